//! The flood benchmark's output: one line per run (human and `run\t` machine-readable)
//! and the markdown table of medians over the rounds.

use std::fmt::Write as _;

use crate::{FEW_FLOWS, MANY_FLOWS, Opts, Run, balancers::Kind, setup::Setup};

/// On-CPU share above which a side counts as busy.
const BUSY: f64 = 0.9;

pub fn print_run(round: usize, run: &Run) {
    let m = &run.m;
    let per_backend: Vec<String> = m.per_backend.iter().map(u64::to_string).collect();
    println!(
        "round {round}, {}: {:<14} {:>4} flows: sent {} (+{} refused) in {:.2} s, lb received {}, \
         {} lost into lb, delivered {} [{}]; {:.2} Mpps, sender {:.0} % + switch {:.0} % busy, lb core {:.0} % busy, \
         {:.2} M packets per lb core-second",
        run.setup.key(),
        run.kind.name(),
        run.flows,
        m.sent.sent,
        m.sent.refused,
        m.sent.elapsed.as_secs_f64(),
        m.lb_rx,
        m.into_lb_dropped,
        m.delivered(),
        per_backend.join(" "),
        m.delivered_per_s() / 1e6,
        m.sender_busy() * 100.0,
        m.switch_napi.as_secs_f64() / m.sent.elapsed.as_secs_f64() * 100.0,
        m.busy() * 100.0,
        m.per_core_second() / 1e6,
    );
    println!(
        "run\t{round}\t{}\t{}\tsetup={}\tsent={}\trefused={}\tlb_rx={}\tinto_lb_dropped={}\tdelivered={}\tper_backend={}\tnapi_us={}\tprocess_us={}\tsender_us={}\tswitch_us={}\telapsed_us={}",
        run.kind.key(),
        run.flows,
        run.setup.key(),
        m.sent.sent,
        m.sent.refused,
        m.lb_rx,
        m.into_lb_dropped,
        m.delivered(),
        per_backend.join(","),
        m.napi.as_micros(),
        m.process.as_micros(),
        m.sent.cpu.as_micros(),
        m.switch_napi.as_micros(),
        m.sent.elapsed.as_micros(),
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

/// Which side ran out: the lb core (its thread on the CPU nearly all the time), the
/// sender's CPU (the sending thread and the switch's receive threads), both, or
/// neither (the machine's other work held them back).
fn limit(runs: &[&Run]) -> &'static str {
    let lb = median(runs.iter().map(|r| r.m.busy()).collect()) > BUSY;
    let sender = median(runs.iter().map(|r| r.m.sender_side_busy()).collect()) > BUSY;
    match (lb, sender) {
        (true, true) => "both",
        (true, false) => "lb core",
        (false, true) => "sender CPU",
        (false, false) => "neither",
    }
}

pub fn table(runs: &[Run], opts: &Opts) -> String {
    let mode = match opts.trickle {
        Some(n) => format!("{n} paced packets per run (smoke mode, no figures)"),
        None => format!(
            "{} s floods (after {} ms of warm-up flood)",
            opts.seconds,
            crate::WARMUP.as_millis()
        ),
    };
    let mut md = format!(
        "# Saturation: UDP flood through one lb core\n\n\
         {mode}, {} rounds with the balancers alternating; medians over the rounds \
         (min–max in brackets). 60-byte frames from one sender thread; backends weighted \
         1:1:2 count and drop in XDP.\n\n\
         | setup | balancer | flows | offered (Mpps) | forwarded (Mpps) | lost (at the lb's queue) | sender CPU busy | lb core busy | \
         forwarded per lb core-second (M) | vs nftables | vs reflector | limit |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        opts.rounds
    );
    for (setup, flows) in Setup::ALL
        .into_iter()
        .flat_map(|s| [(s, MANY_FLOWS), (s, FEW_FLOWS)])
    {
        let of = |kind: Kind| -> Vec<&Run> {
            runs.iter()
                .filter(|r| r.setup == setup && r.kind == kind && r.flows == flows)
                .collect()
        };
        let per_core =
            |rs: &[&Run]| -> Vec<f64> { rs.iter().map(|r| r.m.per_core_second() / 1e6).collect() };
        let baseline = median(per_core(&of(Kind::Nftables)));
        let floor = median(per_core(&of(Kind::Reflector)));
        let ratio_to = |pcm: f64, base: f64| {
            if base.is_finite() && base > 0.0 {
                format!("{:.2}×", pcm / base)
            } else {
                "–".to_owned()
            }
        };
        for kind in Kind::ALL {
            let rs = of(kind);
            if rs.is_empty() {
                continue;
            }
            let pc = per_core(&rs);
            let (lo, hi) = spread(&pc);
            let pcm = median(pc);
            let offered = median(rs.iter().map(|r| r.m.offered_per_s() / 1e6).collect());
            let fwd: Vec<f64> = rs.iter().map(|r| r.m.delivered_per_s() / 1e6).collect();
            let (flo, fhi) = spread(&fwd);
            let sent: u64 = rs.iter().map(|r| r.m.sent.sent + r.m.sent.refused).sum();
            let delivered: u64 = rs.iter().map(|r| r.m.delivered()).sum();
            let lost = 1.0 - delivered as f64 / sent.max(1) as f64;
            let into_lb: u64 = rs.iter().map(|r| r.m.into_lb_dropped).sum();
            let into_lb = into_lb as f64 / sent.max(1) as f64;
            let busy = median(rs.iter().map(|r| r.m.busy() * 100.0).collect());
            let sender_busy = median(rs.iter().map(|r| r.m.sender_side_busy() * 100.0).collect());
            let (ratio, to_floor) = (ratio_to(pcm, baseline), ratio_to(pcm, floor));
            let _ = writeln!(
                md,
                "| {} | {} | {flows} | {offered:.2} | {:.2} ({flo:.2}–{fhi:.2}) | {:.1} % ({:.1} %) | {sender_busy:.0} % | {busy:.0} % | \
                 **{pcm:.2}** ({lo:.2}–{hi:.2}) | {ratio} | {to_floor} | {} |",
                setup.key(),
                kind.name(),
                median(fwd.clone()),
                lost * 100.0,
                into_lb * 100.0,
                limit(&rs),
            );
        }
    }
    md.push_str(
        "\nMethod: one topology (client, lb, b1..b3 on a bridge, as the namespace tests), \
         the balancers set up in turn in the lb host; prebuilt 60-byte UDP frames to the \
         VIP sent by one real-time thread (AF_PACKET, PACKET_QDISC_BYPASS, sendmmsg of 64) \
         cycling over the flows' source ports. Setup e2e: sent from the client's eth0 \
         through the switch's bridge; the lb host forwards through the bridge to b1..b3, \
         whose XDP programs count and drop. Setup wire: sent from the switch's port facing \
         the lb (p-lb) straight into the lb's eth0, counted and dropped by that port's XDP \
         program (a generator and a sink cabled to the lb's NIC). The lb host's eth0 \
         receives in a threaded NAPI kernel thread (SCHED_FIFO) pinned to CPU 0: XDP for \
         lb; GRO, conntrack, NAT and forwarding for nftables. Everything else (the sender, \
         the switch's NAPI threads for p-client and p-lb with the bridge and the backends' \
         XDP behind them, the agent) runs on CPU 1. Forwarded = frames the sinks counted; \
         lost = offered minus forwarded (in brackets: refused by the lb host's full receive \
         queue); sender CPU busy = on-CPU time of the sending thread and the switch's NAPI \
         threads, lb core busy = the lb host's NAPI thread's (/proc/PID/schedstat), each \
         over the flood's wall time (the kernel's RT throttling caps a real-time thread at \
         95 %); forwarded per lb core-second = forwarded / the lb thread's on-CPU time. \
         The XDP_TX reflector (lb_reflect: swap the MACs, XDP_TX) is no balancer but this \
         bed's physical limit, measured in the same rounds: it sends every frame back out \
         of the lb's eth0, to the p-lb sink on the wire and through the bridge to a sink on \
         the client's eth0 end to end (as many bridge crossings as a forwarded frame); \
         vs nftables and vs reflector are ratios of the per-core medians in the same \
         setup and flow count. \
         Limit: the side over 90 % busy (`neither`: the machine's other work held both \
         back). Where the lb core is not the limit, its per-core figure includes the cost \
         of waking up for partial batches and is a lower bound of what a saturated core \
         forwards.\n",
    );
    md
}
