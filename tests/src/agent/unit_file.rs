//! A systemd unit file read as systemd reads it (sections, `Key=value` lines, `#`/`;`
//! comments, `\` continuations, a key given again appends), so that a scenario runs
//! exactly the unit we ship.

use std::path::Path;

/// Why a unit file could not be read or lacks a directive.
#[derive(Debug, thiserror::Error)]
pub enum UnitError {
    #[error("reading the unit file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line} of the unit file is neither a section, a comment nor Key=value: {text:?}")]
    Syntax { line: usize, text: String },
    #[error("[{section}] {key}= is not set in the unit file")]
    Missing { section: String, key: String },
    #[error("[{section}] {key}= is set {count} times; the unit should say it once")]
    Repeated {
        section: String,
        key: String,
        count: usize,
    },
}

/// One `Key=value` line, with the section it is in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Directive {
    pub section: String,
    pub key: String,
    pub value: String,
}

/// The directives of a unit file, in order.
#[derive(Clone, Debug)]
pub struct UnitFile {
    directives: Vec<Directive>,
}

impl UnitFile {
    pub fn read(path: &Path) -> Result<UnitFile, UnitError> {
        let text = std::fs::read_to_string(path).map_err(|source| UnitError::Read {
            path: path.display().to_string(),
            source,
        })?;
        UnitFile::parse(&text)
    }

    pub fn parse(text: &str) -> Result<UnitFile, UnitError> {
        let mut directives = Vec::new();
        let mut section = String::new();
        let mut pending = String::new();
        let mut first_line = 0;
        for (n, raw) in text.lines().enumerate() {
            let trimmed = raw.trim();
            if pending.is_empty() {
                first_line = n + 1;
                if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with(';') {
                    continue;
                }
            }
            if let Some(cont) = trimmed.strip_suffix('\\') {
                pending.push_str(cont);
                pending.push(' ');
                continue;
            }
            pending.push_str(trimmed);
            let line = std::mem::take(&mut pending);
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
                continue;
            }
            let Some((key, value)) = line.split_once('=') else {
                return Err(UnitError::Syntax {
                    line: first_line,
                    text: line,
                });
            };
            directives.push(Directive {
                section: section.clone(),
                key: key.trim().to_owned(),
                value: value.trim().to_owned(),
            });
        }
        Ok(UnitFile { directives })
    }

    /// Every value of `[section] key=`, in order.
    pub fn all(&self, section: &str, key: &str) -> Vec<&str> {
        self.directives
            .iter()
            .filter(|d| d.section == section && d.key == key)
            .map(|d| d.value.as_str())
            .collect()
    }

    /// The single value of `[section] key=`; an error when absent or repeated.
    pub fn one(&self, section: &str, key: &str) -> Result<&str, UnitError> {
        match self.all(section, key).as_slice() {
            [one] => Ok(one),
            [] => Err(UnitError::Missing {
                section: section.to_owned(),
                key: key.to_owned(),
            }),
            many => Err(UnitError::Repeated {
                section: section.to_owned(),
                key: key.to_owned(),
                count: many.len(),
            }),
        }
    }

    /// `[Service] key=`, see [`UnitFile::one`].
    pub fn service(&self, key: &str) -> Result<&str, UnitError> {
        self.one("Service", key)
    }

    /// The space-separated words of every `[Service] key=` line, joined (systemd merges
    /// list directives such as `ReadWritePaths=` given more than once).
    pub fn service_list(&self, key: &str) -> Vec<String> {
        self.all("Service", key)
            .iter()
            .flat_map(|v| v.split_whitespace().map(str::to_owned))
            .collect()
    }

    /// Every directive, in order.
    pub fn directives(&self) -> &[Directive] {
        &self.directives
    }
}

/// The capability names of a `CAP_A CAP_B` list as setpriv spells them (`+a,+b`).
pub fn setpriv_caps(caps: &[String]) -> String {
    caps.iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_comments_continuations_and_repeats() {
        let unit = UnitFile::parse(
            "# c\n[Unit]\nDescription=x\n[Service]\n; c\nExecStart=/bin/a \\\n  --b\n\
             ReadWritePaths=/x\nReadWritePaths=/y /z\nX=1\nX=2\n",
        )
        .expect("parses");
        assert_eq!(unit.service("ExecStart").unwrap(), "/bin/a  --b");
        assert_eq!(unit.service_list("ReadWritePaths"), ["/x", "/y", "/z"]);
        assert!(matches!(
            unit.service("X"),
            Err(UnitError::Repeated { count: 2, .. })
        ));
        assert!(matches!(
            unit.service("Description"),
            Err(UnitError::Missing { .. })
        ));
        assert!(UnitFile::parse("[Service]\nnonsense\n").is_err());
        assert_eq!(
            setpriv_caps(&["CAP_BPF".into(), "CAP_NET_ADMIN".into()]),
            "+bpf,+net_admin"
        );
    }
}
