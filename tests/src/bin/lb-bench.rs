//! `cargo xtask bench`: nanoseconds per packet of the XDP balancer, each case next to a
//! minimal XDP_TX reflector (swap MACs) run on the same packets in the same run (the
//! floor), reported as a ratio.
//!
//! Method: BPF_PROG_TEST_RUN with `repeat = 1` (a rewriting program rerun on its own
//! output would measure something else), many calls, averaging the kernel-reported
//! duration — as katran_tester does. Program and floor alternate in blocks so drift
//! (frequency, other load) hits both alike. The maps are populated through the agent's
//! real publishing path (`Publisher` + `BpfDataplane`: Maglev tables via mmap + swap).

use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, bail};
use aya::programs::{ProgramError, TestRun, TestRunOptions, Xdp};
use lb_agent::{
    agent::{Agent, Environment, StaticNeighbors},
    config::ProbeConfig,
    dataplane::{BpfDataplane, Dataplane},
    probe::{ProbeOutcome, ProbeReport, Prober},
    publish::{DesiredBackend, DesiredService, NatSpec, Publisher, Role},
};
use lb_common::{IPPROTO_TCP, REFLECT_PROGRAM_NAME, counters};
use lb_tests::packet::{Frame, TCP_ACK, TCP_SYN};

/// Calls per block; blocks alternate program / floor.
const BLOCK: usize = 2_000;
/// Blocks per case and side.
const BLOCKS: usize = 10;
/// Distinct new flows available to the new-flow cases (one per call).
const NEW_FLOWS: usize = BLOCK * BLOCKS;

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;

struct Case {
    name: &'static str,
    packets: Vec<Vec<u8>>,
    expect: u32,
}

struct Measured {
    name: &'static str,
    program_ns: f64,
    floor_ns: f64,
}

fn main() -> anyhow::Result<()> {
    let out_dir = parse_out()?;
    let mut dp = BpfDataplane::load().context("loading the balancer (are you root?)")?;
    let mut publisher = Publisher::default();
    let (dsr_vip, nat_vip, snat) = publish(&mut publisher, &mut dp)?;
    // As when attached: the program compares destination MACs with the interface's.
    let frame_dst_mac = Frame::tcp(dsr_vip.ip(), 1, dsr_vip.ip(), 1, 0).dst_mac;
    dp.set_interface_mac(frame_dst_mac)?;

    let mut reflect_obj = aya::Ebpf::load(lb_agent::EBPF_OBJECT)?;
    let reflect: &mut Xdp = reflect_obj
        .program_mut(REFLECT_PROGRAM_NAME)
        .context("no reflector program")?
        .try_into()?;
    reflect.load()?;

    let client: IpAddr = "10.9.0.1".parse()?;
    let tcp = |src: IpAddr, sport: u16, dst: SocketAddr, flags: u8| {
        Frame::tcp(src, sport, dst.ip(), dst.port(), flags)
            .payload(&[0u8; 64])
            .bytes()
    };

    // Established flows: the first call creates the flow, the measured ones hit it.
    let est_dsr = tcp(client, 40_000, dsr_vip, TCP_ACK);
    let est_nat = tcp(client, 40_001, nat_vip, TCP_ACK);
    run_once(dp.program_mut()?, &est_dsr)?;
    run_once(dp.program_mut()?, &est_nat)?;

    // A nat reply: learn the allocated source port from a forwarded SYN.
    let syn = tcp(client, 40_002, nat_vip, TCP_SYN);
    let (action, fwd) = run_once(dp.program_mut()?, &syn)?;
    if action != XDP_TX {
        let c = dp.counters()?;
        let nonzero: Vec<String> = counters::NAMES
            .iter()
            .zip(c)
            .filter(|(_, v)| *v > 0)
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        bail!(
            "nat SYN was not forwarded (action {action}); counters: {}",
            nonzero.join(" ")
        );
    }
    let (backend, nat_port) = forwarded_to(&fwd)?;
    let reply = |flags: u8| {
        Frame::tcp(backend.ip(), backend.port(), snat, nat_port, flags)
            .payload(&[0u8; 64])
            .bytes()
    };

    let new_flows = |vip: SocketAddr, base: u8| -> Vec<Vec<u8>> {
        (0..NEW_FLOWS)
            .map(|i| {
                let src = IpAddr::from([10, base, (i >> 14) as u8, 1]);
                tcp(src, 1024 + (i & 0x3fff) as u16, vip, TCP_SYN)
            })
            .collect()
    };

    let cases = vec![
        Case {
            name: "established flow, dsr",
            packets: vec![est_dsr],
            expect: XDP_TX,
        },
        Case {
            name: "established flow, nat",
            packets: vec![est_nat],
            expect: XDP_TX,
        },
        Case {
            name: "new flow, dsr",
            packets: new_flows(dsr_vip, 20),
            expect: XDP_TX,
        },
        Case {
            name: "new flow, nat",
            packets: new_flows(nat_vip, 21),
            expect: XDP_TX,
        },
        Case {
            name: "nat reply",
            packets: vec![reply(TCP_SYN | TCP_ACK)],
            expect: XDP_TX,
        },
        // Diagnostic: the SYN-ACK above also looks the flow up for the handshake
        // signals; the rest of a connection's replies (ACK/data) do not.
        Case {
            name: "nat reply (ACK)",
            packets: vec![reply(TCP_ACK)],
            expect: XDP_TX,
        },
        Case {
            name: "VIP miss (passed)",
            packets: vec![tcp(client, 40_003, "10.9.9.9:80".parse()?, TCP_ACK)],
            expect: XDP_PASS,
        },
    ];

    let mut results = Vec::new();
    for case in &cases {
        let m = measure(case, &mut dp, reflect)?;
        println!(
            "{:<24} {:>7.1} ns/pkt   floor {:>6.1} ns/pkt   ratio {:.2}x",
            m.name,
            m.program_ns,
            m.floor_ns,
            m.program_ns / m.floor_ns
        );
        results.push(m);
    }
    let c = dp.counters()?;
    println!(
        "counters: tx_dsr {} tx_nat_forward {} tx_nat_reply {} flow_new {} flow_hit {} pass_not_vip {}",
        c[counters::TX_DSR as usize],
        c[counters::TX_NAT_FORWARD as usize],
        c[counters::TX_NAT_REPLY as usize],
        c[counters::FLOW_NEW as usize],
        c[counters::FLOW_HIT as usize],
        c[counters::PASS_NOT_VIP as usize],
    );
    let propagation = propagation_bench()?;
    write_report(&out_dir, &results, &propagation)?;
    Ok(())
}

