//! docs/configuration.md is the reference of the config keys, and it agrees with the
//! parser both ways: every key the parser accepts (`config::accepted_keys`) has a row in
//! the table of its section (`## \`[agent]\``, `## \`[[service.probe]]\``, ...), or, for
//! the keys of an inline table, is shown as `key =` in the row of the key that takes it;
//! every key a row names, or shows in an inline table (`{ key = … }`), is accepted in
//! that table; every section is a table the parser reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use lb_agent::config::accepted_keys;

/// One section's table: the keys each row's first cell names, with the row's text.
type Rows = Vec<(Vec<String>, String)>;

fn reference() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The spans between backticks in `text`.
fn quoted(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The tables of `doc` by section path (`## \`[[service.server]]\`` gives
/// `service.server`), each row with the keys its first cell names.
fn sections(doc: &str) -> BTreeMap<String, Rows> {
    let mut out: BTreeMap<String, Rows> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            current = heading
                .trim()
                .strip_prefix('`')
                .and_then(|h| h.strip_suffix('`'))
                .map(|h| h.trim_matches(|c| c == '[' || c == ']').to_string());
            if let Some(path) = &current {
                out.entry(path.clone()).or_default();
            }
        } else if let Some(path) = &current
            && let Some(first) = line.strip_prefix('|').and_then(|l| l.split('|').next())
        {
            let keys = quoted(first);
            if !keys.is_empty() {
                out.get_mut(path)
                    .expect("entered")
                    .push((keys, line.to_string()));
            }
        }
    }
    out
}

/// The keys of the inline tables a row shows (`{ permanent = "2m" }` gives `permanent`).
fn inline_keys(row: &str) -> Vec<String> {
    quoted(row)
        .iter()
        .filter_map(|span| span.strip_prefix('{')?.strip_suffix('}'))
        .flat_map(|inner| inner.split(','))
        .filter_map(|pair| Some(pair.split_once('=')?.0.trim().to_string()))
        .collect()
}

/// What `doc` and the parser's key lists disagree on, one line each.
fn divergences(doc: &str) -> Vec<String> {
    let documented = sections(doc);
    let accepted: BTreeMap<&str, Vec<&str>> = accepted_keys().into_iter().collect();
    let mut out = Vec::new();
    for (path, keys) in &accepted {
        if path.is_empty() {
            // The top-level keys are the sections `[agent]` and `[[service]]`.
            for key in keys {
                if !documented.contains_key(*key) {
                    out.push(format!("table `{key}` has no section"));
                }
            }
        } else if let Some(rows) = documented.get(*path) {
            let named: BTreeSet<&str> = rows
                .iter()
                .flat_map(|(k, _)| k)
                .map(|k| k.as_str())
                .collect();
            for key in keys {
                // A key that is a table of its own (`service.server`) has its own section.
                if !named.contains(key) && !documented.contains_key(&format!("{path}.{key}")) {
                    out.push(format!("`{path}.{key}` is accepted but has no row"));
                }
            }
            for key in named {
                if !keys.contains(&key) {
                    out.push(format!("`{path}.{key}` has a row but is not accepted"));
                }
            }
        } else {
            // An inline table: its keys are shown in the row of the key that takes it.
            let (parent, key) = path.rsplit_once('.').expect("an inline table has a parent");
            let row = documented
                .get(parent)
                .and_then(|rows| rows.iter().find(|(k, _)| k.iter().any(|k| k == key)));
            let Some((_, row)) = row else {
                out.push(format!("`{path}` is accepted but has no row in `{parent}`"));
                continue;
            };
            for inner in keys {
                if !row.contains(&format!("{inner} =")) {
                    out.push(format!(
                        "`{path}.{inner}` is accepted but not shown in its row"
                    ));
                }
            }
            for shown in inline_keys(row) {
                if !keys.contains(&shown.as_str()) {
                    out.push(format!(
                        "`{path}.{shown}` is shown in its row but is not accepted"
                    ));
                }
            }
        }
    }
    for path in documented.keys() {
        if !accepted.contains_key(path.as_str()) {
            out.push(format!("section `{path}` is no table the parser reads"));
        }
    }
    out
}

#[test]
fn the_reference_documents_every_accepted_key_and_only_those() {
    let found = divergences(&reference());
    assert!(
        found.is_empty(),
        "docs/configuration.md and the parser's keys (lb-agent/src/config/fields.rs) \
         disagree:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_missing_row_an_extra_row_and_a_missing_or_extra_inline_key_are_found() {
    let doc = reference();
    let row = doc
        .lines()
        .find(|l| l.starts_with("| `xdp_mode` |"))
        .expect("the reference has a row for agent.xdp_mode");
    let without = doc.replace(&format!("{row}\n"), "");
    assert_eq!(
        divergences(&without),
        ["`agent.xdp_mode` is accepted but has no row"]
    );
    let extra = doc.replace(
        &format!("{row}\n"),
        &format!("{row}\n| `xdp_flags` | 0 | |\n"),
    );
    assert_eq!(
        divergences(&extra),
        ["`agent.xdp_flags` has a row but is not accepted"]
    );
    let unaccepted = doc.replace(
        "`{ permanent = true }`",
        "`{ permanent = true, forever = true }`",
    );
    assert_eq!(
        divergences(&unaccepted),
        ["`service.backup_switch.forever` is shown in its row but is not accepted"]
    );
    let unshown = doc.replace("permanent =", "permanently");
    assert_eq!(
        divergences(&unshown),
        ["`service.backup_switch.permanent` is accepted but not shown in its row"]
    );
}
