//! Headless Chromium inside a namespace, driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: commands on fd 3, answers on fd 4, NUL-separated JSON),
//! so no debugging port is opened: open a page, evaluate JavaScript against its live
//! DOM, wait for a condition, take a screenshot. The browser's whole process group is
//! killed and its profile removed on drop, also when a test fails.

use std::{
    fs::File,
    io::{self, BufRead, BufReader, Write},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::process::CommandExt,
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc::{self, Receiver, RecvTimeoutError},
    thread,
    time::{Duration, Instant},
};

use crate::{
    net::netns::NetNs,
    util::{error::Error, json::Json},
};

/// The Debian package's binary.
pub const CHROMIUM: &str = "chromium";
/// Longest wait for one DevTools answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause between two evaluations while waiting for a condition.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Largest DevTools message read (a full-page screenshot is a few MB of base64).
const MAX_MESSAGE: usize = 64 << 20;

/// A headless Chromium with one page open; killed (whole process group) on drop.
pub struct Browser {
    child: Child,
    commands: File,
    answers: Receiver<Vec<u8>>,
    output: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    session: String,
    next_id: u64,
    profile: PathBuf,
}

impl Browser {
    /// Starts Chromium in `ns` with a fresh profile under `dir`, opens `url` in a
    /// `width`×`height` window and attaches to that page.
    pub fn open(
        ns: &NetNs,
        dir: &Path,
        url: &str,
        width: u32,
        height: u32,
    ) -> Result<Browser, Error> {
        let profile = dir.join(format!("chromium-profile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).map_err(Error::io(format!(
            "could not start {CHROMIUM} (install Debian's `chromium`: `cargo xtask setup`)"
        )))?;
        let (cmd_read, cmd_write) = pipe().map_err(Error::io("the DevTools pipe"))?;
        let (ans_read, ans_write) = pipe().map_err(Error::io("the DevTools pipe"))?;
        let (cmd_fd, ans_fd) = (cmd_read.as_raw_fd(), ans_write.as_raw_fd());
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns.name(), CHROMIUM])
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // SAFETY: dup2 and prctl are async-signal-safe; the fds are open in the parent.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(cmd_fd, 3) < 0 || libc::dup2(ans_fd, 4) < 0 {
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(Error::io(format!(
            "could not start {CHROMIUM} (install Debian's `chromium`: `cargo xtask setup`)"
        )))?;
        // The browser holds its ends now; the reader sees EOF when it exits.
        drop(cmd_read);
        drop(ans_write);
        let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let output = output.clone();
            thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut o = output.lock().expect("output lock");
                    if o.len() >= 200 {
                        o.remove(0);
                    }
                    o.push(line);
                }
            });
        }
        let (tx, answers) = mpsc::channel();
        let reader = File::from(ans_read);
        thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            loop {
                let mut msg = Vec::new();
                match reader.read_until(0, &mut msg) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        if msg.last() == Some(&0) {
                            msg.pop();
                        }
                        if msg.len() > MAX_MESSAGE || tx.send(msg).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let mut browser = Browser {
            child,
            commands: File::from(cmd_write),
            answers,
            output,
            session: String::new(),
            next_id: 0,
            profile,
        };
        let target = browser.call(
            "Target.createTarget",
            &format!("{{\"url\":{}}}", quote(url)),
        )?;
        let target_id = field(&target, "targetId", "Target.createTarget")?;
        let attached = browser.call(
            "Target.attachToTarget",
            &format!("{{\"targetId\":{},\"flatten\":true}}", quote(&target_id)),
        )?;
        browser.session = field(&attached, "sessionId", "Target.attachToTarget")?;
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            &format!(
                "{{\"width\":{width},\"height\":{height},\"deviceScaleFactor\":1,\"mobile\":false}}"
            ),
        )?;
        Ok(browser)
    }

    /// Opens `url` in another window of this browser (visible, as a tab in front of
    /// each of ten screens would be) and attaches to it; the answer names the tab for
    /// [`eval_in`](Self::eval_in).
    pub fn open_tab(&mut self, url: &str) -> Result<String, Error> {
        let target = self.call_on(
            "",
            "Target.createTarget",
            &format!("{{\"url\":{},\"newWindow\":true}}", quote(url)),
        )?;
        let target_id = field(&target, "targetId", "Target.createTarget")?;
        let attached = self.call_on(
            "",
            "Target.attachToTarget",
            &format!("{{\"targetId\":{},\"flatten\":true}}", quote(&target_id)),
        )?;
        field(&attached, "sessionId", "Target.attachToTarget")
    }

    /// Sends one DevTools command (to the first page once attached) and waits for its
    /// result.
    pub fn call(&mut self, method: &str, params: &str) -> Result<Json, Error> {
        let session = self.session.clone();
        self.call_on(&session, method, params)
    }

    /// Sends one DevTools command to `session` (`""`: the browser itself).
    pub fn call_on(&mut self, session: &str, method: &str, params: &str) -> Result<Json, Error> {
        self.next_id += 1;
        let id = self.next_id;
        let session = if session.is_empty() {
            String::new()
        } else {
            format!(",\"sessionId\":{}", quote(session))
        };
        let msg = format!(
            "{{\"id\":{id},\"method\":{},\"params\":{params}{session}}}\0",
            quote(method)
        );
        self.commands
            .write_all(msg.as_bytes())
            .map_err(Error::io("the DevTools pipe"))?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let raw = match self.answers.recv_timeout(left) {
                Ok(raw) => raw,
                Err(RecvTimeoutError::Timeout) => {
                    return Err(Error::Timeout {
                        what: format!("the answer to {method} (browser output)"),
                        waited: CALL_TIMEOUT,
                        last: self.output(),
                    });
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Error::Unexpected(format!(
                        "{method}: the browser closed the DevTools pipe (browser output:\n{})",
                        self.output()
                    )));
                }
            };
            let text = String::from_utf8_lossy(&raw);
            let answer = Json::parse(&text).map_err(|source| Error::Json {
                what: "a DevTools message".into(),
                source,
            })?;
            if answer.get("id").and_then(Json::as_u64) != Some(id) {
                continue; // an event, or an answer to an earlier command
            }
            if let Some(err) = answer.get("error") {
                return Err(Error::Unexpected(format!(
                    "{method}: {}",
                    err.str_at(&["message"])
                )));
            }
            return answer
                .get("result")
                .cloned()
                .ok_or_else(|| no_field(method, "result"));
        }
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns its value.
    pub fn eval(&mut self, expression: &str) -> Result<Json, Error> {
        let session = self.session.clone();
        self.eval_in(&session, expression)
    }

    /// Evaluates `expression` in the tab of `session`.
    pub fn eval_in(&mut self, session: &str, expression: &str) -> Result<Json, Error> {
        let r = self.call_on(
            session,
            "Runtime.evaluate",
            &format!(
                "{{\"expression\":{},\"returnByValue\":true,\"awaitPromise\":true}}",
                quote(expression)
            ),
        )?;
        if let Some(ex) = r.get("exceptionDetails") {
            let text = ex
                .at(&["exception", "description"])
                .and_then(Json::as_str)
                .or_else(|| ex.get("text").and_then(Json::as_str))
                .unwrap_or("(no description)");
            return Err(Error::Unexpected(format!("the page threw: {text}")));
        }
        Ok(r.at(&["result", "value"]).cloned().unwrap_or(Json::Null))
    }

    /// Evaluates `expression` every 100 ms until `done` accepts its value or `timeout`
    /// passes; returns the accepted value and how long it took.
    pub fn wait_for(
        &mut self,
        what: &str,
        expression: &str,
        timeout: Duration,
        done: impl Fn(&Json) -> bool,
    ) -> Result<(Json, Duration), Error> {
        let start = Instant::now();
        loop {
            let value = self.eval(expression)?;
            if done(&value) {
                return Ok((value, start.elapsed()));
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    what: what.into(),
                    waited: start.elapsed(),
                    last: format!("{value:?}"),
                });
            }
            thread::sleep(POLL_EVERY);
        }
    }

    /// Saves a PNG of the whole page to `path`.
    pub fn screenshot(&mut self, path: &Path) -> Result<(), Error> {
        let r = self.call(
            "Page.captureScreenshot",
            "{\"format\":\"png\",\"captureBeyondViewport\":true}",
        )?;
        let data = field(&r, "data", "Page.captureScreenshot")?;
        let png = base64_decode(&data)
            .ok_or_else(|| Error::Unexpected("the screenshot is not valid base64".into()))?;
        std::fs::write(path, png).map_err(Error::io(format!("writing {}", path.display())))
    }

    /// The browser's last lines of output.
    pub fn output(&self) -> String {
        self.output.lock().map(|o| o.join("\n")).unwrap_or_default()
    }

    /// Process id of the browser (the leader of its process group).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self
            .commands
            .write_all(b"{\"id\":0,\"method\":\"Browser.close\"}\0");
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        // Renderers and helpers share the group: none may outlive the test.
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: signals only the process group this browser leads.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn field(v: &Json, key: &str, method: &str) -> Result<String, Error> {
    v.get(key)
        .and_then(Json::as_str)
        .map(str::to_owned)
        .ok_or_else(|| no_field(method, key))
}

