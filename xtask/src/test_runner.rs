//! The root half of `cargo xtask test`: lb-tests' binaries, built once, run as separate
//! processes in lanes ([`crate::test_classes`]): the timed lane one binary at a time,
//! the light lane beside it, and the binaries that need the machine to themselves with
//! nothing beside them. Each binary's output is captured and printed whole when it ends;
//! a table of every binary's wall time and result closes the run.

use std::{
    collections::VecDeque,
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Condvar, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use crate::test_classes::{self, Class};

/// The extra arguments of `cargo xtask test`, split as `cargo test` reads them:
/// options for cargo, and the arguments every test binary gets (a name filter,
/// `--exact`, `--nocapture`…).
#[derive(Debug, Default, PartialEq)]
pub struct Extra {
    pub cargo: Vec<String>,
    pub binary: Vec<String>,
}

/// The `cargo` arguments of the soak that `cargo xtask bench` runs for the suite: the
/// dsr half of `netns_traffic_ordinary` (ignored in `cargo xtask test`, which keeps nat).
pub const BENCH_SOAK: [&str; 11] = [
    "test",
    "--release",
    "-p",
    "lb-tests",
    "--test",
    "netns_traffic_ordinary",
    "--",
    "--ignored",
    "--exact",
    "ordinary_traffic_moves_no_health_dsr",
    "--test-threads=1",
];

/// `cargo test` options that take a value as the next argument.
const CARGO_VALUE_OPTS: &[&str] = &[
    "--test",
    "--bin",
    "--bench",
    "--example",
    "-p",
    "--package",
    "--exclude",
    "-F",
    "--features",
    "-j",
    "--jobs",
    "--profile",
    "--target",
    "--target-dir",
    "--manifest-path",
    "--color",
    "--config",
    "-Z",
];

impl Extra {
    /// `[cargo options] [TESTNAME] [-- binary args]`, as `cargo test` takes them.
    pub fn parse(args: &[String]) -> Extra {
        let mut extra = Extra::default();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "--" {
                extra.binary.extend(it.by_ref().cloned());
                break;
            }
            if a.starts_with('-') {
                extra.cargo.push(a.clone());
                if CARGO_VALUE_OPTS.contains(&a.as_str())
                    && let Some(v) = it.next()
                {
                    extra.cargo.push(v.clone());
                }
            } else {
                // cargo's positional TESTNAME: a filter handed to every binary.
                extra.binary.push(a.clone());
            }
        }
        extra
    }

    /// The cargo options for the lb-tests side and for the other crates' side: a
    /// `--test NAME` goes to the side whose package has `tests/NAME.rs` (None: that
    /// side has nothing selected and is skipped).
    pub fn sides(&self, root: &Path) -> (Option<Vec<String>>, Option<Vec<String>>) {
        let mut named = Vec::new();
        let mut rest = Vec::new();
        let mut it = self.cargo.iter();
        while let Some(a) = it.next() {
            if a == "--test" {
                if let Some(v) = it.next() {
                    named.push(v.clone());
                }
            } else {
                rest.push(a.clone());
            }
        }
        if named.is_empty() {
            return (Some(self.cargo.clone()), Some(self.cargo.clone()));
        }
        let side = |here: bool| {
            let picked: Vec<&String> = named
                .iter()
                .filter(|n| root.join("tests/tests").join(format!("{n}.rs")).exists() == here)
                .collect();
            (!picked.is_empty()).then(|| {
                let mut v = rest.clone();
                for n in picked {
                    v.extend(["--test".to_owned(), n.clone()]);
                }
                v
            })
        };
        (side(true), side(false))
    }

    /// `cargo test` arguments for a run that also selects `extra.binary`.
    pub fn cargo_test_args(&self, cargo: &[String]) -> Vec<String> {
        let mut v = cargo.to_vec();
        if !self.binary.is_empty() {
            v.push("--".into());
            v.extend(self.binary.iter().cloned());
        }
        v
    }
}

/// One test executable cargo built.
#[derive(Clone, Debug)]
pub struct TestBin {
    /// `tests/NAME.rs` target name, or `lb-tests(lib)` / `lb-tests(bin NAME)`.
    pub name: String,
    pub exe: PathBuf,
}

