//! The passive-event stream: `LB_EVENTS` ring buffer records as an async source.

use aya::maps::{MapData, RingBuf};
use lb_common::events::PassiveEvent;
use tokio::io::unix::AsyncFd;

use super::DataplaneError;

/// Reads [`PassiveEvent`]s from the ring buffer as they arrive.
pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl EventStream {
    pub(super) fn new(ring: RingBuf<MapData>) -> Result<Self, DataplaneError> {
        // SAFETY: the ring buffer owns its fd and keeps it open (and unchanged) for as
        // long as the AsyncFd holds it.
        let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| DataplaneError::Io {
            what: "registering the event ring buffer with the reactor",
            source: e.into(),
        })?;
        Ok(Self { ring })
    }

    /// Waits until at least one event is available and returns every available event.
    pub async fn next_batch(&mut self) -> Result<Vec<PassiveEvent>, DataplaneError> {
        loop {
            let mut guard =
                self.ring
                    .readable_mut()
                    .await
                    .map_err(|source| DataplaneError::Io {
                        what: "waiting on the event ring buffer",
                        source,
                    })?;
            let batch = drain(guard.get_inner_mut());
            guard.clear_ready();
            if !batch.is_empty() {
                return Ok(batch);
            }
        }
    }
}

fn drain(ring: &mut RingBuf<MapData>) -> Vec<PassiveEvent> {
    let mut out = Vec::new();
    while let Some(item) = ring.next() {
        if item.len() >= size_of::<PassiveEvent>() {
            // SAFETY: the record is at least one PassiveEvent long; read unaligned.
            let event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<PassiveEvent>()) };
            out.push(event);
        }
    }
    out
}
