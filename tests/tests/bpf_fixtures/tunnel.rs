//! Tunnel forwarding (`ipip`, `gue`): the encapsulation toward the backend's next hop,
//! the ICMP "too big" answer when the encapsulated packet would not fit the MTU, merged
//! segments longer than the MTU encapsulated and passed (to `lb_tunnel_gso`), and the
//! backends' `lb_decap` (which restores the client's packet).

use super::prelude::*;
use lb_common::{
    DECAP_PASSED, DECAP_STRIPPED,
    maps::{DataplaneConfig, FlowCacheEntry, FlowValue, GUE_PORT, SERVICE_F_GUE, SERVICE_F_TUNNEL},
};

/// ipip, TCP, 10.0.0.110:80 -> backend 21 (192.168.7.21, routed).
const TUN4: Tun = Tun {
    id: 21,
    vip: "10.0.0.110",
    port: 80,
    proto: IPPROTO_TCP,
    gue: false,
    backend: "192.168.7.21",
};
/// ipip, TCP, [fd00::110]:80 -> backend 22 (fd07::22).
const TUN6: Tun = Tun {
    id: 22,
    vip: "fd00::110",
    port: 80,
    proto: IPPROTO_TCP,
    gue: false,
    backend: "fd07::22",
};
/// gue, UDP, 10.0.0.111:53 -> backend 23 (192.168.7.23).
const GUE4: Tun = Tun {
    id: 23,
    vip: "10.0.0.111",
    port: 53,
    proto: IPPROTO_UDP,
    gue: true,
    backend: "192.168.7.23",
};
/// gue, TCP, [fd00::111]:443 -> backend 24 (fd07::24).
const GUE6: Tun = Tun {
    id: 24,
    vip: "fd00::111",
    port: 443,
    proto: IPPROTO_TCP,
    gue: true,
    backend: "fd07::24",
};
/// ipip, TCP, 10.0.0.112:80 -> backend 25 (fd07::25): IPv4 inside IPv6.
const TUN46: Tun = Tun {
    id: 25,
    vip: "10.0.0.112",
    port: 80,
    proto: IPPROTO_TCP,
    gue: false,
    backend: "fd07::25",
};
const ALL: [Tun; 5] = [TUN4, TUN6, GUE4, GUE6, TUN46];

const SRC4: &str = "10.0.0.2";
const SRC6: &str = "fd00::2";
const MTU: u16 = 1500;

#[derive(Clone, Copy)]
struct Tun {
    id: u32,
    vip: &'static str,
    port: u16,
    proto: u8,
    gue: bool,
    backend: &'static str,
}

impl Tun {
    fn vip(&self) -> IpAddr {
        self.vip.parse().unwrap()
    }
    fn backend(&self) -> IpAddr {
        self.backend.parse().unwrap()
    }
    /// A client packet to the service from client port `sport`.
    fn packet(&self, sport: u16, flags: u8) -> Frame {
        let client = if self.vip().is_ipv4() {
            client4()
        } else {
            client6()
        };
        let f = if self.proto == IPPROTO_TCP {
            Frame::tcp(client, sport, self.vip(), self.port, flags)
        } else {
            Frame::udp(client, sport, self.vip(), self.port)
        };
        f.macs(CLIENT_MAC, LB_MAC)
    }
    fn overhead(&self) -> usize {
        (if self.backend().is_ipv4() { 20 } else { 40 }) + if self.gue { 8 } else { 0 }
    }
}

fn src_of(family_of: IpAddr) -> IpAddr {
    (if family_of.is_ipv4() { SRC4 } else { SRC6 })
        .parse()
        .unwrap()
}

