//! One owner of an interface's data plane and of a pin directory.
//!
//! The interface lock is a listening abstract unix socket named after the interface
//! index (abstract names belong to the network namespace, as interfaces do), held for
//! the life of the process: the kernel releases it however the process ends, SIGKILL
//! included. Whoever finds the name taken connects to it and learns the owner's pid
//! through `SO_PEERCRED`. The pin directory lock is an `flock` on the directory; its
//! owner is found in `/proc/locks`.

use std::{
    fmt,
    fs::File,
    io,
    os::{
        fd::AsRawFd,
        linux::net::SocketAddrExt,
        unix::{
            fs::MetadataExt,
            net::{SocketAddr, UnixListener, UnixStream},
        },
    },
    path::{Path, PathBuf},
};

/// A process holding a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub pid: i32,
    /// Its command line, as far as `/proc` shows it.
    pub command: String,
}

impl Owner {
    fn of(pid: i32) -> Owner {
        let command = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|raw| {
                raw.split(|&b| b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        Owner { pid, command }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.command.is_empty() {
            write!(f, "pid {}", self.pid)
        } else {
            write!(f, "pid {} (`{}`)", self.pid, self.command)
        }
    }
}

/// Why a lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error(
        "another lb-agent already runs on interface `{interface}` in this network namespace: \
         {owner}; stop it first (`kill -TERM {pid}`, or `systemctl stop lb-agent`) — it leaves \
         the XDP program attached and a new agent adopts it",
        pid = owner.pid
    )]
    Interface { interface: String, owner: Owner },
    #[error(
        "another lb-agent holds the pin directory {}: {}; stop it first, or give this agent \
         another `agent.pin_path`",
        dir.display(),
        owner.as_ref().map_or_else(|| "pid unknown".to_string(), Owner::to_string)
    )]
    PinDir { dir: PathBuf, owner: Option<Owner> },
    #[error("{what}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn socket_name(ifindex: u32) -> String {
    format!("lb-agent/xdp/ifindex/{ifindex}")
}

fn address(ifindex: u32) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(socket_name(ifindex).as_bytes())
}

/// Takes the interface lock for the rest of this process's life, or names the owner.
pub fn claim_interface(ifindex: u32, interface: &str) -> Result<(), OwnerError> {
    let addr = address(ifindex).map_err(|source| OwnerError::Io {
        what: "naming the interface lock",
        source,
    })?;
    match UnixListener::bind_addr(&addr) {
        Ok(listener) => {
            // Accept and drop, so that any number of callers can ask who owns it.
            std::thread::Builder::new()
                .name("owner-lock".into())
                .spawn(move || {
                    for conn in listener.incoming() {
                        if conn.is_err() {
                            // Out of descriptors, say: do not spin.
                            std::thread::sleep(std::time::Duration::from_millis(100));
                        }
                    }
                })
                .map_err(|source| OwnerError::Io {
                    what: "starting the interface lock thread",
                    source,
                })?;
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Err(OwnerError::Interface {
            interface: interface.to_string(),
            owner: interface_owner(ifindex).unwrap_or(Owner {
                pid: 0,
                command: "an agent that is exiting".into(),
            }),
        }),
        Err(source) => Err(OwnerError::Io {
            what: "taking the interface lock",
            source,
        }),
    }
}

/// The process holding interface `ifindex`'s lock in this network namespace, if any.
pub fn interface_owner(ifindex: u32) -> Option<Owner> {
    let conn = UnixStream::connect_addr(&address(ifindex).ok()?).ok()?;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes; the fd is open.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then(|| Owner::of(cred.pid))
}

/// Takes the lock of pin directory `dir` (held while the returned file is open).
pub fn claim_pin_dir(dir: &Path) -> Result<File, OwnerError> {
    let file = File::open(dir).map_err(|source| OwnerError::Io {
        what: "opening the pin directory to lock it",
        source,
    })?;
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(file);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(OwnerError::Io {
            what: "locking the pin directory",
            source: err,
        });
    }
    Err(OwnerError::PinDir {
        dir: dir.to_path_buf(),
        owner: flock_owner(&file),
    })
}

/// The process holding pin directory `dir`'s lock, if any.
pub fn pin_dir_owner(dir: &Path) -> Option<Owner> {
    match claim_pin_dir(dir) {
        Err(OwnerError::PinDir { owner, .. }) => owner.or(Some(Owner {
            pid: 0,
            command: "unknown".into(),
        })),
        _ => None,
    }
}

/// The pid `/proc/locks` gives for an flock on `file`'s inode.
fn flock_owner(file: &File) -> Option<Owner> {
    let ino = file.metadata().ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|line| {
        // "1: FLOCK  ADVISORY  WRITE 1234 00:2a:5678 0 EOF"
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        let pid: i32 = fields.get(4)?.parse().ok()?;
        let lock_ino: u64 = fields.get(5)?.rsplit(':').next()?.parse().ok()?;
        (lock_ino == ino).then(|| Owner::of(pid))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An interface index no real interface has, unique to this test process.
    fn fake_ifindex() -> u32 {
        0x8000_0000 | std::process::id()
    }

    #[test]
    fn a_second_claim_on_an_interface_names_the_owner() {
        let ifindex = fake_ifindex();
        assert_eq!(interface_owner(ifindex), None);
        claim_interface(ifindex, "test0").expect("the first claim");
        let me = std::process::id() as i32;
        assert_eq!(interface_owner(ifindex).map(|o| o.pid), Some(me));
        match claim_interface(ifindex, "test0") {
            Err(err @ OwnerError::Interface { .. }) => {
                let text = err.to_string();
                assert!(text.contains(&format!("pid {me}")), "{text}");
                assert!(text.contains("`test0`"), "{text}");
            }
            other => panic!("a second claim must be refused, got {other:?}"),
        }
    }

    #[test]
    fn a_second_claim_on_a_pin_directory_names_the_owner() {
        let dir = std::env::temp_dir().join(format!("lb-owner-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let held = claim_pin_dir(&dir).expect("the first claim");
        let me = std::process::id() as i32;
        match claim_pin_dir(&dir) {
            Err(OwnerError::PinDir { owner, .. }) => {
                assert_eq!(owner.map(|o| o.pid), Some(me));
            }
            other => panic!("a second claim must be refused, got {other:?}"),
        }
        assert_eq!(pin_dir_owner(&dir).map(|o| o.pid), Some(me));
        drop(held);
        assert_eq!(pin_dir_owner(&dir), None);
        std::fs::remove_dir(&dir).unwrap();
    }
}
