//! The removal cap (`max_unhealthy_percent`): how many unhealthy servers health may remove
//! from one group at once, and which unhealthy servers stay in traffic. As Azure's
//! health check: with a cap below 100 %, a group whose servers are **all** unhealthy
//! has none removed (removing them all would take the group out entirely; docs/references.md).
//!
//! A group is the servers that carry its traffic: a level's servers without the spares.
//! An idle spare carries none, so its failure uses up nothing; a running spare stands in
//! for one removed server of the primary group, so each one lets health remove one more.

use std::{collections::BTreeMap, net::SocketAddr};

use tokio::time::Instant;

use super::{Admin, MemberInput};

/// A group where the cap holds unhealthy servers in traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Capped {
    /// 0 = primary group (without its spares).
    pub level: u32,
    /// Servers of the group whose admin state is `up`.
    pub servers: usize,
    /// Of those, unhealthy ones.
    pub unusable: usize,
    /// `floor(servers × pct / 100)`, plus the running spares in the primary group; 0 when
    /// every server is unusable and no spare stands in (`all`).
    pub removable: usize,
    /// Every server of the group is unusable and no spare stands in: none is removed.
    pub all: bool,
    /// Unhealthy servers kept in traffic: the most recent failures.
    pub held: Vec<SocketAddr>,
}

/// Groups of `servers` where more servers are unhealthy than `pct` allows removing, by
/// level, with `stand_ins` spares running in the primary group.
pub(super) fn apply(servers: &[MemberInput], pct: u8, stand_ins: usize) -> Vec<Capped> {
    let pct = u64::from(pct.min(100));
    let mut groups: BTreeMap<u32, (usize, Vec<(Instant, SocketAddr)>)> = BTreeMap::new();
    // A `checking` server was never let in by health: neither in `n` nor removable.
    for s in servers
        .iter()
        .filter(|s| s.admin == Admin::Up && !s.health.is_checking() && !s.is_spare())
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
            let stand_ins = if level == 0 { stand_ins } else { 0 };
            let all = pct < 100 && unhealthy.len() == n && stand_ins == 0;
            let removable = if all { 0 } else { removable(n, pct, stand_ins) };
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

/// `floor(n × pct / 100)` plus one per spare standing in, at most `n`.
pub(super) fn removable(n: usize, pct: u64, stand_ins: usize) -> usize {
    let own = usize::try_from(n as u64 * pct / 100).expect("at most n");
    own.saturating_add(stand_ins).min(n)
}
