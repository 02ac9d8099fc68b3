//! The monitoring operators install from `contrib/`: the Prometheus alert rules pass
//! `promtool check rules` and their unit tests (`promtool test rules`), every query of the
//! Grafana dashboard is PromQL that promtool accepts, and every metric family the
//! dashboard and the rules name is one docs/metrics.md lists (netns_metrics holds the
//! same families against a running agent's `/metrics`).
//!
//! promtool comes from Debian's `prometheus` package, which `cargo xtask test` installs.

use lb_tests::{
    agent::metric_families::{
        ALERT_RULES, ALERT_TESTS, dashboard_queries, documented, named_in_contrib, repo_root,
    },
    net::names,
    util::{cmd, temp_dir::TempDir},
};

/// `promtool args…`; its output.
fn promtool(args: &[&str]) -> String {
    cmd::run("promtool", args).unwrap_or_else(|e| {
        panic!("{e} (promtool: Debian's `prometheus` package, which `cargo xtask test` installs)")
    })
}

/// The path of `relative` in the repository, as an argument.
fn in_repo(relative: &str) -> String {
    repo_root().join(relative).to_string_lossy().into_owned()
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let checked = promtool(&["check", "rules", &in_repo(ALERT_RULES)]);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", &in_repo(ALERT_TESTS)]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_dashboard_query_is_promql() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 30, "only {} queries found", queries.len());
    // Each query as a recording rule; Grafana's `$__rate_interval` is a range there.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        let expr = q.replace("$__rate_interval", "5m");
        assert!(!expr.contains("$__"), "an unknown Grafana variable in {q}");
        rules.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: {}\n",
            json_string(&expr)
        ));
    }
    names::sweep_stale_once();
    let dir = TempDir::create(std::env::temp_dir().join(format!("{}-dash", names::unique_tag())))
        .expect("a temporary directory");
    let file = dir.path().join("dashboard-rules.yml");
    std::fs::write(&file, rules).expect("writing the rules");
    let checked = promtool(&["check", "rules", &file.to_string_lossy()]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
}

#[test]
fn every_family_named_is_documented() {
    let documented = documented();
    let named = named_in_contrib();
    for family in [
        "lb_server_state",
        "lb_propagation_seconds",
        "lb_probe_duration_seconds",
        "lb_vip_announced",
    ] {
        assert!(
            named.contains_key(family),
            "{family} is not named: {named:?}"
        );
    }
    let unknown: Vec<_> = named
        .iter()
        .filter(|(family, _)| !documented.contains_key(*family))
        .collect();
    assert!(
        unknown.is_empty(),
        "named in contrib but not in docs/metrics.md: {unknown:?}"
    );
}

/// `s` as a double-quoted string (JSON's escapes, which YAML reads the same).
fn json_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
