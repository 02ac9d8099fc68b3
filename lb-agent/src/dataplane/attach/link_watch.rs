//! When to check that the interface still runs the agent's program: on every rtnetlink
//! link notification (`RTNLGRP_LINK`; an XDP change through netlink sends one) and at
//! least once per period (a change that sends none, or a lost notification).

use std::time::Duration;

use tokio::time::Interval;

use crate::netlink::{RTNLGRP_LINK, Subscription};

/// Resolves [`LinkWatch::due`] on a link notification or when the period ends.
pub struct LinkWatch {
    every: Interval,
    events: Option<Subscription>,
}

impl LinkWatch {
    /// Needs a tokio runtime. Without a notification socket (it could not be opened:
    /// logged) it falls back to the period alone.
    pub fn new(every: Duration) -> Self {
        let events = Subscription::open(&[RTNLGRP_LINK], None);
        if let Err(err) = &events {
            tracing::warn!(error = %err, "no link notifications; checking the XDP attachment every {every:?} only");
        }
        let mut every = tokio::time::interval(every);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        LinkWatch {
            every,
            events: events.ok(),
        }
    }

    /// Waits until a check is due. Cancel-safe.
    pub async fn due(&mut self) {
        let LinkWatch { every, events } = self;
        let Some(subscription) = events else {
            every.tick().await;
            return;
        };
        tokio::select! {
            _ = every.tick() => {}
            // The notifications' content does not matter (the check reads the
            // interface's state itself), nor does an overflow, which a check covers too.
            ready = subscription.ready() => {
                if let Err(err) = ready.and_then(|ready| ready.read_all(|_| {})) {
                    tracing::warn!(error = %err, "link notifications failed; checking the XDP attachment every {:?} only", every.period());
                    *events = None;
                }
            }
        }
    }
}
