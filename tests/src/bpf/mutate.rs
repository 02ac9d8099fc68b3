//! Seeded, deterministic frame mutation for the packet-parser fuzz target: a corpus of
//! valid frames, and mutations that aim at the fields the parser checks (bits and bytes
//! of the headers, truncation, padding, lengths, IHL/data offset, flags, TTL, addresses,
//! destination MAC, VLAN tags, fragment bits, protocol numbers).

use std::net::IpAddr;

use crate::{
    bpf::classify::ETH_P_8021AD,
    traffic::packet::{
        ETH_P_8021Q, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, Frame, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST,
        TCP_SYN, checksum, raw_frame,
    },
};

/// splitmix64: small, seedable, the same sequence on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// Addresses the mutator plants: the world's VIPs and clients, and sources no client has.
#[derive(Clone, Debug)]
pub struct Addresses {
    pub v4: Vec<IpAddr>,
    pub v6: Vec<IpAddr>,
    /// MACs to put in the destination: ours, foreign, group.
    pub macs: Vec<[u8; 6]>,
}

/// The smallest frame BPF_PROG_TEST_RUN accepts (an Ethernet header).
pub const MIN_FRAME: usize = 14;
/// The largest frame produced (BPF_PROG_TEST_RUN takes up to a page minus head/tailroom).
pub const MAX_FRAME: usize = 1500;

/// Where the headers of a (possibly already mutated) frame are, as far as they can be
/// found: IP header offset and family, L4 offset.
struct Layout {
    l3: usize,
    v4: bool,
    l4: usize,
}

fn layout(f: &[u8]) -> Option<Layout> {
    if f.len() < 14 {
        return None;
    }
    let mut l3 = 14;
    let mut ethertype = u16::from_be_bytes([f[12], f[13]]);
    if (ethertype == ETH_P_8021Q || ethertype == ETH_P_8021AD) && f.len() >= 18 {
        ethertype = u16::from_be_bytes([f[16], f[17]]);
        l3 = 18;
    }
    match ethertype {
        ETH_P_IP if f.len() >= l3 + 20 => {
            let l4 = l3 + usize::from(f[l3] & 0x0f) * 4;
            Some(Layout { l3, v4: true, l4 })
        }
        ETH_P_IPV6 if f.len() >= l3 + 40 => Some(Layout {
            l3,
            v4: false,
            l4: l3 + 40,
        }),
        _ => None,
    }
}

/// Recomputes the IPv4 header checksum, if the frame has a whole IPv4 header.
pub fn fix_ipv4_checksum(f: &mut [u8]) {
    let Some(l) = layout(f) else { return };
    if !l.v4 || l.l4 > f.len() || l.l4 < l.l3 + 20 {
        return;
    }
    f[l.l3 + 10] = 0;
    f[l.l3 + 11] = 0;
    let c = checksum(&f[l.l3..l.l4]);
    f[l.l3 + 10..l.l3 + 12].copy_from_slice(&c.to_be_bytes());
}

