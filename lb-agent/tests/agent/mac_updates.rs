//! MAC changes the netlink watch reports reach the maps through the agent's MAC path:
//! a new address is written into the backend's entry with its slots kept; an unusable
//! next hop (`None`: FAILED, INCOMPLETE, deleted) takes the server out as an unknown MAC
//! does (no slots, no flags, status without a MAC) while its health stays; the address
//! coming back restores it. The agent tells its neighbours which backends to follow.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Mutex,
};

use crate::util::{Harness, MAC, sa, secs, servers, web};
use lb_agent::{agent::Neighbours, neighbour::nexthops::MacUpdate};

const NEW: [u8; 6] = [0x02, 0, 0, 0, 0x5a, 0x01];

fn config() -> String {
    web(
        "",
        &(servers(&[
            ("10.0.1.1:80", ""),
            ("10.0.1.2:80", ""),
            ("10.0.1.3:80", ""),
        ]) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    )
}

fn mac_in_map(h: &Harness<impl Neighbours>, addr: SocketAddr) -> Vec<[u8; 6]> {
    let dp = h.agent().dataplane();
    h.backend_ids("web", addr)
        .iter()
        .map(|id| dp.backends[id].mac)
        .collect()
}

fn update(addr: SocketAddr, mac: Option<[u8; 6]>) -> MacUpdate {
    MacUpdate {
        backend: addr.ip(),
        mac,
    }
}

#[tokio::test(start_paused = true)]
async fn a_changed_mac_goes_into_the_backend_entry_and_keeps_its_slots() {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(2)).await;
    let a = sa("10.0.1.1:80");
    let slots = h.slots("web", a);
    assert!(slots > 0);
    assert_eq!(mac_in_map(&h, a), vec![MAC]);
    h.send_mac_updates(&[update(a, Some(NEW))]).await;
    assert_eq!(
        mac_in_map(&h, a),
        vec![NEW],
        "the entry carries the new MAC"
    );
    assert_eq!(h.slots("web", a), slots, "a new MAC moves no slot");
    assert!(h.serving("web", a));
    h.agent_mut().publish_snapshot();
    assert_eq!(
        h.server_status("web", a).mac.as_deref(),
        Some("02:00:00:00:5a:01")
    );
}

#[tokio::test(start_paused = true)]
async fn an_unusable_next_hop_takes_the_server_out_until_it_resolves_again() {
    let mut h = Harness::start(&config()).await;
    h.run_for(secs(2)).await;
    let a = sa("10.0.1.1:80");
    h.send_mac_updates(&[update(a, None)]).await;
    assert_eq!(h.slots("web", a), 0, "not selectable for new flows");
    assert!(
        !h.live("web", a),
        "as an unknown MAC: no flag, its pinned flows are re-hashed"
    );
    h.agent_mut().publish_snapshot();
    let status = h.server_status("web", a);
    assert_eq!(status.mac, None, "status shows the MAC unknown");
    assert_eq!(status.state, "up", "its health is not touched");
    for other in [sa("10.0.1.2:80"), sa("10.0.1.3:80")] {
        assert!(h.slots("web", other) > 0);
    }
    // The kernel has an address again (REACHABLE after the new resolution).
    h.send_mac_updates(&[update(a, Some(NEW))]).await;
    assert!(h.slots("web", a) > 0, "selectable again");
    assert!(h.serving("web", a));
    assert_eq!(mac_in_map(&h, a), vec![NEW]);
}

/// Records what the agent asks to follow.
#[derive(Default)]
struct Recording {
    followed: Mutex<Vec<IpAddr>>,
}

impl Neighbours for Recording {
    async fn resolve(&self, _ip: IpAddr) -> Result<[u8; 6], String> {
        Ok(MAC)
    }

    fn follow(&self, backends: Vec<IpAddr>) {
        *self.followed.lock().unwrap() = backends;
    }

    fn follow_one(&self, backend: IpAddr) {
        self.followed.lock().unwrap().push(backend);
    }
}

#[tokio::test(start_paused = true)]
async fn the_agent_follows_every_servers_address() {
    let h = Harness::with_neighbours(&config(), Recording::default()).await;
    let followed = h.neighbours.followed.lock().unwrap().clone();
    let want: Vec<IpAddr> = ["10.0.1.1", "10.0.1.2", "10.0.1.3"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(followed, want);
}
