//! The announcer's rules against in-memory routes; BIRD output parsing;
//! fingerprints that ignore backend ids.

use std::net::{IpAddr, SocketAddr};

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn started(routes: &MemoryRoutes) -> Announcer {
    let mut a = Announcer::default();
    a.start(Box::new(routes.clone()), None);
    a
}

#[test]
fn decision_table() {
    use Serve::*;
    assert_eq!(decide([Serving], false), Reason::Serving);
    assert_eq!(decide([FailOpen], false), Reason::FailOpen);
    assert_eq!(decide([Nothing], false), Reason::NoUsableServer);
    assert_eq!(decide([], false), Reason::NoUsableServer);
    // One service of a shared VIP serving keeps the VIP.
    assert_eq!(decide([Nothing, Serving], false), Reason::Serving);
    assert_eq!(decide([Nothing, FailOpen], false), Reason::FailOpen);
    // Drain wins over everything.
    assert_eq!(decide([Serving], true), Reason::NodeDrained);
    assert!(Reason::Serving.announces() && Reason::FailOpen.announces());
    assert!(!Reason::NoUsableServer.announces() && !Reason::NodeDrained.announces());
}

#[test]
fn follows_what_services_can_do() {
    let routes = MemoryRoutes::default();
    let mut a = started(&routes);
    let vip = ip("10.0.0.100");
    let changes = a.update(vec![(vip, Serve::Nothing)]);
    assert!(changes.is_empty(), "nothing installed, nothing to withdraw");
    assert!(routes.installed().is_empty());

    let changes = a.update(vec![(vip, Serve::Serving)]);
    assert_eq!(
        changes,
        vec![Change {
            vip,
            announced: true,
            reason: "serving"
        }]
    );
    assert_eq!(routes.installed(), vec![vip]);
    assert!(
        a.update(vec![(vip, Serve::Serving)]).is_empty(),
        "no change, no event"
    );

    // Fail-open keeps it announced and says why.
    let changes = a.update(vec![(vip, Serve::FailOpen)]);
    assert_eq!(changes[0].reason, "fail-open");
    assert_eq!(routes.installed(), vec![vip]);

    a.update(vec![(vip, Serve::Nothing)]);
    assert!(routes.installed().is_empty());
    let st = a.status();
    assert_eq!(st.vips.len(), 1);
    assert!(!st.vips[0].announced);
    assert_eq!(st.vips[0].reason, "no usable server");
}

#[test]
fn shared_vip_is_withdrawn_only_when_no_service_serves() {
    let routes = MemoryRoutes::default();
    let mut a = started(&routes);
    let vip = ip("10.0.0.100");
    a.update(vec![(vip, Serve::Serving), (vip, Serve::Serving)]);
    a.update(vec![(vip, Serve::Nothing), (vip, Serve::Serving)]);
    assert_eq!(
        routes.installed(),
        vec![vip],
        "the other service still serves"
    );
    a.update(vec![(vip, Serve::Nothing), (vip, Serve::Nothing)]);
    assert!(routes.installed().is_empty());
}

#[test]
fn drain_withdraws_everything_and_undrain_restores() {
    let routes = MemoryRoutes::default();
    let mut a = started(&routes);
    let (v1, v2, v3) = (ip("10.0.0.100"), ip("10.0.0.101"), ip("fd00::100"));
    a.update(vec![
        (v1, Serve::Serving),
        (v2, Serve::Nothing),
        (v3, Serve::FailOpen),
    ]);
    assert_eq!(routes.installed(), vec![v1, v3]);
    let changes = a.set_drained(true).expect("no file");
    assert_eq!(changes.len(), 2);
    assert!(
        changes
            .iter()
            .all(|c| !c.announced && c.reason == "node drained")
    );
    assert!(routes.installed().is_empty());
    // Health changes while drained announce nothing.
    a.update(vec![
        (v1, Serve::Serving),
        (v2, Serve::Serving),
        (v3, Serve::Serving),
    ]);
    assert!(routes.installed().is_empty());
    a.set_drained(false).expect("no file");
    assert_eq!(routes.installed(), vec![v1, v2, v3]);
}