/// Verdict -> maps written, through the real agent on the real maps: one nat service
/// with [`PROPAGATION_SERVERS`] servers; each round one server's probe fails and then
/// passes again (two transitions, two publishes).
const PROPAGATION_SERVERS: usize = 100;
const PROPAGATION_ROUNDS: usize = 500;

struct Propagation {
    samples: Vec<Duration>,
}

impl Propagation {
    fn quantile(&self, q: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        s[((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1]
    }
}

/// A prober that never answers: the benchmark feeds verdicts itself.
struct SilentProber;

impl Prober for SilentProber {
    fn probe(
        &self,
        _cfg: &ProbeConfig,
        _target: SocketAddr,
    ) -> impl Future<Output = ProbeOutcome> + Send {
        std::future::pending()
    }
}

fn propagation_bench() -> anyhow::Result<Propagation> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let mut text = String::from(
            "[[service]]\nname = \"web\"\nvip = \"10.9.4.100:80\"\nsnat_ip = \"10.9.4.2\"\n\
             [[service.probe]]\ntype = \"tcp\"\ninterval = \"1h\"\n",
        );
        for i in 0..PROPAGATION_SERVERS {
            text.push_str(&format!(
                "[[service.server]]\naddress = \"10.9.{}.{}:8080\"\n",
                5 + i / 250,
                1 + i % 250
            ));
        }
        let cfg = lb_agent::config::parse(&text, std::path::Path::new("bench.toml"))?;
        let dp = BpfDataplane::load()?;
        let neighbors = StaticNeighbors {
            default: Some([2, 0, 0, 0, 0, 9]),
            ..StaticNeighbors::default()
        };
        let (mut agent, _handles) = Agent::new(
            dp,
            Arc::new(SilentProber),
            Arc::new(neighbors),
            Environment::default(),
        );
        agent.apply_config(&cfg).await?;
        let mut samples = Vec::with_capacity(2 * PROPAGATION_ROUNDS);
        for round in 0..PROPAGATION_ROUNDS {
            let addr = cfg.services[0].servers[round % PROPAGATION_SERVERS].address.clone();
            let lb_agent::config::ServerAddress::Socket(addr) = addr else {
                bail!("bench servers are addresses");
            };
            for ok in [false, true] {
                let outcome = if ok {
                    ProbeOutcome::pass(Duration::from_millis(1), "bench")
                } else {
                    ProbeOutcome::fail(Duration::from_millis(1), "bench")
                };
                let report = ProbeReport {
                    server: agent
                        .server_key("web", addr)
                        .context("the bench server is configured")?,
                    probe: 0,
                    outcome,
                    at: tokio::time::Instant::now(),
                };
                let before = agent.propagation().count;
                let t = std::time::Instant::now();
                agent.on_probe_report(report)?;
                let spent = t.elapsed();
                if agent.propagation().count != before + 1 {
                    bail!("round {round}: the verdict did not reach the maps");
                }
                samples.push(spent);
            }
        }
        let h = agent.propagation();
        println!(
            "agent histogram (verdict -> maps written): count {} p50 <= {:?}s p99 <= {:?}s mean {:.1}us",
            h.count,
            h.quantile_bound(0.5),
            h.quantile_bound(0.99),
            h.sum / h.count as f64 * 1e6
        );
        let p = Propagation { samples };
        println!(
            "propagation, {PROPAGATION_SERVERS} servers, {} verdicts: p50 {:?}  p99 {:?}  max {:?}",
            p.samples.len(),
            p.quantile(0.5),
            p.quantile(0.99),
            p.quantile(1.0)
        );
        Ok(p)
    })
}

