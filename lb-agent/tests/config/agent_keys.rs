//! The `[agent]` keys of the API and admin state, what a reload cannot apply (named,
//! "restart to apply"), the loud warning for a non-loopback `api_listen`, and a nat
//! `snat_ip` that is not on this host (refused by `run`, warned by `check-config`).

use std::{path::Path, process::Command};

use lb_agent::config::{self, AgentConfig, non_loopback_api, restart_only_changes};

const SERVICE: &str = "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\n\
    snat_ip = \"SNAT\"\n[[service.server]]\naddress = \"10.0.1.1:80\"\n";

fn agent(lines: &str) -> Result<AgentConfig, config::ConfigError> {
    config::parse(&format!("[agent]\n{lines}\n"), Path::new("lb.toml")).map(|c| c.agent)
}

#[test]
fn api_and_state_keys_parse_with_defaults_and_empty_disables() {
    let d = agent("").unwrap();
    assert_eq!(
        d.api_socket.as_deref(),
        Some(Path::new(config::DEFAULT_API_SOCKET))
    );
    assert_eq!(
        d.state_file.as_deref(),
        Some(Path::new(config::DEFAULT_STATE_FILE))
    );
    assert_eq!(d.api_token_file, None);
    let c = agent("api_socket = \"\"\nstate_file = \"\"\napi_token_file = \"/etc/lb/token\"\n")
        .unwrap();
    assert_eq!((c.api_socket, c.state_file), (None, None));
    assert_eq!(
        c.api_token_file.as_deref(),
        Some(Path::new("/etc/lb/token"))
    );
    let c = agent("api_socket = \"/run/x.sock\"\napi_socket_group = \"lbadmin\"\n").unwrap();
    assert_eq!(c.api_socket_group.as_deref(), Some("lbadmin"));
}

#[test]
fn bad_api_and_state_keys_are_refused_with_file_line_and_key() {
    for (lines, key, says) in [
        (
            "api_socket = \"run/x.sock\"",
            "agent.api_socket",
            "absolute path",
        ),
        (
            "state_file = \"state.json\"",
            "agent.state_file",
            "absolute path",
        ),
        (
            "api_token_file = \"\"",
            "agent.api_token_file",
            "leave the key out",
        ),
        (
            "api_socket = \"\"\napi_socket_group = \"lb\"",
            "agent.api_socket_group",
            "needs api_socket",
        ),
        (
            "api_socket_group = \"a b\"",
            "agent.api_socket_group",
            "not a group name",
        ),
    ] {
        let err = agent(lines).expect_err(lines).to_string();
        assert!(
            err.starts_with("lb.toml:") && err.contains(key) && err.contains(says),
            "{lines}: {err}"
        );
    }
}

#[test]
fn a_reload_names_the_agent_keys_that_need_a_restart() {
    let running = agent("api_listen = \"127.0.0.1:9900\"").unwrap();
    let same = agent("api_listen = \"127.0.0.1:9900\"\nresolver = \"10.0.0.53\"").unwrap();
    assert!(
        restart_only_changes(&running, &same).is_empty(),
        "resolver applies live"
    );
    let new = agent(
        "api_listen = \"127.0.0.1:9901\"\nstate_file = \"/tmp/s.json\"\nxdp_mode = \"generic\"",
    )
    .unwrap();
    let changes = restart_only_changes(&running, &new);
    assert_eq!(changes.0, vec!["xdp_mode", "api_listen", "state_file"]);
    let text = changes.to_string();
    assert!(
        text.contains("xdp_mode, api_listen, state_file") && text.contains("restart to apply"),
        "{text}"
    );
}

#[test]
fn a_non_loopback_api_listen_is_warned_about() {
    for (listen, warned) in [
        ("127.0.0.1:9900", false),
        ("[::1]:9900", false),
        ("0.0.0.0:9900", true),
        ("10.0.0.5:9900", true),
    ] {
        let c = agent(&format!("api_listen = \"{listen}\"")).unwrap();
        let w = non_loopback_api(&c);
        assert_eq!(w.is_some(), warned, "{listen}: {w:?}");
        if let Some(w) = w {
            assert!(w.contains("not a loopback address"), "{w}");
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn addresses_the_agent_announces_itself_are_no_foreign_snat_ip() {
    let none = std::collections::BTreeSet::new();
    let parse = |head: &str, snat: &str| {
        config::parse(
            &format!("{head}{}", SERVICE.replace("SNAT", snat)),
            Path::new("lb.toml"),
        )
        .unwrap()
    };
    let announce = "[agent]\nannounce_interface = \"lo\"\n";
    let cluster = "[cluster]\nnode = \"lb1\"\nlisten = \"10.0.9.1:7946\"\n\
                   key_file = \"/etc/lb/cluster.key\"\n[[cluster.peer]]\nname = \"lb2\"\n\
                   address = \"10.0.9.2:7946\"\n";
    let foreign = |cfg: &config::Config| lb_agent::host::foreign_snat_ips(cfg, &none).len();
    // The VIP's own address: put there by the announcer.
    assert_eq!(foreign(&parse(announce, "10.0.0.100")), 0);
    assert_eq!(
        foreign(&parse("", "10.0.0.100")),
        1,
        "no announcer: not added"
    );
    // A SNAT address of its own: announced like a VIP in a cluster only.
    assert_eq!(
        foreign(&parse(&format!("{announce}{cluster}"), "10.0.0.2")),
        0
    );
    assert_eq!(foreign(&parse(announce, "10.0.0.2")), 1);
    assert_eq!(foreign(&parse(cluster, "10.0.0.2")), 1);
}

#[test]
fn a_snat_ip_not_on_this_host_is_found_refused_by_run_and_warned_by_check_config() {
    let local = lb_agent::host::local_addresses().expect("listing addresses");
    assert!(local.contains(&"127.0.0.1".parse().unwrap()), "{local:?}");
    let parse =
        |snat: &str| config::parse(&SERVICE.replace("SNAT", snat), Path::new("lb.toml")).unwrap();
    assert!(lb_agent::host::foreign_snat_ips(&parse("127.0.0.1"), &local).is_empty());
    let foreign = lb_agent::host::foreign_snat_ips(&parse("192.0.2.77"), &local);
    assert_eq!(
        foreign,
        vec![("web".to_string(), "192.0.2.77".parse().unwrap())]
    );

    let dir = std::env::temp_dir().join(format!("lb-snat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = format!(
        "[agent]\napi_listen = \"0.0.0.0:0\"\napi_socket = \"\"\nstate_file = \"\"\npin_path = \"\"\n\
         interface = \"lo\"\n{}",
        SERVICE.replace("SNAT", "192.0.2.77")
    );
    let cfg = write(&dir, "lb.toml", &text);
    let bin = env!("CARGO_BIN_EXE_lb-agent");
    let check = Command::new(bin)
        .args(["check-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{out}");
    assert!(
        out.contains("warning: api_listen = \"0.0.0.0:0\" is not a loopback address"),
        "{out}"
    );
    assert!(
        out.contains("snat_ip 192.0.2.77 not configured on this host"),
        "{out}"
    );
    // `run` refuses before touching the interface.
    let run = Command::new(bin)
        .args(["run", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{err}");
    assert!(
        err.contains("192.0.2.77") && err.contains("not configured on this host"),
        "{err}"
    );
    assert!(
        err.contains("!!! api_listen = \"0.0.0.0:0\" is not a loopback address"),
        "run warns loudly about the API address first: {err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
