//! A loopback TCP port of the host forwarded to an address inside a namespace, so that
//! a browser on the host can open the agent's status page while `lb-demo` runs (the
//! API listens on the lb namespace's own loopback). Bounded: at most
//! [`MAX_CONNECTIONS`] at once, each ends when either side closes or after
//! [`MAX_AGE`]; everything stops on drop.

use std::{
    io,
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::{self, JoinHandle},
    time::Duration,
};

use crate::net::netns::NetNs;

/// Connections forwarded at once; more are closed when accepted.
pub const MAX_CONNECTIONS: usize = 32;
/// A forwarded connection is closed after this long (the agent closes idle ones
/// sooner, after its header timeout).
pub const MAX_AGE: Duration = Duration::from_secs(120);
/// How often the accept loop looks at its stop flag.
const TICK: Duration = Duration::from_millis(100);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A running forwarder; stops accepting on drop (open connections end by themselves).
pub struct Forward {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Forward {
    /// Listens on `listen` (port 0: any free port) and forwards each connection to
    /// `target` inside `ns`.
    pub fn start(listen: SocketAddr, ns: &NetNs, target: SocketAddr) -> io::Result<Forward> {
        let listener = TcpListener::bind(listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let ns = ns.clone();
        let flag = stop.clone();
        let thread = thread::Builder::new()
            .name("forward".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((client, _)) => admit(client, &ns, target, &open),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(TICK),
                        Err(_) => thread::sleep(TICK),
                    }
                }
            })?;
        Ok(Forward {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address actually listened on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn admit(client: TcpStream, ns: &NetNs, target: SocketAddr, open: &Arc<AtomicUsize>) {
    if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        open.fetch_sub(1, Ordering::SeqCst);
        return; // dropped: closed
    }
    let ns = ns.clone();
    let held = open.clone();
    let spawned = thread::Builder::new()
        .name("forward-conn".into())
        .spawn(move || {
            // The socket is made inside the namespace and stays there.
            if let Ok(Ok(upstream)) =
                ns.run(|| TcpStream::connect_timeout(&target, CONNECT_TIMEOUT))
            {
                relay(client, upstream);
            }
            held.fetch_sub(1, Ordering::SeqCst);
        });
    if spawned.is_err() {
        // The closure never ran (the client was dropped with it): give its slot back.
        open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Copies both ways until either side closes or [`MAX_AGE`] passes.
fn relay(client: TcpStream, upstream: TcpStream) {
    let _ = client.set_nonblocking(false);
    for s in [&client, &upstream] {
        let _ = s.set_read_timeout(Some(MAX_AGE));
    }
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let up = thread::spawn(move || pump(c2, u2));
    pump(upstream, client);
    let _ = up.join();
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    #[test]
    fn forwards_both_ways_inside_a_namespace() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root (namespaces)");
            return;
        }
        let ns = NetNs::create(&format!("{}-fwd", crate::net::names::unique_tag()))
            .expect("creating a namespace");
        let server = ns
            .run(|| TcpListener::bind("127.0.0.1:0"))
            .expect("entering")
            .expect("binding in the namespace");
        let target = server.local_addr().expect("address");
        let echo = thread::spawn(move || {
            let (mut s, _) = server.accept().expect("accepting");
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).expect("reading");
            s.write_all(&buf).expect("echoing");
        });
        let fwd = Forward::start("127.0.0.1:0".parse().unwrap(), &ns, target).expect("forward");
        let mut c = TcpStream::connect(fwd.addr()).expect("connecting to the forward");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"hello").expect("writing");
        let mut back = [0u8; 5];
        c.read_exact(&mut back).expect("reading the echo");
        assert_eq!(&back, b"hello");
        echo.join().expect("echo thread");
    }
}
