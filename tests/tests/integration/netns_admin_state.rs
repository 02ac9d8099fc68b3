//! Runtime admin state end to end (docs/admin-state.md, docs/api-security.md): changes
//! made with `lb-agent server …` over the agent's Unix socket stay in force across a
//! reload (which names the `[agent]` key it cannot apply) and across a restart (the
//! state file), until `lb-agent server reset`; over TCP without the token a change is
//! refused. A reload to a nat `snat_ip` this host does not have is refused.

use std::{net::SocketAddr, path::Path, time::Duration};

use lb_tests::{
    agent::{
        api::{self, Api},
        daemon::{Agent, AgentConfig, RELOAD_TIMEOUT, START_TIMEOUT, locate_binary, socket_path},
    },
    net::topology::Forwarding,
    scenario::balance::{self, BACKEND_TCP_PORT, WEIGHTS},
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const CLI_TIMEOUT: Duration = Duration::from_secs(10);
const WAIT: Duration = Duration::from_secs(10);

#[test]
fn runtime_changes_survive_reload_and_restart_until_reset() {
    let bed = balance::Testbed::start(Forwarding::Nat, 71, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let binary = locate_binary("lb-agent").expect("lb-agent binary");
    let config = AgentConfig::new(vec![service.clone()]);
    let agent = Agent::start(topo, &binary, &config, Some("native"), START_TIMEOUT)
        .expect("starting lb-agent");
    let api = Api::new(&topo.lb().ns);
    let b = |i: usize| SocketAddr::new(topo.backends()[i].ipv4.into(), BACKEND_TCP_PORT);
    let (b1, b2) = (b(0), b(1));
    api.wait_service("web", "every server up", WAIT, |s| {
        s.servers.iter().all(|v| v.state == "up")
    })
    .expect("all servers up after start");

    let socket = socket_path(topo.dir()).display().to_string();
    let cli = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["--socket", &socket]);
        api::cli(&topo.lb().ns, &binary, &all, CLI_TIMEOUT)
    };
    let (b1s, b2s) = (b1.to_string(), b2.to_string());
    cli(&["server", "down", "web", &b1s]).expect("`server down` over the socket");
    cli(&["server", "set", "web", &b2s, "--weight", "5"]).expect("`server set --weight`");

    // Over TCP without the token, the CLI's change is refused and says why.
    let url = api.url();
    let refused = api::cli(
        &topo.lb().ns,
        &binary,
        &["server", "up", "web", &b1s, "--api", &url],
        CLI_TIMEOUT,
    )
    .expect_err("a change over TCP without the token");
    assert!(refused.to_string().contains("401"), "{refused}");

    let changed = |s: &api::ServiceView| {
        s.server(b1).is_some_and(|v| v.state == "down" && !v.active)
            && s.server(b2).is_some_and(|v| v.weight == 5)
    };
    api.wait_service("web", "b1 down, b2 weight 5", WAIT, changed)
        .expect("the changes are in force");

    // A reload that also changes api_listen: the runtime changes stay, the key is named.
    let mut moved = config.clone();
    moved.api_listen = "127.0.0.1:9901".into();
    let since = agent.process().cursor();
    let line = agent
        .reload(&moved, RELOAD_TIMEOUT)
        .expect("the reload is applied");
    let warning = agent
        .process()
        .wait_for_line(since, "restart to apply", Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("the reload must name the key it cannot apply ({line}): {e}"));
    assert!(warning.contains("api_listen"), "{warning}");
    let out = cli(&["reload"]).expect("`lb-agent reload` over the socket");
    assert!(
        out.contains("warning: [agent] api_listen changed: restart to apply"),
        "{out}"
    );
    let (view, _) = api
        .wait_service("web", "changes kept by the reload", WAIT, changed)
        .expect("the API still listens on the running address; changes kept");
    println!("after reload:\n{}", view.describe(|a| a.to_string()));

    // Restart: the state file brings the changes back before the first publish.
    agent
        .stop(Duration::from_secs(10))
        .expect("stopping the agent");
    let state = std::fs::read_to_string(lb_tests::agent::daemon::state_file(topo.dir()))
        .expect("the state file was written");
    assert!(
        state.contains("\"down\"") && state.contains("\"weight\": 5"),
        "{state}"
    );
    let agent = Agent::start(topo, &binary, &config, Some("native"), START_TIMEOUT)
        .expect("restarting lb-agent");
    assert!(
        agent
            .process()
            .lines()
            .iter()
            .any(|l| l.contains("restoring the runtime admin state")),
        "the restart says it restores state:\n{}",
        agent.process().tail(20)
    );
    let first = api.service("web").expect("GET service after restart");
    assert!(
        changed(&first),
        "the first status after a restart already has the changes:\n{}",
        first.describe(|a| a.to_string())
    );

    cli(&["server", "reset", "web", &b1s]).expect("`server reset`");
    cli(&["server", "reset", "web", &b2s]).expect("`server reset`");
    let (view, took) = api
        .wait_service("web", "b1 up, b2 back to the file's weight", WAIT, |s| {
            s.server(b1).is_some_and(|v| v.state == "up" && v.active)
                && s.server(b2)
                    .is_some_and(|v| v.weight == u64::from(WEIGHTS[1]))
        })
        .expect("reset returns to the file");
    println!(
        "after reset ({took:.2?}):\n{}",
        view.describe(|a| a.to_string())
    );
    agent
        .stop(Duration::from_secs(10))
        .expect("stopping the agent");
}

#[test]
fn a_reload_to_a_snat_ip_not_on_this_host_is_refused() {
    let bed = balance::Testbed::start(Forwarding::Nat, 72, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service = balance::tcp_service(topo, &backends);
    let agent = balance::start_agent(topo, vec![service.clone()], Some("native"))
        .expect("starting lb-agent");
    let mut foreign = service.clone();
    foreign.snat_ip = Some("192.0.2.77".parse().unwrap());
    let err = agent
        .reload(&AgentConfig::new(vec![foreign]), RELOAD_TIMEOUT)
        .expect_err("a snat_ip the lb host does not have");
    let text = err.to_string();
    assert!(
        text.contains("192.0.2.77") && text.contains("not configured on this host"),
        "{text}"
    );
    let api = Api::new(&topo.lb().ns);
    api.wait_service("web", "the running config still serves", WAIT, |s| {
        s.servers.iter().all(|v| v.state == "up" && v.active)
    })
    .expect("the running config stays in force");
    agent
        .stop(Duration::from_secs(10))
        .expect("stopping the agent");
}
