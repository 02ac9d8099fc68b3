//! The one error type of config loading: where (file, line, key) and what is allowed.

use std::fmt;
use std::path::PathBuf;

/// A config file that could not be read, parsed or validated.
///
/// Displays as `FILE:LINE: KEY: MESSAGE`, leaving out the parts that are unknown, e.g.
/// `lb.toml:12: service[0].server[1].weight: must be at least 1 (got 0)`.
/// Indices in `key` are 0-based positions of `[[service]]`, `[[service.server]]` and
/// `[[service.probe]]` tables in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file as given to [`load`](super::load) / [`parse`](super::parse).
    pub file: PathBuf,
    /// 1-based line of the offending key or value (of the table header for a missing key).
    pub line: Option<usize>,
    /// Key path, e.g. `service[0].server[1].weight`; `None` for file-level errors.
    pub key: Option<String>,
    /// What is wrong and what is allowed.
    pub message: String,
    /// Set when the file could not be read; the message already carries the OS error text.
    pub io_kind: Option<std::io::ErrorKind>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if let Some(key) = &self.key {
            write!(f, ": {key}")?;
        }
        write!(f, ": {}", self.message)
    }
}
