//! The agent run the way systemd runs `contrib/lb-agent.service`, read from the unit
//! file itself so that unit and test cannot drift.
//!
//! Emulated (docs/deployment.md): the network namespace joined with setns only (as
//! `NetworkNamespacePath=` does, no /sys remount); a private mount namespace (slave
//! propagation) with every mount but /dev, /proc and /sys read-only (`ProtectSystem=
//! strict`), /home and /root empty and inaccessible (`ProtectHome=yes`), /run and
//! /var/lib read-only except `/run/lb-agent` and `/var/lib/lb-agent`, which are
//! directories of the test created with the unit's modes (`RuntimeDirectory*`,
//! `StateDirectory*`; the rest of /run and /var/lib is hidden, where systemd would show
//! it read-only); root with exactly the unit's bounding and ambient capabilities,
//! `LimitMEMLOCK`, `LimitNOFILE`, `NoNewPrivileges`; a cleared environment with
//! `RUNTIME_DIRECTORY` and `STATE_DIRECTORY`. `ExecStartPre`, `ExecStart` and
//! `ExecReload` are the unit's command lines with the binary and config paths replaced
//! by the test's, `ExecReload` confined as the agent is (it reaches the agent through
//! the unit's runtime directory) and judged by its exit status; `Type=notify`: the agent
//! gets `NOTIFY_SOCKET` (a datagram socket of the test) and `WATCHDOG_USEC`, "started"
//! means `READY=1` arrived, the watchdog pings are counted (at 1 s instead of the unit's
//! `WatchdogSec`, so that a short run sees several) and a stop must say `STOPPING=1`;
//! `KillSignal` is sent as systemd sends it. Not emulated: cgroups,
//! seccomp, the journal (stdout is a pipe), `Restart=` timing (the test restarts).