/// Builds lb-tests' test executables (`cargo test --no-run`) and lists them.
pub fn build(cargo: &Path, channel: &str, args: &[String]) -> anyhow::Result<Vec<TestBin>> {
    let mut cmd = Command::new(cargo);
    cmd.arg(format!("+{channel}"))
        .args([
            "test",
            "-p",
            "lb-tests",
            "--no-run",
            "--message-format=json",
        ])
        .args(args)
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .stdout(Stdio::piped());
    let shown = format!("{cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("running {shown}"))?;
    let stdout = child.stdout.take().expect("piped");
    let mut bins = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(bin) = test_bin(&line)? {
            bins.push(bin);
        }
    }
    let st = child.wait()?;
    if !st.success() {
        bail!("{shown} failed: {st}");
    }
    bins.sort_by(|a, b| a.name.cmp(&b.name));
    bins.dedup_by(|a, b| a.name == b.name);
    Ok(bins)
}

/// The test executable a `compiler-artifact` message of lb-tests names, if any.
fn test_bin(line: &str) -> anyhow::Result<Option<TestBin>> {
    if !line.starts_with('{') {
        return Ok(None);
    }
    let msg: serde_json::Value = serde_json::from_str(line).context("cargo's JSON message")?;
    if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
        return Ok(None);
    }
    let Some(exe) = msg["executable"].as_str() else {
        return Ok(None);
    };
    let target = &msg["target"];
    let name = target["name"].as_str().unwrap_or_default();
    let kind = target["kind"][0].as_str().unwrap_or_default();
    let name = match kind {
        "test" => name.to_owned(),
        "lib" => "lb-tests(lib)".to_owned(),
        _ => format!("lb-tests({kind} {name})"),
    };
    Ok(Some(TestBin {
        name,
        exe: PathBuf::from(exe),
    }))
}

/// A job: a test binary, or the unit tests of the other crates as one `cargo test`.
struct Job {
    name: String,
    class: Class,
    cmd: Command,
}

/// How one job ended.
struct Outcome {
    name: String,
    class: Class,
    wall: Duration,
    ok: bool,
    /// `test result:` lines, summed up for the table.
    summary: String,
}

/// What the runner needs besides the binaries.
pub struct Plan<'a> {
    pub root: &'a Path,
    /// The other crates' tests, run as one job in the light lane (already built).
    pub unit: Option<Command>,
    pub bins: Vec<TestBin>,
    pub extra: &'a Extra,
}

/// Runs every job in its lane; prints each job's output whole as it ends and a table
/// at the end. Fails if any job failed (all run regardless).
pub fn run(plan: Plan<'_>) -> anyhow::Result<()> {
    let logs = plan.root.join("target/xtask-test");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    for listed in test_classes::listed() {
        if plan.extra.cargo.is_empty() && !plan.bins.iter().any(|b| b.name == listed) {
            println!("xtask test: note: {listed} is classified but was not built");
        }
    }

    let mut timed = VecDeque::new();
    let mut light = VecDeque::new();
    if let Some(unit) = plan.unit {
        light.push_back(Job {
            name: "unit tests (workspace but lb-tests)".into(),
            class: Class::Light,
            cmd: unit,
        });
    }
    for bin in &plan.bins {
        let class = test_classes::class_of(&bin.name);
        let mut cmd = Command::new(&bin.exe);
        // As `cargo test` runs them: from the package's directory, one test at a time.
        cmd.current_dir(plan.root.join("tests"))
            .env("CARGO_MANIFEST_DIR", plan.root.join("tests"))
            .env("CARGO_PKG_NAME", "lb-tests")
            .args(&plan.extra.binary)
            .arg("--test-threads=1");
        let job = Job {
            name: bin.name.clone(),
            class,
            cmd,
        };
        match class {
            Class::Light => light.push_back(job),
            // Alone jobs go through the timed lane, which keeps the light lane out.
            Class::Timed | Class::Alone => timed.push_back(job),
        }
    }
    println!(
        "xtask test: {} timed/alone binaries one at a time, {} light jobs beside them; \
         output of each printed when it ends (logs in {})",
        timed.len(),
        light.len(),
        logs.display()
    );

    let started = Instant::now();
    let gate = Arc::new(Gate::default());
    let print = Arc::new(Mutex::new(()));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let lanes = [timed, light].map(|queue| {
        let (gate, print, outcomes, logs) =
            (gate.clone(), print.clone(), outcomes.clone(), logs.clone());
        thread::spawn(move || {
            for job in queue {
                let outcome = {
                    // Light jobs share the machine; an alone job waits for the running
                    // light job and keeps the next one out until it ends.
                    let _pass = gate.enter(job.class);
                    run_job(job, &logs, &print)
                };
                outcomes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(outcome);
            }
        })
    });
    for lane in lanes {
        lane.join().expect("a lane panicked");
    }
    let total = started.elapsed();
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap_or_else(|e| e.into_inner()));
    table(&outcomes, total);
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok)
        .map(|o| o.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("{} test job(s) failed: {}", failed.len(), failed.join(", "));
    }
    Ok(())
}

