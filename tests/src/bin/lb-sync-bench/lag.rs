//! Sync lag: node A publishes records paced at a rate, a batch every millisecond (as the
//! agent publishes the connection events of one ring read); node B installs each into
//! the kernel's peer tables. Per record: B's install done less A's publish call.

use std::time::{Duration, Instant};

use lb_agent::cluster::{Cluster, Record};

use crate::kernel;
use crate::node::{self, Plan};

/// A's batches: one every millisecond.
const BATCH_EVERY: Duration = Duration::from_millis(1);

/// A publishes `rate` records a second for `seconds`; B installs them.
pub fn lag(rate: usize, seconds: f64) -> anyhow::Result<()> {
    let per_batch = (rate as f64 * BATCH_EVERY.as_secs_f64()).round() as usize;
    anyhow::ensure!(per_batch > 0, "--rates: at least 1,000 a second");
    let total = (rate as f64 * seconds) as usize / per_batch * per_batch;
    let all: Vec<Record> = (0..total as u32).map(node::record).collect();
    let (sa, sb, [ca, cb]) = node::sockets()?;
    node::single_thread()?.block_on(async move {
        let plan = Plan {
            expect: total,
            tables: Some(kernel::sizes(total, true)?),
            track: true,
        };
        let mut b = node::receiver(cb, sb, plan);
        b.wait_started()?;
        let a = Cluster::start_on(&ca, &node::KEY, sa)?;
        node::wait_up(&a).await?;
        let mut published = Vec::with_capacity(total);
        let mut tick = tokio::time::interval(BATCH_EVERY);
        let start = Instant::now();
        for batch in all.chunks(per_batch) {
            tick.tick().await;
            let at = Instant::now();
            a.publish(batch);
            published.extend(std::iter::repeat_n(at, batch.len()));
        }
        let took = start.elapsed();
        let applied =
            node::wait_done(&mut b, Duration::from_secs(120), "install of every record").await?;
        if let Ok(value) = std::env::var("LB_SYNC_BENCH_TIMELINE") {
            // The worst lag of each N ms of publishing (the variable's value; 100 if it
            // is not a positive number), to tell a start-up queue from stalls later on.
            let step: u128 = value.parse().ok().filter(|&n| n > 0).unwrap_or(100);
            let mut worst = vec![Duration::ZERO; (took.as_millis() / step + 1) as usize];
            for &(n, done) in &applied.installs {
                let at = published[n as usize];
                let slot = (((at - start).as_millis() / step) as usize).min(worst.len() - 1);
                worst[slot] = worst[slot].max(done - at);
            }
            eprintln!("worst lag per 100 ms published: {worst:.1?}");
        }
        let mut lags: Vec<Duration> = applied
            .installs
            .iter()
            .map(|&(n, done)| done - published[n as usize])
            .collect();
        lags.sort_unstable();
        let at = |q: f64| lags[((lags.len() - 1) as f64 * q).round() as usize];
        println!(
            "lag: {rate}/s for {seconds} s ({total} records in batches of {per_batch} every \
             {BATCH_EVERY:?}, published in {took:.2?}): {} installed; publish -> B's map \
             write done: p50 {:.2?}, p99 {:.2?}, max {:.2?}",
            lags.len(),
            at(0.5),
            at(0.99),
            lags[lags.len() - 1],
        );
        Ok(())
    })
}
