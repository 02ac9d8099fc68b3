//! `lb-testserver`: the backend server of the namespace scenarios.
//!
//! ```text
//! lb-testserver --name b1 [--tcp PORT]... [--udp PORT]... [--http PORT]... [--web PORT]...
//!               [--http-path PATH] [--http-answer SPEC] [--udp-answer SPEC]
//!               [--control FILE] [--max-conns N] [--idle-timeout SECS]
//! ```
//!
//! TCP: on accept, writes `<name>\n`, then answers every line it receives with
//! `<name> <line>` until the client closes, so a long-lived connection can be checked;
//! a line `stream N` is answered with `<name> stream N` and then N bytes (at most 1 GiB,
//! a repeating `0123456789` pattern) as fast as the client reads: a long download.
//! UDP: answers every datagram with `<name>` (or the `--udp-answer` text), from the
//! address it was sent to (one socket per local address, so a DSR VIP on `lo` answers as
//! the VIP).
//!
//! HTTP/1.1 (for http probes): reads one request head and its body (`Content-Length`, at
//! most 4 KiB); a request for `<http-path>` (default `/health`), whatever its method,
//! gets the current answer, any other path `404`. Every response says what was asked:
//! `X-Request-Method: <method>` and `X-Request-Body: <body>` (printable ASCII up to 256
//! bytes, else `<N bytes>`), so that a probe's method and body can be checked. Answers,
//! as `SPEC`:
//! - `CODE [BODY…]`: status `CODE` with `BODY` (default `<name> ok`), `Connection: close`;
//! - `hang`: reads the request and never answers (until the client closes);
//! - `endless`: a `200` head, then a chunked body of `x` that never ends;
//! - `garbage`: random bytes that are no HTTP at all, without end.
//!
//! Web (`--web PORT`, the service port of the realistic-traffic scenarios): HTTP/1.1 that
//! answers every `GET` (any path) with `200` and the body `<name>\n`, whatever the
//! control file says (that one drives the health endpoint). Like a real backend it closes
//! the connection itself right after the response (`Connection: close`: the *backend*
//! closes first) unless the request asks `Connection: keep-alive`; a kept-alive connection
//! serves up to 100 requests, the last one answered with `Connection: close` before the
//! server closes.
//!
//! UDP answers, as `SPEC`: `name` (the default), `reply TEXT`, or `silent` (read, never
//! answer).
//!
//! Switching at runtime: with `--control FILE`, the file is read on every HTTP request
//! and every datagram; its lines `http SPEC` and `udp SPEC` override the flags (a missing
//! file or line means the flag's answer; `#` starts a comment), and each line
//! `header NAME: VALUE` adds a header to every `CODE [BODY]` answer. Write it atomically
//! (write another file, rename it over).
//!
//! Bounded: at most `--max-conns` TCP connections at once (more are closed at once),
//! lines of at most 4 KiB, request heads of at most 8 KiB, endless answers stop after
//! 1 GiB, connections idle for `--idle-timeout` are closed. Prints
//! `lb-testserver <name> ready` on stderr once every port is bound. Runs until killed.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context, bail};

/// Longest line echoed; a longer one closes the connection.
const MAX_LINE: u64 = 4096;
/// Longest HTTP request head read; a longer one closes the connection.
const MAX_HEAD: usize = 8192;
/// Bytes an `endless` or `garbage` answer sends at most.
const MAX_ENDLESS: u64 = 1 << 30;
/// Longest HTTP request body read; a longer one is read this far and answered.
const MAX_BODY: usize = 4096;
/// Longest request body echoed in `X-Request-Body`.
const MAX_ECHO: usize = 256;
/// Bytes a `hang` connection reads (and drops) at most before it closes.
const MAX_HANG_READ: u64 = 1 << 20;
/// The longest download a `stream N` line may ask for.
const MAX_STREAM: u64 = 1 << 30;
/// Requests a kept-alive web connection serves before the server closes it.
const WEB_KEEPALIVE_MAX: usize = 100;

