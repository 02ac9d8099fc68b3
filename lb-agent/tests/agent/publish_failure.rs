//! A publish that fails holds its services for a retry on a spaced schedule
//! (`FIRST_RETRY`, doubling up to `LAST_RETRY`): later batches of verdicts leave them
//! alone (before, every later batch re-ran them whole), the retry recomputes them over
//! every server, a failure is counted and shown, a reload or an operator's change tries
//! at once, and a backend is never shown SERVING outside its table meanwhile.

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::util::{MAC, Scripted, parse, sa};
use lb_agent::{
    agent::{Agent, Environment, FIRST_RETRY, Handles, LAST_RETRY, StaticNeighbours},
    dataplane::{Dataplane, DataplaneError},
    probe::{ProbeOutcome, ProbeReport},
    publish::{addr_words, vip_key},
    testing::MemoryDataplane,
};
use lb_common::{
    IPPROTO_TCP, counters,
    maps::{BACKEND_F_SERVING, Backend, BackendStats, ServiceMeta, ServiceStats, VipKey},
};
use tokio::time::Instant;

/// The in-memory data plane, whose writes fail while `failing` is set.
#[derive(Default)]
struct Flaky {
    inner: MemoryDataplane,
    failing: Arc<AtomicBool>,
    /// Writes tried while failing.
    refused: Arc<AtomicU64>,
}

impl Flaky {
    fn check(&self) -> Result<(), DataplaneError> {
        if self.failing.load(Ordering::Relaxed) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(DataplaneError::Previous {
                what: "injected map write failure".into(),
                source: io::Error::other("injected"),
            });
        }
        Ok(())
    }
}

impl Dataplane for Flaky {
    fn upsert_service(&mut self, vip: &VipKey, meta: &ServiceMeta) -> Result<(), DataplaneError> {
        self.check()?;
        self.inner.upsert_service(vip, meta)
    }
    fn remove_service(&mut self, vip: &VipKey, service_id: u32) -> Result<(), DataplaneError> {
        self.check()?;
        self.inner.remove_service(vip, service_id)
    }
    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<(), DataplaneError> {
        self.check()?;
        self.inner.set_backend(id, backend)
    }
    fn publish_table(&mut self, service_id: u32, table: &[u32]) -> Result<(), DataplaneError> {
        self.check()?;
        self.inner.publish_table(service_id, table)
    }
    fn write_slots(&mut self, service_id: u32, slots: &[(u32, u32)]) -> Result<(), DataplaneError> {
        self.check()?;
        self.inner.write_slots(service_id, slots)
    }
    fn counters(&self) -> Result<[u64; counters::COUNT as usize], DataplaneError> {
        self.inner.counters()
    }
    fn service_stats(&self, service_id: u32) -> Result<ServiceStats, DataplaneError> {
        self.inner.service_stats(service_id)
    }
    fn backend_stats(&self, backend_id: u32) -> Result<BackendStats, DataplaneError> {
        self.inner.backend_stats(backend_id)
    }
}

const TEXT: &str = "\
[[service]]\nname = \"a\"\nvip = \"10.0.200.1:80\"\nsnat_ip = \"10.0.0.2\"\n\
[[service.server]]\naddress = \"10.0.1.1:80\"\n\
[[service.server]]\naddress = \"10.0.1.2:80\"\n\
[[service.server]]\naddress = \"10.0.1.3:80\"\n\
[[service.probe]]\ntype = \"tcp\"\ninterval = \"1h\"\n\
[[service]]\nname = \"b\"\nvip = \"10.0.200.2:80\"\nsnat_ip = \"10.0.0.2\"\n\
[[service.server]]\naddress = \"10.0.2.1:80\"\n\
[[service.server]]\naddress = \"10.0.2.2:80\"\n\
[[service.probe]]\ntype = \"tcp\"\ninterval = \"1h\"\n";

type TestAgent = Agent<Flaky, Scripted, StaticNeighbours>;

fn verdict(agent: &mut TestAgent, service: &str, addr: SocketAddr, ok: bool) -> ProbeReport {
    let d = Duration::from_millis(1);
    ProbeReport {
        server: agent
            .server_key(service, addr)
            .expect("a configured server"),
        probe: 0,
        outcome: if ok {
            ProbeOutcome::pass(d, "test")
        } else {
            ProbeOutcome::fail(d, "test")
        },
        at: tokio::time::Instant::now(),
    }
}

