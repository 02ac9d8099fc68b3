//! Child processes run inside a namespace (`ip netns exec`), with stdout and stderr
//! captured line by line, waits for a log line with a deadline, and kill on drop.

use std::{
    collections::VecDeque,
    ffi::OsStr,
    io::{BufRead, BufReader, Read},
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Condvar, Mutex, MutexGuard},
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::{net::netns::NetNs, util::error::Error};

/// Lines kept per process; older ones are dropped (the count of dropped lines is kept).
const MAX_LINES: usize = 20_000;
/// Longest line kept; the rest of a longer line is cut.
const MAX_LINE: usize = 4096;
/// Lines of a process's log shown in errors and when a test panics.
const TAIL: usize = 40;
/// How long a process gets to exit after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// A process started in a namespace; SIGTERM (then SIGKILL) on drop.
///
/// It holds a clone of its namespace, so the namespace outlives the process.
pub struct NsProcess {
    label: String,
    child: Child,
    log: Arc<Log>,
    readers: Vec<JoinHandle<()>>,
    exited: Option<ExitStatus>,
    _ns: NetNs,
}

impl NsProcess {
    /// Starts `program args…` inside `ns`. `label` names it in errors and logs.
    ///
    /// The child gets its own process group (a terminal's Ctrl-C reaches only the
    /// harness, which then stops children in order) and dies with the spawning thread
    /// (`PR_SET_PDEATHSIG`), so spawn from a thread that lives as long as the process.
    pub fn spawn<S: AsRef<OsStr>>(
        ns: &NetNs,
        label: &str,
        program: &Path,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Result<Self, Error> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns.name()])
            .arg(program)
            .args(args)
            .envs(env.iter().copied());
        Self::spawn_command(ns, label, cmd)
    }

    /// Starts `cmd`, which enters `ns` itself (e.g. through `nsenter --net=…`), with
    /// the same capture, process group and parent-death signal as [`NsProcess::spawn`].
    pub fn spawn_command(ns: &NetNs, label: &str, mut cmd: Command) -> Result<Self, Error> {
        let program = cmd.get_program().to_string_lossy().into_owned();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches nothing of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(Error::io(format!(
            "starting {label} (`{program}`) in network namespace {}",
            ns.name()
        )))?;
        let log = Arc::new(Log::default());
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(spawn_reader(label, "stdout", out, &log));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(spawn_reader(label, "stderr", err, &log));
        }
        Ok(NsProcess {
            label: label.to_owned(),
            child,
            log,
            readers,
            exited: None,
            _ns: ns.clone(),
        })
    }

    /// The label given at spawn.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The process id (`ip netns exec` execs the program, so this is the program itself).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (e.g. `libc::SIGHUP`).
    pub fn signal(&self, signal: i32) -> Result<(), Error> {
        let pid = self.pid();
        // SAFETY: plain kill(2) on our own child, which is not reaped while `self` lives.
        if unsafe { libc::kill(pid as libc::pid_t, signal) } != 0 {
            return Err(Error::Io {
                what: format!("sending signal {signal} to {} (pid {pid})", self.label),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// Position just past the last line captured so far; pass it to
    /// [`wait_for_line`](Self::wait_for_line) to wait only for lines printed after now.
    pub fn cursor(&self) -> usize {
        self.log.lock().end()
    }

    /// Waits until a line at or after `since` contains one of `needles`; returns the
    /// index of the needle and the line. Fails when `timeout` passes, when the process
    /// closes its output, or on Ctrl-C (see [`crate::util::interrupt`]).
    pub fn wait_for_any(
        &self,
        since: usize,
        needles: &[&str],
        timeout: Duration,
    ) -> Result<(usize, String), Error> {
        let start = Instant::now();
        let wanted = || {
            needles
                .iter()
                .map(|n| format!("{n:?}"))
                .collect::<Vec<_>>()
                .join(" or ")
        };
        let mut state = self.log.lock();
        loop {
            if let Some(found) = state.find(since, needles) {
                return Ok(found);
            }
            if state.closed_streams >= 2 {
                let tail = state.tail(TAIL);
                drop(state);
                return Err(Error::Unexpected(format!(
                    "{} closed its output ({}) before printing a line containing {}; \
                     last lines:\n{tail}",
                    self.label,
                    peek_exit(self.pid(), Duration::from_millis(500)),
                    wanted(),
                )));
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(Error::Timeout {
                    what: format!("{} to print a line containing {}", self.label, wanted()),
                    waited,
                    last: state.tail(TAIL),
                });
            }
            if crate::util::interrupt::requested() {
                return Err(Error::Interrupted {
                    what: self.label.clone(),
                });
            }
            let step = (timeout - waited).min(Duration::from_millis(100));
            state = self.log.wait(state, step);
        }
    }

    /// Waits until a line at or after `since` contains `needle`, and returns it.
    pub fn wait_for_line(
        &self,
        since: usize,
        needle: &str,
        timeout: Duration,
    ) -> Result<String, Error> {
        self.wait_for_any(since, &[needle], timeout)
            .map(|(_, line)| line)
    }

    /// The last `n` captured lines, one per line.
    pub fn tail(&self, n: usize) -> String {
        self.log.lock().tail(n)
    }

    /// All captured lines still kept.
    pub fn lines(&self) -> Vec<String> {
        self.log.lock().lines.iter().cloned().collect()
    }

    /// The exit status if the process has exited (reaps it).
    pub fn try_status(&mut self) -> Result<Option<ExitStatus>, Error> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().map_err(|source| Error::Io {
                what: format!("waiting for {}", self.label),
                source,
            })?;
        }
        Ok(self.exited)
    }

    /// Sends SIGTERM, waits up to `grace`, then SIGKILLs; returns how the process ended.
    pub fn stop(mut self, grace: Duration) -> Result<ExitStatus, Error> {
        self.terminate(grace)
    }

    fn terminate(&mut self, grace: Duration) -> Result<ExitStatus, Error> {
        self.end_with(libc::SIGTERM, grace)
    }

    /// Sends `signal`, waits up to `grace` for the process to end, then SIGKILLs; returns
    /// how it ended. The output read so far stays readable.
    pub fn end_with(&mut self, signal: i32, grace: Duration) -> Result<ExitStatus, Error> {
        if let Some(status) = self.try_status()? {
            return Ok(status);
        }
        let _ = self.signal(signal);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.try_status()? {
                return Ok(status);
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let status = self
            .child
            .wait()
            .map_err(Error::io(format!("waiting for {}", self.label)))?;
        self.exited = Some(status);
        Ok(status)
    }
}

impl Drop for NsProcess {
    fn drop(&mut self) {
        let status = self.terminate(STOP_GRACE);
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        if thread::panicking() {
            eprintln!(
                "---- {} (pid {}, {:?}) last lines ----\n{}",
                self.label,
                self.child.id(),
                status.as_ref().map_err(|e| e.to_string()),
                self.log.lock().tail(TAIL)
            );
        }
    }
}

/// How process `pid` ended, without reaping it (`waitid` with `WNOWAIT`), waiting up to
/// `patience` for it to end: "exit code N", "killed by signal N (NAME)" or "still running".
fn peek_exit(pid: u32, patience: Duration) -> String {
    let deadline = Instant::now() + patience;
    loop {
        // SAFETY: a zeroed siginfo_t is valid output space; WNOWAIT leaves the child
        // waitable for `Child::wait`.
        let (rc, info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let rc = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            );
            (rc, info)
        };
        // SAFETY: si_pid/si_status are valid for a SIGCHLD-style siginfo from waitid.
        let (child, status) = unsafe { (info.si_pid(), info.si_status()) };
        if rc == 0 && child != 0 {
            return match info.si_code {
                libc::CLD_EXITED => format!("exit code {status}"),
                _ => format!("killed by signal {status} ({})", signal_name(status)),
            };
        }
        if rc != 0 || Instant::now() >= deadline {
            return "still running or already reaped".to_owned();
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGPIPE => "SIGPIPE",
        _ => "?",
    }
}

fn spawn_reader<R: Read + Send + 'static>(
    label: &str,
    stream: &'static str,
    pipe: R,
    log: &Arc<Log>,
) -> JoinHandle<()> {
    let log = Arc::clone(log);
    let echo = std::env::var_os("LB_TEST_VERBOSE").is_some();
    let label = label.to_owned();
    thread::Builder::new()
        .name(format!("log-{label}-{stream}"))
        .spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = clean_line(&buf);
                        if echo {
                            eprintln!("[{label}] {line}");
                        }
                        log.push(line);
                    }
                }
            }
            log.close_stream();
        })
        .expect("spawning a log reader thread")
}

