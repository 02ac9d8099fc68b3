//! Kernel time stamps for the probes that own their packets (the SYN check, icmp): a
//! probe is judged by when its request left and its answer reached the kernel, not by
//! when the agent got to look (docs/local-faults.md, "Judged by the kernel's clock").
//!
//! Receive stamps are the kernel's (`SO_TIMESTAMPNS`, taken when the packet reached the
//! socket layer, in softirq, whatever the agent's threads were doing); the request's send
//! is bracketed by the realtime clock read just before and just after the send call
//! (`sent`), so the true send instant lies in between. All stamps are `CLOCK_REALTIME`
//! nanoseconds, the clock `SO_TIMESTAMPNS` uses.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// Nanoseconds of `CLOCK_REALTIME`.
pub(crate) type Stamp = u64;

/// When a request was handed to the kernel: at or after `lo`, at or before `hi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    pub lo: Stamp,
    pub hi: Stamp,
}

/// The realtime clock now.
pub(crate) fn now() -> Stamp {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    timespec_ns(ts.tv_sec, ts.tv_nsec)
}

fn timespec_ns(sec: i64, nsec: i64) -> Stamp {
    (sec.max(0) as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(nsec.max(0) as u64)
}

/// Asks the kernel to stamp every packet `sock` receives (`SO_TIMESTAMPNS`).
pub(crate) fn enable(sock: &impl AsRawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: an int option on the caller's socket, `on` alive for the call.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS_NEW,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Bytes of control buffer a received packet's stamp needs (with room to spare).
pub(crate) const CONTROL_BYTES: usize = 64;

/// The kernel's receive stamp in `msg`'s control data, if it carries one.
///
/// # Safety
/// `msg` must come from a successful `recvmsg`/`recvmmsg` whose control buffer is alive.
pub(crate) unsafe fn received(msg: &libc::msghdr) -> Option<Stamp> {
    // SAFETY: the CMSG_* walk stays within the control length the kernel wrote.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_TIMESTAMPNS_NEW {
                // struct __kernel_timespec { s64 tv_sec; long long tv_nsec; }
                let data = libc::CMSG_DATA(c) as *const [i64; 2];
                let [sec, nsec] = std::ptr::read_unaligned(data);
                return Some(timespec_ns(sec, nsec));
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

/// What a probe's stamps say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Judged {
    /// The kernel received the answer within the timeout of the request's send: this long
    /// after it (an upper bound: measured from the earliest possible send).
    InTime(Duration),
    /// The server had the whole timeout and no answer reached the kernel within it.
    TimedOut,
    /// The stamps cannot tell the server's lateness from the agent's: no verdict.
    Unknowable(String),
}

/// An answer the kernel received at `rx` to a request `sent`, with `timeout` allowed.
pub(crate) fn answer(sent: Sent, rx: Stamp, timeout: Duration) -> Judged {
    let t = timeout.as_nanos() as u64;
    // The true round trip lies in [rx - hi, rx - lo].
    let longest = rx.saturating_sub(sent.lo);
    let shortest = rx.saturating_sub(sent.hi);
    if longest <= t {
        Judged::InTime(Duration::from_nanos(longest))
    } else if shortest > t {
        Judged::TimedOut
    } else {
        Judged::Unknowable(format!(
            "local fault: the answer came {:?}–{:?} after the request and the agent's send \
             took {:?} (timeout {timeout:?})",
            Duration::from_nanos(shortest),
            Duration::from_nanos(longest),
            Duration::from_nanos(sent.hi.saturating_sub(sent.lo)),
        ))
    }
}

/// No answer: the agent read every packet the kernel had received up to `drained` and
/// none answered a request `sent` (if it was sent at all). `Ok` is the judgement; `Err`
/// is how much longer the server is owed before silence is its failure.
pub(crate) fn silence(
    sent: Option<Sent>,
    drained: Stamp,
    timeout: Duration,
) -> Result<Judged, Duration> {
    let Some(sent) = sent else {
        return Ok(Judged::Unknowable(
            "local fault: the request was still queued in the agent at the deadline \
             (agent starved)"
                .into(),
        ));
    };
    // The server's full timeout ends at the latest possible send plus the timeout.
    let owed_until = sent.hi.saturating_add(timeout.as_nanos() as u64);
    if drained >= owed_until {
        Ok(Judged::TimedOut)
    } else {
        Err(Duration::from_nanos(owed_until - drained))
    }
}

/// A judgement confirmed against the agent's own lateness: a timeout (an answer stamped
/// too late, or silence) while the agent was late during the probe (since `sent_lo`) by
/// more than the timer's slack may be the agent's host's doing — its receive path, where
/// the stamp is taken, shares the agent's lot — and gives no verdict ([`super::lag`]).
pub(crate) fn confirm(judged: Judged, sent_lo: Stamp, timeout: Duration) -> Judged {
    if judged != Judged::TimedOut {
        return judged;
    }
    match super::lag::within(sent_lo, now()) {
        Some(late) if late > super::local::on_time_slack(timeout) => Judged::Unknowable(format!(
            "local fault: no answer within the timeout while the agent itself was {late:?} \
             late (its host may have delayed or dropped the answer)"
        )),
        _ => judged,
    }
}

/// A probe still owed time after the agent's last look: no verdict.
pub(crate) fn still_owed(owed: Duration) -> Judged {
    Judged::Unknowable(format!(
        "local fault: the agent looked {owed:?} before the server's timeout ran out \
         (agent late)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn an_answer_is_judged_by_its_stamps_not_by_when_it_was_read() {
        let t = Duration::from_millis(500);
        let sent = Sent {
            lo: 1000 * MS,
            hi: 1000 * MS + 20_000,
        };
        assert_eq!(
            answer(sent, 1001 * MS, t),
            Judged::InTime(Duration::from_millis(1))
        );
        assert_eq!(
            answer(sent, 1500 * MS, t),
            Judged::InTime(Duration::from_millis(500))
        );
        assert_eq!(answer(sent, 1501 * MS, t), Judged::TimedOut);
        // Inside the send's own uncertainty: no verdict.
        assert!(matches!(
            answer(sent, 1500 * MS + 10_000, t),
            Judged::Unknowable(_)
        ));
    }

    #[test]
    fn silence_is_a_timeout_only_once_the_server_had_its_whole_timeout() {
        let t = Duration::from_millis(500);
        let sent = Sent {
            lo: 1000 * MS,
            hi: 1001 * MS,
        };
        assert_eq!(silence(Some(sent), 1501 * MS, t), Ok(Judged::TimedOut));
        assert_eq!(silence(Some(sent), 1600 * MS, t), Ok(Judged::TimedOut));
        assert_eq!(
            silence(Some(sent), 1400 * MS, t),
            Err(Duration::from_millis(101)),
            "a late send leaves the server time"
        );
        assert!(matches!(
            silence(None, 9000 * MS, t),
            Ok(Judged::Unknowable(_))
        ));
    }

    #[test]
    fn the_clock_is_realtime_nanoseconds() {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        assert!(now().abs_diff(wall) < 1_000 * MS);
    }
}
