//! The hardware (MAC) address and the MTU of a network interface, read with
//! `SIOCGIFHWADDR` / `SIOCGIFMTU` in the calling thread's network namespace (the one the
//! XDP program is attached in).

use std::io;

/// `ARPHRD_ETHER`: the hardware type of an Ethernet interface.
const ARPHRD_ETHER: u16 = 1;

/// The MAC of `interface`; all zero when it is not an Ethernet interface (no MAC to
/// check frames against). `ENODEV` when there is no such interface.
pub fn of(interface: &str) -> io::Result<[u8; 6]> {
    let req = interface_request(interface, libc::SIOCGIFHWADDR)?;
    // SAFETY: SIOCGIFHWADDR succeeded, so the union holds `ifru_hwaddr`.
    let addr = unsafe { req.ifr_ifru.ifru_hwaddr };
    if addr.sa_family != ARPHRD_ETHER {
        return Ok([0; 6]);
    }
    let mut mac = [0u8; 6];
    for (dst, &src) in mac.iter_mut().zip(&addr.sa_data) {
        *dst = src as u8;
    }
    Ok(mac)
}

/// The MTU of `interface` (`SIOCGIFMTU`, in the calling thread's network namespace, as
/// the MAC is read: `/sys/class/net` shows the namespace that mounted `/sys`).
pub fn mtu(interface: &str) -> io::Result<u32> {
    let req = interface_request(interface, libc::SIOCGIFMTU)?;
    // SAFETY: SIOCGIFMTU succeeded, so the union holds `ifru_mtu`.
    Ok(unsafe { req.ifr_ifru.ifru_mtu }.max(0) as u32)
}

/// One `SIOCGIF*` `request` about `interface` on a throwaway socket: the filled
/// `ifreq`. `ENODEV` for a name that cannot be an interface's.
fn interface_request(interface: &str, request: libc::c_ulong) -> io::Result<libc::ifreq> {
    let name = interface.as_bytes();
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() >= req.ifr_name.len() || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::ENODEV));
    }
    for (dst, &src) in req.ifr_name.iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    // SAFETY: plain socket(2); the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a SIOCGIF* request reads the name and fills the union of our ifreq.
    let rc = unsafe { libc::ioctl(fd, request, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: our descriptor, closed once.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err);
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_has_no_ethernet_mac_and_unknown_names_fail() {
        assert_eq!(of("lo").expect("lo exists"), [0; 6]);
        let err = of("no-such-if0").expect_err("no such interface");
        assert_eq!(err.raw_os_error(), Some(libc::ENODEV));
        assert!(of("").is_err());
        assert!(of("a-name-longer-than-ifnamsiz").is_err());
    }

    #[test]
    fn the_mtu_is_read_from_the_interface() {
        assert_eq!(mtu("lo").expect("lo exists"), 65536);
        let err = mtu("no-such-if0").expect_err("no such interface");
        assert_eq!(err.raw_os_error(), Some(libc::ENODEV));
    }
}
