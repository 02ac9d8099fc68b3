//! A directory of the harness's own (configs, sockets, logs of one bed), removed with
//! everything in it when dropped.

use std::path::{Path, PathBuf};

use crate::util::error::Error;

/// A directory removed with everything in it on drop.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `path` and its missing parents.
    pub fn create(path: PathBuf) -> Result<Self, Error> {
        std::fs::create_dir_all(&path).map_err(Error::io(format!(
            "creating the directory {}",
            path.display()
        )))?;
        Ok(TempDir(path))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