/// Strips the newline and ANSI colour sequences, and cuts the line at [`MAX_LINE`].
fn clean_line(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len().min(MAX_LINE));
    let mut chars = text.trim_end_matches(['\n', '\r']).chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC '[' parameters… final byte in '@'..='~'.
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        if out.len() + c.len_utf8() > MAX_LINE {
            break;
        }
        out.push(c);
    }
    out
}

/// Captured lines of one process, shared with its reader threads.
#[derive(Default)]
struct Log {
    state: Mutex<LogState>,
    changed: Condvar,
}

#[derive(Default)]
struct LogState {
    lines: VecDeque<String>,
    /// Lines dropped from the front to stay under [`MAX_LINES`]; absolute index of `lines[0]`.
    dropped: usize,
    /// stdout and stderr each count once when they reach end of file.
    closed_streams: u8,
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(
        &self,
        guard: MutexGuard<'a, LogState>,
        timeout: Duration,
    ) -> MutexGuard<'a, LogState> {
        match self.changed.wait_timeout(guard, timeout) {
            Ok((guard, _)) => guard,
            Err(poisoned) => poisoned.into_inner().0,
        }
    }

    fn push(&self, line: String) {
        let mut state = self.lock();
        if state.lines.len() == MAX_LINES {
            state.lines.pop_front();
            state.dropped += 1;
        }
        state.lines.push_back(line);
        drop(state);
        self.changed.notify_all();
    }

    fn close_stream(&self) {
        self.lock().closed_streams += 1;
        self.changed.notify_all();
    }
}

