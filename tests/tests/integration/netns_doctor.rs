//! `lb-agent doctor` on real network namespaces: a host prepared as docs/doctor.md says
//! passes (exit 0, no blocker), and each blocker is found on a host or config that has
//! it — a missing interface, strict rp_filter with a backend routed out of another
//! interface, a snat_ip that is not local, snat_ports overlapping the ephemeral ports,
//! a pin_path off bpffs, BIRD's socket absent, a dsr backend off the segment, an MTU
//! native XDP does not take with `xdp_mode = "native"` (a warning with `auto`; `run`
//! refuses the dsr backend off the segment too), and a
//! veth whose peer runs no XDP program with `xdp_mode = "native"` (a warning with
//! `auto`, which then attaches in generic mode). A veth's peer with TX checksum offload
//! on is a warning (its peer in another namespace, which doctor cannot read, too), and
//! fine once it is off.
//!
//! Layout: namespace `lb` with `eth0` (10.70.0.2/24, the attached interface) and `eth1`
//! (10.71.0.2/24), each a veth to a peer namespace; `eth0`'s peer runs `lb_pass` in
//! native mode; BIRD runs in `lb` with a minimal config; pin_path is on a private bpffs.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use aya::programs::XdpMode;
use lb_tests::{
    agent::{bpffs::PrivateBpffs, daemon::locate_binary},
    bpf::pass_prog::{self, PassPrograms},
    net::{
        link::{self, Link, Mac, VethEnd, veth_pair},
        multinode::{bird_present, start_bird},
        names::unique_tag,
        netns::NetNs,
    },
    util::{process::NsProcess, temp_dir::TempDir},
};

struct Host {
    lb: NetNs,
    dir: TempDir,
    pins: PrivateBpffs,
    bird_socket: PathBuf,
    /// `lb_pass` on `eth0`'s peer, which native XDP_TX on a veth needs.
    peer_pass: Option<PassPrograms>,
    // Dropped in field order: BIRD before the links and namespaces it runs in.
    _bird: NsProcess,
    _links: Vec<Link>,
    _peers: Vec<NetNs>,
}

fn host() -> Host {
    let tag = unique_tag();
    let lb = NetNs::create(&format!("{tag}lb")).expect("lb namespace");
    let mut peers = Vec::new();
    let mut links = Vec::new();
    for (i, net) in ["10.70.0", "10.71.0"].iter().enumerate() {
        let peer = NetNs::create(&format!("{tag}p{i}")).expect("peer namespace");
        let name = format!("eth{i}");
        links.push(
            veth_pair(
                VethEnd {
                    ns: &lb,
                    name: &name,
                    mac: Mac([0x02, 0x70, 0, 0, i as u8, 2]),
                },
                VethEnd {
                    ns: &peer,
                    name: "eth0",
                    mac: Mac([0x02, 0x70, 0, 0, i as u8, 1]),
                },
            )
            .expect("veth pair"),
        );
        lb.ip_batch(&[
            format!("addr add {net}.2/24 dev {name}"),
            format!("link set {name} up"),
        ])
        .expect("lb side");
        peer.ip_batch(&[
            format!("addr add {net}.1/24 dev eth0"),
            "link set eth0 up".into(),
        ])
        .expect("peer side");
        peers.push(peer);
    }
    lb.sysctl("net.ipv4.ip_local_port_range", "32768 60999")
        .expect("port range");
    lb.sysctl("net.ipv4.conf.all.rp_filter", "2")
        .expect("rp_filter");
    lb.sysctl("net.ipv4.conf.eth0.rp_filter", "0")
        .expect("rp_filter");
    let dir = std::env::temp_dir().join(format!("lb-doctor-{tag}"));
    let dir = TempDir::create(dir).expect("the host's directory");
    let conf = dir.path().join("bird.conf");
    std::fs::write(&conf, "router id 10.70.0.2;\nprotocol device {}\n").unwrap();
    let bird_socket = dir.path().join("bird.ctl");
    let bird = start_bird(&lb, "doctor", &conf, &bird_socket).expect("BIRD starts");
    let pins = PrivateBpffs::mount("doctor").expect("a private bpffs");
    let peer_pass = pass_prog::attach(&peers[0], &["eth0"], XdpMode::Driver).expect("lb_pass");
    Host {
        lb,
        dir,
        pins,
        bird_socket,
        peer_pass: Some(peer_pass),
        _bird: bird,
        _links: links,
        _peers: peers,
    }
}

