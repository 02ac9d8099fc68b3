//! The agent's process really runs out of file descriptors while its tcp probes run
//! against a live server on loopback: every probe fails with EMFILE, which is a local
//! fault — no transition, the server stays `up`, and the status reports it. One test in
//! its own binary: it lowers this process's RLIMIT_NOFILE (restored on drop, also on
//! failure). The probes connect (`tcp_check = "connect"`): a SYN check holds no
//! descriptor per probe and would not run out.

use std::{fs::File, net::SocketAddr, path::Path, sync::Arc, time::Duration};

use lb_agent::{
    agent::{Agent, Environment, Handles, StaticNeighbours},
    config,
    probe::NetProber,
    testing::MemoryDataplane,
};
use tokio::{net::TcpListener, time::Instant};

type NetAgent = Agent<MemoryDataplane, NetProber, StaticNeighbours>;

/// Lowers the soft RLIMIT_NOFILE and holds descriptors until `open` fails with EMFILE;
/// dropping it closes them and restores the limit.
struct Exhausted {
    files: Vec<File>,
    saved: libc::rlimit,
}

impl Exhausted {
    fn new(soft: u64) -> Self {
        let mut saved = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: valid, writable rlimit.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut saved) };
        assert_eq!(read, 0);
        let mut guard = Exhausted {
            files: Vec::new(),
            saved,
        };
        let low = libc::rlimit {
            rlim_cur: soft.min(saved.rlim_max),
            rlim_max: saved.rlim_max,
        };
        // SAFETY: valid rlimit, cur <= max.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
        loop {
            match File::open("/dev/null") {
                Ok(f) => guard.files.push(f),
                Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
                Err(e) => panic!("opening /dev/null: {e}"),
            }
            assert!(guard.files.len() < 100_000, "no EMFILE after 100,000 files");
        }
        guard
    }
}

impl Drop for Exhausted {
    fn drop(&mut self) {
        self.files.clear();
        // SAFETY: restores the limit read in `new`.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.saved) };
    }
}

/// Feeds probe reports to the agent for `d` of real time.
async fn drive(agent: &mut NetAgent, handles: &mut Handles, d: Duration) {
    let end = Instant::now() + d;
    loop {
        tokio::select! {
            Some(r) = handles.reports.recv() => agent.on_probe_report(r).expect("memory publish"),
            _ = tokio::time::sleep_until(end) => break,
        }
    }
    agent.publish_snapshot();
}

fn server_state(handles: &Handles, addr: SocketAddr) -> (String, u64, u64) {
    let snap = handles.snapshot.borrow().clone();
    let s = snap.services[0]
        .servers
        .iter()
        .find(|s| s.address == addr.to_string())
        .expect("server in status")
        .clone();
    let p = &s.health.probes["tcp"];
    (s.state.clone(), p.fails, p.count)
}

#[tokio::test(flavor = "current_thread")]
async fn probes_failing_with_emfile_change_no_server_state() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let accept = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            drop(conn);
        }
    });
    let text = format!(
        "[[service]]\nname = \"web\"\nvip = \"10.0.0.100:80\"\nsnat_ip = \"10.0.0.2\"\n\
         [[service.server]]\naddress = \"{addr}\"\n\
         [[service.probe]]\ntype = \"tcp\"\ntcp_check = \"connect\"\ninterval = \"100ms\"\ntimeout = \"1s\"\nfails = 1\npasses = 1\n"
    );
    let cfg = config::parse(&text, Path::new("emfile.toml")).expect("config");
    let neighbours = StaticNeighbours {
        default: Some([2, 0, 0, 0, 0, 1]),
        ..Default::default()
    };
    let (mut agent, mut handles) = Agent::new(
        MemoryDataplane::default(),
        Arc::new(NetProber),
        Arc::new(neighbours),
        Environment::default(),
    );
    agent.apply_config(&cfg).await.expect("apply");
    drive(&mut agent, &mut handles, Duration::from_millis(500)).await;
    let (state, _, ran) = server_state(&handles, addr);
    assert_eq!(state, "up", "setup: the probe passes against the listener");
    assert!(ran >= 2, "setup: probes ran ({ran})");
    let transitions = handles.snapshot.borrow().transitions;

    let exhausted = Exhausted::new(256);
    drive(&mut agent, &mut handles, Duration::from_secs(1)).await;
    let snap = handles.snapshot.borrow().clone();
    let (state, fails, _) = server_state(&handles, addr);
    let files = exhausted.files.len();
    drop(exhausted);

    assert!(files > 0, "the process held {files} extra descriptors");
    assert_eq!(state, "up", "EMFILE is the agent's fault, not the server's");
    assert_eq!(fails, 0, "no failure counted");
    assert_eq!(snap.transitions, transitions, "no transition");
    assert!(
        snap.local_faults.total >= 5,
        "about 10 probes hit EMFILE: {:?}",
        snap.local_faults
    );
    assert!(snap.local_faults.active);
    assert!(
        snap.local_faults
            .last_detail
            .as_deref()
            .is_some_and(|d| d.contains("EMFILE")),
        "{:?}",
        snap.local_faults
    );

    // Descriptors back: the probes run and pass again.
    let before = server_state(&handles, addr).2;
    drive(&mut agent, &mut handles, Duration::from_millis(500)).await;
    let (state, fails, after) = server_state(&handles, addr);
    assert_eq!((state.as_str(), fails), ("up", 0));
    assert!(after > before, "probes run again ({before} -> {after})");
    accept.abort();
}
