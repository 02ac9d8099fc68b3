//! Which service a probe report belongs to, without a search of every service: a hint
//! from the report's server incarnation to the service's position, learnt on the first
//! report and checked on every later one (a stale hint costs the search it replaced).

use std::collections::HashMap;

/// Hints kept at most per server known (removed servers' hints are dropped by clearing).
const SLACK: usize = 2;

/// Incarnation → position in the agent's services, as last found.
#[derive(Debug, Default)]
pub(super) struct ReportRoutes {
    hints: HashMap<usize, usize>,
}

impl ReportRoutes {
    /// The service position last found for `incarnation`, unchecked.
    pub(super) fn hint(&self, incarnation: usize) -> Option<usize> {
        self.hints.get(&incarnation).copied()
    }

    /// `incarnation`'s reports belong to the service at `position`. Hints of servers
    /// gone since are dropped all at once when they outnumber the `servers` there are.
    pub(super) fn learn(&mut self, incarnation: usize, position: usize, servers: usize) {
        if self.hints.len() >= SLACK * servers.max(1) {
            self.hints.clear();
        }
        self.hints.insert(incarnation, position);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learnt_hint_is_returned_and_the_table_stays_bounded() {
        let mut routes = ReportRoutes::default();
        assert_eq!(routes.hint(7), None);
        routes.learn(7, 3, 10);
        assert_eq!(routes.hint(7), Some(3));
        for inc in 100..200 {
            routes.learn(inc, 1, 10);
            assert!(routes.hints.len() <= SLACK * 10);
        }
        assert_eq!(routes.hint(199), Some(1));
    }
}
