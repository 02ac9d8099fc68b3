//! Bridges and veth pairs as RAII guards, plus the link settings the harness needs
//! (MAC addresses, TX checksum offload, threaded NAPI).

use std::{fmt, os::fd::AsRawFd};

use crate::{net::netns::NetNs, util::error::Error};

/// Longest interface name Linux accepts (`IFNAMSIZ` − 1).
pub const MAX_IFNAME: usize = 15;

/// A MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// An interface the harness created, deleted (`ip link del`) on drop. Deleting one end
/// of a veth pair deletes both.
#[derive(Debug)]
pub struct Link {
    ns: NetNs,
    name: String,
}

impl Link {
    /// The interface name inside its namespace.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace the interface lives in.
    pub fn netns(&self) -> &NetNs {
        &self.ns
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Fails harmlessly when the peer's namespace is already gone (the pair went with it).
        let _ = self.ns.ip(&["link", "del", &self.name]);
    }
}

/// Creates bridge `name` in `ns` and sets it up. STP stays off, so ports forward at once.
pub fn bridge(ns: &NetNs, name: &str) -> Result<Link, Error> {
    check_name(name)?;
    ns.ip(&["link", "add", name, "type", "bridge"])?;
    let link = Link {
        ns: ns.clone(),
        name: name.to_owned(),
    };
    ns.ip(&["link", "set", name, "up"])?;
    Ok(link)
}

/// One end of a veth pair: where it lives, its name and MAC address.
#[derive(Clone, Debug)]
pub struct VethEnd<'a> {
    pub ns: &'a NetNs,
    pub name: &'a str,
    pub mac: Mac,
}

/// Creates a veth pair with `a` in `a.ns` and `b` in `b.ns` (never in the caller's
/// namespace, so names only need to be unique inside those two). The guard owns end `a`.
/// Both ends are left down.
pub fn veth_pair(a: VethEnd<'_>, b: VethEnd<'_>) -> Result<Link, Error> {
    veth_pair_with_queues(a, b, 1)
}

/// [`veth_pair`] with `queues` receive and transmit queues on each end (`numrxqueues`,
/// `numtxqueues`): each receive queue has a NAPI instance of its own, so native XDP on
/// the end runs on whichever CPU sent into that queue, on several CPUs at once.
pub fn veth_pair_with_queues(a: VethEnd<'_>, b: VethEnd<'_>, queues: u32) -> Result<Link, Error> {
    check_name(a.name)?;
    check_name(b.name)?;
    let (mac_a, mac_b) = (a.mac.to_string(), b.mac.to_string());
    let count = queues.to_string();
    // One queue is veth's default: the command then names no queues.
    let per_end: &[&str] = if queues == 1 {
        &[]
    } else {
        &["numrxqueues", &count, "numtxqueues", &count]
    };
    let mut args = vec!["link", "add", a.name, "address", &mac_a];
    args.extend_from_slice(per_end);
    args.extend(["type", "veth", "peer", "name", b.name, "address", &mac_b]);
    args.extend_from_slice(per_end);
    args.extend(["netns", b.ns.name()]);
    a.ns.ip(&args)?;
    Ok(Link {
        ns: a.ns.clone(),
        name: a.name.to_owned(),
    })
}

/// Gives `ifname` in `ns` the MAC `mac`, as a NIC swap or a migrated VM does; the kernel
/// announces it only where `arp_notify` (IPv4) or `ndisc_notify` (IPv6) is on.
pub fn set_mac(ns: &NetNs, ifname: &str, mac: Mac) -> Result<(), Error> {
    ns.ip(&["link", "set", "dev", ifname, "address", &mac.to_string()])
        .map(|_| ())
}

/// What a bed leaves of veth's offloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offloads {
    /// Every host sends full checksums ([`set_tx_checksum`] off, which takes TSO with
    /// it): the balancer only ever sees wire-sized frames with complete checksums.
    FullChecksums,
    /// Hosts with NICs: the client, the lb and the backends keep veth's defaults (TX
    /// checksum offload, TSO, GSO) and the lb's interface has GRO on, as a NIC's driver;
    /// the switch's ports (and a router) are the wire, which carries no super-packet and
    /// no partial checksum: they send full checksums, so the bridge segments and
    /// checksums every TSO packet before it reaches another host.
    HostDefaults,
    /// [`Offloads::HostDefaults`], but the switch's ports keep veth's defaults too: the
    /// lb's interface is a veth whose peer hands over what senders on the same host
    /// built, whole (TSO packets of up to 64 KiB, partial checksums), as on a container
    /// host.
    VethPeers,
}

