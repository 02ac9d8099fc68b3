//! What one node knows of the cluster's connections: the replica of every connection
//! (its own and its peers'), with the time each expires, and the log of the records it
//! published, numbered, that its peers have not all acknowledged (the resend window).

use std::collections::{BTreeMap, VecDeque};
use std::hash::BuildHasher;
use std::time::{Duration, Instant};

use super::record::{ConnKey, Endpoint, Record, RecordKind};
use super::shard::{self, Probe};

/// Added to a connection's idle time before its replica expires.
pub const EXPIRY_MARGIN: Duration = Duration::from_secs(5);
/// Most published records kept for resending: a peer that falls further behind gets a
/// bulk resync instead.
pub const RESEND_WINDOW: usize = 262_144;

/// A change the rest of the agent applies (to the data plane's peer maps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Install or refresh this connection (a closed one too, with its closed state,
    /// until its reuse time has passed).
    Upsert(Record),
    /// Remove it: expired (the record it was last known by, aged 0).
    Remove(Record),
}

/// What the replica table holds of a connection besides its key: 56 bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Replica {
    kind: RecordKind,
    state: u8,
    /// Whether a peer's record of it went to the data plane's peer tables (which then
    /// hold it until it expires, also after this node's own records of it).
    installed: bool,
    backend: Endpoint,
    snat: Endpoint,
    /// When it expires, in nanoseconds from the table's origin.
    expires: u64,
    /// The expiry wheel's slot that holds its key: at or before `expires`'s.
    due: u32,
}

impl Replica {
    /// Its record, the key giving the rest, aged `age_ms`.
    fn record(&self, key: &ConnKey, age_ms: u32) -> Record {
        key.record(self.kind, self.state, age_ms, self.backend, self.snat)
    }
}

/// How long a connection in `record`'s state lives without packets: the nat
/// lifecycle's reuse time for that state, plus [`EXPIRY_MARGIN`].
pub fn idle_limit(record: &Record) -> Duration {
    idle_limit_of(record.state, record.protocol)
}

fn idle_limit_of(state: u8, protocol: u8) -> Duration {
    let nat_seconds = lb_common::maps::nat_reuse_after(state, protocol);
    Duration::from_nanos(u64::from(nat_seconds) << 30) + EXPIRY_MARGIN
}

/// Shards of the replica table (a power of two). Each grows on its own and at its own
/// count, so a growth copies a small part of the table, never the whole (a million
/// replicas take tens of milliseconds to copy, and the sync waits meanwhile).
const SHARDS: usize = 1024;

/// Records whose slots [`Replicas::apply_all`] starts loading before it applies the
/// record in hand: enough to overlap the cache misses of a table far larger than the
/// caches.
const AHEAD: usize = 8;

type Shard = shard::Shard<ConnKey, Replica>;

/// Every connection this node knows, by its client side, and an expiry wheel: the keys
/// by the second (from `origin`) their replica is due to be looked at. A replica's key
/// sits in one slot at a time, at or before its expiry; a refresh that moves the expiry
/// later leaves it there, and the sweep that reaches the slot moves it on. So a sweep
/// costs the replicas due, not the table. Times are kept as nanoseconds from `origin`,
/// a day before the table was made.
#[derive(Debug)]
pub struct Replicas {
    shards: Vec<Shard>,
    /// Hashes keys, once per record: the hash picks the shard, the slot and the tag.
    hasher: foldhash::fast::RandomState,
    wheel: BTreeMap<u32, Vec<ConnKey>>,
    origin: Instant,
}

impl Default for Replicas {
    fn default() -> Self {
        Replicas {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            wheel: BTreeMap::new(),
            // A day back: before the last packet of every connection not expired yet.
            origin: Instant::now()
                .checked_sub(Duration::from_secs(86_400))
                .unwrap_or_else(Instant::now),
        }
    }
}

/// Seconds in a nanosecond time: its wheel slot.
fn slot_of(ns: u64) -> u32 {
    (ns / 1_000_000_000) as u32
}

