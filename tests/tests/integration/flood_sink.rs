//! The flood benchmark's sink (`lb_tests::bpf::drop_prog`) on a backend's `eth0`: UDP to its
//! port is counted and dropped before the stack sees it, other UDP passes to sockets,
//! and dropping the sink detaches it.

use std::{
    net::{SocketAddr, UdpSocket},
    time::{Duration, Instant},
};

use lb_tests::{bpf::drop_prog, net::topology::Topology};

const SINK_PORT: u16 = 9000;
const OTHER_PORT: u16 = 9001;

/// Datagrams `socket` receives until it stays quiet for 300 ms.
fn received(socket: &UdpSocket) -> usize {
    socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("read timeout");
    let mut buf = [0u8; 64];
    let mut n = 0;
    while socket.recv_from(&mut buf).is_ok() {
        n += 1;
    }
    n
}

#[test]
fn sink_counts_and_drops_its_port_and_passes_the_rest() {
    let topo = Topology::builder().backends(1).build().expect("topology");
    let b1 = &topo.backends()[0];
    let bind = |port: u16| {
        b1.ns
            .run(move || UdpSocket::bind(("0.0.0.0", port)))
            .expect("enter b1")
            .expect("bind in b1")
    };
    let (sink_socket, other_socket) = (bind(SINK_PORT), bind(OTHER_PORT));
    let send = |port: u16, count: usize| {
        let to = SocketAddr::new(b1.ipv4.into(), port);
        topo.client()
            .ns
            .run(move || -> std::io::Result<()> {
                let s = UdpSocket::bind("0.0.0.0:0")?;
                for i in 0..count {
                    s.send_to(format!("datagram {i}").as_bytes(), to)?;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            })
            .expect("enter client")
            .expect("send from client");
    };

    let sink = drop_prog::attach(&b1.ns, "eth0", SINK_PORT).expect("attach the sink");
    send(SINK_PORT, 20);
    send(OTHER_PORT, 7);
    let deadline = Instant::now() + Duration::from_secs(3);
    while sink.count().expect("read the counter") < 20 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sink.count().expect("read the counter"), 20);
    assert_eq!(received(&other_socket), 7, "other ports pass to the stack");
    assert_eq!(
        received(&sink_socket),
        0,
        "the sink's port is dropped in XDP"
    );

    drop(sink);
    send(SINK_PORT, 3);
    assert_eq!(
        received(&sink_socket),
        3,
        "dropping the sink detaches it from eth0"
    );
}