struct Args {
    name: String,
    tcp: Vec<u16>,
    udp: Vec<u16>,
    http: Vec<u16>,
    web: Vec<u16>,
    http_path: String,
    defaults: Behaviour,
    control: Option<PathBuf>,
    max_conns: usize,
    idle_timeout: Duration,
}

/// What an HTTP request gets.
#[derive(Clone, Debug, PartialEq, Eq)]
enum HttpAnswer {
    Respond { status: u16, body: String },
    Hang,
    Endless,
    Garbage,
}

/// What a datagram gets.
#[derive(Clone, Debug, PartialEq, Eq)]
enum UdpAnswer {
    Reply(String),
    Silent,
}

/// The answers in force.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Behaviour {
    http: HttpAnswer,
    udp: UdpAnswer,
    /// Extra `NAME: VALUE` headers of `CODE [BODY]` answers.
    headers: Vec<String>,
}

impl HttpAnswer {
    fn parse(spec: &str, name: &str) -> anyhow::Result<Self> {
        let spec = spec.trim();
        let (word, rest) = spec.split_once(' ').unwrap_or((spec, ""));
        Ok(match word {
            "hang" => HttpAnswer::Hang,
            "endless" => HttpAnswer::Endless,
            "garbage" => HttpAnswer::Garbage,
            code => {
                let status: u16 = code
                    .parse()
                    .ok()
                    .filter(|c| (100..=999).contains(c))
                    .with_context(|| {
                        format!(
                            "http answer {spec:?}: expected CODE [BODY], hang, endless or garbage"
                        )
                    })?;
                let body = if rest.trim().is_empty() {
                    format!("{name} ok")
                } else {
                    rest.trim().to_owned()
                };
                HttpAnswer::Respond { status, body }
            }
        })
    }
}

impl UdpAnswer {
    fn parse(spec: &str, name: &str) -> anyhow::Result<Self> {
        let spec = spec.trim();
        match spec.split_once(' ').unwrap_or((spec, "")) {
            ("name", "") => Ok(UdpAnswer::Reply(name.to_owned())),
            ("silent", "") => Ok(UdpAnswer::Silent),
            ("reply", text) if !text.trim().is_empty() => {
                Ok(UdpAnswer::Reply(text.trim().to_owned()))
            }
            _ => bail!("udp answer {spec:?}: expected name, silent or reply TEXT"),
        }
    }
}

/// The answers from `--control FILE` over the flags' defaults, read at every use.
struct Control {
    name: Arc<str>,
    path: Option<PathBuf>,
    defaults: Behaviour,
    /// The last behaviour reported on stderr (each change is logged once).
    last: Mutex<Option<Behaviour>>,
}