/// The shard of a key's hash: bits apart from those that pick the slot (the low ones)
/// and the tag (the top 16).
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize & (SHARDS - 1)
}

impl Replicas {
    pub fn len(&self) -> usize {
        self.shards.iter().map(Shard::len).sum()
    }

    fn hash(&self, key: &ConnKey) -> u64 {
        self.hasher.hash_one(key)
    }

    /// `t` in nanoseconds from the origin.
    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// Applies `record` received at `now` (`from_peer`: a peer sent it; otherwise this
    /// node published it). Returns the change for the data plane, if any.
    #[cfg(test)]
    pub fn apply(&mut self, record: &Record, now: Instant, from_peer: bool) -> Option<Change> {
        let key = record.key();
        let hash = self.hash(&key);
        self.apply_hashed(record, key, hash, now, from_peer)
    }

    /// [`Replicas::apply`] for each of `records` in order, each change handed to
    /// `changed`; the table's slots for the records ahead are loaded meanwhile.
    pub fn apply_all(
        &mut self,
        records: &[Record],
        now: Instant,
        from_peer: bool,
        mut changed: impl FnMut(Change),
    ) {
        let keyed: Vec<(ConnKey, u64)> = records
            .iter()
            .map(|r| {
                let key = r.key();
                (key, self.hash(&key))
            })
            .collect();
        for &(_, hash) in keyed.iter().take(AHEAD) {
            self.shards[shard_of(hash)].prefetch(hash);
        }
        for (i, (record, &(key, hash))) in records.iter().zip(&keyed).enumerate() {
            if let Some(&(_, ahead)) = keyed.get(i + AHEAD) {
                self.shards[shard_of(ahead)].prefetch(ahead);
            }
            if let Some(change) = self.apply_hashed(record, key, hash, now, from_peer) {
                changed(change);
            }
        }
    }

    fn apply_hashed(
        &mut self,
        record: &Record,
        key: ConnKey,
        hash: u64,
        now: Instant,
        from_peer: bool,
    ) -> Option<Change> {
        // A closed connection stays until its closed state's reuse time has passed (as
        // an open one until its idle time has): the node that saw the close holds its
        // translation that long, so its owner must not hand the pair out before.
        let last_packet = now
            .checked_sub(Duration::from_millis(record.age_ms.into()))
            .unwrap_or(now);
        let expires_at = last_packet + idle_limit(record);
        let expired = expires_at <= now;
        let expires = self.ns(expires_at);
        let slot = slot_of(expires);
        let replica = Replica {
            kind: record.kind,
            state: record.state,
            installed: from_peer,
            backend: record.backend,
            snat: record.snat,
            expires,
            due: slot,
        };
        let hasher = &self.hasher;
        let rehash = |k: &ConnKey| hasher.hash_one(k);
        let shard = &mut self.shards[shard_of(hash)];
        match shard.probe(hash, &key) {
            Probe::Vacant(_) => {
                if record.kind == RecordKind::Close || expired {
                    return None;
                }
                shard.reserve_one(rehash);
                // Probed again: a growth moves the slots.
                let Probe::Vacant(at) = shard.probe(hash, &key) else {
                    unreachable!("a growth keeps the keys it holds, and only those");
                };
                shard.insert_at(at, hash, key, replica);
                self.wheel.entry(slot).or_default().push(key);
            }
            Probe::Found(at) => {
                let old = *shard.value_at(at);
                if expired {
                    // Its wheel entry finds it gone.
                    shard.remove_at(at, rehash);
                    return old.installed.then(|| Change::Remove(old.record(&key, 0)));
                }
                if old.expires > expires && record.kind != RecordKind::Close {
                    // An older report (a resent or bulk record): keep the later one.
                    return None;
                }
                let due = if old.due <= slot {
                    old.due
                } else {
                    self.wheel.entry(slot).or_default().push(key);
                    slot
                };
                *shard.value_at(at) = Replica {
                    due,
                    installed: from_peer || old.installed,
                    ..replica
                };
            }
        }
        Some(Change::Upsert(*record))
    }

