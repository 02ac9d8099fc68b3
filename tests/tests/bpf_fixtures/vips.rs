//! The VIP index: every configured service is found through the hashed buckets, and
//! only packets to a nat source address inside the nat port range reach `LB_NAT`.

use super::prelude::*;

/// A reverse entry as `nat::allocate` would write it for `nat4`'s client.
fn reverse_entry() -> NatValue {
    NatValue {
        client_addr: addr_words(client4()),
        vip_addr: addr_words(svc(NAT4).vip),
        client_port: CPORT.to_be(),
        vip_port: 80u16.to_be(),
        backend_id: 2,
        client_mac: CLIENT_MAC,
        state: lb_common::maps::NAT_S_ESTABLISHED | lb_common::maps::NAT_S_ACKED,
        handshake: 0,
        last_seen: super::nat::now_nat_seconds(),
        _pad2: 0,
    }
}

#[test]
fn every_one_of_the_most_services_is_found() {
    let mut lb = Lb::load();
    lb.set_interface_mac(LB_MAC);
    let max = lb_common::MAX_SERVICES;
    let vip = |i: u32| ip4(10, 50, (i / 100) as u8, (i % 100) as u8);
    for i in 0..max {
        let meta = ServiceMeta {
            service_id: i,
            ..ServiceMeta::default()
        };
        lb.add_service(vip(i), 1000 + i as u16, IPPROTO_TCP, meta);
    }
    for i in 0..max {
        let syn = Frame::tcp(client4(), CPORT, vip(i), 1000 + i as u16, TCP_SYN)
            .macs(CLIENT_MAC, LB_MAC)
            .bytes();
        check(
            &mut lb,
            Fixture {
                desc: "a SYN to a configured service with no table is that service's",
                input: syn,
                action: XDP_DROP,
                output: Out::Any,
                counters: &[(DROP_NO_BACKEND, 1)],
            },
        );
        assert_eq!(lb.service_stats(i).no_backend, 1, "service {i} was found");
        for (port, proto) in [
            (1000 + i as u16 + 1, IPPROTO_TCP),
            (1000 + i as u16, IPPROTO_UDP),
        ] {
            let other = if proto == IPPROTO_TCP {
                Frame::tcp(client4(), CPORT, vip(i), port, TCP_SYN)
            } else {
                Frame::udp(client4(), CPORT, vip(i), port)
            };
            check(
                &mut lb,
                Fixture {
                    desc: "the VIP's address with another port or protocol is no service",
                    input: other.macs(CLIENT_MAC, LB_MAC).bytes(),
                    action: XDP_PASS,
                    output: Out::Unchanged,
                    counters: &[(PASS_NOT_VIP, 1)],
                },
            );
        }
    }
}

#[test]
fn only_a_nat_source_address_and_port_reaches_the_nat_table() {
    let mut lb = world(&[NAT4]);
    let inside = NAT_PORT_MIN + 7;
    let outside = NAT_PORT_MAX + 1;
    let s = svc(NAT4);
    let stranger = ip4(10, 0, 0, 77);
    // Reverse entries the program never writes (an address that is no nat source, a
    // port outside every nat range): they must not be looked at.
    lb.insert_nat(reply_key(NAT4, inside), reverse_entry());
    lb.insert_nat(reply_key(NAT4, outside), reverse_entry());
    lb.insert_nat(
        flow_key(
            s.backend_addr,
            s.backend_port,
            stranger,
            inside,
            IPPROTO_TCP,
        ),
        reverse_entry(),
    );

    let reply = backend_reply(NAT4, inside, TCP_ACK).payload(b"data");
    check(
        &mut lb,
        Fixture {
            desc: "a reply to the nat source address inside the port range is translated",
            input: reply.bytes(),
            action: XDP_TX,
            output: Out::Frame(reply_expected(&reply, NAT4, CPORT)),
            counters: &[(TX_NAT_REPLY, 1)],
        },
    );
    let reply = backend_reply(NAT4, outside, TCP_ACK).payload(b"data");
    check(
        &mut lb,
        Fixture {
            desc: "a port outside every nat range is passed before any map read",
            input: reply.bytes(),
            action: XDP_PASS,
            output: Out::Unchanged,
            counters: &[(PASS_NOT_VIP, 1)],
        },
    );
    let reply = Frame::tcp(s.backend_addr, s.backend_port, stranger, inside, TCP_ACK)
        .payload(b"data")
        .macs(backend_mac(s.backend), LB_MAC);
    check(
        &mut lb,
        Fixture {
            desc: "an address that is no nat source is passed",
            input: reply.bytes(),
            action: XDP_PASS,
            output: Out::Unchanged,
            counters: &[(PASS_NOT_VIP, 1)],
        },
    );
}
