//! Probe durations of one service, one histogram per probe over all its servers
//! (`lb_probe_duration_seconds{service,probe}`): per server they would be a series set
//! per backend, thousands of them; the last duration per server stays a gauge.

use std::collections::BTreeMap;

use crate::{
    config::ProbeConfig,
    view::{Histogram, PROBE_DURATION_BOUNDS},
};

/// The histograms, in the order of the service's probes.
#[derive(Debug, Default)]
pub(super) struct ProbeDurations {
    by_probe: Vec<(String, Histogram)>,
}

impl ProbeDurations {
    /// Records a run of probe `idx` of `probes` (the service's probes now); the
    /// histograms start again when the probes' names changed (a reload).
    pub(super) fn observe(&mut self, probes: &[ProbeConfig], idx: usize, seconds: f64) {
        let same = self.by_probe.len() == probes.len()
            && self
                .by_probe
                .iter()
                .zip(probes)
                .all(|((name, _), p)| *name == p.name);
        if !same {
            self.by_probe = probes
                .iter()
                .map(|p| (p.name.clone(), Histogram::new(&PROBE_DURATION_BOUNDS)))
                .collect();
        }
        if let Some((_, h)) = self.by_probe.get_mut(idx) {
            h.observe(seconds);
        }
    }

    /// As the snapshot shows them.
    pub(super) fn status(&self) -> BTreeMap<String, Histogram> {
        self.by_probe.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProbeKind;

    #[test]
    fn each_probe_has_its_histogram_and_a_renamed_set_starts_again() {
        let probes = vec![
            ProbeConfig::new("http", ProbeKind::Tcp),
            ProbeConfig::new("tcp", ProbeKind::Tcp),
        ];
        let mut d = ProbeDurations::default();
        d.observe(&probes, 0, 0.003);
        d.observe(&probes, 0, 2.0);
        d.observe(&probes, 1, 0.0004);
        let s = d.status();
        assert_eq!(s["http"].count, 2);
        assert_eq!(s["tcp"].count, 1);
        assert_eq!(s["http"].counts[3], 1, "3 ms in the (2.5 ms, 5 ms] bucket");
        let renamed = vec![ProbeConfig::new("other", ProbeKind::Tcp)];
        d.observe(&renamed, 0, 0.01);
        let s = d.status();
        assert_eq!(s.len(), 1);
        assert_eq!(s["other"].count, 1);
    }
}
