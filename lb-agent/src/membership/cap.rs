//! The removal cap (`max_unhealthy_percent`): how many unhealthy servers health may remove
//! from one group at once, and which unhealthy servers stay in traffic. As Azure's
//! health check: with a cap below 100 %, a group whose servers are **all** unhealthy
//! has none removed (removing them all would take the group out entirely; docs/references.md).

use std::{collections::BTreeMap, net::SocketAddr};

use tokio::time::Instant;

use super::{Admin, MemberInput};

/// A group where the cap holds unhealthy servers in traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Capped {
    /// 0 = primary group (with its spares).
    pub level: u32,
    /// Servers of the group whose admin state is `up`.
    pub servers: usize,
    /// Of those, unhealthy ones.
    pub unusable: usize,
    /// `floor(servers × pct / 100)`; 0 when every server is unusable (`all`).
    pub removable: usize,
    /// Every server of the group is unusable: none is removed.
    pub all: bool,
    /// Unhealthy servers kept in traffic: the most recent failures.
    pub held: Vec<SocketAddr>,
}

/// Groups of `servers` where more servers are unhealthy than `pct` allows removing, by level.
pub(super) fn apply(servers: &[MemberInput], pct: u8) -> Vec<Capped> {
    let pct = u64::from(pct.min(100));
    let mut groups: BTreeMap<u32, (usize, Vec<(Instant, SocketAddr)>)> = BTreeMap::new();
    // A `checking` server was never let in by health: neither in `n` nor removable.
    for s in servers
        .iter()
        .filter(|s| s.admin == Admin::Up && !s.health.is_checking())
    {
        let (n, unhealthy) = groups.entry(s.backup).or_default();
        *n += 1;
        if let Some(since) = s.health.unusable_since() {
            unhealthy.push((since, s.key));
        }
    }
    groups
        .into_iter()
        .filter_map(|(level, (n, mut unhealthy))| {
            let all = pct < 100 && unhealthy.len() == n;
            let removable = if all {
                0
            } else {
                usize::try_from(n as u64 * pct / 100).expect("at most n")
            };
            if unhealthy.len() <= removable {
                return None;
            }
            // Earliest failures are removed; the rest are held.
            unhealthy.sort_unstable();
            Some(Capped {
                level,
                servers: n,
                unusable: unhealthy.len(),
                removable,
                all,
                held: unhealthy[removable..].iter().map(|&(_, k)| k).collect(),
            })
        })
        .collect()
}