fn parse_out() -> anyhow::Result<PathBuf> {
    let mut args = std::env::args().skip(1);
    let mut out = PathBuf::from("target/bench");
    while let Some(a) = args.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(args.next().context("--out needs a directory")?),
            other => bail!("unknown argument {other}; usage: lb-bench [--out DIR]"),
        }
    }
    std::fs::create_dir_all(&out)?;
    Ok(out)
}

/// One dsr and one nat service, three backends each, through the real publisher.
fn publish(
    publisher: &mut Publisher,
    dp: &mut BpfDataplane,
) -> anyhow::Result<(SocketAddr, SocketAddr, IpAddr)> {
    let dsr_vip: SocketAddr = "10.9.1.100:80".parse()?;
    let nat_vip: SocketAddr = "10.9.1.101:80".parse()?;
    let snat: IpAddr = "10.9.1.2".parse()?;
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
    let services = [
        DesiredService {
            name: "dsr".into(),
            vip: dsr_vip,
            proto: IPPROTO_TCP,
            nat: None,
            backends: backends(80),
        },
        DesiredService {
            name: "nat".into(),
            vip: nat_vip,
            proto: IPPROTO_TCP,
            nat: Some(NatSpec {
                snat_ips: vec![snat],
                ports: 20_000..=59_999,
                source_rate: 0,
                source_burst: 1,
            }),
            backends: backends(8080),
        },
    ];
    let report = publisher.apply(&services, dp)?;
    println!(
        "published 2 services, 6 backends, {} tables in {:?}",
        report.tables_published, report.elapsed
    );
    Ok((dsr_vip, nat_vip, snat))
}

fn run_once(prog: &mut Xdp, packet: &[u8]) -> anyhow::Result<(u32, Vec<u8>)> {
    let mut out = vec![0u8; packet.len() + 256];
    let res = prog.test_run(TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        ..TestRunOptions::default()
    })?;
    out.truncate(res.data_size_out as usize);
    Ok((res.return_value, out))
}

fn timed(prog: &mut Xdp, packet: &[u8]) -> Result<(u32, Duration), ProgramError> {
    let res = prog.test_run(TestRunOptions {
        data_in: Some(packet),
        ..TestRunOptions::default()
    })?;
    Ok((res.return_value, res.duration))
}

fn measure(case: &Case, dp: &mut BpfDataplane, floor: &mut Xdp) -> anyhow::Result<Measured> {
    let mut program_total = Duration::ZERO;
    let mut floor_total = Duration::ZERO;
    let mut calls = 0usize;
    for block in 0..BLOCKS {
        for i in 0..BLOCK {
            let pkt = &case.packets[(block * BLOCK + i) % case.packets.len()];
            let (action, d) = timed(dp.program_mut()?, pkt)?;
            if action != case.expect {
                bail!(
                    "{}: expected action {} got {action} at call {}",
                    case.name,
                    case.expect,
                    block * BLOCK + i
                );
            }
            program_total += d;
            calls += 1;
        }
        for i in 0..BLOCK {
            let pkt = &case.packets[(block * BLOCK + i) % case.packets.len()];
            let (action, d) = timed(floor, pkt)?;
            if action != XDP_TX {
                bail!("reflector returned {action}");
            }
            floor_total += d;
        }
    }
    Ok(Measured {
        name: case.name,
        program_ns: program_total.as_nanos() as f64 / calls as f64,
        floor_ns: floor_total.as_nanos() as f64 / calls as f64,
    })
}

/// Destination (backend) and source port of a forwarded IPv4/TCP frame without VLAN.
fn forwarded_to(frame: &[u8]) -> anyhow::Result<(SocketAddr, u16)> {
    if frame.len() < 14 + 20 + 20 {
        bail!("forwarded frame too short");
    }
    let ip = &frame[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let dst = IpAddr::from([ip[16], ip[17], ip[18], ip[19]]);
    let l4 = &ip[ihl..];
    let sport = u16::from_be_bytes([l4[0], l4[1]]);
    let dport = u16::from_be_bytes([l4[2], l4[3]]);
    Ok((SocketAddr::new(dst, dport), sport))
}

fn write_report(
    dir: &std::path::Path,
    results: &[Measured],
    propagation: &Propagation,
) -> anyhow::Result<()> {
    let mut md =
        String::from("| case | lb ns/packet | floor ns/packet | ratio |\n|---|---:|---:|---:|\n");
    for m in results {
        let _ = writeln!(
            md,
            "| {} | {:.1} | {:.1} | {:.2}x |",
            m.name,
            m.program_ns,
            m.floor_ns,
            m.program_ns / m.floor_ns
        );
    }
    let _ = writeln!(
        md,
        "\nPropagation (verdict -> maps written), {PROPAGATION_SERVERS} servers, {} verdicts: \
         p50 {:?}, p99 {:?}, max {:?}",
        propagation.samples.len(),
        propagation.quantile(0.5),
        propagation.quantile(0.99),
        propagation.quantile(1.0)
    );
    std::fs::write(dir.join("xdp.md"), &md)?;
    println!("\nwritten {}", dir.join("xdp.md").display());
    Ok(())
}
