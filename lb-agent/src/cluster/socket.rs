//! The sync socket, counting every datagram it receives: with the datagrams the
//! connections took (their statistics), it tells how many no connection accepted.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// A UDP socket for quinn that counts received datagrams in `received`.
pub struct CountingSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    received: Arc<AtomicU64>,
}

impl CountingSocket {
    pub fn new(inner: Arc<dyn AsyncUdpSocket>, received: Arc<AtomicU64>) -> Self {
        CountingSocket { inner, received }
    }
}

impl fmt::Debug for CountingSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CountingSocket")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl AsyncUdpSocket for CountingSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let polled = self.inner.poll_recv(cx, bufs, meta);
        if let Poll::Ready(Ok(n)) = &polled {
            let datagrams: usize = meta[..*n]
                .iter()
                .map(|m| m.len.div_ceil(m.stride.max(1)))
                .sum();
            self.received.fetch_add(datagrams as u64, Relaxed);
        }
        polled
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
