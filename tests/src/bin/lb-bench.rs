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
    agent::{Agent, Environment, StaticNeighbours},
    api::{AdminChange, AdminRequest, NewServer, ServerPatch},
    config::ProbeConfig,
    dataplane::attach::tunnel::TunnelConfig,
    dataplane::{BpfDataplane, Dataplane, MapSizes},
    probe::{ProbeOutcome, ProbeReport, Prober},
    publish::{DesiredBackend, DesiredService, NatSpec, Publisher, Role, Tunnel},
};
use lb_common::{IPPROTO_TCP, counters};
use lb_tests::traffic::packet::{Frame, TCP_ACK, TCP_SYN};

/// Calls per block; blocks alternate program / floor.
const BLOCK: usize = 2_000;
/// Blocks per case and side.
const BLOCKS: usize = 10;
/// Distinct new flows available to the new-flow cases (one per call).
const NEW_FLOWS: usize = BLOCK * BLOCKS;

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
/// Passes of the table fill (`--flows`, `--full-table`): an ACK's flow is confirmed by
/// the next pass's ACK, a flow displaced before that opened again.
const FILL_PASSES: usize = 3;
/// More than the second after which a packet of an unproven flow confirms it.
const PROOF_WAIT: Duration = Duration::from_millis(1_100);

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
    let args = parse_args()?;
    if args.propagation_only {
        propagation_bench(&args.scale)?;
        return Ok(());
    }
    let out_dir = args.out;
    if let Some(counts) = &args.vip_counts {
        // `--vips 1,64,1000`: the cost of the VIP count, the counts side by side.
        lb_tests::bench::cpu::pin_self(0).context("pinning to CPU 0")?;
        let _spinner = args.busy.then(Spinner::start);
        let md = lb_tests::bench::vips_bench::run(counts, args.vip_rounds)?;
        std::fs::write(out_dir.join("vips.md"), md)?;
        println!("written {}", out_dir.join("vips.md").display());
        return Ok(());
    }
    // One CPU: the per-CPU structures (flow cache, clock) behave as under RSS.
    lb_tests::bench::cpu::pin_self(0).context("pinning to CPU 0")?;
    let _spinner = args.busy.then(Spinner::start);
    // Tables sized for `--flows N` (fresh seeds, as a first start), else the compiled size.
    let sizes = match args.flows {
        Some(n) => {
            let (flow, nat) = lb_agent::dataplane::sizing::random_seeds()?;
            MapSizes::default()
                .with_flows(n)
                .context("--flows: 1024..=16777216")?
                .with_seeds(flow, nat)
        }
        None => MapSizes::default(),
    };
    let sizes = if args.cluster {
        sizes.with_cluster()
    } else {
        sizes
    };
    let mut dp = BpfDataplane::load_sized(None, None, sizes)
        .context("loading the balancer (are you root?)")?;
    let mut publisher = Publisher::default();
    let (dsr_vip, nat_vip, snat) = publish(&mut publisher, &mut dp, args.vips)?;
    // As when attached: the program compares destination MACs with the interface's,
    // and the ipip service needs an outer source (and the MTU).
    let frame_dst_mac = Frame::tcp(dsr_vip.ip(), 1, dsr_vip.ip(), 1, 0).dst_mac;
    dp.set_interface_mac(frame_dst_mac)?;
    dp.set_tunnel(&TunnelConfig {
        mtu: 1500,
        src4: Some("10.9.1.2".parse()?),
        src6: None,
    })?;
    // Native mode: the program checks each packet for a partial checksum (these carry
    // full ones, so it measures the check a NIC's packets pay).
    dp.set_native(args.native)?;

    let mut reflect_obj = aya::Ebpf::load(lb_tests::bpf::lab::OBJECT)?;
    let reflect: &mut Xdp = reflect_obj
        .program_mut(lb_tests::bpf::lab::REFLECT_PROGRAM)
        .context("no reflector program")?
        .try_into()?;
    reflect.load()?;

    let client: IpAddr = "10.9.0.1".parse()?;
    let tcp = |src: IpAddr, sport: u16, dst: SocketAddr, flags: u8| {
        Frame::tcp(src, sport, dst.ip(), dst.port(), flags)
            .payload(&[0u8; 64])
            .bytes()
    };
    let fill = match args.flows {
        Some(_) => Some(sizes.max_flows() as usize),
        None if args.full_table => Some(lb_common::FLOW_TABLE_SIZE as usize),
        None => None,
    };
    if let Some(fill) = fill {
        // Live (established) flows from other clients, as many as the table is sized
        // for: each opened by an ACK, unconfirmed (at most two of a bucket at a time),
        // and confirmed by its next ACK more than a second later; a flow displaced
        // before that is opened again by the next pass.
        let started = std::time::Instant::now();
        for pass in 0..FILL_PASSES {
            if pass > 0 {
                std::thread::sleep(PROOF_WAIT);
            }
            for i in 0..fill {
                let src = IpAddr::from([10, 30 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
                let frame = tcp(src, 5000, dsr_vip, TCP_ACK);
                let (action, _) = run_once(dp.program_mut()?, &frame)?;
                if action != XDP_TX {
                    bail!("filling the flow table: action {action}");
                }
            }
        }
        let filled_in = started.elapsed();
        // A nat SYN whose bucket holds four flows takes the way of one silent for 10 s
        // (else it is refused, `drop_flows_full`): the filled flows fall silent first,
        // so that every measured nat SYN is forwarded.
        std::thread::sleep(Duration::from_secs(11));
        let m = sizes.table_memory();
        println!(
            "flow table ({} buckets of 4 ways, {} flows) filled with {fill} flows in {:.1?}; \
             LB_FLOWS {} B, LB_NAT {} B, LB_SOURCES {} B: {} B per flow it is sized for",
            sizes.tables().flow_buckets,
            sizes.max_flows(),
            filled_in,
            m.flows,
            m.nat,
            m.sources,
            m.total() / u64::from(sizes.max_flows())
        );
    }

    // Established flows, confirmed before they are measured: dsr and ipip by a second
    // packet more than a second after the first, nat by its handshake (the client's
    // SYN, the backend's SYN-ACK, the client's ACK).
    let est_dsr = tcp(client, 40_000, dsr_vip, TCP_ACK);
    let est_nat = tcp(client, 40_001, nat_vip, TCP_ACK);
    let est_ipip = tcp(client, 40_004, IPIP_VIP.parse()?, TCP_ACK);
    run_once(dp.program_mut()?, &est_dsr)?;
    run_once(dp.program_mut()?, &est_ipip)?;
    // A backend's segment to the nat flow it was forwarded as (`fwd`).
    let backend_reply = |fwd: &[u8], flags: u8| -> anyhow::Result<Vec<u8>> {
        let (backend, nat_port) = forwarded_to(fwd)?;
        Ok(
            Frame::tcp(backend.ip(), backend.port(), snat, nat_port, flags)
                .payload(&[0u8; 64])
                .bytes(),
        )
    };
    let (_, fwd) = run_once(dp.program_mut()?, &tcp(client, 40_001, nat_vip, TCP_SYN))?;
    run_once(dp.program_mut()?, &backend_reply(&fwd, TCP_SYN | TCP_ACK)?)?;
    std::thread::sleep(PROOF_WAIT);
    for est in [&est_dsr, &est_nat, &est_ipip] {
        let (action, _) = run_once(dp.program_mut()?, est)?;
        if action != XDP_TX {
            bail!("confirming an established flow: action {action}");
        }
    }

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
    let reply = |flags: u8| backend_reply(&fwd, flags);

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
            name: "established flow, ipip",
            packets: vec![est_ipip],
            expect: XDP_TX,
        },
        Case {
            name: "new flow, dsr",
            packets: new_flows(dsr_vip, 20),
            expect: XDP_TX,
        },
        Case {
            name: "new flow, ipip",
            packets: new_flows(IPIP_VIP.parse()?, 22),
            expect: XDP_TX,
        },
        Case {
            name: "new flow, nat",
            packets: new_flows(nat_vip, 21),
            expect: XDP_TX,
        },
        Case {
            name: "nat reply",
            packets: vec![reply(TCP_SYN | TCP_ACK)?],
            expect: XDP_TX,
        },
        // The SYN-ACK above reads the handshake state kept in the reverse entry
        // (docs/passive-signals.md); the rest of a connection's replies do not.
        Case {
            name: "nat reply (ACK)",
            packets: vec![reply(TCP_ACK)?],
            expect: XDP_TX,
        },
        Case {
            name: "VIP miss (passed)",
            packets: vec![tcp(client, 40_003, "10.9.9.9:80".parse()?, TCP_ACK)],
            expect: XDP_PASS,
        },
    ];

    // Native mode: segments as a veth peer with TX checksum offload sends them (a
    // partial checksum the program completes), at a full MSS.
    let mut cases = cases;
    if args.native {
        let mss = |sport: u16, vip: SocketAddr| {
            Frame::tcp(client, sport, vip.ip(), vip.port(), TCP_ACK).payload(&[0x5a; 1460])
        };
        cases.extend([
            Case {
                name: "est. dsr, partial 1460",
                packets: vec![mss(40_000, dsr_vip).partial_checksum_bytes()],
                expect: XDP_TX,
            },
            Case {
                name: "est. nat, partial 1460",
                packets: vec![mss(40_001, nat_vip).partial_checksum_bytes()],
                expect: XDP_TX,
            },
            Case {
                name: "est. dsr, full 1460",
                packets: vec![mss(40_000, dsr_vip).bytes()],
                expect: XDP_TX,
            },
        ]);
    }

    let mut results = Vec::new();
    for case in &cases {
        let m = measure(case, &mut dp, reflect, args.whole)?;
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
        "counters: tx_dsr {} tx_tunnel {} tx_nat_forward {} tx_nat_reply {} flow_new {} flow_hit {} pass_not_vip {}",
        c[counters::TX_DSR as usize],
        c[counters::TX_TUNNEL as usize],
        c[counters::TX_NAT_FORWARD as usize],
        c[counters::TX_NAT_REPLY as usize],
        c[counters::FLOW_NEW as usize],
        c[counters::FLOW_HIT as usize],
        c[counters::PASS_NOT_VIP as usize],
    );
    if args.xdp_only {
        return Ok(());
    }
    let propagation = propagation_bench(&args.scale)?;
    write_report(&out_dir, &results, &propagation)?;
    Ok(())
}

