//! What a service manager or a container runtime does to a process, reproduced with the
//! kernel's own tools (`nsenter`, `unshare`, `mount`, `prlimit`, `setpriv`): a shell
//! script that builds the confinement in fresh namespaces and then `exec`s the agent, so
//! the agent is the process the manager would have started (same pid, same signals).
//!
//! Not reproduced: seccomp filters, AppArmor/SELinux profiles, cgroups, a private /dev,
//! user namespaces, and (for containers) an image of its own: the root file system is
//! the host's, made read-only.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::net::netns::NetNs;

/// The capabilities `docker run` and `podman run` leave a container by default.
pub const DOCKER_DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// What Docker masks in /proc (bound over by /dev/null or an empty read-only tmpfs).
const DOCKER_MASKED: [&str; 10] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];

/// What Docker makes read-only in /proc.
const DOCKER_READ_ONLY: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The exit status of the script when the root it built is still writable.
pub const ROOT_WRITABLE: i32 = 97;

/// A shell script, built step by step, that ends by exec'ing the confined program.
#[derive(Clone, Debug, Default)]
pub struct Script {
    lines: Vec<String>,
}

/// `s` quoted for the shell.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Script {
    pub fn line(&mut self, line: impl Into<String>) -> &mut Self {
        self.lines.push(line.into());
        self
    }

    /// Every mount outside /dev, /proc and /sys made read-only (systemd's
    /// `ProtectSystem=strict`, `docker run --read-only`), then checked: the script exits
    /// with [`ROOT_WRITABLE`] when `/usr` or `/etc` can still be written.
    pub fn read_only_root(&mut self) -> &mut Self {
        // Mounts of other tests may come and go while this runs (propagation): a remount
        // of one that vanished fails, which is why failures are tolerated and the
        // outcome is checked instead.
        self.line(
            "findmnt -rn -o TARGET | while read -r m; do case \"$m\" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*) ;; \
             *) mount -o remount,bind,ro \"$m\" 2>/dev/null || true ;; esac; done",
        );
        self.line(format!(
            "for p in /usr /etc /; do if touch \"$p/.lb-rw-probe-$$\" 2>/dev/null; then \
             rm -f \"$p/.lb-rw-probe-$$\"; echo \"confine: $p is still writable\" >&2; exit {ROOT_WRITABLE}; fi; done"
        ))
    }

    /// An empty read-only tmpfs over `dir`, with `subdirs` as read-write bind mounts of
    /// host directories `(host, inside)` (systemd's RuntimeDirectory=/StateDirectory=
    /// under ProtectSystem=strict; a container's tmpfs and volume). The host directory
    /// keeps its mode, so create it with the mode the manager would.
    pub fn tmpfs_with_binds(&mut self, dir: &str, binds: &[(&Path, &str)]) -> &mut Self {
        self.line(format!("mount -t tmpfs -o mode=0755 tmpfs {}", quote(dir)));
        for (_, inside) in binds {
            self.line(format!("mkdir -p {}", quote(inside)));
        }
        self.line(format!("mount -o remount,ro {}", quote(dir)));
        for (host, inside) in binds {
            let host = quote(&host.display().to_string());
            let inside = quote(inside);
            // A bind keeps the source's read-only flag: made read-write again.
            self.line(format!(
                "mount --bind {host} {inside} && mount -o remount,bind,rw {inside}"
            ));
        }
        self
    }

    /// An empty, read-only, mode 000 tmpfs over each existing `dir` (ProtectHome=yes).
    pub fn inaccessible(&mut self, dirs: &[&str]) -> &mut Self {
        for d in dirs {
            let d = quote(d);
            self.line(format!(
                "if [ -d {d} ]; then mount -t tmpfs -o ro,mode=000 tmpfs {d}; fi"
            ));
        }
        self
    }

    /// A container's /sys (a fresh sysfs of its network namespace, read-only, so no
    /// bpffs) and /proc (masked and read-only where Docker does so).
    pub fn container_sys_and_proc(&mut self) -> &mut Self {
        self.line("mount -t sysfs -o ro,nosuid,nodev,noexec sysfs /sys");
        for p in DOCKER_MASKED {
            self.line(format!(
                "if [ -d {p} ]; then mount -t tmpfs -o ro tmpfs {p}; elif [ -e {p} ]; then mount --bind /dev/null {p}; fi"
            ));
        }
        for p in DOCKER_READ_ONLY {
            self.line(format!(
                "if [ -e {p} ]; then mount --bind {p} {p} && mount -o remount,bind,ro {p}; fi"
            ));
        }
        self
    }

    /// The script's text, ending with `exec command…`.
    pub fn exec(&self, command: &[String]) -> String {
        let mut text = String::from("set -e\n");
        for l in &self.lines {
            text.push_str(l);
            text.push('\n');
        }
        let words: Vec<String> = command.iter().map(|w| quote(w)).collect();
        text.push_str(&format!("exec {}\n", words.join(" ")));
        text
    }
}

