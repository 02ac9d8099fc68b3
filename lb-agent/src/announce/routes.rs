//! Where an announced VIP lives: a host address (`/32`, `/128`) on an interface the agent
//! owns. The routing daemon exports that interface's prefixes (BIRD `protocol direct`),
//! so the daemon needs no knowledge of lb. The kernel here has no `dummy` driver: the
//! agent creates an `ifb` device when the interface is missing (an address on `lo` works
//! too). Changes go through rtnetlink ([`super::rtnl`]).
//!
//! Every address carries a lifetime (`agent.announce_lifetime`) that the running agent
//! restarts well before it ends: an agent that dies and stays dead lets the kernel
//! remove the addresses, and the routing daemon withdraws the node (docs/multi-node.md,
//! "Dead-man switch").

use std::{
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use super::rtnl::{self, RtnlError};
use crate::netlink;

/// A route operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error(transparent)]
    Netlink(#[from] RtnlError),
    #[error("interface {0} does not exist any more")]
    Gone(String),
    #[error("{args} failed: {stderr}")]
    /// A failure injected by [`MemoryRoutes`] (tests).
    Failed { args: String, stderr: String },
}

/// The announced VIPs as routes.
pub trait VipRoutes {
    /// Announces `ip`, or refreshes it when it is announced: its lifetime starts again.
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
    /// Lifetime of every address added or refreshed; `None`: they never expire.
    lifetime: Option<Duration>,
}

impl KernelRoutes {
    /// Uses `interface`, creating it as an `ifb` device when it does not exist, and sets
    /// it up. Addresses get `lifetime` (`None`: they never expire).
    pub fn open(interface: &str, lifetime: Option<Duration>) -> Result<Self, RouteError> {
        if netlink::link_index(interface).is_none() {
            match rtnl::create_ifb(interface) {
                Ok(()) => {}
                // Made meanwhile by someone else: use it.
                Err(e) if e.errno() == Some(libc::EEXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let routes = Self {
            interface: interface.to_string(),
            lifetime,
        };
        rtnl::set_up(routes.index()?, interface)?;
        Ok(routes)
    }

    /// The interface's index now (it may have been removed and made again).
    fn index(&self) -> Result<u32, RouteError> {
        netlink::link_index(&self.interface).ok_or_else(|| RouteError::Gone(self.interface.clone()))
    }
}

impl VipRoutes for KernelRoutes {
    fn add(&self, vip: IpAddr) -> Result<(), RouteError> {
        Ok(rtnl::replace_host_address(
            self.index()?,
            vip,
            self.lifetime,
        )?)
    }

    fn remove(&self, vip: IpAddr) -> Result<(), RouteError> {
        match rtnl::delete_host_address(self.index()?, vip) {
            Ok(()) => Ok(()),
            // Not there (expired, or removed by hand): withdrawn all the same.
            Err(e) if e.errno() == Some(libc::EADDRNOTAVAIL) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn list(&self) -> Result<Vec<IpAddr>, RouteError> {
        Ok(rtnl::host_addresses(self.index()?)?
            .into_iter()
            .map(|a| a.addr)
            .collect())
    }

    fn describe(&self) -> String {
        self.interface.clone()
    }
}

/// Routes kept in memory (tests), with an optional failure to inject.
#[derive(Clone, Debug, Default)]
pub struct MemoryRoutes {
    pub installed: Arc<Mutex<Vec<IpAddr>>>,
    /// Every successful `add`, in order (announcements and refreshes).
    pub added: Arc<Mutex<Vec<IpAddr>>>,
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
        self.added.lock().expect("not poisoned").push(vip);
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
