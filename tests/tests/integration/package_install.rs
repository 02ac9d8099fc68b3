//! The product as `cargo xtask dist` packs it (`cargo xtask test` builds it first):
//! the Debian package installs with dpkg into a scratch root, every file is where
//! operators look for it, the installed binary runs (`--version` names the commit and
//! the XDP object's hash, `check-config` passes on the packaged example config), `dpkg
//! --verify` finds every file as the package's md5sums say, the unit
//! passes `systemd-analyze verify` where systemd-analyze exists, removal keeps the
//! conffile and purge removes it; the tarball holds the same files; the shipped binary is
//! stripped (under 30 MB, no symbol table) and points at its split-off debug file;
//! `lintian` (Debian's package checker, which `cargo xtask test` installs) reports no
//! error and no warning on the package.
//!
//! Needs root (dpkg). Without the package the test fails when `CI` is set and is skipped
//! (with a message) otherwise.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use lb_tests::{net::names, util::temp_dir::TempDir};

/// The largest shipped binary we accept.
const MAX_BINARY: u64 = 30_000_000;

fn dist_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("dist")
}

/// The one file in `target/dist` whose name ends with `suffix`.
fn artifact(suffix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dist_dir())
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    assert!(
        found.len() <= 1,
        "several {suffix} in target/dist: {found:?}"
    );
    found.pop()
}

fn present() -> Option<PathBuf> {
    match artifact("_amd64.deb") {
        Some(deb) => Some(deb),
        None if std::env::var_os("CI").is_some() => {
            panic!(
                "no package in {}: `cargo xtask test` builds it",
                dist_dir().display()
            )
        }
        None => {
            eprintln!("skipped: no package in target/dist (run `cargo xtask dist`)");
            None
        }
    }
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{said}");
    said
}

/// A scratch root with an empty dpkg database, removed on drop.
struct ScratchRoot(TempDir);

impl ScratchRoot {
    fn new() -> ScratchRoot {
        names::sweep_stale_once();
        let dir =
            TempDir::create(std::env::temp_dir().join(format!("{}-root", names::unique_tag())))
                .unwrap();
        for sub in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("var/lib/dpkg/status"), "").unwrap();
        ScratchRoot(dir)
    }

    fn path(&self, p: &str) -> PathBuf {
        self.0.path().join(p.trim_start_matches('/'))
    }

    fn dpkg(&self, args: &[&str]) -> String {
        // The scratch root has no libc6 package: the dependency is the host's.
        run(Command::new("dpkg")
            .arg(format!("--root={}", self.0.path().display()))
            .arg("--force-depends")
            .args(args))
    }
}

const FILES: &[&str] = &[
    "/usr/sbin/lb-agent",
    "/lib/systemd/system/lb-agent.service",
    "/etc/lb/lb.toml",
    "/usr/share/bash-completion/completions/lb-agent",
    "/usr/share/zsh/vendor-completions/_lb-agent",
    "/usr/share/fish/vendor_completions.d/lb-agent.fish",
    "/usr/share/man/man8/lb-agent.8.gz",
    "/usr/share/man/man8/lb-agent-run.8.gz",
    "/usr/share/man/man8/lb-agent-check-config.8.gz",
    "/usr/share/doc/lb-agent/copyright",
    "/usr/share/doc/lb-agent/changelog.gz",
];