/// A thread spinning on CPU 1 until dropped: the other CPU busy.
struct Spinner {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    fn start() -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let _ = lb_tests::bench::cpu::pin_self(1);
            let mut x = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Verdict -> maps written, through the real agent on the real maps: `servers` nat
/// servers spread over `services` services; each round one server's probe fails and
/// then passes again (two transitions, two publishes), rotating over every service.
/// Then admin changes: a server added to the first service, its weight changed, and
/// removed again.
struct Scale {
    servers: usize,
    services: usize,
    rounds: usize,
    admin_rounds: usize,
}

impl Default for Scale {
    fn default() -> Self {
        Self {
            servers: 100,
            services: 1,
            rounds: 500,
            admin_rounds: 10,
        }
    }
}

struct Propagation {
    scale_servers: usize,
    scale_services: usize,
    samples: Vec<Duration>,
    /// The machine's floor for the same number of samples: the live-table failover pass
    /// alone (pure CPU, no agent, no syscall), what every table-changing verdict pays.
    /// Its spread is scheduling noise, not the agent.
    floor: Vec<Duration>,
    /// Admin add/weight/remove: until the maps are written (the agent's propagation
    /// histogram) and until the request is answered (the snapshot is left to the next read).
    admin_maps: Vec<Duration>,
    admin_answered: Vec<Duration>,
    /// A weighted Maglev build of the first service's home table alone (median of 3).
    maglev_build: Duration,
}

fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut s = samples.to_vec();
    s.sort();
    s[((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1]
}

impl Propagation {
    fn quantile(&self, q: f64) -> Duration {
        quantile(&self.samples, q)
    }

    fn line(&self) -> String {
        format!(
            "propagation, {} servers in {} services, {} verdicts: p50 {:?}  p99 {:?}  max {:?}; \
             floor (failover pass alone) p50 {:?} p99 {:?}; \
             admin add/weight/remove ({}): maps p50 {:?} max {:?}, answered p50 {:?} max {:?}; \
             maglev build {:?}",
            self.scale_servers,
            self.scale_services,
            self.samples.len(),
            self.quantile(0.5),
            self.quantile(0.99),
            self.quantile(1.0),
            quantile(&self.floor, 0.5),
            quantile(&self.floor, 0.99),
            self.admin_maps.len(),
            quantile(&self.admin_maps, 0.5),
            quantile(&self.admin_maps, 1.0),
            quantile(&self.admin_answered, 0.5),
            quantile(&self.admin_answered, 1.0),
            self.maglev_build,
        )
    }

    /// The report's table: header and one row (µs for verdicts, ms for admin changes).
    fn table(&self) -> String {
        let us = |d: Duration| format!("{:.0} µs", d.as_secs_f64() * 1e6);
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        format!(
            "| servers | services | p50 | p99 | max | floor p50 / p99 | admin → maps p50 (max) \
             | answered p50 | Maglev build |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
             | {} | {} | {} | {} | {} | {} / {} | {} ({}) | {} | {} |",
            self.scale_servers,
            self.scale_services,
            us(self.quantile(0.5)),
            us(self.quantile(0.99)),
            us(self.quantile(1.0)),
            us(quantile(&self.floor, 0.5)),
            us(quantile(&self.floor, 0.99)),
            ms(quantile(&self.admin_maps, 0.5)),
            ms(quantile(&self.admin_maps, 1.0)),
            ms(quantile(&self.admin_answered, 0.5)),
            ms(self.maglev_build),
        )
    }
}

/// Untimed pause before each verdict. The data plane does not rewrite a table within
/// 100 µs of its last flip (`GRACE` in lb-agent's `dataplane/tables/maglev_table.rs`: packets
/// that read the old generation must be done with it) and spins out the rest of that
/// time; verdicts fed back to back to one service would measure that spin, not the
/// agent. Real verdicts about one service are rarely that close, and a burst of them is
/// one batch, one publish.
const VERDICT_GAP: Duration = Duration::from_micros(250);

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

/// The configuration: `servers` servers over `services` nat services (round robin).
fn scale_config(scale: &Scale) -> String {
    let mut text = String::new();
    for s in 0..scale.services {
        text.push_str(&format!(
            "[[service]]\nname = \"web{s}\"\nvip = \"10.8.{}.{}:80\"\nsnat_ip = \"10.7.0.2\"\n\
             [[service.probe]]\ntype = \"tcp\"\ninterval = \"1h\"\n",
            s / 250,
            1 + s % 250
        ));
        for i in (s..scale.servers).step_by(scale.services) {
            text.push_str(&format!(
                "[[service.server]]\naddress = \"10.{}.{}.{}:8080\"\n",
                10 + i / 62_500,
                (i / 250) % 250,
                1 + i % 250
            ));
        }
    }
    text
}

fn propagation_bench(scale: &Scale) -> anyhow::Result<Propagation> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let cfg = lb_agent::config::parse(&scale_config(scale), std::path::Path::new("bench.toml"))?;
        let dp = BpfDataplane::load()?;
        let neighbours = StaticNeighbours {
            default: Some([2, 0, 0, 0, 0, 9]),
            ..StaticNeighbours::default()
        };
        let (mut agent, _handles) = Agent::new(
            dp,
            Arc::new(SilentProber),
            Arc::new(neighbours),
            Environment::default(),
        );
        let t = std::time::Instant::now();
        agent.apply_config(&cfg).await?;
        println!("configuration applied in {:?}", t.elapsed());
        let mut samples = Vec::with_capacity(2 * scale.rounds);
        for round in 0..scale.rounds {
            let svc = &cfg.services[round % cfg.services.len()];
            let addr = svc.servers[(round / cfg.services.len()) % svc.servers.len()]
                .address
                .clone();
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
                        .server_key(&svc.name, addr)
                        .context("the bench server is configured")?,
                    probe: 0,
                    outcome,
                    at: tokio::time::Instant::now(),
                };
                let before = agent.propagation().count;
                std::thread::sleep(VERDICT_GAP);
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

        let (floor, maglev_build) = floor_and_build(&cfg, samples.len())?;

        let mut admin_maps = Vec::new();
        let mut admin_answered = Vec::new();
        let service = cfg.services[0].name.clone();
        for round in 0..scale.admin_rounds {
            let address: SocketAddr = format!("10.200.0.{}:8080", 1 + round % 250).parse()?;
            for change in [
                AdminChange::Add(NewServer {
                    address,
                    weight: 1,
                    spare: false,
                    backup: 0,
                }),
                AdminChange::Patch(ServerPatch {
                    weight: Some(2),
                    ..ServerPatch::default()
                }),
                AdminChange::Remove,
            ] {
                let (reply, answer) = tokio::sync::oneshot::channel();
                let (count, sum) = (agent.propagation().count, agent.propagation().sum);
                let t = std::time::Instant::now();
                agent
                    .on_admin(AdminRequest {
                        service: service.clone(),
                        address: address.to_string(),
                        change,
                        reply,
                    })
                    .await;
                admin_answered.push(t.elapsed());
                answer.await?.map_err(|e| anyhow::anyhow!("admin change refused: {e}"))?;
                if agent.propagation().count != count + 1 {
                    bail!("admin round {round}: the change did not reach the maps");
                }
                admin_maps.push(Duration::from_secs_f64(agent.propagation().sum - sum));
            }
        }
        let p = Propagation {
            scale_servers: scale.servers,
            scale_services: scale.services,
            samples,
            floor,
            admin_maps,
            admin_answered,
            maglev_build,
        };
        println!("{}", p.line());
        println!("{}", p.table());
        Ok(p)
    })
}

