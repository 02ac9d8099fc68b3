//! The default set of scenarios (each in its own process) and the Markdown report.

use super::*;

pub(super) fn orchestrate(opts: &Opts) -> anyhow::Result<()> {
    std::fs::create_dir_all(&opts.out)?;
    let sc = |kind, targets, net, check| Scenario {
        kind,
        targets,
        net,
        check,
    };
    use Check::{Connect, Syn};
    // Targets behind veth (as remote backends) first; then on loopback, where the
    // agent also pays for the targets' kernel side, for comparison.
    let runs = [
        sc(Kind::ProbesOnly, AIM_TARGETS, Net::Veth, Connect),
        sc(Kind::ProbesOnly, AIM_TARGETS, Net::Veth, Syn),
        sc(Kind::Bpf, AIM_TARGETS, Net::Veth, Syn),
        sc(Kind::Memory, AIM_TARGETS, Net::Veth, Syn),
        sc(Kind::ProbesOnly, AIM_TARGETS, Net::Loopback, Connect),
        sc(Kind::Bpf, AIM_TARGETS, Net::Loopback, Syn),
        // Ten times the scale: the connect baseline next to the SYN check, in one run.
        sc(Kind::ProbesOnly, SCALE_TARGETS, Net::Veth, Connect),
        sc(Kind::ProbesOnly, SCALE_TARGETS, Net::Veth, Syn),
        sc(Kind::Memory, SCALE_TARGETS, Net::Veth, Syn),
        sc(Kind::Bpf, SCALE_TARGETS, Net::Veth, Syn),
        // The same with the targets' kernel work off this machine (the SYN responder).
        sc(Kind::Memory, SCALE_TARGETS, Net::Remote, Syn),
        sc(Kind::Bpf, SCALE_TARGETS, Net::Remote, Syn),
    ];
    let mut results = Vec::new();
    for Scenario {
        kind,
        targets,
        net,
        check,
    } in runs
    {
        let mut cmd = std::process::Command::new(std::env::current_exe()?);
        cmd.args(["--child", "--dataplane", kind.name()])
            .args(["--targets", &targets.to_string(), "--net", net.name()])
            .args(["--tcp-check", check.name()])
            .args(["--cpus", opts.cpus.name()])
            .args(["--warmup", &opts.warmup.as_secs_f64().to_string()])
            .args(["--window", &opts.window.as_secs_f64().to_string()])
            .args(["--fail-window", &opts.fail_window.as_secs_f64().to_string()])
            .stdout(Stdio::piped());
        let mut child = cmd.spawn()?;
        let mut figures = Figures::new();
        let stdout = child.stdout.take().context("scenario stdout")?;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            match line.strip_prefix(RESULT).and_then(|l| l.split_once('\t')) {
                Some((k, v)) => {
                    figures.insert(k.to_string(), v.to_string());
                }
                None => println!("{line}"),
            }
        }
        let status = child.wait()?;
        if !status.success() {
            bail!(
                "scenario {} with {targets} targets failed ({status})",
                kind.name()
            );
        }
        results.push(figures);
    }
    let md = report(&results, opts);
    println!("\n{md}");
    let path = opts.out.join("probes.md");
    std::fs::write(&path, &md)?;
    println!("written {}", path.display());
    Ok(())
}

/// Header of [`summary_row`]'s lines (one scenario's steady window on one line).
pub(super) const SUMMARY_HEADER: &str = "| data plane | cpus | agent cores (user + sys) | probes/s | \
     agent CPU per probe | failed (of open targets) | of them verdicts / local faults | peak RSS | agent host's NAPI cores | \
     targets' cores | machine busy | load avg |";

/// One scenario's steady window on one line, under [`SUMMARY_HEADER`].
pub(super) fn summary_row(f: &Figures) -> String {
    let get = |k: &str| f.get(k).cloned().unwrap_or_else(|| "?".into());
    let num = |k: &str| get(k).parse::<f64>().unwrap_or(f64::NAN);
    format!(
        "{SUMMARY_HEADER}\n| {} | {} | {} ({} + {}) | {} | {:.1} µs | {} ({}) | {} / {} | {} MB | {} | {} | {} of {} | {} |",
        get("dataplane"),
        get("cpus"),
        get("cores"),
        get("user_cores"),
        get("sys_cores"),
        get("probes_per_s"),
        num("cores") / num("probes_per_s") * 1e6,
        get("failed"),
        get("open_failed"),
        get("verdicts_failed"),
        get("local"),
        get("peak_rss_mb"),
        get("agent_napi_cores"),
        get("target_cores"),
        get("machine_busy"),
        machine_cores(),
        get("load"),
    )
}