/// Gives a host's `ifname` in `ns` the offloads of `offloads`: full checksums, or veth's
/// defaults with GRO on where `gro` (the lb's interface, as a NIC's driver has it).
pub fn set_host_offloads(
    ns: &NetNs,
    ifname: &str,
    offloads: Offloads,
    gro: bool,
) -> Result<(), Error> {
    match offloads {
        Offloads::FullChecksums => set_tx_checksum(ns, ifname, false),
        Offloads::HostDefaults | Offloads::VethPeers if gro => set_gro(ns, ifname, true),
        Offloads::HostDefaults | Offloads::VethPeers => Ok(()),
    }
}

/// Turns TX checksum offload of `ifname` in `ns` on or off (`ethtool -K IF tx on|off`).
///
/// A veth that sends with offload hands the peer packets whose checksum field holds only
/// the pseudo-header sum; once an XDP program turns such a packet into an `XDP_TX`
/// frame that promise is lost and the receiver drops it as corrupt. Hosts that send
/// through the balancer therefore send full checksums, as a NIC would deliver them.
pub fn set_tx_checksum(ns: &NetNs, ifname: &str, on: bool) -> Result<(), Error> {
    ethtool_set(ns, ifname, ETHTOOL_STXCSUM, u32::from(on))
}

/// Turns TCP segmentation offload of `ifname` in `ns` on or off (`ethtool -K IF tso …`).
/// A veth hands TSO-capable senders' packets to its peer's NAPI only with TSO off.
pub fn set_tso(ns: &NetNs, ifname: &str, on: bool) -> Result<(), Error> {
    ethtool_set(ns, ifname, ETHTOOL_STSO, u32::from(on))
}

/// Turns generic receive offload of `ifname` in `ns` on or off (`ethtool -K IF gro …`).
/// A veth with GRO on receives through NAPI and merges what arrives, as a NIC's driver.
pub fn set_gro(ns: &NetNs, ifname: &str, on: bool) -> Result<(), Error> {
    ethtool_set(ns, ifname, ETHTOOL_SGRO, u32::from(on))
}

fn ethtool_set(ns: &NetNs, ifname: &str, cmd: u32, data: u32) -> Result<(), Error> {
    check_name(ifname)?;
    let result = ns.run(|| ethtool_set_value(ifname, cmd, data))?;
    result.map_err(Error::io(format!(
        "ethtool ioctl on {ifname} in network namespace {}",
        ns.name()
    )))
}

/// Gives `ifname` in `ns` its own NAPI kernel thread: GRO on (which makes a veth
/// receive through NAPI) and `threaded` on. What arrives on it is then processed by
/// `napi/IFNAME-…`, not in the softirq of whoever sent it, as on a host whose NIC
/// interrupts another CPU: a benchmark's sender is then not billed for the receiver's
/// TCP work. The link must be up (a veth has NAPI instances only then), and the peer
/// must send without TSO ([`set_tso`]): a veth passes TSO senders' packets around NAPI.
pub fn set_threaded_napi(ns: &NetNs, ifname: &str) -> Result<(), Error> {
    set_gro(ns, ifname, true)?;
    // sysfs shows the devices of the namespace it was mounted in: `ip netns exec`
    // mounts the namespace's own.
    let sysfs = format!("/sys/class/net/{ifname}/threaded");
    crate::util::cmd::run(
        "ip",
        &[
            "netns",
            "exec",
            ns.name(),
            "sh",
            "-c",
            &format!("echo 1 > {sysfs}"),
        ],
    )
    .map_err(|e| e.context(format!("in network namespace {}", ns.name())))?;
    Ok(())
}

/// `ETHTOOL_STXCSUM` from `linux/ethtool.h`.
const ETHTOOL_STXCSUM: u32 = 0x17;
/// `ETHTOOL_STSO` from `linux/ethtool.h`.
const ETHTOOL_STSO: u32 = 0x1f;
/// `ETHTOOL_SGRO` from `linux/ethtool.h`.
const ETHTOOL_SGRO: u32 = 0x2c;
/// `SIOCETHTOOL` from `linux/sockios.h`.
const SIOCETHTOOL: libc::c_ulong = 0x8946;

/// `struct ethtool_value` from `linux/ethtool.h`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

fn ethtool_set_value(ifname: &str, cmd: u32, data: u32) -> std::io::Result<()> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
    let mut value = EthtoolValue { cmd, data };
    // SAFETY: a zeroed ifreq is valid; the name fits (checked by the caller, NUL kept) and
    // `ifru_data` points at `value`, which outlives the ioctl.
    let rc = unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
            *dst = src as libc::c_char;
        }
        req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut req)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), Error> {
    if name.len() > MAX_IFNAME || name.is_empty() {
        return Err(Error::Unexpected(format!(
            "interface name {name:?} is longer than {MAX_IFNAME} bytes"
        )));
    }
    Ok(())
}
