//! The publish pipeline's end ([`Publishing`]): the [`Publisher`], which owns what was
//! written to the maps (ids, tables), the retry of failed publishes
//! (`publish_retry.rs`), and what the last recompute and publish did (tests, benchmarks,
//! the propagation histogram). `recompute.rs` decides what to publish; this writes it.

use std::{collections::HashMap, net::IpAddr};

use tokio::time::Instant;

use super::{MembershipWork, ServiceRt, desired::desired_service, publish_retry::PublishRetry};
use crate::{
    dataplane::{Dataplane, PublishedState},
    publish::{DesiredBackend, DesiredService, PublishError, PublishReport, Publisher},
    view::Histogram,
};

/// The publisher, its retry schedule and the record of its last run.
pub(super) struct Publishing {
    publisher: Publisher,
    /// Services whose publish failed, retried on a spaced schedule (a failed full
    /// publish is retried full: only a full publish removes what the configuration no
    /// longer has).
    retry: PublishRetry,
    /// What the last publish did (tests and benchmarks check its scope).
    last_publish: PublishReport,
    /// What the last recompute did with membership.
    last_membership: MembershipWork,
    /// Verdict to maps written, for every publish that wrote something.
    propagation: Histogram,
}

impl Publishing {
    /// A pipeline that has published nothing, for maps of `max_backends` backends.
    pub fn new(max_backends: u32) -> Self {
        Publishing {
            publisher: Publisher::with_max_backends(max_backends),
            retry: PublishRetry::default(),
            last_publish: PublishReport::default(),
            last_membership: MembershipWork::default(),
            propagation: Histogram::default(),
        }
    }

    /// What is published (ids, backends, tables), read-only: only this pipeline writes.
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// Takes over what a previous run published (pinned maps).
    pub fn adopt(&mut self, state: &PublishedState) {
        self.publisher.adopt(state);
    }

    /// Publishes the whole descriptions in `desired` (every service when `all`) and
    /// the changed backends in `partial` (by index into `services`); a service whose
    /// changed backends are not enough for the publisher (`Publisher::apply_backends`)
    /// is described whole.
    pub fn publish<D: Dataplane>(
        &mut self,
        dp: &mut D,
        services: &[ServiceRt],
        macs: &HashMap<IpAddr, [u8; 6]>,
        mut desired: Vec<DesiredService>,
        partial: Vec<(usize, Vec<DesiredBackend>)>,
        all: bool,
    ) -> Result<PublishReport, PublishError> {
        let mut report = PublishReport::default();
        for (si, backends) in partial {
            let svc = &services[si];
            match self
                .publisher
                .apply_backends(&svc.cfg.name, &backends, dp)?
            {
                Some(done) => report.absorb(done),
                None => {
                    let outcome = svc.outcome.as_ref().expect("computed before publishing");
                    desired.push(desired_service(svc, outcome, macs));
                }
            }
        }
        if all {
            report.absorb(self.publisher.apply(&desired, dp)?);
        } else if !desired.is_empty() {
            report.absorb(self.publisher.apply_some(&desired, dp)?);
        }
        Ok(report)
    }

    /// The publish of `services` (`full`: every service) failed at `now` with `error`:
    /// they wait for the retry.
    pub fn failed(
        &mut self,
        services: impl IntoIterator<Item = String>,
        full: bool,
        now: Instant,
        error: &PublishError,
    ) {
        self.retry.failed(services, full, now, error.to_string());
    }

    /// A publish wrote `report`.
    pub fn succeeded(&mut self, report: PublishReport) {
        self.retry.succeeded();
        self.last_publish = report;
    }

    /// The last publish, if it wrote anything, took the time since `started` from the
    /// event to the maps.
    pub fn observe_propagation(&mut self, started: std::time::Instant) {
        let r = self.last_publish;
        if r.tables_published + r.backends_written + r.services_written > 0 {
            self.propagation.observe(started.elapsed().as_secs_f64());
        }
    }

    /// What the last recompute did with membership.
    pub fn set_membership_work(&mut self, work: MembershipWork) {
        self.last_membership = work;
    }

    /// The retry schedule of failed publishes (which services it holds, when it is
    /// due, its status).
    pub fn retry(&self) -> &PublishRetry {
        &self.retry
    }

    /// The retry schedule, to take what is due or release a service from it.
    pub fn retry_mut(&mut self) -> &mut PublishRetry {
        &mut self.retry
    }

    pub fn last_publish(&self) -> PublishReport {
        self.last_publish
    }

    pub fn last_membership(&self) -> MembershipWork {
        self.last_membership
    }

    pub fn propagation(&self) -> &Histogram {
        &self.propagation
    }
}