impl Control {
    fn current(&self) -> Behaviour {
        let mut b = self.defaults.clone();
        if let Some(path) = &self.path {
            match std::fs::read_to_string(path) {
                Ok(text) => self.apply(&text, &mut b),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => eprintln!(
                    "lb-testserver {}: reading {}: {err}",
                    self.name,
                    path.display()
                ),
            }
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_ref() != Some(&b) {
            eprintln!("lb-testserver {} answers {:?}", self.name, b);
            *last = Some(b.clone());
        }
        b
    }

    fn apply(&self, text: &str, b: &mut Behaviour) {
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let (key, spec) = line.split_once(' ').unwrap_or((line, ""));
            let parsed = match key {
                "http" => HttpAnswer::parse(spec, &self.name).map(|a| b.http = a),
                "udp" => UdpAnswer::parse(spec, &self.name).map(|a| b.udp = a),
                "header" => match spec.split_once(':') {
                    Some((n, v))
                        if !n.trim().is_empty()
                            && !n.contains(char::is_whitespace)
                            && !v.contains(char::is_control) =>
                    {
                        b.headers.push(format!("{}: {}", n.trim(), v.trim()));
                        Ok(())
                    }
                    _ => Err(anyhow::anyhow!("header: expected NAME: VALUE")),
                },
                other => Err(anyhow::anyhow!("unknown key {other:?} (http, udp, header)")),
            };
            if let Err(err) = parsed {
                eprintln!(
                    "lb-testserver {}: control line {line:?}: {err:#}",
                    self.name
                );
            }
        }
    }
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        name: String::new(),
        tcp: Vec::new(),
        udp: Vec::new(),
        http: Vec::new(),
        web: Vec::new(),
        http_path: "/health".to_owned(),
        defaults: Behaviour {
            http: HttpAnswer::Respond {
                status: 200,
                body: String::new(),
            },
            udp: UdpAnswer::Reply(String::new()),
            headers: Vec::new(),
        },
        control: None,
        max_conns: 512,
        idle_timeout: Duration::from_secs(120),
    };
    let (mut http_spec, mut udp_spec) = ("200".to_owned(), "name".to_owned());
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--name" => args.name = value()?,
            "--tcp" => args.tcp.push(parse_port(&value()?)?),
            "--udp" => args.udp.push(parse_port(&value()?)?),
            "--http" => args.http.push(parse_port(&value()?)?),
            "--web" => args.web.push(parse_port(&value()?)?),
            "--http-path" => args.http_path = value()?,
            "--http-answer" => http_spec = value()?,
            "--udp-answer" => udp_spec = value()?,
            "--control" => args.control = Some(PathBuf::from(value()?)),
            "--max-conns" => args.max_conns = value()?.parse().context("--max-conns")?,
            "--idle-timeout" => {
                args.idle_timeout = Duration::from_secs(value()?.parse().context("--idle-timeout")?)
            }
            "-h" | "--help" => {
                println!(
                    "usage: lb-testserver --name NAME [--tcp PORT]... [--udp PORT]... \
                     [--http PORT]... [--web PORT]... [--http-path PATH] [--http-answer SPEC] \
                     [--udp-answer SPEC] [--control FILE] [--max-conns N] \
                     [--idle-timeout SECS]\n\
                     http SPEC: CODE [BODY] | hang | endless | garbage; \
                     udp SPEC: name | reply TEXT | silent"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (see --help)"),
        }
    }
    if args.name.is_empty() || args.name.contains(['\n', '\r']) {
        bail!("--name NAME is required (one line)");
    }
    if args.tcp.is_empty() && args.udp.is_empty() && args.http.is_empty() && args.web.is_empty() {
        bail!("give at least one --tcp PORT, --udp PORT, --http PORT or --web PORT");
    }
    if !args.http_path.starts_with('/') {
        bail!("--http-path {:?} must start with '/'", args.http_path);
    }
    args.defaults = Behaviour {
        http: HttpAnswer::parse(&http_spec, &args.name).context("--http-answer")?,
        udp: UdpAnswer::parse(&udp_spec, &args.name).context("--udp-answer")?,
        headers: Vec::new(),
    };
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
    let control = Arc::new(Control {
        name: Arc::clone(&name),
        path: args.control,
        defaults: args.defaults,
        last: Mutex::new(None),
    });
    let active = Arc::new(AtomicUsize::new(0));
    let limits = Limits {
        active,
        max: args.max_conns,
        idle: args.idle_timeout,
    };
    let mut threads = Vec::new();
    for port in &args.tcp {
        let listener = bind_tcp(*port)?;
        let name = Arc::clone(&name);
        let limits = limits.clone();
        threads.push(thread::spawn(move || {
            accept_loop(listener, limits, move |stream, idle| {
                serve_tcp(stream, &name, idle)
            })
        }));
    }
    for port in &args.http {
        let listener = bind_tcp(*port)?;
        let control = Arc::clone(&control);
        let path: Arc<str> = args.http_path.as_str().into();
        let limits = limits.clone();
        threads.push(thread::spawn(move || {
            accept_loop(listener, limits, move |stream, idle| {
                serve_http(stream, &control, &path, idle)
            })
        }));
    }
    for port in &args.web {
        let listener = bind_tcp(*port)?;
        let name = Arc::clone(&name);
        let limits = limits.clone();
        threads.push(thread::spawn(move || {
            accept_loop(listener, limits, move |stream, idle| {
                serve_web(stream, &name, idle)
            })
        }));
    }
    for port in &args.udp {
        for socket in bind_udp(*port)? {
            let control = Arc::clone(&control);
            threads.push(thread::spawn(move || udp_loop(socket, control)));
        }
    }
    // Report the starting answers once, so the log shows them before any change.
    let _ = control.current();
    eprintln!(
        "lb-testserver {name} ready tcp={:?} udp={:?} http={:?} web={:?}",
        args.tcp, args.udp, args.http, args.web
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

/// The connection limits every listener shares.
#[derive(Clone)]
struct Limits {
    /// Connections open now, over every listener.
    active: Arc<AtomicUsize>,
    max: usize,
    idle: Duration,
}

fn accept_loop<F>(listener: TcpListener, limits: Limits, serve: F)
where
    F: Fn(TcpStream, Duration) -> std::io::Result<()> + Send + Sync + 'static,
{
    let serve = Arc::new(serve);
    for conn in listener.incoming() {
        let Ok(stream) = conn else { continue };
        let active = &limits.active;
        if active.fetch_add(1, Ordering::SeqCst) >= limits.max {
            active.fetch_sub(1, Ordering::SeqCst);
            continue; // dropped: closed at once
        }
        let (conn_serve, conn_active, idle) = (Arc::clone(&serve), Arc::clone(active), limits.idle);
        let spawned = thread::Builder::new().spawn(move || {
            let _ = conn_serve(stream, idle);
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
        if let Some(bytes) = stream_request(&line) {
            write_pattern(&mut stream, bytes)?;
        }
    }
}

/// The byte count of a `stream N` line (at most [`MAX_STREAM`]).
fn stream_request(line: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(line).ok()?.trim_end();
    let n: u64 = text.strip_prefix("stream ")?.parse().ok()?;
    (n <= MAX_STREAM).then_some(n)
}

/// Writes `bytes` bytes of the repeating `0123456789` pattern, byte `i` being
/// `b'0' + i % 10`, so the reader can check every byte.
fn write_pattern(stream: &mut TcpStream, bytes: u64) -> std::io::Result<()> {
    let chunk: Vec<u8> = (0..64 * 1024).map(|i| b'0' + (i % 10) as u8).collect();
    let mut left = bytes;
    while left > 0 {
        // 65,536 is not a multiple of 10: every chunk starts where the last one ended.
        let start = ((bytes - left) % 10) as usize;
        let n = left.min((chunk.len() - 10) as u64) as usize;
        stream.write_all(&chunk[start..start + n])?;
        left -= n as u64;
    }
    Ok(())
}

fn udp_loop(socket: UdpSocket, control: Arc<Control>) {
    let mut buf = [0u8; 2048];
    loop {
        match socket.recv_from(&mut buf) {
            Ok((_, peer)) => match control.current().udp {
                UdpAnswer::Reply(text) => {
                    let _ = socket.send_to(text.as_bytes(), peer);
                }
                UdpAnswer::Silent => {}
            },
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(err) => {
                eprintln!("lb-testserver {}: udp receive failed: {err}", control.name);
                return;
            }
        }
    }
}

/// One HTTP/1.1 exchange: reads the request head, answers as the control says, closes.
fn serve_http(
    mut stream: TcpStream,
    control: &Control,
    path: &str,
    idle: Duration,
) -> std::io::Result<()> {
    stream.set_read_timeout(Some(idle))?;
    stream.set_write_timeout(Some(idle))?;
    stream.set_nodelay(true)?;
    let Some(request) = read_request(&mut stream)? else {
        return Ok(()); // closed early, or a head that is too long
    };
    let behaviour = control.current();
    let on_path = request.target.split('?').next() == Some(path);
    let mut headers = vec![
        format!("X-Request-Method: {}", request.method),
        format!("X-Request-Body: {}", echo(&request.body)),
    ];
    match behaviour.http {
        _ if !on_path => respond(&mut stream, 404, "not found", &headers),
        HttpAnswer::Respond { status, body } => {
            headers.extend(behaviour.headers);
            respond(&mut stream, status, &body, &headers)
        }
        HttpAnswer::Hang => {
            // Never answer; return when the client gives up (or the idle timeout passes).
            let _ = std::io::copy(&mut (&stream).take(MAX_HANG_READ), &mut std::io::sink());
            Ok(())
        }
        HttpAnswer::Endless => {
            stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\
                  Transfer-Encoding: chunked\r\n\r\n",
            )?;
            let chunk = {
                let mut c = b"4000\r\n".to_vec();
                c.extend(std::iter::repeat_n(b'x', 0x4000));
                c.extend_from_slice(b"\r\n");
                c
            };
            let mut sent = 0u64;
            while sent < MAX_ENDLESS {
                stream.write_all(&chunk)?;
                sent += chunk.len() as u64;
            }
            Ok(())
        }
        HttpAnswer::Garbage => {
            stream.write_all(b"\x00\xff\x16\x03garbage, not HTTP\r\n\r\n")?;
            let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
            let mut block = [0u8; 4096];
            let mut sent = 0u64;
            while sent < MAX_ENDLESS {
                for b in block.iter_mut() {
                    // xorshift64: cheap bytes that are no protocol at all.
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    *b = state as u8;
                }
                stream.write_all(&block)?;
                sent += block.len() as u64;
            }
            Ok(())
        }
    }
}

/// The web service: `200 <name>\n` to every request; closes after the response unless
/// the request asked for keep-alive (then after [`WEB_KEEPALIVE_MAX`] requests).
fn serve_web(mut stream: TcpStream, name: &str, idle: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(idle))?;
    stream.set_write_timeout(Some(idle))?;
    stream.set_nodelay(true)?;
    let body = format!("{name}\n");
    let mut carry = Vec::new();
    for served in 1..=WEB_KEEPALIVE_MAX {
        let Some(head) = read_head(&mut stream, &mut carry)? else {
            return Ok(()); // the client closed (between requests: normal), or a head too long
        };
        let keep_alive = head.lines().skip(1).any(|l| {
            let l = l.to_ascii_lowercase();
            l.starts_with("connection:") && l.contains("keep-alive")
        }) && served < WEB_KEEPALIVE_MAX;
        let text = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
             Connection: {}\r\n\r\n{body}",
            body.len(),
            if keep_alive { "keep-alive" } else { "close" }
        );
        stream.write_all(text.as_bytes())?;
        if !keep_alive {
            break;
        }
    }
    // Dropping the stream closes it: the server sends the first FIN.
    Ok(())
}

