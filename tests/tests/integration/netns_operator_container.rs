//! The agent run as `docker run` / `podman run` runs it (docs/deployment.md):
//! `docker run --read-only --tmpfs /run -v lb-state:/var/lib/lb-agent --cap-add BPF
//! --cap-add PERFMON --cap-add NET_ADMIN --cap-add SYS_ADMIN --network <the lb namespace> … lb-agent run`.
//!
//! Emulated: its own network namespace (joined with setns), mount, PID, UTS and IPC
//! namespaces (`unshare --pid --fork --mount-proc`), the agent as PID 1 of its PID
//! namespace (every wrapper execs), a fresh read-only sysfs (so no bpffs), /proc masked
//! and partly read-only as Docker does, a read-only root with a tmpfs on /run and a
//! "volume" (a directory of the test) on /var/lib/lb-agent, root with Docker's default
//! capabilities plus the added ones as bounding set and none inheritable or ambient.
//! `docker kill -s HUP`, `docker stop` and `docker exec` are a signal from the host to
//! PID 1 and `nsenter` into its namespaces. Not emulated: an image of its own (the
//! host's root is used, read-only), a private /dev, seccomp and AppArmor profiles
//! (Docker's default AppArmor profile denies mount: see docs/deployment.md), cgroups.

use std::{
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        confine::{self, DOCKER_DEFAULT_CAPS, Script, cap_mask, children, ns_pids, status_field},
        daemon::{AgentConfig, READY_LINE, RELOADED_LINE, Service},
        operator::{
            FRESH, STOP_BOUND, agent_binary, assert_adopted, kill, line_with, state, wait_exit,
            write_operator_config,
        },
    },
    net::topology::{Forwarding, Topology},
    scenario::{
        balance::{self, WEIGHTS},
        restart::{Stream, assert_served, assert_stream_clean, echoes, other_backend},
    },
    traffic::clients::EchoConn,
    util::process::NsProcess,
};

const TESTSERVER: &str = env!("CARGO_BIN_EXE_lb-testserver");
const START: Duration = Duration::from_secs(30);
/// What docs/deployment.md tells operators to add with `--cap-add`.
const CAP_ADD: [&str; 4] = ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_ADMIN"];
const HOSTNAME: &str = "lb-container";

/// A started container: the `unshare` process the test holds and the agent, its PID 1.
struct Container {
    runtime: NsProcess,
    init: u32,
}

fn capabilities(cap_add: &[&str]) -> Vec<String> {
    DOCKER_DEFAULT_CAPS
        .iter()
        .chain(cap_add.iter())
        .map(|c| c.to_string())
        .collect()
}

/// `docker run …`: the agent as PID 1, until it says it is ready.
fn run(topo: &Topology, config: &Path, volume: &Path) -> Container {
    let runtime = spawn(topo, config, volume, &CAP_ADD);
    let t = Instant::now();
    runtime
        .wait_for_line(0, READY_LINE, START)
        .unwrap_or_else(|e| panic!("the containerized agent should start: {e}"));
    println!(
        "container: lb-agent ready {:?} after docker run",
        t.elapsed()
    );
    let init = match children(runtime.pid()).as_slice() {
        [one] => *one,
        other => panic!("unshare should have one child, the container's init: {other:?}"),
    };
    Container { runtime, init }
}

/// `docker run --cap-add …` for each of `cap_add`: the `unshare` process whose child,
/// PID 1 of the container, is the agent.
fn spawn(topo: &Topology, config: &Path, volume: &Path, cap_add: &[&str]) -> NsProcess {
    let mut script = Script::default();
    script
        .line(format!("hostname {HOSTNAME}"))
        .container_sys_and_proc()
        .read_only_root()
        .line("mount -t tmpfs -o mode=0755 tmpfs /run")
        .tmpfs_with_binds("/var/lib", &[(volume, "/var/lib/lb-agent")]);
    let mut command = vec![
        "env".to_owned(),
        "-i".to_owned(),
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        format!("HOSTNAME={HOSTNAME}"),
        "NO_COLOR=1".to_owned(),
    ];
    let program = vec![
        agent_binary().display().to_string(),
        "run".to_owned(),
        "--config".to_owned(),
        config.display().to_string(),
    ];
    // Docker applies no limits of its own by default: the daemon's are inherited.
    command.extend(confine::privileges(
        &capabilities(cap_add),
        false,
        false,
        &[],
        &program,
    ));
    let mut cmd = confine::in_netns(&topo.lb().ns);
    cmd.args([
        "unshare",
        "--mount",
        "--uts",
        "--ipc",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--propagation",
        "private",
        "--",
    ])
    .args(["sh", "-c", &script.exec(&command)]);
    NsProcess::spawn_command(&topo.lb().ns, "container", cmd)
        .unwrap_or_else(|e| panic!("docker run: {e}"))
}