fn set16(f: &mut [u8], at: usize, v: u16) {
    if at + 2 <= f.len() {
        f[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
}

/// A length near `exact`: exact, off by one either way, small, zero or huge.
fn near(rng: &mut Rng, exact: usize) -> u16 {
    let e = exact as i64;
    let v = match rng.below(7) {
        0 | 1 => e,
        2 => e + 1,
        3 => e - 1,
        4 => rng.below(64) as i64,
        5 => 0,
        _ => i64::from(rng.next_u64() as u16),
    };
    v.clamp(0, 0xffff) as u16
}

/// Applies 1 to 3 random mutations to `frame`; then, most of the time, repairs the IPv4
/// header checksum so the checks behind it are reached.
pub fn mutate(rng: &mut Rng, frame: &[u8], addrs: &Addresses) -> Vec<u8> {
    let mut f = frame.to_vec();
    for _ in 0..1 + rng.below(3) {
        one(rng, &mut f, addrs);
    }
    if rng.chance(80) {
        fix_ipv4_checksum(&mut f);
    }
    f.truncate(MAX_FRAME);
    if f.len() < MIN_FRAME {
        f.resize(MIN_FRAME, 0);
    }
    f
}

fn one(rng: &mut Rng, f: &mut Vec<u8>, addrs: &Addresses) {
    let l = layout(f);
    let headers = f.len().min(90);
    match rng.below(16) {
        0 => {
            let at = rng.below(headers);
            f[at] ^= 1 << rng.below(8);
        }
        1 => {
            let at = rng.below(headers);
            f[at] = rng.byte();
        }
        2 => {
            let keep = MIN_FRAME + rng.below(f.len().saturating_sub(MIN_FRAME) + 1);
            f.truncate(keep);
        }
        3 => {
            let n = 1 + rng.below(64);
            let fill = rng.byte();
            f.extend(std::iter::repeat_n(fill, n));
        }
        4 => {
            // IP length field.
            let Some(l) = l else { return };
            if l.v4 {
                let v = near(rng, f.len() - l.l3);
                set16(f, l.l3 + 2, v);
            } else {
                let v = near(rng, f.len().saturating_sub(l.l4));
                set16(f, l.l3 + 4, v);
            }
        }
        5 => {
            let Some(l) = l else { return };
            if l.v4 {
                f[l.l3] = (f[l.l3] & 0xf0) | rng.below(16) as u8;
            } else {
                f[l.l3] = (rng.below(16) as u8) << 4 | (f[l.l3] & 0x0f);
            }
        }
        6 => {
            // TCP flags (meaningful combinations most of the time).
            let Some(l) = l else { return };
            let flags = if rng.chance(70) {
                rng.pick(&[
                    TCP_SYN,
                    TCP_ACK,
                    TCP_ACK | TCP_PSH,
                    TCP_FIN | TCP_ACK,
                    TCP_RST,
                    TCP_RST | TCP_ACK,
                    TCP_SYN | TCP_FIN,
                    TCP_SYN | TCP_RST,
                    TCP_SYN | TCP_ACK,
                    0,
                    TCP_FIN,
                    TCP_FIN | TCP_PSH | 0x20,
                ])
            } else {
                rng.byte()
            };
            if l.l4 + 14 <= f.len() {
                f[l.l4 + 13] = flags;
            }
        }
        7 => {
            let Some(l) = l else { return };
            let ttl = rng.pick(&[0u8, 1, 2, 64, 255]);
            let at = if l.v4 { l.l3 + 8 } else { l.l3 + 7 };
            f[at] = ttl;
        }
        8 | 9 => {
            // Source or destination address.
            let Some(l) = l else { return };
            let src = rng.chance(60);
            let pool = if l.v4 { &addrs.v4 } else { &addrs.v6 };
            let addr = pool[rng.below(pool.len())];
            let (at, bytes) = match addr {
                IpAddr::V4(a) if l.v4 => (if src { 12 } else { 16 }, a.octets().to_vec()),
                IpAddr::V6(a) if !l.v4 => (if src { 8 } else { 24 }, a.octets().to_vec()),
                _ => return,
            };
            f[l.l3 + at..l.l3 + at + bytes.len()].copy_from_slice(&bytes);
        }
        10 => {
            let mac = addrs.macs[rng.below(addrs.macs.len())];
            f[..6].copy_from_slice(&mac);
        }
        11 => {
            // Add a VLAN tag (802.1Q or 802.1AD), or remove the first one.
            let tagged = u16::from_be_bytes([f[12], f[13]]);
            if (tagged == ETH_P_8021Q || tagged == ETH_P_8021AD) && f.len() >= 18 && rng.chance(40)
            {
                f.drain(12..16);
            } else {
                let tpid = rng.pick(&[ETH_P_8021Q, ETH_P_8021AD]);
                let mut tag = tpid.to_be_bytes().to_vec();
                tag.extend_from_slice(&(rng.below(4096) as u16).to_be_bytes());
                f.splice(12..12, tag);
            }
        }
        12 => {
            // TCP data offset or UDP length.
            let Some(l) = l else { return };
            if l.l4 + 14 > f.len() {
                return;
            }
            if rng.chance(50) {
                f[l.l4 + 12] = (rng.below(16) as u8) << 4 | (f[l.l4 + 12] & 0x0f);
            } else {
                let v = near(rng, f.len() - l.l4);
                set16(f, l.l4 + 4, v);
            }
        }
        13 => {
            let Some(l) = l else { return };
            if l.v4 {
                let frag = rng.pick(&[0x2000u16, 0x4000, 0x0001, 0x1fff, 0x6000, 0]);
                set16(f, l.l3 + 6, frag);
            }
        }
        14 => {
            let Some(l) = l else { return };
            let proto = rng.pick(&[6u8, 17, 1, 58, 47, 44, 0, 43, 60]);
            let at = if l.v4 { l.l3 + 9 } else { l.l3 + 6 };
            f[at] = proto;
        }
        _ => {
            // EtherType.
            let at = match u16::from_be_bytes([f[12], f[13]]) {
                ETH_P_8021Q | ETH_P_8021AD if f.len() >= 18 => 16,
                _ => 12,
            };
            let t = rng.pick(&[ETH_P_IP, ETH_P_IPV6, ETH_P_ARP, ETH_P_8021Q, 0x88cc]);
            set16(f, at, t);
        }
    }
}

/// Valid frames to start from: TCP (several flag sets, payloads, IPv4 options, VLAN)
/// and UDP to each service, traffic not for a VIP, ICMP, ARP.
pub fn corpus(
    services: &[(IpAddr, u16, u8)],
    clients: (IpAddr, IpAddr),
    client_mac: [u8; 6],
    our_mac: [u8; 6],
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for &(vip, port, proto) in services {
        let client = if vip.is_ipv4() { clients.0 } else { clients.1 };
        for (i, flags) in [
            TCP_SYN,
            TCP_ACK,
            TCP_ACK | TCP_PSH,
            TCP_FIN | TCP_ACK,
            TCP_RST,
        ]
        .into_iter()
        .enumerate()
        {
            let sport = 40_000 + i as u16;
            let f = if proto == crate::traffic::packet::IPPROTO_TCP {
                Frame::tcp(client, sport, vip, port, flags)
            } else {
                Frame::udp(client, sport, vip, port)
            };
            let f = f.macs(client_mac, our_mac);
            out.push(f.clone().bytes());
            out.push(f.clone().payload(&[0x5a; 37]).bytes());
            out.push(f.clone().vlan(7).bytes());
            if vip.is_ipv4() {
                let mut opt = f.clone();
                opt.v4.options = vec![1, 1, 1, 0];
                out.push(opt.bytes());
            }
        }
        let other = if vip.is_ipv4() {
            "10.0.0.7".parse().expect("address")
        } else {
            "fd00::7".parse().expect("address")
        };
        out.push(
            Frame::tcp(client, 1234, other, port, TCP_SYN)
                .macs(client_mac, our_mac)
                .bytes(),
        );
        out.push(
            Frame::udp(client, 1234, other, 53)
                .macs(client_mac, our_mac)
                .payload(b"q")
                .bytes(),
        );
        out.push(
            Frame::icmp(client, vip, if vip.is_ipv4() { 8 } else { 128 }, 0)
                .macs(client_mac, our_mac)
                .bytes(),
        );
    }
    out.push(raw_frame([0xff; 6], client_mac, ETH_P_ARP, &[0u8; 28]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(seed: u64) -> Vec<Vec<u8>> {
        let vip: IpAddr = "10.0.0.100".parse().unwrap();
        let clients = ("10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap());
        let seeds = corpus(
            &[(vip, 80, 6)],
            clients,
            [2, 0, 0, 0, 0, 1],
            [2, 0, 0, 0, 0, 2],
        );
        let addrs = Addresses {
            v4: vec![vip, "0.0.0.0".parse().unwrap()],
            v6: vec!["::1".parse().unwrap()],
            macs: vec![[0xff; 6]],
        };
        let mut rng = Rng::new(seed);
        (0..2_000)
            .map(|_| {
                let base = &seeds[rng.below(seeds.len())];
                mutate(&mut rng, base, &addrs)
            })
            .collect()
    }

    #[test]
    fn a_seed_replays_the_same_frames_within_bounds() {
        let a = frames(5);
        assert_eq!(a, frames(5), "same seed, same frames");
        assert_ne!(a, frames(6), "another seed, other frames");
        assert!(
            a.iter().all(|f| (MIN_FRAME..=MAX_FRAME).contains(&f.len())),
            "every frame between {MIN_FRAME} and {MAX_FRAME} bytes"
        );
    }
}
