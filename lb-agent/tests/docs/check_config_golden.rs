//! `check-config`'s text for every config in `examples/` against its checked-in
//! `examples/expected/NAME.out` (docs/check-config.md). `LB_BLESS=1` rewrites the `.out`
//! files instead of comparing; review the diff. The real binary is also run on the
//! examples whose text cannot depend on the host.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use lb_agent::config::{self, HostFacts};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("lb-agent sits in the workspace")
        .to_path_buf()
}

/// `examples/*.toml`, sorted.
fn examples() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(repo().join("examples"))
        .expect("examples/ exists")
        .map(|e| e.expect("readable examples/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    out.sort();
    assert!(out.len() >= 10, "the example set went missing: {out:?}");
    out
}

/// Fixed host facts, so that the text is the same on every machine.
fn host() -> HostFacts {
    let local: BTreeSet<IpAddr> = ["10.0.0.2", "10.0.0.3", "fd00::2"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    HostFacts {
        local_addresses: Some(Ok(local)),
        ephemeral_ports: Some(32768..=60999),
        raw_tcp_socket: None,
        memory: Some(16 << 30),
    }
}

/// The path as `check-config` is shown it: relative to the repository.
fn shown(path: &Path) -> PathBuf {
    path.strip_prefix(repo()).unwrap().to_path_buf()
}

/// What `check-config --config examples/NAME.toml` prints, run from the repository root:
/// stdout for a valid file, the error (its stderr, exit status 2) for a refused one.
fn text(path: &Path) -> (String, bool) {
    let body = std::fs::read_to_string(path).unwrap();
    match config::parse(&body, &shown(path)) {
        Ok(cfg) => {
            let mut t = config::render(&cfg, &shown(path), &host()).join("\n");
            t.push('\n');
            (t, true)
        }
        Err(e) => (format!("{e}\n"), false),
    }
}

fn expected_path(path: &Path) -> PathBuf {
    let stem = path.file_stem().unwrap().to_str().unwrap();
    repo().join("examples/expected").join(format!("{stem}.out"))
}

#[test]
fn check_config_text_matches_the_golden_files() {
    let bless = std::env::var_os("LB_BLESS").is_some_and(|v| v == "1");
    let mut wrong = Vec::new();
    for path in examples() {
        let (got, _) = text(&path);
        assert_plain(&path, &got);
        let want_path = expected_path(&path);
        if bless {
            std::fs::write(&want_path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&want_path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; create it with LB_BLESS=1 cargo test -p lb-agent --test docs check_config_golden",
                want_path.display()
            )
        });
        if got != want {
            wrong.push(format!(
                "{}:\n--- expected ({})\n{want}--- got\n{got}",
                shown(&path).display(),
                shown(&want_path).display()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "check-config text changed (LB_BLESS=1 regenerates, then review `git diff examples/expected`):\n{}",
        wrong.join("\n")
    );
}

/// The text speaks the config's language: no Rust type names (`Tcp Nat`, `Onfail`) and
/// no Debug durations (`0ns`, `1.5s` is fine).
fn assert_plain(path: &Path, text: &str) {
    const TYPE_NAMES: &[&str] = &[
        "Tcp", "Udp", "Nat", "Dsr", "Http", "Icmp", "Always", "Idle", "Onfail", "None",
    ];
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        assert!(
            !TYPE_NAMES.contains(&word),
            "{}: internal name {word:?} in:\n{text}",
            path.display()
        );
    }
    for debug in ["Level(", "Some(", "0ns", "µs"] {
        assert!(
            !text.contains(debug),
            "{}: Debug output {debug:?} in:\n{text}",
            path.display()
        );
    }
}

#[test]
fn every_golden_file_has_its_example() {
    let stems: BTreeSet<String> = examples()
        .iter()
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    for entry in std::fs::read_dir(repo().join("examples/expected")).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(
            stems.contains(&stem),
            "{} has no examples/{stem}.toml: remove it",
            path.display()
        );
    }
}

/// Does the text of this example depend on the host? nat services (snat addresses,
/// ephemeral ports) and tcp probes without data that may use the SYN check (whether
/// this host opens raw sockets) make it so.
fn host_independent(path: &Path) -> bool {
    let body = std::fs::read_to_string(path).unwrap();
    match config::parse(&body, path) {
        Ok(cfg) => cfg.services.iter().all(|s| {
            s.forwarding == config::Forwarding::Dsr
                && !s.probes.iter().any(|p| {
                    p.kind == config::ProbeKind::Tcp
                        && lb_agent::probe::syn::plain(p)
                        && p.tcp_check != config::TcpCheck::Connect
                })
        }),
        Err(_) => true,
    }
}

/// `check-config FILE` without `--config` prints the same as with it (but for the
/// `flow tables:` line, whose default follows this host's memory).
#[test]
fn check_config_takes_the_file_without_config_too() {
    let path = repo().join("examples/udp-probes.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_lb-agent"))
        .current_dir(repo())
        .arg("check-config")
        .arg(shown(&path))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        without_tables_line(&String::from_utf8_lossy(&out.stdout)),
        without_tables_line(&text(&path).0)
    );
}

/// The text without its `flow tables:` line, and whether it had one.
fn without_tables_line(text: &str) -> (String, bool) {
    let mut had = false;
    let kept: Vec<&str> = text
        .split_inclusive('\n')
        .filter(|l| {
            let tables = l.starts_with("flow tables: ");
            had |= tables;
            !tables
        })
        .collect();
    (kept.concat(), had)
}

#[test]
fn the_binary_prints_the_golden_text() {
    let mut ran = 0;
    for path in examples().into_iter().filter(|p| host_independent(p)) {
        let out = Command::new(env!("CARGO_BIN_EXE_lb-agent"))
            .current_dir(repo())
            .arg("check-config")
            .arg("--config")
            .arg(shown(&path))
            .output()
            .unwrap();
        let (want, valid) = text(&path);
        let (stream, code) = if valid {
            (&out.stdout, 0)
        } else {
            (&out.stderr, 2)
        };
        assert_eq!(out.status.code(), Some(code), "{}: {out:?}", path.display());
        // The tables' default size follows this host's memory (the golden text is
        // rendered for 16 GiB): that line is compared by its start only.
        let got = String::from_utf8_lossy(stream);
        let (got, got_tables) = without_tables_line(&got);
        let (want, want_tables) = without_tables_line(&want);
        assert_eq!(got, want, "{}", path.display());
        assert_eq!(got_tables, want_tables, "{}", path.display());
        ran += 1;
    }
    assert!(ran >= 4, "too few host-independent examples ran: {ran}");
}
