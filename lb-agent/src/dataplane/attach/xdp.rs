//! Attaching through netlink (`IFLA_XDP`): a fresh attach that never clobbers another
//! program, an atomic replacement of lb's previous program, and errors that name what
//! is in the way.

use std::os::fd::{AsFd, BorrowedFd};

use crate::netlink::{self, XdpAttached, xdp::XDP_FLAGS_UPDATE_IF_NOEXIST};

use crate::dataplane::{
    DataplaneError,
    adopt::{self, AttachedProgram},
};

/// How the program is attached to the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// Native (driver) mode, falling back to generic when the driver refuses.
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (skb) mode, works on every interface, slower.
    Generic,
}

impl AttachMode {
    pub fn name(self) -> &'static str {
        match self {
            AttachMode::Auto => "auto",
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
        }
    }
}

/// The index of `interface` in this network namespace.
pub fn if_index(interface: &str) -> Result<u32, DataplaneError> {
    netlink::link_index(interface).ok_or_else(|| DataplaneError::NoSuchInterface {
        interface: interface.to_string(),
    })
}

/// Puts `prog` on the interface. With `previous` (lb's program found there), replaces
/// exactly that program in its mode, atomically (no packet sees no program); else
/// attaches only if the interface has no program. `auto` calls `before_generic` when
/// the driver refused native mode, before it attaches in generic mode (the program's
/// mode flag is set for the mode its first packet will see). Returns the mode in use.
pub(in crate::dataplane) fn attach(
    prog: BorrowedFd<'_>,
    ifindex: u32,
    interface: &str,
    mode: AttachMode,
    previous: Option<&AttachedProgram>,
    before_generic: &mut dyn FnMut() -> Result<(), DataplaneError>,
) -> Result<XdpAttached, DataplaneError> {
    if let Some(old) = previous {
        if old.mode != XdpAttached::Driver && old.mode != XdpAttached::Generic {
            return Err(old.in_the_way(interface));
        }
        if mode != AttachMode::Auto && mode.name() != old.mode.name() {
            tracing::warn!(
                interface,
                running = old.mode.name(),
                configured = mode.name(),
                "the running program is attached in another mode; it is replaced in that mode \
                 (modes cannot change without a gap: `lb-agent detach`, then start)"
            );
        }
        return netlink::set_xdp(ifindex, Some(prog), Some(old.fd.as_fd()), old.mode.flags())
            .map(|()| old.mode)
            .map_err(|source| match source.errno() {
                Some(libc::EBUSY) => DataplaneError::HeldByLink {
                    interface: interface.to_string(),
                    id: old.id,
                },
                _ => DataplaneError::Attach {
                    interface: interface.to_string(),
                    mode: old.mode.name(),
                    source,
                },
            });
    }
    let fresh = |m: XdpAttached| {
        netlink::set_xdp(
            ifindex,
            Some(prog),
            None,
            XDP_FLAGS_UPDATE_IF_NOEXIST | m.flags(),
        )
        .map(|()| m)
    };
    let attempt = match mode {
        AttachMode::Generic => fresh(XdpAttached::Generic),
        AttachMode::Native => fresh(XdpAttached::Driver),
        AttachMode::Auto => match fresh(XdpAttached::Driver) {
            Err(native) if !is_occupied(native.errno()) => {
                tracing::warn!(interface, error = %native, "native XDP refused, using generic mode");
                before_generic()?;
                fresh(XdpAttached::Generic)
            }
            native => native,
        },
    };
    attempt.map_err(|source| {
        if is_occupied(source.errno())
            && let Ok(Some(there)) = adopt::attached_program(ifindex, interface)
        {
            return there.in_the_way(interface);
        }
        DataplaneError::Attach {
            interface: interface.to_string(),
            mode: mode.name(),
            source,
        }
    })
}

/// Removes `program` from the interface, only if it is still the one attached.
pub fn detach(
    ifindex: u32,
    interface: &str,
    program: &AttachedProgram,
) -> Result<(), DataplaneError> {
    netlink::set_xdp(
        ifindex,
        None,
        Some(program.fd.as_fd()),
        program.mode.flags(),
    )
    .map_err(|source| DataplaneError::Netlink {
        what: format!("removing XDP program id {} from `{interface}`", program.id),
        source,
    })?;
    // Only lb's balancer pins its full path; lb_decap has none.
    if program.is_ours() {
        super::full_path::forget(program.id);
    }
    Ok(())
}

/// `EBUSY`: a program is attached; `EEXIST`: one is attached in the other mode.
fn is_occupied(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::EBUSY) | Some(libc::EEXIST))
}
