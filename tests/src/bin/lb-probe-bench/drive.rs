//! Driving one scenario: the agent's loop (or the probes alone) through warm-up, the
//! measured window and the failure window.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Warmup,
    Window,
    Failing,
}

/// What [`drive`] and [`probes_only`] run against.
pub(super) struct Run<'a> {
    pub(super) cfg: &'a lb_agent::config::Config,
    pub(super) targets: &'a mut Targets,
    pub(super) opts: &'a Opts,
}

/// The phases of a scenario (warm-up, the measured window, the failure window) and what
/// is measured across them: marks at their edges, report counts, and when every closed
/// target had been seen failing.
struct Phases {
    phase: Phase,
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    marks: Vec<Mark>,
    tally: Tally,
    details: BTreeMap<String, u64>,
    closed_count: usize,
    failing_since: Instant,
    seen_failing: HashSet<SocketAddr>,
    detected: Option<Duration>,
}

impl Phases {
    fn start(opts: &Opts) -> Self {
        Self {
            phase: Phase::Warmup,
            timer: Box::pin(tokio::time::sleep(opts.warmup)),
            marks: Vec::new(),
            tally: Tally::default(),
            details: BTreeMap::new(),
            closed_count: 0,
            failing_since: Instant::now(),
            seen_failing: HashSet::new(),
            detected: None,
        }
    }

    /// Counts a probe report; in the failure window, notes when the last closed target
    /// was first seen failing.
    fn note(&mut self, r: &ProbeReport) {
        let phase = self.phase;
        let Self {
            tally,
            details,
            seen_failing,
            detected,
            closed_count,
            failing_since,
            ..
        } = self;
        tally.note(r, phase, details, |r| {
            if phase == Phase::Failing && closed(target_index(r.server.addr)) {
                seen_failing.insert(r.server.addr);
                if seen_failing.len() == *closed_count && detected.is_none() {
                    *detected = Some(failing_since.elapsed());
                }
            }
        });
    }

    /// When the current phase's timer fires, enters the next phase: marks the window
    /// edges, writes the window's figures into `f`, closes every `CLOSE_EVERY`-th target
    /// for the failure window. Returns the phase entered, `None` when all are over.
    async fn advance(
        &mut self,
        targets: &mut Targets,
        opts: &Opts,
        f: &mut Figures,
    ) -> anyhow::Result<Option<Phase>> {
        let next = match self.phase {
            Phase::Warmup => {
                f.insert(
                    "setup_peak_rss_mb".into(),
                    format!("{:.1}", status_mb("VmHWM")),
                );
                reset_peak_rss();
                self.marks.push(Mark::now(targets, self.tally));
                self.timer.as_mut().reset(Instant::now() + opts.window);
                println!("warm-up done; measuring {:?}", opts.window);
                Phase::Window
            }
            Phase::Window => {
                self.marks.push(Mark::now(targets, self.tally));
                window_figures(f, "", &self.marks[0], &self.marks[1]);
                self.closed_count = targets.close(CLOSE_EVERY).await?;
                self.failing_since = Instant::now();
                reset_peak_rss();
                self.marks.push(Mark::now(targets, self.tally));
                self.timer.as_mut().reset(Instant::now() + opts.fail_window);
                println!(
                    "closed {} targets; measuring {:?}",
                    self.closed_count, opts.fail_window
                );
                Phase::Failing
            }
            Phase::Failing => {
                self.marks.push(Mark::now(targets, self.tally));
                window_figures(f, "fail_", &self.marks[2], &self.marks[3]);
                return Ok(None);
            }
        };
        self.phase = next;
        Ok(Some(next))
    }

    /// The failure window's detection figures and the failure details.
    fn finish(&self, f: &mut Figures) {
        f.insert("fail_closed".into(), self.closed_count.to_string());
        f.insert(
            "fail_detect".into(),
            self.detected.map_or("not within the window".into(), |d| {
                format!("{:.2} s", d.as_secs_f64())
            }),
        );
        f.insert("failure_details".into(), show_details(&self.details));
    }
}

