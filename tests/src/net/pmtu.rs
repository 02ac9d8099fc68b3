//! The path-MTU test network: a client and a backend, each behind a router whose route
//! toward them allows only [`SMALL_MTU`] bytes, while every link is 1500 bytes; lb on a
//! bridge with the router (one-armed, as in [`crate::net::topology`]).
//!
//! ```text
//! client ──(cl)── router ──(lan: bridge br0)── lb (eth0, XDP)
//!                   └──(be)── backend
//! ```
//!
//! | host    | IPv4            | IPv6        |
//! |---------|-----------------|-------------|
//! | router  | 10.90.0.1 (lan), 10.91.0.1 (cl), 10.92.0.1 (be) | fd90::1, fd91::1, fd92::1 |
//! | lb      | 10.90.0.2 (also the snat address) | fd90::2 |
//! | client  | 10.91.0.10      | fd91::a     |
//! | backend | 10.92.0.10      | fd92::a     |
//! | VIP     | 10.99.0.1 (routed by the router to lb) | fd99::1 |
//!
//! Both ends see a 1500-byte link and announce a 1460-byte MSS; the router's routes
//! toward them carry `mtu 1280`, so a full-size segment toward the client (a download)
//! or toward the backend (an upload) makes the router answer "fragmentation needed" /
//! "packet too big" to the segment's source: the VIP, or lb's snat address. Only lb's
//! translation of that error gets it to the sender; without it the transfer stalls.
//!
//! Every namespace, link and program is removed on drop, also when a test fails.

