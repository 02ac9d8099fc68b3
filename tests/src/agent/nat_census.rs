//! A census of a running agent's `LB_NAT` table: live entries by lifecycle row, and how
//! close any client 5-tuple came to finding all its candidate pairs held (the cause of
//! `drop_nat_ports`), so that a scenario's report explains port pressure instead of only
//! counting it. It walks the candidates as `nat::allocate` does (docs/nat-ports.md,
//! "Allocation"), ignoring only full buckets.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt,
    net::IpAddr,
    ops::RangeInclusive,
};

use crate::util::error::Error;
use aya::maps::{Array, Map, MapData, loaded_maps};
use lb_common::{
    FAMILY_V4, IPPROTO_TCP, NAT_HANDSHAKE_DISPLACE, NAT_PORT_ATTEMPTS,
    hash::{SEED_NAT_PORT, flow_hash},
    map_names,
    maps::{
        FlowKey, NAT_S_BACKEND_FIRST, NAT_S_ESTABLISHED, NAT_S_FIN_BACKEND, NAT_S_FIN_CLIENT,
        NAT_S_RST, NatValue, nat_backend_time_wait, nat_owned_by, nat_reclaimable,
    },
    nat_stride,
    table::{NatBucket, SLOT_LIVE},
};

/// What holds one candidate pair of a client 5-tuple toward one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// Nobody.
    Free,
    /// An entry whose port may be reused now (taken over in the second pass only).
    Reclaimable,
    /// The same client 5-tuple's earlier connection in the backend's TIME_WAIT: the
    /// allocation takes it back when all candidates are held.
    OwnTimeWait,
    /// The same client 5-tuple, in another state (`state` bits).
    Own(u8),
    /// Another client's live entry (`state` bits).
    Other(u8),
}

impl Holder {
    /// Neither pass may take the pair.
    fn blocks(&self) -> bool {
        matches!(self, Holder::Own(_) | Holder::Other(_))
    }
}

/// The client 5-tuple (as `address:port`) toward one backend that had the most of its
/// candidates held, and by what.
#[derive(Clone, Debug)]
pub struct Worst {
    pub client: String,
    pub backend: String,
    /// The candidates' ports, in the order they are tried.
    pub ports: Vec<u16>,
    pub holders: Vec<Holder>,
}

/// The census (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct NatCensus {
    /// Live entries by row name.
    pub rows: BTreeMap<&'static str, usize>,
    /// (client 5-tuple, backend) pairs by how many of their 16 candidates could not be
    /// taken in either pass (held, not reclaimable, not the 5-tuple's own TIME_WAIT):
    /// index `k` counts those with `k` blocked.
    pub blocked: [usize; WALK + 1],
    /// Those a new SYN would be refused for right now (`drop_nat_ports`).
    pub refused: usize,
    pub worst: Option<Worst>,
}

/// Candidates of one allocation: both passes.
const WALK: usize = 2 * NAT_PORT_ATTEMPTS as usize;

/// Where the census looks: the service's VIP and port, its SNAT addresses and port
/// range, and the client addresses whose every source port is checked.
pub struct Scope<'a> {
    pub vip: IpAddr,
    pub vip_port: u16,
    pub snat: &'a [IpAddr],
    pub ports: RangeInclusive<u16>,
    pub clients: &'a [IpAddr],
}

/// Reads the newest loaded `LB_NAT` (the agent's) and takes the census of `scope`'s TCP
/// service (IPv4).
pub fn take(scope: &Scope<'_>) -> Result<NatCensus, Error> {
    let entries = read_newest()?;
    let now = crate::bpf::clock::nat_seconds_now();
    Ok(census(&entries, scope, now))
}

fn read_newest() -> Result<Vec<(FlowKey, NatValue)>, Error> {
    let short = &map_names::NAT[..map_names::NAT.len().min(15)];
    let id = loaded_maps()
        .filter_map(Result::ok)
        .filter(|m| m.name_as_str() == Some(short))
        .map(|m| m.id())
        .max()
        .ok_or_else(|| Error::Unexpected("no LB_NAT map is loaded".into()))?;
    let data = MapData::from_id(id).map_err(Error::bpf("reading LB_NAT"))?;
    let map: Array<MapData, NatBucket> =
        Array::try_from(Map::Array(data)).map_err(Error::bpf("reading LB_NAT"))?;
    let mut out = Vec::new();
    for i in 0..map.len() {
        let b = map
            .get(&i, 0)
            .map_err(|e| Error::bpf("reading LB_NAT")(e))?;
        for s in b.ways.iter().filter(|s| s.word & SLOT_LIVE != 0) {
            out.push((s.key, s.value));
        }
    }
    Ok(out)
}

