//! Between the data plane's view of a nat connection (lb-common's 5-tuples and
//! `NatValue`, as `LB_CONN_EVENTS` reports them and `LB_NAT` holds them) and a sync
//! [`Record`] (addresses only). Everything a record needs is in the two 5-tuples: the
//! client's (client -> VIP) and the reply's (backend -> SNAT address and port).

use std::net::SocketAddr;

use lb_common::{
    events::{CONN_ENDED, CONN_ESTABLISHED, ConnEvent},
    maps::{FlowKey, NatValue},
};

use super::record::{Endpoint, Record, RecordKind};
use crate::publish::{addr_words, words_addr};

/// The record of a connection event: `Open` when it was established, `Close` when it
/// ended; `None` for a kind this agent does not know.
pub fn record_of_event(event: &ConnEvent) -> Option<Record> {
    let kind = match event.kind {
        CONN_ESTABLISHED => RecordKind::Open,
        CONN_ENDED => RecordKind::Close,
        _ => return None,
    };
    Some(record_of(kind, &event.client, &event.reply, &event.nat, 0))
}

/// A `Refresh` record of a `LB_NAT` entry (`reply` is its key) that carried a packet
/// `age_ms` ago.
pub fn refresh_of_entry(reply: &FlowKey, nat: &NatValue, age_ms: u32) -> Record {
    let client = FlowKey {
        src: nat.client_addr,
        dst: nat.vip_addr,
        sport: nat.client_port,
        dport: nat.vip_port,
        proto: reply.proto,
        family: reply.family,
        _pad: [0; 2],
    };
    record_of(RecordKind::Refresh, &client, reply, nat, age_ms)
}

fn record_of(
    kind: RecordKind,
    client: &FlowKey,
    reply: &FlowKey,
    nat: &NatValue,
    age_ms: u32,
) -> Record {
    let at = |words: [u32; 4], port: u16| {
        Endpoint::from(SocketAddr::new(
            words_addr(words, client.family),
            u16::from_be(port),
        ))
    };
    Record {
        kind,
        protocol: client.proto,
        state: nat.state,
        age_ms,
        vip: at(client.dst, client.dport),
        client: at(client.src, client.sport),
        backend: at(reply.src, reply.sport),
        snat: at(reply.dst, reply.dport),
    }
}

/// The client's 5-tuple of `record` (client -> VIP: the `LB_FLOWS` key).
pub fn client_key(record: &Record) -> FlowKey {
    key(record.protocol, record.client, record.vip)
}

/// The reply's 5-tuple of `record` (backend -> SNAT address and port: the `LB_NAT` key).
pub fn reply_key(record: &Record) -> FlowKey {
    key(record.protocol, record.backend, record.snat)
}

fn key(proto: u8, src: Endpoint, dst: Endpoint) -> FlowKey {
    let (src_words, family) = addr_words(src.ip());
    let (dst_words, _) = addr_words(dst.ip());
    FlowKey {
        src: src_words,
        dst: dst_words,
        sport: src.port().to_be(),
        dport: dst.port().to_be(),
        proto,
        family,
        _pad: [0; 2],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::record::tests::sample;
    use crate::dataplane::peers::PeerConnection;
    use lb_common::maps::{NAT_S_ACKED, NAT_S_ESTABLISHED};

    /// The event the data plane reports for `record`'s connection: its entry as the
    /// peer tables would hold it (backend id 7).
    fn event_of(record: &Record, kind: u32) -> ConnEvent {
        let conn = PeerConnection::new(
            client_key(record),
            reply_key(record),
            record.state,
            7,
            0,
            [0; 6],
        );
        ConnEvent {
            kind,
            _pad: 0,
            client: conn.client,
            reply: conn.reply,
            nat: conn.nat,
        }
    }

    #[test]
    fn an_event_becomes_the_record_it_was_made_from() {
        let record = Record {
            age_ms: 0,
            ..sample(42, RecordKind::Open)
        };
        assert_eq!(
            record_of_event(&event_of(&record, CONN_ESTABLISHED)),
            Some(record)
        );
        let closed = Record {
            kind: RecordKind::Close,
            ..record
        };
        assert_eq!(
            record_of_event(&event_of(&record, CONN_ENDED)),
            Some(closed)
        );
        assert_eq!(record_of_event(&event_of(&record, 99)), None);
    }

    #[test]
    fn ipv6_and_ports_keep_their_bytes() {
        let record = Record {
            kind: RecordKind::Open,
            protocol: lb_common::IPPROTO_UDP,
            state: NAT_S_ESTABLISHED | NAT_S_ACKED,
            age_ms: 0,
            vip: "[2001:db8::100]:53".parse().unwrap(),
            client: "[2001:db8:1::7]:40001".parse().unwrap(),
            backend: "[2001:db8:2::11]:5353".parse().unwrap(),
            snat: "[2001:db8::2]:1025".parse().unwrap(),
        };
        assert_eq!(
            record_of_event(&event_of(&record, CONN_ESTABLISHED)),
            Some(record)
        );
        assert_eq!(reply_key(&record).dport, 1025u16.to_be());
    }

    #[test]
    fn a_table_entry_refreshes_its_connection() {
        let record = sample(7, RecordKind::Open);
        let event = event_of(&record, CONN_ESTABLISHED);
        let refresh = refresh_of_entry(&event.reply, &event.nat, 1500);
        assert_eq!(
            refresh,
            Record {
                kind: RecordKind::Refresh,
                age_ms: 1500,
                ..record
            }
        );
    }
}
