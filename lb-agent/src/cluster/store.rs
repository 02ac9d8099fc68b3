//! What one node knows of the cluster's connections: the replica of every connection
//! (its own and its peers'), with the time each expires, and the log of the records it
//! published, numbered, that its peers have not all acknowledged (the resend window).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::record::{ConnKey, Record, RecordKind};

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
    /// Remove it: expired.
    Remove(Record),
}

#[derive(Debug, Clone, Copy)]
struct Replica {
    record: Record,
    last_packet: Instant,
    expires: Instant,
    /// Whether a peer's record of it went to the data plane's peer tables (which then
    /// hold it until it expires, also after this node's own records of it).
    installed: bool,
}

/// How long a connection in `record`'s state lives without packets: the nat
/// lifecycle's reuse time for that state, plus [`EXPIRY_MARGIN`].
pub fn idle_limit(record: &Record) -> Duration {
    let nat_seconds = lb_common::maps::nat_reuse_after(record.state, record.protocol);
    Duration::from_nanos(u64::from(nat_seconds) << 30) + EXPIRY_MARGIN
}

/// Every connection this node knows, by its client side.
#[derive(Debug, Default)]
pub struct Replicas {
    map: HashMap<ConnKey, Replica>,
}

impl Replicas {
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Applies `record` received at `now` (`from_peer`: a peer sent it; otherwise this
    /// node published it). Returns the change for the data plane, if any.
    pub fn apply(&mut self, record: &Record, now: Instant, from_peer: bool) -> Option<Change> {
        let key = record.key();
        if record.kind == RecordKind::Close && !self.map.contains_key(&key) {
            return None;
        }
        // A closed connection stays until its closed state's reuse time has passed (as
        // an open one until its idle time has): the node that saw the close holds its
        // translation that long, so its owner must not hand the pair out before.
        let last_packet = now
            .checked_sub(Duration::from_millis(record.age_ms.into()))
            .unwrap_or(now);
        let expires = last_packet + idle_limit(record);
        if expires <= now {
            return self
                .map
                .remove(&key)
                .filter(|r| r.installed)
                .map(|r| Change::Remove(r.record));
        }
        let installed = from_peer || self.map.get(&key).is_some_and(|r| r.installed);
        let replica = Replica {
            record: *record,
            last_packet,
            expires,
            installed,
        };
        match self.map.insert(key, replica) {
            Some(old) if old.expires > expires && record.kind != RecordKind::Close => {
                // An older report (a resent or bulk record): keep the later one.
                self.map.insert(key, old);
                None
            }
            _ => Some(Change::Upsert(*record)),
        }
    }

    /// Removes the replicas expired at `now`; returns those the peer tables hold.
    pub fn expire(&mut self, now: Instant) -> Vec<Change> {
        let mut gone = Vec::new();
        self.map.retain(|_, r| {
            let keep = r.expires > now;
            if !keep && r.installed {
                gone.push(Change::Remove(r.record));
            }
            keep
        });
        gone
    }

    /// Every connection as an open record aged at `now`, for a bulk resync.
    pub fn snapshot(&self, now: Instant) -> Vec<Record> {
        self.map
            .values()
            .map(|r| Record {
                kind: RecordKind::Open,
                age_ms: now
                    .saturating_duration_since(r.last_packet)
                    .as_millis()
                    .min(u32::MAX.into()) as u32,
                ..r.record
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
            log: VecDeque::new(),
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
        assert_eq!(r.expire(now + closed_limit), vec![Change::Remove(close)]);
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
        assert_eq!(r.expire(now + limit), vec![Change::Remove(open)]);
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
            vec![Change::Remove(close)]
        );
        // This node's own connection never reached the peer tables: nothing to remove.
        let own = sample(2, RecordKind::Open);
        r.apply(&own, now, false);
        assert!(r.expire(now + idle_limit(&own)).is_empty());
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
