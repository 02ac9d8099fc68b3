//! [`DataplaneLifecycle`] on the kernel: the netlink attach of the serving program with
//! the interface's MAC, tunnel parameters and XDP mode, the attachment check that
//! re-attaches a program removed behind the agent, and the event ring and table census
//! handed out.

use std::{net::IpAddr, os::fd::AsFd, time::Duration};

use lb_common::{FULL_PROGRAM_NAME, PROGRAM_NAME};

use super::{Attachment, BpfDataplane};
use crate::{
    dataplane::{
        DataplaneError, DataplaneLifecycle, EventStream, LinkCheck,
        adopt::{
            self, AttachedProgram,
            pin::{self, PinDir},
        },
        attach::{self, AttachMode, full_path},
        census::CensusSampler,
        sizing::MapSizes,
    },
    netlink::{self, XdpAttached},
};

impl DataplaneLifecycle for BpfDataplane {
    fn attach(
        &mut self,
        interface: &str,
        mode: AttachMode,
        previous: Option<&AttachedProgram>,
    ) -> Result<(), DataplaneError> {
        // Before attaching: the program balances only frames addressed to this MAC.
        let mac = crate::hwaddr::of(interface).map_err(|source| match source.raw_os_error() {
            Some(libc::ENODEV) => DataplaneError::NoSuchInterface {
                interface: interface.to_string(),
            },
            _ => DataplaneError::Io {
                what: "reading the interface's MAC address",
                source,
            },
        })?;
        self.set_interface_mac(mac)?;
        self.set_tunnel_config(interface)?;
        // The mode the attach tries first, so that the program's first packets are
        // treated as that mode's; cleared before `auto` falls back to generic.
        let tried_native = match previous {
            Some(old) => old.mode == XdpAttached::Driver,
            None => mode != AttachMode::Generic,
        };
        self.set_native(tried_native)?;
        let ifindex = attach::if_index(interface)?;
        // The split's `LB_PROGRAMS` must outlive this process as the attached program does.
        let lasting = full_path::lasting_dir(self.pins.as_ref());
        self.serving = if lasting.is_some() {
            PROGRAM_NAME
        } else {
            // Nothing to act on: restarts adopt the program either way.
            tracing::info!(
                interface,
                "no bpffs outlives the agent here (no pin_path, and init's /sys/fs/bpf is out of \
                 reach): attaching the whole-path program lb_xdp_full, without the hot-path \
                 split (docs/internals/fast-path.md, \"Two programs\")"
            );
            FULL_PROGRAM_NAME
        };
        let serving = self.serving;
        let prog_id = self.program_id()?;
        let fd = self
            .serving_mut()?
            .fd()
            .and_then(|fd| fd.try_clone().map_err(aya::programs::ProgramError::from))
            .map_err(|source| DataplaneError::Program {
                name: serving,
                source,
            })?;
        let attempt = attach::attach(fd.as_fd(), ifindex, interface, mode, previous, &mut || {
            self.set_native(false)
        });
        let legacy = self
            .pins
            .as_ref()
            .map(|p| p.legacy_link(interface))
            .filter(|path| path.exists());
        let used = match (attempt, legacy, previous) {
            (Err(DataplaneError::HeldByLink { .. }), Some(path), Some(old)) => {
                // Upgrading from an agent that attached through a pinned bpf_link:
                // swap into that link (atomic) rather than interrupt traffic.
                pin::swap_into_legacy_link(self.serving_mut()?, &path)?;
                tracing::warn!(
                    interface,
                    link = %path.display(),
                    "swapped into the pinned bpf_link an older lb-agent left: restarts stay \
                     hitless while that pin lives; to move to netlink (which needs no pins), \
                     stop the agent, `lb-agent detach`, start it (a short interruption)"
                );
                old.mode
            }
            (attempt, _, _) => attempt?,
        };
        if let Some(dir) = &lasting {
            full_path::keep(&self.ebpf, dir, prog_id, previous.map(|p| p.id))?;
        }
        tracing::info!(
            interface,
            mode = used.name(),
            program_id = prog_id,
            replaced = previous.map(|p| p.id),
            "XDP program attached"
        );
        if used == XdpAttached::Generic && !self.tunnel_gso {
            match attach::tunnel_gso::attach(&mut self.ebpf, ifindex) {
                Ok(()) => {
                    self.tunnel_gso = true;
                    tracing::info!(
                        interface,
                        "lb_tunnel_gso attached to the tc ingress: it sends out the tunnel \
                         services' merged segments generic mode sees (docs/tunnel.md, \
                         \"Offloads\")"
                    );
                }
                Err(error) => tracing::warn!(
                    interface,
                    error = ?error,
                    "lb_tunnel_gso not attached to the tc ingress (TCX, kernel 6.6 or later): \
                     the merged segments generic mode may see are lost to tunnel services \
                     (docs/tunnel.md, \"Offloads\")"
                ),
            }
        }
        self.attached = Some(Attachment {
            interface: interface.to_string(),
            ifindex,
            mode: used,
            prog_id,
        });
        Ok(())
    }

    fn check_attachment(&mut self) -> Result<LinkCheck, DataplaneError> {
        let Some(att) = self.attached.clone() else {
            return Ok(LinkCheck::Intact);
        };
        let now = match netlink::query_xdp(att.ifindex) {
            Ok(now) => now,
            Err(source) if source.errno() == Some(libc::ENODEV) => {
                return Err(DataplaneError::InterfaceGone {
                    interface: att.interface,
                    ifindex: att.ifindex,
                });
            }
            Err(source) => {
                return Err(DataplaneError::Netlink {
                    what: format!("reading the XDP program of `{}`", att.interface),
                    source,
                });
            }
        };
        match now {
            Some(p) if p.id == att.prog_id => Ok(LinkCheck::Intact),
            Some(p) => {
                let name = adopt::attached_program(att.ifindex, &att.interface)
                    .ok()
                    .flatten()
                    .map(|p| p.name)
                    .unwrap_or_default();
                Err(DataplaneError::Replaced {
                    interface: att.interface,
                    now: format!("program id {} `{name}` ({})", p.id, p.mode.name()),
                })
            }
            None => {
                let mode = match att.mode {
                    XdpAttached::Generic => AttachMode::Generic,
                    _ => AttachMode::Native,
                };
                self.attach(&att.interface, mode, None)?;
                Ok(LinkCheck::Reattached)
            }
        }
    }

    fn still_attached(&self) -> bool {
        self.attached.as_ref().is_some_and(
            |att| matches!(netlink::query_xdp(att.ifindex), Ok(Some(p)) if p.id == att.prog_id),
        )
    }

    fn sizes(&self) -> MapSizes {
        self.sizes
    }

    fn set_tunnel_source(&mut self, source: Option<IpAddr>) {
        self.tunnel_source = source;
    }

    fn pins(&self) -> Option<&PinDir> {
        self.pins.as_ref()
    }

    fn interface(&self) -> &str {
        self.attached.as_ref().map_or("", |a| &a.interface)
    }

    fn mode_name(&self) -> &'static str {
        self.attached.as_ref().map_or("detached", |a| a.mode.name())
    }

    fn start_census(&mut self, every: Duration) -> Result<(), DataplaneError> {
        let reader = CensusSampler::start(self.table_reader()?, every).map_err(|source| {
            DataplaneError::Io {
                what: "starting the flow and nat table count",
                source,
            }
        })?;
        self.census = Some(reader);
        Ok(())
    }

    fn take_events(&mut self) -> Option<Result<EventStream, DataplaneError>> {
        self.events.take().map(EventStream::new)
    }
}