/// The tunnel services on a fresh load: interface MAC, MTU and tunnel sources set.
fn tunnels() -> Lb {
    let mut lb = Lb::load();
    let w = |ip: &str| addr_words(ip.parse().unwrap());
    lb.set_config(DataplaneConfig {
        mac: LB_MAC,
        mtu: MTU,
        tunnel_src4: w(SRC4)[0],
        tunnel_src6: w(SRC6),
        ..DataplaneConfig::default()
    });
    for t in ALL {
        let flags = SERVICE_F_TUNNEL | if t.gue { SERVICE_F_GUE } else { 0 };
        lb.add_service(
            t.vip(),
            t.port,
            t.proto,
            ServiceMeta {
                service_id: t.id,
                flags,
                ..ServiceMeta::default()
            },
        );
        lb.set_backend(t.id, backend(t.backend(), t.port, t.id, t.id));
        lb.set_maglev_all(t.id, t.id);
    }
    lb
}

/// What the balancer must send for `inner` of service `t`: `inner`'s IP packet behind
/// new outer headers, toward the backend's next hop. `sport` / `label`: the GUE source
/// port and IPv6 flow label the program chose (read from its output).
fn encapsulated(t: Tun, inner: &Frame, sport: u16, label: u32) -> Vec<u8> {
    let ip = inner.ip_bytes();
    let mut body = Vec::new();
    let mut udp = Vec::new();
    if t.gue {
        udp.extend_from_slice(&sport.to_be_bytes());
        udp.extend_from_slice(&GUE_PORT.to_be_bytes());
        udp.extend_from_slice(&((8 + ip.len()) as u16).to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
    }
    let inner_proto = if t.gue {
        17
    } else if inner.src.is_ipv4() {
        4
    } else {
        41
    };
    let (src, dst) = (src_of(t.backend()), t.backend());
    let ethertype = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let mut h = vec![0x45, 0];
            h.extend_from_slice(&((20 + udp.len() + ip.len()) as u16).to_be_bytes());
            h.extend_from_slice(&[0, 0, 0, 0, 64, inner_proto, 0, 0]);
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let c = checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            body.extend_from_slice(&h);
            0x0800u16
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            body.extend_from_slice(&(0x6000_0000u32 | label).to_be_bytes());
            body.extend_from_slice(&((udp.len() + ip.len()) as u16).to_be_bytes());
            body.extend_from_slice(&[inner_proto, 64]);
            body.extend_from_slice(&s.octets());
            body.extend_from_slice(&d.octets());
            0x86dd
        }
        _ => unreachable!(),
    };
    body.extend_from_slice(&udp);
    body.extend_from_slice(&ip);
    raw_frame(backend_mac(t.id), LB_MAC, ethertype, &body)
}

/// The GUE source port (`gue`) and IPv6 flow label (IPv6 outer) the output carries.
fn chosen(t: Tun, out: &[u8]) -> (u16, u32) {
    let (ip_len, label) = if t.backend().is_ipv4() {
        (20, 0)
    } else {
        (
            40,
            u32::from_be_bytes([out[14], out[15], out[16], out[17]]) & 0xf_ffff,
        )
    };
    let sport = if t.gue {
        u16::from_be_bytes([out[14 + ip_len], out[15 + ip_len]])
    } else {
        0
    };
    (sport, label)
}

/// Sends `inner` to `t` and checks the encapsulation byte for byte; returns the output.
fn forward(lb: &mut Lb, t: Tun, desc: &str, inner: &Frame, counters: &[(u32, u64)]) -> Vec<u8> {
    encapsulate(lb, t, desc, inner, XDP_TX, counters)
}

/// [`forward`], with the encapsulated packet's `action`.
fn encapsulate(
    lb: &mut Lb,
    t: Tun,
    desc: &str,
    inner: &Frame,
    action: u32,
    counters: &[(u32, u64)],
) -> Vec<u8> {
    let run = check(
        lb,
        Fixture {
            desc,
            input: inner.bytes(),
            action,
            output: Out::Any,
            counters,
        },
    );
    let (sport, label) = chosen(t, &run.out);
    assert_frames_eq(desc, &encapsulated(t, inner, sport, label), &run.out);
    if t.gue {
        assert!(
            sport >= 0x8000,
            "{desc}: GUE source port {sport} in 32768..65535"
        );
    }
    {
        let p = SlicedPacket::from_ethernet(&run.out).expect("the output parses");
        if let Some(NetSlice::Ipv4(ip)) = &p.net {
            let h = ip.header();
            assert_eq!(
                h.header_checksum(),
                h.to_header().calc_header_checksum(),
                "{desc}: outer IPv4 checksum (etherparse)"
            );
        }
    }
    run.out
}