fn no_field(method: &str, what: &str) -> Error {
    Error::Unexpected(format!("{method}: the answer has no {what}"))
}

/// A pipe whose two ends sit above the standard fds and 3/4 (dup2 targets in the
/// child), close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds: [RawFd; 2] = [-1; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let lift = |fd: RawFd| -> io::Result<OwnedFd> {
        // SAFETY: fd is ours (just made); the duplicate is owned by the result.
        let high = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 10) };
        // SAFETY: fd is one of the two pipe2 just made, owned by nothing else, and
        // closed only here.
        unsafe { libc::close(fd) };
        if high < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: high is a fresh fd owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(high) })
    };
    Ok((lift(fds[0])?, lift(fds[1])?))
}

/// `s` as a JSON string literal.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Standard base64 (with padding) to bytes; `None` if malformed.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= value(c)? << (18 - 6 * i);
        }
        let n = chunk.len() - 1;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_known_vectors() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode("Zm9vYmFy").unwrap(), b"foobar");
        assert_eq!(base64_decode("iVBORw0KGgo=").unwrap(), b"\x89PNG\r\n\x1a\n");
        assert!(base64_decode("Zm9v!").is_none());
        assert!(base64_decode("Z").is_none());
    }

    #[test]
    fn quote_escapes_what_json_needs() {
        assert_eq!(quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        let parsed = Json::parse(&quote("x \" \\ \n é")).unwrap();
        assert_eq!(parsed.as_str(), Some("x \" \\ \n é"));
    }
}