use std::{
    os::unix::{fs::DirBuilderExt, net::UnixDatagram},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use lb_tests::{
    agent::{
        confine::{self, Script, cap_mask, status_field},
        daemon::{AgentConfig, READY_LINE, RELOADED_LINE, Service},
        operator::{
            FRESH, STOP_BOUND, agent_binary, assert_adopted, contrib, kill, limit, line_with,
            run_to_end, wait_exit, write_operator_config,
        },
        unit_file::UnitFile,
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
/// `WATCHDOG_USEC` given to the agent: pings every 0.5 s.
const WATCHDOG_EMULATED: Duration = Duration::from_secs(1);
/// Paths of the unit replaced by the test's own.
const UNIT_BINARY: &str = "/usr/local/bin/lb-agent";
const UNIT_CONFIG: &str = "/etc/lb/lb.toml";

/// The unit we ship.
fn unit() -> UnitFile {
    UnitFile::read(&contrib("lb-agent.service")).expect("reading contrib/lb-agent.service")
}

/// Each directive the scenario follows is set once (a repeated one would make systemd
/// merge or override silently), and the capability sets agree.
#[test]
fn the_unit_says_each_directive_once() {
    let unit = unit();
    for key in [
        "Type",
        "NotifyAccess",
        "WatchdogSec",
        "ExecStartPre",
        "ExecStart",
        "ExecReload",
        "KillSignal",
        "Restart",
        "RestartSec",
        "AmbientCapabilities",
        "CapabilityBoundingSet",
        "LimitMEMLOCK",
        "LimitNOFILE",
        "NoNewPrivileges",
        "ProtectSystem",
        "ProtectHome",
        "RuntimeDirectory",
        "RuntimeDirectoryMode",
        "StateDirectory",
        "StateDirectoryMode",
    ] {
        unit.service(key)
            .unwrap_or_else(|e| panic!("contrib/lb-agent.service: {e}"));
    }
    assert_eq!(
        unit.service_list("AmbientCapabilities"),
        unit.service_list("CapabilityBoundingSet"),
        "root keeps the bounding set; the ambient set should say the same"
    );
    assert_eq!(unit.service("Restart").unwrap(), "on-failure");
    assert_eq!(unit.service("Type").unwrap(), "notify");
    assert_eq!(unit.service("NotifyAccess").unwrap(), "main");
    let watchdog = unit.service("WatchdogSec").unwrap();
    let secs: u64 = watchdog
        .strip_suffix('s')
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("WatchdogSec={watchdog}: seconds expected"));
    assert!(
        (10..=120).contains(&secs),
        "WatchdogSec={watchdog}: long enough for a busy loop, short enough to matter"
    );
    let reload = unit.service("ExecReload").unwrap();
    assert!(
        reload.ends_with("lb-agent reload --config /etc/lb/lb.toml"),
        "ExecReload must wait for the agent's answer and fail on a refused config, and find \
         the API socket the config names: {reload}"
    );
    assert_eq!(unit.service("ProtectSystem").unwrap(), "strict");
}

/// The service as systemd would start it, from the unit's directives.
struct Unit {
    unit: UnitFile,
    binary: PathBuf,
    config: PathBuf,
    /// Host directories mounted as /run/lb-agent and /var/lib/lb-agent.
    runtime_dir: PathBuf,
    state_dir: PathBuf,
    /// `NOTIFY_SOCKET`: what the agent tells systemd.
    notify: UnixDatagram,
    notify_path: PathBuf,
}

impl Unit {
    fn new(topo: &Topology, config: &AgentConfig) -> Unit {
        let unit = unit();
        let topo_dir = topo.dir();
        let runtime_dir = topo_dir.join("run-lb-agent");
        let state_dir = topo_dir.join("var-lib-lb-agent");
        for (dir, mode_key) in [
            (&runtime_dir, "RuntimeDirectoryMode"),
            (&state_dir, "StateDirectoryMode"),
        ] {
            let mode = u32::from_str_radix(unit.service(mode_key).expect(mode_key), 8)
                .expect("an octal mode");
            std::fs::DirBuilder::new()
                .mode(mode)
                .create(dir)
                .unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        }
        assert_eq!(unit.service("RuntimeDirectory").unwrap(), "lb-agent");
        assert_eq!(unit.service("StateDirectory").unwrap(), "lb-agent");
        let config_path = topo_dir.join("lb.toml");
        write_operator_config(&config_path, config);
        let notify_path = topo_dir.join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).expect("binding the notify socket");
        Unit {
            unit,
            binary: agent_binary(),
            config: config_path,
            runtime_dir,
            state_dir,
            notify,
            notify_path,
        }
    }

    /// The notifications that arrive within `wait` (all of them: the wait ends early
    /// once one contains `until`).
    fn notifications(&self, wait: Duration, until: &str) -> Vec<String> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return got;
            }
            self.notify.set_read_timeout(Some(left)).unwrap();
            match self.notify.recv(&mut buf) {
                Ok(n) => {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let done = !until.is_empty() && msg.contains(until);
                    got.push(msg);
                    if done {
                        return got;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return got,
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return got,
                Err(e) => panic!("reading the notify socket: {e}"),
            }
        }
    }

    /// The watchdog pings waiting in the socket now.
    fn watchdog_pings(&self) -> usize {
        self.notifications(Duration::from_millis(50), "")
            .iter()
            .filter(|m| m.contains("WATCHDOG=1"))
            .count()
    }

    /// The unit's `key=` command line, with the test's binary and config.
    fn command(&self, key: &str) -> Vec<String> {
        let line = self.unit.service(key).expect(key);
        assert!(
            !line.starts_with(['-', '+', '!', '@', ':']),
            "{key}= has a prefix the scenario does not emulate: {line}"
        );
        line.split_whitespace()
            .map(|w| match w {
                UNIT_BINARY => self.binary.display().to_string(),
                UNIT_CONFIG => self.config.display().to_string(),
                other => other.to_owned(),
            })
            .collect()
    }

    /// The capabilities of `key=` as names.
    fn caps(&self, key: &str) -> Vec<String> {
        self.unit.service_list(key)
    }

    /// `LimitMEMLOCK` and `LimitNOFILE` as prlimit spells them, each lowered to this
    /// process's hard limit when above it: raising a hard limit needs CAP_SYS_RESOURCE,
    /// which a sandboxed test machine may lack (said on stdout when it happens).
    fn limits(&self) -> Vec<(&'static str, String)> {
        [
            ("memlock", "LimitMEMLOCK", libc::RLIMIT_MEMLOCK),
            ("nofile", "LimitNOFILE", libc::RLIMIT_NOFILE),
        ]
        .into_iter()
        .map(|(name, key, resource)| {
            let v = self.unit.service(key).expect(key);
            let wanted = if v == "infinity" {
                libc::RLIM_INFINITY
            } else {
                v.parse().unwrap_or_else(|_| panic!("{key}={v}"))
            };
            let hard = hard_limit(resource);
            let value = if wanted <= hard {
                wanted
            } else {
                println!(
                    "systemd: {key}={v} not emulated: this process's hard limit is {hard} and \
                     raising it needs CAP_SYS_RESOURCE; the agent runs with {hard}"
                );
                hard
            };
            let text = if value == libc::RLIM_INFINITY {
                "unlimited".to_owned()
            } else {
                value.to_string()
            };
            (name, text)
        })
        .collect()
    }

    /// Starts `key=` (ExecStartPre, ExecStart) confined as the unit says.
    fn spawn(&self, topo: &Topology, key: &str) -> NsProcess {
        assert_eq!(self.unit.service("ProtectSystem").unwrap(), "strict");
        assert_eq!(self.unit.service("ProtectHome").unwrap(), "yes");
        let mut script = Script::default();
        script
            .read_only_root()
            .inaccessible(&["/home", "/root"])
            .tmpfs_with_binds("/run", &[(&self.runtime_dir, "/run/lb-agent")])
            .tmpfs_with_binds("/var/lib", &[(&self.state_dir, "/var/lib/lb-agent")]);
        let ambient = self.caps("AmbientCapabilities");
        assert_eq!(ambient, self.caps("CapabilityBoundingSet"));
        let nnp = self.unit.service("NoNewPrivileges").unwrap() == "yes";
        let mut command = vec![
            "env".to_owned(),
            "-i".to_owned(),
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            "RUNTIME_DIRECTORY=/run/lb-agent".to_owned(),
            "STATE_DIRECTORY=/var/lib/lb-agent".to_owned(),
            "NO_COLOR=1".to_owned(),
        ];
        if key == "ExecStart" {
            command.push(format!("NOTIFY_SOCKET={}", self.notify_path.display()));
            command.push(format!("WATCHDOG_USEC={}", WATCHDOG_EMULATED.as_micros()));
        }
        command.extend(confine::privileges(
            &ambient,
            true,
            nnp,
            &self.limits(),
            &self.command(key),
        ));
        let mut cmd = confine::in_netns(&topo.lb().ns);
        cmd.args(["unshare", "--mount", "--propagation", "slave", "--"])
            .args(["sh", "-c", &script.exec(&command)]);
        NsProcess::spawn_command(&topo.lb().ns, &format!("systemd {key}"), cmd)
            .unwrap_or_else(|e| panic!("starting {key}: {e}"))
    }

    /// `systemctl start`: ExecStartPre must succeed, then ExecStart until it notifies
    /// `READY=1`, which it may do only once it is attached and serving.
    fn start(&self, topo: &Topology) -> NsProcess {
        let (status, said) = run_to_end(self.spawn(topo, "ExecStartPre"), START);
        assert!(
            status.success(),
            "ExecStartPre (check-config) failed:\n{said}"
        );
        // What a previous run left unread.
        self.notifications(Duration::from_millis(10), "");
        let t = Instant::now();
        let agent = self.spawn(topo, "ExecStart");
        let told = self.notifications(START, "READY=1");
        let ready = told
            .iter()
            .find(|m| m.lines().any(|l| l == "READY=1"))
            .unwrap_or_else(|| {
                panic!(
                    "Type=notify: no READY=1 within {START:?} (got {told:?}):\n{}",
                    agent.tail(20)
                )
            });
        assert!(ready.contains("STATUS=serving"), "{ready:?}");
        agent
            .wait_for_line(0, READY_LINE, Duration::from_secs(2))
            .unwrap_or_else(|e| panic!("READY=1 before the agent was ready: {e}"));
        println!(
            "systemd: READY=1 {:?} after ExecStart: {ready:?}",
            t.elapsed()
        );
        agent
    }

    /// `systemctl reload`: the unit's ExecReload, confined as the service; it returns
    /// once the agent has applied the file.
    fn reload(&self, topo: &Topology, agent: &NsProcess, config: &AgentConfig) -> String {
        write_operator_config(&self.config, config);
        let since = agent.cursor();
        let (status, said) = run_to_end(self.spawn(topo, "ExecReload"), START);
        assert!(status.success(), "ExecReload failed:\n{said}");
        // Synchronous: the agent's line is there when ExecReload has returned.
        agent
            .wait_for_line(since, RELOADED_LINE, Duration::from_millis(500))
            .unwrap_or_else(|e| panic!("ExecReload returned before the reload: {e}"))
    }

    /// `systemctl reload` of a file the agent refuses: ExecReload fails and says why; the
    /// running config stays in force.
    fn refused_reload(&self, topo: &Topology, agent: &NsProcess, broken: &str) {
        let good = std::fs::read_to_string(&self.config).unwrap();
        std::fs::write(&self.config, broken).unwrap();
        let since = agent.cursor();
        let (status, said) = run_to_end(self.spawn(topo, "ExecReload"), START);
        std::fs::write(&self.config, good).unwrap();
        assert!(
            !status.success(),
            "ExecReload must fail when the agent refuses the file:\n{said}"
        );
        assert!(said.contains("lb.toml"), "ExecReload says why: {said}");
        agent
            .wait_for_line(since, "reload failed", Duration::from_millis(500))
            .unwrap_or_else(|e| panic!("the agent refused the file: {e}"));
        println!("systemd: refused ExecReload said: {}", said.trim());
    }

    /// `systemctl stop`: KillSignal to the main process; it must end by itself with
    /// status 0 (else Restart=on-failure would restart it) within [`STOP_BOUND`].
    fn stop(&self, mut agent: NsProcess) {
        let name = self.unit.service("KillSignal").unwrap();
        let signal = match name {
            "SIGTERM" => libc::SIGTERM,
            "SIGINT" => libc::SIGINT,
            other => panic!("KillSignal={other} is not emulated"),
        };
        let since = agent.cursor();
        kill(agent.pid(), signal).expect("sending KillSignal");
        let t = Instant::now();
        let status = wait_exit(&mut agent, STOP_BOUND)
            .unwrap_or_else(|| panic!("KillSignal={name}: still running after {STOP_BOUND:?}"));
        let told = self.notifications(Duration::from_millis(200), "STOPPING=1");
        assert!(
            told.iter().any(|m| m.contains("STOPPING=1")),
            "Type=notify: a stop says STOPPING=1 (got {told:?})"
        );
        let line = agent
            .wait_for_line(since, "shutting down", Duration::from_secs(1))
            .unwrap_or_else(|e| panic!("no shutdown line: {e}"));
        assert!(
            status.success(),
            "KillSignal={name} should exit 0: {status}"
        );
        println!("systemd: stopped by {name} in {:?}: {line}", t.elapsed());
    }

    /// `lb-agent status` on the host, through the runtime directory's socket.
    fn status(&self) -> String {
        let socket = self.runtime_dir.join("lb-agent.sock");
        let out = Command::new(&self.binary)
            .args(["status", "--socket"])
            .arg(&socket)
            .env("NO_COLOR", "1")
            .output()
            .expect("running lb-agent status");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "lb-agent status --socket {}:\n{said}",
            socket.display()
        );
        said
    }
}

