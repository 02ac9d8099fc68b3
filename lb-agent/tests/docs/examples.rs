//! The config examples in the documentation load with the real loader, and every example
//! of README.md is one of `examples/*.toml` (so its `check-config` text is a golden file),
//! so README, docs and loader cannot drift apart.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("lb-agent sits in the workspace")
        .to_path_buf()
}

/// The ```toml blocks of a Markdown file, each with the line it starts on.
fn toml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        match &mut open {
            None if line.trim_start() == "```toml" => open = Some((i + 2, String::new())),
            None => {}
            Some(_) if line.trim_start().starts_with("```") => out.extend(open.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
        }
    }
    assert!(open.is_none(), "an unterminated ```toml block");
    out
}

fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut files = vec![repo().join("README.md"), repo().join("DESIGN.md")];
    walk(&repo().join("docs"), &mut files);
    files.sort();
    files
}

#[test]
fn every_toml_block_in_the_docs_loads() {
    let mut count = 0;
    for file in markdown_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (line, body) in toml_blocks(&text) {
            let shown = format!("{}:{line}", file.display());
            if let Err(e) = lb_agent::config::parse(&body, Path::new(&shown)) {
                panic!("the ```toml block at {shown} does not load: {e}");
            }
            count += 1;
        }
    }
    assert!(count >= 3, "the docs' toml examples went missing ({count})");
}

#[test]
fn every_readme_example_is_a_golden_example() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let examples: Vec<(PathBuf, String)> = std::fs::read_dir(repo().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| {
            let body = std::fs::read_to_string(&p).unwrap();
            (p, body)
        })
        .collect();
    let blocks = toml_blocks(&readme);
    assert!(!blocks.is_empty(), "README.md lost its config example");
    for (line, body) in blocks {
        assert!(
            examples.iter().any(|(_, e)| *e == body),
            "the ```toml block at README.md:{line} is not in examples/ (copy it there as \
             examples/readme-NAME.toml and bless its check-config text, docs/check-config.md)"
        );
    }
}

/// The packaged `/etc/lb/lb.toml` (contrib/lb.toml) is the config of
/// docs/getting-started.md, with comments, and draws no warning from the loader.
#[test]
fn the_packaged_example_is_getting_starteds_config_without_a_warning() {
    let path = repo().join("contrib/lb.toml");
    let packaged = lb_agent::config::load(&path).expect("contrib/lb.toml loads");
    let warnings = lb_agent::config::warnings(&packaged);
    assert!(warnings.is_empty(), "{warnings:?}");
    let page = std::fs::read_to_string(repo().join("docs/getting-started.md")).unwrap();
    let documented = toml_blocks(&page)
        .into_iter()
        .map(|(_, body)| lb_agent::config::parse(&body, Path::new("getting-started.md")))
        .find_map(|c| {
            c.ok()
                .filter(|c| c.agent.interface.as_deref() == Some("eth0"))
        })
        .expect("getting-started.md has the config for eth0");
    assert_eq!(packaged.services, documented.services);
    assert_eq!(packaged.agent.interface, documented.agent.interface);
}