/// Who is running beside whom: any number of light jobs, or one alone job. A waiting
/// alone job keeps new light jobs out (it does not wait for the light lane to empty).
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    light: usize,
    alone_waiting: bool,
    alone: bool,
}

/// A job's place through the [`Gate`], given back on drop.
struct Pass<'a> {
    gate: &'a Gate,
    class: Class,
}

impl Gate {
    fn enter(&self, class: Class) -> Pass<'_> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match class {
            Class::Light => {
                while st.alone_waiting || st.alone {
                    st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                st.light += 1;
            }
            Class::Alone => {
                st.alone_waiting = true;
                while st.light > 0 || st.alone {
                    st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                st.alone_waiting = false;
                st.alone = true;
            }
            Class::Timed => {}
        }
        Pass { gate: self, class }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut st = self.gate.state.lock().unwrap_or_else(|e| e.into_inner());
        match self.class {
            Class::Light => st.light -= 1,
            Class::Alone => st.alone = false,
            Class::Timed => {}
        }
        self.gate.changed.notify_all();
    }
}

/// Runs one job with its output in `logs/NAME.log`, then prints that log whole.
fn run_job(mut job: Job, logs: &Path, print: &Mutex<()>) -> Outcome {
    let log_path = logs.join(format!("{}.log", file_name(&job.name)));
    let started = Instant::now();
    let result = (|| -> anyhow::Result<bool> {
        let log = File::create(&log_path)?;
        let st = job
            .cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .status()
            .with_context(|| format!("running {:?}", job.cmd))?;
        Ok(st.success())
    })();
    let wall = started.elapsed();
    let mut text = String::new();
    if let Ok(mut f) = File::open(&log_path) {
        let mut raw = Vec::new();
        let _ = f.read_to_end(&mut raw);
        text = String::from_utf8_lossy(&raw).into_owned();
    }
    let (ok, note) = match result {
        Ok(ok) => (ok, String::new()),
        Err(e) => (false, format!("xtask test: {e:#}\n")),
    };
    let summary = summarize(&text);
    let _guard = print.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n===== {} [{}] {} in {:.1} s =====",
        job.name,
        job.class.as_str(),
        if ok { "ok" } else { "FAILED" },
        wall.as_secs_f64()
    );
    let _ = out.write_all(text.as_bytes());
    let _ = out.write_all(note.as_bytes());
    let _ = out.flush();
    Outcome {
        name: job.name,
        class: job.class,
        wall,
        ok,
        summary,
    }
}

