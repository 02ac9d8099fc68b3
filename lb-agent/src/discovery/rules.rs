//! The pure rules of discovery: which backends an answer stands for (port, backup level,
//! weight, spare), how long an answer is trusted, and how failed lookups back off.

use std::{collections::BTreeSet, net::SocketAddr, time::Duration};

use crate::config::{BackupLevel, Forwarding, MAX_WEIGHT, ServerAddress, ServerConfig};

use super::dns::{Answer, Target};

/// One backend a server entry stands for, with the settings it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expanded {
    pub addr: SocketAddr,
    pub weight: u32,
    /// 0 = primary group.
    pub backup: u32,
    pub spare: bool,
}

/// An SRV record that gave no backend, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub target: String,
    pub reason: String,
}

/// What `entry` stands for given `answer`.
///
/// - Port: the SRV record's; for a plain name, the entry's (the VIP's when omitted). With
///   `forwarding = "dsr"` a record whose port is not the VIP's is skipped (dsr keeps the
///   destination port), and so is port 0.
/// - Level ([`srv_level`]): `backup = "prio"` → the SRV priority; `backup = N` → N plus
///   the rank of the record's priority among the answer's distinct priorities; a plain
///   name → N.
/// - Weight ([`srv_weight`]): the entry's weight × the SRV weight (0 counts as 1).
/// - Spare: the entry's `spare`, for backends that land in the primary group only.
///
/// Backends are in answer order (priority, then weight, port, target, address); an address
/// that appears twice keeps its first (lowest-level) settings.
pub fn expand(
    entry: &ServerConfig,
    vip: SocketAddr,
    forwarding: Forwarding,
    answer: &Answer,
) -> (Vec<Expanded>, Vec<Skipped>) {
    let priorities: BTreeSet<u16> = answer
        .targets
        .iter()
        .filter_map(|t| t.srv.as_ref().map(|s| s.priority))
        .collect();
    let mut ordered: Vec<&Target> = answer.targets.iter().collect();
    ordered.sort_by_key(|t| t.srv.as_ref().map(|s| s.priority));
    let mut out: Vec<Expanded> = Vec::new();
    let mut skipped = Vec::new();
    for t in ordered {
        let (port, backup, weight) = match &t.srv {
            Some(s) => (
                s.port,
                srv_level(entry.backup, s.priority, &priorities),
                srv_weight(entry.weight, s.weight),
            ),
            None => (
                entry.address.port().unwrap_or(vip.port()),
                base_level(entry.backup),
                entry.weight,
            ),
        };
        let name = t
            .srv
            .as_ref()
            .map_or_else(|| host(entry), |s| s.target.clone());
        if port == 0 {
            skipped.push(Skipped {
                target: format!("{name} ({})", t.ip),
                reason: "SRV port 0".into(),
            });
            continue;
        }
        if forwarding.keeps_destination() && port != vip.port() {
            skipped.push(Skipped {
                target: format!("{name} ({})", t.ip),
                reason: format!(
                    "port {port}: forwarding = \"{forwarding}\" keeps the destination port, so it must be the VIP's ({})",
                    vip.port()
                ),
            });
            continue;
        }
        let addr = SocketAddr::new(t.ip, port);
        if out.iter().any(|e| e.addr == addr) {
            continue;
        }
        out.push(Expanded {
            addr,
            weight,
            backup,
            spare: entry.spare && backup == 0,
        });
    }
    (out, skipped)
}

/// The backup level of an SRV record of priority `priority`, `priorities` being every
/// distinct priority of the answer.
///
/// Angie's rule, restated in docs/references.md ("SRV priorities as levels"): with
/// `backup = "prio"` the record's priority is the level; otherwise `backup = N` is the
/// base level that the lowest priority gets, the next distinct priority N + 1, and so on,
/// and with no `backup` the lowest priority is the primary group (level 0). So relative
/// levels count distinct priorities (10, 20, 50 → N, N+1, N+2), not their differences.
pub fn srv_level(backup: BackupLevel, priority: u16, priorities: &BTreeSet<u16>) -> u32 {
    match backup {
        BackupLevel::Prio => u32::from(priority),
        BackupLevel::Level(base) => {
            let rank = priorities.range(..priority).count() as u32;
            base.saturating_add(rank)
        }
    }
}

/// The level of a non-SRV entry (`"prio"` needs SRV, so it never reaches here).
fn base_level(backup: BackupLevel) -> u32 {
    match backup {
        BackupLevel::Level(l) => l,
        BackupLevel::Prio => 0,
    }
}

