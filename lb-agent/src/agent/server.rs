//! One backend as the agent tracks it: configured settings, runtime overrides, admin
//! state, health state machine, probe tasks, and the data-plane counters last seen.

use std::{net::SocketAddr, sync::Arc};

use lb_common::maps::BackendStats;
use tokio::time::Instant;

use crate::{
    health::{HealthState, ServerHealth},
    membership::{Admin, MemberHealth, MemberInput},
    probe::{ProbeTask, SharedSignals},
};

/// A server of a service.
pub(super) struct ServerRt {
    pub addr: SocketAddr,
    /// `addr` as the snapshot shows it, formatted once (not on every snapshot build).
    pub addr_text: String,
    /// Key its probe tasks report under (unique per incarnation).
    pub incarnation: usize,
    /// In effect now (config value unless changed at runtime).
    pub weight: u32,
    pub spare: bool,
    pub backup: u32,
    /// As the config file says; `None` for a server added at runtime.
    pub configured: Option<Configured>,
    pub admin: Admin,
    pub health: ServerHealth,
    /// What the probe tasks read: healthy? last client traffic?
    pub signals: Arc<SharedSignals>,
    /// Dropping these stops the probes.
    pub _probes: Vec<ProbeTask>,
    /// Data-plane counters at the last poll (deltas drive passive success and idle mode).
    pub last_stats: BackendStats,
}

/// A server's settings from the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Configured {
    pub weight: u32,
    pub spare: bool,
    pub backup: u32,
}

impl ServerRt {
    pub fn member_input(&self) -> MemberInput {
        let since = self.health.state_since();
        MemberInput {
            key: self.addr,
            weight: self.weight,
            spare: self.spare,
            backup: self.backup,
            // A server that never passed its essential probes was never in traffic:
            // neither fail-open nor the removal cap may put it there (membership rule 2, 5).
            health: match self.health.state() {
                HealthState::Up => MemberHealth::Usable,
                HealthState::Unavailable => MemberHealth::Passive { since },
                HealthState::Unhealthy => MemberHealth::Failing { since },
                HealthState::Checking => MemberHealth::Checking {
                    was_up: self.health.was_up_before(),
                    pending: self.health.verdicts_pending(),
                },
            },
            admin: self.admin,
        }
    }

    /// `up`, `checking`, `unhealthy`, `unavailable`, `draining` or `down`.
    pub fn state_name(&self) -> &'static str {
        match self.admin {
            Admin::Down => "down",
            Admin::Drain => "draining",
            Admin::Up => self.health.state().as_str(),
        }
    }

    /// Settings changed at runtime that differ from the file.
    pub fn differs_from_config(&self) -> Vec<String> {
        let mut out = Vec::new();
        match self.configured {
            None => out.push("added at runtime".into()),
            Some(c) => {
                if c.weight != self.weight {
                    out.push(format!("weight {} (file: {})", self.weight, c.weight));
                }
                if c.spare != self.spare {
                    out.push(format!("spare {} (file: {})", self.spare, c.spare));
                }
            }
        }
        match self.admin {
            Admin::Up => {}
            Admin::Drain => out.push("drained at runtime".into()),
            Admin::Down => out.push("down at runtime".into()),
        }
        out
    }

    /// Applies new data-plane counters; returns (new successful connections, whether
    /// client traffic arrived).
    pub fn absorb_stats(&mut self, stats: BackendStats, now: Instant) -> (u64, bool) {
        let ok = stats.conn_ok.saturating_sub(self.last_stats.conn_ok);
        let traffic = stats.packets > self.last_stats.packets;
        self.last_stats = stats;
        if traffic {
            self.signals.note_traffic(now);
        }
        (ok, traffic)
    }
}