/// What the kernel says about the confined agent: the unit's capabilities exactly,
/// no_new_privs, the limits, the private mount namespace.
fn assert_confined(service: &Unit, agent: &NsProcess) {
    let pid = agent.pid();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the agent's exe");
    assert!(
        exe.ends_with("lb-agent"),
        "the main pid should be lb-agent itself (every wrapper execs): {}",
        exe.display()
    );
    let want = cap_mask(&service.caps("CapabilityBoundingSet"));
    for field in ["CapEff", "CapPrm", "CapBnd", "CapAmb"] {
        let got = status_field(pid, field).expect(field);
        assert_eq!(
            u64::from_str_radix(&got, 16).expect("hex"),
            want,
            "{field} of the agent should be the unit's set ({want:x})"
        );
    }
    assert_eq!(status_field(pid, "NoNewPrivs").as_deref(), Some("1"));
    for (name, row) in [
        ("nofile", "Max open files"),
        ("memlock", "Max locked memory"),
    ] {
        let (_, value) = service
            .limits()
            .into_iter()
            .find(|(n, _)| *n == name)
            .expect("a limit");
        assert_eq!(
            limit(pid, row),
            Some((value.clone(), value)),
            "{row} of the agent (Limit* of the unit)"
        );
    }
    let own = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("mnt ns");
    let ours = std::fs::read_link("/proc/self/ns/mnt").expect("mnt ns");
    assert_ne!(
        own, ours,
        "the agent should have a mount namespace of its own"
    );
}

