//! The acceptor: the peers' connections to this node. It checks each hello (member,
//! fingerprint, version), asks for a bulk resync when it holds none from the sender's
//! incarnation, applies batches in sequence (counting replays), and acknowledges.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::io::BufReader;

use super::error::SyncError;
use super::frame::{Frame, MAX_BODY, VERSION, Verdict};
use super::record::Record;
use super::stats::Refusal;
use super::{Shared, is_crypto};

/// How long a refused dialer has to read the welcome before the connection closes.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// Accepts connections until the endpoint closes.
pub(super) async fn accept(shared: Arc<Shared>, endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        tokio::spawn(serve(shared.clone(), incoming));
    }
}

async fn serve(shared: Arc<Shared>, incoming: quinn::Incoming) {
    let conn = match incoming.await {
        Ok(c) => c,
        Err(e) => {
            if is_crypto(&e) {
                shared.refusals.count(Refusal::WrongKey, 1);
            }
            tracing::debug!("cluster sync: refused a handshake: {e}");
            return;
        }
    };
    let _tracked = shared.track(&conn);
    let mut peer = None;
    let result = receive(&shared, &conn, &mut peer).await;
    if let Some(p) = peer {
        // Unless a newer connection of the same peer replaced this one.
        let mut t = shared.lock();
        let inbound = &mut t.inbound[p];
        if inbound
            .connection
            .as_ref()
            .is_some_and(|c| c.stable_id() == conn.stable_id())
        {
            inbound.connection = None;
            shared.peers[p].receiving.store(false, Relaxed);
        }
    }
    match result {
        Ok(()) => {}
        Err(SyncError::Malformed(_) | SyncError::Unexpected(_)) => {
            shared.refusals.count(Refusal::Malformed, 1);
            conn.close(2u8.into(), b"malformed");
        }
        Err(e) => tracing::debug!("cluster sync: a peer's connection ended: {e}"),
    }
}

/// Serves one connection; `peer` is set once its hello is accepted.
async fn receive(
    shared: &Arc<Shared>,
    conn: &quinn::Connection,
    peer: &mut Option<usize>,
) -> Result<(), SyncError> {
    let (mut send, recv) = conn.accept_bi().await?;
    let mut recv = BufReader::with_capacity(MAX_BODY + 5, recv);
    let mut body = Vec::new();
    let Some(Frame::Hello {
        version,
        fingerprint,
        incarnation,
        name,
    }) = Frame::read(&mut recv, &mut body).await?
    else {
        return Err(SyncError::Unexpected("a frame other than the hello"));
    };
    let index = shared
        .members
        .index_of(&name)
        .filter(|&i| i != shared.members.own_index());
    let verdict = if version != VERSION {
        Verdict::OtherVersion
    } else if index.is_none() {
        Verdict::ForeignNode
    } else if fingerprint != shared.fingerprint {
        Verdict::OtherFingerprint
    } else {
        Verdict::Accepted
    };
    let mut buf = Vec::new();
    let Some(index) = index.filter(|_| verdict == Verdict::Accepted) else {
        shared.refusals.count(
            match verdict {
                Verdict::OtherVersion => Refusal::Version,
                Verdict::ForeignNode => Refusal::ForeignNode,
                _ => Refusal::Fingerprint,
            },
            1,
        );
        tracing::warn!(%name, "cluster sync: refused a peer's hello: {verdict:?}");
        Frame::Welcome {
            verdict,
            bulk_wanted: false,
            next_seq: 0,
        }
        .encode(&mut buf);
        send.write_all(&buf).await?;
        let _ = send.finish();
        let _ = tokio::time::timeout(REFUSAL_LINGER, conn.closed()).await;
        conn.close(1u8.into(), b"refused");
        return Ok(());
    };
    *peer = Some(index);

    let (generation, bulk_wanted, next_seq) = {
        let mut t = shared.lock();
        let inbound = &mut t.inbound[index];
        if let Some(old) = inbound.connection.replace(conn.clone()) {
            old.close(0u8.into(), b"replaced");
        }
        inbound.generation += 1;
        if inbound.incarnation != Some(incarnation) || !inbound.bulk_done {
            inbound.incarnation = Some(incarnation);
            inbound.bulk_done = false;
            inbound.next_seq = 0;
        }
        (inbound.generation, !inbound.bulk_done, inbound.next_seq)
    };
    if bulk_wanted {
        shared.peers[index].bulk_received.store(false, Relaxed);
    }
    Frame::Welcome {
        verdict,
        bulk_wanted,
        next_seq,
    }
    .encode(&mut buf);
    send.write_all(&buf).await?;
    shared.peers[index].receiving.store(true, Relaxed);

    loop {
        let Some(frame) = Frame::read(&mut recv, &mut body).await? else {
            return Ok(());
        };
        let ack = {
            let mut t = shared.lock();
            let now = Instant::now();
            let tables = &mut *t;
            let inbound = &mut tables.inbound[index];
            if inbound.generation != generation {
                return Ok(());
            }
            let (records, ack): (&[Record], _) = match &frame {
                Frame::Batch { first_seq, records } => {
                    if !inbound.bulk_done || *first_seq > inbound.next_seq {
                        return Err(SyncError::Unexpected("a batch out of sequence"));
                    }
                    let seen = (inbound.next_seq - first_seq).min(records.len() as u64);
                    shared.refusals.count(Refusal::Replayed, seen);
                    inbound.next_seq = inbound.next_seq.max(first_seq + records.len() as u64);
                    (&records[seen as usize..], Some(inbound.next_seq))
                }
                Frame::Bulk { records } => {
                    // A bulk may also come on a live connection (the sender's resend
                    // window no longer reached back): batches wait for its end.
                    inbound.bulk_done = false;
                    (records, None)
                }
                Frame::BulkEnd { next_seq, .. } if !inbound.bulk_done => {
                    inbound.bulk_done = true;
                    inbound.next_seq = *next_seq;
                    (&[], Some(*next_seq))
                }
                _ => return Err(SyncError::Unexpected("a frame out of place")),
            };
            // Room for every record at once: most become a change, and a list grown by
            // doubling would copy its 144-byte changes again at each step.
            let mut changes = Vec::with_capacity(records.len());
            tables
                .replicas
                .apply_all(records, now, true, |change| changes.push(change));
            shared.peers[index]
                .received
                .fetch_add(records.len() as u64, Relaxed);
            drop(t);
            shared.emit(changes);
            ack
        };
        if matches!(frame, Frame::BulkEnd { .. }) {
            shared.peers[index].bulk_received.store(true, Relaxed);
            shared.check_resync();
        }
        if let Some(next_seq) = ack {
            buf.clear();
            Frame::Ack { next_seq }.encode(&mut buf);
            send.write_all(&buf).await?;
        }
    }
}
