//! The API says which passive signals a service can produce (`passive_signals`): every
//! kind for tcp + nat, only `syn_retransmit` for tcp + dsr, only `icmp_unreachable` for
//! udp + nat, none for udp + dsr (docs/passive-signals.md), and it follows a reload that
//! changes the forwarding mode.

use crate::util::Harness;

/// One service `svc` with one server, `protocol` and `forwarding` as given.
fn service(name: &str, protocol: &str, forwarding: &str) -> String {
    let snat = if forwarding == "nat" {
        "snat_ip = \"10.0.0.2\"\n"
    } else {
        ""
    };
    format!(
        "[[service]]\nname = \"{name}\"\nvip = \"10.0.0.100:53\"\nprotocol = \"{protocol}\"\n\
         forwarding = \"{forwarding}\"\n{snat}max_fails = 1\n\
         [[service.server]]\naddress = \"10.0.1.1:53\"\n"
    )
}

#[tokio::test(start_paused = true)]
async fn the_api_names_the_passive_signals_each_service_can_see() {
    let mut text = service("tcp-nat", "tcp", "nat");
    text += &service("tcp-dsr", "tcp", "dsr").replace(":53", ":54");
    text += &service("udp-nat", "udp", "nat");
    text += &service("udp-dsr", "udp", "dsr").replace(":53", ":55");
    let h = Harness::start(&text).await;
    let signals = |svc: &str| h.service_status(svc).passive_signals;
    assert_eq!(
        signals("tcp-nat"),
        ["rst_on_syn", "icmp_unreachable", "syn_retransmit"]
    );
    assert_eq!(signals("tcp-dsr"), ["syn_retransmit"]);
    assert_eq!(signals("udp-nat"), ["icmp_unreachable"]);
    assert!(
        signals("udp-dsr").is_empty(),
        "udp + dsr: max_fails = 1 counts nothing, and the API must say so"
    );
    let json = serde_json::to_value(h.service_status("udp-dsr")).unwrap();
    assert_eq!(json["passive_signals"], serde_json::json!([]));
}

#[tokio::test(start_paused = true)]
async fn passive_signals_follow_a_reload_to_dsr() {
    let mut h = Harness::start(&service("dns", "udp", "nat")).await;
    assert_eq!(
        h.service_status("dns").passive_signals,
        ["icmp_unreachable"]
    );
    h.reload(&service("dns", "udp", "dsr")).await;
    assert!(h.service_status("dns").passive_signals.is_empty());
}
