//! The dialer: this node's connection to one peer, on which it sends its records (a
//! bulk resync when the peer wants one, then every published record in order) and
//! reads the peer's acknowledgements; dialled again after any failure.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use tokio::io::BufReader;

use super::error::SyncError;
use super::frame::{Frame, MAX_RECORDS, VERSION, Verdict};
use super::identity::SERVER_NAME;
use super::stats::{PeerState, Refusal};
use super::{Shared, is_crypto};

/// First pause before dialling again; it doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Frames written with one call while catching up.
const FRAMES_PER_WRITE: usize = 16;

/// Keeps a connection to peer `peer` (a member index) while the component runs.
pub(super) async fn dial(shared: Arc<Shared>, endpoint: quinn::Endpoint, peer: usize) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let stats = &shared.peers[peer];
        stats.set_state(PeerState::Connecting);
        let started = Instant::now();
        let err = session(&shared, &endpoint, peer).await;
        match &err {
            SyncError::Connection(e) if is_crypto(e) => {
                shared.refusals.count(Refusal::WrongKey, 1);
            }
            SyncError::Refused(_) => stats.set_state(PeerState::Refused),
            SyncError::Malformed(_) | SyncError::Unexpected(_) => {
                shared.refusals.count(Refusal::Malformed, 1);
            }
            _ => {}
        }
        tracing::debug!(peer = %shared.members.all()[peer].name, "cluster sync: {err}");
        if started.elapsed() > MAX_BACKOFF {
            backoff = MIN_BACKOFF;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One connection, until it fails.
async fn session(shared: &Arc<Shared>, endpoint: &quinn::Endpoint, peer: usize) -> SyncError {
    let conn = match endpoint.connect(shared.members.all()[peer].address, SERVER_NAME) {
        Ok(connecting) => match connecting.await {
            Ok(c) => c,
            Err(e) => return e.into(),
        },
        Err(e) => return e.into(),
    };
    let _tracked = shared.track(&conn);
    shared.peers[peer].connects.fetch_add(1, Relaxed);
    let err = match run(shared, &conn, peer).await {
        Ok(never) => match never {},
        Err(e) => e,
    };
    if matches!(err, SyncError::Malformed(_) | SyncError::Unexpected(_)) {
        conn.close(2u8.into(), b"malformed");
    }
    err
}

enum Never {}

async fn run(
    shared: &Arc<Shared>,
    conn: &quinn::Connection,
    peer: usize,
) -> Result<Never, SyncError> {
    let stats = &shared.peers[peer];
    let (mut send, recv) = conn.open_bi().await?;
    let mut recv = BufReader::new(recv);
    let own = &shared.members.all()[shared.members.own_index()];
    let mut buf = Vec::new();
    Frame::Hello {
        version: VERSION,
        fingerprint: shared.fingerprint,
        incarnation: shared.incarnation,
        name: own.name.clone(),
    }
    .encode(&mut buf);
    send.write_all(&buf).await?;
    let mut body = Vec::new();
    let (bulk_wanted, resume_at) = match Frame::read(&mut recv, &mut body).await? {
        Some(Frame::Welcome {
            verdict: Verdict::Accepted,
            bulk_wanted,
            next_seq,
        }) => (bulk_wanted, next_seq),
        Some(Frame::Welcome { verdict, .. }) => return Err(SyncError::Refused(verdict)),
        None => return Err(SyncError::Unexpected("end of stream before the welcome")),
        Some(_) => return Err(SyncError::Unexpected("a frame other than the welcome")),
    };
    let mut next = if bulk_wanted || !shared.lock().outbox.holds_from(resume_at) {
        bulk(shared, &mut send, peer).await?
    } else {
        stats.acked.fetch_max(resume_at, Relaxed);
        resume_at
    };
    stats.set_state(PeerState::Up);

    let sending = async {
        let mut published = shared.published.subscribe();
        loop {
            let records = {
                let t = shared.lock();
                if t.outbox.holds_from(next) {
                    Some(t.outbox.read(next, MAX_RECORDS * FRAMES_PER_WRITE))
                } else {
                    None
                }
            };
            let Some(records) = records else {
                // Fell behind the resend window: a bulk resync on this connection.
                next = bulk(shared, &mut send, peer).await?;
                stats.set_state(PeerState::Up);
                continue;
            };
            if records.is_empty() {
                published.mark_unchanged();
                if next >= *published.borrow() {
                    published
                        .changed()
                        .await
                        .map_err(|_| SyncError::Unexpected("the component stopped"))?;
                }
                continue;
            }
            buf.clear();
            for (i, chunk) in records.chunks(MAX_RECORDS).enumerate() {
                Frame::Batch {
                    first_seq: next + (i * MAX_RECORDS) as u64,
                    records: chunk.to_vec(),
                }
                .encode(&mut buf);
            }
            send.write_all(&buf).await?;
            let n = records.len() as u64;
            let resent = stats.sent_high.load(Relaxed).saturating_sub(next).min(n);
            stats.resent.fetch_add(resent, Relaxed);
            stats.sent.fetch_add(n - resent, Relaxed);
            next += n;
            stats.sent_high.fetch_max(next, Relaxed);
        }
    };
    let acknowledged = async {
        loop {
            match Frame::read(&mut recv, &mut body).await? {
                Some(Frame::Ack { next_seq }) => {
                    stats.acked.fetch_max(next_seq, Relaxed);
                    trim(shared);
                }
                Some(_) => return Err(SyncError::Unexpected("a frame other than an ack")),
                None => return Err(SyncError::Unexpected("the peer closed its stream")),
            }
        }
    };
    tokio::select! {
        r = sending => r,
        r = acknowledged => r,
    }
}

/// Sends every known connection, then the bulk end; returns the sequence number the
/// live records continue from.
async fn bulk(
    shared: &Shared,
    send: &mut quinn::SendStream,
    peer: usize,
) -> Result<u64, SyncError> {
    shared.peers[peer].set_state(PeerState::Syncing);
    let (snapshot, next) = {
        let t = shared.lock();
        (t.replicas.snapshot(Instant::now()), t.outbox.next_seq())
    };
    let mut buf = Vec::with_capacity(FRAMES_PER_WRITE * (MAX_RECORDS * 80 + 7));
    for frames in snapshot.chunks(MAX_RECORDS * FRAMES_PER_WRITE) {
        buf.clear();
        for chunk in frames.chunks(MAX_RECORDS) {
            Frame::Bulk {
                records: chunk.to_vec(),
            }
            .encode(&mut buf);
        }
        send.write_all(&buf).await?;
    }
    buf.clear();
    Frame::BulkEnd {
        records: snapshot.len() as u64,
        next_seq: next,
    }
    .encode(&mut buf);
    send.write_all(&buf).await?;
    shared.peers[peer]
        .sent
        .fetch_add(snapshot.len() as u64, Relaxed);
    Ok(next)
}

/// Forgets the published records every peer acknowledged.
fn trim(shared: &Shared) {
    let min = shared
        .members
        .peers()
        .map(|(i, _)| shared.peers[i].acked.load(Relaxed))
        .min()
        .unwrap_or(1);
    shared.lock().outbox.trim_below(min);
}