impl LogState {
    fn end(&self) -> usize {
        self.dropped + self.lines.len()
    }

    fn find(&self, since: usize, needles: &[&str]) -> Option<(usize, String)> {
        let skip = since.saturating_sub(self.dropped);
        self.lines.iter().skip(skip).find_map(|line| {
            needles
                .iter()
                .position(|n| line.contains(n))
                .map(|i| (i, line.clone()))
        })
    }

    fn tail(&self, n: usize) -> String {
        let skip = self.lines.len().saturating_sub(n);
        let mut out = String::new();
        for line in self.lines.iter().skip(skip) {
            out.push_str("    ");
            out.push_str(line);
            out.push('\n');
        }
        if out.is_empty() {
            out.push_str("    (no output)\n");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_line_strips_colour_and_newline() {
        assert_eq!(
            clean_line(b"\x1b[2m2024\x1b[0m \x1b[32m INFO\x1b[0m lb-agent ready\n"),
            "2024  INFO lb-agent ready"
        );
        assert_eq!(clean_line(&[b'a'; 5000]).len(), MAX_LINE);
    }

    #[test]
    fn find_respects_the_cursor_and_dropped_lines() {
        let mut state = LogState::default();
        for i in 0..5 {
            state.lines.push_back(format!("line {i}"));
        }
        state.dropped = 10;
        assert_eq!(state.end(), 15);
        assert_eq!(state.find(0, &["line 1"]), Some((0, "line 1".into())));
        assert_eq!(state.find(12, &["line 1"]), None);
        assert_eq!(
            state.find(12, &["nope", "line 3"]),
            Some((1, "line 3".into()))
        );
    }
}