#[test]
fn the_package_installs_runs_and_removes_cleanly() {
    let Some(deb) = present() else {
        return;
    };
    let root = ScratchRoot::new();
    root.dpkg(&["-i", &deb.display().to_string()]);
    let listed = root.dpkg(&["-L", "lb-agent"]);
    for f in FILES {
        assert!(
            listed.lines().any(|l| l == *f),
            "{f} not in the package:\n{listed}"
        );
        let meta = std::fs::metadata(root.path(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(meta.len() > 0, "{f} is empty");
    }
    let verified = root.dpkg(&["--verify", "lb-agent"]);
    assert!(
        verified.trim().is_empty(),
        "the installed files match the package's md5sums:\n{verified}"
    );
    let conffiles = root.dpkg(&["--status", "lb-agent"]);
    assert!(
        conffiles.contains("/etc/lb/lb.toml"),
        "the config is a conffile (kept on upgrade and removal):\n{conffiles}"
    );

    // The installed binary: small, stripped of its debug info, naming its build.
    let bin = root.path("/usr/sbin/lb-agent");
    let size = std::fs::metadata(&bin).unwrap().len();
    assert!(size < MAX_BINARY, "the shipped binary is {size} bytes");
    let sections = run(Command::new("readelf").arg("-S").arg(&bin));
    assert!(
        !sections.contains(".debug_info") && !sections.contains(".symtab"),
        "the shipped binary carries no DWARF and no symbol table:\n{sections}"
    );
    let link = run(Command::new("readelf")
        .args(["--string-dump=.gnu_debuglink"])
        .arg(&bin));
    let debug = artifact(".debug").expect("the split-off debug file in target/dist");
    let debug_name = debug.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        link.contains(&debug_name),
        "the binary points at {debug_name}:\n{link}"
    );
    let debug_sections = run(Command::new("readelf").arg("-S").arg(&debug));
    assert!(
        debug_sections.contains(".debug_info") && debug_sections.contains(".symtab"),
        "{debug_name} holds the DWARF and the symbol table"
    );

    let version = run(Command::new(&bin).arg("--version"));
    assert!(
        version.starts_with("lb-agent ")
            && version.contains("commit ")
            && version.contains("bpf sha256:"),
        "{version}"
    );
    let checked = run(Command::new(&bin)
        .args(["check-config", "--config"])
        .arg(root.path("/etc/lb/lb.toml")));
    assert!(checked.contains("valid, 1 service"), "{checked}");
    let man = std::fs::read(root.path("/usr/share/man/man8/lb-agent-run.8.gz")).unwrap();
    assert_eq!(&man[..2], &[0x1f, 0x8b], "man pages are gzipped");
    let bash =
        std::fs::read_to_string(root.path("/usr/share/bash-completion/completions/lb-agent"))
            .unwrap();
    assert!(
        bash.contains("check-config") && bash.contains("--config"),
        "bash completion"
    );

    // The unit names the installed binary; systemd-analyze checks it where present.
    let unit = std::fs::read_to_string(root.path("/lib/systemd/system/lb-agent.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/sbin/lb-agent run --config /etc/lb/lb.toml"));
    assert!(unit.contains("ExecReload=/usr/sbin/lb-agent reload"));
    assert!(
        !unit
            .lines()
            .any(|l| l.starts_with("Exec") && l.contains("/usr/local/bin")),
        "{unit}"
    );
    verify_unit(&root, &unit);

    // Removal keeps the edited config, purge removes it.
    root.dpkg(&["-r", "lb-agent"]);
    assert!(!root.path("/usr/sbin/lb-agent").exists());
    assert!(
        root.path("/etc/lb/lb.toml").exists(),
        "remove keeps conffiles"
    );
    root.dpkg(&["-P", "lb-agent"]);
    assert!(!root.path("/etc/lb/lb.toml").exists(), "purge removes them");
}

/// `systemd-analyze verify` on the unit, its binary paths pointed into the scratch root
/// (the host has no /usr/sbin/lb-agent). Any complaint fails the test.
fn verify_unit(root: &ScratchRoot, unit: &str) {
    let Ok(analyze) = lb_tests::net::multinode::which("systemd-analyze") else {
        eprintln!("systemd-analyze not installed: the unit is not verified");
        return;
    };
    let dir = root.path("/verify");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("lb-agent.service");
    let bin = root.path("/usr/sbin/lb-agent").display().to_string();
    std::fs::write(&copy, unit.replace("/usr/sbin/lb-agent", &bin)).unwrap();
    let out = Command::new(analyze)
        .arg("verify")
        .arg(&copy)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );
    println!("systemd-analyze verify: the unit is clean");
}

#[test]
fn lintian_finds_no_error_or_warning() {
    let Some(deb) = present() else {
        return;
    };
    // Exit status 0 unless a tag of at least the `--fail-on` levels is found; the
    // listing shows what lintian said either way.
    let out = Command::new("lintian")
        .args(["--fail-on", "error,warning", "--tag-display-limit", "0"])
        .arg(&deb)
        .output()
        .unwrap_or_else(|e| {
            panic!("lintian: {e} (Debian's lintian package; `cargo xtask test` installs it)")
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let tags: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    assert!(
        out.status.success() && tags.is_empty(),
        "lintian {}: {}\n{said}",
        deb.display(),
        out.status
    );
    println!("lintian: no error or warning\n{said}");
}

#[test]
fn the_tarball_holds_the_same_product() {
    if present().is_none() {
        return;
    }
    let tarball = artifact("-x86_64-linux.tar.gz").expect("the tarball in target/dist");
    let listed = run(Command::new("tar").arg("tzf").arg(&tarball));
    let top = tarball
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_end_matches("-x86_64-linux.tar.gz")
        .to_owned();
    for f in [
        "bin/lb-agent",
        "lib/systemd/lb-agent.service",
        "etc/lb.toml",
        "share/man/man8/lb-agent.8.gz",
        "share/bash-completion/completions/lb-agent",
        "share/doc/lb-agent/LICENSE-MIT",
        "share/doc/lb-agent/LICENSE-APACHE",
    ] {
        let want = format!("{top}/{f}");
        assert!(
            listed.lines().any(|l| l == want),
            "{want} not in the tarball:\n{listed}"
        );
    }
}
