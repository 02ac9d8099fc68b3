//! `lb-testserver`: the backend server of the namespace scenarios.
//!
//! ```text
//! lb-testserver --name b1 [--tcp PORT]... [--udp PORT]... [--max-conns N] [--idle-timeout SECS]
//! ```
//!
//! TCP: on accept, writes `<name>\n`, then answers every line it receives with
//! `<name> <line>` until the client closes, so a long-lived connection can be checked.
//! UDP: answers every datagram with `<name>`, from the address it was sent to (one
//! socket per local address, so a DSR VIP on `lo` answers as the VIP).
//!
//! Bounded: at most `--max-conns` TCP connections at once (more are closed at once),
//! lines of at most 4 KiB, connections idle for `--idle-timeout` are closed. Prints
//! `lb-testserver <name> ready` on stderr once every port is bound. Runs until killed.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context, bail};

/// Longest line echoed; a longer one closes the connection.
const MAX_LINE: u64 = 4096;

struct Args {
    name: String,
    tcp: Vec<u16>,
    udp: Vec<u16>,
    max_conns: usize,
    idle_timeout: Duration,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        name: String::new(),
        tcp: Vec::new(),
        udp: Vec::new(),
        max_conns: 512,
        idle_timeout: Duration::from_secs(120),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--name" => args.name = value()?,
            "--tcp" => args.tcp.push(parse_port(&value()?)?),
            "--udp" => args.udp.push(parse_port(&value()?)?),
            "--max-conns" => args.max_conns = value()?.parse().context("--max-conns")?,
            "--idle-timeout" => {
                args.idle_timeout = Duration::from_secs(value()?.parse().context("--idle-timeout")?)
            }
            "-h" | "--help" => {
                println!(
                    "usage: lb-testserver --name NAME [--tcp PORT]... [--udp PORT]... \
                     [--max-conns N] [--idle-timeout SECS]"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    if args.name.is_empty() || args.name.contains(['\n', '\r']) {
        bail!("--name NAME is required (one line)");
    }
    if args.tcp.is_empty() && args.udp.is_empty() {
        bail!("give at least one --tcp PORT or --udp PORT");
    }
    Ok(args)
}

fn parse_port(s: &str) -> anyhow::Result<u16> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => bail!("{s:?} is not a port (1..65535)"),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("lb-testserver: error: {err:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<()> {
    let args = parse_args()?;
    let name: Arc<str> = args.name.into();
    let active = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for port in &args.tcp {
        let listener = bind_tcp(*port)?;
        let (name, active) = (Arc::clone(&name), Arc::clone(&active));
        let (max, idle) = (args.max_conns, args.idle_timeout);
        threads.push(thread::spawn(move || {
            accept_loop(listener, name, active, max, idle)
        }));
    }
    for port in &args.udp {
        for socket in bind_udp(*port)? {
            let name = Arc::clone(&name);
            threads.push(thread::spawn(move || udp_loop(socket, name)));
        }
    }
    eprintln!(
        "lb-testserver {name} ready tcp={:?} udp={:?}",
        args.tcp, args.udp
    );
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// A dual-stack listener when the host has IPv6, else IPv4 only.
fn bind_tcp(port: u16) -> anyhow::Result<TcpListener> {
    TcpListener::bind((Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)))
        .with_context(|| format!("binding TCP port {port}"))
}

/// One socket per local address (so replies leave from the address asked), loopback included.
fn bind_udp(port: u16) -> anyhow::Result<Vec<UdpSocket>> {
    let mut sockets = Vec::new();
    for addr in local_addrs()? {
        let sa = match addr {
            IpAddr::V6(v6) if v6.is_unicast_link_local() => continue,
            other => SocketAddr::new(other, port),
        };
        sockets.push(UdpSocket::bind(sa).with_context(|| format!("binding UDP {sa}"))?);
    }
    if sockets.is_empty() {
        bail!("no local address to bind UDP port {port} to");
    }
    Ok(sockets)
}

fn local_addrs() -> anyhow::Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below; we only read sockaddrs
    // whose family says which struct they are.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return Err(std::io::Error::last_os_error()).context("getifaddrs");
        }
        let mut cur = head;
        while !cur.is_null() {
            let sa = (*cur).ifa_addr;
            if !sa.is_null() {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                            sin.sin_addr.s_addr,
                        ))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn accept_loop(
    listener: TcpListener,
    name: Arc<str>,
    active: Arc<AtomicUsize>,
    max: usize,
    idle: Duration,
) {
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        if active.fetch_add(1, Ordering::SeqCst) >= max {
            active.fetch_sub(1, Ordering::SeqCst);
            continue; // dropped: closed at once
        }
        let (conn_name, conn_active) = (Arc::clone(&name), Arc::clone(&active));
        let spawned = thread::Builder::new().spawn(move || {
            let _ = serve_tcp(stream, &conn_name, idle);
            conn_active.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn serve_tcp(mut stream: TcpStream, name: &str, idle: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(idle))?;
    stream.set_write_timeout(Some(idle))?;
    stream.set_nodelay(true)?;
    stream.write_all(format!("{name}\n").as_bytes())?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line)?;
        if n == 0 || line.last() != Some(&b'\n') {
            return Ok(()); // closed by the client, or a line too long
        }
        let mut reply = Vec::with_capacity(name.len() + 1 + line.len());
        reply.extend_from_slice(name.as_bytes());
        reply.push(b' ');
        reply.extend_from_slice(&line);
        stream.write_all(&reply)?;
    }
}

fn udp_loop(socket: UdpSocket, name: Arc<str>) {
    let mut buf = [0u8; 2048];
    loop {
        match socket.recv_from(&mut buf) {
            Ok((_, peer)) => {
                let _ = socket.send_to(name.as_bytes(), peer);
            }
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => {
                eprintln!("lb-testserver {name}: udp receive failed: {err}");
                return;
            }
        }
    }
}
