//! CPU pinning and on-CPU time of processes and kernel threads (NAPI threads among
//! them), from `/proc`: what the benchmarks measure a balancer or an agent with.

use std::{fs, time::Duration};

/// Pins the calling thread (and the threads it starts later) to `cpu`.
pub fn pin_self(cpu: usize) -> std::io::Result<()> {
    pin(0, cpu)
}

/// Pins task `tid` (a thread or kernel thread; 0 = the caller) to `cpu`. For a
/// process, every thread of it.
pub fn pin(tid: u32, cpu: usize) -> std::io::Result<()> {
    let tasks: Vec<u32> = if tid == 0 {
        vec![0]
    } else {
        threads(tid).unwrap_or_else(|| vec![tid])
    };
    for t in tasks {
        // SAFETY: a zeroed cpu_set_t is empty; CPU_SET and sched_setaffinity read the
        // set we own.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(t as libc::pid_t, size_of::<libc::cpu_set_t>(), &set)
        };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                err.kind(),
                format!("pinning task {t} to CPU {cpu}: {err}"),
            ));
        }
    }
    Ok(())
}

/// The thread ids of process `pid`.
fn threads(pid: u32) -> Option<Vec<u32>> {
    let dir = fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    Some(
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect(),
    )
}

/// Kernel threads `napi/IFNAME-…` (every namespace's interfaces of that name: only
/// interfaces with threaded NAPI have one).
pub fn napi_threads(ifname: &str) -> Vec<u32> {
    let prefix = format!("napi/{ifname}-");
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with(&prefix))
        })
        .collect()
}

/// Time a task has spent on a CPU, from its `schedstat` file at `path` (nanoseconds).
fn task_on_cpu(path: &str) -> Duration {
    fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// On-CPU time of the given kernel threads, summed.
pub fn on_cpu(tids: &[u32]) -> Duration {
    tids.iter()
        .map(|t| task_on_cpu(&format!("/proc/{t}/schedstat")))
        .sum()
}

/// On-CPU time of every live thread of process `pid`, summed (threads that already
/// exited are not counted: meant for processes whose threads live as long as they do).
pub fn process_on_cpu(pid: u32) -> Duration {
    threads(pid)
        .unwrap_or_default()
        .iter()
        .map(|t| task_on_cpu(&format!("/proc/{pid}/task/{t}/schedstat")))
        .sum()
}

/// A thread spinning at real-time priority (`SCHED_FIFO` 1) on one CPU until a deadline:
/// everything else on that CPU (processes not real-time) gets only what the kernel's
/// real-time throttling leaves — by default 5 % (`sched_rt_runtime_us` 950,000 of each
/// 1,000,000). Stops at its deadline or when dropped (joined).
pub struct FifoHog {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<std::io::Result<Duration>>>,
}

impl FifoHog {
    /// Starts hogging `cpu` for at most `length`.
    pub fn start(cpu: usize, length: Duration) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            pin_self(cpu)?;
            let param = libc::sched_param { sched_priority: 1 };
            // SAFETY: our own thread (0), a valid parameter.
            if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let start = std::time::Instant::now();
            while start.elapsed() < length && !flag.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            Ok(start.elapsed())
        });
        FifoHog {
            stop,
            thread: Some(thread),
        }
    }

    /// Waits for the deadline; how long it spun, or why it could not.
    pub fn join(mut self) -> std::io::Result<Duration> {
        self.thread
            .take()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("hog panicked")))
            })
            .unwrap_or(Ok(Duration::ZERO))
    }
}

impl Drop for FifoHog {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