use std::{
    io::{self, BufRead, BufReader, Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use aya::programs::XdpMode;

use crate::{
    agent::daemon::{AgentConfig, READY_LINE, START_TIMEOUT, Service},
    net::{
        link::{self, Link, Mac, VethEnd},
        names,
        netns::NetNs,
        switch::Switch,
        topology::{Forwarding, HOST_IF},
    },
    util::{error::Error, process::NsProcess, temp_dir::TempDir},
};

/// MTU of the router's routes toward the client and the backend (IPv6's minimum).
pub const SMALL_MTU: u32 = 1280;
/// Port of the backend's transfer server and of the VIP.
pub const PORT: u16 = 8080;

/// One address family's plan.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub ipv6: bool,
}

impl Plan {
    fn addr(self, v4: [u8; 4], v6: &str) -> IpAddr {
        if self.ipv6 {
            IpAddr::V6(v6.parse().expect("IPv6 literal"))
        } else {
            IpAddr::from(v4)
        }
    }

    fn prefix(self) -> u8 {
        if self.ipv6 { 64 } else { 24 }
    }

    pub fn router_lan(self) -> IpAddr {
        self.addr([10, 90, 0, 1], "fd90::1")
    }
    pub fn lb(self) -> IpAddr {
        self.addr([10, 90, 0, 2], "fd90::2")
    }
    pub fn router_cl(self) -> IpAddr {
        self.addr([10, 91, 0, 1], "fd91::1")
    }
    pub fn client(self) -> IpAddr {
        self.addr([10, 91, 0, 10], "fd91::a")
    }
    pub fn router_be(self) -> IpAddr {
        self.addr([10, 92, 0, 1], "fd92::1")
    }
    pub fn backend(self) -> IpAddr {
        self.addr([10, 92, 0, 10], "fd92::a")
    }
    pub fn vip(self) -> IpAddr {
        self.addr([10, 99, 0, 1], "fd99::1")
    }
    /// The `/N` network of `addr` in this plan.
    fn net(self, addr: IpAddr) -> String {
        match addr {
            IpAddr::V4(a) => {
                let o = a.octets();
                format!("{}.{}.{}.0/24", o[0], o[1], o[2])
            }
            IpAddr::V6(a) => {
                let s = a.segments();
                format!("{:x}::/64", s[0])
            }
        }
    }
}

const MAC_ROUTER_LAN: Mac = Mac([0x02, 0x90, 0, 0, 0, 0x01]);
const MAC_LB: Mac = Mac([0x02, 0x90, 0, 0, 0, 0x02]);
const MAC_ROUTER_CL: Mac = Mac([0x02, 0x91, 0, 0, 0, 0x01]);
const MAC_CLIENT: Mac = Mac([0x02, 0x91, 0, 0, 0, 0x0a]);
const MAC_ROUTER_BE: Mac = Mac([0x02, 0x92, 0, 0, 0, 0x01]);
const MAC_BACKEND: Mac = Mac([0x02, 0x92, 0, 0, 0, 0x0a]);

/// The built network; dropping it removes everything.
pub struct PmtuNet {
    // Fields drop in this order: the switch (programs, ports), the router's links,
    // namespaces, the directory.
    switch: Switch,
    links: Vec<Link>,
    pub plan: Plan,
    pub client: NetNs,
    pub router: NetNs,
    pub lb: NetNs,
    pub backend: NetNs,
    dir: TempDir,
}

impl PmtuNet {
    /// Creates the namespaces, links, addresses, routes and neighbours of `plan`.
    pub fn build(plan: Plan) -> Result<PmtuNet, Error> {
        names::sweep_stale_once();
        let tag = names::unique_tag();
        let dir = TempDir::create(std::env::temp_dir().join(&tag))?;
        let switch = Switch::create(&tag)?;
        let ns = |role: &str| NetNs::create(&format!("{tag}-{role}"));
        let (router, lb, client, backend) = (ns("rt")?, ns("lb")?, ns("cl")?, ns("be")?);
        let mut net = PmtuNet {
            switch,
            links: Vec::new(),
            plan,
            client,
            router,
            lb,
            backend,
            dir,
        };
        for (port, host, name, mac) in [
            ("p-rt", &net.router, "lan", MAC_ROUTER_LAN),
            ("p-lb", &net.lb, HOST_IF, MAC_LB),
        ] {
            net.switch.plug(
                port,
                Mac([0x02, 0x98, 0, 0, 0, mac.0[5]]),
                VethEnd {
                    ns: host,
                    name,
                    mac,
                },
            )?;
        }
        for (host, name, mac, router_name, router_mac) in [
            (&net.client, HOST_IF, MAC_CLIENT, "cl", MAC_ROUTER_CL),
            (&net.backend, HOST_IF, MAC_BACKEND, "be", MAC_ROUTER_BE),
        ] {
            net.links.push(link::veth_pair(
                VethEnd {
                    ns: &net.router,
                    name: router_name,
                    mac: router_mac,
                },
                VethEnd {
                    ns: host,
                    name,
                    mac,
                },
            )?);
        }
        net.configure()?;
        net.client.keep_ephemeral_ports_above_fixed()?;
        net.switch.attach_pass(XdpMode::Driver, &[])?;
        Ok(net)
    }

    fn configure(&self) -> Result<(), Error> {
        let p = self.plan;
        let len = p.prefix();
        let nodad = if p.ipv6 { " nodad" } else { "" };
        let neigh = |addr: IpAddr, mac: Mac, dev: &str| {
            format!("neigh replace {addr} lladdr {mac} dev {dev} nud permanent")
        };
        // The router: the small MTU is on its routes toward the two ends, not on links.
        self.router.ip_batch(&[
            "link set lan up".into(),
            "link set cl up".into(),
            "link set be up".into(),
            format!("addr add {}/{len} dev lan{nodad}", p.router_lan()),
            format!(
                "addr add {}/{len} dev cl noprefixroute{nodad}",
                p.router_cl()
            ),
            format!(
                "addr add {}/{len} dev be noprefixroute{nodad}",
                p.router_be()
            ),
            format!(
                "route add {} dev cl mtu lock {SMALL_MTU}",
                p.net(p.client())
            ),
            format!(
                "route add {} dev be mtu lock {SMALL_MTU}",
                p.net(p.backend())
            ),
            format!("route add {} via {}", host_route(p.vip()), p.lb()),
            neigh(p.lb(), MAC_LB, "lan"),
            neigh(p.client(), MAC_CLIENT, "cl"),
            neigh(p.backend(), MAC_BACKEND, "be"),
        ])?;
        let forward = if p.ipv6 {
            "net.ipv6.conf.all.forwarding"
        } else {
            "net.ipv4.ip_forward"
        };
        self.router.sysctl(forward, "1")?;
        for (host, addr, gateway, mac) in [
            (&self.lb, p.lb(), p.router_lan(), MAC_ROUTER_LAN),
            (&self.client, p.client(), p.router_cl(), MAC_ROUTER_CL),
            (&self.backend, p.backend(), p.router_be(), MAC_ROUTER_BE),
        ] {
            host.ip_batch(&[
                format!("link set {HOST_IF} up"),
                format!("addr add {addr}/{len} dev {HOST_IF}{nodad}"),
                format!("route add default via {gateway}"),
                neigh(gateway, mac, HOST_IF),
            ])?;
        }
        // Hosts send full checksums (see `link::set_tx_checksum`); so does the router.
        for (ns, dev) in [
            (&self.lb, HOST_IF),
            (&self.client, HOST_IF),
            (&self.backend, HOST_IF),
            (&self.router, "lan"),
            (&self.router, "cl"),
            (&self.router, "be"),
        ] {
            link::set_tx_checksum(ns, dev, false)?;
        }
        Ok(())
    }

    /// Starts `lb-agent run` in the lb namespace with one nat TCP service `VIP:PORT ->
    /// backend:PORT`, snat from lb's address; waits until it is ready.
    pub fn start_agent(&self, binary: &Path) -> Result<NsProcess, Error> {
        let p = self.plan;
        let service = Service {
            name: "bulk".into(),
            vip: SocketAddr::new(p.vip(), PORT),
            protocol: crate::agent::daemon::Proto::Tcp,
            forwarding: Forwarding::Nat,
            snat_ip: Some(p.lb()),
            snat_ports: Some("20000-29999".into()),
            servers: vec![(SocketAddr::new(p.backend(), PORT), 1)],
            extra: vec!["max_fails = 0".into()],
        };
        let config = AgentConfig::new(vec![service]);
        let path = self.dir.path().join("lb.toml");
        std::fs::write(&path, config.render())
            .map_err(Error::io(format!("writing {}", path.display())))?;
        let args = [
            "run".to_owned(),
            "--config".to_owned(),
            path.display().to_string(),
            "--interface".to_owned(),
            HOST_IF.to_owned(),
        ];
        let agent = NsProcess::spawn(&self.lb, "lb-agent", binary, &args, &[("NO_COLOR", "1")])?;
        agent.wait_for_line(0, READY_LINE, START_TIMEOUT)?;
        Ok(agent)
    }
}

/// `addr/32` or `addr/128`.
fn host_route(addr: IpAddr) -> String {
    match addr {
        IpAddr::V4(a) => format!("{a}/32"),
        IpAddr::V6(a) => format!("{a}/128"),
    }
}

/// The ICMP errors a namespace sent about packets too big: IPv4 destination-unreachable
/// messages (`Icmp: OutDestUnreachs`, every code) or ICMPv6 packet-too-big
/// (`Icmp6OutPktTooBigs`).
pub fn too_big_sent(ns: &NetNs, ipv6: bool) -> Result<u64, Error> {
    // /proc/thread-self/net is the namespace of the reading thread (/proc/self/net
    // would be the main thread's).
    let (file, key) = if ipv6 {
        ("/proc/thread-self/net/snmp6", "Icmp6OutPktTooBigs")
    } else {
        ("/proc/thread-self/net/snmp", "OutDestUnreachs")
    };
    let text = ns
        .run(|| std::fs::read_to_string(file))?
        .map_err(Error::io(format!("reading {file} in {}", ns.name())))?;
    snmp_value(&text, ipv6, key).ok_or_else(|| Error::Io {
        what: format!("no {key} in {file}"),
        source: io::Error::from(io::ErrorKind::InvalidData),
    })
}

/// `key`'s value in `/proc/net/snmp6` (`name value` lines) or, for IPv4, in the `Icmp:`
/// lines of `/proc/net/snmp` (a line of names, then a line of values).
fn snmp_value(text: &str, ipv6: bool, key: &str) -> Option<u64> {
    if ipv6 {
        text.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == key).then(|| words.next()?.parse().ok())?
        })
    } else {
        let mut lines = text.lines().filter(|l| l.starts_with("Icmp: "));
        let (names, values) = (lines.next()?, lines.next()?);
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(k, _)| *k == key)
            .and_then(|(_, v)| v.parse().ok())
    }
}

