//! `lb-probe-bench` at a small scale, so the benchmark's machinery (target namespaces,
//! threaded NAPI, the SYN responder, the agent over real maps, SYN checks and connects, the failure window) keeps working on a
//! fresh machine: every target is probed, the closed ones become `unhealthy`, the open
//! ones never fail, and the namespaces are gone afterwards. Figures are not asserted.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
};

const BENCH: &str = env!("CARGO_BIN_EXE_lb-probe-bench");
const TARGETS: usize = 300;
/// `CLOSE_EVERY` of the benchmark: every 10th target is closed in the failure window.
const CLOSED: usize = TARGETS / 10;

/// The figures of one run, and the pid the run had (its namespaces are named after it).
fn run(net: &str, check: &str) -> (BTreeMap<String, String>, u32) {
    let child = Command::new(BENCH)
        .args(["--child", "--dataplane", "bpf", "--tcp-check", check])
        .args(["--targets", &TARGETS.to_string(), "--net", net])
        .args(["--warmup", "1", "--window", "2", "--fail-window", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running lb-probe-bench");
    let pid = child.id();
    let out = child
        .wait_with_output()
        .expect("waiting for lb-probe-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "lb-probe-bench --net {net} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let figures = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("result\t")?.split_once('\t'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    (figures, pid)
}

fn check(net: &str, tcp_check: &str) {
    let (f, pid) = run(net, tcp_check);
    let get = |k: &str| {
        f.get(k)
            .unwrap_or_else(|| panic!("no figure {k} in {f:?}"))
            .clone()
    };
    let probes_per_s: f64 = get("probes_per_s").parse().expect("probes_per_s");
    // One probe per target per second is scheduled; a window of 2 s sees about that.
    assert!(
        probes_per_s > TARGETS as f64 * 0.7,
        "{net}: {probes_per_s} probes/s for {TARGETS} targets at a 1 s interval: {f:?}"
    );
    assert_eq!(get("failed"), "0", "{net}: no target was closed yet: {f:?}");
    assert_eq!(get("fail_closed"), CLOSED.to_string(), "{net}: {f:?}");
    assert_eq!(
        get("fail_unhealthy_closed"),
        CLOSED.to_string(),
        "{net}: every closed target should become unhealthy: {f:?}"
    );
    assert_eq!(
        get("fail_open_failed"),
        "0",
        "{net}: open targets never fail: {f:?}"
    );
    assert_eq!(get("tcp_check"), tcp_check, "{f:?}");
    let syn = get("syn_packets");
    assert_eq!(
        tcp_check == "syn",
        !syn.starts_with("sent 0,"),
        "{net}: SYN packets only with the SYN check: {syn}"
    );
    let leftovers: Vec<String> = std::fs::read_dir(lb_tests::net::names::NETNS_DIR)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| lb_tests::net::names::owner_pid(n) == Some(pid))
                .collect()
        })
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "{net}: lb-probe-bench left namespaces behind: {leftovers:?}"
    );
}

#[test]
fn probe_bench_runs_with_targets_behind_veth() {
    check("veth", "syn");
}

#[test]
fn probe_bench_runs_connect_probes_behind_veth() {
    check("veth", "connect");
}

/// The targets answered by the SYN responder (`--net remote`): its SYN-ACKs pass the
/// real prober's checks, and its RST-ACKs for closed targets fail them.
#[test]
fn probe_bench_runs_with_targets_answered_by_the_syn_responder() {
    check("remote", "syn");
}

#[test]
fn probe_bench_runs_with_targets_on_loopback() {
    check("loopback", "syn");
}
