//! The root half of `cargo xtask test`: lb-tests' binaries, built once, run as separate
//! processes (a waiting binary's tests each as its own), up to four at a time as their
//! classes allow ([`crate::test_classes`]), and beside them, at idle CPU priority, the
//! builds some of them need. Each job's output is captured and printed whole when it
//! ends; a table of every job's wall time, CPU time and result closes the run, and the
//! next run starts the longest jobs of this one first.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};

use crate::{
    test_classes::{self, Class},
    test_schedule::{self, Board, Lane, Scheduled, WAITING_AT_ONCE, WORKERS},
};

/// The extra arguments of `cargo xtask test`, split as `cargo test` reads them:
/// options for cargo, and the arguments every test binary gets (a name filter,
/// `--exact`, `--nocapture`…).
#[derive(Debug, Default, PartialEq)]
pub struct Extra {
    pub cargo: Vec<String>,
    pub binary: Vec<String>,
}

/// The `cargo` arguments of the soak that `cargo xtask bench` runs for the suite: the
/// dsr half of `netns_traffic_ordinary`, which the suite runs for 20 s, for the whole
/// [`BENCH_SOAK_ENV`] seconds.
pub const BENCH_SOAK: [&str; 10] = [
    "test",
    "--release",
    "-p",
    "lb-tests",
    "--test",
    test_classes::INTEGRATION,
    "--",
    "--exact",
    "netns_traffic_ordinary::ordinary_traffic_moves_no_health_dsr",
    "--test-threads=1",
];

/// The length of [`BENCH_SOAK`], as the test reads it.
pub const BENCH_SOAK_ENV: (&str, &str) = ("LB_DSR_SOAK_SECS", "60");

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

    /// Rewrites each `--test NAME` that names a module of the integration binary
    /// (`tests/tests/integration/NAME.rs`) as `--test integration` with the filter
    /// `NAME::` for the binary, so a module is selected as a binary of its own was.
    pub fn resolve_modules(mut self, root: &Path) -> Extra {
        let mut cargo = Vec::new();
        let mut it = self.cargo.iter();
        let mut integration = false;
        while let Some(a) = it.next() {
            if a == "--test"
                && let Some(name) = it.next()
            {
                if is_integration_module(root, name) {
                    integration = true;
                    self.binary.push(format!("{name}::"));
                } else {
                    cargo.extend([a.clone(), name.clone()]);
                }
            } else {
                cargo.push(a.clone());
            }
        }
        if integration {
            cargo.extend(["--test".to_owned(), test_classes::INTEGRATION.to_owned()]);
        }
        self.cargo = cargo;
        self
    }

    /// The cargo options for the lb-tests side and for the other crates' side: a
    /// `--test NAME` goes to lb-tests when it has `tests/NAME.rs` or `tests/NAME/main.rs`,
    /// else to the other crates, whose test binaries may also be directories
    /// (`lb-agent/tests/NAME/main.rs`) (None: that side has nothing selected and is
    /// skipped).
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
                .filter(|n| {
                    let dir = root.join("tests/tests");
                    let ours = dir.join(format!("{n}.rs")).exists()
                        || dir.join(n).join("main.rs").exists();
                    ours == here
                })
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

/// One test executable cargo built, or one module of the integration binary.
#[derive(Clone, Debug)]
pub struct TestBin {
    /// `tests/NAME.rs` target name, `lb-tests(lib)` / `lb-tests(bin NAME)`, or the name of
    /// a module of the integration binary.
    pub name: String,
    pub exe: PathBuf,
    /// A module's tests (full paths, `module::test`); `None`: every test of `exe`.
    pub tests: Option<Vec<String>>,
}

/// Whether `name` is a module of the integration binary.
fn is_integration_module(root: &Path, name: &str) -> bool {
    root.join("tests/tests")
        .join(test_classes::INTEGRATION)
        .join(format!("{name}.rs"))
        .exists()
}

/// Splits the integration binary into its modules (each scheduled as a binary); other
/// binaries stay as they are. A module's ignored tests are named and left out.
pub fn split_modules(bins: Vec<TestBin>, dir: &Path) -> anyhow::Result<Vec<TestBin>> {
    let mut out = Vec::new();
    for bin in bins {
        if bin.name != test_classes::INTEGRATION {
            out.push(bin);
            continue;
        }
        let (tests, ignored) = tests_of(&bin.exe, dir)?;
        if !ignored.is_empty() {
            println!("xtask test: ignored, not run: {}", ignored.join(", "));
        }
        let mut modules: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for test in tests {
            let module = test.split("::").next().unwrap_or_default().to_owned();
            modules.entry(module).or_default().push(test);
        }
        out.extend(modules.into_iter().map(|(name, tests)| TestBin {
            name,
            exe: bin.exe.clone(),
            tests: Some(tests),
        }));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
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
        tests: None,
    }))
}