#[test]
fn ipip_and_gue_encapsulate_toward_the_backends_next_hop() {
    // One CPU: the settled packets below are served from this CPU's flow cache.
    lb_tests::bench::cpu::pin_self(0).expect("pinning to CPU 0");
    let mut lb = tunnels();
    for t in ALL {
        let syn = t.packet(CPORT, TCP_SYN).payload(b"hello");
        forward(
            &mut lb,
            t,
            &format!("{}: a new flow is encapsulated to {}", t.vip, t.backend),
            &syn,
            &[(TX_TUNNEL, 1), (FLOW_NEW, 1)],
        );
        let flow = lb
            .flow(&flow_key(syn.src, CPORT, t.vip(), t.port, t.proto))
            .expect("the flow is pinned as in dsr");
        assert_eq!(flow.backend_id, t.id);
        let ack = t.packet(CPORT, TCP_ACK | TCP_PSH).payload(b"more");
        // TCP: the ACK completes the handshake as in dsr (the backend answers directly).
        let want: &[(u32, u64)] = &[(TX_TUNNEL, 1), (FLOW_HIT, 1)];
        forward(
            &mut lb,
            t,
            &format!("{}: the flow's next packet", t.vip),
            &ack,
            want,
        );
        // Settled flows are served by lb_xdp itself from this CPU's cache (its
        // encapsulation too), even with lb_xdp_full out of reach.
        let (f, out) = from_cache(&mut lb, t);
        let (sport, label) = chosen(t, &out);
        assert_frames_eq(
            &format!(
                "{}: a settled packet from the cache, in lb_xdp alone",
                t.vip
            ),
            &encapsulated(t, &f, sport, label),
            &out,
        );
        let s = lb.backend_stats(t.id);
        assert!(
            s.packets >= 3 && s.new_flows == 1,
            "{}: backend stats {s:?}",
            t.vip
        );
    }
    let s = lb.backend_stats(TUN4.id);
    assert_eq!(
        s.conn_ok, 1,
        "the client's ACK completes a tunnel handshake (as dsr)"
    );
}

/// Flows cached by hand for the ticks after the one the whole path cached a flow in
/// (as `split.rs` does): emptying `LB_PROGRAMS` can take longer than a tick.
const CACHED_FLOWS: u16 = 1500;