/// `prlimit` and `setpriv` in front of `program`: root with `caps` as bounding set (so
/// also permitted and effective after the exec), as inheritable and ambient set too
/// when `ambient` (systemd's AmbientCapabilities=; a container has neither), the
/// limits `(resource, value)` as soft and hard limit, and no_new_privs when asked.
pub fn privileges(
    caps: &[String],
    ambient: bool,
    no_new_privs: bool,
    limits: &[(&str, String)],
    program: &[String],
) -> Vec<String> {
    let set = format!("-all,{}", crate::agent::unit_file::setpriv_caps(caps));
    let mut cmd = vec!["prlimit".to_owned()];
    for (resource, value) in limits {
        cmd.push(format!("--{resource}={value}:{value}"));
    }
    cmd.extend(["setpriv".to_owned(), format!("--bounding-set={set}")]);
    if ambient {
        cmd.push(format!("--inh-caps={set}"));
        cmd.push(format!("--ambient-caps={set}"));
    } else {
        cmd.push("--inh-caps=-all".to_owned());
    }
    if no_new_privs {
        cmd.push("--no-new-privs".to_owned());
    }
    cmd.push("--".to_owned());
    cmd.extend(program.iter().cloned());
    cmd
}

/// `nsenter --net=/run/netns/NS` (systemd's `NetworkNamespacePath=`, a container's own
/// network namespace): only the network namespace, no /sys remount.
pub fn in_netns(ns: &NetNs) -> Command {
    let mut cmd = Command::new("nsenter");
    let path = PathBuf::from(crate::net::names::NETNS_DIR).join(ns.name());
    cmd.arg(format!("--net={}", path.display()));
    cmd.arg("--");
    cmd
}

/// Where the process `pid` really runs: its children as listed by the kernel.
pub fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// `pid`'s ids in the pid namespaces it belongs to, outermost first (`NSpid:`).
pub fn ns_pids(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|v| {
            v.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// `pid`'s `Cap*` lines and `NoNewPrivs` from /proc, for assertions and reports.
pub fn status_field(pid: u32, field: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_owned())
        })
}

/// The capability bits of `caps` (names as in `capabilities(7)`), for comparing with
/// `CapEff` / `CapBnd`.
pub fn cap_mask(caps: &[String]) -> u64 {
    caps.iter()
        .map(|c| {
            let bit = match c.as_str() {
                "CAP_CHOWN" => 0,
                "CAP_DAC_OVERRIDE" => 1,
                "CAP_FOWNER" => 3,
                "CAP_FSETID" => 4,
                "CAP_KILL" => 5,
                "CAP_SETGID" => 6,
                "CAP_SETUID" => 7,
                "CAP_SETPCAP" => 8,
                "CAP_NET_BIND_SERVICE" => 10,
                "CAP_NET_ADMIN" => 12,
                "CAP_NET_RAW" => 13,
                "CAP_SYS_CHROOT" => 18,
                "CAP_SYS_ADMIN" => 21,
                "CAP_MKNOD" => 27,
                "CAP_AUDIT_WRITE" => 29,
                "CAP_SETFCAP" => 31,
                "CAP_PERFMON" => 38,
                "CAP_BPF" => 39,
                other => panic!("cap_mask: unknown capability {other}"),
            };
            1u64 << bit
        })
        .fold(0, |a, b| a | b)
}
