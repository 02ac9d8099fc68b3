//! What the event loop is fed besides channels: stop and reload signals, the data
//! plane's passive event stream, and the watch over the program's attachment; each a
//! small trait, so that tests feed the same loop what production reads from the kernel.

use std::future::Future;

use lb_common::events::PassiveEvent;
use tokio::signal::unix::{SignalKind, signal};

use crate::dataplane::{DataplaneError, EventStream};

/// What a signal asks of the loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Re-read the configuration and apply it (SIGHUP).
    Reload,
    /// Leave the loop; the program stays attached (SIGINT, SIGTERM).
    Stop,
}

/// Where stop and reload requests from outside the API come from.
pub trait Signals {
    /// The next signal. Cancel-safe.
    fn next(&mut self) -> impl Future<Output = Signal>;
}

/// The process's SIGHUP (reload), SIGTERM and SIGINT (stop).
pub struct UnixSignals {
    hangup: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl UnixSignals {
    /// Installs the handlers (inside a tokio runtime); from then on a signal is kept
    /// until the loop reads it, instead of ending the process.
    pub fn install() -> std::io::Result<Self> {
        Ok(UnixSignals {
            hangup: signal(SignalKind::hangup())?,
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }
}

impl Signals for UnixSignals {
    async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.terminate.recv() => Signal::Stop,
            _ = self.interrupt.recv() => Signal::Stop,
            _ = self.hangup.recv() => Signal::Reload,
        }
    }
}

/// Batches of passive events (resets, timeouts, ICMP errors seen by the data plane).
pub trait PassiveEvents {
    /// Waits for at least one event and returns every available one; an error ends the
    /// stream. Cancel-safe.
    fn next_batch(&mut self) -> impl Future<Output = Result<Vec<PassiveEvent>, DataplaneError>>;
}

impl PassiveEvents for EventStream {
    async fn next_batch(&mut self) -> Result<Vec<PassiveEvent>, DataplaneError> {
        EventStream::next_batch(self).await
    }
}

/// Keeps the program attached to the interface of the data plane `D`.
pub trait AttachmentWatch<D> {
    /// Waits until a check is due. Cancel-safe.
    fn due(&mut self) -> impl Future<Output = ()>;

    /// One check, repairing what it can: after a repair, the mode text for status; an
    /// error means the agent cannot serve and must stop.
    fn check(&mut self, dp: &mut D) -> Result<Option<String>, DataplaneError>;
}