/// A packet of service `t` served by `lb_xdp` alone from CPU 0's flow cache, with
/// `lb_xdp_full` out of reach (`LB_PROGRAMS` emptied), and its output. A cached flow
/// serves only the tick it was cached in, so flow `i` (pinned in `LB_FLOWS`) is cached
/// by hand for tick `t0 + i` after the one the whole path cached the first in, and they
/// are sent in that order: at least one meets its tick; the others are dropped.
fn from_cache(lb: &mut Lb, t: Tun) -> (Frame, Vec<u8>) {
    let key = |sport: u16| flow_key(t.packet(sport, 0).src, sport, t.vip(), t.port, t.proto);
    let pinned = FlowValue {
        backend_id: t.id,
        ..FlowValue::default()
    };
    let first = 30_000;
    lb.set_flow(&key(first), pinned);
    let ack = t.packet(first, TCP_ACK).payload(b"data");
    assert_eq!(
        lb.run(&ack.bytes()).action,
        XDP_TX,
        "through the whole path"
    );
    let t0 = lb
        .cached_flow(0, &key(first))
        .expect("cached on CPU 0")
        .tick;
    lb.clear_full_path();
    let mut slots = std::collections::BTreeSet::new();
    // Each flow is pinned in `LB_FLOWS` too: no more per bucket than its free ways.
    let mut free = std::collections::BTreeMap::new();
    let flows: Vec<u16> = (first + 1..first + 20_000)
        .filter(|&sport| slots.insert(lb_common::hash::flow_cache_slot(&key(sport))))
        .filter(|&sport| {
            let (index, bucket) = lb.flow_bucket_of(&key(sport));
            let free = free.entry(index).or_insert_with(|| {
                let live = lb_common::table::SLOT_LIVE;
                bucket.ways.iter().filter(|w| w.word & live == 0).count()
            });
            let room = *free > 0;
            *free = free.saturating_sub(1);
            room
        })
        .take(CACHED_FLOWS as usize)
        .collect();
    for (i, &sport) in flows.iter().enumerate() {
        lb.set_flow(&key(sport), pinned);
        lb.set_cached_flow(
            0,
            FlowCacheEntry {
                key: key(sport),
                backend_id: t.id,
                tick: t0.wrapping_add(i as u32),
                ..FlowCacheEntry::default()
            },
        );
    }
    let mut served = None;
    for &sport in &flows {
        let f = t.packet(sport, TCP_ACK).payload(b"more");
        let run = lb.run(&f.bytes());
        if run.action == XDP_TX {
            served = Some((f, run.out));
            break;
        }
        assert_eq!(run.action, XDP_DROP, "a cache miss without the full path");
    }
    lb.fill_full_path();
    served.expect("no flow was served from the cache in its tick")
}

#[test]
fn ipv4_options_travel_inside_the_tunnel_untouched() {
    let mut lb = tunnels();
    for t in [TUN4, GUE4, TUN46] {
        let mut f = t.packet(CPORT, TCP_SYN).payload(b"opts");
        f.v4.options = vec![1, 1, 1, 0]; // NOP NOP NOP EOL: IHL 6
        forward(
            &mut lb,
            t,
            &format!(
                "{}: IPv4 with options (IHL 6) encapsulated as it came",
                t.vip
            ),
            &f,
            &[(TX_TUNNEL, 1), (FLOW_NEW, 1)],
        );
    }
}

#[test]
fn gue_spreads_flows_over_source_ports_and_keeps_each_flows() {
    let mut lb = tunnels();
    let mut ports = std::collections::BTreeSet::new();
    for i in 0..16u16 {
        let f = GUE4.packet(CPORT + i, 0);
        let a = forward(
            &mut lb,
            GUE4,
            "gue: a flow",
            &f,
            &[(TX_TUNNEL, 1), (FLOW_NEW, 1)],
        );
        let b = forward(
            &mut lb,
            GUE4,
            "gue: the same flow again",
            &f,
            &[(TX_TUNNEL, 1), (FLOW_HIT, 1)],
        );
        assert_eq!(
            chosen(GUE4, &a),
            chosen(GUE4, &b),
            "one flow, one source port"
        );
        ports.insert(chosen(GUE4, &a).0);
    }
    assert!(
        ports.len() >= 12,
        "16 flows over {} source ports",
        ports.len()
    );
}

