//! docs/getting-started.md's rehearsal on one machine, run as the page writes it: the
//! shell blocks of its section "A rehearsal on one machine", in order, each with
//! `bash -e` and the workspace's `lb-agent` first on `PATH`; the last block (the
//! cleanup) runs also when an earlier one fails. The page cannot drift from what works:
//! the client's requests are answered by both backends, through lb in nat (generic XDP:
//! the lb host's veth peer runs no XDP program, which doctor says).

use std::{
    path::Path,
    process::{Command, Output},
};

use lb_tests::agent::daemon::locate_binary;

const PAGE: &str = "docs/getting-started.md";
const SECTION: &str = "## A rehearsal on one machine";
/// Each block's time limit (the agent's start and its first probes included).
const BLOCK_LIMIT_SECS: &str = "180";

/// The ```sh blocks of `section` in `page`, in order.
fn shell_blocks(page: &str, section: &str) -> Vec<String> {
    let start = page.find(section).expect("the rehearsal's section");
    let body = &page[start + section.len()..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in body.lines() {
        match &mut open {
            None if line.trim_end() == "```sh" => open = Some(String::new()),
            None => {}
            Some(_) if line.trim_end() == "```" => blocks.extend(open.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(open.is_none(), "an unterminated ```sh block in {section}");
    blocks
}

fn bash(block: &str, path: &str, strict: bool) -> Output {
    let mut cmd = Command::new("timeout");
    cmd.args([BLOCK_LIMIT_SECS, "bash"]);
    if strict {
        cmd.arg("-e");
    }
    cmd.args(["-c", block])
        .env("PATH", path)
        .env("NO_COLOR", "1")
        .output()
        .expect("running bash")
}

/// Runs the cleanup block when dropped.
struct Cleanup<'a> {
    block: &'a str,
    path: &'a str,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        bash(self.block, self.path, false);
    }
}

fn tool_present(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_rehearsal_on_one_machine_works_as_written() {
    for tool in ["python3", "curl"] {
        if !tool_present(tool) {
            // CI has both (the machine image); elsewhere a missing one skips with a note.
            assert!(
                std::env::var_os("CI").is_none(),
                "the rehearsal needs {tool}, which is not installed"
            );
            eprintln!("skipped: the rehearsal needs {tool}, which is not installed");
            return;
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf();
    let page = std::fs::read_to_string(root.join(PAGE)).expect("reading the page");
    let blocks = shell_blocks(&page, SECTION);
    assert_eq!(
        blocks.len(),
        5,
        "network, servers, agent, requests, cleanup: {blocks:#?}"
    );
    let agent = locate_binary("lb-agent").expect("lb-agent built (cargo build --workspace --bins)");
    let path = format!(
        "{}:{}",
        agent.parent().expect("the binary's directory").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (cleanup, steps) = blocks.split_last().expect("blocks");
    // A rehearsal interrupted earlier leaves its namespaces behind.
    bash(cleanup, &path, false);
    let _cleanup = Cleanup {
        block: cleanup,
        path: &path,
    };
    let mut outputs = Vec::new();
    for (i, block) in steps.iter().enumerate() {
        let out = bash(block, &path, true);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        println!("--- block {} ---\n{block}--- stdout ---\n{stdout}", i + 1);
        assert!(
            out.status.success(),
            "block {} failed ({}):\n{block}\nstdout:\n{stdout}\nstderr:\n{stderr}\nagent log:\n{}",
            i + 1,
            out.status,
            std::fs::read_to_string("/tmp/lb-try/agent.log").unwrap_or_default()
        );
        outputs.push(stdout);
    }
    let [_, _, agent_out, requests] = &outputs[..] else {
        panic!("four steps before the cleanup");
    };
    assert!(
        agent_out
            .lines()
            .any(|l| l
                .starts_with("warning  xdp driver: eth0 is a veth whose peer takes no XDP frames")),
        "doctor names the veth case:\n{agent_out}"
    );
    assert!(
        agent_out.contains("on eth0 (generic)"),
        "the agent attached in generic mode:\n{agent_out}"
    );
    let answers: Vec<&str> = requests.lines().filter(|l| l.starts_with('b')).collect();
    assert_eq!(answers.len(), 20, "every request answered:\n{requests}");
    assert!(
        answers.contains(&"b1") && answers.contains(&"b2"),
        "both servers answered:\n{requests}"
    );
    for reason in ["nat_forward", "nat_reply"] {
        let line = format!("lb_packets_forwarded_total{{reason=\"{reason}\"}} ");
        let count: f64 = requests
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line}in:\n{requests}"));
        assert!(count >= 20.0, "{reason}: {count}");
    }
}
