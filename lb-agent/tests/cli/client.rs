//! The client commands against a real API on a Unix socket: `status` lines up
//! `[IPv6]:port` addresses, `events` prints the transitions (and `--follow` the new
//! ones), `server add|set --spare` send the same change in either form, and every
//! client command finds the socket through `--config`.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::{Arc, Mutex as StdMutex},
    time::Duration,
};

use lb_agent::{
    api::{AdminChange, ApiState, Limits, ListenConfig, Listening, listen},
    view::{Event, ServerStatus, ServiceStatus, Snapshot},
};
use tokio::sync::{Mutex, mpsc, watch};

/// A temp directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("lb-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Agent {
    socket: PathBuf,
    events: lb_agent::api::EventLog,
    /// Every change the API handed to the agent side, as JSON.
    changes: Arc<StdMutex<Vec<String>>>,
    _listening: Listening,
    _keep: watch::Sender<Arc<Snapshot>>,
    dir: TempDir,
}

fn event(i: u32, to: &str) -> Event {
    Event {
        time: format!("2026-01-01T00:00:{i:02}Z"),
        service: "web6".into(),
        server: "[2001:db8::1]:8080".into(),
        from: "up".into(),
        to: to.into(),
        cause: format!("probe http failed ({i})"),
    }
}

