//! Restarts that keep state wherever the agent runs (docs/restarts.md): the agent is
//! started exactly as an operator does, `ip netns exec NS lb-agent run --config FILE`,
//! with no bpffs shared with the host (no `pin_path`, or the default one, which lands in
//! the private /sys that `ip netns exec` mounts and dies with the process). Under steady
//! traffic: SIGTERM + restart, SIGKILL + restart and two SIGHUP reloads lose no request
//! and each restarted agent says it adopted the previous state. Then the single owner
//! (a second agent and `detach` refuse, naming the owner), the link watch (`xdp off`
//! behind the agent's back is repaired) and `detach` after the agent stopped.

use std::{
    path::Path,
    process::{Command, Output},
    thread,
    time::{Duration, Instant},
};

use aya::programs::XdpMode;
use lb_tests::{
    agent::{
        bpffs::PrivateBpffs,
        daemon::{Agent, AgentConfig, Service, locate_binary},
    },
    bpf::pass_prog,
    net::topology::{Forwarding, HOST_IF, Topology},
    scenario::{
        balance::{self, WEIGHTS},
        restart::{
            Stream, assert_served, assert_stream_clean, echoes, reload_out_and_back, sigkill,
        },
    },
    traffic::clients::EchoConn,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const START: Duration = Duration::from_secs(30);
/// The line a restarted agent prints when it took over the running program's maps.
const ADOPTED: &str = "adopted the previous state";
/// The line of an agent that found nothing to adopt.
const FRESH: &str = "starting fresh";
/// The truthful shutdown line.
const STAYS: &str = "the XDP program stays attached";
/// How long the link watch (1 s period) may take to notice and repair.
const REPAIR: Duration = Duration::from_secs(10);

/// The test bed with three `lb-testserver`s and the weighted TCP service over them.
fn web_bed(forwarding: Forwarding, subnet: u8) -> (balance::Testbed, Service) {
    let bed = balance::Testbed::start(forwarding, subnet, false, Path::new(TESTSERVER));
    let backends = balance::weighted(&bed.topo, &WEIGHTS);
    let service = balance::tcp_service(&bed.topo, &backends);
    (bed, service)
}

/// `lb-agent` started in native XDP mode, or a panic `"{what}: {error}"`.
fn start_native(topo: &Topology, binary: &Path, config: &AgentConfig, what: &str) -> Agent {
    Agent::start(topo, binary, config, Some("native"), START)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `ip netns exec <lb ns> lb-agent ARGS…`, to completion.
fn lb_agent_in(topo: &Topology, binary: &Path, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", topo.lb().ns.name()])
        .arg(binary)
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("running lb-agent through ip netns exec")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `out` failed: its output, or a panic `"{what}:\n{output}"`.
fn refusal(out: Output, what: &str) -> String {
    let said = text(&out);
    assert!(!out.status.success(), "{what}:\n{said}");
    said
}

/// `out` succeeded: its output, or a panic `"{what}:\n{output}"`.
fn success(out: Output, what: &str) -> String {
    let said = text(&out);
    assert!(out.status.success(), "{what}:\n{said}");
    said
}

/// The id of the XDP program on the lb's `eth0`, if any (`ip -d link show`).
fn xdp_prog_id(topo: &Topology) -> Option<u32> {
    let out = topo
        .lb()
        .ns
        .ip(&["-d", "link", "show", "dev", HOST_IF])
        .expect("ip link show in the lb namespace");
    let at = out.find("prog/xdp id ")?;
    out[at + "prog/xdp id ".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The line of `agent`'s log containing `needle`, or a panic quoting its tail.
fn line_with(agent: &Agent, needle: &str, what: &str) -> String {
    agent
        .process()
        .lines()
        .into_iter()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no line with {needle:?}; last lines:\n{}",
                agent.process().tail(30)
            )
        })
}

/// The line says it adopted one service and its three servers.
fn assert_adopted(agent: &Agent, what: &str) {
    let line = line_with(agent, ADOPTED, what);
    assert!(
        line.contains("services=1") && line.contains("backends=3"),
        "{what}: the adoption should name 1 service and 3 backends: {line}"
    );
    assert!(
        line.contains("maps_fresh=0"),
        "{what}: every map of the same object should be adopted: {line}"
    );
    println!("{what}: {line}");
}

/// SIGTERM, waiting for the shutdown line; returns it with the exit status.
fn sigterm(agent: Agent, what: &str) -> String {
    let since = agent.process().cursor();
    agent
        .process()
        .signal(libc::SIGTERM)
        .expect("signalling the agent");
    let line = agent
        .process()
        .wait_for_line(since, "shutting down", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{what}: no shutdown line: {e}"));
    let status = agent.stop(Duration::from_secs(10)).expect("stopping");
    assert!(status.success(), "{what}: SIGTERM should exit 0: {status}");
    line
}

fn restart_without_bpffs(forwarding: Forwarding, subnet: u8, pin_path: &str) {
    let mode = forwarding.as_str();
    let (bed, service) = web_bed(forwarding, subnet);
    let topo = &bed.topo;
    let vip = service.vip;
    let mut config = AgentConfig::new(vec![service.clone()]);
    config.pin_path = pin_path.to_owned();
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let start = |config: &AgentConfig| {
        let t = Instant::now();
        let agent = Agent::start(topo, &binary, config, Some("native"), START)
            .unwrap_or_else(|e| panic!("{mode}: starting lb-agent: {e}"));
        println!("{mode}: lb-agent ready {:?} after its start", t.elapsed());
        agent
    };

    let agent = start(&config);
    line_with(&agent, FRESH, "first start");
    let first_id = xdp_prog_id(topo).expect("XDP attached after the first start");
    let client = topo.client();
    let mut conn = EchoConn::connect(&client.ns, client.ipv4.into(), vip)
        .expect("entering the client namespace")
        .unwrap_or_else(|e| panic!("{mode}: a connection to {vip} should be answered: {e}"));
    let kept = conn.backend().to_owned();
    let stream = Stream::start(topo, vip);
    thread::sleep(Duration::from_millis(300));

    // 1. SIGTERM: the program stays attached (and the log says so), a new agent adopts.
    let line = sigterm(agent, mode);
    assert!(line.contains(STAYS), "{mode}: shutdown line: {line}");
    assert_eq!(
        xdp_prog_id(topo),
        Some(first_id),
        "{mode}: the program should stay attached after SIGTERM"
    );
    thread::sleep(Duration::from_millis(300)); // traffic while no agent runs
    echoes(
        &mut conn,
        "after SIGTERM, before restart",
        mode,
        "while the agent is down",
    );
    let agent = start(&config);
    assert_adopted(&agent, "restart after SIGTERM");
    let second_id = xdp_prog_id(topo).expect("XDP attached after the restart");
    assert_ne!(
        second_id, first_id,
        "{mode}: the restarted agent should have swapped in its own program"
    );
    echoes(&mut conn, "after restart", mode, "after restart");
    thread::sleep(Duration::from_millis(300));

    // 2. SIGKILL: no chance to clean up; a new agent adopts.
    sigkill(agent);
    assert_eq!(xdp_prog_id(topo), Some(second_id), "{mode}: after SIGKILL");
    echoes(&mut conn, "after SIGKILL", mode, "after SIGKILL");
    let agent = start(&config);
    assert_adopted(&agent, "restart after SIGKILL");
    thread::sleep(Duration::from_millis(300));

    // 3. Two SIGHUP reloads: one server out, then back under another weight.
    reload_out_and_back(&agent, topo, (&config, &service), &kept, &mut conn, mode);

    let tally = stream.finish();
    println!(
        "{mode} (pin_path {pin_path:?}, started through ip netns exec): {} new connections \
         across SIGTERM+restart, SIGKILL+restart and two reloads in {:?}: {} failed; \
         long-lived connection to {kept} kept",
        tally.attempted,
        tally.elapsed,
        tally.failures.len()
    );
    assert_stream_clean(&tally, mode);
    sigterm(agent, mode);
}

#[test]
fn restart_through_netns_exec_without_pins_nat() {
    restart_without_bpffs(Forwarding::Nat, 63, "");
}

/// The default `pin_path`: under `ip netns exec` its bpffs is private to the agent.
#[test]
fn restart_through_netns_exec_default_pin_path_dsr() {
    restart_without_bpffs(Forwarding::Dsr, 64, "/sys/fs/bpf/lb");
}

/// One owner: a second agent on the interface and on the pin directory refuse, naming
/// the owner's pid; an interface running another program and missing capabilities are
/// refused with what is in the way; `detach` refuses while the owner runs; `xdp off` behind the agent's
/// back is repaired; after the agent stopped `detach` removes the program and says
/// so, and a second `detach` says there was nothing.
#[test]
fn one_owner_link_watch_and_detach() {
    let (bed, service) = web_bed(Forwarding::Nat, 65);
    let topo = &bed.topo;
    let vip = service.vip;
    // A bpffs shared by every process (not under /sys, which `ip netns exec` remounts).
    let bpffs = PrivateBpffs::mount("owner").expect("mounting a bpffs for the pins");
    let mut config = AgentConfig::new(vec![service.clone()]);
    config.pin_path = bpffs.pins().display().to_string();
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let agent = start_native(topo, &binary, &config, "starting lb-agent");
    let owner_pid = format!("pid {}", agent.process().pid());
    let config_path = topo.dir().join("lb.toml");
    let config_arg = config_path.display().to_string();

    // A second agent on the same interface.
    let said = refusal(
        lb_agent_in(topo, &binary, &["run", "--config", &config_arg]),
        "a second agent must not start",
    );
    assert!(
        said.contains("another lb-agent already runs on interface `eth0`")
            && said.contains(&owner_pid),
        "the refusal should name the interface and the owner ({owner_pid}):\n{said}"
    );

    // A second agent on another interface but the same pin directory.
    topo.lb()
        .ns
        .ip(&[
            "link",
            "add",
            "lbt-other0",
            "type",
            "veth",
            "peer",
            "name",
            "lbt-other1",
        ])
        .expect("adding a second interface (a veth pair) in the lb namespace");
    topo.lb()
        .ns
        .ip(&["link", "set", "lbt-other0", "up"])
        .expect("setting the second interface up");
    let said = refusal(
        lb_agent_in(
            topo,
            &binary,
            &[
                "run",
                "--config",
                &config_arg,
                "--interface",
                "lbt-other0",
                "--xdp-mode",
                "generic",
            ],
        ),
        "an agent on the same pins must not start",
    );
    assert!(
        said.contains("holds the pin directory") && said.contains(&owner_pid),
        "the refusal should name the pin directory's owner ({owner_pid}):\n{said}"
    );

    // Another program on an interface: refused, naming it and how to remove it.
    let pass = pass_prog::attach(&topo.lb().ns, &["lbt-other0"], XdpMode::Skb)
        .expect("attaching lb_pass to the second interface");
    let mut unpinned = config.clone();
    unpinned.pin_path = String::new();
    let other_config = topo.dir().join("other.toml");
    std::fs::write(&other_config, unpinned.render()).expect("writing other.toml");
    let other_arg = other_config.display().to_string();
    let said = refusal(
        lb_agent_in(
            topo,
            &binary,
            &["run", "--config", &other_arg, "--interface", "lbt-other0"],
        ),
        "an occupied interface must refuse",
    );
    assert!(
        said.contains("already runs XDP program id")
            && said.contains("`lb_pass`")
            && said.contains("ip link set dev lbt-other0"),
        "the refusal should name the program in the way and how to remove it:\n{said}"
    );
    drop(pass);

    // Without the capabilities: refused, naming them.
    let said = refusal(
        Command::new("ip")
            .args(["netns", "exec", topo.lb().ns.name()])
            .args(["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"])
            .arg(&binary)
            .args(["run", "--config", &other_arg, "--interface", "lbt-other0"])
            .env("NO_COLOR", "1")
            .output()
            .expect("running lb-agent without capabilities"),
        "no capabilities must refuse",
    );
    assert!(
        said.contains("lacks CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) and CAP_NET_ADMIN"),
        "the refusal should name the missing capabilities:\n{said}"
    );

    // detach while the owner runs.
    let said = refusal(
        lb_agent_in(topo, &binary, &["detach", "--config", &config_arg]),
        "detach must refuse while the agent runs",
    );
    assert!(
        said.contains("refusing to detach")
            && said.contains(&owner_pid)
            && said.contains("kill -TERM"),
        "detach should name the owner and how to stop it:\n{said}"
    );
    assert!(
        xdp_prog_id(topo).is_some(),
        "the refused detach left the program"
    );

    // The program removed behind the agent's back: repaired within a few watch periods.
    let before = xdp_prog_id(topo).expect("attached");
    let since = agent.process().cursor();
    topo.lb()
        .ns
        .ip(&["link", "set", "dev", HOST_IF, "xdp", "off"])
        .expect("ip link set xdp off");
    let removed = Instant::now();
    let line = agent
        .process()
        .wait_for_line(since, "re-attached it", REPAIR)
        .unwrap_or_else(|e| panic!("the agent should notice and repair the removal: {e}"));
    println!(
        "xdp off behind the agent: repaired after {:?} (watch period 1 s)",
        removed.elapsed()
    );
    assert!(
        line.contains("ERROR"),
        "the repair must be logged loudly: {line}"
    );
    assert_eq!(
        xdp_prog_id(topo),
        Some(before),
        "the agent re-attached its own program"
    );
    assert_served(
        topo,
        vip,
        40_000,
        "connections after the repair should be answered",
    );

    // Stopped: detach removes the program and the pins and says so; again: nothing.
    let line = sigterm(agent, "owner");
    assert!(line.contains(STAYS), "shutdown line: {line}");
    let said = success(
        lb_agent_in(topo, &binary, &["detach", "--config", &config_arg]),
        "detach after the agent stopped",
    );
    assert!(
        said.contains(&format!("detached lb's XDP program (id {before}")),
        "detach should say what it removed:\n{said}"
    );
    assert!(
        said.contains("pins)"),
        "detach should remove the pins:\n{said}"
    );
    assert_eq!(xdp_prog_id(topo), None, "no XDP program after detach");
    let said = success(
        lb_agent_in(topo, &binary, &["detach", "--config", &config_arg]),
        "a second detach",
    );
    assert!(
        said.contains("runs no XDP program: nothing to detach")
            && said.contains("no pin directory"),
        "a second detach should say there was nothing:\n{said}"
    );
}

/// lb's object loaded (in the calling thread's namespace), with `sizes` as the
/// `max_entries` of the maps they name.
fn lb_object(sizes: &[(&str, u32)]) -> aya::Ebpf {
    let mut loader = aya::EbpfLoader::new();
    for (map, entries) in sizes {
        loader.map_max_entries(map, *entries);
    }
    loader
        .load(lb_agent::EBPF_OBJECT)
        .expect("loading lb's object")
}

/// The XDP program `name` of `ebpf`, loaded into the kernel (verified).
fn loaded_xdp<'e>(ebpf: &'e mut aya::Ebpf, name: &str) -> &'e mut aya::programs::Xdp {
    let prog: &mut aya::programs::Xdp = ebpf
        .program_mut(name)
        .expect(name)
        .try_into()
        .expect("an XDP program");
    prog.load()
        .unwrap_or_else(|e| panic!("verifying {name}: {e}"));
    prog
}

/// Loads lb's object with a smaller flow table (as an older or newer build whose
/// `LB_FLOWS` has another size would have) in the lb namespace; attaches `lb_xdp` to
/// `eth0` through a bpf_link held by the returned object, or through netlink (then the
/// object can go: the interface holds the program).
fn older_program(topo: &Topology, through_link: bool) -> Option<aya::Ebpf> {
    topo.lb()
        .ns
        .run(move || {
            let mut ebpf = lb_object(&[(lb_common::map_names::FLOWS, 1024)]);
            // An older build's one program: today's whole path (`lb_xdp` alone would
            // tail-call into an empty `LB_PROGRAMS`).
            let prog = loaded_xdp(&mut ebpf, lb_common::FULL_PROGRAM_NAME);
            let ifindex = lb_agent::dataplane::if_index(HOST_IF).expect("eth0");
            if through_link {
                prog.attach(ifindex, XdpMode::Driver)
                    .expect("attaching through a bpf_link");
                return Some(ebpf);
            }
            let fd = prog.fd().expect("program fd");
            lb_agent::netlink::set_xdp(
                ifindex,
                Some(std::os::fd::AsFd::as_fd(fd)),
                None,
                lb_agent::netlink::xdp::XDP_FLAGS_UPDATE_IF_NOEXIST
                    | lb_agent::netlink::xdp::XDP_FLAGS_DRV_MODE,
            )
            .expect("attaching through netlink");
            None
        })
        .expect("entering the lb namespace")
}

/// A program of lb whose flow table has another layout: held by a bpf_link (an older
/// agent's way), the agent refuses with the migration step; attached through netlink,
/// the agent adopts every map but the two tables (copied), says which, and serves; `--reset`
/// replaces it with fresh maps.
#[test]
fn adoption_across_layout_change_link_and_reset() {
    let (bed, service) = web_bed(Forwarding::Dsr, 66);
    let topo = &bed.topo;
    let vip = service.vip;
    let config = AgentConfig::new(vec![service.clone()]);
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let config_path = topo.dir().join("lb.toml");
    std::fs::write(&config_path, config.render()).expect("writing lb.toml");
    let config_arg = config_path.display().to_string();

    // Held by a bpf_link: refused with the one-time migration step.
    let linked = older_program(topo, true).expect("the link's owner");
    let said = refusal(
        lb_agent_in(topo, &binary, &["run", "--config", &config_arg]),
        "a linked program cannot be replaced",
    );
    assert!(
        said.contains("through a bpf_link") && said.contains("lb-agent detach"),
        "the refusal should explain the link and the migration:\n{said}"
    );
    drop(linked);
    assert_eq!(xdp_prog_id(topo), None, "the link's owner is gone");

    // Attached through netlink with a smaller flow table: adopted except LB_FLOWS.
    assert!(older_program(topo, false).is_none());
    let old_id = xdp_prog_id(topo).expect("attached through netlink");
    let agent = start_native(topo, &binary, &config, "starting over the older program");
    let line = line_with(&agent, ADOPTED, "over a changed layout");
    assert!(
        // The object's fifteen maps (docs/restarts.md): all but the two tables are kept
        // (LB_FLOWS has another size; the program recorded no seeds, as an earlier
        // release, so this install draws its own and LB_NAT is re-seeded too).
        line.contains("maps_kept=13") && line.contains("maps_fresh=2"),
        "thirteen maps kept and the two tables fresh: {line}"
    );
    let fresh: Vec<String> = agent
        .process()
        .lines()
        .into_iter()
        .filter(|l| l.contains("map not adopted, created fresh"))
        .collect();
    assert!(
        fresh
            .iter()
            .any(|l| l.contains("LB_FLOWS") && l.contains("layout changed")),
        "the warning should name the map and why: {fresh:?}"
    );
    assert!(
        fresh
            .iter()
            .any(|l| l.contains("LB_NAT") && l.contains("re-seeded")),
        "LB_NAT re-seeded: {fresh:?}"
    );
    assert_ne!(xdp_prog_id(topo), Some(old_id), "swapped in");
    assert_served(topo, vip, 41_000, "served after adoption");
    sigterm(agent, "adopting");

    // --reset: the running program replaced with fresh maps, said plainly.
    let running = xdp_prog_id(topo).expect("still attached");
    let args = [
        "run",
        "--config",
        config_arg.as_str(),
        "--interface",
        HOST_IF,
        "--reset",
    ];
    let reset = topo
        .lb()
        .spawn("lb-agent --reset", &binary, &args)
        .expect("starting lb-agent --reset");
    reset
        .wait_for_line(0, lb_tests::agent::daemon::READY_LINE, START)
        .unwrap_or_else(|e| panic!("lb-agent --reset should start: {e}"));
    let lines = reset.lines();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("--reset: replacing the running lb program")),
        "--reset should say it replaces the running program:\n{}",
        reset.tail(20)
    );
    assert!(
        !lines.iter().any(|l| l.contains(ADOPTED)),
        "--reset must not adopt:\n{}",
        reset.tail(20)
    );
    assert_ne!(
        xdp_prog_id(topo),
        Some(running),
        "--reset swapped in a new program"
    );
    assert_served(topo, vip, 42_000, "served after --reset");
    let status = reset.stop(Duration::from_secs(10)).expect("stopping");
    assert!(
        status.success(),
        "--reset agent exits 0 on SIGTERM: {status}"
    );
    let detach = lb_agent_in(topo, &binary, &["detach", "--config", &config_arg]);
    assert!(detach.status.success(), "detach:\n{}", text(&detach));
}

