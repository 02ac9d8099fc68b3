//! `agent.max_flows`: the flow, nat and source tables' size — unset by default (derived
//! from the host's memory at start), its range refused with file, line and key, and
//! `check-config`'s line with the sizes, why and their memory.

use std::path::Path;

use crate::util::check;
use lb_agent::config::{self, HostFacts, MAX_MAX_FLOWS, MIN_MAX_FLOWS};

const SERVICE: &str = "[[service]]\nname = \"s\"\nvip = \"10.0.0.100:80\"\nforwarding = \"dsr\"\n\
                       [[service.server]]\naddress = \"10.0.1.1:80\"\n";

fn text(agent_lines: &str) -> String {
    format!("[agent]\n{agent_lines}\n{SERVICE}")
}

fn render(agent_lines: &str, memory: Option<u64>) -> String {
    let c = config::parse(&text(agent_lines), Path::new("lb.toml")).unwrap();
    let host = HostFacts {
        memory,
        ..HostFacts::default()
    };
    let lines = config::render(&c, Path::new("lb.toml"), &host);
    lines
        .into_iter()
        .find(|l| l.starts_with("flow tables: "))
        .expect("the tables' line")
}

#[test]
fn unset_by_default_and_the_range_parses() {
    let c = config::parse(&text(""), Path::new("lb.toml")).unwrap();
    assert_eq!(c.agent.max_flows, None);
    for n in [MIN_MAX_FLOWS, 1_000_000, MAX_MAX_FLOWS] {
        let c = config::parse(&text(&format!("max_flows = {n}")), Path::new("lb.toml")).unwrap();
        assert_eq!(c.agent.max_flows, Some(n));
    }
}

#[test]
fn a_size_out_of_range_is_refused_with_file_line_and_key() {
    check(
        &text("max_flows = 1023 # here"),
        "# here",
        "agent.max_flows",
        &["at least 1024"],
    );
    check(
        &text(&format!("max_flows = {} # here", MAX_MAX_FLOWS + 1)),
        "# here",
        "agent.max_flows",
        &["at most 16777216"],
    );
}

#[test]
fn check_config_says_the_size_why_and_the_memory() {
    const GIB: u64 = 1 << 30;
    assert_eq!(
        render("max_flows = 1000000", None),
        "flow tables: 1048576 live flows (agent.max_flows): LB_FLOWS 288.0 MiB (1048576 \
         buckets of 4 ways), LB_NAT 208.0 MiB (524288 buckets of 4 ways), LB_SOURCES 24.0 MiB \
         (262144 entries); 520.0 MiB in all, 520 B per flow"
    );
    let line = render("", Some(256 * GIB));
    assert!(
        line.starts_with("flow tables: 1048576 live flows (the default: 1/400 of this host's 256.0 GiB of memory, at least 262144)"),
        "{line}"
    );
    let line = render("", Some(4 * GIB));
    assert!(line.starts_with("flow tables: 262144 live flows"), "{line}");
}
