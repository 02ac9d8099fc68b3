//! Where an announced VIP lives: a host address (`/32`, `/128`) on an interface the agent
//! owns. The routing daemon exports that interface's prefixes (BIRD `protocol direct`),
//! so the daemon needs no knowledge of lb. The kernel here has no `dummy` driver: the
//! agent creates an `ifb` device when the interface is missing (an address on `lo` works
//! too). Changes go through iproute2's `ip`, which every lb host already has.

use std::{
    net::IpAddr,
    process::Command,
    sync::{Arc, Mutex},
};

/// A route operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("running `ip {args}`: {source}")]
    Spawn {
        args: String,
        source: std::io::Error,
    },
    #[error("`ip {args}` failed: {stderr}")]
    Failed { args: String, stderr: String },
}

/// The announced VIPs as routes.
pub trait VipRoutes {
    /// Announces `ip` (idempotent).
    fn add(&self, ip: IpAddr) -> Result<(), RouteError>;
    /// Withdraws `ip` (idempotent).
    fn remove(&self, ip: IpAddr) -> Result<(), RouteError>;
    /// Host addresses on the interface now.
    fn list(&self) -> Result<Vec<IpAddr>, RouteError>;
    /// Shown in status, e.g. the interface name.
    fn describe(&self) -> String;
}

/// VIPs as addresses on a kernel interface.
#[derive(Clone, Debug)]
pub struct KernelRoutes {
    interface: String,
}

impl KernelRoutes {
    /// Uses `interface`, creating it as an `ifb` device when it does not exist, and sets
    /// it up.
    pub fn open(interface: &str) -> Result<Self, RouteError> {
        if ip(&["link", "show", "dev", interface]).is_err() {
            ip(&["link", "add", interface, "type", "ifb"])?;
        }
        ip(&["link", "set", "dev", interface, "up"])?;
        Ok(Self {
            interface: interface.to_string(),
        })
    }
}

impl VipRoutes for KernelRoutes {
    fn add(&self, vip: IpAddr) -> Result<(), RouteError> {
        let prefix = host_prefix(vip);
        let mut args = vec!["addr", "replace", &prefix, "dev", &self.interface];
        if vip.is_ipv6() {
            args.push("nodad");
        }
        ip(&args).map(drop)
    }

    fn remove(&self, vip: IpAddr) -> Result<(), RouteError> {
        if !self.list()?.contains(&vip) {
            return Ok(());
        }
        ip(&["addr", "del", &host_prefix(vip), "dev", &self.interface]).map(drop)
    }

    fn list(&self) -> Result<Vec<IpAddr>, RouteError> {
        let out = ip(&["-o", "addr", "show", "dev", &self.interface])?;
        Ok(parse_host_addrs(&out))
    }

    fn describe(&self) -> String {
        self.interface.clone()
    }
}

fn host_prefix(vip: IpAddr) -> String {
    match vip {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

/// The host (`/32`, `/128`) addresses in `ip -o addr show` output.
pub fn parse_host_addrs(out: &str) -> Vec<IpAddr> {
    let mut found = Vec::new();
    for line in out.lines() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w != "inet" && w != "inet6" {
                continue;
            }
            let Some((addr, len)) = words.next().and_then(|p| p.split_once('/')) else {
                continue;
            };
            let Ok(ip) = addr.parse::<IpAddr>() else {
                continue;
            };
            let host = match ip {
                IpAddr::V4(_) => len == "32",
                IpAddr::V6(_) => len == "128",
            };
            if host {
                found.push(ip);
            }
        }
    }
    found
}

fn ip(args: &[&str]) -> Result<String, RouteError> {
    let joined = args.join(" ");
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| RouteError::Spawn {
            args: joined.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(RouteError::Failed {
            args: joined,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Routes kept in memory (tests), with an optional failure to inject.
#[derive(Clone, Debug, Default)]
pub struct MemoryRoutes {
    pub installed: Arc<Mutex<Vec<IpAddr>>>,
    /// While set, every add/remove fails with this message.
    pub fail: Arc<Mutex<Option<String>>>,
}

impl MemoryRoutes {
    pub fn installed(&self) -> Vec<IpAddr> {
        let mut v = self.installed.lock().expect("not poisoned").clone();
        v.sort();
        v
    }

    fn check(&self, args: &str) -> Result<(), RouteError> {
        match self.fail.lock().expect("not poisoned").clone() {
            Some(stderr) => Err(RouteError::Failed {
                args: args.to_string(),
                stderr,
            }),
            None => Ok(()),
        }
    }
}

impl VipRoutes for MemoryRoutes {
    fn add(&self, vip: IpAddr) -> Result<(), RouteError> {
        self.check("add")?;
        let mut v = self.installed.lock().expect("not poisoned");
        if !v.contains(&vip) {
            v.push(vip);
        }
        Ok(())
    }

    fn remove(&self, vip: IpAddr) -> Result<(), RouteError> {
        self.check("del")?;
        self.installed
            .lock()
            .expect("not poisoned")
            .retain(|&a| a != vip);
        Ok(())
    }

    fn list(&self) -> Result<Vec<IpAddr>, RouteError> {
        Ok(self.installed())
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}
