//! The routing daemon's sessions as BIRD reports them (`birdc show protocols`), read
//! periodically for status; lb never configures BIRD.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One protocol line of `birdc show protocols`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Protocol {
    pub name: String,
    /// `BGP`, `BFD`, `Direct`, `Kernel`, `Device`, …
    pub proto: String,
    /// `up`, `down`, `start`, …
    pub state: String,
    /// BIRD's info column, e.g. `Established`, `Active`, `Connect`.
    pub info: String,
}

/// What the last read found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sessions {
    pub protocols: Vec<Protocol>,
    /// Why the read failed (BIRD not running, socket missing, …).
    pub error: Option<String>,
}

/// Parses `birdc show protocols` output (BIRD 2): a header line `Name Proto Table State
/// Since Info`, then one line per protocol. `Table` is `---` for protocols without one;
/// `Since` is a date and a time (two words) or a time alone.
pub fn parse_protocols(out: &str) -> Vec<Protocol> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("Name"));
    lines.next();
    lines
        .filter_map(|line| {
            let w: Vec<&str> = line.split_whitespace().collect();
            if w.len() < 5 {
                return None;
            }
            let (name, proto, state) = (w[0], w[1], w[3]);
            // Since: `2026-12-01 14:00:01` or `14:00:01.123`; info follows it.
            let info_at = if w.len() > 5 && w[4].contains('-') && w[5].contains(':') {
                6
            } else {
                5
            };
            Some(Protocol {
                name: name.to_string(),
                proto: proto.to_string(),
                state: state.to_string(),
                info: w.get(info_at..).map(|i| i.join(" ")).unwrap_or_default(),
            })
        })
        .collect()
}

/// Runs `birdc -s <socket> show protocols` and parses it.
pub async fn read(socket: &Path) -> Sessions {
    let out = tokio::process::Command::new("birdc")
        .arg("-s")
        .arg(socket)
        .args(["show", "protocols"])
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(std::time::Duration::from_secs(2), out).await {
        Ok(Ok(out)) if out.status.success() => Sessions {
            protocols: parse_protocols(&String::from_utf8_lossy(&out.stdout)),
            error: None,
        },
        Ok(Ok(out)) => Sessions {
            protocols: Vec::new(),
            error: Some(format!(
                "birdc failed: {}",
                String::from_utf8_lossy(&out.stdout).trim()
            )),
        },
        Ok(Err(err)) => Sessions {
            protocols: Vec::new(),
            error: Some(format!("running birdc: {err}")),
        },
        Err(_) => Sessions {
            protocols: Vec::new(),
            error: Some("birdc did not answer within 2 s".into()),
        },
    }
}
