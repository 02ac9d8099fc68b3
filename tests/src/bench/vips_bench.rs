//! `lb-bench --xdp-only --vips 1,64,1000`: what the number of services costs per packet.
//!
//! One balancer is loaded per VIP count, each published through the agent's real path
//! (`Publisher` + `BpfDataplane`); the measured dsr and nat services have three backends
//! (their own 4,099-slot tables), the others one backend each on other VIPs. Each
//! round measures every case at every count in turn, a block of the balancer then a
//! block of the reflector on the same packets (BPF_PROG_TEST_RUN, repeat = 1, kernel
//! ns), so drift hits all counts and both sides alike (each round starts at another
//! count); the report gives, per case and
//! count, the median ratio to the reflector over the rounds and its spread (min–max).

use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use anyhow::{Context, bail};
use aya::programs::{TestRun, TestRunOptions, Xdp};
use lb_agent::{
    dataplane::BpfDataplane,
    publish::{DesiredBackend, DesiredService, NatSpec, Publisher, Role},
};
use lb_common::IPPROTO_TCP;

use crate::traffic::packet::{Frame, TCP_ACK, TCP_SYN};

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

/// Calls per block (one block of the balancer, one of the reflector, per case, count
/// and round).
pub const BLOCK: usize = 2_000;

const DSR_VIP: &str = "10.9.1.100:80";
const NAT_VIP: &str = "10.9.1.101:80";
const SNATS: [&str; 4] = ["10.9.1.2", "10.9.1.3", "10.9.1.4", "10.9.1.5"];

/// One case at one VIP count: its packets and the action each must get.
struct Case {
    name: &'static str,
    expect: u32,
    /// Packet of call `i` (new-flow cases: a new 5-tuple every call).
    packet: Box<dyn Fn(usize) -> Vec<u8>>,
}

/// The cases measured at every count (nat ones only where a nat service exists).
const CASES: [&str; 5] = [
    "established flow, dsr",
    "established flow, nat",
    "new flow, dsr",
    "new flow, nat",
    "VIP miss (passed)",
];

/// A loaded balancer with `vips` services published.
struct Setup {
    vips: usize,
    dp: BpfDataplane,
    cases: Vec<Case>,
    /// Calls made per case so far (new flows keep coming).
    calls: Vec<usize>,
}

/// Runs the comparison for each count in `counts` over `rounds` rounds; prints the
/// table and returns it (markdown).
pub fn run(counts: &[usize], rounds: usize) -> anyhow::Result<String> {
    let mut reflect_obj = aya::Ebpf::load(crate::bpf::lab::OBJECT)?;
    let reflect: &mut Xdp = reflect_obj
        .program_mut(crate::bpf::lab::REFLECT_PROGRAM)
        .context("no reflector program")?
        .try_into()?;
    reflect.load()?;
    let mut setups = Vec::new();
    for &vips in counts {
        setups.push(setup(vips).with_context(|| format!("publishing {vips} services"))?);
        println!("{vips} services published");
    }
    // ratios[setup][case] = one ratio per round; ns likewise (balancer, reflector).
    let mut ratios = vec![vec![Vec::new(); CASES.len()]; setups.len()];
    let mut ns = vec![vec![Vec::new(); CASES.len()]; setups.len()];
    let n = setups.len();
    for round in 0..rounds {
        // Each round starts at another count: none always follows the same one.
        for s in (0..n).map(|k| (round + k) % n) {
            let setup = &mut setups[s];
            for c in 0..setup.cases.len() {
                let (prog, floor) = block(setup, c, reflect)?;
                let at = CASES
                    .iter()
                    .position(|n| *n == setup.cases[c].name)
                    .expect("a known case");
                ratios[s][at].push(prog / floor);
                ns[s][at].push((prog, floor));
            }
        }
    }
    let mut md = format!(
        "VIP count, {rounds} rounds of {BLOCK} calls per case and side; ratio to the \
         reflector: median (min–max over rounds); ns: medians\n\n\
         | case | VIPs | ratio | spread | lb ns | reflector ns |\n|---|---:|---:|---:|---:|---:|\n"
    );
    for (c, name) in CASES.iter().enumerate() {
        for (s, setup) in setups.iter().enumerate() {
            let r = &ratios[s][c];
            if r.is_empty() {
                let _ = writeln!(md, "| {name} | {} | – | – | – | – |", setup.vips);
                continue;
            }
            let prog: Vec<f64> = ns[s][c].iter().map(|p| p.0).collect();
            let floor: Vec<f64> = ns[s][c].iter().map(|p| p.1).collect();
            let _ = writeln!(
                md,
                "| {name} | {} | {:.2}× | {:.2}–{:.2} | {:.0} | {:.0} |",
                setup.vips,
                median(r),
                min(r),
                max(r),
                median(&prog),
                median(&floor)
            );
        }
    }
    println!("{md}");
    Ok(md)
}

