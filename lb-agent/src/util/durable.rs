//! Durable writes (and reads) of the agent's small state files (admin state, passive ejections): a
//! temporary file beside the target, fsync, rename over it, fsync of the directory,
//! which is created (0700) when missing. A crash leaves the old file or the new one,
//! never a torn one.

use std::{io::Write, path::Path};

/// Writes `bytes` to `path` atomically through `path` with extension `tmp_extension`.
/// On failure: what was being done (for the caller's error) and the I/O error.
pub(crate) fn write_atomic(
    path: &Path,
    tmp_extension: &str,
    bytes: &[u8],
) -> Result<(), (&'static str, std::io::Error)> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    if !dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| ("creating the directory of", e))?;
    }
    let tmp = path.with_extension(tmp_extension);
    let mut f = std::fs::File::create(&tmp).map_err(|e| ("creating", e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| ("writing", e))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(|e| ("renaming into", e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ("syncing the directory of", e))
}

/// The text of `path`, `None` when there is no such file (nothing kept yet).
pub(crate) fn read_if_present(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
