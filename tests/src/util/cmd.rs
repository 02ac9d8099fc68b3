//! Runs the short setup commands of the harness (`ip`), quoting the command and its stderr on failure.

use std::{
    io::Write,
    process::{Command, Stdio},
};

use crate::util::error::Error;

/// Runs `program args…` to completion and returns its stdout.
pub fn run(program: &str, args: &[&str]) -> Result<String, Error> {
    run_with_input(program, args, None)
}

/// Runs `ip args…` and returns its stdout.
pub fn ip(args: &[&str]) -> Result<String, Error> {
    run("ip", args)
}

/// Runs `ip [-n NETNS] -batch -` with `lines` on stdin: one process for many changes.
/// iproute2 stops at the first failing line and reports it.
pub fn ip_batch(netns: Option<&str>, lines: &[String]) -> Result<(), Error> {
    if lines.is_empty() {
        return Ok(());
    }
    let mut args = Vec::new();
    if let Some(ns) = netns {
        args.extend(["-n", ns]);
    }
    args.extend(["-batch", "-"]);
    let mut input = lines.join("\n");
    input.push('\n');
    run_with_input("ip", &args, Some(&input)).map(drop)
}

/// Runs `program args…` with `input` on its stdin (if any) and returns its stdout.
pub fn run_with_input(program: &str, args: &[&str], input: Option<&str>) -> Result<String, Error> {
    let cmd = describe(program, args, input);
    let spawn_err = |source| Error::Spawn {
        cmd: cmd.clone(),
        source,
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        // `ip -batch` reads all of stdin before it exits, so this cannot block forever.
        stdin.write_all(text.as_bytes()).map_err(spawn_err)?;
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd,
            status: out.status.to_string(),
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn describe(program: &str, args: &[&str], input: Option<&str>) -> String {
    let mut s = program.to_owned();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    if let Some(text) = input {
        s.push_str(" <<< ");
        s.push_str(&text.trim().replace('\n', "; "));
    }
    s
}
