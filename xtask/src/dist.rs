//! `cargo xtask dist`: the product as operators install it, in `target/dist/`:
//! - `lb-agent_<version>_amd64.deb`: the binary (`/usr/sbin/lb-agent`), the systemd unit,
//!   an example `/etc/lb/lb.toml` (a conffile), shell completions, man pages, the
//!   changelog (`contrib/debian/changelog`) and the copyright file with both licences;
//!   `lintian` finds no error or warning in it (tests/tests/integration/package_install.rs);
//! - `lb-<version>-x86_64-linux.tar.gz`: the same files under `lb-<version>/`;
//! - `lb-agent-<version>.debug`: the debug info and symbol table split off the shipped
//!   binary (for crash analysis and profiles: `gdb` and `perf` find it through the
//!   binary's `.gnu_debuglink`).
//!
//! Only the product is built (`cargo build --release -p lb-agent`), no test or benchmark
//! binary.

use std::{fs, path::Path, process::Command};

use anyhow::{Context, bail};

/// Where the unit and the docs expect the binary (the contrib unit says
/// [`UNIT_BINARY`]; the package puts it here).
const PACKAGE_BINARY: &str = "/usr/sbin/lb-agent";
const UNIT_BINARY: &str = "/usr/local/bin/lb-agent";
/// The package's Maintainer field (the address the project's commits come from).
const MAINTAINER: &str = "The lb maintainers <maintainers@users.noreply.a-seed-a1153c89.example>";
/// The Debian changelog the package ships; its newest entry names the package version.
const CHANGELOG: &str = "contrib/debian/changelog";

/// Builds the release binary and packs it; `target` is the cargo target directory.
pub fn run(root: &Path, target: &Path) -> anyhow::Result<()> {
    super::cargo(&["build", "--release", "-p", "lb-agent"])?;
    let version = package_version(root)?;
    let out = target.join("dist");
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;

    // Split the debug info and the symbol table off, as Debian strips binaries: the
    // shipped binary points at the debug file, where gdb and perf find the names.
    let built = target.join("release/lb-agent");
    let debug = out.join(format!("lb-agent-{version}.debug"));
    let stripped = out.join("lb-agent");
    sh(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&built)
        .arg(&debug))?;
    sh(Command::new("objcopy")
        .args([
            "--strip-all",
            "--remove-section=.comment",
            "--remove-section=.note",
            "--remove-section=.gnu_debuglink",
        ])
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&built)
        .arg(&stripped))?;

    let stage = out.join("stage");
    let deb_root = stage.join("deb");
    lay_out(root, &stripped, &deb_root, &version, Layout::Debian)?;
    let deb = out.join(format!("lb-agent_{version}_amd64.deb"));
    sh(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&deb_root)
        .arg(&deb))?;

    let name = format!("lb-{version}");
    let tar_root = stage.join(&name);
    lay_out(root, &stripped, &tar_root, &version, Layout::Tarball)?;
    let tarball = out.join(format!("{name}-x86_64-linux.tar.gz"));
    sh(Command::new("tar")
        .args(["--owner=0", "--group=0", "-czf"])
        .arg(&tarball)
        .arg("-C")
        .arg(&stage)
        .arg(&name))?;
    fs::remove_dir_all(&stage)?;
    fs::remove_file(&stripped)?;
    for f in [&deb, &tarball, &debug] {
        let size = fs::metadata(f)?.len();
        println!("dist: {} ({:.1} MB)", f.display(), size as f64 / 1e6);
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Filesystem paths of the package (`/usr/sbin`, `/lib/systemd/system`, …).
    Debian,
    /// A directory to unpack anywhere: `bin/`, `etc/`, `share/`.
    Tarball,
}