fn v4(addr: IpAddr) -> Option<u32> {
    match addr {
        IpAddr::V4(a) => Some(u32::from_ne_bytes(a.octets())),
        IpAddr::V6(_) => None,
    }
}

/// The row name of a TCP entry's state (docs/nat-ports.md).
fn row(state: u8) -> &'static str {
    use lb_common::maps::{NAT_S_ACKED, NAT_S_ESTABLISHED};
    let fins = state & (NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND);
    if state & NAT_S_RST != 0 {
        "7 reset"
    } else if fins == NAT_S_FIN_CLIENT | NAT_S_FIN_BACKEND {
        if state & NAT_S_BACKEND_FIRST != 0 {
            "6 closed, backend first"
        } else {
            "5 closed, client first"
        }
    } else if fins != 0 {
        "4 half-closed"
    } else if state & NAT_S_ACKED != 0 {
        "3 established"
    } else if state & NAT_S_ESTABLISHED != 0 {
        "2 half-open"
    } else {
        "1 unanswered"
    }
}

/// The offsets `nat::allocate` tries, in order, in a space of `total` pairs for a flow of
/// hash `h` (both passes).
pub fn walk(h: u32, total: u32) -> impl Iterator<Item = u32> {
    let stride = nat_stride(h, total);
    (0..WALK as u32).map(move |i| ((h % total) as u64 + i as u64 * stride as u64) as u32 % total)
}

/// Whether the second pass may take a TCP entry's pair: its row's time is over, or it
/// is a handshake silent for `NAT_HANDSHAKE_DISPLACE` (docs/nat-ports.md, "Spoofed SYN
/// floods").
fn reclaimable(v: &NatValue, now: u32) -> bool {
    nat_reclaimable(v, IPPROTO_TCP, now)
        || (v.state & !NAT_S_ESTABLISHED == 0
            && now.wrapping_sub(v.last_seen) >= NAT_HANDSHAKE_DISPLACE)
}

fn census(entries: &[(FlowKey, NatValue)], scope: &Scope<'_>, now: u32) -> NatCensus {
    let mut out = NatCensus::default();
    let (Some(vip), Some(snat)) = (
        v4(scope.vip),
        scope
            .snat
            .iter()
            .map(|a| v4(*a))
            .collect::<Option<Vec<_>>>(),
    ) else {
        return out;
    };
    let mut held: HashMap<FlowKey, NatValue> = HashMap::new();
    let mut backends = BTreeSet::new();
    for (k, v) in entries {
        if k.proto != IPPROTO_TCP || k.family != FAMILY_V4 {
            continue;
        }
        *out.rows.entry(row(v.state)).or_default() += 1;
        backends.insert((k.src[0], k.sport));
        held.insert(*k, *v);
    }
    let (min, max) = (*scope.ports.start() as u32, *scope.ports.end() as u32);
    let range = max - min + 1;
    let total = range * snat.len() as u32;
    let vip_port = scope.vip_port.to_be();
    for client in scope.clients.iter().filter_map(|a| v4(*a)) {
        for cport in 1u16..=u16::MAX {
            let key = FlowKey {
                src: [client, 0, 0, 0],
                dst: [vip, 0, 0, 0],
                sport: cport.to_be(),
                dport: vip_port,
                proto: IPPROTO_TCP,
                family: FAMILY_V4,
                _pad: [0; 2],
            };
            let h = flow_hash(&key, SEED_NAT_PORT);
            for &(baddr, bport) in &backends {
                let mut holders = Vec::with_capacity(WALK);
                let mut ports = Vec::with_capacity(WALK);
                for off in walk(h, total) {
                    let reply = FlowKey {
                        src: [baddr, 0, 0, 0],
                        dst: [snat[(off / range) as usize], 0, 0, 0],
                        sport: bport,
                        dport: ((min + off % range) as u16).to_be(),
                        proto: IPPROTO_TCP,
                        family: FAMILY_V4,
                        _pad: [0; 2],
                    };
                    ports.push(u16::from_be(reply.dport));
                    holders.push(match held.get(&reply) {
                        None => Holder::Free,
                        Some(v) if reclaimable(v, now) => Holder::Reclaimable,
                        Some(v) if nat_owned_by(v, &key) => {
                            if nat_backend_time_wait(v.state) {
                                Holder::OwnTimeWait
                            } else {
                                Holder::Own(v.state)
                            }
                        }
                        Some(v) => Holder::Other(v.state),
                    });
                }
                let blocked = holders.iter().filter(|h| h.blocks()).count();
                out.blocked[blocked] += 1;
                let (first, second) = holders.split_at(NAT_PORT_ATTEMPTS as usize);
                if !first.contains(&Holder::Free) && second.iter().all(Holder::blocks) {
                    out.refused += 1;
                }
                let worse = out.worst.as_ref().is_none_or(|w| blocked > w.blocked());
                if blocked > 0 && worse {
                    out.worst = Some(Worst {
                        client: format!(
                            "{}:{cport}",
                            std::net::Ipv4Addr::from(client.to_ne_bytes())
                        ),
                        backend: format!(
                            "{}:{}",
                            std::net::Ipv4Addr::from(baddr.to_ne_bytes()),
                            u16::from_be(bport)
                        ),
                        ports,
                        holders,
                    });
                }
            }
        }
    }
    out
}