/// The first service's home table built as the publisher builds it (weighted Maglev over
/// every server, at the service's own table size), timed (median of 3); then `n` failover
/// passes over a 65,537-slot table of the same servers, each with one server out in turn,
/// timed one by one: the floor of a table-changing verdict before per-slot rewrites, kept
/// as a yardstick.
fn floor_and_build(
    cfg: &lb_agent::config::Config,
    n: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    use lb_agent::maglev::{MaglevBackend, build_table, failover_table, stable_key};
    let mut members = Vec::new();
    for (i, server) in cfg.services[0].servers.iter().enumerate() {
        let lb_agent::config::ServerAddress::Socket(addr) = server.address.clone() else {
            bail!("bench servers are addresses");
        };
        members.push(MaglevBackend {
            id: i as u32 + 1,
            key: stable_key(&addr),
            weight: 1,
        });
    }
    let size = lb_common::maglev_size_for(u32::try_from(members.len())?);
    let mut builds = Vec::new();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        std::hint::black_box(build_table(&members, size));
        builds.push(t.elapsed());
    }
    let home = build_table(&members, lb_common::MAGLEV_RING_SIZE);
    let floor = (0..n)
        .map(|i| {
            let out = (i % members.len()) as u32 + 1;
            let t = std::time::Instant::now();
            let live = failover_table(&home, |id| id != out);
            let spent = t.elapsed();
            std::hint::black_box(live);
            spent
        })
        .collect();
    Ok((floor, quantile(&builds, 0.5)))
}

