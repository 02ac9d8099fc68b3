//! The data plane's ring buffers as async sources: passive events (`LB_EVENTS`,
//! [`EventStream`]) and in cluster mode connection events (`LB_CONN_EVENTS`,
//! [`ConnEventStream`]).

use aya::maps::{MapData, RingBuf};
use lb_common::events::{ConnEvent, PassiveEvent};
use tokio::io::unix::AsyncFd;

use super::DataplaneError;

/// Reads [`PassiveEvent`]s from `LB_EVENTS` as they arrive.
pub type EventStream = RingStream<PassiveEvent>;
/// Reads [`ConnEvent`]s from `LB_CONN_EVENTS` as they arrive.
pub type ConnEventStream = RingStream<ConnEvent>;

/// Reads records of type `T` from a ring buffer as they arrive.
pub struct RingStream<T> {
    ring: AsyncFd<RingBuf<MapData>>,
    record: std::marker::PhantomData<T>,
}

impl<T: aya::Pod> RingStream<T> {
    pub(super) fn new(ring: RingBuf<MapData>) -> Result<Self, DataplaneError> {
        // SAFETY: the ring buffer owns its fd and keeps it open (and unchanged) for as
        // long as the AsyncFd holds it.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| DataplaneError::Io {
            what: "registering a ring buffer with the reactor",
            source: e.into(),
        })?;
        Ok(Self {
            ring,
            record: std::marker::PhantomData,
        })
    }

    /// Waits until at least one record is available and returns every available one.
    pub async fn next_batch(&mut self) -> Result<Vec<T>, DataplaneError> {
        loop {
            let mut guard =
                self.ring
                    .readable_mut()
                    .await
                    .map_err(|source| DataplaneError::Io {
                        what: "waiting on a ring buffer",
                        source,
                    })?;
            let batch = drain(guard.get_inner_mut());
            guard.clear_ready();
            if !batch.is_empty() {
                return Ok(batch);
            }
        }
    }

    /// Every record available now, without waiting (none: empty).
    pub fn try_batch(&mut self) -> Vec<T> {
        drain(self.ring.get_mut())
    }
}

/// Reads every record available.
fn drain<T: aya::Pod>(ring: &mut RingBuf<MapData>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<T>() {
            // SAFETY: the record is at least one T long, and every bit pattern is a T
            // (`aya::Pod`); read unaligned.
            let record = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<T>()) };
            out.push(record);
        }
    }
    out
}