/// The good config, with `edit` applied to its text.
fn config(h: &Host, edit: impl Fn(String) -> String) -> PathBuf {
    let text = format!(
        r#"[agent]
interface = "eth0"
api_listen = ""
api_socket = ""
state_file = ""
pin_path = "{pins}"
announce_interface = "lbvip"
bird_socket = "{bird}"

[[service]]
name = "web"
vip = "10.70.0.100:80"
forwarding = "nat"
snat_ip = "10.70.0.2"
snat_ports = "1024-32767"

[[service.server]]
address = "10.70.0.11:8080"

[[service]]
name = "dns"
vip = "10.70.0.100:53"
protocol = "udp"
forwarding = "dsr"

[[service.server]]
address = "10.70.0.12:53"
"#,
        pins = h.pins.pins().display(),
        bird = h.bird_socket.display(),
    );
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = h.dir.path().join(format!("lb-{n}.toml"));
    std::fs::write(&path, edit(text)).unwrap();
    path
}

/// `lb-agent doctor ARGS` in the lb namespace: exit code and stdout.
fn doctor(h: &Host, config: &Path, extra: &[&str]) -> (i32, String) {
    let bin = locate_binary("lb-agent").expect("lb-agent built (cargo build --workspace --bins)");
    let out = Command::new("ip")
        .args(["netns", "exec", h.lb.name()])
        .arg(bin)
        .args(["doctor", "--config"])
        .arg(config)
        .args(extra)
        .output()
        .expect("running lb-agent doctor");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

fn blockers(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.starts_with("blocker")).collect()
}

/// Runs doctor on the config edited by `edit` (after `prepare` on the host) and
/// expects exactly one blocker, of check `check`.
fn expect_blocker(h: &Host, check: &str, edit: impl Fn(String) -> String, extra: &[&str]) {
    let path = config(h, edit);
    let (code, text) = doctor(h, &path, extra);
    assert_eq!(code, 1, "a blocker makes the exit status 1:\n{text}");
    let b = blockers(&text);
    assert_eq!(b.len(), 1, "exactly the {check} blocker:\n{text}");
    assert!(
        b[0].starts_with(&format!("blocker  {check}:")),
        "expected a {check} blocker:\n{text}"
    );
}