/// Another program swapped in behind the agent (atomically, so no re-attach is
/// possible without clobbering it): the agent says so and exits with status 1 instead
/// of reporting servers up while the VIP is not served; a new agent is refused with
/// that program named.
#[test]
fn a_foreign_program_taking_the_interface_stops_the_agent() {
    let (bed, service) = web_bed(Forwarding::Dsr, 67);
    let topo = &bed.topo;
    let config = AgentConfig::new(vec![service]);
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let agent = start_native(topo, &binary, &config, "starting lb-agent");
    let since = agent.process().cursor();
    topo.lb()
        .ns
        .run(|| {
            let mut ebpf = lb_object(&[
                (lb_common::map_names::FLOWS, 64),
                (lb_common::map_names::NAT, 64),
            ]);
            let pass = loaded_xdp(&mut ebpf, lb_common::PASS_PROGRAM_NAME);
            let ifindex = lb_agent::dataplane::if_index(HOST_IF).expect("eth0");
            let running = lb_agent::dataplane::adopt::attached_program(ifindex, HOST_IF)
                .expect("reading eth0")
                .expect("the agent's program");
            lb_agent::netlink::set_xdp(
                ifindex,
                Some(std::os::fd::AsFd::as_fd(pass.fd().expect("fd"))),
                Some(std::os::fd::AsFd::as_fd(&running.fd)),
                running.mode.flags(),
            )
            .expect("swapping lb_pass in");
        })
        .expect("entering the lb namespace");
    let line = agent
        .process()
        .wait_for_line(since, "not ours any more", REPAIR)
        .unwrap_or_else(|e| panic!("the agent should notice the foreign program: {e}"));
    assert!(
        line.contains("ERROR") && line.contains("`lb_pass`"),
        "the agent should name the program that took the interface: {line}"
    );
    let line = agent
        .process()
        .wait_for_line(since, "shutting down", REPAIR)
        .unwrap_or_else(|e| panic!("the agent should stop: {e}"));
    assert!(
        line.contains("NOT attached"),
        "the shutdown line should say the program is not attached: {line}"
    );
    let status = agent
        .stop(Duration::from_secs(10))
        .expect("reaping the agent");
    assert_eq!(status.code(), Some(1), "exit status 1: {status}");
    let config_arg = topo.dir().join("lb.toml").display().to_string();
    let out = lb_agent_in(topo, &binary, &["run", "--config", &config_arg]);
    let said = text(&out);
    assert!(
        !out.status.success()
            && said.contains("already runs XDP program id")
            && said.contains("`lb_pass`"),
        "a new agent is refused naming the program:\n{said}"
    );
}