/// The whole life of the service: check-config, start, traffic, status from the host,
/// two reloads, stop and start (adopting, no failed connection), a crash (SIGKILL, as
/// Restart=on-failure would restart it) and start again.
#[test]
fn systemd_unit_start_reload_stop_restart() {
    let bed = balance::Testbed::start(Forwarding::Nat, 185, false, Path::new(TESTSERVER));
    let topo = &bed.topo;
    let backends = balance::weighted(topo, &WEIGHTS);
    let service: Service = balance::tcp_service(topo, &backends);
    let vip = service.vip;
    let mut config = AgentConfig::new(vec![service.clone()]);
    // The API only on the unit's socket; pins off (the host's /sys/fs/bpf is shared
    // with every other test: setns-only keeps the host's /sys).
    config.api_listen = String::new();
    config.pin_path = String::new();
    let unit = Unit::new(topo, &config);

    let agent = unit.start(topo);
    line_with(&agent, FRESH, "first start");
    assert_confined(&unit, &agent);
    let said = unit.status();
    assert!(
        said.contains(&service.name),
        "status from the host should show the service:\n{said}"
    );

    let client = topo.client();
    let mut conn = EchoConn::connect(&client.ns, client.ipv4.into(), vip)
        .expect("entering the client namespace")
        .unwrap_or_else(|e| panic!("a connection to {vip} should be answered: {e}"));
    let kept = conn.backend().to_owned();
    let stream = Stream::start(topo, vip);
    thread::sleep(Duration::from_millis(300));

    // ExecReload: a server out, then back; a file with an error is refused.
    let started = Instant::now();
    let (_, removed) = other_backend(topo, &kept);
    let mut smaller = config.clone();
    smaller.services = vec![service.without(removed)];
    unit.reload(topo, &agent, &smaller);
    let said = unit.status();
    assert!(
        !said.contains(&removed.to_string()),
        "after the reload {removed} should be gone from status:\n{said}"
    );
    thread::sleep(Duration::from_millis(300));
    unit.refused_reload(topo, &agent, "[agent]\ninterfce = \"eth0\"\n");
    unit.reload(topo, &agent, &config);
    thread::sleep(Duration::from_secs(2));
    let pings = unit.watchdog_pings();
    let expected = started.elapsed().as_secs_f64() / (WATCHDOG_EMULATED.as_secs_f64() / 2.0);
    println!(
        "systemd: {pings} watchdog pings in {:?} (every {:?} expected)",
        started.elapsed(),
        WATCHDOG_EMULATED / 2
    );
    assert!(
        pings as f64 >= expected * 0.5,
        "WATCHDOG=1 from the main loop every {:?}: {pings} in {:?}",
        WATCHDOG_EMULATED / 2,
        started.elapsed()
    );
    echoes(
        &mut conn,
        "after the reloads",
        "systemd",
        "after ExecReload",
    );

    // KillSignal, then systemctl start: adopted, nothing lost.
    unit.stop(agent);
    thread::sleep(Duration::from_millis(300));
    let agent = unit.start(topo);
    assert_adopted(&agent, "systemd restart");
    echoes(&mut conn, "after restart", "systemd", "after the restart");
    assert!(
        unit.status().contains(&service.name),
        "status after restart"
    );

    // A crash: Restart=on-failure starts it again after RestartSec.
    kill(agent.pid(), libc::SIGKILL).expect("SIGKILL");
    drop(agent);
    let restart_sec = unit.unit.service("RestartSec").unwrap();
    let pause = restart_sec
        .trim_end_matches('s')
        .parse::<u64>()
        .map(Duration::from_secs)
        .unwrap_or_else(|_| panic!("RestartSec={restart_sec} is not emulated"));
    thread::sleep(pause);
    let agent = unit.start(topo);
    assert_adopted(&agent, "systemd restart after a crash");
    assert!(
        !agent.lines().iter().any(|l| l.contains("ERROR")),
        "no error in the restarted agent's log:\n{}",
        agent.tail(30)
    );
    assert_served(topo, vip, 40_000, "after the restarts");

    let tally = stream.finish();
    println!(
        "systemd: {} new connections across two reloads, a stop+start and a crash+start \
         in {:?}: {} failed; long-lived connection to {kept} kept",
        tally.attempted,
        tally.elapsed,
        tally.failures.len()
    );
    assert_stream_clean(&tally, "systemd");
    unit.stop(agent);
}

/// This process's hard limit of `resource`.
fn hard_limit(resource: libc::__rlimit_resource_t) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    assert_eq!(unsafe { libc::getrlimit(resource, &mut lim) }, 0);
    lim.rlim_max
}