/// Applies the config and runs the loop of `lb-agent run` through the phases.
pub(super) async fn drive<D, P, N>(
    mut agent: Agent<D, P, N>,
    mut handles: lb_agent::agent::Handles,
    mut events: Option<EventStream>,
    run: Run<'_>,
    published: impl Fn(&D) -> usize,
) -> anyhow::Result<Figures>
where
    D: Dataplane,
    P: Prober,
    N: Neighbours,
{
    let Run { cfg, targets, opts } = run;
    let mut f = Figures::new();
    f.insert(
        "rss_before_apply_mb".into(),
        format!("{:.1}", status_mb("VmRSS")),
    );
    let t = std::time::Instant::now();
    let applied = agent.apply_config(cfg).await;
    f.insert(
        "rss_after_apply_mb".into(),
        format!("{:.1}", status_mb("VmRSS")),
    );
    f.insert(
        "setup_s".into(),
        format!("{:.2}", t.elapsed().as_secs_f64()),
    );
    match &applied {
        Ok(()) => f.insert("setup_error".into(), "-".into()),
        // The benchmark goes on: probes and health run for every server either way.
        Err(e @ PublishError::TooManyBackends { .. }) => {
            f.insert("setup_error".into(), e.to_string())
        }
        Err(e) => bail!("publishing the configured services: {e}"),
    };
    let published = published(agent.dataplane());
    f.insert("published".into(), published.to_string());
    println!(
        "agent configured in {:.2} s: {published} backends published{}",
        t.elapsed().as_secs_f64(),
        match &applied {
            Ok(()) => String::new(),
            Err(e) => format!(" (apply_config: {e})"),
        }
    );

    let mut phases = Phases::start(opts);
    let mut transitions_before = 0;
    let mut propagation_before = Histogram::default();
    let mut mac_retry = tokio::time::interval(MAC_RETRY);
    let mut stats = tokio::time::interval(STATS_EVERY);
    let mut reader = tokio::time::interval(READ_EVERY);
    let mut batch = Vec::with_capacity(BATCH);
    let mut costs = Costs::default();
    loop {
        let deadline = agent.next_deadline();
        let result = tokio::select! {
            n = handles.reports.recv_many(&mut batch, BATCH) => {
                if n == 0 {
                    bail!("the probe report channel closed");
                }
                for report in &batch {
                    phases.note(report);
                }
                // As `lb-agent run` does: a batch of reports, one recompute and publish.
                let published = agent.propagation().count;
                let t = std::time::Instant::now();
                let result = agent.on_probe_reports(batch.drain(..));
                if result.is_err() || agent.propagation().count != published {
                    costs.recompute.add(t.elapsed());
                }
                result
            }
            batch = next_events(&mut events) => match batch {
                Ok(batch) => agent.on_passive_events(&batch),
                Err(err) => {
                    println!("event ring buffer failed: {err}");
                    events = None;
                    Ok(())
                }
            },
            _ = sleep_until(deadline) => agent.on_tick(Instant::now()),
            _ = stats.tick() => {
                let t = std::time::Instant::now();
                agent.poll_stats();
                costs.poll_stats.add(t.elapsed());
                Ok(())
            }
            // One reader a second (a metrics scrape, a status page): as `lb-agent run`
            // answers it, from the loop, building the snapshot on demand.
            _ = reader.tick() => {
                let (tx, _answer) = tokio::sync::oneshot::channel();
                agent.on_snapshot_request(tx);
                Ok(())
            }
            _ = sleep_until(agent.readers_deadline()) => Ok(()),
            _ = mac_retry.tick() => {
                if agent.has_unknown_macs() {
                    agent.retry_macs().await
                } else {
                    Ok(())
                }
            }
            _ = phases.timer.as_mut() => {
                match phases.advance(targets, opts, &mut f).await? {
                    Some(Phase::Window) => costs = Costs::default(),
                    Some(_) => {
                        costs.figures(&mut f, "");
                        costs = Costs::default();
                        agent.publish_snapshot();
                        handles.snapshot.borrow_and_update();
                        transitions_before = handles.snapshot.borrow().transitions;
                        propagation_before = agent.propagation().clone();
                    }
                    None => {
                        costs.figures(&mut f, "fail_");
                        break;
                    }
                }
                Ok(())
            }
        };
        if let Err(err) = result {
            phases.tally.count_error(&err, &mut phases.details);
        }
        let (t, builds) = (std::time::Instant::now(), agent.snapshot_builds());
        agent.answer_readers();
        if agent.snapshot_builds() != builds {
            costs.snapshot_build.add(t.elapsed());
            handles.snapshot.borrow_and_update();
        }
        phases.tally.iterations += 1;
    }

    agent.publish_snapshot();
    let snap = handles.snapshot.borrow().clone();
    let states: BTreeMap<String, usize> =
        snap.services
            .iter()
            .flat_map(|s| &s.servers)
            .fold(BTreeMap::new(), |mut m, s| {
                *m.entry(s.state.clone()).or_default() += 1;
                m
            });
    let unhealthy_closed = snap
        .services
        .iter()
        .flat_map(|s| &s.servers)
        .filter(|s| {
            s.state == "unhealthy"
                && s.address
                    .parse()
                    .is_ok_and(|a: SocketAddr| closed(target_index(a)))
        })
        .count();
    phases.finish(&mut f);
    f.insert("fail_unhealthy_closed".into(), unhealthy_closed.to_string());
    f.insert(
        "fail_states".into(),
        states
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    f.insert(
        "fail_transitions".into(),
        (snap.transitions - transitions_before).to_string(),
    );
    let prop = histogram_delta(agent.propagation(), &propagation_before);
    f.insert("fail_publishes".into(), prop.count.to_string());
    f.insert(
        "fail_propagation".into(),
        match (prop.quantile_bound(0.5), prop.quantile_bound(0.99)) {
            (Some(p50), Some(p99)) => format!(
                "mean {:.0} µs, p50 ≤ {:.0} µs, p99 ≤ {:.0} µs",
                prop.sum / prop.count as f64 * 1e6,
                p50 * 1e6,
                p99 * 1e6
            ),
            _ => "-".into(),
        },
    );
    Ok(f)
}

/// Probes every server of `run.cfg` with the agent's scheduler and prober, and only counts
/// the reports: the same phases and figures as [`drive`], without an agent.
pub(super) async fn probes_only(run: Run<'_>) -> anyhow::Result<Figures> {
    let Run { cfg, targets, opts } = run;
    let mut f = Figures::new();
    f.insert(
        "rss_before_apply_mb".into(),
        format!("{:.1}", status_mb("VmRSS")),
    );
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let mut tasks = Vec::new();
    for (i, svc) in cfg.services.iter().enumerate() {
        let probe = Arc::new(svc.probes[0].clone());
        for server in &svc.servers {
            let lb_agent::config::ServerAddress::Socket(addr) = server.address else {
                bail!("bench servers are addresses");
            };
            let key = lb_agent::probe::ServerKey { service: i, addr };
            let signals = Arc::new(lb_agent::probe::SharedSignals::new(true));
            tasks.push(lb_agent::probe::spawn(
                key,
                0,
                probe.clone(),
                signals,
                tx.clone(),
            ));
        }
    }
    f.insert(
        "rss_after_apply_mb".into(),
        format!("{:.1}", status_mb("VmRSS")),
    );
    f.insert("published".into(), "-".into());
    f.insert("setup_s".into(), "-".into());
    f.insert("setup_error".into(), "-".into());
    let mut phases = Phases::start(opts);
    loop {
        tokio::select! {
            Some(report) = rx.recv() => {
                phases.tally.iterations += 1;
                phases.note(&report);
            }
            _ = phases.timer.as_mut() => {
                if phases.advance(targets, opts, &mut f).await?.is_none() {
                    break;
                }
            }
        }
    }
    drop(tasks);
    phases.finish(&mut f);
    for k in [
        "fail_unhealthy_closed",
        "fail_transitions",
        "fail_publishes",
        "fail_states",
    ] {
        f.insert(k.into(), "-".into());
    }
    f.insert("fail_propagation".into(), "no agent".into());
    Ok(f)
}

pub(super) fn show_details(details: &BTreeMap<String, u64>) -> String {
    if details.is_empty() {
        return "-".into();
    }
    details
        .iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl Tally {
    pub(super) fn count_error(&mut self, err: &PublishError, details: &mut BTreeMap<String, u64>) {
        self.publish_errors += 1;
        *details.entry(format!("publish error: {err}")).or_default() += 1;
    }

    pub(super) fn note(
        &mut self,
        r: &ProbeReport,
        phase: Phase,
        details: &mut BTreeMap<String, u64>,
        on_fail: impl FnOnce(&ProbeReport),
    ) {
        if r.outcome.ok {
            self.ok += 1;
            return;
        }
        self.failed += 1;
        self.local += u64::from(r.outcome.local);
        let was_closed = phase == Phase::Failing && closed(target_index(r.server.addr));
        if !was_closed {
            self.open_failed += 1;
            *details
                .entry(format!("open target: {}", detail_kind(&r.outcome.detail)))
                .or_default() += 1;
        }
        on_fail(r);
    }
}

/// A failure's detail without the figures that make each one unique ("timeout fired
/// 2.03s late"), so that the report counts kinds: a local fault's up to its first digit.
fn detail_kind(detail: &str) -> &str {
    if detail.starts_with("local fault:") {
        detail
            .find(|c: char| c.is_ascii_digit())
            .map_or(detail, |i| detail[..i].trim_end())
    } else {
        detail
    }
}

pub(super) fn histogram_delta(now: &Histogram, before: &Histogram) -> Histogram {
    let mut h = now.clone();
    for (c, b) in h.counts.iter_mut().zip(&before.counts) {
        *c -= b;
    }
    h.sum -= before.sum;
    h.count -= before.count;
    h
}

pub(super) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

pub(super) async fn next_events(
    events: &mut Option<EventStream>,
) -> Result<Vec<lb_common::events::PassiveEvent>, lb_agent::dataplane::DataplaneError> {
    match events {
        Some(stream) => stream.next_batch().await,
        None => std::future::pending().await,
    }
}