/// `addr`'s id in service `vip` and the service's table, as the maps hold them.
fn published(dp: &MemoryDataplane, vip: &str, addr: SocketAddr) -> (Backend, bool) {
    let sid = dp
        .service(&vip_key(sa(vip), IPPROTO_TCP))
        .expect("service published")
        .service_id;
    let (words, _) = addr_words(addr.ip());
    let (id, entry) = dp
        .backends
        .iter()
        .find(|(_, b)| b.service_id == sid && b.addr == words && b.port == addr.port().to_be())
        .expect("backend published");
    (*entry, dp.tables[&sid].contains(id))
}

/// An agent over `Flaky` with every server of both services up and published.
async fn agent_all_up() -> (TestAgent, Handles, Arc<AtomicBool>, Arc<AtomicU64>) {
    let failing = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let dp = Flaky {
        failing: failing.clone(),
        refused: refused.clone(),
        ..Flaky::default()
    };
    let neighbours = StaticNeighbours {
        default: Some(MAC),
        ..Default::default()
    };
    let (mut agent, handles) = Agent::new(
        dp,
        Arc::new(Scripted::default()),
        Arc::new(neighbours),
        Environment::default(),
    );
    agent
        .apply_config(&parse(TEXT))
        .await
        .expect("first publish");
    for (service, addr) in [
        ("a", "10.0.1.1:80"),
        ("a", "10.0.1.2:80"),
        ("a", "10.0.1.3:80"),
        ("b", "10.0.2.1:80"),
        ("b", "10.0.2.2:80"),
    ] {
        let up = verdict(&mut agent, service, sa(addr), true);
        agent.on_probe_report(up).expect("publish");
    }
    (agent, handles, failing, refused)
}

/// What status says about server `addr` of service `service`: (in the table, its slots).
fn shown(agent: &mut TestAgent, handles: &Handles, service: &str, addr: &str) -> (bool, u32) {
    agent.publish_snapshot();
    let snap = handles.snapshot.borrow();
    let svc = snap
        .services
        .iter()
        .find(|s| s.name == service)
        .expect("service");
    let server = svc
        .servers
        .iter()
        .find(|s| s.address == addr)
        .expect("server");
    (server.active, server.slots)
}

