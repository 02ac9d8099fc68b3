//! Probe header values read from a file or an environment variable (`headers = { X = {
//! file = "/path" } }`), so that a secret stays out of the config file. The value is read
//! at every load and reload, and never printed: `Debug` shows only where it came from.

use std::fmt;

/// A header value that must not show up in logs, the API or `check-config` output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    value: String,
    /// "file /etc/lb/probe.token", "env LB_PROBE_TOKEN".
    origin: String,
}

impl Secret {
    pub fn new(value: String, origin: String) -> Self {
        Secret { value, origin }
    }

    /// The value, for the request only.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// Where the value came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(from {})", self.origin)
    }
}

/// Reads the file at `path`: its content without one trailing newline (`\n` or `\r\n`).
/// Errors name the file, never its content.
pub(super) fn from_file(path: &str) -> Result<Secret, String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} is not an absolute path"));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{path} is not UTF-8 text"))?;
    let value = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(&text);
    checked(value, &format!("file {path}"))
}

/// Reads environment variable `name`. Errors name the variable, never its value.
pub(super) fn from_env(name: &str) -> Result<Secret, String> {
    let value = std::env::var(name).map_err(|e| match e {
        std::env::VarError::NotPresent => format!("environment variable {name} is not set"),
        std::env::VarError::NotUnicode(_) => {
            format!("environment variable {name} is not UTF-8 text")
        }
    })?;
    checked(&value, &format!("env {name}"))
}

fn checked(value: &str, origin: &str) -> Result<Secret, String> {
    if value.is_empty() {
        return Err(format!("{origin} is empty"));
    }
    if !super::values::http_text(value) {
        return Err(format!(
            "the value from {origin} contains control characters (CR, LF, ...), not allowed in a header"
        ));
    }
    Ok(Secret::new(value.to_string(), origin.to_string()))
}