/// A job: a test binary, one test of a binary that runs test by test, or the unit tests
/// of the other crates as one `cargo test`.
struct Job {
    name: String,
    lane: Lane,
    cmd: Command,
}

impl Scheduled for Job {
    fn lane(&self) -> &Lane {
        &self.lane
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// How one job ended.
struct Outcome {
    name: String,
    class: Class,
    wall: Duration,
    /// CPU time of the job and the processes it waited for (agents, servers, clients).
    cpu: Option<Duration>,
    ok: bool,
    /// `test result:` lines, summed up for the table.
    summary: String,
}

/// What the runner needs besides the binaries.
pub struct Plan<'a> {
    pub root: &'a Path,
    /// The other crates' tests, run as one light job (already built).
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

    let mut queue = Vec::new();
    if let Some(unit) = plan.unit {
        queue.push(Job {
            name: UNIT_JOB.into(),
            lane: Lane::new(Class::Light, UNIT_JOB),
            cmd: unit,
        });
    }
    for bin in &plan.bins {
        let class = test_classes::class_of(&bin.name);
        // As `cargo test` runs them: from the package's directory, one test at a time.
        let command = |args: &[String]| {
            let mut cmd = Command::new(&bin.exe);
            cmd.current_dir(plan.root.join("tests"))
                .env("CARGO_MANIFEST_DIR", plan.root.join("tests"))
                .env("CARGO_PKG_NAME", "lb-tests")
                .args(args)
                .arg("--test-threads=1");
            cmd
        };
        let lane = Lane {
            class,
            binary: bin.name.clone(),
            after: test_classes::build_for(&bin.name).map(|b| b.name.to_owned()),
        };
        // A module of the integration binary: its tests by exact name, those a filter from
        // the command line selects (as cargo would select them).
        if let Some(all) = &bin.tests {
            let (tests, flags) = select(all, &plan.extra.binary);
            if tests.is_empty() {
                continue;
            }
            if test_classes::runs_test_by_test(&bin.name) {
                for test in tests {
                    let mut args = flags.clone();
                    args.extend(["--exact".to_owned(), test.clone()]);
                    queue.push(Job {
                        name: test,
                        lane: lane.clone(),
                        cmd: command(&args),
                    });
                }
            } else {
                let mut args = flags;
                args.push("--exact".to_owned());
                args.extend(tests);
                queue.push(Job {
                    name: bin.name.clone(),
                    lane,
                    cmd: command(&args),
                });
            }
            continue;
        }
        // A name filter from the command line goes to the whole binary, as cargo would.
        if test_classes::runs_test_by_test(&bin.name) && plan.extra.binary.is_empty() {
            let (tests, ignored) = tests_of(&bin.exe, &plan.root.join("tests"))?;
            if !ignored.is_empty() {
                println!(
                    "xtask test: {}: ignored, not run: {}",
                    bin.name,
                    ignored.join(", ")
                );
            }
            for test in tests {
                queue.push(Job {
                    name: format!("{}::{test}", bin.name),
                    lane: lane.clone(),
                    cmd: command(&["--exact".into(), test]),
                });
            }
        } else {
            queue.push(Job {
                name: bin.name.clone(),
                lane,
                cmd: command(&plan.extra.binary),
            });
        }
    }
    let whole_run = plan.extra.cargo.is_empty() && plan.extra.binary.is_empty();
    queue.extend(builds(plan.root, &queue, whole_run));
    let kept = plan.root.join(test_schedule::KEPT_WALLS);
    test_schedule::order(&mut queue, &test_schedule::last_walls(&logs, &kept));
    let count = |c: Class| queue.iter().filter(|j| j.lane.class == c).count();
    println!(
        "xtask test: {} alone, {} timed (one at a time), {} waiting ({WAITING_AT_ONCE} at a \
         time), {} light (one at a time beside them), {} builds (at idle CPU priority beside \
         the tests); output of each printed when it ends (logs in {})",
        count(Class::Alone),
        count(Class::Timed),
        count(Class::Waiting),
        count(Class::Light),
        count(Class::Build),
        logs.display()
    );

    let started = Instant::now();
    let board = Arc::new(Board::new(queue));
    let print = Arc::new(Mutex::new(()));
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (board, print, outcomes, logs) =
                (board.clone(), print.clone(), outcomes.clone(), logs.clone());
            thread::spawn(move || {
                while let Some(job) = board.take() {
                    let lane = job.lane.clone();
                    let outcome = run_job(job, &logs, &print);
                    board.done(&lane);
                    outcomes
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(outcome);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("a worker panicked");
    }
    let total = started.elapsed();
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap_or_else(|e| e.into_inner()));
    table(&outcomes, total);
    if plan.extra.binary.is_empty() {
        test_schedule::keep_walls(&logs, outcomes.iter().map(|o| (o.name.as_str(), o.wall)));
    }
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

/// The jobs of the [`test_classes::BUILDS`] that `queue`'s jobs wait for, and in a whole
/// run the checks no job needs. Each is its `cargo xtask` command, run from `root` as a
/// user runs it (the workspace build before the tests may have replaced this very
/// binary) under `chrt --idle 0` (`SCHED_IDLE`, inherited by every process it starts:
/// the compilers get only the CPU time the tests leave).
fn builds(root: &Path, queue: &[Job], whole_run: bool) -> Vec<Job> {
    test_classes::BUILDS
        .iter()
        .filter(|b| {
            let waited_for = queue
                .iter()
                .any(|j| j.lane.after.as_deref() == Some(b.name));
            waited_for || (b.needed_by.is_empty() && whole_run)
        })
        .map(|b| {
            let mut cmd = Command::new("chrt");
            cmd.args(["--idle", "0", "cargo", "xtask", b.command])
                .current_dir(root)
                .env_remove("RUSTUP_TOOLCHAIN")
                .env_remove("CARGO")
                .env_remove("RUSTC");
            Job {
                name: b.name.to_owned(),
                lane: Lane::new(Class::Build, b.name),
                cmd,
            }
        })
        .collect()
}

/// The tests of `all` that the command line's binary arguments select (every test when
/// they name none; with `--exact`, equal to a name, else containing one), and the
/// arguments to pass on (the options, without `--exact`, which the job adds itself).
fn select(all: &[String], binary_args: &[String]) -> (Vec<String>, Vec<String>) {
    let exact = binary_args.iter().any(|a| a == "--exact");
    let filters: Vec<&String> = binary_args.iter().filter(|a| !a.starts_with('-')).collect();
    let flags = binary_args
        .iter()
        .filter(|a| a.starts_with('-') && *a != "--exact")
        .cloned()
        .collect();
    let tests = all
        .iter()
        .filter(|t| {
            filters.is_empty()
                || filters.iter().any(|f| {
                    if exact {
                        t == f
                    } else {
                        t.contains(f.as_str())
                    }
                })
        })
        .cloned()
        .collect();
    (tests, flags)
}

/// The unit tests of the other crates, as one job.
const UNIT_JOB: &str = "unit tests (workspace but lb-tests)";

/// The tests a binary holds (`--list`), and apart those it marks ignored.
fn tests_of(exe: &Path, dir: &Path) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let list = |ignored: bool| -> anyhow::Result<Vec<String>> {
        let mut cmd = Command::new(exe);
        cmd.current_dir(dir).args(["--list", "--format", "terse"]);
        if ignored {
            cmd.arg("--ignored");
        }
        let out = cmd
            .output()
            .with_context(|| format!("listing the tests of {}", exe.display()))?;
        if !out.status.success() {
            bail!("{} --list failed: {}", exe.display(), out.status);
        }
        Ok(parse_list(&String::from_utf8_lossy(&out.stdout)))
    };
    let ignored = list(true)?;
    let tests = list(false)?
        .into_iter()
        .filter(|t| !ignored.contains(t))
        .collect();
    Ok((tests, ignored))
}

/// The test names of a `--list --format terse` output (`NAME: test` lines).
fn parse_list(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// Runs one job with its output in `logs/NAME.log`, then prints that log whole.
fn run_job(mut job: Job, logs: &Path, print: &Mutex<()>) -> Outcome {
    let log_path = logs.join(format!("{}.log", file_name(&job.name)));
    let started = Instant::now();
    let mut cpu = None;
    let result = (|| -> anyhow::Result<bool> {
        let log = File::create(&log_path)?;
        let child = job
            .cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("running {:?}", job.cmd))?;
        let (st, used) = reap(child)?;
        cpu = used;
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
    let summary = if job.lane.class == Class::Build {
        "a build, not a test".to_owned()
    } else {
        summarize(&text)
    };
    let _guard = print.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n===== {} [{}] {} in {:.1} s ({} CPU) =====",
        job.name,
        job.lane.class.as_str(),
        if ok { "ok" } else { "FAILED" },
        wall.as_secs_f64(),
        cpu_text(cpu)
    );
    let _ = out.write_all(text.as_bytes());
    let _ = out.write_all(note.as_bytes());
    let _ = out.flush();
    Outcome {
        name: job.name,
        class: job.lane.class,
        wall,
        cpu,
        ok,
        summary,
    }
}

/// Serializes reaping, so that the change in this process's children's CPU time
/// across one reap is that child's.
static REAPING: Mutex<()> = Mutex::new(());

/// Waits for `child`; returns its status and the CPU time (user and system) that it and
/// the processes it waited for used, read from `/proc/self/stat` around the reap
/// (None where that file cannot be read).
fn reap(
    mut child: std::process::Child,
) -> anyhow::Result<(std::process::ExitStatus, Option<Duration>)> {
    loop {
        {
            let _one = REAPING.lock().unwrap_or_else(|e| e.into_inner());
            let before = children_cpu();
            if let Some(st) = child.try_wait()? {
                let used = before.zip(children_cpu()).map(|(b, a)| a.saturating_sub(b));
                return Ok((st, used));
            }
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// The CPU time of this process's waited-for children (`cutime + cstime`).
fn children_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse_children_cpu(&stat, 100)
}

/// `cutime + cstime` (fields 16 and 17) of a `/proc/PID/stat` line, in ticks of
/// `1/hz` s. The command name (field 2) may hold spaces and parentheses: fields are
/// counted after its closing parenthesis.
fn parse_children_cpu(stat: &str, hz: u64) -> Option<Duration> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state).
    let ticks = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let t = ticks(16)? + ticks(17)?;
    Some(Duration::from_millis(t * 1000 / hz))
}

fn cpu_text(cpu: Option<Duration>) -> String {
    cpu.map_or_else(|| "? s".into(), |c| format!("{:.1} s", c.as_secs_f64()))
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
    println!(
        "{:<width$}  {:>8}  {:>7}  {:<5}  result",
        "job", "wall s", "CPU s", "lane"
    );
    for o in &sorted {
        println!(
            "{:<width$}  {:>8.1}  {:>7}  {:<5}  {} ({})",
            o.name,
            o.wall.as_secs_f64(),
            o.cpu
                .map_or_else(|| "?".into(), |c| format!("{:.1}", c.as_secs_f64())),
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
        let e = Extra::parse(&s(&["--test", "integration", "--test", "docs"]));
        assert_eq!(
            e.sides(root),
            (
                Some(s(&["--test", "integration"])),
                Some(s(&["--test", "docs"]))
            )
        );
        let e = Extra::parse(&s(&["--test", "bpf_fixtures"]));
        assert_eq!(e.sides(root), (Some(s(&["--test", "bpf_fixtures"])), None));
    }

    #[test]
    fn a_module_of_the_integration_binary_is_selected_as_a_binary() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let e = Extra::parse(&s(&[
            "--test",
            "netns_udp",
            "--test",
            "docs",
            "--",
            "--nocapture",
        ]))
        .resolve_modules(root);
        assert_eq!(e.cargo, s(&["--test", "docs", "--test", "integration"]));
        assert_eq!(e.binary, s(&["--nocapture", "netns_udp::"]));
    }

    #[test]
    fn a_filter_selects_a_modules_tests_as_libtest_would() {
        let all = s(&[
            "netns_udp::udp_nat",
            "netns_udp::udp_dsr",
            "netns_tunnel::ipip",
        ]);
        assert_eq!(select(&all, &[]), (all.clone(), vec![]));
        assert_eq!(
            select(&all, &s(&["udp_", "--nocapture"])),
            (
                s(&["netns_udp::udp_nat", "netns_udp::udp_dsr"]),
                s(&["--nocapture"])
            )
        );
        assert_eq!(
            select(&all, &s(&["--exact", "netns_udp::udp_nat"])),
            (s(&["netns_udp::udp_nat"]), vec![])
        );
    }

    #[test]
    fn results_are_summed_over_test_result_lines() {
        let text = "test a ... ok\ntest result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.0s\n\
                    test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s\n";
        assert_eq!(summarize(text), "4 passed, 2 failed, 1 ignored");
        assert_eq!(summarize("boom"), "no test result");
    }

    #[test]
    fn listed_tests_are_read_from_the_terse_format() {
        let text = "tests::a: test\nnat::b_c: test\n\nbench_x: benchmark\n";
        assert_eq!(parse_list(text), ["tests::a", "nat::b_c"]);
    }

    #[test]
    fn children_cpu_is_read_after_the_command_name() {
        let line = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 250 50 20 0 1 0 99";
        assert_eq!(parse_children_cpu(line, 100), Some(Duration::from_secs(3)));
        assert_eq!(parse_children_cpu("garbage", 100), None);
    }

    #[test]
    fn a_reaped_child_reports_the_cpu_it_used() {
        // A shell that spins for a moment: its CPU shows up in the reap.
        let child = Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .spawn()
            .unwrap();
        let (st, cpu) = reap(child).unwrap();
        assert!(st.success());
        assert!(cpu.expect("/proc/self/stat is readable") > Duration::ZERO);
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
        assert_eq!(test_classes::class_of("package_install"), Class::Timed);
    }
}
