//! Which lb-tests binaries may run next to others in `cargo xtask test`: the one list
//! the runner reads, with the reason for each entry. Each module of the
//! [`INTEGRATION`] binary counts as a binary of its own, by the module's name. A binary
//! not listed here is timed: it runs with no other timed or waiting job beside it.
//!
//! - **light**: asserts no time bound, no balance share, no throughput and measures
//!   nothing, and touches no state shared by the host (everything it creates is named
//!   after its own pid: namespaces, temp dirs, private bpffs mounts). One light binary
//!   runs at a time, beside the others.
//! - **waiting**: asserts detection or recovery bounds that are whole probe intervals or
//!   timers with margins for a shared machine, and is mostly idle waiting for them; it
//!   creates only what is named after its pid, as a light one. Its tests run as jobs of
//!   their own ([`runs_test_by_test`]), three at a time.
//! - **timed** (everything else, and any new binary until it is classified): touches
//!   state the host shares (systemd units, containers, dpkg) or has not been measured
//!   beside others; no other timed or waiting job runs beside it.
//! - **alone**: changes what every other process on the machine gets (a real-time hog
//!   pinned to a CPU, threaded NAPI and paced floods measured as a benchmark does), or
//!   fails on any neighbour's stall: no other test runs beside it, except, for a binary
//!   of [`ALONE_TOGETHER`], its own other tests.
//!
//! Besides the tests' classes there is one for the [`BUILDS`] some jobs need: a build
//! runs at idle CPU priority (`SCHED_IDLE`: a test's thread that wakes takes the CPU
//! from it at once, so it gets only what the tests leave idle), one at a time, beside
//! any test, alone ones included; a job that needs it waits until it has ended.

/// The integration binary (`tests/tests/integration/`), whose top-level modules the
/// runner schedules as binaries.
pub const INTEGRATION: &str = "integration";

/// The lane a test binary runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Light,
    Waiting,
    Timed,
    Alone,
    /// One of the [`BUILDS`], not a test.
    Build,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Light => "light",
            Class::Waiting => "wait",
            Class::Timed => "timed",
            Class::Alone => "alone",
            Class::Build => "build",
        }
    }
}

/// Light binaries, by test target name, and why each is safe next to others.
const LIGHT: &[(&str, &str)] = &[
    (
        "bpf_fixtures",
        "BPF_PROG_TEST_RUN on its own loaded object; frames and counters, the program's clock is a map it writes",
    ),
    (
        "bpf_flood_full_size",
        "BPF_PROG_TEST_RUN on its own maps; counts flows kept, prints its rate without asserting it",
    ),
    (
        "bpf_fuzz",
        "BPF_PROG_TEST_RUN with a seeded mutator; verdicts only",
    ),
    (
        "contrib_monitoring",
        "promtool over the contrib files and a temporary rule file named after its pid; no agent",
    ),
    (
        "dataplane_backend_capacity",
        "its own maps; steering and counts only",
    ),
    (
        "dataplane_maglev_pool",
        "its own maps and a private bpffs named after its pid",
    ),
    (
        "dataplane_native_flag",
        "its own maps, attached in a namespace named after its pid; reads LB_CONFIG",
    ),
    (
        "dataplane_peers",
        "its own maps and a private bpffs named after its pid",
    ),
    (
        "dataplane_slot_writes",
        "its own maps and a private bpffs named after its pid",
    ),
    (
        "netns_harness",
        "the harness's own namespaces; reads the root namespace's arp_ignore, which no test writes",
    ),
    (
        "netns_neighbour_netlink",
        "netlink reads in its own namespace; no agent, no clock",
    ),
    (
        "netns_admin_state",
        "admin state over the agent's socket across reload and restart; no probe verdict, no clock",
    ),
    (
        "netns_reload",
        "a held connection and membership after SIGHUP; no time bound",
    ),
    (
        "netns_restart_max_backends",
        "map adoption after a restart, read from the log and the maps",
    ),
    (
        "netns_restart_max_flows",
        "map sizes and copied entries after a restart",
    ),
    (
        "netns_upgrade",
        "maps kept and flows pinned across builds; the previous release's binary is only read",
    ),
    (
        "netns_foreign_mac",
        "counters and a switch's FDB for a fixed number of frames",
    ),
];

