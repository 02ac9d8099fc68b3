//! A counting `XDP_DROP` program for flood sinks: every IPv4 UDP frame to one port is
//! counted in a one-slot array map and dropped; anything else (neighbour discovery and
//! the like) passes. Assembled here from a dozen instructions and
//! loaded with the `bpf(2)` syscall (no object file); attached in native mode through
//! a BPF link, so closing it (drop) detaches it.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

use crate::{net::netns::NetNs, util::error::Error};

/// The program attached to one interface; detached and freed on drop.
#[derive(Debug)]
pub struct DropCounter {
    // Fields drop in order: the link (detaches), the program, the map.
    _link: OwnedFd,
    _prog: OwnedFd,
    map: OwnedFd,
    ifname: String,
}

impl DropCounter {
    /// Frames to the port dropped (and counted) so far.
    pub fn count(&self) -> Result<u64, Error> {
        let key: u32 = 0;
        let mut value: u64 = 0;
        let attr = MapElemAttr {
            map_fd: self.map.as_raw_fd() as u32,
            pad: 0,
            key: &key as *const u32 as u64,
            value: &mut value as *mut u64 as u64,
            flags: 0,
        };
        // SAFETY: attr points at live key and value buffers of the map's sizes.
        unsafe { bpf(BPF_MAP_LOOKUP_ELEM, &attr) }.map_err(|source| Error::Io {
            what: format!(
                "reading the counter for the counting XDP_DROP program on {}",
                self.ifname
            ),
            source,
        })?;
        Ok(value)
    }
}

/// Loads the program for UDP `port` and attaches it in native (driver) mode to
/// `ifname` in `ns`.
pub fn attach(ns: &NetNs, ifname: &str, port: u16) -> Result<DropCounter, Error> {
    let err = |what: &'static str| {
        let ifname = ifname.to_owned();
        move |source| Error::Io {
            what: format!("{what} for the counting XDP_DROP program on {ifname}"),
            source,
        }
    };
    let name = CString::new(ifname)
        .map_err(|_| err("interface name")(io::Error::from(io::ErrorKind::InvalidInput)))?;
    let map = create_map().map_err(err("creating the counter map"))?;
    let prog = load_prog(&map, port).map_err(err("loading the program"))?;
    // The interface index and the attachment resolve in the calling thread's namespace.
    let link = ns.run(|| -> Result<OwnedFd, Error> {
        // SAFETY: `name` is a CString, NUL-terminated and alive across the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(err("finding the interface")(io::Error::last_os_error()));
        }
        let attr = LinkCreateAttr {
            prog_fd: prog.as_raw_fd() as u32,
            target_ifindex: index,
            attach_type: BPF_XDP,
            flags: XDP_FLAGS_DRV_MODE,
        };
        // SAFETY: a plain attribute struct; the result is a new fd we own.
        let fd = unsafe { bpf(BPF_LINK_CREATE, &attr) }.map_err(err("attaching (native)"))?;
        // SAFETY: the kernel just returned this fd to us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })??;
    Ok(DropCounter {
        _link: link,
        _prog: prog,
        map,
        ifname: ifname.to_owned(),
    })
}

fn create_map() -> io::Result<OwnedFd> {
    let attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: 1,
        map_flags: 0,
    };
    // SAFETY: a plain attribute struct; the result is a new fd we own.
    let fd = unsafe { bpf(BPF_MAP_CREATE, &attr) }?;
    // SAFETY: the kernel just returned this fd to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn load_prog(map: &OwnedFd, port: u16) -> io::Result<OwnedFd> {
    let insns = program(map.as_raw_fd(), port);
    let license = c"GPL";
    let mut log = vec![0u8; 4096];
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        kern_version: 0,
        prog_flags: 0,
        prog_name: [0; 16],
        prog_ifindex: 0,
        expected_attach_type: BPF_XDP,
    };
    for (dst, src) in attr.prog_name.iter_mut().zip(b"lb_flood_sink") {
        *dst = *src;
    }
    // SAFETY: insns, license and log outlive the call; the result is a new fd we own.
    match unsafe { bpf(BPF_PROG_LOAD, &attr) } {
        // SAFETY: the kernel just returned this fd to us.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            Err(io::Error::new(e.kind(), format!("{e}; verifier: {text}")))
        }
    }
}