impl Worst {
    fn blocked(&self) -> usize {
        self.holders.iter().filter(|h| h.blocks()).count()
    }
}

impl fmt::Display for NatCensus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LB_NAT rows {:?}; client ports x backends by candidates blocked (0..=16) {:?}, refused now {}",
            self.rows, self.blocked, self.refused
        )?;
        if let Some(w) = &self.worst {
            write!(
                f,
                "; worst {} -> {}: ports {:?} held {:?}",
                w.client, w.backend, w.ports, w.holders
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of the allocation walk without reclaims: `flows` new flows over
    /// `backends` x `total` pairs, each taking the first free pair of `offsets`; how
    /// many were refused.
    fn refused(total: u32, flows: u32, backends: u32, offsets: impl Fn(u32) -> Vec<u32>) -> u32 {
        let mut used = vec![vec![false; total as usize]; backends as usize];
        let mut refused = 0;
        for i in 0..flows {
            let key = FlowKey {
                src: [0x0a00_0000 + i / 50_000, 0, 0, 0],
                dst: [0x0a00_00c8, 0, 0, 0],
                sport: ((i % 50_000) as u16 + 10_000).to_be(),
                dport: 80u16.to_be(),
                proto: IPPROTO_TCP,
                family: FAMILY_V4,
                _pad: [0; 2],
            };
            let h = flow_hash(&key, SEED_NAT_PORT);
            let b = &mut used[(flow_hash(&key, 7) % backends) as usize];
            match offsets(h).into_iter().find(|&o| !b[o as usize]) {
                Some(o) => b[o as usize] = true,
                None => refused += 1,
            }
        }
        refused
    }

    /// The figures of docs/nat-ports.md "Allocation": 3 backends x 40,000 pairs filled
    /// to 83 % and 67 %, the walk of 16 against the former 8 candidates with a stride
    /// drawn from the whole space.
    #[test]
    fn the_walk_of_16_refuses_far_fewer_flows_than_the_former_8() {
        let total = 40_000;
        let former = |h: u32| {
            let stride = 1 + (h >> 16) % (total - 1);
            (0..NAT_PORT_ATTEMPTS)
                .map(|i| ((h % total) as u64 + i as u64 * stride as u64) as u32 % total)
                .collect()
        };
        let now = |h: u32| walk(h, total).collect();
        for (flows, most) in [(100_000, 500), (80_000, 20)] {
            let (before, after) = (
                refused(total, flows, 3, former),
                refused(total, flows, 3, now),
            );
            println!("{flows} flows: former 8 refused {before}, the walk of 16 {after}");
            assert!(
                after <= most && after * 4 < before,
                "{flows}: {before} -> {after}"
            );
        }
    }
}
