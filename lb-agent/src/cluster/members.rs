//! The members of a cluster, from the config only: sorted by name, each node's index,
//! the fingerprint two nodes compare in their hello, and the slice of every nat
//! service's source ports that a member hands out (docs/internals/cluster-sync.md).

use std::net::SocketAddr;
use std::ops::RangeInclusive;

use ring::digest;

use crate::config::{ClusterConfig, Config, Forwarding};

/// One member: its name and the address its peers dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub address: SocketAddr,
}

/// This node and its peers, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Members {
    sorted: Vec<Member>,
    own: usize,
}

impl Members {
    pub fn new(cluster: &ClusterConfig) -> Self {
        let mut sorted: Vec<Member> = cluster
            .peers
            .iter()
            .map(|p| Member {
                name: p.name.clone(),
                address: p.address,
            })
            .chain([Member {
                name: cluster.node.clone(),
                address: cluster.listen,
            }])
            .collect();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let own = sorted
            .iter()
            .position(|m| m.name == cluster.node)
            .expect("this node is a member");
        Members { sorted, own }
    }

    /// Every member, by index.
    pub fn all(&self) -> &[Member] {
        &self.sorted
    }

    /// This node's index.
    pub fn own_index(&self) -> usize {
        self.own
    }

    /// The index of the member called `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.sorted.iter().position(|m| m.name == name)
    }

    /// The members other than this node, with their indexes.
    pub fn peers(&self) -> impl Iterator<Item = (usize, &Member)> {
        self.sorted
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != self.own)
    }

    /// SHA-256 over the sorted members, each as `name \0 address \0`.
    pub fn fingerprint(&self) -> [u8; 32] {
        let mut ctx = digest::Context::new(&digest::SHA256);
        for m in &self.sorted {
            ctx.update(m.name.as_bytes());
            ctx.update(&[0]);
            ctx.update(m.address.to_string().as_bytes());
            ctx.update(&[0]);
        }
        ctx.finish()
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes")
    }

    /// The ports of `range` this node hands out.
    pub fn own_ports(&self, range: &RangeInclusive<u16>) -> RangeInclusive<u16> {
        port_slice(range, self.own, self.sorted.len())
    }

    /// `cfg` as this node applies it: every nat service's `snat_ports` narrowed to this
    /// node's slice, so that the data plane hands out only ports no other member does.
    pub fn own_share(&self, cfg: &Config) -> Config {
        let mut own = cfg.clone();
        for svc in own
            .services
            .iter_mut()
            .filter(|s| s.forwarding == Forwarding::Nat)
        {
            svc.snat_ports = self.own_ports(&svc.snat_ports);
        }
        own
    }
}

/// The ports of `range` that member `index` of `members` hands out: the `index`-th of
/// `members` contiguous slices, `[min + i*len/n, min + (i+1)*len/n)`. `members` must not
/// exceed the range's length (check-config refuses it), so no slice is empty.
pub fn port_slice(
    range: &RangeInclusive<u16>,
    index: usize,
    members: usize,
) -> RangeInclusive<u16> {
    assert!(index < members, "member {index} of {members}");
    let min = u64::from(*range.start());
    let len = u64::from(*range.end()) - min + 1;
    let n = members as u64;
    assert!(n <= len, "{members} members for {len} ports");
    let i = index as u64;
    let first = min + i * len / n;
    let end = min + (i + 1) * len / n;
    first as u16..=(end - 1) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClusterPeer;

    fn cluster(node: &str, listen: &str, peers: &[(&str, &str)]) -> ClusterConfig {
        ClusterConfig {
            node: node.into(),
            listen: listen.parse().unwrap(),
            key_file: "/k".into(),
            resync_timeout: crate::config::DEFAULT_RESYNC_TIMEOUT,
            peers: peers
                .iter()
                .map(|(n, a)| ClusterPeer {
                    name: (*n).into(),
                    address: a.parse().unwrap(),
                })
                .collect(),
        }
    }

    #[test]
    fn members_are_sorted_by_name_and_every_node_agrees() {
        let b = Members::new(&cluster(
            "lb-b",
            "10.0.0.2:1",
            &[("lb-c", "10.0.0.3:1"), ("lb-a", "10.0.0.1:1")],
        ));
        let a = Members::new(&cluster(
            "lb-a",
            "10.0.0.1:1",
            &[("lb-b", "10.0.0.2:1"), ("lb-c", "10.0.0.3:1")],
        ));
        let names: Vec<&str> = b.all().iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["lb-a", "lb-b", "lb-c"]);
        assert_eq!((a.own_index(), b.own_index()), (0, 1));
        assert_eq!(a.all(), b.all());
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(b.index_of("lb-c"), Some(2));
        assert_eq!(b.peers().map(|(i, _)| i).collect::<Vec<_>>(), [0, 2]);
    }

    #[test]
    fn another_member_list_has_another_fingerprint() {
        let base = Members::new(&cluster("a", "10.0.0.1:1", &[("b", "10.0.0.2:1")]));
        for other in [
            cluster("a", "10.0.0.1:1", &[("b", "10.0.0.2:2")]),
            cluster("a", "10.0.0.1:1", &[("c", "10.0.0.2:1")]),
            cluster(
                "a",
                "10.0.0.1:1",
                &[("b", "10.0.0.2:1"), ("c", "10.0.0.3:1")],
            ),
        ] {
            assert_ne!(Members::new(&other).fingerprint(), base.fingerprint());
        }
    }

    #[test]
    fn slices_are_disjoint_contiguous_and_cover_the_range() {
        for (range, n) in [
            (1024..=32767u16, 3usize),
            (1024..=32767, 16),
            (1..=65535, 7),
            (5000..=5001, 2),
            (100..=115, 16),
            (0..=65535, 1),
        ] {
            let mut next = u32::from(*range.start());
            for i in 0..n {
                let s = port_slice(&range, i, n);
                assert_eq!(u32::from(*s.start()), next, "{range:?} / {n}: slice {i}");
                assert!(s.start() <= s.end());
                next = u32::from(*s.end()) + 1;
            }
            assert_eq!(next, u32::from(*range.end()) + 1, "{range:?} / {n}");
        }
        assert_eq!(port_slice(&(1024..=32767), 1, 3), 11605..=22185);
    }
}