#[test]
fn drain_survives_a_restart_through_its_file() {
    let dir = std::env::temp_dir().join(format!("lb-announce-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("state.json.node-drained");
    let routes = MemoryRoutes::default();
    let vip = ip("10.0.0.100");
    let mut a = Announcer::default();
    a.start(Box::new(routes.clone()), Some(file.clone()));
    a.update(vec![(vip, Serve::Serving)]);
    a.set_drained(true).expect("file written");
    assert!(file.exists());

    let mut again = Announcer::default();
    again.start(Box::new(routes.clone()), Some(file.clone()));
    assert!(again.drained(), "the next run starts drained");
    again.update(vec![(vip, Serve::Serving)]);
    assert!(routes.installed().is_empty());
    again.set_drained(false).expect("file removed");
    assert!(!file.exists());
    assert_eq!(routes.installed(), vec![vip]);
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

#[test]
fn a_restart_keeps_routes_that_are_there() {
    let routes = MemoryRoutes::default();
    let vip = ip("10.0.0.100");
    routes.add(vip).expect("memory");
    let other = ip("::1");
    routes.add(other).expect("memory");
    let mut a = started(&routes);
    // First membership after the restart: still serving, no withdrawal, no event.
    let changes = a.update(vec![(vip, Serve::Serving)]);
    assert!(
        changes.is_empty(),
        "a restart must not withdraw: {changes:?}"
    );
    assert!(a.status().vips[0].announced);
    assert_eq!(a.status().vips.len(), 1, "::1 is no VIP: not shown");
    assert_eq!(
        routes.installed(),
        vec![vip, other],
        "::1 is not ours: untouched"
    );
    a.update(vec![]);
    assert_eq!(routes.installed(), vec![other], "the VIP left the config");
}

#[test]
fn vips_no_longer_configured_are_withdrawn() {
    let routes = MemoryRoutes::default();
    let mut a = started(&routes);
    let (v1, v2) = (ip("10.0.0.100"), ip("10.0.0.101"));
    a.update(vec![(v1, Serve::Serving), (v2, Serve::Serving)]);
    let changes = a.update(vec![(v1, Serve::Serving)]);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].vip, v2);
    assert_eq!(changes[0].reason, "no longer configured");
    assert_eq!(routes.installed(), vec![v1]);
    assert_eq!(a.status().vips.len(), 1);
}

#[test]
fn a_failed_route_change_is_shown_and_retried() {
    let routes = MemoryRoutes::default();
    let mut a = started(&routes);
    let vip = ip("10.0.0.100");
    *routes.fail.lock().unwrap() = Some("RTNETLINK answers: Operation not permitted".into());
    assert!(a.update(vec![(vip, Serve::Serving)]).is_empty());
    let st = a.status();
    assert!(!st.vips[0].announced);
    assert!(
        st.vips[0]
            .error
            .as_deref()
            .unwrap()
            .contains("not permitted")
    );
    *routes.fail.lock().unwrap() = None;
    let changes = a.update(vec![(vip, Serve::Serving)]);
    assert_eq!(changes.len(), 1, "retried at the next update");
    assert_eq!(routes.installed(), vec![vip]);
    assert_eq!(a.status().vips[0].error, None);
}

#[test]
fn off_until_started() {
    let mut a = Announcer::default();
    assert!(
        a.update(vec![(ip("10.0.0.100"), Serve::Serving)])
            .is_empty()
    );
    assert!(!a.status().enabled);
    assert!(!a.is_on());
}

#[test]
fn parses_birdc_show_protocols() {
    let out = "BIRD 2.0.12 ready.
Name       Proto      Table      State  Since         Info
device1    Device     ---        up     14:50:01.123  
direct1    Direct     ---        up     14:50:01.123  
kernel1    Kernel     master4    up     14:50:01.123  
bfd1       BFD        ---        up     14:50:01.123  
router     BGP        ---        up     14:50:02.456  Established   
other      BGP        ---        start  2026-12-01 14:50:02  Active        Socket: Connection refused
";
    let p = bird_sessions::parse_protocols(out);
    assert_eq!(p.len(), 6);
    assert_eq!(p[0].name, "device1");
    assert_eq!(p[0].info, "");
    assert_eq!(p[4].proto, "BGP");
    assert_eq!(p[4].state, "up");
    assert_eq!(p[4].info, "Established");
    assert_eq!(p[5].state, "start");
    assert_eq!(p[5].info, "Active Socket: Connection refused");
    assert!(
        bird_sessions::parse_protocols("Unable to connect to server control socket").is_empty()
    );
}

#[test]
fn fingerprint_depends_on_addresses_not_ids() {
    let a: SocketAddr = "10.0.1.1:80".parse().unwrap();
    let b: SocketAddr = "10.0.1.2:80".parse().unwrap();
    // Node 1 gave a id 1 and b id 2; node 2 the other way round.
    let node1 = [1u32, 2, 1, 1, 2];
    let node2 = [2u32, 1, 2, 2, 1];
    let f1 = fingerprint::fingerprint(&node1, |id| [None, Some(a), Some(b)][id as usize]);
    let f2 = fingerprint::fingerprint(&node2, |id| [None, Some(b), Some(a)][id as usize]);
    assert_eq!(f1, f2);
    assert_eq!(f1.len(), 16);
    // One slot to another backend changes it.
    let moved = [1u32, 2, 1, 2, 2];
    let f3 = fingerprint::fingerprint(&moved, |id| [None, Some(a), Some(b)][id as usize]);
    assert_ne!(f1, f3);
}

#[test]
fn a_refresh_restarts_the_lifetime_of_announced_vips_only() {
    let routes = MemoryRoutes::default();
    let mut a = started(&routes);
    let (up, down) = (ip("10.0.0.100"), ip("10.0.0.101"));
    a.update(vec![(up, Serve::Serving), (down, Serve::Nothing)]);
    assert_eq!(routes.installed(), vec![up]);
    routes.added.lock().unwrap().clear();
    a.refresh();
    a.refresh();
    assert_eq!(*routes.added.lock().unwrap(), vec![up, up]);
    // Expired meanwhile (the agent stalled past the lifetime): the refresh puts it back.
    routes.installed.lock().unwrap().clear();
    a.refresh();
    assert_eq!(routes.installed(), vec![up]);
}

#[test]
fn a_failed_refresh_shows_in_status_and_clears_when_one_succeeds() {
    let routes = MemoryRoutes::default();
    let mut a = started(&routes);
    let vip = ip("10.0.0.100");
    a.update(vec![(vip, Serve::Serving)]);
    *routes.fail.lock().unwrap() = Some("No buffer space available".into());
    a.refresh();
    let status = a.status();
    assert!(status.vips[0].announced);
    assert_eq!(
        status.vips[0].error.as_deref(),
        Some("add failed: No buffer space available")
    );
    *routes.fail.lock().unwrap() = None;
    a.refresh();
    assert_eq!(a.status().vips[0].error, None);
}
