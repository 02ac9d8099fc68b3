//! Which of the capabilities the agent needs the process lacks, from `CapEff` in
//! `/proc/self/status`, so that a refusal names them instead of "Operation not
//! permitted".

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The missing capabilities as `"CAP_A and CAP_B"`, or `None` when the agent has what
/// it needs: CAP_NET_ADMIN, and CAP_BPF with CAP_PERFMON or CAP_SYS_ADMIN (without
/// CAP_PERFMON the verifier refuses the program's packet-pointer arithmetic, "pointer
/// -= pointer prohibited"). Adopting a running program also needs CAP_SYS_ADMIN; its
/// refusal says so.
pub fn missing() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    missing_from(eff)
}

/// [`missing`] for the effective capability mask `eff` (`CapEff`).
pub fn missing_from_mask(eff: u64) -> Option<String> {
    missing_from(eff)
}

fn missing_from(eff: u64) -> Option<String> {
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    let loads = has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON));
    if !loads {
        missing.push("CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    (!missing.is_empty()).then(|| missing.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_missing() {
        assert_eq!(missing_from(u64::MAX), None);
        assert_eq!(
            missing_from(0).as_deref(),
            Some("CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) and CAP_NET_ADMIN")
        );
        let bpf_net = (1u64 << CAP_BPF) | (1u64 << CAP_NET_ADMIN);
        assert_eq!(
            missing_from(bpf_net).as_deref(),
            Some("CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)")
        );
        let bpf_only = (1u64 << CAP_BPF) | (1u64 << CAP_PERFMON);
        assert_eq!(missing_from(bpf_only).as_deref(), Some("CAP_NET_ADMIN"));
        let admin = (1u64 << CAP_SYS_ADMIN) | (1u64 << CAP_NET_ADMIN);
        assert_eq!(missing_from(admin), None);
    }
}