struct Args {
    out: PathBuf,
    /// Only the verdict -> maps benchmark (skips the XDP ns/packet cases).
    propagation_only: bool,
    /// Only the XDP ns/packet cases (skips the verdict -> maps benchmark).
    xdp_only: bool,
    /// Services published (at least the dsr and nat ones measured; the others are
    /// dsr services on other VIPs, so the VIP index holds this many keys).
    vips: usize,
    /// `--vips A,B,...` (more than one count): compare those VIP counts instead
    /// (`lb_tests::bench::vips_bench`), over `vip_rounds` rounds (`--rounds`, default 15).
    vip_counts: Option<Vec<usize>>,
    vip_rounds: usize,
    /// Fill the flow table (`FLOW_TABLE_SIZE` live flows) before measuring.
    full_table: bool,
    /// `--flows N`: tables sized for N flows (`agent.max_flows`), filled with that many
    /// live flows before measuring.
    flows: Option<u32>,
    /// Keep the other CPU busy (a spinning thread pinned to CPU 1) while measuring;
    /// the benchmark itself runs on CPU 0.
    busy: bool,
    /// Measure `lb_xdp_full` run directly (the whole path as one program) instead of
    /// `lb_xdp` with its tail call: the hand-over's price in place.
    whole: bool,
    /// `--cluster`: the program loaded in cluster mode (peer tables empty: every case
    /// takes the paths a node without peers' connections takes).
    cluster: bool,
    /// `--native`: the program told it runs in native mode, as when attached so.
    native: bool,
    scale: Scale,
}