async fn agent(tag: &str) -> Agent {
    let dir = TempDir::new(tag);
    let socket = dir.0.join("api.sock");
    let srv = |a: &str, state: &str| {
        Arc::new(ServerStatus {
            address: a.into(),
            weight: 3,
            state: state.into(),
            active: true,
            mac: Some("02:00:00:00:00:01".into()),
            ..Default::default()
        })
    };
    let snap = Snapshot {
        services: vec![ServiceStatus {
            name: "web6".into(),
            vip: "[2001:db8::100]:80".into(),
            protocol: "tcp".into(),
            forwarding: "nat".into(),
            servers: vec![
                srv("[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535", "up"),
                srv("[2001:db8::1]:8080", "unhealthy"),
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    let (keep, latest) = watch::channel(Arc::new(snap));
    let (admin, mut admin_rx) = mpsc::channel::<lb_agent::api::AdminRequest>(8);
    let (reload, _reload_rx) = mpsc::channel(1);
    std::mem::forget(_reload_rx);
    let changes = Arc::new(StdMutex::new(Vec::new()));
    let seen = changes.clone();
    tokio::spawn(async move {
        while let Some(req) = admin_rx.recv().await {
            let text = match &req.change {
                AdminChange::Patch(p) => serde_json::to_string(p).unwrap(),
                AdminChange::Add(n) => serde_json::to_string(n).unwrap(),
                other => format!("{other:?}"),
            };
            seen.lock()
                .unwrap()
                .push(format!("{} {} {text}", req.service, req.address));
            let _ = req.reply.send(Ok(()));
        }
    });
    let events: lb_agent::api::EventLog = Arc::new(Mutex::new(
        [event(1, "unhealthy"), event(2, "up")]
            .into_iter()
            .collect(),
    ));
    let state = ApiState {
        snapshot: latest.into(),
        events: events.clone(),
        admin,
        reload,
        counters: Default::default(),
    };
    let listening = listen(
        state,
        ListenConfig {
            tcp: None,
            socket: Some(socket.clone()),
            socket_group: None,
            token: None,
            limits: Limits::default(),
        },
    )
    .await
    .expect("the API listens");
    Agent {
        socket,
        events,
        changes,
        _listening: listening,
        _keep: keep,
        dir,
    }
}

/// Runs `lb-agent ARGS` off the runtime's threads; its output.
async fn cli(args: &[&str]) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_lb-agent"))
            .args(&args)
            .output()
            .expect("running lb-agent")
    })
    .await
    .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn config_naming(dir: &Path, socket: &Path) -> String {
    let path = dir.join("lb.toml");
    std::fs::write(
        &path,
        format!(
            "[agent]\ninterface = \"eth0\"\napi_socket = \"{}\"\napi_listen = \"\"\n",
            socket.display()
        ),
    )
    .unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_lines_up_ipv6_addresses_and_finds_the_socket_through_the_config() {
    let a = agent("status").await;
    let config = config_naming(&a.dir.0, &a.socket);
    let out = stdout(&cli(&["status", "--config", &config]).await);
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("  ")).collect();
    assert_eq!(rows.len(), 3, "{out}");
    let col = |l: &str, word: &str| l.find(word).unwrap_or_else(|| panic!("{word} in {l}"));
    // The weight column ends at the same place on the header and both rows.
    let header_weight = col(rows[0], "weight") + "weight".len();
    assert_eq!(col(rows[1], " 3 ") + 2, header_weight, "{out}");
    assert_eq!(col(rows[2], " 3 ") + 2, header_weight, "{out}");
    assert_eq!(col(rows[1], " up "), col(rows[2], " unhealthy "), "{out}");
    // `-c` works too, and `--socket` is still the way to name the socket directly.
    let short = stdout(&cli(&["status", "-c", &config]).await);
    assert_eq!(short, out);
    let socket = a.socket.display().to_string();
    let direct = stdout(&cli(&["status", "--socket", &socket]).await);
    assert_eq!(direct, out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_without_an_api_is_named_in_the_error() {
    let dir = TempDir::new("noapi");
    let path = dir.0.join("lb.toml");
    std::fs::write(&path, "[agent]\napi_socket = \"\"\napi_listen = \"\"\n").unwrap();
    let out = cli(&["status", "--config", path.to_str().unwrap()]).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("disables both api_socket and api_listen"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_prints_each_transition_and_follow_prints_new_ones() {
    let a = agent("events").await;
    let config = config_naming(&a.dir.0, &a.socket);
    let out = stdout(&cli(&["events", "--config", &config]).await);
    assert_eq!(
        out,
        "2026-01-01T00:00:01Z  web6  [2001:db8::1]:8080  up -> unhealthy  probe http failed (1)\n\
         2026-01-01T00:00:02Z  web6  [2001:db8::1]:8080  up -> up  probe http failed (2)\n"
    );
    let json = stdout(&cli(&["events", "--json", "-c", &config]).await);
    let v: Vec<Event> = serde_json::from_str(json.trim()).expect("the API's JSON");
    assert_eq!(v.len(), 2);

    // --follow: the two, then a third logged while it runs, each printed once.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lb-agent"))
        .args(["events", "--follow", "--config", &config])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning lb-agent events --follow");
    let stdout_pipe = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stdout_pipe).lines() {
            let Ok(line) = line else { break };
            lines.push(line);
            if lines.len() == 3 {
                break;
            }
        }
        lines
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.events.lock().await.push_back(event(3, "unhealthy"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().expect("stopping --follow");
    child.wait().unwrap();
    let lines = reader.join().unwrap();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[2].contains("probe http failed (3)"), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spare_is_one_form_for_add_and_set() {
    let a = agent("spare").await;
    let config = config_naming(&a.dir.0, &a.socket);
    for args in [
        &["server", "add", "web6", "[2001:db8::2]:8080", "--spare"][..],
        &[
            "server",
            "add",
            "web6",
            "[2001:db8::3]:8080",
            "--spare=false",
        ],
        &["server", "set", "web6", "[2001:db8::1]:8080", "--spare"],
        &[
            "server",
            "set",
            "web6",
            "[2001:db8::1]:8080",
            "--spare",
            "false",
        ],
        &[
            "server",
            "set",
            "web6",
            "[2001:db8::1]:8080",
            "--spare=true",
        ],
    ] {
        let mut args = args.to_vec();
        args.extend(["--config", &config]);
        assert_eq!(stdout(&cli(&args).await), "ok\n", "{args:?}");
    }
    let changes = a.changes.lock().unwrap().clone();
    assert_eq!(changes.len(), 5, "{changes:?}");
    assert!(changes[0].contains("\"spare\":true"), "{changes:?}");
    assert!(changes[1].contains("\"spare\":false"), "{changes:?}");
    assert!(changes[2].contains("\"spare\":true"), "{changes:?}");
    assert!(changes[3].contains("\"spare\":false"), "{changes:?}");
    assert!(changes[4].contains("\"spare\":true"), "{changes:?}");
    assert!(
        changes[2].starts_with("web6 [2001:db8::1]:8080 "),
        "{changes:?}"
    );
}

#[test]
fn every_argument_has_help() {
    // `--help` of each command lists every argument with a sentence after it.
    let commands: &[&[&str]] = &[
        &["status"],
        &["events"],
        &["reload"],
        &["server", "drain"],
        &["server", "set"],
        &["server", "add"],
        &["server", "remove"],
        &["node", "drain"],
        &["run"],
        &["detach"],
        &["check-config"],
        &["doctor"],
    ];
    for cmd in commands {
        let out = Command::new(env!("CARGO_BIN_EXE_lb-agent"))
            .args(*cmd)
            .arg("--help")
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut section = "";
        for line in text.lines() {
            if line.ends_with(':') && !line.starts_with(' ') {
                section = line;
                continue;
            }
            if !(section == "Arguments:" || section == "Options:") || line.trim().is_empty() {
                continue;
            }
            let t = line.trim_start();
            // An argument line: `<NAME>  help` or `-x, --name <V>  help`; a continued
            // help line is indented further and starts with a word.
            if t.starts_with('<') || t.starts_with('-') {
                let (_, help) = t.split_once("  ").unwrap_or((t, ""));
                assert!(
                    !help.trim().is_empty(),
                    "`lb-agent {}` argument without help: {line:?}\n{text}",
                    cmd.join(" ")
                );
            }
        }
    }
}