/// The replacement is made in the running program's mode: generic (skb) here, and a
/// restart configured for native keeps generic and says why.
#[test]
fn restart_in_generic_mode_replaces_in_that_mode() {
    let (bed, service) = web_bed(Forwarding::Nat, 68);
    let topo = &bed.topo;
    let vip = service.vip;
    let config = AgentConfig::new(vec![service]);
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let agent = Agent::start(topo, &binary, &config, Some("generic"), START)
        .unwrap_or_else(|e| panic!("starting lb-agent in generic mode: {e}"));
    let first = xdp_prog_id(topo).expect("attached");
    let line = sigterm(agent, "generic");
    assert!(line.contains(STAYS) && line.contains("generic"), "{line}");

    let agent = start_native(topo, &binary, &config, "restarting lb-agent");
    assert_adopted(&agent, "generic restart");
    line_with(&agent, "attached in another mode", "mode change");
    let attached = line_with(&agent, "XDP program attached", "generic restart");
    assert!(attached.contains("mode=\"generic\""), "{attached}");
    assert_ne!(
        xdp_prog_id(topo),
        Some(first),
        "the new program is swapped in"
    );
    let out = topo
        .lb()
        .ns
        .ip(&["-d", "link", "show", "dev", HOST_IF])
        .expect("ip link show");
    assert!(out.contains("xdpgeneric"), "still generic:\n{out}");
    assert_served(topo, vip, 43_000, "served after the generic restart");
    sigterm(agent, "generic");
}