/// Puts the product's files under `dest` for `layout`.
fn lay_out(
    root: &Path,
    binary: &Path,
    dest: &Path,
    version: &str,
    layout: Layout,
) -> anyhow::Result<()> {
    let deb = layout == Layout::Debian;
    let at = |p: &str| dest.join(p);
    let bin = if deb {
        at("usr/sbin/lb-agent")
    } else {
        at("bin/lb-agent")
    };
    copy(binary, &bin, 0o755)?;
    let unit = fs::read_to_string(root.join("contrib/lb-agent.service"))?;
    if !unit.contains(UNIT_BINARY) {
        bail!("contrib/lb-agent.service no longer names {UNIT_BINARY}");
    }
    let unit_path = if deb {
        at("lib/systemd/system/lb-agent.service")
    } else {
        at("lib/systemd/lb-agent.service")
    };
    let unit = if deb {
        unit.replace(UNIT_BINARY, PACKAGE_BINARY)
    } else {
        unit
    };
    write(&unit_path, unit.as_bytes(), 0o644)?;
    let config = if deb {
        at("etc/lb/lb.toml")
    } else {
        at("etc/lb.toml")
    };
    copy(&root.join("contrib/lb.toml"), &config, 0o644)?;

    let share = if deb { at("usr/share") } else { at("share") };
    for (shell, path) in [
        ("bash", "bash-completion/completions/lb-agent"),
        ("zsh", "zsh/vendor-completions/_lb-agent"),
        ("fish", "fish/vendor_completions.d/lb-agent.fish"),
    ] {
        let script = capture(Command::new(binary).args(["completions", shell]))?;
        write(&share.join(path), &script, 0o644)?;
    }
    let man = share.join("man/man8");
    sh(Command::new(binary).arg("manpages").arg(&man))?;
    for page in fs::read_dir(&man)? {
        let page = page?.path();
        sh(Command::new("gzip").args(["-9n"]).arg(&page))?;
    }
    let doc = share.join("doc/lb-agent");
    copy(&root.join("README.md"), &doc.join("README.md"), 0o644)?;
    if deb {
        // Debian keeps the licences in the copyright file (Apache-2.0 is in
        // /usr/share/common-licenses) and the changelog gzipped.
        write(&doc.join("copyright"), copyright(root)?.as_bytes(), 0o644)?;
        let changelog = changelog(root, version)?;
        write(&doc.join("changelog"), changelog.as_bytes(), 0o644)?;
        sh(Command::new("gzip")
            .args(["-9n"])
            .arg(doc.join("changelog")))?;
        let installed_kib = du_kib(dest)?;
        let control = format!(
            "Package: lb-agent\nVersion: {version}\nArchitecture: amd64\nSection: net\n\
             Priority: optional\nMaintainer: {MAINTAINER}\n\
             Depends: libc6 (>= 2.34)\nInstalled-Size: {installed_kib}\n\
             Description: XDP layer-4 load balancer with a health agent\n \
             lb steers every packet for a virtual service to a healthy backend from an XDP\n \
             program (Maglev hashing, a flow table, dsr or full NAT), while the agent runs\n \
             active and passive health checks and publishes each verdict into the maps.\n"
        );
        write(&at("DEBIAN/control"), control.as_bytes(), 0o644)?;
        write(&at("DEBIAN/conffiles"), b"/etc/lb/lb.toml\n", 0o644)?;
        md5sums(dest)?;
    } else {
        for f in ["LICENSE-MIT", "LICENSE-APACHE"] {
            copy(&root.join(f), &doc.join(f), 0o644)?;
        }
    }
    Ok(())
}

/// `DEBIAN/md5sums` of the files under `dest` (the conffile aside, which dpkg tracks
/// itself): what `dpkg --verify` checks the installed files against.
fn md5sums(dest: &Path) -> anyhow::Result<()> {
    let sums = capture(
        Command::new("sh")
            .args(["-c", "find usr lib -type f | LC_ALL=C sort | xargs md5sum"])
            .current_dir(dest),
    )?;
    write(&dest.join("DEBIAN/md5sums"), &sums, 0o644)
}

/// [`CHANGELOG`], whose newest entry must be `version`'s.
fn changelog(root: &Path, version: &str) -> anyhow::Result<String> {
    let text =
        fs::read_to_string(root.join(CHANGELOG)).with_context(|| format!("reading {CHANGELOG}"))?;
    let newest = text
        .lines()
        .next()
        .and_then(|l| l.split_once(" ("))
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(v, _)| v);
    if newest != Some(version) {
        bail!(
            "{CHANGELOG}: the newest entry is {newest:?}, the package is {version}: add an entry"
        );
    }
    Ok(text)
}

/// The machine-readable `debian/copyright`: the MIT licence in full (LICENSE-MIT), the
/// Apache licence by its path in common-licenses.
fn copyright(root: &Path) -> anyhow::Result<String> {
    let mit = fs::read_to_string(root.join("LICENSE-MIT")).context("reading LICENSE-MIT")?;
    let mit: String = mit
        .trim_end()
        .lines()
        .map(|l| {
            if l.trim().is_empty() {
                " .\n".to_owned()
            } else {
                format!(" {l}\n")
            }
        })
        .collect();
    Ok(format!(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: lb\n\n\
         Files: *\nCopyright: 2026 The lb developers\nLicense: MIT or Apache-2.0\n\n\
         License: MIT\n{mit}\n\
         License: Apache-2.0\n \
         On Debian systems, the full text of the Apache License, Version 2.0 is in\n \
         /usr/share/common-licenses/Apache-2.0.\n"
    ))
}

/// The workspace package version of lb-agent (`cargo metadata` would build nothing but
/// costs a dependency; the manifest line is enough).
fn package_version(root: &Path) -> anyhow::Result<String> {
    let manifest = fs::read_to_string(root.join("lb-agent/Cargo.toml"))?;
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .map(str::to_owned)
        .context("lb-agent/Cargo.toml has no version line")
}

fn du_kib(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            du_kib(&entry.path())? * 1024
        } else {
            meta.len()
        };
    }
    Ok(total.div_ceil(1024))
}

fn copy(from: &Path, to: &Path, mode: u32) -> anyhow::Result<()> {
    let bytes = fs::read(from).with_context(|| format!("reading {}", from.display()))?;
    write(to, &bytes, mode)
}

fn write(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn sh(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn capture(cmd: &mut Command) -> anyhow::Result<Vec<u8>> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}
