//! Privileges: the capabilities the agent needs, the locked-memory limit, and whether
//! this kernel accepts the program (the embedded object loaded, not attached).

use std::time::Instant;

use super::Finding;

const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;

pub fn check() -> Vec<Finding> {
    let mut out = Vec::new();
    let eff = effective_caps();
    out.push(match eff {
        Some(eff) => capabilities(eff),
        None => Finding::warning("capabilities", "cannot read CapEff from /proc/self/status"),
    });
    out.push(memlock());
    let loads =
        eff.is_none_or(|eff| crate::dataplane::attach::caps::missing_from_mask(eff).is_none());
    out.push(if loads {
        load()
    } else {
        Finding::blocker(
            "bpf load",
            "not tried: without the capabilities above the kernel refuses it",
        )
    });
    out
}

/// The findings for the effective capability mask `eff`.
pub fn capabilities(eff: u64) -> Finding {
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    if let Some(missing) = crate::dataplane::attach::caps::missing_from_mask(eff) {
        return Finding::blocker(
            "capabilities",
            format!(
                "missing {missing}: the agent cannot load or attach the program; run it as \
                 root or grant them (docs/deployment.md)"
            ),
        );
    }
    let mut lacks = Vec::new();
    if !has(CAP_NET_RAW) {
        lacks.push("CAP_NET_RAW (icmp probes fail; tcp probes connect instead of SYN checks)");
    }
    if !has(CAP_SYS_ADMIN) {
        lacks.push(
            "CAP_SYS_ADMIN (a restarted agent cannot adopt the running program; pin_path \
             cannot mount bpffs)",
        );
    }
    if lacks.is_empty() {
        Finding::ok(
            "capabilities",
            "CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_ADMIN",
        )
    } else {
        Finding::warning("capabilities", format!("without {}", lacks.join("; ")))
    }
}

fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// `RLIMIT_MEMLOCK`: only kernels before 5.11 charge BPF maps to it (later ones charge
/// the cgroup), and those are older than lb's minimum; reported for the record.
fn memlock() -> Finding {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Finding::warning("memlock", "cannot read RLIMIT_MEMLOCK");
    }
    let show = |v: libc::rlim_t| {
        if v == libc::RLIM_INFINITY {
            "unlimited".to_string()
        } else {
            format!("{} KiB", v / 1024)
        }
    };
    Finding::ok(
        "memlock",
        format!(
            "RLIMIT_MEMLOCK {} (kernels since 5.11 charge BPF maps to the cgroup, not this \
             limit: a memory limit on the agent's cgroup must leave room for the maps, \
             docs/capacity.md)",
            show(lim.rlim_cur)
        ),
    )
}

/// Loads the embedded object (maps created, both programs through the verifier), then
/// frees it.
fn load() -> Finding {
    let start = Instant::now();
    match crate::dataplane::BpfDataplane::load() {
        Ok(dp) => {
            drop(dp);
            Finding::ok(
                "bpf load",
                format!(
                    "the XDP program and its maps load on this kernel ({} ms; not attached)",
                    start.elapsed().as_millis()
                ),
            )
        }
        Err(err) => Finding::blocker(
            "bpf load",
            format!("the kernel refuses the XDP program or its maps: {err}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Level;

    const CAP_NET_ADMIN: u32 = 12;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;

    #[test]
    fn missing_capabilities_block_and_optional_ones_warn() {
        assert_eq!(capabilities(0).level, Level::Blocker);
        assert_eq!(capabilities(u64::MAX).level, Level::Ok);
        let no_raw = !(1u64 << CAP_NET_RAW);
        let f = capabilities(no_raw);
        assert_eq!(f.level, Level::Warning);
        assert!(f.text.contains("CAP_NET_RAW"), "{f}");
        let minimal = (1u64 << CAP_BPF) | (1u64 << CAP_PERFMON) | (1u64 << CAP_NET_ADMIN);
        assert_eq!(capabilities(minimal).level, Level::Warning);
    }
}
