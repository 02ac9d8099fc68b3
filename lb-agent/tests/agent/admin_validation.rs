//! A server added through the API meets the config loader's rules (port 0,
//! `0.0.0.0`, the VIP itself, backup 4e9): every case is refused by both,
//! for the same reason.

use std::path::Path;

use crate::util::{Harness, secs, servers, web};
use lb_agent::{
    api::{AdminChange, AdminError, NewServer, ServerPatch},
    config,
};

/// (case, address, weight, spare, backup, what both refusals say)
const CASES: &[(&str, &str, u32, bool, u32, &str)] = &[
    ("port 0", "10.0.1.5:0", 1, false, 0, "port 0"),
    ("unspecified address", "0.0.0.0:80", 1, false, 0, "unicast"),
    ("multicast address", "224.0.0.1:80", 1, false, 0, "unicast"),
    (
        "broadcast address",
        "255.255.255.255:80",
        1,
        false,
        0,
        "unicast",
    ),
    ("the VIP itself", "10.0.0.100:80", 1, false, 0, "VIP itself"),
    (
        "the VIP's address, another port",
        "10.0.0.100:8080",
        1,
        false,
        0,
        "VIP itself",
    ),
    (
        "other address family",
        "[2001:db8::1]:80",
        1,
        false,
        0,
        "mixed families",
    ),
    (
        "backup 4e9",
        "10.0.1.5:80",
        1,
        false,
        4_000_000_000,
        "(got 4000000000)",
    ),
    ("weight 0", "10.0.1.5:80", 0, false, 0, "at least 1 (got 0)"),
    (
        "weight above the maximum",
        "10.0.1.5:80",
        10_001,
        false,
        0,
        "at most 10000 (got 10001)",
    ),
    (
        "spare on a backup level",
        "10.0.1.5:80",
        1,
        true,
        1,
        "primary group",
    ),
];

fn base() -> String {
    web("", &servers(&[("10.0.1.1:80", "")]))
}

#[tokio::test(start_paused = true)]
async fn the_api_refuses_every_server_the_config_loader_refuses() {
    let mut h = Harness::start(&base()).await;
    h.run_for(secs(1)).await;
    for &(case, address, weight, spare, backup, says) in CASES {
        let entry = format!(
            "[[service.server]]\naddress = \"{address}\"\nweight = {weight}\nspare = {spare}\nbackup = {backup}\n"
        );
        let file = config::parse(&format!("{}{entry}", base()), Path::new("lb.toml"))
            .expect_err(case)
            .to_string();
        assert!(file.contains(says), "{case}: the loader says {file:?}");

        let addr = address.parse().expect("a socket address");
        let api = h
            .admin(
                "web",
                address,
                AdminChange::Add(NewServer {
                    address: addr,
                    weight,
                    spare,
                    backup,
                }),
            )
            .await
            .expect_err(case);
        let AdminError::Invalid(why) = &api else {
            panic!("{case}: {api:?}");
        };
        assert!(why.contains(says), "{case}: the API says {why:?}");
    }
    assert_eq!(
        h.snapshot().services[0].servers.len(),
        1,
        "nothing was added"
    );
    assert!(h.agent().admin_state().is_empty(), "nothing recorded");
}

#[tokio::test(start_paused = true)]
async fn a_patch_meets_the_same_weight_and_spare_rules() {
    let text = web(
        "",
        &servers(&[("10.0.1.1:80", ""), ("10.0.1.2:80", "backup = 1\n")]),
    );
    let mut h = Harness::start(&text).await;
    for (case, addr, patch, says) in [
        (
            "weight 0",
            "10.0.1.1:80",
            ServerPatch {
                weight: Some(0),
                ..Default::default()
            },
            "at least 1 (got 0)",
        ),
        (
            "weight above the maximum",
            "10.0.1.1:80",
            ServerPatch {
                weight: Some(10_001),
                ..Default::default()
            },
            "at most 10000 (got 10001)",
        ),
        (
            "spare on a backup level",
            "10.0.1.2:80",
            ServerPatch {
                spare: Some(true),
                ..Default::default()
            },
            "primary group",
        ),
    ] {
        let err = h
            .admin("web", addr, AdminChange::Patch(patch))
            .await
            .expect_err(case);
        assert!(err.to_string().contains(says), "{case}: {err}");
    }
}