impl Container {
    /// `docker kill -s HUP` after rewriting the mounted config.
    fn reload(&self, config_path: &Path, config: &AgentConfig) -> String {
        write_operator_config(config_path, config);
        let since = self.runtime.cursor();
        kill(self.init, libc::SIGHUP).expect("SIGHUP to PID 1");
        self.runtime
            .wait_for_line(since, RELOADED_LINE, Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("SIGHUP to PID 1 should reload: {e}"))
    }

    /// `docker exec CONTAINER lb-agent ARGS…`.
    fn exec(&self, args: &[&str]) -> String {
        let out = Command::new("nsenter")
            .arg(format!("--target={}", self.init))
            .args(["--mount", "--uts", "--ipc", "--net", "--pid", "--"])
            .arg(agent_binary())
            .args(args)
            .env("NO_COLOR", "1")
            .output()
            .expect("running nsenter");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "docker exec lb-agent {args:?}:\n{said}"
        );
        said
    }

    /// `docker stop`: SIGTERM to PID 1, which must exit 0 by itself within the bound
    /// (Docker would SIGKILL after 10 s).
    fn stop(mut self) {
        let since = self.runtime.cursor();
        kill(self.init, libc::SIGTERM).expect("SIGTERM to PID 1");
        let t = Instant::now();
        let status = wait_exit(&mut self.runtime, STOP_BOUND).unwrap_or_else(|| {
            panic!(
                "PID 1 ignored SIGTERM for {STOP_BOUND:?}:\n{}",
                self.runtime.tail(20)
            )
        });
        let line = self
            .runtime
            .wait_for_line(since, "shutting down", Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("no shutdown line: {e}"));
        assert!(
            status.success(),
            "docker stop: PID 1 should exit 0: {status}"
        );
        println!(
            "container: stopped by SIGTERM to PID 1 in {:?}: {line}",
            t.elapsed()
        );
    }
}

/// What the kernel says about the container's init: the agent, PID 1 of its own PID
/// namespace, with exactly Docker's capabilities plus the added ones, in its own
/// UTS namespace, and no zombie among its children.
fn assert_containerized(c: &Container) {
    let pid = c.init;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    assert!(
        exe.ends_with("lb-agent"),
        "PID 1 should be lb-agent: {}",
        exe.display()
    );
    let pids = ns_pids(pid);
    assert_eq!(
        pids.last(),
        Some(&1),
        "the agent is PID 1 of its namespace: {pids:?}"
    );
    let want = cap_mask(&capabilities(&CAP_ADD));
    for field in ["CapEff", "CapBnd"] {
        let got = status_field(pid, field).expect(field);
        assert_eq!(
            u64::from_str_radix(&got, 16).expect("hex"),
            want,
            "{field} should be Docker's default set plus --cap-add"
        );
    }
    assert_eq!(
        status_field(pid, "CapAmb").as_deref(),
        Some("0000000000000000")
    );
    for ns in ["uts", "ipc", "pid", "mnt"] {
        let own = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).expect("ns");
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).expect("ns");
        assert_ne!(
            own, ours,
            "the container should have its own {ns} namespace"
        );
    }
    let zombies: Vec<u32> = children(pid)
        .into_iter()
        .filter(|c| state(*c) == Some('Z'))
        .collect();
    assert!(zombies.is_empty(), "PID 1 left zombies: {zombies:?}");
}