/// Upgrading from an agent that attached through a bpf_link pinned in `pin_path`
/// (`link_xdp_eth0`): the new agent swaps its program into that link (atomically) and
/// says so; a later restart adopts again through the interface; `detach` removes the
/// link pin and so the program.
#[test]
fn upgrade_from_a_pinned_link_swaps_into_it() {
    let (bed, service) = web_bed(Forwarding::Nat, 69);
    let topo = &bed.topo;
    let vip = service.vip;
    let bpffs = PrivateBpffs::mount("legacy").expect("mounting a bpffs for the pins");
    std::fs::create_dir_all(bpffs.pins()).expect("creating the pin directory");
    let link_pin = bpffs.pins().join(format!("link_xdp_{HOST_IF}"));
    topo.lb()
        .ns
        .run(|| {
            let mut ebpf = lb_object(&[]);
            // An older build's one program: today's whole path (`lb_xdp` alone would
            // tail-call into an empty `LB_PROGRAMS`).
            let prog = loaded_xdp(&mut ebpf, lb_common::FULL_PROGRAM_NAME);
            let ifindex = lb_agent::dataplane::if_index(HOST_IF).expect("eth0");
            let id = prog
                .attach(ifindex, XdpMode::Driver)
                .expect("attaching through a bpf_link");
            let link = prog.take_link(id).expect("the link");
            let link = aya::programs::links::FdLink::try_from(link).expect("an fd link");
            link.pin(&link_pin).expect("pinning the link");
        })
        .expect("entering the lb namespace");
    let old_id = xdp_prog_id(topo).expect("the older agent's program stays through its pin");

    let mut config = AgentConfig::new(vec![service.clone()]);
    config.pin_path = bpffs.pins().display().to_string();
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let agent = start_native(topo, &binary, &config, "starting over a pinned link");
    line_with(&agent, ADOPTED, "over a pinned link");
    line_with(
        &agent,
        "swapped into the pinned bpf_link",
        "over a pinned link",
    );
    let new_id = xdp_prog_id(topo).expect("attached");
    assert_ne!(new_id, old_id, "the agent's program runs in the link now");
    assert_served(topo, vip, 44_000, "served through the link");

    // A later restart adopts the published state through the interface again.
    let line = sigterm(agent, "legacy");
    assert!(line.contains(STAYS), "{line}");
    let agent = start_native(topo, &binary, &config, "restarting over the link");
    assert_adopted(&agent, "restart over the link");
    assert_served(topo, vip, 45_000, "served after the restart");
    sigterm(agent, "legacy");

    let config_arg = topo.dir().join("lb.toml").display().to_string();
    let said = success(
        lb_agent_in(topo, &binary, &["detach", "--config", &config_arg]),
        "detach",
    );
    assert_eq!(
        xdp_prog_id(topo),
        None,
        "removing the link pin detaches:\n{said}"
    );
}