fn parse_args() -> anyhow::Result<Args> {
    const USAGE: &str = "usage: lb-bench [--out DIR] [--propagation-only | --xdp-only] \
                         [--vips N | --vips N,N,...] [--full-table | --flows N] [--busy] [--whole] [--cluster] [--native] [--servers N] \
                         [--services N] [--rounds N] [--admin-rounds N]";
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        out: PathBuf::from("target/bench"),
        propagation_only: false,
        xdp_only: false,
        vips: 2,
        vip_counts: None,
        vip_rounds: 15,
        full_table: false,
        flows: None,
        busy: false,
        whole: false,
        cluster: false,
        native: false,
        scale: Scale::default(),
    };
    while let Some(a) = args.next() {
        let mut number = |what: &str| -> anyhow::Result<usize> {
            let n: usize = args
                .next()
                .with_context(|| format!("{what} needs a number; {USAGE}"))?
                .parse()
                .with_context(|| format!("{what} needs a number; {USAGE}"))?;
            if n == 0 {
                bail!("{what} must be at least 1");
            }
            Ok(n)
        };
        match a.as_str() {
            "--out" => parsed.out = PathBuf::from(args.next().context("--out needs a directory")?),
            "--propagation-only" => parsed.propagation_only = true,
            "--xdp-only" => parsed.xdp_only = true,
            "--vips" => {
                let list = args.next().context("--vips needs a number or a list")?;
                let counts = list
                    .split(',')
                    .map(|n| n.trim().parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| format!("--vips {list}: numbers separated by commas"))?;
                match counts.as_slice() {
                    [one] => parsed.vips = *one,
                    _ => parsed.vip_counts = Some(counts),
                }
            }
            "--full-table" => parsed.full_table = true,
            "--flows" => parsed.flows = Some(number("--flows")? as u32),
            "--busy" => parsed.busy = true,
            "--whole" => parsed.whole = true,
            "--cluster" => parsed.cluster = true,
            "--native" => parsed.native = true,
            "--servers" => parsed.scale.servers = number("--servers")?,
            "--services" => parsed.scale.services = number("--services")?,
            "--rounds" => {
                parsed.scale.rounds = number("--rounds")?;
                parsed.vip_rounds = parsed.scale.rounds;
            }
            "--admin-rounds" => parsed.scale.admin_rounds = number("--admin-rounds")?,
            other => bail!("unknown argument {other}; {USAGE}"),
        }
    }
    if parsed.scale.services > parsed.scale.servers {
        bail!("every service needs a server: --services must not exceed --servers");
    }
    if parsed.scale.services > 250 * 250 || parsed.scale.servers > 10 * 62_500 {
        bail!("at most 62,500 services and 625,000 servers");
    }
    if let Some(counts) = &parsed.vip_counts
        && counts
            .iter()
            .any(|n| !(1..=lb_common::MAX_SERVICES as usize).contains(n))
    {
        bail!("--vips counts must be 1..={}", lb_common::MAX_SERVICES);
    }
    if !(2..=lb_common::MAX_SERVICES as usize).contains(&parsed.vips) {
        bail!("--vips must be 2..={}", lb_common::MAX_SERVICES);
    }
    std::fs::create_dir_all(&parsed.out)?;
    Ok(parsed)
}

