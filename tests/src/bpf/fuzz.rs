//! The packet-parser fuzz target: mutated frames ([`crate::bpf::mutate`]) through
//! BPF_PROG_TEST_RUN of `lb_xdp`, each verdict compared with the reference classifier
//! ([`crate::bpf::classify`]) in a dsr world, and invariants that hold whatever the rules:
//! exactly one outcome counter moves per frame, a passed frame is unchanged, a dsr
//! forward changes only the MACs.
//!
//! Deterministic for a seed: a failure names the seed and the frame index, and prints
//! the frame in hex with both verdicts.

use std::{collections::BTreeMap, fmt::Write as _, net::IpAddr};

use lb_common::{
    IPPROTO_TCP, IPPROTO_UDP,
    counters::{self, OUTCOMES},
    maps::{BACKEND_F_LIVE, BACKEND_F_SERVING, Backend, ServiceMeta},
};

use crate::bpf::{
    classify::{Flows, Service, Verdict, World},
    mutate::{Addresses, Rng, corpus, mutate},
    object::{Lb, XDP_PASS, XDP_TX, addr_words, family},
};

pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x1b];
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];
const FOREIGN_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x99];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("address literal")
}

fn backend_mac(id: u32) -> [u8; 6] {
    [0x02, 0, 0, 0, 0x01, id as u8]
}

/// (service id, VIP, port, protocol, backend id and address; backend 0 = no table)
type Spec = (u32, &'static str, u16, u8, u32, &'static str);

/// dsr services: TCP and UDP on one IPv4 VIP, TCP on an IPv6 VIP, one without a table.
const SERVICES: [Spec; 4] = [
    (1, "10.0.0.100", 80, IPPROTO_TCP, 1, "10.0.1.11"),
    (2, "10.0.0.100", 53, IPPROTO_UDP, 1, "10.0.1.11"),
    (3, "fd00::100", 80, IPPROTO_TCP, 4, "fd00::11"),
    (4, "10.0.0.102", 80, IPPROTO_TCP, 0, "0.0.0.0"),
];

/// The fuzz world, as the classifier sees it.
pub fn world() -> World {
    World {
        mac: LB_MAC,
        services: SERVICES
            .iter()
            .map(|&(_, vip, port, proto, backend, _)| Service {
                vip: ip(vip),
                port,
                proto,
                backend: (backend != 0).then(|| backend_mac(backend)),
            })
            .collect(),
    }
}

/// Loads the program and configures the same world.
pub fn load_world() -> Lb {
    let mut lb = Lb::load();
    lb.set_interface_mac(LB_MAC);
    for &(id, vip, port, proto, backend, addr) in &SERVICES {
        let meta = ServiceMeta {
            service_id: id,
            ..ServiceMeta::default()
        };
        lb.add_service(ip(vip), port, proto, meta);
        if backend != 0 {
            let a = ip(addr);
            lb.set_backend(
                backend,
                Backend {
                    addr: addr_words(a),
                    port: port.to_be(),
                    family: family(a),
                    flags: BACKEND_F_LIVE | BACKEND_F_SERVING,
                    mac: backend_mac(backend),
                    _pad: [0; 2],
                    service_id: id,
                },
            );
            lb.set_maglev_all(id, backend);
        }
    }
    lb
}

fn addresses() -> Addresses {
    let v4 = [
        "10.0.0.100",
        "10.0.0.102",
        "10.0.0.1",
        "10.0.0.7",
        "0.0.0.0",
        "0.1.2.3",
        "127.0.0.1",
        "224.0.0.1",
        "239.1.2.3",
        "255.255.255.255",
        "223.255.255.255",
    ];
    let v6 = ["fd00::100", "fd00::1", "fd00::7", "::", "::1", "ff02::1"];
    Addresses {
        v4: v4.iter().map(|a| ip(a)).collect(),
        v6: v6.iter().map(|a| ip(a)).collect(),
        macs: vec![
            LB_MAC,
            LB_MAC,
            FOREIGN_MAC,
            [0xff; 6],
            [0x01, 0x00, 0x5e, 0, 0, 1],
            [0x33, 0x33, 0, 0, 0, 1],
        ],
    }
}

/// What a run saw: how often each predicted verdict occurred.
#[derive(Debug, Default)]
pub struct Report {
    pub frames: usize,
    pub verdicts: BTreeMap<String, usize>,
    /// Counter indices that were predicted at least once.
    pub outcomes: Vec<u32>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{} frames, every verdict as predicted:", self.frames)?;
        for (v, n) in &self.verdicts {
            writeln!(f, "  {n:>8}  {v}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("seed {seed}, frame {index}: {what}\n  expected {expected}\n  frame ({len} bytes) {hex}")]
pub struct Disagreement {
    pub seed: u64,
    pub index: usize,
    pub what: String,
    pub expected: Verdict,
    pub len: usize,
    pub hex: String,
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// Feeds `frames` mutated frames (seed `seed`) through the program and checks each.
pub fn run(frames: usize, seed: u64) -> Result<Report, Disagreement> {
    let mut lb = load_world();
    let world = world();
    let specs: Vec<(IpAddr, u16, u8)> = world
        .services
        .iter()
        .map(|s| (s.vip, s.port, s.proto))
        .collect();
    let seeds = corpus(&specs, (ip("10.0.0.1"), ip("fd00::1")), CLIENT_MAC, LB_MAC);
    let addrs = addresses();
    let mut rng = Rng::new(seed);
    let mut flows = Flows::default();
    let mut report = Report {
        frames,
        ..Report::default()
    };
    let mut counters = lb.counters();
    for index in 0..frames {
        let base = &seeds[rng.below(seeds.len())];
        let frame = if rng.chance(5) {
            base.clone()
        } else {
            mutate(&mut rng, base, &addrs)
        };
        let expected = world.classify(&frame, &mut flows);
        let fail = |what: String| Disagreement {
            seed,
            index,
            what,
            expected,
            len: frame.len(),
            hex: hex(&frame),
        };
        let out = lb
            .try_run(&frame)
            .map_err(|e| fail(format!("BPF_PROG_TEST_RUN refused the frame: {e}")))?;
        let after = lb.counters();
        let moved: Vec<(u32, u64)> = OUTCOMES
            .iter()
            .map(|&i| (i, after[i as usize] - counters[i as usize]))
            .filter(|&(_, d)| d != 0)
            .collect();
        counters = after;
        let got = match moved.as_slice() {
            [(counter, 1)] => Verdict {
                action: out.action,
                counter: *counter,
            },
            _ => {
                let names: Vec<String> = moved
                    .iter()
                    .map(|(i, d)| format!("{}+{d}", counters::NAMES[*i as usize]))
                    .collect();
                return Err(fail(format!(
                    "not exactly one outcome counter moved: [{}] (action {})",
                    names.join(", "),
                    crate::bpf::object::action_name(out.action)
                )));
            }
        };
        if got != expected {
            return Err(fail(format!("program said {got}")));
        }
        if got.action == XDP_PASS && out.out != frame {
            return Err(fail(format!("passed frame changed: {}", hex(&out.out))));
        }
        if got.action == XDP_TX && Some(&out.out) != world.dsr_output(&frame).as_ref() {
            return Err(fail(format!(
                "dsr output is not the frame with new MACs: {}",
                hex(&out.out)
            )));
        }
        *report.verdicts.entry(expected.to_string()).or_default() += 1;
        if !report.outcomes.contains(&expected.counter) {
            report.outcomes.push(expected.counter);
        }
    }
    Ok(report)
}