/// Why a waiting binary's tests may run beside two others: their bounds are whole probe
/// intervals, fail timeouts or neighbour timers (a tenth of a second and up) with margins
/// made for a shared machine, and their processes are mostly idle, waiting for those
/// timers: in the suite's table none used more than a third of a core on average (CPU s
/// / wall s), so three of them and a light job leave the machine's two cores unfilled.
const PROBES: &str = "probe detection and recovery bounds of whole intervals; mostly idle";
const TRAFFIC: &str =
    "ordinary traffic (about 200 requests a second) with probe bounds; a fifth of a core";
const NEIGHBOURS: &str = "neighbour timing bounds of seconds under a connection every 20 ms; \
     the agent's own 100 ms share read from its log line's timestamp";
const MULTINODE: &str = "two lb nodes and a BIRD router in its own namespaces; bounds of seconds";
const RESTARTS: &str = "agent restarts with held connections; bounds of seconds";
const TRANSFERS: &str =
    "4 MiB transfers over veth, each well under a second, bounded at 20 s to tell a stall";

/// Timing-bound binaries whose bounds hold beside two other tests of this list (and a
/// light job): three of their tests run at a time.
const WAITING: &[(&str, &str)] = &[
    ("browser_status_page", PROBES),
    ("netns_balance", PROBES),
    ("netns_doctor", PROBES),
    ("netns_flood_nat_ports", PROBES),
    ("netns_health_hostile", PROBES),
    ("netns_health_http", PROBES),
    ("netns_health_icmp_forged", PROBES),
    ("netns_health_keeps_connections", PROBES),
    ("netns_health_local_faults", PROBES),
    ("netns_health_passive", PROBES),
    ("netns_health_probes", PROBES),
    ("netns_health_reload_recheck", PROBES),
    ("netns_health_syn_check", PROBES),
    ("netns_health_syn_families", PROBES),
    ("netns_health_syn_icmp_defaults", PROBES),
    ("netns_health_syn_icmp_flood", PROBES),
    ("netns_health_test_condition", PROBES),
    ("netns_metrics", PROBES),
    ("netns_multinode", MULTINODE),
    ("netns_multinode_deadman", MULTINODE),
    ("netns_multinode_tunnel", MULTINODE),
    ("netns_nat_hostile", PROBES),
    ("netns_nat_time_wait", PROBES),
    ("netns_neighbour_failed", NEIGHBOURS),
    ("netns_neighbour_gateway", NEIGHBOURS),
    ("netns_neighbour_moves", NEIGHBOURS),
    ("netns_offloads", TRANSFERS),
    ("netns_passive_restart", RESTARTS),
    ("netns_pmtu", PROBES),
    ("netns_redundancy_backup", PROBES),
    ("netns_redundancy_cap", PROBES),
    ("netns_redundancy_drain", PROBES),
    ("netns_redundancy_failopen", PROBES),
    ("netns_redundancy_spare", PROBES),
    ("netns_restart", RESTARTS),
    ("netns_restart_netns_exec", RESTARTS),
    ("netns_syn_port_reuse", PROBES),
    ("netns_traffic_backup", TRAFFIC),
    ("netns_traffic_hostile", TRAFFIC),
    ("netns_traffic_keepalive", TRAFFIC),
    ("netns_traffic_kill", TRAFFIC),
    ("netns_traffic_ordinary", TRAFFIC),
    ("netns_traffic_spare", TRAFFIC),
    ("netns_tunnel", PROBES),
    ("netns_udp", PROBES),
];

