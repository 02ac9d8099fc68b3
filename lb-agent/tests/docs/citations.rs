//! Every citation of the repository's own documents resolves: `DESIGN.md §N` (and
//! `§N.M`, `§N–§M`) and `BENCHMARKS.md §N` name a section that exists, `docs/NAME.md`
//! names a file that exists, a Markdown link in README/DESIGN/docs points at a file that
//! exists, nothing cites the outside reference texts (`reference/…`), which a reader
//! of the repository does not have (their content is restated in docs/), and README.md
//! reaches every page of docs/ through docs/index.md.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("lb-agent sits in the workspace")
        .to_path_buf()
}

/// Source and documentation files of the repository (not build outputs).
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                files(&p, out);
            }
        } else if [".rs", ".md", ".toml", ".sh", ".conf", ".service"]
            .iter()
            .any(|x| name.ends_with(x))
            || name == "run"
        {
            out.push(p);
        }
    }
}

/// Section numbers of a document: `## 5. Health` gives `5`; within it, the numbered
/// items `1. ...` at the start of a line give `5.1`.
fn sections(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        if let Some(rest) = line.strip_prefix("## ") {
            current = rest
                .split_once('.')
                .map(|(n, _)| n.trim().to_string())
                .filter(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
            out.extend(current.clone());
        } else if let Some(cur) = &current
            && let Some((n, _)) = line.split_once(". ")
            && !n.is_empty()
            && n.chars().all(|c| c.is_ascii_digit())
        {
            out.push(format!("{cur}.{n}"));
        }
    }
    out
}

/// The section numbers cited after each `prefix` (`"DESIGN.md §"`) in `text`:
/// `§5`, `§10.4`, and both ends of `§5–§7`.
fn cited(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices(prefix) {
        let mut rest = &text[at + prefix.len()..];
        loop {
            let n: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let n = n.trim_end_matches('.').to_string();
            if n.is_empty() {
                break;
            }
            rest = &rest[n.len()..];
            out.push(n);
            match rest.strip_prefix("–§").or_else(|| rest.strip_prefix("-§")) {
                Some(r) => rest = r,
                None => break,
            }
        }
    }
    out
}

#[test]
fn cited_sections_and_documents_exist() {
    let root = repo();
    let mut all = Vec::new();
    files(&root, &mut all);
    assert!(all.len() > 50, "walked too few files: {}", all.len());
    let docs = [
        (
            "DESIGN.md §",
            sections(&std::fs::read_to_string(root.join("DESIGN.md")).unwrap()),
        ),
        (
            "BENCHMARKS.md §",
            sections(&std::fs::read_to_string(root.join("BENCHMARKS.md")).unwrap()),
        ),
    ];
    let mut wrong = Vec::new();
    for file in &all {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        let shown = file.strip_prefix(&root).unwrap().display().to_string();
        if shown == "lb-agent/tests/docs/citations.rs" {
            continue;
        }
        for (prefix, known) in &docs {
            for n in cited(&text, prefix) {
                if !known.contains(&n) {
                    wrong.push(format!("{shown}: cites {prefix}{n}, which does not exist"));
                }
            }
        }
        for (at, _) in text.match_indices("docs/") {
            let before = text[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '/' || c == '.') {
                continue; // part of another path (`../docs/`, a URL)
            }
            let name: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '-' | '_' | '.'))
                .collect();
            let name = name.trim_end_matches('.');
            if (name.ends_with(".md") || name.ends_with(".png")) && !root.join(name).exists() {
                wrong.push(format!("{shown}: cites {name}, which does not exist"));
            }
        }
        for (at, _) in text.match_indices("reference/") {
            let before = &text[..at];
            if before.ends_with("shared/")
                || before.ends_with('`')
                || before.ends_with('(')
                || before.ends_with(' ')
            {
                wrong.push(format!(
                    "{shown}: cites the outside reference texts ({}…): cite the docs/ page that restates them",
                    text[at..(at + 30).min(text.len())].lines().next().unwrap_or("")
                ));
            }
        }
        if shown.ends_with(".md") {
            for link in markdown_links(&text) {
                let target = link.split('#').next().unwrap();
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                if !file.parent().unwrap().join(target).exists() {
                    wrong.push(format!("{shown}: links {link}, which does not exist"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dangling citations:\n{}",
        wrong.join("\n")
    );
}

/// The targets of `[text](target)` links.
fn markdown_links(text: &str) -> Vec<String> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            rest.find(')').map(|end| rest[..end].to_string())
        })
        .filter(|t| !t.contains(' '))
        .collect()
}

/// The pages of `dir` and its subdirectories, as paths from the repository root.
fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            pages(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// README.md is the entry point and links the docs index; every page of docs/ (user guide
/// and internals) is reachable from one of the two.
#[test]
fn every_docs_page_is_reachable_from_the_readme() {
    let root = repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let index = std::fs::read_to_string(root.join("docs/index.md")).unwrap();
    let linked: Vec<PathBuf> = markdown_links(&readme)
        .iter()
        .map(|l| root.join(l.split('#').next().unwrap()))
        .chain(
            markdown_links(&index)
                .iter()
                .map(|l| root.join("docs").join(l.split('#').next().unwrap())),
        )
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    assert!(
        linked.contains(&root.join("docs/index.md").canonicalize().unwrap()),
        "README.md does not link docs/index.md"
    );
    let mut all = Vec::new();
    pages(&root.join("docs"), &mut all);
    for page in all {
        assert!(
            linked.contains(&page.canonicalize().unwrap()),
            "neither README.md nor docs/index.md links {}",
            page.strip_prefix(&root).unwrap().display()
        );
    }
}

#[test]
fn the_citation_parser_reads_every_form() {
    assert_eq!(cited("see DESIGN.md §5.", "DESIGN.md §"), ["5"]);
    assert_eq!(cited("(DESIGN.md §10.4)", "DESIGN.md §"), ["10.4"]);
    assert_eq!(cited("DESIGN.md §5–§7:", "DESIGN.md §"), ["5", "7"]);
    let s = sections("# t\n## 1. A\ntext\n## 10. B\n1. one\n4. four\n## Other\n2. no\n");
    assert_eq!(s, ["1", "10", "10.1", "10.4"]);
}