/// Reads one request head from `stream`, starting with the bytes in `carry` and leaving
/// in it whatever followed the head (a pipelined request); `None` when the client closed
/// first or the head is longer than [`MAX_HEAD`].
fn read_head(stream: &mut TcpStream, carry: &mut Vec<u8>) -> std::io::Result<Option<String>> {
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = carry.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&carry[..end]).into_owned();
            carry.drain(..end + 4);
            return Ok(Some(head));
        }
        if carry.len() > MAX_HEAD {
            return Ok(None);
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(None);
        }
        carry.extend_from_slice(&buf[..n]);
    }
}

/// One request: its method, target and body.
struct Request {
    method: String,
    target: String,
    body: Vec<u8>,
}

/// Reads a request head (up to the empty line, at most [`MAX_HEAD`] bytes) and its body
/// (`Content-Length`, at most [`MAX_BODY`] bytes kept and read); `None` when the client
/// closed before the head ended or the head is too long.
fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<Request>> {
    let mut carry = Vec::new();
    let Some(head) = read_head(stream, &mut carry)? else {
        return Ok(None);
    };
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_owned();
    let target = first.next().unwrap_or("").to_owned();
    let length = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0)
        .min(MAX_BODY);
    let mut body = carry;
    let mut buf = [0u8; 1024];
    while body.len() < length {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
    }
    body.truncate(length);
    Ok(Some(Request {
        method,
        target,
        body,
    }))
}

/// The body as `X-Request-Body` shows it.
fn echo(body: &[u8]) -> String {
    if body.len() <= MAX_ECHO && body.iter().all(|b| (0x20..0x7f).contains(b)) {
        String::from_utf8_lossy(body).into_owned()
    } else {
        format!("<{} bytes>", body.len())
    }
}

fn respond(
    stream: &mut TcpStream,
    status: u16,
    body: &str,
    headers: &[String],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let text = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
         {extra}Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(text.as_bytes())?;
    stream.shutdown(std::net::Shutdown::Write)
}
