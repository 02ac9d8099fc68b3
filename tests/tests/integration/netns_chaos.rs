//! A seeded chaos run in nat and in dsr (`lb_tests::scenario::chaos`): four backends under ordinary
//! traffic (four loops of new connections from OS-chosen ports, about 160 a second, and
//! two keep-alive clients) while a server is killed and started again, a backend's link
//! goes down for 3 s, a health check fails for 6 s, a backend's address moves to another
//! MAC, the config is reloaded and the agent is restarted by SIGTERM and by SIGKILL, one at a time in an order drawn from the seed
//! (`LB_CHAOS_SEED`, printed). Every host resolves its neighbours by ARP, as on a real
//! network. No server may change state outside its own fault, nothing
//! may fail open, and no request may fail outside the window of a kill or a link down.

use std::{path::Path, time::Duration};

use lb_tests::{
    net::topology::Forwarding,
    scenario::{
        chaos,
        realistic::{Bed, Role},
    },
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");

fn chaos_run(forwarding: Forwarding, subnet: u8) {
    let label = forwarding.as_str();
    let mut bed = Bed::start_resolving(
        forwarding,
        subnet,
        &Role::primaries(4),
        Path::new(TESTSERVER),
    );
    let seed = chaos::seed_from_env();
    let names: Vec<&'static str> = bed.roles.iter().map(|r| r.name).collect();
    let faults = chaos::plan(seed, &names);
    let run = chaos::run(&mut bed, seed, &faults, 4, Duration::from_millis(20));
    println!("{label}: {}", run.describe(&bed));
    let violations = run.violations(&bed);
    assert!(
        violations.is_empty(),
        "{label}, seed {seed:#x} (LB_CHAOS_SEED={seed:#x} repeats it):\n{}\n{}",
        violations.join("\n"),
        run.describe(&bed)
    );
}

#[test]
fn chaos_ejects_only_the_faulted_server_and_fails_no_request_while_all_are_healthy_nat() {
    chaos_run(Forwarding::Nat, 191);
}

#[test]
fn chaos_ejects_only_the_faulted_server_and_fails_no_request_while_all_are_healthy_dsr() {
    chaos_run(Forwarding::Dsr, 192);
}