/// Byte `i` of every transfer.
fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

/// The backend's transfer server: each connection sends one line, `GET N` (the server
/// sends N pattern bytes and closes) or `PUT N` (the client sends N pattern bytes, the
/// server answers `OK N` once all arrived intact, else `BAD …`). Connections are served
/// one after another; stopped and joined on drop.
pub struct TransferServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Longest a transfer connection may stay silent.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

impl TransferServer {
    pub fn start(backend: &NetNs, addr: SocketAddr) -> Result<TransferServer, Error> {
        let listener = backend
            .run(|| TcpListener::bind(addr))?
            .map_err(Error::io(format!("binding {addr} in the backend")))?;
        listener
            .set_nonblocking(true)
            .map_err(Error::io("listener non-blocking"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = thread::Builder::new()
            .name("pmtu-server".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let _ = serve(stream);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(10));
                        }
                        Err(_) => thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
            .map_err(Error::io("starting the server thread"))?;
        Ok(TransferServer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for TransferServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(stream: TcpStream) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.by_ref().take(64).read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (verb, n) = (
        words.next(),
        words.next().and_then(|n| n.parse::<usize>().ok()),
    );
    let mut stream = stream;
    match (verb, n) {
        (Some("GET"), Some(n)) => {
            let data: Vec<u8> = (0..n).map(pattern).collect();
            stream.write_all(&data)?;
        }
        (Some("PUT"), Some(n)) => {
            let mut got = vec![0u8; n];
            reader.read_exact(&mut got)?;
            let bad = got.iter().enumerate().position(|(i, b)| *b != pattern(i));
            let answer = match bad {
                None => format!("OK {n}\n"),
                Some(i) => format!("BAD at {i}\n"),
            };
            stream.write_all(answer.as_bytes())?;
        }
        _ => stream.write_all(b"BAD request\n")?,
    }
    stream.flush()
}

/// Downloads `n` bytes from `vip` from the client namespace within `limit`; returns the
/// bytes received intact (fewer than `n` when it stalled).
pub fn download(
    client: &NetNs,
    vip: SocketAddr,
    n: usize,
    limit: Duration,
) -> Result<usize, Error> {
    client.run(|| -> Result<usize, Error> {
        let deadline = Instant::now() + limit;
        let mut s = connect(vip)?;
        s.write_all(format!("GET {n}\n").as_bytes())
            .map_err(Error::io("sending GET"))?;
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        while got < n && Instant::now() < deadline {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => {
                    if let Some(i) = (0..k).find(|&i| buf[i] != pattern(got + i)) {
                        return Err(Error::Io {
                            what: format!("download corrupt at byte {}", got + i),
                            source: io::Error::from(io::ErrorKind::InvalidData),
                        });
                    }
                    got += k;
                }
                // A stall: keep trying until the deadline.
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(Error::io("downloading")(e)),
            }
        }
        Ok(got)
    })?
}

/// Uploads `n` bytes to `vip` from the client namespace within `limit`; returns the
/// server's answer (`OK n` when everything arrived intact).
pub fn upload(client: &NetNs, vip: SocketAddr, n: usize, limit: Duration) -> Result<String, Error> {
    client.run(|| -> Result<String, Error> {
        let deadline = Instant::now() + limit;
        let mut s = connect(vip)?;
        s.write_all(format!("PUT {n}\n").as_bytes())
            .map_err(Error::io("sending PUT"))?;
        let data: Vec<u8> = (0..n).map(pattern).collect();
        let mut sent = 0;
        while sent < n {
            if Instant::now() >= deadline {
                return Ok(format!("stalled after {sent} of {n} bytes"));
            }
            match s.write(&data[sent..]) {
                Ok(k) => sent += k,
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(Error::io("uploading")(e)),
            }
        }
        let mut answer = Vec::new();
        while Instant::now() < deadline && !answer.ends_with(b"\n") {
            let mut byte = [0u8; 64];
            match s.read(&mut byte) {
                Ok(0) => break,
                Ok(k) => answer.extend_from_slice(&byte[..k]),
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(Error::io("reading the answer")(e)),
            }
        }
        Ok(String::from_utf8_lossy(&answer).trim().to_owned())
    })?
}

fn connect(vip: SocketAddr) -> Result<TcpStream, Error> {
    let s = TcpStream::connect_timeout(&vip, IO_TIMEOUT)
        .map_err(Error::io(format!("connecting to {vip}")))?;
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .and_then(|()| s.set_write_timeout(Some(Duration::from_millis(500))))
        .map_err(Error::io("socket timeouts"))?;
    Ok(s)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snmp_counters_are_found() {
        let v4 = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
                  Icmp: InMsgs OutMsgs OutDestUnreachs\nIcmp: 3 12 10\n\
                  IcmpMsg: OutType3\nIcmpMsg: 10\n";
        assert_eq!(snmp_value(v4, false, "OutDestUnreachs"), Some(10));
        assert_eq!(snmp_value(v4, false, "OutType3"), None);
        let v6 = "Icmp6InMsgs                     \t4\nIcmp6OutPktTooBigs              \t7\n";
        assert_eq!(snmp_value(v6, true, "Icmp6OutPktTooBigs"), Some(7));
        assert_eq!(snmp_value(v6, true, "Icmp6OutMsgs"), None);
    }

    #[test]
    fn plan_networks() {
        let v4 = Plan { ipv6: false };
        assert_eq!(v4.net(v4.client()), "10.91.0.0/24");
        assert_eq!(host_route(v4.vip()), "10.99.0.1/32");
        let v6 = Plan { ipv6: true };
        assert_eq!(v6.net(v6.backend()), "fd92::/64");
        assert_eq!(host_route(v6.vip()), "fd99::1/128");
    }
}
