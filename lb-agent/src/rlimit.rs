//! The agent's file-descriptor limit: raised to the hard limit at start, so that probes,
//! API connections and map handles do not run out at the common soft limit of 1,024.

use std::io;

/// Raises `RLIMIT_NOFILE`'s soft limit to its hard limit; returns `(before, after)`.
pub fn raise_nofile() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit with cur <= max.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((before, lim.rlim_cur))
}

/// [`raise_nofile`], logged: the limit in force is worth a line at start.
pub fn raise_nofile_logged() {
    match raise_nofile() {
        Ok((before, after)) if before != after => {
            tracing::info!(
                before,
                after,
                "file descriptor limit raised to the hard limit"
            )
        }
        Ok((_, after)) => tracing::info!(limit = after, "file descriptor limit"),
        Err(err) => tracing::warn!(error = %err, "could not raise the file descriptor limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_limit_ends_at_the_hard_limit() {
        let (_, after) = raise_nofile().expect("getrlimit/setrlimit");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: valid, writable rlimit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!((lim.rlim_cur, after), (lim.rlim_max, lim.rlim_max));
    }
}
