//! Pinned data-plane state for hitless restarts and crash safety.
//!
//! With `agent.pin_path` set, every map and the XDP link are pinned in that bpffs
//! directory. The agent's exit (clean or not) then leaves the program attached and
//! forwarding with the last published state; a restarted agent opens the same maps,
//! swaps its (possibly newer) program into the pinned link atomically
//! (`bpf_link_update`), adopts the published ids and continues. `--reset` removes the
//! directory first; `lb-agent detach` removes it and so detaches the program.

use std::{
    ffi::CString,
    io,
    path::{Path, PathBuf},
};

use aya::programs::{
    Xdp,
    links::{FdLink, PinnedLink},
    xdp::XdpLink,
};

use super::{AttachMode, DataplaneError, attach};

/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Where bpffs is normally mounted.
const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// A bpffs directory holding one agent's pins.
#[derive(Clone, Debug)]
pub struct PinDir {
    dir: PathBuf,
}

impl PinDir {
    /// Makes sure bpffs is mounted under `dir` (mounting it at `/sys/fs/bpf` when that
    /// is where `dir` lives and nothing is mounted yet) and creates `dir`. With `reset`,
    /// everything pinned there before is removed first.
    pub fn prepare(dir: &Path, reset: bool) -> Result<Self, DataplaneError> {
        ensure_bpffs(dir)?;
        if reset {
            remove(dir).map_err(|source| DataplaneError::Io {
                what: "removing the pinned state (--reset)",
                source,
            })?;
        }
        std::fs::create_dir_all(dir).map_err(|source| DataplaneError::Io {
            what: "creating the pin directory",
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Where map `name` is pinned.
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Where the XDP link for `interface` is pinned.
    pub fn link(&self, interface: &str) -> PathBuf {
        self.dir.join(format!("link_xdp_{interface}"))
    }
}

/// Removes a pin directory and everything in it (unpinning detaches the program once
/// no process holds it). A missing directory is fine.
pub fn remove(dir: &Path) -> io::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                std::fs::remove_file(entry?.path())?;
            }
            std::fs::remove_dir(dir)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Attaches through the pinned link when there is one (atomic program swap, no gap in
/// forwarding), else attaches afresh and pins the new link.
pub(super) fn attach_pinned(
    prog: &mut Xdp,
    interface: &str,
    mode: AttachMode,
    pins: &PinDir,
) -> Result<AttachMode, DataplaneError> {
    let path = pins.link(interface);
    if path.exists() {
        let kept = PinnedLink::from_pin(&path)
            .map_err(|e| e.to_string())
            .and_then(|pinned| XdpLink::try_from(FdLink::from(pinned)).map_err(|e| e.to_string()))
            .and_then(|link| prog.attach_to_link(link).map_err(|e| e.to_string()));
        match kept {
            Ok(_) => return Ok(AttachMode::Kept),
            Err(err) => {
                // A link whose interface went away (or of another program type).
                tracing::warn!(path = %path.display(), error = %err, "pinned XDP link unusable; attaching afresh");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let (mode, id) = attach::attach(prog, interface, mode)?;
    let pin_err = |e: String| DataplaneError::Io {
        what: "pinning the XDP link",
        source: io::Error::other(e),
    };
    let link = prog.take_link(id).map_err(|e| pin_err(e.to_string()))?;
    let fd_link = FdLink::try_from(link).map_err(|e| pin_err(e.to_string()))?;
    fd_link.pin(&path).map_err(|e| pin_err(e.to_string()))?;
    Ok(mode)
}

fn ensure_bpffs(dir: &Path) -> Result<(), DataplaneError> {
    let mut probe = dir.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            break;
        }
    }
    if is_bpffs(&probe) {
        return Ok(());
    }
    if dir.starts_with(BPFFS_ROOT)
        && Path::new(BPFFS_ROOT).exists()
        && !is_bpffs(Path::new(BPFFS_ROOT))
    {
        let target = CString::new(BPFFS_ROOT).expect("no NUL");
        let fstype = CString::new("bpf").expect("no NUL");
        // SAFETY: valid NUL-terminated strings; no data argument.
        let rc = unsafe {
            libc::mount(
                fstype.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if rc == 0 {
            tracing::info!("mounted bpffs at {BPFFS_ROOT}");
            return Ok(());
        }
        return Err(DataplaneError::Io {
            what: "mounting bpffs at /sys/fs/bpf (needed for pin_path)",
            source: io::Error::last_os_error(),
        });
    }
    Err(DataplaneError::Io {
        what: "pin_path is not on a bpffs mount (mount -t bpf bpf DIR, or use /sys/fs/bpf/...)",
        source: io::Error::from(io::ErrorKind::InvalidInput),
    })
}

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct; the path is NUL-terminated.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}
