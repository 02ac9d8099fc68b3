//! XDP attach modes and attaching with a clear error naming the interface.

use aya::programs::{
    Xdp,
    xdp::{XdpLinkId, XdpMode},
};

use super::DataplaneError;

/// How the program is attached to the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// Native (driver) mode, falling back to generic when the driver refuses.
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (skb) mode, works on every interface, slower.
    Generic,
    /// A pinned link from a previous run was kept (its mode is whatever it was).
    Kept,
}

impl AttachMode {
    pub fn name(self) -> &'static str {
        match self {
            AttachMode::Auto => "auto",
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
            AttachMode::Kept => "kept",
        }
    }
}

/// Attaches `prog` to `interface`; returns the mode actually used and the link.
pub(super) fn attach(
    prog: &mut Xdp,
    interface: &str,
    mode: AttachMode,
) -> Result<(AttachMode, XdpLinkId), DataplaneError> {
    if nix_if_index(interface).is_none() {
        return Err(DataplaneError::NoSuchInterface {
            interface: interface.to_string(),
        });
    }
    let try_mode = |prog: &mut Xdp, m: AttachMode| {
        let flags = match m {
            AttachMode::Generic => XdpMode::Skb,
            _ => XdpMode::Driver,
        };
        prog.attach(interface, flags)
            .map(|id| (m, id))
            .map_err(|source| DataplaneError::Attach {
                interface: interface.to_string(),
                mode: m.name(),
                source,
            })
    };
    match mode {
        AttachMode::Auto => try_mode(prog, AttachMode::Native).or_else(|native_err| {
            tracing::warn!(interface, error = %native_err, "native XDP refused, using generic mode");
            try_mode(prog, AttachMode::Generic)
        }),
        m => try_mode(prog, m),
    }
}

fn nix_if_index(interface: &str) -> Option<u32> {
    let name = std::ffi::CString::new(interface).ok()?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}