/// The ICMP answer a client must receive for `inner` (sent to `vip`), naming `mtu`.
fn too_big_expected(inner: &Frame, mtu: u32) -> Vec<u8> {
    let ip = inner.ip_bytes();
    match (inner.src, inner.dst) {
        (IpAddr::V4(client), IpAddr::V4(vip)) => {
            let mut icmp = vec![3, 4, 0, 0, 0, 0];
            icmp.extend_from_slice(&(mtu as u16).to_be_bytes());
            icmp.extend_from_slice(&ip[..28]);
            let c = checksum(&icmp);
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut h = vec![0x45, 0];
            h.extend_from_slice(&((20 + icmp.len()) as u16).to_be_bytes());
            h.extend_from_slice(&[0, 0, 0, 0, 64, 1, 0, 0]);
            h.extend_from_slice(&vip.octets());
            h.extend_from_slice(&client.octets());
            let c = checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            h.extend_from_slice(&icmp);
            raw_frame(CLIENT_MAC, LB_MAC, 0x0800, &h)
        }
        (IpAddr::V6(client), IpAddr::V6(vip)) => {
            let mut icmp = vec![2, 0, 0, 0];
            icmp.extend_from_slice(&mtu.to_be_bytes());
            icmp.extend_from_slice(&ip[..48]);
            let sum = pseudo_header_sum(inner.dst, inner.src, 58, icmp.len()) + sum_words(&icmp);
            let c = !fold(sum);
            icmp[2..4].copy_from_slice(&c.to_be_bytes());
            let mut h = vec![0x60, 0, 0, 0];
            h.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
            h.extend_from_slice(&[58, 64]);
            h.extend_from_slice(&vip.octets());
            h.extend_from_slice(&client.octets());
            h.extend_from_slice(&icmp);
            raw_frame(CLIENT_MAC, LB_MAC, 0x86dd, &h)
        }
        _ => unreachable!(),
    }
}

/// A client packet to `t` whose IP packet is `ip_len` bytes.
fn sized(t: Tun, sport: u16, ip_len: usize) -> Frame {
    let header = if t.vip().is_ipv4() { 20 } else { 40 } + 20;
    t.packet(sport, TCP_ACK | TCP_PSH)
        .payload(&vec![0xab; ip_len - header])
}

#[test]
fn a_packet_that_would_not_fit_the_mtu_is_answered_too_big() {
    let mut lb = tunnels();
    for t in [TUN4, TUN6, GUE6, TUN46] {
        let fits = MTU as usize - t.overhead();
        let mut f = sized(t, CPORT, fits);
        f.v4.frag = 0x4000;
        forward(
            &mut lb,
            t,
            &format!("{}: {fits} bytes fit the MTU once encapsulated", t.vip),
            &f,
            &[(TX_TUNNEL, 1), (FLOW_NEW, 1)],
        );
        let mut big = sized(t, CPORT, fits + 1);
        big.v4.frag = 0x4000;
        let run = check(
            &mut lb,
            Fixture {
                desc: &format!(
                    "{}: {} bytes do not: ICMP too big naming {fits}",
                    t.vip,
                    fits + 1
                ),
                input: big.bytes(),
                action: XDP_TX,
                output: Out::Frame(too_big_expected(&big, fits as u32)),
                counters: &[(TX_ICMP_TOO_BIG, 1), (FLOW_HIT, 1)],
            },
        );
        let p = SlicedPacket::from_ethernet(&run.out).expect("the answer parses");
        assert!(p.net.is_some(), "{}: an IP answer", t.vip);
    }
    // IPv4 without DF may not be answered "fragmentation needed": it is dropped.
    let big = sized(TUN4, CPORT + 1, MTU as usize - 19);
    check(
        &mut lb,
        Fixture {
            desc: "ipip: too big without DF: dropped (lb does not fragment)",
            input: big.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_TUNNEL, 1), (FLOW_NEW, 1)],
        },
    );
}

#[test]
fn merged_segments_longer_than_the_mtu_are_encapsulated_and_passed_to_tc() {
    let mut lb = tunnels();
    // What generic mode sees from a peer that hands over a TSO packet whole: more than
    // any frame of the wire (a frame that only the outer headers push over the MTU is
    // answered too big, above). Encapsulated, not answered, and passed: lb_tunnel_gso
    // sends it out.
    for t in [TUN4, TUN6, GUE6] {
        let mut merged = sized(t, CPORT, MTU as usize + 1);
        merged.v4.frag = 0x4000;
        encapsulate(
            &mut lb,
            t,
            &format!(
                "{}: {} bytes, more than the MTU: merged segments, encapsulated and passed",
                t.vip,
                MTU + 1
            ),
            &merged,
            XDP_PASS,
            &[(TX_TUNNEL, 1), (FLOW_NEW, 1)],
        );
    }
    // tc takes the skb's inner protocol from the outer header: one family only.
    let mut merged = sized(TUN46, CPORT, MTU as usize + 1);
    merged.v4.frag = 0x4000;
    check(
        &mut lb,
        Fixture {
            desc: "IPv4 in IPv6, more than the MTU: merged segments across families, dropped",
            input: merged.bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_TUNNEL, 1), (FLOW_NEW, 1)],
        },
    );
}

