//! A publish that fails leaves its services marked: the next recompute (here another
//! service's verdict) publishes them again, over every server, so the maps catch up with
//! a verdict whose publish failed.

mod agent_util;

use std::{
    io,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use agent_util::{MAC, Scripted, parse, sa};
use lb_agent::{
    agent::{Agent, Environment, StaticNeighbors},
    dataplane::{Dataplane, DataplaneError, memory::MemoryDataplane},
    probe::{ProbeOutcome, ProbeReport},
    publish::{addr_words, vip_key},
};
use lb_common::{
    IPPROTO_TCP, counters,
    maps::{BACKEND_F_SERVING, Backend, BackendStats, ServiceMeta, ServiceStats, VipKey},
};

/// The in-memory data plane, whose writes fail while `failing` is set.
#[derive(Default)]
struct Flaky {
    inner: MemoryDataplane,
    failing: Arc<AtomicBool>,
}

impl Flaky {
    fn check(&self) -> Result<(), DataplaneError> {
        if self.failing.load(Ordering::Relaxed) {
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

type TestAgent = Agent<Flaky, Scripted, StaticNeighbors>;

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

#[tokio::test(start_paused = true)]
async fn a_failed_publish_is_retried_by_the_next_recompute() {
    let failing = Arc::new(AtomicBool::new(false));
    let dp = Flaky {
        failing: failing.clone(),
        ..Flaky::default()
    };
    let neighbors = StaticNeighbors {
        default: Some(MAC),
        ..Default::default()
    };
    let (mut agent, _handles) = Agent::new(
        dp,
        Arc::new(Scripted::default()),
        Arc::new(neighbors),
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
    let x = sa("10.0.1.2:80");
    let (entry, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(
        in_table && entry.flags & BACKEND_F_SERVING != 0,
        "x is in traffic"
    );

    failing.store(true, Ordering::Relaxed);
    let down = verdict(&mut agent, "a", x, false);
    assert!(
        agent.on_probe_report(down).is_err(),
        "the map write fails: so does the publish"
    );
    failing.store(false, Ordering::Relaxed);
    let (_, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(in_table, "nothing was written");

    // The next recompute is another service's verdict: it must take `a` again.
    let other = verdict(&mut agent, "b", sa("10.0.2.1:80"), false);
    agent.on_probe_report(other).expect("publish");
    let (entry, in_table) = published(&agent.dataplane().inner, "10.0.200.1:80", x);
    assert!(
        !in_table && entry.flags & BACKEND_F_SERVING == 0,
        "the failed verdict reached the maps with the next publish"
    );
    let (work, report) = (agent.last_membership(), agent.last_publish());
    assert_eq!(
        (work.computed, work.updated, report.services_given),
        (1, 1, 2),
        "`a` computed again over every server, `b` updated for its verdict: {work:?} {report:?}"
    );
}
