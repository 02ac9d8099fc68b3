//! The Unix-socket listener's file: its directory (`0700`, or `0750` with a group), the
//! socket (`0600` root, or `0660` with `api_socket_group`), a stale socket of a crashed
//! agent replaced, a live one refused; removed when the agent stops.

use std::{
    ffi::CString,
    os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
};

/// Why the socket could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another agent answers on {0}: set a different agent.api_socket for this one")]
    InUse(PathBuf),
    #[error("{0} exists and is not a socket: remove it or choose another agent.api_socket")]
    NotASocket(PathBuf),
    #[error("no group named {0:?} (agent.api_socket_group)")]
    NoGroup(String),
}

/// The bound socket; its file is removed on drop.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
}

impl SocketFile {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Binds `path` with the permissions above.
pub fn bind(
    path: &Path,
    group: Option<&str>,
) -> Result<(tokio::net::UnixListener, SocketFile), SocketError> {
    let io = |what, source| SocketError::Io {
        what,
        path: path.to_path_buf(),
        source,
    };
    let gid = group.map(group_id).transpose()?;
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(if gid.is_some() { 0o750 } else { 0o700 })
            .create(dir)
            .map_err(|e| io("creating the directory of", e))?;
        if let Some(gid) = gid {
            std::os::unix::fs::chown(dir, None, Some(gid))
                .map_err(|e| io("giving the group the directory of", e))?;
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(SocketError::InUse(path.to_path_buf()));
            }
            std::fs::remove_file(path).map_err(|e| io("removing the stale socket", e))?;
        }
        Ok(_) => return Err(SocketError::NotASocket(path.to_path_buf())),
        Err(_) => {}
    }
    let std_listener =
        std::os::unix::net::UnixListener::bind(path).map_err(|e| io("binding", e))?;
    let file = SocketFile {
        path: path.to_path_buf(),
    };
    let mode = if gid.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io("setting the mode of", e))?;
    if let Some(gid) = gid {
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| io("giving the group the socket", e))?;
    }
    std_listener
        .set_nonblocking(true)
        .map_err(|e| io("configuring", e))?;
    let listener =
        tokio::net::UnixListener::from_std(std_listener).map_err(|e| io("registering", e))?;
    Ok((listener, file))
}

/// The id of group `name`.
fn group_id(name: &str) -> Result<u32, SocketError> {
    let c = CString::new(name).map_err(|_| SocketError::NoGroup(name.to_string()))?;
    // SAFETY: all-zero is a valid `group` (null pointers, gid 0); getgrnam_r fills it.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; `buf` outlives the result's use.
    let rc = unsafe {
        libc::getgrnam_r(
            c.as_ptr(),
            &mut grp,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 || found.is_null() {
        return Err(SocketError::NoGroup(name.to_string()));
    }
    Ok(grp.gr_gid)
}