/// The ipip service's VIP (published besides the `--vips` count's services).
const IPIP_VIP: &str = "10.9.1.102:80";

/// One dsr, one nat and one ipip service, three backends each, through the real
/// publisher.
fn publish(
    publisher: &mut Publisher,
    dp: &mut BpfDataplane,
    vips: usize,
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
    let mut services = vec![
        DesiredService {
            name: "ipip".into(),
            vip: IPIP_VIP.parse()?,
            proto: IPPROTO_TCP,
            tunnel: Some(Tunnel::Ipip),
            nat: None,
            backends: backends(80),
            maglev_size: None,
        },
        DesiredService {
            name: "dsr".into(),
            vip: dsr_vip,
            proto: IPPROTO_TCP,
            tunnel: None,
            nat: None,
            backends: backends(80),
            maglev_size: None,
        },
        DesiredService {
            name: "nat".into(),
            vip: nat_vip,
            proto: IPPROTO_TCP,
            tunnel: None,
            nat: Some(NatSpec {
                snat_ips: vec![snat],
                ports: 20_000..=59_999,
                source_rate: 0,
                source_burst: 1,
            }),
            backends: backends(8080),
            maglev_size: None,
        },
    ];
    for i in 0..vips - 2 {
        services.push(DesiredService {
            name: format!("extra{i}"),
            vip: SocketAddr::new(
                IpAddr::from([10, 8, (i / 200) as u8, (i % 200) as u8 + 1]),
                443,
            ),
            proto: IPPROTO_TCP,
            tunnel: None,
            nat: None,
            backends: vec![DesiredBackend {
                addr: SocketAddr::new(
                    IpAddr::from([10, 7, (i / 200) as u8, (i % 200) as u8 + 1]),
                    443,
                ),
                weight: 1,
                mac: Some([2, 0, 0, 7, (i >> 8) as u8, i as u8]),
                role: Role::Active,
            }],
            maglev_size: None,
        });
    }
    let report = publisher.apply(&services, dp)?;
    println!(
        "published {} services, {} tables in {:?}",
        services.len(),
        report.tables_published,
        report.elapsed
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

fn measure(
    case: &Case,
    dp: &mut BpfDataplane,
    floor: &mut Xdp,
    whole: bool,
) -> anyhow::Result<Measured> {
    let mut program_total = Duration::ZERO;
    let mut floor_total = Duration::ZERO;
    let mut calls = 0usize;
    for block in 0..BLOCKS {
        for i in 0..BLOCK {
            let pkt = &case.packets[(block * BLOCK + i) % case.packets.len()];
            let prog = if whole {
                dp.full_program_mut()?
            } else {
                dp.program_mut()?
            };
            let (action, d) = timed(prog, pkt)?;
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
    let _ = writeln!(md, "\n{}\n\n{}", propagation.line(), propagation.table());
    std::fs::write(dir.join("xdp.md"), &md)?;
    println!("\nwritten {}", dir.join("xdp.md").display());
    Ok(())
}