/// IPv4 UDP to `port` (with a 20-byte IP header): `counter[0] += 1` (atomically) and
/// `XDP_DROP`; anything else `XDP_PASS`.
fn program(map_fd: i32, port: u16) -> Vec<Insn> {
    // A 16-bit load of network-order bytes, as the program sees it.
    let be16 = |v: u16| i32::from(u16::from_ne_bytes(v.to_be_bytes()));
    vec![
        Insn::new(ALU64_MOV_X, 6, 1, 0, 0),        // 0: r6 = ctx
        Insn::new(LDX_MEM_W, 2, 6, 0, 0),          // 1: r2 = ctx->data
        Insn::new(LDX_MEM_W, 3, 6, 4, 0),          // 2: r3 = ctx->data_end
        Insn::new(ALU64_MOV_X, 4, 2, 0, 0),        // 3: r4 = r2
        Insn::new(ALU64_ADD_K, 4, 0, 0, 38),       // 4: r4 += 38 (through the UDP dport)
        Insn::new(JGT_X, 4, 3, 18, 0),             // 5: if r4 > r3 goto pass
        Insn::new(LDX_MEM_H, 4, 2, 12, 0),         // 6: r4 = ethertype
        Insn::new(JNE_K, 4, 0, 16, be16(0x0800)),  // 7: if not IPv4 goto pass
        Insn::new(LDX_MEM_B, 4, 2, 23, 0),         // 8: r4 = IP protocol
        Insn::new(JNE_K, 4, 0, 14, 17),            // 9: if not UDP goto pass
        Insn::new(LDX_MEM_H, 4, 2, 36, 0),         // 10: r4 = UDP dport
        Insn::new(JNE_K, 4, 0, 12, be16(port)),    // 11: if not port goto pass
        Insn::new(ALU64_MOV_K, 1, 0, 0, 0),        // 12: r1 = 0
        Insn::new(STX_MEM_W, 10, 1, -4, 0),        // 13: *(u32 *)(r10 - 4) = r1 (key)
        Insn::new(ALU64_MOV_X, 2, 10, 0, 0),       // 14: r2 = r10
        Insn::new(ALU64_ADD_K, 2, 0, 0, -4),       // 15: r2 += -4
        Insn::new(LD_IMM64, 1, 1, 0, map_fd),      // 16: r1 = map (BPF_PSEUDO_MAP_FD)
        Insn::new(0, 0, 0, 0, 0),                  // 17:   (second half of ld_imm64)
        Insn::new(CALL, 0, 0, 0, 1),               // 18: r0 = bpf_map_lookup_elem(r1, r2)
        Insn::new(JEQ_K, 0, 0, 2, 0),              // 19: if r0 == 0 goto 22
        Insn::new(ALU64_MOV_K, 1, 0, 0, 1),        // 20: r1 = 1
        Insn::new(STX_ATOMIC_DW, 0, 1, 0, 0),      // 21: lock *(u64 *)(r0 + 0) += r1
        Insn::new(ALU64_MOV_K, 0, 0, 0, XDP_DROP), // 22: r0 = XDP_DROP
        Insn::new(EXIT, 0, 0, 0, 0),               // 23: exit
        Insn::new(ALU64_MOV_K, 0, 0, 0, XDP_PASS), // 24: pass: r0 = XDP_PASS
        Insn::new(EXIT, 0, 0, 0, 0),               // 25: exit
    ]
}

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        Insn {
            code,
            regs: (src << 4) | dst,
            off,
            imm,
        }
    }
}

// Opcodes (linux/bpf.h, linux/bpf_common.h).
const ALU64_MOV_K: u8 = 0x07 | 0xb0;
const ALU64_MOV_X: u8 = 0x07 | 0xb0 | 0x08;
const ALU64_ADD_K: u8 = 0x07;
const STX_MEM_W: u8 = 0x03 | 0x60;
const STX_ATOMIC_DW: u8 = 0x03 | 0xc0 | 0x18;
const LDX_MEM_W: u8 = 0x01 | 0x60;
const LDX_MEM_H: u8 = 0x01 | 0x60 | 0x08;
const LDX_MEM_B: u8 = 0x01 | 0x60 | 0x10;
const LD_IMM64: u8 = 0x18;
const CALL: u8 = 0x85;
const JEQ_K: u8 = 0x15;
const JNE_K: u8 = 0x55;
const JGT_X: u8 = 0x2d;
const EXIT: u8 = 0x95;

// Commands, types and flags (linux/bpf.h, linux/if_link.h).
const BPF_MAP_CREATE: i32 = 0;
const BPF_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_PROG_LOAD: i32 = 5;
const BPF_LINK_CREATE: i32 = 28;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_DROP: i32 = 1;
const XDP_PASS: i32 = 2;

/// The leading fields of `union bpf_attr` for `BPF_MAP_CREATE`.
#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// For `BPF_MAP_LOOKUP_ELEM`.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// For `BPF_PROG_LOAD`, up to `expected_attach_type`.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// For `BPF_LINK_CREATE`.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// `bpf(cmd, attr, sizeof attr)`; the returned value (an fd for the creating commands).
///
/// # Safety
/// Every pointer inside `attr` must be valid for what `cmd` reads or writes.
unsafe fn bpf<T>(cmd: i32, attr: &T) -> io::Result<i32> {
    // SAFETY: per the caller; the kernel reads size_of::<T>() bytes of attr.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *const T,
            std::mem::size_of::<T>() as u32,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc as i32)
}
