//! The kernel: its version against the oldest the program runs on, and BTF.
//!
//! The oldest kernel is set by what the XDP program and the agent use:
//! BPF atomic instructions (`cmpxchg`/`xchg`/fetch-and on the flow and nat tables'
//! bucket words) and the per-bucket lock built on them: 5.12; `bpf_ktime_get_coarse_ns`:
//! 5.11; the ring buffer of passive events: 5.8; mmapable arrays (Maglev tables written
//! in place): 5.5; CAP_BPF/CAP_PERFMON instead of CAP_SYS_ADMIN: 5.8; map memory charged
//! to the cgroup instead of RLIMIT_MEMLOCK: 5.11.

use super::Finding;

/// The oldest kernel lb runs on (see the module's text).
pub const MIN_KERNEL: (u32, u32) = (5, 12);

const CHECK: &str = "kernel";

pub fn check() -> Vec<Finding> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let mut out = vec![version(&release)];
    out.push(btf(std::path::Path::new("/sys/kernel/btf/vmlinux").exists()));
    out
}

/// The finding for kernel release `release` (`6.1.0-18-amd64`).
pub fn version(release: &str) -> Finding {
    let (min_major, min_minor) = MIN_KERNEL;
    match parse(release) {
        Some(v) if v >= MIN_KERNEL => Finding::ok(
            CHECK,
            format!(
                "{release} (lb needs {min_major}.{min_minor} or later: BPF atomics on the flow \
                 and nat tables)"
            ),
        ),
        Some(_) => Finding::blocker(
            CHECK,
            format!(
                "{release} is older than {min_major}.{min_minor}, the oldest lb runs on (BPF \
                 atomic compare-and-swap on the flow and nat tables, 5.12; the ring buffer, \
                 5.8): upgrade the kernel"
            ),
        ),
        None => Finding::warning(
            CHECK,
            format!(
                "cannot read the kernel version ({release:?}); lb needs \
                 {min_major}.{min_minor} or later"
            ),
        ),
    }
}

/// The finding for whether `/sys/kernel/btf/vmlinux` exists.
pub fn btf(present: bool) -> Finding {
    if present {
        Finding::ok(
            "btf",
            "/sys/kernel/btf/vmlinux present (bpftool can show lb's maps)",
        )
    } else {
        Finding::warning(
            "btf",
            "/sys/kernel/btf/vmlinux missing (kernel built without CONFIG_DEBUG_INFO_BTF): the \
             `bpf load` check tells whether lb loads without it; tools that need the kernel's \
             BTF will not work; prefer a kernel with BTF",
        )
    }
}

/// `(major, minor)` of a release string.
fn parse(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Level;

    #[test]
    fn the_minimum_is_5_12() {
        assert_eq!(version("6.1.0-18-amd64").level, Level::Ok);
        assert_eq!(version("5.12.0").level, Level::Ok);
        assert_eq!(version("5.11.22-generic").level, Level::Blocker);
        assert_eq!(version("4.19.0").level, Level::Blocker);
        assert_eq!(version("junk").level, Level::Warning);
        assert_eq!(btf(false).level, Level::Warning);
    }
}