/// `passed/failed/ignored` summed over the `test result:` lines of `text`.
fn summarize(text: &str) -> String {
    let (mut passed, mut failed, mut ignored) = (0u64, 0u64, 0u64);
    let mut seen = false;
    for line in text.lines().filter(|l| l.starts_with("test result:")) {
        seen = true;
        let num = |word: &str| -> u64 {
            line.split(';')
                .find(|part| part.trim_end().ends_with(word))
                .and_then(|part| part.split_whitespace().rev().nth(1))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        passed += num("passed");
        failed += num("failed");
        ignored += num("ignored");
    }
    if seen {
        format!("{passed} passed, {failed} failed, {ignored} ignored")
    } else {
        "no test result".into()
    }
}

fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The closing table: every job by wall time, its lane, its result; then the total.
fn table(outcomes: &[Outcome], total: Duration) {
    let mut sorted: Vec<&Outcome> = outcomes.iter().collect();
    sorted.sort_by_key(|o| std::cmp::Reverse(o.wall));
    let width = sorted
        .iter()
        .map(|o| o.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("\n===== xtask test: {} jobs =====", sorted.len());
    println!("{:<width$}  {:>8}  {:<5}  result", "job", "wall s", "lane");
    for o in &sorted {
        println!(
            "{:<width$}  {:>8.1}  {:<5}  {} ({})",
            o.name,
            o.wall.as_secs_f64(),
            o.class.as_str(),
            if o.ok { "ok" } else { "FAILED" },
            o.summary
        );
    }
    let summed: f64 = sorted.iter().map(|o| o.wall.as_secs_f64()).sum();
    let failed = sorted.iter().filter(|o| !o.ok).count();
    println!(
        "total: {:.1} s wall for the tests ({summed:.1} s summed over jobs), {} ok, {failed} failed",
        total.as_secs_f64(),
        sorted.len() - failed
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn extra_args_split_as_cargo_test_reads_them() {
        assert_eq!(
            Extra::parse(&s(&["--test", "netns_udp", "udp_nat", "--", "--nocapture"])),
            Extra {
                cargo: s(&["--test", "netns_udp"]),
                binary: s(&["udp_nat", "--nocapture"]),
            }
        );
        assert_eq!(
            Extra::parse(&s(&["--", "dsr_ipv6", "--exact"])),
            Extra {
                cargo: vec![],
                binary: s(&["dsr_ipv6", "--exact"]),
            }
        );
        let e = Extra::parse(&s(&["--release", "nat"]));
        assert_eq!(e.cargo_test_args(&e.cargo), s(&["--release", "--", "nat"]));
    }

    #[test]
    fn a_named_test_goes_to_the_package_that_has_it() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let e = Extra::parse(&s(&["--test", "netns_udp", "--test", "docs_examples"]));
        assert_eq!(
            e.sides(root),
            (
                Some(s(&["--test", "netns_udp"])),
                Some(s(&["--test", "docs_examples"]))
            )
        );
        let e = Extra::parse(&s(&["--test", "bpf_fuzz"]));
        assert_eq!(e.sides(root), (Some(s(&["--test", "bpf_fuzz"])), None));
    }

    #[test]
    fn results_are_summed_over_test_result_lines() {
        let text = "test a ... ok\ntest result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.0s\n\
                    test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n";
        assert_eq!(summarize(text), "4 passed, 2 failed, 1 ignored");
        assert_eq!(summarize("boom"), "no test result");
    }

    #[test]
    fn a_waiting_alone_job_keeps_the_next_light_job_out() {
        let gate = Arc::new(Gate::default());
        let light = gate.enter(Class::Light);
        let (g, order) = (gate.clone(), Arc::new(Mutex::new(Vec::new())));
        let o = order.clone();
        let alone = thread::spawn(move || {
            let _p = g.enter(Class::Alone);
            o.lock().unwrap().push("alone");
            thread::sleep(Duration::from_millis(50));
        });
        // Let the alone job start waiting, then release the light job and ask again.
        while !gate.state.lock().unwrap().alone_waiting {
            thread::sleep(Duration::from_millis(1));
        }
        drop(light);
        let _next = gate.enter(Class::Light);
        order.lock().unwrap().push("light");
        alone.join().unwrap();
        assert_eq!(*order.lock().unwrap(), ["alone", "light"]);
    }

    #[test]
    fn unknown_binaries_are_timed() {
        assert_eq!(test_classes::class_of("netns_new_thing"), Class::Timed);
        assert_eq!(test_classes::class_of("bpf_fixtures"), Class::Light);
        assert_eq!(test_classes::class_of("lb-tests(lib)"), Class::Light);
        assert_eq!(
            test_classes::class_of("netns_health_starved_agent"),
            Class::Alone
        );
    }
}