#[test]
fn without_a_source_of_the_backends_family_or_with_a_vlan_tag_it_drops() {
    let mut lb = tunnels();
    lb.set_config(DataplaneConfig {
        mac: LB_MAC,
        mtu: 0,
        ..DataplaneConfig::default()
    });
    check(
        &mut lb,
        Fixture {
            desc: "ipip: no IPv4 tunnel source configured: dropped",
            input: TUN4.packet(CPORT, TCP_SYN).bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_TUNNEL, 1), (FLOW_NEW, 1)],
        },
    );
    let mut lb = tunnels();
    check(
        &mut lb,
        Fixture {
            desc: "ipip: a VLAN-tagged frame is not carried into the tunnel",
            input: TUN4.packet(CPORT, TCP_SYN).vlan(7).bytes(),
            action: XDP_DROP,
            output: Out::Any,
            counters: &[(DROP_TUNNEL, 1), (FLOW_NEW, 1)],
        },
    );
}

#[test]
fn lb_decap_restores_the_clients_packet_and_passes_the_rest() {
    let mut lb = tunnels();
    for t in ALL {
        lb.add_decap_addr(t.backend());
    }
    for t in ALL {
        let inner = t.packet(CPORT, TCP_SYN).payload(b"through the tunnel");
        let desc = format!("{}: encapsulated", t.vip);
        let out = forward(&mut lb, t, &desc, &inner, &[(TX_TUNNEL, 1), (FLOW_NEW, 1)]);
        let before = lb.decap_counters();
        let run = lb.run_prog(lb_common::DECAP_PROGRAM_NAME, &out);
        assert_eq!(run.action, XDP_PASS, "{}: lb_decap passes", t.vip);
        assert_frames_eq(
            &format!("{}: lb_decap gives the stack the client's packet", t.vip),
            &inner.clone().macs(LB_MAC, backend_mac(t.id)).bytes(),
            &run.out,
        );
        let after = lb.decap_counters();
        assert_eq!(
            after[DECAP_STRIPPED as usize],
            before[DECAP_STRIPPED as usize] + 1
        );
    }
    // Not for this host, not a tunnel, not GUE's port: untouched.
    let inner = TUN4.packet(CPORT, TCP_SYN);
    let out = forward(
        &mut lb,
        TUN4,
        "ipip",
        &inner,
        &[(TX_TUNNEL, 1), (FLOW_HIT, 1)],
    );
    let mut elsewhere = out.clone();
    elsewhere[33] ^= 1; // the outer destination's last byte
    let plain = inner.bytes();
    let mut other_port = forward(
        &mut lb,
        GUE4,
        "gue",
        &GUE4.packet(CPORT + 1, 0),
        &[(TX_TUNNEL, 1), (FLOW_NEW, 1)],
    );
    other_port[14 + 20 + 3] ^= 1; // the UDP destination port
    for (what, frame) in [
        ("an outer destination not the host's", elsewhere),
        ("a packet that is no tunnel", plain),
        ("UDP to another port than GUE's", other_port),
    ] {
        let before = lb.decap_counters();
        let run = lb.run_prog(lb_common::DECAP_PROGRAM_NAME, &frame);
        assert_eq!(run.action, XDP_PASS, "lb_decap: {what}: passed");
        assert_frames_eq(&format!("lb_decap: {what}: untouched"), &frame, &run.out);
        let after = lb.decap_counters();
        assert_eq!(
            after[DECAP_PASSED as usize],
            before[DECAP_PASSED as usize] + 1,
            "{what}"
        );
    }
}
