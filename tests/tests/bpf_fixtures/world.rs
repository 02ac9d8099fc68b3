//! The configured world every fixture starts from: services, backends, addresses.

use super::prelude::*;

pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x1b];
pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0xc1];

pub fn backend_mac(id: u32) -> [u8; 6] {
    [0x02, 0, 0, 0, 0x01, id as u8]
}

pub fn ip4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

pub fn ip6(s: &str) -> IpAddr {
    IpAddr::V6(s.parse::<Ipv6Addr>().expect("IPv6 literal"))
}

pub fn client4() -> IpAddr {
    ip4(10, 0, 0, 1)
}
pub fn client6() -> IpAddr {
    ip6("fd00::1")
}
pub const CPORT: u16 = 40000;

/// dsr, TCP, 10.0.0.100:80 -> backend 1 (10.0.1.11).
pub const DSR4: u32 = 1;
/// nat, TCP, 10.0.0.101:80 -> backend 2 (10.0.1.12:8080), snat 10.0.0.2.
pub const NAT4: u32 = 2;
/// nat, UDP, 10.0.0.101:53 -> backend 3 (10.0.1.13:5353), snat 10.0.0.2.
pub const NAT4_UDP: u32 = 3;
/// dsr, TCP, [fd00::100]:80 -> backend 4 (fd00::11).
pub const DSR6: u32 = 4;
/// nat, TCP, [fd00::101]:443 -> backend 5 ([fd00::12]:8443), snat fd00::2.
pub const NAT6: u32 = 5;
/// dsr, TCP, 10.0.0.102:80: no Maglev table published.
pub const EMPTY: u32 = 6;
/// nat, UDP, [fd00::101]:53 -> backend 7 ([fd00::13]:5353), snat fd00::2.
pub const NAT6_UDP: u32 = 7;
/// dsr, UDP, 10.0.0.100:53 -> backend 1.
pub const DSR4_UDP: u32 = 8;

pub const NAT_PORT_MIN: u16 = 20000;
pub const NAT_PORT_MAX: u16 = 20999;

pub struct Svc {
    pub id: u32,
    pub vip: IpAddr,
    pub port: u16,
    pub proto: u8,
    pub nat: bool,
    pub backend: u32,
    pub backend_addr: IpAddr,
    pub backend_port: u16,
}

pub fn services() -> Vec<Svc> {
    let s = |id, vip, port, proto, nat, backend, backend_addr, backend_port| Svc {
        id,
        vip,
        port,
        proto,
        nat,
        backend,
        backend_addr,
        backend_port,
    };
    vec![
        s(
            DSR4,
            ip4(10, 0, 0, 100),
            80,
            IPPROTO_TCP,
            false,
            1,
            ip4(10, 0, 1, 11),
            80,
        ),
        s(
            NAT4,
            ip4(10, 0, 0, 101),
            80,
            IPPROTO_TCP,
            true,
            2,
            ip4(10, 0, 1, 12),
            8080,
        ),
        s(
            NAT4_UDP,
            ip4(10, 0, 0, 101),
            53,
            IPPROTO_UDP,
            true,
            3,
            ip4(10, 0, 1, 13),
            5353,
        ),
        s(
            DSR6,
            ip6("fd00::100"),
            80,
            IPPROTO_TCP,
            false,
            4,
            ip6("fd00::11"),
            80,
        ),
        s(
            NAT6,
            ip6("fd00::101"),
            443,
            IPPROTO_TCP,
            true,
            5,
            ip6("fd00::12"),
            8443,
        ),
        s(
            EMPTY,
            ip4(10, 0, 0, 102),
            80,
            IPPROTO_TCP,
            false,
            0,
            ip4(0, 0, 0, 0),
            0,
        ),
        s(
            NAT6_UDP,
            ip6("fd00::101"),
            53,
            IPPROTO_UDP,
            true,
            7,
            ip6("fd00::13"),
            5353,
        ),
        s(
            DSR4_UDP,
            ip4(10, 0, 0, 100),
            53,
            IPPROTO_UDP,
            false,
            1,
            ip4(10, 0, 1, 11),
            53,
        ),
    ]
}

pub fn svc(id: u32) -> Svc {
    services()
        .into_iter()
        .find(|s| s.id == id)
        .expect("a configured service")
}

pub fn snat(vip: IpAddr) -> IpAddr {
    if vip.is_ipv4() {
        ip4(10, 0, 0, 2)
    } else {
        ip6("fd00::2")
    }
}

pub fn backend(addr: IpAddr, port: u16, id: u32, service_id: u32) -> Backend {
    Backend {
        addr: addr_words(addr),
        port: port.to_be(),
        family: family(addr),
        flags: BACKEND_F_LIVE | BACKEND_F_SERVING,
        mac: backend_mac(id),
        _pad: [0; 2],
        service_id,
    }
}

/// Loads the object, gives it the interface MAC [`LB_MAC`] and configures every service
/// of [`services`]; only the services in `tables` get a Maglev table (all slots on their
/// backend), to keep setup fast.
pub fn world(tables: &[u32]) -> Lb {
    world_in(Lb::load(), tables)
}

/// [`world`] on an object loaded by the caller (other sizes or seeds).
pub fn world_in(mut lb: Lb, tables: &[u32]) -> Lb {
    lb.set_interface_mac(LB_MAC);
    for s in services() {
        let meta = ServiceMeta {
            service_id: s.id,
            flags: if s.nat { SERVICE_F_NAT } else { 0 },
            snat_addrs: if s.nat {
                [addr_words(snat(s.vip)), [0; 4], [0; 4], [0; 4]]
            } else {
                [[0; 4]; 4]
            },
            snat_count: 1,
            nat_port_min: NAT_PORT_MIN,
            nat_port_max: NAT_PORT_MAX,
            ..ServiceMeta::default()
        };
        lb.add_service(s.vip, s.port, s.proto, meta);
        if s.backend != 0 {
            lb.set_backend(
                s.backend,
                backend(s.backend_addr, s.backend_port, s.backend, s.id),
            );
        }
        if tables.contains(&s.id) {
            lb.set_maglev_all(s.id, s.backend);
        }
    }
    lb
}