    /// Removes the replicas expired at `now`; returns those the peer tables hold.
    pub fn expire(&mut self, now: Instant) -> Vec<Change> {
        let now = self.ns(now);
        let current = slot_of(now);
        let mut gone = Vec::new();
        while let Some(entry) = self.wheel.first_entry() {
            let slot = *entry.key();
            if slot > current {
                break;
            }
            let keys = entry.remove();
            let mut later: Vec<(u32, ConnKey)> = Vec::new();
            for key in keys {
                let hash = self.hash(&key);
                let hasher = &self.hasher;
                let shard = &mut self.shards[shard_of(hash)];
                let Probe::Found(at) = shard.probe(hash, &key) else {
                    continue;
                };
                let r = shard.value_at(at);
                if r.due != slot {
                    // An earlier expiry put it in an earlier slot, already looked at.
                    continue;
                }
                if r.expires <= now {
                    if r.installed {
                        gone.push(Change::Remove(r.record(&key, 0)));
                    }
                    shard.remove_at(at, |k| hasher.hash_one(k));
                } else {
                    r.due = slot_of(r.expires).max(slot);
                    later.push((r.due, key));
                }
            }
            for (due, key) in later {
                self.wheel.entry(due).or_default().push(key);
            }
            if slot == current {
                break;
            }
        }
        gone
    }

    /// Every connection as an open record aged at `now`, for a bulk resync.
    pub fn snapshot(&self, now: Instant) -> Vec<Record> {
        let now = self.ns(now);
        self.shards
            .iter()
            .flat_map(|shard| shard.iter())
            .map(|(key, r)| {
                let limit = idle_limit_of(r.state, key.protocol()).as_nanos() as u64;
                let last_packet = r.expires.saturating_sub(limit);
                let age_ms = (now.saturating_sub(last_packet) / 1_000_000).min(u32::MAX.into());
                Record {
                    kind: RecordKind::Open,
                    ..r.record(key, age_ms as u32)
                }
            })
            .collect()
    }
}

/// The records this node published, numbered from 1, while a peer may still need them.
#[derive(Debug)]
pub struct Outbox {
    /// Sequence number of `log[0]`.
    first: u64,
    log: VecDeque<(Record, Instant)>,
    window: usize,
}

impl Outbox {
    pub fn new(window: usize) -> Self {
        Outbox {
            first: 1,
            // Reserved whole (its pages are touched as records come): growing it would
            // copy the log while the sync waits.
            log: VecDeque::with_capacity(window + 1),
            window,
        }
    }

