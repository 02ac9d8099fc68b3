//! The metric families lb documents and the ones its contrib monitoring names: the rows
//! of docs/metrics.md, and every `lb_` family the Grafana dashboard
//! (`contrib/grafana/lb.json`) and the Prometheus rules (`contrib/prometheus/`) query,
//! so that scenarios can hold both against a running agent's `/metrics`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use crate::util::json::Json;

/// The repository's root (the parent of this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

/// `name -> type` of every table row of docs/metrics.md.
pub fn documented() -> BTreeMap<String, String> {
    documented_by_section()
        .into_iter()
        .map(|(name, (kind, _))| (name, kind))
        .collect()
}

/// The heading of docs/metrics.md's section of the families only an agent with
/// `[cluster]` exports.
pub const CLUSTER_SECTION: &str = "Cluster (with `[cluster]`)";

/// `name -> (type, heading of its section)` of every table row of docs/metrics.md.
pub fn documented_by_section() -> BTreeMap<String, (String, String)> {
    let text = read("docs/metrics.md");
    let mut section = String::new();
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = heading.trim().to_string();
        } else if line.starts_with("| `lb_") {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            out.insert(
                cells[1].trim_matches('`').to_string(),
                (cells[2].to_string(), section.clone()),
            );
        }
    }
    out
}

/// `name -> type` of every family a `/metrics` text declares (`# TYPE` lines).
pub fn exposed(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

/// The Prometheus rule file and its unit tests, relative to the repository.
pub const ALERT_RULES: &str = "contrib/prometheus/lb-alerts.yml";
pub const ALERT_TESTS: &str = "contrib/prometheus/lb-alerts.test.yml";
/// The Grafana dashboard, relative to the repository.
pub const DASHBOARD: &str = "contrib/grafana/lb.json";

/// Every `expr` of the dashboard's panels (rows included), in panel order.
pub fn dashboard_queries() -> Vec<String> {
    let dashboard = Json::parse(&read(DASHBOARD)).expect("contrib/grafana/lb.json is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    exprs
}

fn collect_exprs(v: &Json, out: &mut Vec<String>) {
    match v {
        Json::Object(map) => {
            if let Some(Json::String(expr)) = map.get("expr") {
                out.push(expr.clone());
            }
            map.values().for_each(|child| collect_exprs(child, out));
        }
        Json::Array(items) => items.iter().for_each(|child| collect_exprs(child, out)),
        _ => {}
    }
}

/// Every family the dashboard, the rules and the rules' tests name: each `lb_` word of
/// those files, a histogram's `_bucket`, `_sum` and `_count` series counted as its
/// family (by docs/metrics.md's types), with the file that names it.
pub fn named_in_contrib() -> BTreeMap<String, &'static str> {
    let histograms: BTreeSet<String> = documented()
        .into_iter()
        .filter(|(_, kind)| kind == "histogram")
        .map(|(name, _)| name)
        .collect();
    let mut named = BTreeMap::new();
    for file in [DASHBOARD, ALERT_RULES, ALERT_TESTS] {
        for word in lb_words(&read(file)) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| word.strip_suffix(suffix))
                .find(|base| histograms.contains(*base))
                .map_or(word.clone(), str::to_owned);
            named.entry(family).or_insert(file);
        }
    }
    named
}

/// The words of `text` that start with `lb_` (metric names: letters, digits, `_`).
fn lb_words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("lb_"))
        .map(str::to_owned)
        .collect()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_whole_metric_names() {
        let words = lb_words(r#"rate(lb_a_total{x="lb-agent"}[5m]) / lb_b_bucket"#);
        assert_eq!(
            words.into_iter().collect::<Vec<_>>(),
            ["lb_a_total", "lb_b_bucket"]
        );
    }
}
