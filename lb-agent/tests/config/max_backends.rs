//! `agent.max_backends`: the data plane's backend capacity over all services — its
//! default, its range, and a config with more servers than it, each refused with file,
//! line and key.

use std::path::Path;

use crate::util::check;
use lb_agent::config::{self, DEFAULT_MAX_BACKENDS, MAX_MAX_BACKENDS};

/// `[agent]` with `agent_lines`, then services of `per` servers each.
fn text(agent_lines: &str, services: usize, per: usize) -> String {
    let mut t = format!("[agent]\n{agent_lines}\n");
    for s in 0..services {
        t.push_str(&format!(
            "[[service]] # svc{s}\nname = \"s{s}\"\nvip = \"10.0.0.{}:80\"\nsnat_ip = \"10.0.0.2\"\n",
            s + 100
        ));
        for i in 0..per {
            let marker = if i == 0 {
                format!(" # first{s}")
            } else {
                String::new()
            };
            t.push_str(&format!(
                "[[service.server]]{marker}\naddress = \"10.{s}.{}.{}:80\"\n",
                i / 250,
                i % 250 + 1
            ));
        }
    }
    t
}

#[test]
fn the_default_is_the_compiled_size_and_larger_sizes_parse() {
    let c = config::parse(&text("", 1, 1), Path::new("lb.toml")).unwrap();
    assert_eq!(c.agent.max_backends, DEFAULT_MAX_BACKENDS);
    assert_eq!(DEFAULT_MAX_BACKENDS, lb_common::MAX_BACKENDS - 1);
    let c = config::parse(&text("max_backends = 131071", 1, 1), Path::new("lb.toml")).unwrap();
    assert_eq!(c.agent.max_backends, 131_071);
    let top = format!("max_backends = {MAX_MAX_BACKENDS}");
    let c = config::parse(&text(&top, 1, 1), Path::new("lb.toml")).unwrap();
    assert_eq!(c.agent.max_backends, MAX_MAX_BACKENDS);
}

#[test]
fn a_size_out_of_range_is_refused_with_file_line_and_key() {
    check(
        &text("interface = \"eth0\"\nmax_backends = 0 # here", 1, 1),
        "# here",
        "agent.max_backends",
        &["at least 1"],
    );
    let past = format!("max_backends = {} # here", MAX_MAX_BACKENDS + 1);
    check(
        &text(&past, 1, 1),
        "# here",
        "agent.max_backends",
        &["at most 1048575"],
    );
    check(
        &text("max_backends = \"many\" # here", 1, 1),
        "# here",
        "agent.max_backends",
        &["integer"],
    );
}

#[test]
fn more_servers_than_the_data_plane_holds_is_refused_at_the_service_that_passes_it() {
    // 3 services of 4 servers: the third takes the total to 12, past 10.
    check(
        &text("max_backends = 10", 3, 4),
        "# first2",
        "service[2].server",
        &["12 servers", "holds 10", "agent.max_backends"],
    );
    // Exactly the size is fine.
    let c = config::parse(&text("max_backends = 12", 3, 4), Path::new("lb.toml")).unwrap();
    assert_eq!(c.services.len(), 3);
}

#[test]
fn check_config_says_the_room_and_its_memory_when_not_the_default() {
    let host = config::HostFacts::default();
    let c = config::parse(&text("", 1, 2), Path::new("lb.toml")).unwrap();
    let lines = config::render(&c, Path::new("lb.toml"), &host);
    assert!(!lines.iter().any(|l| l.contains("room for")), "{lines:?}");
    let c = config::parse(&text("max_backends = 131071", 2, 3), Path::new("lb.toml")).unwrap();
    let lines = config::render(&c, Path::new("lb.toml"), &host);
    let line = lines
        .iter()
        .find(|l| l.starts_with("data plane: room for 131071 backends (6 configured)"))
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(
        line.contains("backend maps 4.0 MiB + 4.0 MiB per CPU"),
        "{line}"
    );
}