    /// The sequence number the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.first + self.log.len() as u64
    }

    /// Numbers and keeps `record`; the oldest goes when the window is full.
    pub fn push(&mut self, record: Record, now: Instant) {
        self.log.push_back((record, now));
        if self.log.len() > self.window {
            self.log.pop_front();
            self.first += 1;
        }
    }

    /// Whether the records from `seq` on are all still here.
    pub fn holds_from(&self, seq: u64) -> bool {
        seq >= self.first && seq <= self.next_seq()
    }

    /// Up to `max` records from `seq` on (`seq` must be held).
    pub fn read(&self, seq: u64, max: usize) -> Vec<Record> {
        let at = (seq - self.first) as usize;
        self.log
            .iter()
            .skip(at)
            .take(max)
            .map(|(r, _)| *r)
            .collect()
    }

    /// When the record `seq` was published, if held and published.
    pub fn published_at(&self, seq: u64) -> Option<Instant> {
        let at = seq.checked_sub(self.first)?;
        self.log.get(at as usize).map(|(_, t)| *t)
    }

    /// Forgets the records below `seq` (every peer acknowledged them).
    pub fn trim_below(&mut self, seq: u64) {
        while self.first < seq && !self.log.is_empty() {
            self.log.pop_front();
            self.first += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cluster::record::tests::sample;

    #[test]
    fn open_refresh_close_and_expiry() {
        let now = Instant::now();
        let mut r = Replicas::default();
        let open = sample(1, RecordKind::Open);
        assert_eq!(r.apply(&open, now, true), Some(Change::Upsert(open)));
        let refresh = Record {
            kind: RecordKind::Refresh,
            age_ms: 0,
            ..open
        };
        assert_eq!(r.apply(&refresh, now, true), Some(Change::Upsert(refresh)));
        // The bulk's older view of the same connection changes nothing.
        let stale = Record {
            age_ms: 60_000,
            ..open
        };
        assert_eq!(r.apply(&stale, now, true), None);
        assert_eq!(r.snapshot(now)[0].age_ms, 0);
        // A close keeps the replica, closed, for the closed state's reuse time.
        let close = Record {
            kind: RecordKind::Close,
            state: open.state | lb_common::maps::NAT_S_RST,
            ..open
        };
        assert_eq!(r.apply(&close, now, true), Some(Change::Upsert(close)));
        let closed_limit = idle_limit(&close);
        assert!(closed_limit < Duration::from_secs(10), "{closed_limit:?}");
        assert!(
            r.expire(now + closed_limit - Duration::from_secs(1))
                .is_empty()
        );
        assert_eq!(
            r.expire(now + closed_limit),
            vec![Change::Remove(Record { age_ms: 0, ..close })]
        );
        // A close of a connection this node never heard of changes nothing.
        assert_eq!(r.apply(&close, now, true), None);
        assert_eq!(r.len(), 0);

        // An established TCP connection lives 900 nat seconds plus the margin.
        r.apply(&open, now, true);
        let own = sample(2, RecordKind::Open);
        r.apply(&own, now, false);
        let limit = idle_limit(&open);
        assert!(limit > Duration::from_secs(960) && limit < Duration::from_secs(975));
        assert!(r.expire(now + limit - Duration::from_secs(1)).is_empty());
        assert_eq!(
            r.expire(now + limit),
            vec![Change::Remove(Record { age_ms: 0, ..open })]
        );
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn a_peers_connection_this_node_reports_too_leaves_the_peer_tables_when_it_expires() {
        // A peer's connection, installed here; then it lives here (this node refreshes
        // it) and ends here: the peer tables still hold it until it expires.
        let now = Instant::now();
        let mut r = Replicas::default();
        let open = sample(1, RecordKind::Open);
        assert_eq!(r.apply(&open, now, true), Some(Change::Upsert(open)));
        let refresh = Record {
            kind: RecordKind::Refresh,
            ..open
        };
        r.apply(&refresh, now, false);
        let close = Record {
            kind: RecordKind::Close,
            state: open.state | lb_common::maps::NAT_S_RST,
            ..open
        };
        r.apply(&close, now, false);
        assert_eq!(
            r.expire(now + idle_limit(&close)),
            vec![Change::Remove(Record { age_ms: 0, ..close })]
        );
        // This node's own connection never reached the peer tables: nothing to remove.
        let own = sample(2, RecordKind::Open);
        r.apply(&own, now, false);
        assert!(r.expire(now + idle_limit(&own)).is_empty());
    }

    #[test]
    fn a_snapshot_gives_each_connection_back_whole_and_aged() {
        let now = Instant::now();
        let mut r = Replicas::default();
        let v4 = Record {
            age_ms: 5_000,
            ..sample(7, RecordKind::Refresh)
        };
        let v6 = Record {
            kind: RecordKind::Open,
            protocol: lb_common::IPPROTO_UDP,
            state: 0,
            age_ms: 0,
            vip: "[2001:db8::100]:53".parse().unwrap(),
            client: "[2001:db8:1::7]:40000".parse().unwrap(),
            backend: "[2001:db8:2::11]:53".parse().unwrap(),
            snat: "[2001:db8::2]:2000".parse().unwrap(),
        };
        r.apply(&v4, now, true);
        r.apply(&v6, now, true);
        let mut snapshot = r.snapshot(now + Duration::from_secs(1));
        snapshot.sort_by_key(|rec| rec.protocol);
        assert_eq!(
            snapshot,
            vec![
                Record {
                    kind: RecordKind::Open,
                    age_ms: 6_000,
                    ..v4
                },
                Record {
                    age_ms: 1_000,
                    ..v6
                },
            ]
        );
    }

    #[test]
    fn the_wheel_expires_exactly_what_a_full_scan_would() {
        // Opens, refreshes (later expiries), stale reports and closes (earlier expiries)
        // in a pseudo-random order, swept every 700 ms: each sweep removes exactly the
        // replicas whose expiry has passed, as a scan of the whole table would.
        let start = Instant::now();
        let mut r = Replicas::default();
        let mut model: HashMap<ConnKey, (Instant, bool)> = HashMap::new();
        let mut seed = 0x9e37_79b9_u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        let udp = |n: u32, kind| Record {
            protocol: lb_common::IPPROTO_UDP,
            state: 0,
            ..sample(n, kind)
        };
        for step in 0..4_000u32 {
            let now = start + Duration::from_millis(u64::from(step) * 700 / 20);
            let n = next(300) as u32;
            let kind = match next(4) {
                0 | 1 => RecordKind::Open,
                2 => RecordKind::Refresh,
                _ => RecordKind::Close,
            };
            let record = Record {
                age_ms: next(40_000) as u32,
                ..udp(n, kind)
            };
            let from_peer = next(2) == 0;
            if let Some(change) = r.apply(&record, now, from_peer) {
                let key = record.key();
                match change {
                    Change::Upsert(_) => {
                        let installed = from_peer || model.get(&key).is_some_and(|(_, i)| *i);
                        let last = now - Duration::from_millis(record.age_ms.into());
                        model.insert(key, (last + idle_limit(&record), installed));
                    }
                    Change::Remove(_) => {
                        model.remove(&key);
                    }
                }
            } else if record.kind != RecordKind::Close || model.contains_key(&record.key()) {
                // Refused as stale, or expired on arrival (and not installed).
                let last = now
                    .checked_sub(Duration::from_millis(record.age_ms.into()))
                    .unwrap_or(now);
                if last + idle_limit(&record) <= now {
                    model.remove(&record.key());
                }
            }
            if step % 20 == 19 {
                let mut gone: Vec<ConnKey> = r
                    .expire(now)
                    .into_iter()
                    .map(|c| match c {
                        Change::Remove(rec) => rec.key(),
                        Change::Upsert(_) => panic!("a sweep only removes"),
                    })
                    .collect();
                let mut expected: Vec<ConnKey> = model
                    .iter()
                    .filter(|(_, (expires, installed))| *expires <= now && *installed)
                    .map(|(k, _)| *k)
                    .collect();
                model.retain(|_, (expires, _)| *expires > now);
                gone.sort();
                expected.sort();
                assert_eq!(gone, expected, "step {step}");
                assert_eq!(r.len(), model.len(), "step {step}");
            }
        }
    }

    #[test]
    fn the_outbox_numbers_records_and_keeps_a_window() {
        let now = Instant::now();
        let mut o = Outbox::new(4);
        assert_eq!(o.next_seq(), 1);
        for n in 0..6 {
            o.push(sample(n, RecordKind::Open), now);
        }
        assert_eq!(o.next_seq(), 7);
        assert!(!o.holds_from(2));
        assert!(o.holds_from(3) && o.holds_from(7) && !o.holds_from(8));
        assert_eq!(
            o.read(5, 10),
            vec![sample(4, RecordKind::Open), sample(5, RecordKind::Open)]
        );
        assert!(o.read(7, 10).is_empty());
        o.trim_below(6);
        assert!(!o.holds_from(5) && o.holds_from(6));
        assert_eq!(o.published_at(6), Some(now));
        assert_eq!(o.published_at(7), None);
    }
}
