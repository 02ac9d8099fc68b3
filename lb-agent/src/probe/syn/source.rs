//! The source address of our SYNs to a target: the one the kernel's route picks, found
//! by connecting a UDP socket (no packet sent) and asking `getsockname`, cached per
//! target address for [`TTL`].

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a looked-up source address is reused (a route change is seen after this).
const TTL: Duration = Duration::from_secs(30);

#[derive(Default)]
pub(super) struct Cache {
    by_target: Mutex<HashMap<IpAddr, (IpAddr, Instant)>>,
}

impl Cache {
    /// The source address for `target`; an error is the route lookup's (no route…).
    pub(super) fn for_target(&self, target: SocketAddr) -> io::Result<IpAddr> {
        let now = Instant::now();
        {
            let cache = self.by_target.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(&(src, at)) = cache.get(&target.ip())
                && now.duration_since(at) < TTL
            {
                return Ok(src);
            }
        }
        let src = lookup(target)?;
        let mut cache = self.by_target.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() > 1 << 20 {
            cache.retain(|_, (_, at)| now.duration_since(*at) < TTL);
        }
        cache.insert(target.ip(), (src, now));
        Ok(src)
    }
}

fn lookup(target: SocketAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = match target {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = UdpSocket::bind(any)?;
    // The port does not matter for the route; 0 is refused by connect.
    sock.connect(SocketAddr::new(target.ip(), target.port().max(1)))?;
    Ok(sock.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_target_has_a_loopback_source() {
        let cache = Cache::default();
        let target: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert_eq!(cache.for_target(target).unwrap(), Ipv4Addr::LOCALHOST);
        assert_eq!(cache.for_target(target).unwrap(), Ipv4Addr::LOCALHOST);
    }
}
