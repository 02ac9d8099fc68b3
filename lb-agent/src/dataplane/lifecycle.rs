//! [`DataplaneLifecycle`]: what the agent process does with its data plane besides
//! publishing — attach it, keep it attached, say how it runs, and take its event and
//! census sources.

use std::{net::IpAddr, time::Duration};

use super::{
    Dataplane, DataplaneError, EventStream,
    adopt::{AttachedProgram, pin::PinDir},
    attach::AttachMode,
    sizing::MapSizes,
};

/// What a check of the interface's XDP program found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkCheck {
    /// Our program is attached.
    Intact,
    /// It was gone and has been attached again.
    Reattached,
}

/// The process-level life of a data plane that runs on an interface (`lb-agent run`),
/// next to the map writes and reads of [`Dataplane`].
pub trait DataplaneLifecycle: Dataplane {
    /// Attaches the loaded program to `interface` through netlink: it stays attached
    /// after the agent exits. With `previous` (lb's program found there), replaces it
    /// atomically; else the interface must have no XDP program.
    fn attach(
        &mut self,
        interface: &str,
        mode: AttachMode,
        previous: Option<&AttachedProgram>,
    ) -> Result<(), DataplaneError>;

    /// Whether the interface still runs this program; re-attaches it when the interface
    /// has none (someone ran `ip link set dev IF xdp off`). An error when another program
    /// took its place or the interface is gone: the agent cannot serve then.
    fn check_attachment(&mut self) -> Result<LinkCheck, DataplaneError>;

    /// Whether the interface runs this program now (for the shutdown log).
    fn still_attached(&self) -> bool;

    /// The sizes the maps were created with, and the tables' layout.
    fn sizes(&self) -> MapSizes;

    /// Sets `agent.tunnel_source` (written to `LB_CONFIG` at the next attach).
    fn set_tunnel_source(&mut self, source: Option<IpAddr>);

    /// The pin directory, if the maps are pinned.
    fn pins(&self) -> Option<&PinDir>;

    /// The interface the program is attached to ("" before `attach`).
    fn interface(&self) -> &str;

    /// The attach mode in use: `native` or `generic` (`detached` before `attach`).
    fn mode_name(&self) -> &'static str;

    /// Starts counting the flow and nat tables every `every` on a thread of its own
    /// ([`Dataplane::table_census`] then answers).
    fn start_census(&mut self, every: Duration) -> Result<(), DataplaneError>;

    /// Takes the passive-event stream (once).
    fn take_events(&mut self) -> Option<Result<EventStream, DataplaneError>>;
}
