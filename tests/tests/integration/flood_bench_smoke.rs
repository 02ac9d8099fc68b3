//! `lb-flood-bench` in its trickle mode (a few thousand paced packets per run instead of
//! a flood), so the benchmark's machinery — the AF_PACKET sender, the counting XDP
//! sinks (on the backends, or on the lb's switch port), the lb host's threaded NAPI
//! thread, nftables, lb in nat and dsr, and the bare XDP_TX reflector the balancers are
//! compared with — keeps working on a fresh machine: the packets reach the sinks (the
//! reflector's come back to the sender's side), the counts add up, lb spreads the many
//! flows by weight, the report has the ratios to the reflector, and the namespaces are
//! gone afterwards.
//! Speed is not asserted. Needs the lb-agent binary built (`cargo build --workspace
//! --bins`); nftables is measured only where `nft` is installed.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
};

const BENCH: &str = env!("CARGO_BIN_EXE_lb-flood-bench");
const PACKETS: u64 = 2000;
const MANY_FLOWS: &str = "4096";
/// lb's backends are weighted 1:1:2.
const WEIGHTS: [f64; 3] = [1.0, 1.0, 2.0];
const SHARE_TOLERANCE: f64 = 0.15;
/// The benchmark's test beds: through the bridge to the backends' sinks, and the
/// generator and sink on the lb's switch port.
const SETUPS: [&str; 2] = ["e2e", "wire"];

/// One `run\t` line: balancer, flows, and its `key=value` fields.
#[derive(Debug)]
struct Row {
    kind: String,
    flows: String,
    fields: BTreeMap<String, String>,
}

impl Row {
    fn get(&self, key: &str) -> u64 {
        self.fields
            .get(key)
            .unwrap_or_else(|| panic!("no {key} in {self:?}"))
            .parse()
            .unwrap_or_else(|_| panic!("{key} is not a number in {self:?}"))
    }

    fn per_backend(&self) -> Vec<u64> {
        self.fields["per_backend"]
            .split(',')
            .map(|n| n.parse().expect("per_backend count"))
            .collect()
    }
}

fn nft_installed() -> bool {
    Command::new("sh")
        .args(["-c", "command -v nft"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn flood_bench_trickle_reaches_the_backends_and_adds_up() {
    let out_dir = std::env::temp_dir().join(format!("lb-flood-smoke-{}", std::process::id()));
    let child = Command::new(BENCH)
        .args(["--trickle", &PACKETS.to_string(), "--rounds", "1"])
        .arg("--out")
        .arg(&out_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running lb-flood-bench");
    let pid = child.id();
    let out = child
        .wait_with_output()
        .expect("waiting for lb-flood-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = std::fs::read_to_string(out_dir.join("flood.md")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(
        out.status.success(),
        "lb-flood-bench failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Row> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("run\t"))
        .map(|l| {
            let mut parts = l.split('\t');
            let _round = parts.next();
            let kind = parts.next().expect("balancer").to_owned();
            let flows = parts.next().expect("flows").to_owned();
            let fields = parts
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            Row {
                kind,
                flows,
                fields,
            }
        })
        .collect();

    let mut kinds = vec!["reflector", "nat", "dsr"];
    if nft_installed() {
        kinds.push("nftables");
    }
    for kind in &kinds {
        for setup in SETUPS {
            assert_eq!(
                rows.iter()
                    .filter(|r| r.kind == *kind
                        && r.fields.get("setup").map(String::as_str) == Some(setup))
                    .count(),
                2,
                "{kind}, {setup}: one run per flow variant expected:\n{stdout}"
            );
        }
    }
    for r in &rows {
        let (sent, delivered) = (r.get("sent"), r.get("delivered"));
        assert_eq!(sent + r.get("refused"), PACKETS, "{r:?}");
        assert_eq!(
            delivered,
            r.per_backend().iter().sum::<u64>(),
            "delivered is the backends' sum: {r:?}"
        );
        // Nothing invented: the backends count no more than the lb host received, and
        // it received no more than was sent (plus a little neighbour traffic).
        assert!(delivered <= r.get("lb_rx"), "{r:?}");
        assert!(r.get("lb_rx") <= sent + 50, "{r:?}");
        // A trickle arrives (a receive thread starved by other work on a shared CPU
        // may lose a few).
        assert!(
            delivered as f64 >= sent as f64 * 0.9,
            "{delivered} of {sent} arrived: {r:?}"
        );
        assert!(
            r.get("napi_us") > 0,
            "the lb host's NAPI thread did the receiving: {r:?}"
        );
        let setup = r.fields.get("setup").map(String::as_str);
        // The reflector's frames come back to one sink: the client's end to end.
        let sinks = if setup == Some("wire") || r.kind == "reflector" {
            1
        } else {
            WEIGHTS.len()
        };
        assert_eq!(r.per_backend().len(), sinks, "one count per sink: {r:?}");
        if ["nat", "dsr"].contains(&r.kind.as_str())
            && r.flows == MANY_FLOWS
            && setup == Some("e2e")
        {
            let per = r.per_backend();
            let total: f64 = WEIGHTS.iter().sum();
            for (i, (&got, w)) in per.iter().zip(WEIGHTS).enumerate() {
                let share = got as f64 / delivered as f64;
                let want = w / total;
                assert!(
                    (share - want).abs() <= want * SHARE_TOLERANCE,
                    "{}: b{} got {share:.3} of the flows' packets, weight share {want:.3}: {r:?}",
                    r.kind,
                    i + 1
                );
            }
        }
    }

    // The report: every lb row of both beds is a ratio to the reflector of its setup.
    let lb_rows: Vec<Vec<&str>> = report
        .lines()
        .filter(|l| l.contains("| lb (XDP,"))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    assert_eq!(lb_rows.len(), 2 * SETUPS.len() * 2, "{report}");
    for cols in &lb_rows {
        // | setup | balancer | … | vs nftables | vs reflector | limit |
        let to_floor = cols[cols.len() - 3];
        assert!(
            to_floor.ends_with('×') && to_floor.trim_end_matches('×').parse::<f64>().is_ok(),
            "no ratio to the reflector in {cols:?}:\n{report}"
        );
    }

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
        "lb-flood-bench left namespaces behind: {leftovers:?}"
    );
}
