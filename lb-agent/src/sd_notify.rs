//! systemd's notification protocol (`sd_notify(3)`), for a `Type=notify` unit: `READY=1`
//! once the program is attached and the first publish is done, `WATCHDOG=1` from the main
//! loop at half of `WatchdogSec` (a stuck loop stops the pings and systemd restarts the
//! agent), `STOPPING=1` on the way out. Without `NOTIFY_SOCKET` every call does nothing.

use std::{io, os::unix::net::UnixDatagram, time::Duration};

/// Sends `state` (newline-separated `KEY=value` lines) to `$NOTIFY_SOCKET`; `Ok(false)`
/// when the variable is unset (not started by systemd as `Type=notify`).
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let path = path.to_string_lossy().into_owned();
    let socket = UnixDatagram::unbound()?;
    match path.strip_prefix('@') {
        // An abstract socket: the name after the '@'.
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            socket.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            socket.send_to(state.as_bytes(), &path)?;
        }
    }
    Ok(true)
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, when it is set for this
/// process (`$WATCHDOG_PID` unset or ours); `None` otherwise.
pub fn watchdog_every() -> Option<Duration> {
    watchdog_every_from(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

fn watchdog_every_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(me)
    {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_pings_at_half_the_period_for_its_own_pid_only() {
        let half = Some(Duration::from_secs(15));
        assert_eq!(watchdog_every_from(Some("30000000"), None, 7), half);
        assert_eq!(watchdog_every_from(Some("30000000"), Some("7"), 7), half);
        assert_eq!(watchdog_every_from(Some("30000000"), Some("8"), 7), None);
        assert_eq!(watchdog_every_from(None, None, 7), None);
        assert_eq!(watchdog_every_from(Some("0"), None, 7), None);
        assert_eq!(watchdog_every_from(Some("soon"), None, 7), None);
    }

    #[test]
    fn a_notification_reaches_the_socket_named_by_the_environment() {
        let dir = std::env::temp_dir().join(format!("lb-sd-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        // SAFETY: this test is the only one in the crate that touches NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        let sent = notify("READY=1\nSTATUS=serving");
        // SAFETY: as for `set_var` above.
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(sent.unwrap());
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        assert!(!notify("READY=1").unwrap(), "no socket, nothing sent");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
