//! `agent.log_format`: `lb-agent run` writes plain text lines without colour codes when
//! stderr is not a terminal, and one JSON object per event with `"json"`. The agent is
//! pointed at an interface that does not exist, so it logs its first line and stops.

use std::process::Command;

fn run_with(format: &str) -> String {
    let dir = std::env::temp_dir().join(format!("lb-log-format-{}-{format}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("lb.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\ninterface = \"nosuch-lb0\"\nlog_format = \"{format}\"\napi_listen = \"\"\n\
             api_socket = \"\"\npin_path = \"\"\nstate_file = \"\"\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lb-agent"))
        .args(["run", "--config"])
        .arg(&config)
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .output()
        .expect("running lb-agent");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success(), "no such interface: the agent stops");
    String::from_utf8(out.stderr).expect("utf-8 log")
}

#[test]
fn text_logs_have_no_colour_codes_off_a_terminal() {
    let log = run_with("text");
    let first = log.lines().next().expect("a log line");
    assert!(first.contains(" INFO "), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "no ANSI escape codes in a pipe: {log:?}"
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let log = run_with("json");
    let events: Vec<&str> = log.lines().filter(|l| l.starts_with('{')).collect();
    assert!(!events.is_empty(), "{log}");
    for line in events {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON object");
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        assert!(v["fields"]["message"].is_string(), "{line}");
    }
    // The fatal error itself is the program's last word on stderr, not a log event.
    assert!(
        log.contains("interface `nosuch-lb0` does not exist"),
        "{log}"
    );
}

#[test]
fn the_format_key_takes_text_or_json_and_needs_a_restart() {
    use lb_agent::config::{self, LogFormat};
    let parse = |t: &str| config::parse(t, std::path::Path::new("lb.toml"));
    assert_eq!(
        parse("[agent]\n").unwrap().agent.log_format,
        LogFormat::Text
    );
    let json = parse("[agent]\nlog_format = \"json\"\n").unwrap().agent;
    assert_eq!(json.log_format, LogFormat::Json);
    let err = parse("[agent]\nlog_format = \"yaml\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("lb.toml:2: agent.log_format:"), "{err}");
    let text = parse("[agent]\n").unwrap().agent;
    assert_eq!(
        config::restart_only_changes(&text, &json).0,
        vec!["log_format"]
    );
}