/// One block of case `c` on the balancer, then one on the reflector: mean ns per call.
fn block(setup: &mut Setup, c: usize, reflect: &mut Xdp) -> anyhow::Result<(f64, f64)> {
    let first = setup.calls[c];
    setup.calls[c] += BLOCK;
    let case = &setup.cases[c];
    let packets: Vec<Vec<u8>> = (first..first + BLOCK).map(|i| (case.packet)(i)).collect();
    let prog = setup.dp.program_mut()?;
    let mut total = Duration::ZERO;
    for (i, p) in packets.iter().enumerate() {
        let (action, d) = timed(prog, p)?;
        if action != case.expect {
            bail!(
                "{} at {} VIPs: expected action {} got {action} at call {}",
                case.name,
                setup.vips,
                case.expect,
                first + i
            );
        }
        total += d;
    }
    let mut floor = Duration::ZERO;
    for p in &packets {
        let (action, d) = timed(reflect, p)?;
        if action != XDP_TX {
            bail!("reflector returned {action}");
        }
        floor += d;
    }
    let per = |d: Duration| d.as_nanos() as f64 / BLOCK as f64;
    Ok((per(total), per(floor)))
}

fn timed(prog: &mut Xdp, packet: &[u8]) -> anyhow::Result<(u32, Duration)> {
    let res = prog.test_run(TestRunOptions {
        data_in: Some(packet),
        ..TestRunOptions::default()
    })?;
    Ok((res.return_value, res.duration))
}

fn run_once(prog: &mut Xdp, packet: &[u8]) -> anyhow::Result<u32> {
    let mut out = vec![0u8; packet.len() + 256];
    let res = prog.test_run(TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        ..TestRunOptions::default()
    })?;
    Ok(res.return_value)
}

fn tcp(src: IpAddr, sport: u16, dst: SocketAddr, flags: u8) -> Vec<u8> {
    Frame::tcp(src, sport, dst.ip(), dst.port(), flags)
        .payload(&[0u8; 64])
        .bytes()
}