#[tokio::test(start_paused = true)]
async fn a_failed_publish_waits_for_its_retry_not_for_the_next_batch() {
    let (mut agent, handles, failing, refused) = agent_all_up().await;
    let x = sa("10.0.1.2:80");
    let (entry, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(
        in_table && entry.flags & BACKEND_F_SERVING != 0,
        "x is in traffic"
    );

    failing.store(true, Ordering::Relaxed);
    let failed_at = Instant::now();
    let down = verdict(&mut agent, "a", x, false);
    assert!(
        agent.on_probe_report(down).is_err(),
        "the map write fails: so does the publish"
    );
    failing.store(false, Ordering::Relaxed);
    let (_, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(in_table, "nothing was written");
    agent.publish_snapshot();
    {
        let snap = handles.snapshot.borrow();
        assert_eq!(snap.publish.failures, 1, "the failure is counted");
        assert_eq!(snap.publish.held, vec!["a".to_string()]);
        assert!(
            snap.publish
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("injected")),
            "{:?}",
            snap.publish
        );
    }

    // A batch about another service does not take `a` (the old contract did, whole).
    tokio::time::advance(FIRST_RETRY / 2).await;
    let other = verdict(&mut agent, "b", sa("10.0.2.1:80"), false);
    agent.on_probe_report(other).expect("publish");
    let (work, report) = (agent.last_membership(), agent.last_publish());
    assert_eq!(
        (work.computed, work.updated, report.services_given),
        (0, 1, 1),
        "only `b`, updated for its verdict: {work:?} {report:?}"
    );
    let (entry, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(
        in_table && entry.flags & BACKEND_F_SERVING != 0,
        "`a` waits for its retry"
    );
    // Status shows what the maps hold: x is still in the table, so it may say so.
    // Status: `slots` are the maps' (x still has its slots), `active` is membership's
    // wish (out), and `publish.held` says that wish is not published yet.
    let (active, slots) = shown(&mut agent, &handles, "a", "10.0.1.2:80");
    assert!(
        !active && slots > 0,
        "slots follow the maps, not the unpublished verdict: active {active}, slots {slots}"
    );
    assert_eq!(
        handles.snapshot.borrow().publish.held,
        vec!["a".to_string()]
    );

    // The retry is the agent's next deadline, FIRST_RETRY after the failure.
    assert_eq!(agent.next_deadline(), Some(failed_at + FIRST_RETRY));
    tokio::time::advance(FIRST_RETRY / 2).await;
    agent.on_tick(Instant::now()).expect("the retry publishes");
    let (entry, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(
        !in_table && entry.flags & BACKEND_F_SERVING == 0,
        "the failed verdict reached the maps with the retry"
    );
    let work = agent.last_membership();
    assert_eq!(
        work.computed, 1,
        "`a` computed again over every server: {work:?}"
    );
    let (active, slots) = shown(&mut agent, &handles, "a", "10.0.1.2:80");
    assert!(!active && slots == 0, "out of the table, and shown so");
    let snap = handles.snapshot.borrow().clone();
    assert!(snap.publish.held.is_empty() && snap.publish.retry_in_seconds.is_none());
    assert_eq!(
        refused.load(Ordering::Relaxed),
        1,
        "one write was refused in all"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failure_that_persists_is_retried_at_doubling_intervals_up_to_the_last() {
    let (mut agent, handles, failing, refused) = agent_all_up().await;
    failing.store(true, Ordering::Relaxed);
    let x = sa("10.0.1.2:80");
    let down = verdict(&mut agent, "a", x, false);
    assert!(agent.on_probe_report(down).is_err());
    let mut at = Instant::now();
    let mut waits = Vec::new();
    for round in 0..9 {
        let due = agent.next_deadline().expect("a retry is scheduled");
        waits.push(due - at);
        // Verdicts about `a` before the retry try no write.
        let before = refused.load(Ordering::Relaxed);
        tokio::time::advance((due - Instant::now()) / 2).await;
        let flap = verdict(&mut agent, "a", sa("10.0.1.3:80"), round % 2 == 1);
        agent
            .on_probe_report(flap)
            .expect("held: nothing published");
        assert_eq!(
            refused.load(Ordering::Relaxed),
            before,
            "round {round}: no write"
        );
        tokio::time::advance(due - Instant::now()).await;
        at = Instant::now();
        assert!(
            agent.on_tick(at).is_err(),
            "round {round}: the retry fails again"
        );
        assert_eq!(
            refused.load(Ordering::Relaxed),
            before + 1,
            "round {round}: one try"
        );
    }
    let ms: Vec<u128> = waits.iter().map(|w| w.as_millis()).collect();
    assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    assert_eq!(*waits.last().unwrap(), LAST_RETRY);
    agent.publish_snapshot();
    assert_eq!(handles.snapshot.borrow().publish.failures, 10);

    // The cause goes away: the next retry publishes, and no retry is scheduled after.
    failing.store(false, Ordering::Relaxed);
    let due = agent.next_deadline().expect("the retry");
    tokio::time::advance(due - Instant::now()).await;
    agent.on_tick(Instant::now()).expect("published");
    let (entry, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(!in_table && entry.flags & BACKEND_F_SERVING == 0);
    assert_ne!(
        agent.next_deadline(),
        Some(due + LAST_RETRY),
        "no retry left"
    );
    agent.publish_snapshot();
    assert!(handles.snapshot.borrow().publish.held.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_reload_tries_a_held_service_at_once() {
    let (mut agent, _handles, failing, _refused) = agent_all_up().await;
    failing.store(true, Ordering::Relaxed);
    let x = sa("10.0.1.2:80");
    let down = verdict(&mut agent, "a", x, false);
    assert!(agent.on_probe_report(down).is_err());
    failing.store(false, Ordering::Relaxed);
    agent
        .apply_config(&parse(TEXT))
        .await
        .expect("the reload publishes every service");
    let (entry, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(
        !in_table && entry.flags & BACKEND_F_SERVING == 0,
        "published by the reload"
    );
}