/// A backend's weight from its entry's `weight` and its SRV record's weight: the product,
/// an SRV weight of 0 counting as 1, capped at [`MAX_WEIGHT`].
///
/// RFC 2782 weights are relative within one priority, and weight 0 means "no selection to
/// do" (with others above 0 it should get "a very small chance"): as 1 it gets exactly
/// that, and a record set all of weight 0 balances evenly. Multiplying keeps the entry's
/// own `weight` meaningful next to the file's other servers.
pub fn srv_weight(entry_weight: u32, srv_weight: u16) -> u32 {
    let w = u64::from(entry_weight) * u64::from(srv_weight.max(1));
    w.min(u64::from(MAX_WEIGHT)) as u32
}

/// How long an answer with TTL `ttl` is used before asking again: `ttl` within
/// `[min, max]` (a TTL of 0, "do not cache", means `min`).
pub fn refresh_after(ttl: Duration, min: Duration, max: Duration) -> Duration {
    ttl.clamp(min, max.max(min))
}

/// The wait before retrying after `failures` consecutive failed lookups (1, 2, …): `min`
/// doubled per further failure, at most `max`.
pub fn backoff(failures: u32, min: Duration, max: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(20);
    min.saturating_mul(1 << doublings).min(max.max(min))
}

fn host(entry: &ServerConfig) -> String {
    match &entry.address {
        ServerAddress::Name { host, .. } => host.clone(),
        ServerAddress::Socket(sa) => sa.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::discovery::dns::SrvFields;

    fn srv(priority: u16, weight: u16, port: u16, ip: &str) -> Target {
        Target {
            ip: ip.parse::<IpAddr>().unwrap(),
            srv: Some(SrvFields {
                priority,
                weight,
                port,
                target: format!("t{priority}.example."),
            }),
        }
    }

    fn entry(backup: BackupLevel, weight: u32, spare: bool) -> ServerConfig {
        let mut e = ServerConfig::new(ServerAddress::Name {
            host: "backends.example".into(),
            port: None,
        });
        e.resolve = true;
        e.service = Some("_http._tcp".into());
        e.backup = backup;
        e.weight = weight;
        e.spare = spare;
        e
    }

    fn answer(targets: Vec<Target>) -> Answer {
        Answer {
            targets,
            ttl: Duration::from_secs(30),
        }
    }

    const VIP: &str = "10.0.0.100:80";

    fn levels(backup: BackupLevel, answer: &Answer) -> Vec<(String, u32)> {
        let (out, _) = expand(
            &entry(backup, 1, false),
            VIP.parse().unwrap(),
            Forwarding::Nat,
            answer,
        );
        out.iter().map(|e| (e.addr.to_string(), e.backup)).collect()
    }

    #[test]
    fn prio_uses_the_priority_itself_as_the_level() {
        let a = answer(vec![
            srv(0, 1, 8080, "10.0.1.1"),
            srv(2, 1, 8080, "10.0.1.2"),
            srv(7, 1, 8080, "10.0.1.3"),
        ]);
        assert_eq!(
            levels(BackupLevel::Prio, &a),
            [
                ("10.0.1.1:8080".into(), 0),
                ("10.0.1.2:8080".into(), 2),
                ("10.0.1.3:8080".into(), 7)
            ],
            "backup = \"prio\": SRV priority n must become backup level n"
        );
    }

    #[test]
    fn a_base_level_counts_distinct_priorities_from_it() {
        let a = answer(vec![
            srv(50, 1, 8080, "10.0.1.3"),
            srv(10, 1, 8080, "10.0.1.1"),
            srv(10, 1, 8080, "10.0.1.4"),
            srv(20, 1, 8080, "10.0.1.2"),
        ]);
        assert_eq!(
            levels(BackupLevel::Level(3), &a),
            [
                ("10.0.1.1:8080".into(), 3),
                ("10.0.1.4:8080".into(), 3),
                ("10.0.1.2:8080".into(), 4),
                ("10.0.1.3:8080".into(), 5)
            ],
            "backup = 3: lowest priority → 3, next → 4, next → 5 (ranks, not differences)"
        );
        assert_eq!(
            levels(BackupLevel::Level(0), &a)
                .iter()
                .map(|(_, l)| *l)
                .collect::<Vec<_>>(),
            [0, 0, 1, 2],
            "no backup: the lowest priority is the primary group"
        );
    }

    #[test]
    fn weight_is_entry_weight_times_srv_weight_zero_counting_as_one() {
        assert_eq!(srv_weight(1, 0), 1);
        assert_eq!(srv_weight(3, 0), 3);
        assert_eq!(srv_weight(2, 5), 10);
        assert_eq!(srv_weight(1, 65535), MAX_WEIGHT, "capped at MAX_WEIGHT");
        assert_eq!(srv_weight(MAX_WEIGHT, 65535), MAX_WEIGHT);
    }

    #[test]
    fn spare_applies_only_to_backends_in_the_primary_group() {
        let a = answer(vec![
            srv(1, 1, 8080, "10.0.1.1"),
            srv(2, 1, 8080, "10.0.1.2"),
        ]);
        let (out, _) = expand(
            &entry(BackupLevel::Level(0), 1, true),
            VIP.parse().unwrap(),
            Forwarding::Nat,
            &a,
        );
        let spares: Vec<(u32, bool)> = out.iter().map(|e| (e.backup, e.spare)).collect();
        assert_eq!(spares, [(0, true), (1, false)]);
    }

    #[test]
    fn dsr_skips_records_whose_port_is_not_the_vips_and_port_zero_is_skipped() {
        let a = answer(vec![
            srv(1, 1, 80, "10.0.1.1"),
            srv(1, 1, 8080, "10.0.1.2"),
            srv(1, 1, 0, "10.0.1.3"),
        ]);
        let vip: SocketAddr = VIP.parse().unwrap();
        let (out, skipped) = expand(
            &entry(BackupLevel::Level(0), 1, false),
            vip,
            Forwarding::Dsr,
            &a,
        );
        let addrs: Vec<String> = out.iter().map(|e| e.addr.to_string()).collect();
        assert_eq!(addrs, ["10.0.1.1:80"]);
        assert_eq!(skipped.len(), 2, "8080 and 0 must be reported: {skipped:?}");
        let (out, _) = expand(
            &entry(BackupLevel::Level(0), 1, false),
            vip,
            Forwarding::Nat,
            &a,
        );
        assert_eq!(out.len(), 2, "nat takes any port but 0");
    }

    #[test]
    fn a_plain_name_takes_the_entry_port_level_and_weight() {
        let mut e = ServerConfig::new(ServerAddress::Name {
            host: "web.example".into(),
            port: Some(8443),
        });
        e.resolve = true;
        e.backup = BackupLevel::Level(2);
        e.weight = 4;
        let a = answer(vec![
            Target {
                ip: "10.0.1.9".parse().unwrap(),
                srv: None,
            },
            Target {
                ip: "10.0.1.8".parse().unwrap(),
                srv: None,
            },
        ]);
        let (out, _) = expand(&e, VIP.parse().unwrap(), Forwarding::Nat, &a);
        assert_eq!(
            out,
            [
                Expanded {
                    addr: "10.0.1.9:8443".parse().unwrap(),
                    weight: 4,
                    backup: 2,
                    spare: false
                },
                Expanded {
                    addr: "10.0.1.8:8443".parse().unwrap(),
                    weight: 4,
                    backup: 2,
                    spare: false
                },
            ]
        );
    }

    #[test]
    fn an_address_named_twice_keeps_its_lowest_level() {
        let a = answer(vec![
            srv(5, 1, 8080, "10.0.1.1"),
            srv(1, 9, 8080, "10.0.1.1"),
        ]);
        let (out, _) = expand(
            &entry(BackupLevel::Prio, 1, false),
            VIP.parse().unwrap(),
            Forwarding::Nat,
            &a,
        );
        assert_eq!(out.len(), 1);
        assert_eq!((out[0].backup, out[0].weight), (1, 9));
    }

    #[test]
    fn ttl_is_clamped_and_backoff_doubles_up_to_its_cap() {
        let (min, max) = (Duration::from_secs(1), Duration::from_secs(3600));
        let s = Duration::from_secs;
        assert_eq!(refresh_after(s(0), min, max), s(1));
        assert_eq!(refresh_after(s(30), min, max), s(30));
        assert_eq!(refresh_after(s(86400), min, max), s(3600));
        let (bmin, bmax) = (s(1), s(30));
        let waits: Vec<u64> = (1..=7).map(|n| backoff(n, bmin, bmax).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(backoff(u32::MAX, bmin, bmax), s(30));
    }
}
