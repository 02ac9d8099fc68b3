//! Which lb-tests binaries may run next to others in `cargo xtask test`: the one list
//! the runner reads, with the reason for each entry. A binary not listed here is
//! timing-bound and runs in the timed lane, one at a time.
//!
//! - **light**: asserts no time bound, no balance share, no throughput and measures
//!   nothing, and touches no state shared by the host (everything it creates is named
//!   after its own pid: namespaces, temp dirs, private bpffs mounts). Light binaries run
//!   one after another in the light lane, alongside the timed lane.
//! - **alone**: changes what every other process on the machine gets (a real-time hog
//!   pinned to a CPU, threaded NAPI and paced floods measured as a benchmark does): the
//!   light lane waits while it runs.
//! - **timed** (everything else, and any new binary until it is classified): asserts a
//!   detection or recovery bound, a share, a rate, or a "nothing moved" under steady
//!   traffic that a starved probe could break; one at a time.

/// The lane a test binary runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Light,
    Timed,
    Alone,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Light => "light",
            Class::Timed => "timed",
            Class::Alone => "alone",
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
        "dataplane_backend_capacity",
        "its own maps; steering and counts only",
    ),
    (
        "dataplane_maglev_pool",
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
        "netns_neighbor_netlink",
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

/// Binaries that must run with nothing else beside them.
const ALONE: &[(&str, &str)] = &[
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
];

/// The class of test binary `name` (a `tests/*.rs` target; the lib's and the bins' own
/// unit tests are `lb-tests(lib)` and `lb-tests(bin NAME)`).
pub fn class_of(name: &str) -> Class {
    if name.starts_with("lb-tests(") {
        // Unit tests of the harness code: no namespace, no root-only state, no clock.
        return Class::Light;
    }
    if LIGHT.iter().any(|(n, _)| *n == name) {
        Class::Light
    } else if ALONE.iter().any(|(n, _)| *n == name) {
        Class::Alone
    } else {
        Class::Timed
    }
}

/// The classified names (to warn about a stale entry).
pub fn listed() -> impl Iterator<Item = &'static str> {
    LIGHT.iter().chain(ALONE).map(|(n, _)| *n)
}
