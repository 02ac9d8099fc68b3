//! The few ethtool queries the doctor needs (`SIOCETHTOOL`): the driver's name, LRO
//! (`ETHTOOL_GFLAGS`), GRO (`ETHTOOL_GGRO`) and TX checksum offload (`ETHTOOL_GTXCSUM`).

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_GFLAGS: u32 = 0x25;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETH_FLAG_LRO: u32 = 1 << 15;

/// `struct ifreq` with `ifr_data`.
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

/// `struct ethtool_drvinfo`.
#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// `struct ethtool_value`.
#[repr(C)]
struct Value {
    cmd: u32,
    data: u32,
}

fn ioctl<T>(interface: &str, data: &mut T) -> io::Result<()> {
    // SAFETY: a plain datagram socket, owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: (data as *mut T).cast(),
        _pad: [0; 16],
    };
    if interface.len() >= libc::IFNAMSIZ {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for (d, s) in req.name.iter_mut().zip(interface.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCETHTOOL reads the name and writes through `data`, which points to a
    // struct of the layout its command expects, alive for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The driver's name as `ethtool -i` shows it.
pub fn driver(interface: &str) -> io::Result<String> {
    // SAFETY: all-zero is a valid `DrvInfo`.
    let mut info: DrvInfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    ioctl(interface, &mut info)?;
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
}

fn value(interface: &str, cmd: u32) -> io::Result<u32> {
    let mut v = Value { cmd, data: 0 };
    ioctl(interface, &mut v)?;
    Ok(v.data)
}

/// Whether large receive offload is on.
pub fn lro(interface: &str) -> io::Result<bool> {
    value(interface, ETHTOOL_GFLAGS).map(|f| f & ETH_FLAG_LRO != 0)
}

/// Whether generic receive offload is on.
pub fn gro(interface: &str) -> io::Result<bool> {
    value(interface, ETHTOOL_GGRO).map(|v| v != 0)
}

/// Whether TX checksum offload is on (`ethtool -k IF`'s `tx-checksumming`).
pub fn tx_checksum(interface: &str) -> io::Result<bool> {
    value(interface, ETHTOOL_GTXCSUM).map(|v| v != 0)
}
