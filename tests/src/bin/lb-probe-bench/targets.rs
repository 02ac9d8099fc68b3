//! The targets: a child process listening on N ports (`--serve N`), and the
//! scenario's handle on it.

use super::*;

/// `--serve N`: listen on N targets, accept and close every connection; on stdin,
/// `close K` drops the listeners of every K-th target and answers `closed <count>`.
/// Exits when stdin closes.
///
/// In `veth` mode beyond [`PORTS_PER_IP`] targets, one listener per port on the wildcard
/// address serves that port on every target address (they are all in this process's
/// namespace, which nothing else uses): [`PORTS_PER_IP`] descriptors instead of one per
/// target, since this machine's hard RLIMIT_NOFILE (20,000 here) cannot be raised.
/// Closing port `j` closes targets `k·PORTS_PER_IP + j`, every K-th target exactly when
/// K divides [`PORTS_PER_IP`].
pub(super) fn serve(n: usize, net: Net) -> anyhow::Result<()> {
    if net == Net::Remote {
        return serve_remote(n);
    }
    let wildcard = net == Net::Veth && n > PORTS_PER_IP;
    let listeners = if wildcard { PORTS_PER_IP } else { n };
    raise_nofile(listeners + FD_SLACK)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut tasks = Vec::with_capacity(listeners);
        for i in 0..listeners {
            let mut addr = target_addr(i);
            if wildcard {
                addr.set_ip(std::net::Ipv4Addr::UNSPECIFIED.into());
            }
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("target {i}: binding {addr}"))?;
            tasks.push(Some(tokio::spawn(accept_loop(listener))));
        }
        println!("ready {n}");
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Some(line) = lines.next_line().await? {
            let words: Vec<&str> = line.split_whitespace().collect();
            let ["close", every] = words.as_slice() else {
                bail!("unknown command {line:?}");
            };
            let every: usize = every.parse()?;
            if wildcard && !PORTS_PER_IP.is_multiple_of(every) {
                bail!("close {every}: with wildcard listeners K must divide {PORTS_PER_IP}");
            }
            let mut count = 0;
            for (i, task) in tasks.iter_mut().enumerate() {
                if i.is_multiple_of(every)
                    && let Some(t) = task.take()
                {
                    t.abort();
                    // Dropped (listener closed) once the cancelled task is joined.
                    let _ = t.await;
                    // The targets this listener served.
                    count += if wildcard {
                        (i..n).step_by(PORTS_PER_IP).count()
                    } else {
                        1
                    };
                }
            }
            println!("closed {count}");
        }
        Ok(())
    })
}

/// `--serve N --net remote`: the targets are `lb_tests::bpf::syn_responder` on this
/// namespace's end of the pair (target `i` is the responder's index `i`: both count
/// [`PORTS_PER_IP`] ports per address from the first); `close K` marks every K-th target
/// closed (answered with an RST-ACK). The responder is detached when this process ends.
fn serve_remote(n: usize) -> anyhow::Result<()> {
    const { assert!(PORTS_PER_IP as u32 == lb_tests::bpf::syn_responder::PORTS_PER_HOST) };
    if n as u64 > u64::from(lb_tests::bpf::syn_responder::TARGETS) {
        bail!(
            "the SYN responder knows {} targets",
            lb_tests::bpf::syn_responder::TARGETS
        );
    }
    let mut responder = lb_tests::bpf::syn_responder::SynResponder::load()?;
    responder.attach(target_net::TARGET_IF)?;
    println!("ready {n}");
    for line in std::io::stdin().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let ["close", every] = words.as_slice() else {
            bail!("unknown command {line:?}");
        };
        let every: usize = every.parse()?;
        let mut count = 0;
        for i in (0..n).step_by(every.max(1)) {
            responder.set_closed(i as u32, true)?;
            count += 1;
        }
        println!("closed {count}");
    }
    Ok(())
}

pub(super) async fn accept_loop(listener: tokio::net::TcpListener) {
    loop {
        match listener.accept().await {
            // Closed at once with a FIN (a reset could reach the prober before its
            // connect is seen complete, and fail it).
            Ok((s, _)) => drop(s),
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

pub(super) struct Targets {
    pub(super) child: Child,
    pub(super) stdin: ChildStdin,
    pub(super) stdout: tokio::io::Lines<tokio::io::BufReader<ChildStdout>>,
}

impl Targets {
    /// Starts the target process for `n` targets (`mode`): in `net`'s namespace when
    /// there is one, pinned to `cpu` if given.
    pub(super) async fn start(
        n: usize,
        mode: Net,
        net: Option<&TargetNet>,
        cpu: Option<usize>,
    ) -> anyhow::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut cmd = match net {
            Some(net) => {
                let mut cmd = Command::new("ip");
                cmd.args(net.exec_prefix()).arg(exe);
                cmd
            }
            None => Command::new(exe),
        };
        cmd.args(["--serve", &n.to_string(), "--net", mode.name()]);
        if let Some(cpu) = cpu {
            cmd.args(["--cpu", &cpu.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the target process")?;
        let stdin = child.stdin.take().context("target stdin")?;
        let mut stdout =
            tokio::io::BufReader::new(child.stdout.take().context("target stdout")?).lines();
        let ready = tokio::time::timeout(Duration::from_secs(120), stdout.next_line())
            .await
            .context("the target process did not get ready within 120 s")??;
        if ready.as_deref() != Some(&format!("ready {n}")) {
            bail!("the target process failed to start (said {ready:?})");
        }
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// Closes every `every`-th target; returns how many were closed.
    pub(super) async fn close(&mut self, every: usize) -> anyhow::Result<usize> {
        self.stdin
            .write_all(format!("close {every}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let line = self.stdout.next_line().await?.unwrap_or_default();
        line.strip_prefix("closed ")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("the target process answered {line:?}"))
    }

    /// Ends the target process (it exits when its stdin closes) and waits for it, so the
    /// next scenario can bind the same ports.
    pub(super) async fn stop(mut self) {
        drop(self.stdin);
        let waited = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        if waited.is_err() {
            let _ = self.child.kill().await;
        }
    }

    /// CPU time the targets have used so far: their process, and with `veth` their
    /// NAPI thread (their kernel's receive work).
    pub(super) fn cpu(&self) -> Duration {
        self.child
            .id()
            .map_or(Duration::ZERO, lb_tests::bench::cpu::process_on_cpu)
            + target_net::napi_cpu(End::Targets)
    }
}