pub(super) fn report(results: &[Figures], opts: &Opts) -> String {
    let get = |f: &Figures, k: &str| f.get(k).cloned().unwrap_or_else(|| "?".into());
    let num = |f: &Figures, k: &str| get(f, k).parse::<f64>().unwrap_or(f64::NAN);
    let row = |f: &Figures| {
        format!(
            "{} | {} | {} | {}",
            get(f, "net"),
            get(f, "dataplane"),
            get(f, "targets"),
            get(f, "tcp_check")
        )
    };
    let mut md = format!(
        "# Probe scale: tcp targets (behind veth, or on loopback), interval 1s, timeout 500ms\n\n\
         Target: {AIM_TARGETS} targets with under {MAX_CORES} core and under {MAX_RSS_MB} MB. \
         Warm-up {:?}, window {:?}; then a failure window of {:?} with every {CLOSE_EVERY}th \
         target closed.\n\n\
         | targets on | data plane | targets | tcp check | published | agent cores (user + sys) | agent host's NAPI cores | peak RSS | \
         RSS at end | probes/s | failed | targets' cores | machine busy / load avg | verdict |\n\
         |---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n",
        opts.warmup, opts.window, opts.fail_window
    );
    for f in results {
        let ok = num(f, "cores") < MAX_CORES && num(f, "peak_rss_mb") < MAX_RSS_MB;
        let _ = writeln!(
            md,
            "| {} | {} | {} ({} + {}) | {} | {} MB | {} MB | {} | {} | {} | {} of {} / {} | {} |",
            row(f),
            get(f, "published"),
            get(f, "cores"),
            get(f, "user_cores"),
            get(f, "sys_cores"),
            get(f, "agent_napi_cores"),
            get(f, "peak_rss_mb"),
            get(f, "end_rss_mb"),
            get(f, "probes_per_s"),
            get(f, "failed"),
            get(f, "target_cores"),
            get(f, "machine_busy"),
            machine_cores(),
            get(f, "load"),
            if ok { "meets" } else { "**misses**" },
        );
    }
    md.push_str(
        "\nEvery 10th target closed:\n\n\
         | targets on | data plane | targets | tcp check | closed | all seen failing after | unhealthy (of closed) | \
         transitions | publishes: verdict → maps written | agent cores | peak RSS | probes/s | \
         failed/s | open targets failed | publish errors | machine busy / load avg |\n\
         |---|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for f in results {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {}: {} | {} | {} MB | {} | {} | {} | {} | {} / {} |",
            row(f),
            get(f, "fail_closed"),
            get(f, "fail_detect"),
            get(f, "fail_unhealthy_closed"),
            get(f, "fail_transitions"),
            get(f, "fail_publishes"),
            get(f, "fail_propagation"),
            get(f, "fail_cores"),
            get(f, "fail_peak_rss_mb"),
            get(f, "fail_probes_per_s"),
            get(f, "fail_failed_per_s"),
            get(f, "fail_open_failed"),
            get(f, "fail_publish_errors"),
            get(f, "fail_machine_busy"),
            get(f, "fail_load"),
        );
    }
    md.push_str(
        "\nWhere the agent loop's time goes (wall time per call, mean):\n\n\
         | targets on | data plane | targets | tcp check | loop iterations/s | `poll_stats` | \
         snapshot builds for one reader/s | failure window: `on_probe_reports` with a recompute | failure \
         window: snapshot builds for one reader/s |\n\
         |---|---|---:|---|---:|---|---|---|---|\n",
    );
    for f in results.iter().filter(|f| f.contains_key("cost_poll_stats")) {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            row(f),
            get(f, "iterations_per_s"),
            get(f, "cost_poll_stats"),
            get(f, "cost_snapshot_build"),
            get(f, "fail_cost_recompute"),
            get(f, "fail_cost_snapshot_build"),
        );
    }
    md.push_str("\nPer run:\n\n");
    for f in results {
        if get(f, "dataplane") == Kind::ProbesOnly.name() {
            let _ = writeln!(
                md,
                "- {} × {} ({}): RSS {} MB before the probe tasks were spawned, {} MB after; at \
                 the window's end {}; SYN check packets over the run: {}; failures: {}.",
                get(f, "dataplane"),
                get(f, "targets"),
                get(f, "tcp_check"),
                get(f, "rss_before_apply_mb"),
                get(f, "rss_after_apply_mb"),
                get(f, "rss_split"),
                get(f, "syn_packets"),
                get(f, "failure_details"),
            );
            continue;
        }
        let _ = writeln!(
            md,
            "- {} × {} ({}): apply_config {} s ({}); RSS {} MB before it (data plane \
             loaded, targets' config parsed), {} MB after it (servers, probe tasks, tables), \
             peak {} MB before the window, at the window's end {}; states at the end: {}; \
             SYN check packets over the run: {}; failures: {}.",
            get(f, "dataplane"),
            get(f, "targets"),
            get(f, "tcp_check"),
            get(f, "setup_s"),
            match get(f, "setup_error").as_str() {
                "-" => "all published".to_string(),
                e => format!("publishing refused: {e}"),
            },
            get(f, "rss_before_apply_mb"),
            get(f, "rss_after_apply_mb"),
            get(f, "setup_peak_rss_mb"),
            get(f, "rss_split"),
            get(f, "fail_states"),
            get(f, "syn_packets"),
            get(f, "failure_details"),
        );
    }
    let future = results
        .first()
        .map_or("?".into(), |f| get(f, "probe_future_bytes"));
    let _ = write!(
        md,
        "\n## Method\n\n\
         - Each row is its own process (`lb-probe-bench --dataplane KIND --targets N --net NET`): \
         the real `Agent` over `BpfDataplane::load()` (the XDP object and its maps loaded, \
         nothing attached, no traffic) or `MemoryDataplane`, with `NetProber` (tcp \
         probes as SYN checks or real connects: the \"tcp check\" column), `StaticNeighbours` (one MAC for all), on a 2-worker tokio runtime. The \
         targets are split over {SERVICES} nat services (more beyond {PER_SERVICE} per \
         service) with one `tcp` probe \
         (`interval = \"1s\"`, `timeout = \"500ms\"`). One probe task's future (`probe::execute`) \
         is {future} bytes.\n\
         - The loop is `lb-agent run`'s (`lb-agent/src/event_loop/`): select over up to {BATCH} queued \
         probe reports (one publish for all), passive events, health deadlines, the \
         {STATS_EVERY:?} stats tick (`poll_stats`), one snapshot reader every {READ_EVERY:?} \
         (as a metrics scrape: built on demand, at most once per `snapshot_interval`, \
         answered by `answer_readers` after each turn) and MAC retries.\n\
         - The targets are a child process (`--serve N`: N listeners on ports {BASE_PORT}.. of \
         one address per {PORTS_PER_IP}; beyond {PORTS_PER_IP} targets on `veth`, one \
         wildcard listener per port serves every address; it accepts and closes each \
         connection), so its CPU \
         is not in the agent's figures; its share is shown separately. Targets on `veth`: \
         the child runs in a namespace of its own behind a veth pair whose receiving end \
         has a threaded NAPI (GRO on, `threaded` = 1), so the targets' kernel work runs in \
         `napi/pbt-…`, counted in the targets' share, as on backends that are other hosts; \
         the agent's end has one too (`napi/pba-…`), so the agent host's receive work for \
         the replies is shown apart, in \"agent host's NAPI cores\", as a NIC's softirq \
         would be on a real host. \
         CPUs (`--cpus`, default `split` with `veth`): `split` pins the agent's process and \
         `napi/pba-…` to CPU 0, the targets' process and `napi/pbt-…` to CPU 1, so the \
         targets' kernel work (their listen sockets' SYN-ACK retransmit timers among it) \
         cannot run in the agent's time slices; `agent-alone` puts `napi/pba-…` on CPU 1 \
         too; `shared` pins nothing. \
         Targets on `loopback` (127.0.x.1): the kernel's work for both ends of a handshake \
         runs inside the agent's `connect` and `close` (softirq in the sender's context), so \
         the agent's sys share also carries the targets' half. \
         Targets on `remote` (SYN checks only): the same pair and CPUs as `veth`, but no \
         listeners: the child attaches the SYN responder (`lbt_syn_responder_tc`, TC ingress \
         on `pbt`) that answers each SYN with the open target's SYN-ACK or a closed one's \
         RST-ACK and consumes our RSTs, so the targets' kernel work, which remote hosts \
         would do, is not on this machine's CPUs (the responder's cost is in the targets' \
         share); both ends' queues hold 10,000 packets (a veth drains only when its peer's \
         NAPI thread runs, a NIC at line rate).\n\
         - Agent cores = `getrusage(RUSAGE_SELF)` user + sys (all threads) over the wall time \
         of the window. Peak RSS = `VmHWM` of the window (reset through \
         `/proc/self/clear_refs` when it starts); RSS at end = `VmRSS`. Probes/s = reports \
         received / wall time (the schedule asks for one per target per second). Machine \
         busy = non-idle jiffies of `/proc/stat` over the window, in cores: other work on the \
         machine competes for the same {} cores, and an agent that cannot keep up shows it as \
         probes/s below the target count.\n\
         - Failure window: the child closes every {CLOSE_EVERY}th listener (connections are \
         refused); \"all seen failing\" is the time until every closed target has produced a \
         failed report; states and transitions are from the agent's snapshot; verdict → maps \
         written is the agent's propagation histogram (from the probe's verdict, including \
         its wait in the report channel) over the window.\n\
         - The data plane is sized for the targets (`agent.max_backends` = the target \
         count, at least its default {}: the backend maps get that many entries at load), so \
         every server is published; a publish that fails all the same is reported in \
         \"setup error\" and retried on the agent's backoff (docs/capacity.md).\n",
        machine_cores(),
        lb_agent::config::DEFAULT_MAX_BACKENDS,
    );
    md
}
