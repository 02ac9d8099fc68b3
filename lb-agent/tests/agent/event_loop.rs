//! The inputs of `lb-agent run`'s event loop that only the process has, fed by the test:
//! a stop signal ends the loop, SIGHUP reads the configuration again and applies it, a
//! check that re-attached the program shows in status, and a check that finds the data
//! plane lost ends the loop as a failure.

use std::net::SocketAddr;

use crate::util::{Harness, sa, secs, servers, web};
use lb_agent::dataplane::DataplaneError;
use lb_agent::event_loop::{Exit, Signal};
use tokio::time::Instant;

/// `web` with `a`, and with `b` too when `with_b`, probed every second.
fn config(with_b: bool) -> String {
    let mut list = vec![("10.0.1.1:80", "")];
    if with_b {
        list.push(("10.0.1.2:80", ""));
    }
    web(
        "",
        &(servers(&list) + "[[service.probe]]\ntype = \"tcp\"\ninterval = \"1s\"\n"),
    )
}

fn b() -> SocketAddr {
    sa("10.0.1.2:80")
}

async fn serving() -> Harness {
    let mut h = Harness::start(&config(true)).await;
    h.run_for(secs(2)).await;
    assert!(h.slots("web", b()) > 0, "setup: b is in the table");
    h
}

#[tokio::test(start_paused = true)]
async fn a_stop_signal_ends_the_loop_at_once() {
    let mut h = serving().await;
    assert_eq!(h.exit, None, "nothing ended the loop yet");
    h.signal_tx.send(Signal::Stop).await.unwrap();
    let sent = Instant::now();
    h.run_for(secs(10)).await;
    assert_eq!(h.exit, Some(Exit::Stopped));
    assert_eq!(
        Instant::now(),
        sent,
        "the loop ends on the signal, not later"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_signal_reads_the_config_again_and_applies_it() {
    let mut h = serving().await;
    h.write_config(&config(false));
    h.signal_tx.send(Signal::Reload).await.unwrap();
    h.run_for(secs(1)).await;
    assert_eq!(h.exit, None, "the loop goes on after a reload");
    assert_eq!(h.slots("web", b()), 0, "the server the file lost is out");
    assert!(h.slots("web", sa("10.0.1.1:80")) > 0);
}

#[tokio::test(start_paused = true)]
async fn a_check_that_re_attached_the_program_shows_in_status() {
    let mut h = serving().await;
    let repaired = "native, re-attached 1 times after removal";
    h.attachment_tx
        .send(Ok(Some(repaired.to_string())))
        .await
        .unwrap();
    h.run_for(secs(1)).await;
    assert_eq!(h.exit, None, "a repaired attachment serves on");
    assert_eq!(h.snapshot().xdp_mode, repaired);
}

#[tokio::test(start_paused = true)]
async fn a_check_that_finds_the_data_plane_lost_ends_the_loop() {
    let mut h = serving().await;
    h.attachment_tx.send(Ok(None)).await.unwrap();
    h.run_for(secs(1)).await;
    assert_eq!(h.exit, None, "an intact attachment serves on");
    h.attachment_tx
        .send(Err(DataplaneError::NoSuchInterface {
            interface: "lb0".into(),
        }))
        .await
        .unwrap();
    h.run_for(secs(10)).await;
    assert_eq!(h.exit, Some(Exit::DataplaneLost));
}
