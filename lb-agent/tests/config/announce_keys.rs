//! `[agent] announce_interface`, `announce_lifetime` and `bird_socket`
//! (docs/multi-node.md): parsed, defaults, errors name file:line:key.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use lb_agent::config;

fn parse(text: &str) -> Result<config::Config, String> {
    config::parse(text, Path::new("lb.toml")).map_err(|e| e.to_string())
}

#[test]
fn off_by_default() {
    let c = parse("[agent]\n").expect("parses");
    assert_eq!(c.agent.announce_interface, None);
    assert_eq!(c.agent.bird_socket, None);
}

#[test]
fn parsed_when_given() {
    let c =
        parse("[agent]\nannounce_interface = \"lbvip\"\nbird_socket = \"/run/bird/bird.ctl\"\n")
            .expect("parses");
    assert_eq!(c.agent.announce_interface.as_deref(), Some("lbvip"));
    assert_eq!(
        c.agent.bird_socket,
        Some(PathBuf::from("/run/bird/bird.ctl"))
    );
    let off = parse("[agent]\nannounce_interface = \"\"\n").expect("parses");
    assert_eq!(off.agent.announce_interface, None, "\"\" disables");
}

#[test]
fn errors_name_the_line_and_key() {
    let err = parse("[agent]\nannounce_interface = \"a/b\"\n").expect_err("bad name");
    assert!(
        err.starts_with("lb.toml:2: agent.announce_interface:"),
        "{err}"
    );
    let err = parse("[agent]\nbird_socket = \"relative.ctl\"\n").expect_err("relative");
    assert!(err.starts_with("lb.toml:2: agent.bird_socket:"), "{err}");
    let err = parse("[agent]\n\nbird_socket = \"/run/bird/bird.ctl\"\n").expect_err("alone");
    assert!(err.starts_with("lb.toml:3: agent.bird_socket:"), "{err}");
    assert!(err.contains("needs announce_interface"), "{err}");
}

#[test]
fn changing_them_needs_a_restart() {
    let a = parse("[agent]\nannounce_interface = \"lbvip\"\n")
        .unwrap()
        .agent;
    let b = parse("[agent]\nannounce_interface = \"lo\"\n")
        .unwrap()
        .agent;
    let changes = config::restart_only_changes(&a, &b);
    assert_eq!(changes.0, vec!["announce_interface"]);
}

#[test]
fn the_lifetime_defaults_to_a_minute_and_takes_whole_seconds_or_forever() {
    let c = parse("[agent]\n").expect("parses");
    assert_eq!(
        c.agent.announce_lifetime,
        Some(config::DEFAULT_ANNOUNCE_LIFETIME)
    );
    assert_eq!(config::DEFAULT_ANNOUNCE_LIFETIME, Duration::from_secs(60));
    let c = parse("[agent]\nannounce_lifetime = \"5m\"\n").expect("parses");
    assert_eq!(c.agent.announce_lifetime, Some(Duration::from_secs(300)));
    let c = parse("[agent]\nannounce_lifetime = \"forever\"\n").expect("parses");
    assert_eq!(c.agent.announce_lifetime, None);
    assert_eq!(
        config::announce_refresh_every(Duration::from_secs(4)),
        Duration::from_millis(1333)
    );
    for bad in ["2s", "1500ms", "3500ms", "2d", "0s", "soon"] {
        let err = parse(&format!("[agent]\n\nannounce_lifetime = \"{bad}\"\n")).expect_err(bad);
        assert!(
            err.starts_with("lb.toml:3: agent.announce_lifetime:"),
            "{bad}: {err}"
        );
    }
    let err = parse("[agent]\nannounce_lifetime = \"2s\"\n").unwrap_err();
    assert!(err.contains("from 3s to 86400s"), "{err}");
    let a = parse("[agent]\n").unwrap().agent;
    let b = parse("[agent]\nannounce_lifetime = \"30s\"\n")
        .unwrap()
        .agent;
    assert_eq!(
        config::restart_only_changes(&a, &b).0,
        vec!["announce_lifetime"]
    );
}
