//! Network namespaces as RAII guards, and running code inside one on a dedicated thread.
//!
//! A [`NetNs`] is a cheap, cloneable handle; the namespace is deleted (`ip netns del`)
//! when the last handle drops, so a process or socket helper that holds a clone keeps
//! the namespace alive exactly as long as it needs it.

use std::{fs::File, os::fd::AsRawFd, panic, path::PathBuf, sync::Arc, thread};

use crate::util::{cmd, error::Error};

/// The ephemeral port range of client namespaces: fixed source ports of client batches
/// stay below it.
pub const EPHEMERAL_PORTS: &str = "50000 60999";

/// A named network namespace (`/run/netns/NAME`), deleted when the last clone drops.
#[derive(Clone, Debug)]
pub struct NetNs(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    name: String,
}

impl NetNs {
    /// Creates namespace `name` (`ip netns add`) with its loopback up.
    pub fn create(name: &str) -> Result<Self, Error> {
        cmd::ip(&["netns", "add", name])
            .map_err(|e| e.context(format!("creating network namespace {name}")))?;
        // From here on the guard owns the namespace, so a failure below removes it.
        let ns = NetNs(Arc::new(Inner {
            name: name.to_owned(),
        }));
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name, as `ip netns` shows it.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// Runs `ip -n NAME args…`.
    pub fn ip(&self, args: &[&str]) -> Result<String, Error> {
        let mut full = vec!["-n", self.name()];
        full.extend_from_slice(args);
        cmd::ip(&full).map_err(|source| self.command_error(source))
    }

    /// Runs `nft ARGS…` in this namespace (`ip netns exec NAME nft …`): a ruleset as
    /// one argument, or a command such as `list table inet NAME`; returns its stdout.
    pub fn nft(&self, args: &[&str]) -> Result<String, Error> {
        let mut full = vec!["netns", "exec", self.name(), "nft"];
        full.extend_from_slice(args);
        cmd::ip(&full).map_err(|source| self.command_error(source))
    }

    /// Runs many `ip` commands (without the leading `ip`) in this namespace in one process.
    pub fn ip_batch(&self, lines: &[String]) -> Result<(), Error> {
        cmd::ip_batch(Some(self.name()), lines).map_err(|source| self.command_error(source))
    }

    /// Runs `f` on a new thread that has entered this namespace, and returns its result.
    ///
    /// Sockets `f` creates belong to the namespace for their whole life, even when they
    /// are used later from other threads. A panic in `f` is passed on to the caller.
    pub fn run<F, R>(&self, f: F) -> Result<R, Error>
    where
        F: FnOnce() -> R + Send,
        R: Send,
    {
        let path = PathBuf::from(crate::net::names::NETNS_DIR).join(self.name());
        let file = File::open(&path).map_err(|source| Error::Io {
            what: format!(
                "opening {} to enter network namespace {}",
                path.display(),
                self.name()
            ),
            source,
        })?;
        thread::scope(|scope| {
            let handle = thread::Builder::new()
                .name(format!("netns-{}", self.name()))
                .spawn_scoped(scope, || {
                    // SAFETY: setns on a valid namespace fd; it only changes this thread's
                    // network namespace, and the thread ends with `f`.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(Error::Io {
                            what: format!("setns into network namespace {}", self.name()),
                            source: std::io::Error::last_os_error(),
                        });
                    }
                    Ok(f())
                })
                .map_err(|source| Error::Io {
                    what: format!(
                        "could not start a thread for network namespace {}",
                        self.name()
                    ),
                    source,
                })?;
            match handle.join() {
                Ok(result) => result,
                Err(payload) => panic::resume_unwind(payload),
            }
        })
    }

    /// Gives `ifname` a transmit queue of `limit` packets (`pfifo`) in place of a veth's
    /// default `noqueue`, as a NIC has one: with a queue, a veth whose peer's ring is
    /// full pushes back (Linux 6.16+: the queue holds the packet, and a full queue
    /// refuses it with `ENOBUFS`) instead of dropping it. For scenarios and benchmarks
    /// that send bursts and count what arrived.
    pub fn hold_bursts(&self, ifname: &str, limit: u32) -> Result<(), Error> {
        let limit = limit.to_string();
        let args = [
            "-n",
            self.name(),
            "qdisc",
            "replace",
            "dev",
            ifname,
            "root",
            "pfifo",
            "limit",
        ];
        let mut all = args.to_vec();
        all.push(&limit);
        cmd::run("tc", &all)
            .map(drop)
            .map_err(|source| self.command_error(source))
    }

    /// Writes `value` to the sysctl `key` (dotted, e.g. `net.ipv4.conf.all.arp_ignore`)
    /// of this namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), Error> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        // /proc/sys/net resolves against the network namespace of the writing thread.
        self.run(|| std::fs::write(&path, value))?
            .map_err(Error::io(format!(
                "writing sysctl {key} = {value} in network namespace {}",
                self.name()
            )))
    }

    /// Moves this namespace's ephemeral port range to [`EPHEMERAL_PORTS`], above every
    /// fixed source port a client batch binds (`first_port + i` stays below 50000), so a
    /// connection that took an ephemeral port (a download, an echo connection, its
    /// `TIME_WAIT`) never holds a port a later batch binds.
    pub fn keep_ephemeral_ports_above_fixed(&self) -> Result<(), Error> {
        self.sysctl("net.ipv4.ip_local_port_range", EPHEMERAL_PORTS)
    }

    fn command_error(&self, source: Error) -> Error {
        source.context(format!("in network namespace {}", self.name()))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Processes still inside keep the namespace alive until they exit; the name goes now.
        if let Err(err) = cmd::ip(&["netns", "del", &self.name]) {
            eprintln!(
                "lb-tests: could not delete network namespace {}: {err}",
                self.name
            );
        }
    }
}