#[test]
fn a_good_host_passes_and_each_blocker_is_found() {
    if !bird_present() {
        return;
    }
    let mut h = host();

    let good = config(&h, |t| t);
    let (code, text) = doctor(&h, &good, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(blockers(&text).is_empty(), "{text}");
    for expected in [
        "ok       kernel:",
        "ok       bpf load:",
        "ok       interface eth0: exists",
        "ok       xdp driver: veth has native XDP (the kernel reports: basic, redirect, \
         ndo-xmit",
        "ok       snat_ip: service \"web\": 10.70.0.2 is on eth0",
        "ok       port range:",
        "ok       bpffs:",
        "ok       bird:",
        "ok       rp_filter: 2 (all 2, eth0 0): loose",
        "ok       dsr dns: on each of the 1 backends",
        "ok       veth peer: eth0's peer is in another network namespace",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(expected)),
            "missing `{expected}`:\n{text}"
        );
    }

    expect_blocker(&h, "interface", |t| t, &["--interface", "nosuch0"]);
    expect_blocker(
        &h,
        "snat_ip",
        |t| t.replace("snat_ip = \"10.70.0.2\"", "snat_ip = \"10.70.0.99\""),
        &[],
    );
    expect_blocker(
        &h,
        "port range",
        |t| t.replace("1024-32767", "1024-40000"),
        &[],
    );
    let off_bpffs = h.dir.path().join("pins");
    expect_blocker(
        &h,
        "bpffs",
        |t| {
            t.replace(
                &h.pins.pins().display().to_string(),
                &off_bpffs.display().to_string(),
            )
        },
        &[],
    );
    let no_bird = h.dir.path().join("nobird.ctl");
    expect_blocker(
        &h,
        "bird",
        |t| {
            t.replace(
                &h.bird_socket.display().to_string(),
                &no_bird.display().to_string(),
            )
        },
        &[],
    );
    expect_blocker(
        &h,
        "dsr dns",
        |t| t.replace("10.70.0.12:53", "10.71.0.12:53"),
        &[],
    );

    // `run` refuses the dsr backend off the segment as doctor does, before attaching.
    let off = config(&h, |t| t.replace("10.70.0.12:53", "10.71.0.12:53"));
    let bin = locate_binary("lb-agent").expect("lb-agent built");
    let out = Command::new("ip")
        .args(["netns", "exec", h.lb.name()])
        .arg(bin)
        .args(["run", "--config"])
        .arg(&off)
        .output()
        .expect("running lb-agent run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("dsr backend 10.71.0.12 is on another interface's segment than eth0"),
        "{stderr}"
    );

    // Strict rp_filter: fine while every backend is routed through eth0, a blocker once
    // one is routed out of eth1.
    h.lb.sysctl("net.ipv4.conf.all.rp_filter", "1")
        .expect("rp_filter");
    let (code, text) = doctor(&h, &good, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.lines()
            .any(|l| l
                .starts_with("ok       rp_filter: 1 (all 1, eth0 0): strict, and every backend")),
        "{text}"
    );
    expect_blocker(
        &h,
        "rp_filter",
        |t| {
            t + "\n[[service.server]]\naddress = \"10.71.0.11:8080\"\n"
                .replace("[[service.server]]", "[[service]]\nname = \"web2\"\nvip = \"10.70.0.101:80\"\nforwarding = \"nat\"\nsnat_ip = \"10.70.0.2\"\n\n[[service.server]]")
                .as_str()
        },
        &[],
    );

    // A veth whose peer is in this namespace: doctor reads the peer's TX checksum
    // offload and says whether native mode completes partial checksums (while it is on,
    // veth's default) or the peer sends full ones (once it is off).
    let pair = veth_pair(
        VethEnd {
            ns: &h.lb,
            name: "vx0",
            mac: Mac([0x02, 0x70, 0, 0, 9, 2]),
        },
        VethEnd {
            ns: &h.lb,
            name: "vx1",
            mac: Mac([0x02, 0x70, 0, 0, 9, 1]),
        },
    )
    .expect("a veth pair inside the lb namespace");
    h.lb.ip_batch(&["link set vx0 up".into(), "link set vx1 up".into()])
        .expect("vx0 and vx1 up");
    // GRO on the peer lets it take XDP frames: native mode forwards on vx0.
    link::set_gro(&h.lb, "vx1", true).expect("ethtool -K vx1 gro on");
    let peer_line = |text: &str| {
        text.lines()
            .find(|l| l.contains("veth peer:"))
            .map(str::to_owned)
            .unwrap_or_default()
    };
    let (_, text) = doctor(&h, &good, &["--interface", "vx0"]);
    assert!(
        peer_line(&text)
            .starts_with("ok       veth peer: vx1, vx0's peer, has TX checksum offload on")
            && peer_line(&text).contains("native mode completes the partial checksums"),
        "{text}"
    );
    link::set_tx_checksum(&h.lb, "vx1", false).expect("ethtool -K vx1 tx off");
    let (_, text) = doctor(&h, &good, &["--interface", "vx0"]);
    assert!(
        peer_line(&text).starts_with("ok       veth peer: vx1 sends full checksums"),
        "{text}"
    );
    drop(pair);

    // A veth whose peer runs no XDP program: native XDP_TX would drop every frame.
    drop(h.peer_pass.take());
    let (code, text) = doctor(&h, &good, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.lines().any(|l| l
            .starts_with("warning  xdp driver: eth0 is a veth whose peer takes no XDP frames")
            && l.contains("\"auto\" attaches in generic mode")),
        "{text}"
    );
    expect_blocker(
        &h,
        "xdp driver",
        |t| {
            t.replace(
                "interface = \"eth0\"",
                "interface = \"eth0\"\nxdp_mode = \"native\"",
            )
        },
        &[],
    );

    // An MTU native XDP does not take (set now: a veth whose peer runs an XDP program
    // cannot have it): a warning with "auto" (it falls back to generic mode), a blocker
    // with "native" (the attach is refused), next to the peer's.
    h.lb.ip(&["link", "set", "eth0", "mtu", "9000"])
        .expect("mtu");
    let (code, text) = doctor(&h, &good, &[]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("warning  mtu: 9000")),
        "{text}"
    );
    let native = config(&h, |t| {
        t.replace(
            "interface = \"eth0\"",
            "interface = \"eth0\"\nxdp_mode = \"native\"",
        )
    });
    let (code, text) = doctor(&h, &native, &[]);
    assert_eq!(code, 1, "{text}");
    let b = blockers(&text);
    assert!(
        b.len() == 2
            && b.iter().any(|l| l.starts_with("blocker  mtu: 9000"))
            && b.iter().any(|l| l.starts_with("blocker  xdp driver:")),
        "{text}"
    );
}