/// docker run, traffic, docker exec status, two reloads by SIGHUP to PID 1, docker
/// stop within the bound, docker run again adopting the state with no failed
/// connection.
#[test]
fn container_start_reload_stop_restart() {
    let bed = balance::Testbed::start(Forwarding::Dsr, 186, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service: Service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let mut config = AgentConfig::new(vec![service.clone()]);
    // Only the socket in the container's /run; pins at the default /sys/fs/bpf/lb,
    // which in a container is the agent's own bpffs and dies with it.
    config.api_listen = String::new();
    config.pin_path = "/sys/fs/bpf/lb".to_owned();
    let config_path = topo.dir().join("lb.toml");
    write_operator_config(&config_path, &config);
    let volume: PathBuf = topo.dir().join("lb-state");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&volume)
        .expect("creating the volume");

    let c = run(topo, &config_path, &volume);
    line_with(&c.runtime, FRESH, "first container");
    // The default pin_path lands in the container's own /sys: the agent must not
    // pretend the pins outlive it.
    line_with(
        &c.runtime,
        "the pins vanish when the agent exits",
        "pins in a container",
    );
    let said = c.exec(&["status"]);
    assert!(
        said.contains(&service.name),
        "docker exec lb-agent status:\n{said}"
    );

    let client = topo.client();
    let mut conn = EchoConn::connect(&client.ns, client.ipv4.into(), vip)
        .expect("entering the client namespace")
        .unwrap_or_else(|e| panic!("a connection to {vip} should be answered: {e}"));
    let kept = conn.backend().to_owned();
    let stream = Stream::start(topo, vip);
    thread::sleep(Duration::from_millis(300));

    let (_, removed) = other_backend(topo, &kept);
    let mut smaller = config.clone();
    smaller.services = vec![service.without(removed)];
    c.reload(&config_path, &smaller);
    let said = c.exec(&["status"]);
    assert!(
        !said.contains(&removed.to_string()),
        "after the reload {removed} should be gone:\n{said}"
    );
    thread::sleep(Duration::from_millis(300));
    c.reload(&config_path, &config);
    echoes(&mut conn, "after the reloads", "container", "after SIGHUP");
    assert_containerized(&c);

    c.stop();
    thread::sleep(Duration::from_millis(300));
    let c = run(topo, &config_path, &volume);
    assert_adopted(&c.runtime, "second container");
    echoes(
        &mut conn,
        "after the second run",
        "container",
        "after restart",
    );
    assert_served(topo, vip, 40_000, "served by the second container");
    assert!(
        !c.runtime.lines().iter().any(|l| l.contains("ERROR")),
        "no error in the second container's log:\n{}",
        c.runtime.tail(30)
    );

    let tally = stream.finish();
    println!(
        "container: {} new connections across two reloads and a stop+run in {:?}: {} \
         failed; long-lived connection to {kept} kept",
        tally.attempted,
        tally.elapsed,
        tally.failures.len()
    );
    assert_stream_clean(&tally, "container");
    assert_containerized(&c);
    c.stop();
}

/// Without `--cap-add SYS_ADMIN` the agent starts fresh, but a second container cannot
/// adopt the running program (opening it by id needs CAP_SYS_ADMIN): it must refuse,
/// naming the capability and how to start fresh, and leave the running program serving.
#[test]
fn container_without_sys_admin_cannot_adopt_and_says_so() {
    let bed = balance::Testbed::start(Forwarding::Nat, 187, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service: Service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let mut config = AgentConfig::new(vec![service]);
    config.api_listen = String::new();
    let config_path = topo.dir().join("lb.toml");
    write_operator_config(&config_path, &config);
    let volume: PathBuf = topo.dir().join("lb-state");
    std::fs::create_dir(&volume).expect("creating the volume");
    let cap_add = ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"];

    let first = spawn(topo, &config_path, &volume, &cap_add);
    first
        .wait_for_line(0, READY_LINE, START)
        .unwrap_or_else(|e| panic!("a fresh start needs no CAP_SYS_ADMIN: {e}"));
    let init = children(first.pid())[0];
    let c = Container {
        runtime: first,
        init,
    };
    assert_served(topo, vip, 40_000, "served without CAP_SYS_ADMIN");
    c.stop();

    let mut second = spawn(topo, &config_path, &volume, &cap_add);
    let status = wait_exit(&mut second, START)
        .unwrap_or_else(|| panic!("the second container should refuse:\n{}", second.tail(20)));
    thread::sleep(Duration::from_millis(100));
    let said = second.lines().join("\n");
    println!("container without SYS_ADMIN, second run: {status}\n{said}");
    assert!(
        !status.success(),
        "adoption without CAP_SYS_ADMIN must fail:\n{said}"
    );
    assert!(
        said.contains("CAP_SYS_ADMIN") && said.contains("ip link set dev eth0 xdp off"),
        "the refusal should name CAP_SYS_ADMIN and how to start fresh:\n{said}"
    );
    assert_served(topo, vip, 41_000, "the running program still serves");
}