/// Binaries that must run with nothing else beside them.
const ALONE: &[(&str, &str)] = &[
    (
        "netns_chaos",
        "no request may fail outside a fault's window for 80 s per mode: a stall caused \
         by a neighbour counts as a failure (its two modes run side by side: \
         ALONE_TOGETHER)",
    ),
    (
        "netns_health_starved_agent",
        "a SCHED_FIFO hog pinned to the agent's CPU for 15 s",
    ),
    (
        "probe_bench_smoke",
        "the probe benchmark's machinery with threaded NAPI and a failure window it measures",
    ),
    (
        "flood_bench_smoke",
        "the flood benchmark's AF_PACKET sender and threaded NAPI at a paced rate it checks",
    ),
    (
        "netns_flood_real_size",
        "3,000,000 frames from an AF_PACKET sender, every one of which must reach the lb",
    ),
    (
        "netns_multiqueue",
        "a sender pinned to each CPU in turn keeps both busy for 17 s, and frames without \
         a stamp are judged to 10 ms of a map write",
    ),
];

/// Alone binaries whose tests run as jobs of their own beside each other (and nothing
/// else), and why their tests do not disturb each other.
const ALONE_TOGETHER: &[(&str, &str)] = &[(
    "netns_chaos",
    "each mode is a bed of its own (namespaces named after the pid, its own subnet) and \
     mostly waits (about 18 s of CPU in 85 s): the two together use under half of the \
     machine's two cores, and a stall from outside them is still kept out",
)];

/// A build that `cargo xtask test` runs beside the tests, in the [`Class::Build`] lane.
pub struct Build {
    /// The job's name in the output and the table.
    pub name: &'static str,
    /// The `cargo xtask` command that does it.
    pub command: &'static str,
    /// The binaries (or integration modules) whose jobs wait for it; none: a check of a
    /// whole run, which no job needs.
    pub needed_by: &'static [&'static str],
}

/// The builds beside the tests, in the order they run: the one the longest job needs
/// first.
pub const BUILDS: &[Build] = &[
    Build {
        name: "build: the previous release (cargo xtask prev-release)",
        command: "prev-release",
        needed_by: &["netns_upgrade"],
    },
    Build {
        name: "build: the package (cargo xtask dist)",
        command: "dist",
        needed_by: &["package_install"],
    },
    Build {
        name: "check: the supply chain (cargo xtask supply-chain)",
        command: "supply-chain",
        needed_by: &[],
    },
];

/// The build of [`BUILDS`] binary `name`'s jobs wait for, if any.
pub fn build_for(name: &str) -> Option<&'static Build> {
    BUILDS.iter().find(|b| b.needed_by.contains(&name))
}

/// The class of test binary `name` (a `tests/*.rs` target; the lib's and the bins' own
/// unit tests are `lb-tests(lib)` and `lb-tests(bin NAME)`).
pub fn class_of(name: &str) -> Class {
    if name.starts_with("lb-tests(") {
        // Unit tests of the harness code: no namespace, no root-only state, no clock.
        return Class::Light;
    }
    if LIGHT.iter().any(|(n, _)| *n == name) {
        Class::Light
    } else if WAITING.iter().any(|(n, _)| *n == name) {
        Class::Waiting
    } else if ALONE.iter().any(|(n, _)| *n == name) {
        Class::Alone
    } else {
        Class::Timed
    }
}

/// Whether binary `name`'s tests run as jobs of their own (`--exact NAME`, one process
/// each), which packs the lanes finer than whole binaries: a waiting binary's, and an
/// [`ALONE_TOGETHER`] one's.
pub fn runs_test_by_test(name: &str) -> bool {
    class_of(name) == Class::Waiting || beside_itself(name)
}

/// Whether the tests of alone binary `name` may run beside each other.
pub fn beside_itself(name: &str) -> bool {
    ALONE_TOGETHER.iter().any(|(n, _)| *n == name)
}

/// The classified names (to warn about a stale entry).
pub fn listed() -> impl Iterator<Item = &'static str> {
    LIGHT.iter().chain(WAITING).chain(ALONE).map(|(n, _)| *n)
}
