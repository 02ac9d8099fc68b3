//! A private, short-lived bpffs that hands adopted maps to aya's loader.
//!
//! aya (0.14 to 0.16) can reuse an existing map only through a pin
//! (`EbpfLoader::map_pin_path`), so the adopted maps are pinned into a bpffs the agent
//! mounts for itself in a fresh temporary directory, the object is loaded, and the mount is
//! removed again. Nothing outlives the load; the maps stay alive through the program that
//! uses them.

use std::{
    ffi::CString,
    io,
    path::{Path, PathBuf},
};

use aya::maps::MapData;

use super::pin::mount_bpffs;
use crate::dataplane::DataplaneError;

/// A mounted private bpffs with adopted maps pinned by object name; unmounted on drop.
pub struct Staging {
    dir: PathBuf,
    mounted: bool,
    pinned: Vec<(&'static str, PathBuf)>,
}

impl Staging {
    /// Mounts a bpffs on a new directory under the runtime or temporary directory and
    /// pins `maps` in it.
    pub fn pin(maps: &[(&'static str, MapData)]) -> Result<Self, DataplaneError> {
        let dir = make_temp_dir().map_err(|source| DataplaneError::Io {
            what: "creating a directory for the private bpffs",
            source,
        })?;
        let mut staging = Staging {
            dir,
            mounted: false,
            pinned: Vec::new(),
        };
        mount_bpffs(&staging.dir).map_err(|source| DataplaneError::Io {
            what: "mounting a private bpffs to hand the adopted maps to the loader (needs \
                   CAP_SYS_ADMIN; or start with --reset to replace the running program \
                   with fresh state)",
            source,
        })?;
        staging.mounted = true;
        for (name, map) in maps {
            let path = staging.dir.join(name);
            map.pin(&path).map_err(|e| DataplaneError::Io {
                what: "pinning an adopted map into the private bpffs",
                source: io::Error::other(e.to_string()),
            })?;
            staging.pinned.push((name, path));
        }
        Ok(staging)
    }

    /// `(object map name, pin path)` of every adopted map.
    pub fn paths(&self) -> &[(&'static str, PathBuf)] {
        &self.pinned
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for (_, path) in &self.pinned {
            let _ = std::fs::remove_file(path);
        }
        if self.mounted
            && let Ok(c) = CString::new(self.dir.as_os_str().as_encoded_bytes())
        {
            // SAFETY: a NUL-terminated path; MNT_DETACH never blocks.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A new directory under systemd's `RUNTIME_DIRECTORY`, /run or /tmp: the first that
/// is writable (ProtectSystem=strict makes /run read-only).
fn make_temp_dir() -> io::Result<PathBuf> {
    let mut last = io::Error::from(io::ErrorKind::NotFound);
    let candidates = std::env::var_os("RUNTIME_DIRECTORY")
        .map(PathBuf::from)
        .into_iter()
        .chain(["/run", "/tmp"].map(PathBuf::from))
        .chain([std::env::temp_dir()]);
    for base in candidates {
        match mkdtemp(&base) {
            Ok(dir) => return Ok(dir),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn mkdtemp(base: &Path) -> io::Result<PathBuf> {
    let mut template = base
        .join("lb-agent-adopt.XXXXXX")
        .into_os_string()
        .into_encoded_bytes();
    template.push(0);
    // SAFETY: `template` is a writable NUL-terminated buffer ending in XXXXXX.
    let rc = unsafe { libc::mkdtemp(template.as_mut_ptr().cast()) };
    if rc.is_null() {
        return Err(io::Error::last_os_error());
    }
    template.pop();
    // SAFETY: mkdtemp only replaced the X's with ASCII characters.
    Ok(PathBuf::from(unsafe {
        std::ffi::OsString::from_encoded_bytes_unchecked(template)
    }))
}