/// A balancer with `vips` services: the dsr one, the nat one (from 2 on), the rest
/// one-backend dsr services on other VIPs; established flows opened.
fn setup(vips: usize) -> anyhow::Result<Setup> {
    if !(1..=lb_common::MAX_SERVICES as usize).contains(&vips) {
        bail!("a VIP count must be 1..={}", lb_common::MAX_SERVICES);
    }
    let dsr: SocketAddr = DSR_VIP.parse()?;
    let nat: SocketAddr = NAT_VIP.parse()?;
    let mut dp = BpfDataplane::load().context("loading the balancer (are you root?)")?;
    let mut publisher = Publisher::default();
    publisher.apply(&services(vips)?, &mut dp)?;
    dp.set_interface_mac(Frame::tcp(dsr.ip(), 1, dsr.ip(), 1, 0).dst_mac)?;

    let client: IpAddr = "10.9.0.1".parse()?;
    let est_dsr = tcp(client, 40_000, dsr, TCP_ACK);
    let est_nat = tcp(client, 40_001, nat, TCP_ACK);
    let mut cases = vec![Case {
        name: CASES[0],
        expect: XDP_TX,
        packet: Box::new(move |_| est_dsr.clone()),
    }];
    if vips >= 2 {
        cases.push(Case {
            name: CASES[1],
            expect: XDP_TX,
            packet: Box::new(move |_| est_nat.clone()),
        });
    }
    let new_flows = move |vip: SocketAddr, base: u8| -> Box<dyn Fn(usize) -> Vec<u8>> {
        Box::new(move |i| {
            let src = IpAddr::from([10, base, (i >> 14) as u8, 1]);
            tcp(src, 1024 + (i & 0x3fff) as u16, vip, TCP_SYN)
        })
    };
    cases.push(Case {
        name: CASES[2],
        expect: XDP_TX,
        packet: new_flows(dsr, 20),
    });
    if vips >= 2 {
        cases.push(Case {
            name: CASES[3],
            expect: XDP_TX,
            packet: new_flows(nat, 21),
        });
    }
    let miss = tcp(client, 40_003, "10.9.9.9:80".parse()?, TCP_ACK);
    cases.push(Case {
        name: CASES[4],
        expect: XDP_PASS,
        packet: Box::new(move |_| miss.clone()),
    });
    // Open the established flows (their first packet creates them).
    for case in cases.iter().filter(|c| c.name.starts_with("established")) {
        let action = run_once(dp.program_mut()?, &(case.packet)(0))?;
        if action != XDP_TX {
            bail!("{}: opening packet got action {action}", case.name);
        }
    }
    let calls = vec![0; cases.len()];
    Ok(Setup {
        vips,
        dp,
        cases,
        calls,
    })
}

/// The services of a `vips`-service setup.
fn services(vips: usize) -> anyhow::Result<Vec<DesiredService>> {
    let backends = |port: u16| -> Vec<DesiredBackend> {
        (1..=3u8)
            .map(|i| DesiredBackend {
                addr: SocketAddr::new(IpAddr::from([10, 9, 2, i]), port),
                weight: 1,
                mac: Some([2, 0, 0, 0, 2, i]),
                role: Role::Active,
            })
            .collect()
    };
    let mut out = vec![DesiredService {
        name: "dsr".into(),
        vip: DSR_VIP.parse()?,
        proto: IPPROTO_TCP,
        tunnel: None,
        nat: None,
        backends: backends(80),
        maglev_size: None,
    }];
    if vips >= 2 {
        out.push(DesiredService {
            name: "nat".into(),
            vip: NAT_VIP.parse()?,
            proto: IPPROTO_TCP,
            tunnel: None,
            nat: Some(NatSpec {
                // Four source addresses: rounds x BLOCK new nat flows (82,000 at 41
                // rounds) stay far from running out of ports.
                snat_ips: SNATS.iter().map(|a| a.parse()).collect::<Result<_, _>>()?,
                ports: 20_000..=59_999,
                source_rate: 0,
                source_burst: 1,
            }),
            backends: backends(8080),
            maglev_size: None,
        });
    }
    for i in 0..vips.saturating_sub(2) {
        let (hi, lo) = ((i / 200) as u8, (i % 200) as u8 + 1);
        out.push(DesiredService {
            name: format!("extra{i}"),
            vip: SocketAddr::new(IpAddr::from([10, 8, hi, lo]), 443),
            proto: IPPROTO_TCP,
            tunnel: None,
            nat: None,
            backends: vec![DesiredBackend {
                addr: SocketAddr::new(IpAddr::from([10, 7, hi, lo]), 443),
                weight: 1,
                mac: Some([2, 0, 0, 7, hi, lo]),
                role: Role::Active,
            }],
            maglev_size: None,
        });
    }
    Ok(out)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn min(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setups_services_are_distinct_and_within_the_limits() {
        for vips in [1, 2, 64, 1000, lb_common::MAX_SERVICES as usize] {
            let s = services(vips).unwrap();
            assert_eq!(s.len(), vips);
            let mut keys: Vec<SocketAddr> = s.iter().map(|d| d.vip).collect();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), vips, "distinct VIPs");
        }
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
