//! `LB_SCHEMA` in the kernel: this build's map versions written into a small hash
//! map bound to the loaded programs (`BPF_PROG_BIND_MAP`), so the next agent finds it
//! among the attached program's map ids as it finds the maps themselves; and read back
//! from a previous program's copy (`lb_common::schema`, docs/upgrades.md).

use std::{
    collections::BTreeMap,
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    path::Path,
};

use lb_common::schema::{self, NAME_LEN};

use super::schema::Recorded;
use crate::dataplane::sys::bpf;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_PROG_BIND_MAP: libc::c_long = 35;
const BPF_MAP_TYPE_HASH: u32 = 1;
/// Room for every adopted map and the format entry, with spare for later builds.
const MAX_ENTRIES: u32 = 64;

/// `bpf_attr` for `BPF_MAP_CREATE`, up to `map_name`.
#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// `bpf_attr` for the element commands.
#[repr(C)]
struct MapElem {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `bpf_attr` for `BPF_PROG_BIND_MAP`.
#[repr(C)]
struct ProgBindMap {
    prog_fd: u32,
    map_fd: u32,
    flags: u32,
}

/// `bpf_attr` for `BPF_OBJ_PIN`.
#[repr(C)]
struct ObjPin {
    pathname: u64,
    bpf_fd: u32,
    file_flags: u32,
}

/// Creates `LB_SCHEMA` holding this build's versions (written once, at load).
pub fn create() -> io::Result<OwnedFd> {
    let mut name = [0u8; 16];
    name[..schema::META_MAP.len()].copy_from_slice(schema::META_MAP.as_bytes());
    let mut attr = MapCreate {
        map_type: BPF_MAP_TYPE_HASH,
        key_size: NAME_LEN as u32,
        value_size: 4,
        max_entries: MAX_ENTRIES,
        map_flags: 0,
        inner_map_fd: 0,
        numa_node: 0,
        map_name: name,
    };
    let fd = bpf(BPF_MAP_CREATE, &mut attr)?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    let map = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let entries = std::iter::once((schema::META_MAP, schema::META_FORMAT))
        .chain(schema::VERSIONS.iter().copied());
    for (name, version) in entries {
        let key = schema::key(name);
        let mut attr = MapElem {
            map_fd: map.as_raw_fd() as u32,
            _pad: 0,
            key: key.as_ptr() as u64,
            value: (&version as *const u32) as u64,
            flags: 0,
        };
        bpf(BPF_MAP_UPDATE_ELEM, &mut attr)?;
    }
    Ok(map)
}

/// Binds `map` to `prog`: the program holds it and lists it among its map ids.
pub fn bind(prog: BorrowedFd<'_>, map: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = ProgBindMap {
        prog_fd: prog.as_raw_fd() as u32,
        map_fd: map.as_raw_fd() as u32,
        flags: 0,
    };
    bpf(BPF_PROG_BIND_MAP, &mut attr).map(|_| ())
}

/// Pins `map` at `path` (`agent.pin_path`, next to the other maps), replacing a pin there.
pub fn pin(map: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    let mut attr = ObjPin {
        pathname: c.as_ptr() as u64,
        bpf_fd: map.as_raw_fd() as u32,
        file_flags: 0,
    };
    bpf(BPF_OBJ_PIN, &mut attr).map(|_| ())
}

/// The versions a previous program's `LB_SCHEMA` (`map`, of key size `key_size` and value
/// size `value_size`) records.
pub fn read(map: impl AsFd, key_size: u32, value_size: u32) -> Recorded {
    if key_size != NAME_LEN as u32 || value_size != 4 {
        return Recorded::Unreadable(format!(
            "key {key_size} B and value {value_size} B, not {NAME_LEN} B and 4 B"
        ));
    }
    match entries(map.as_fd()) {
        Err(e) => Recorded::Unreadable(format!("reading it failed: {e}")),
        Ok(mut all) => match all.remove(schema::META_MAP) {
            Some(schema::META_FORMAT) => Recorded::Versions(all),
            Some(other) => Recorded::Unreadable(format!(
                "format v{other}, this build reads v{}",
                schema::META_FORMAT
            )),
            None => Recorded::Unreadable("no format entry".into()),
        },
    }
}

/// Every `(name, version)` of a map shaped as `LB_SCHEMA`.
fn entries(map: BorrowedFd<'_>) -> io::Result<BTreeMap<String, u32>> {
    let mut out = BTreeMap::new();
    let mut key = [0u8; NAME_LEN];
    let mut first = true;
    for _ in 0..=MAX_ENTRIES {
        let mut next = [0u8; NAME_LEN];
        let mut attr = MapElem {
            map_fd: map.as_raw_fd() as u32,
            _pad: 0,
            key: if first { 0 } else { key.as_ptr() as u64 },
            value: next.as_mut_ptr() as u64,
            flags: 0,
        };
        match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
        }
        first = false;
        key = next;
        let mut version = 0u32;
        let mut attr = MapElem {
            map_fd: map.as_raw_fd() as u32,
            _pad: 0,
            key: key.as_ptr() as u64,
            value: (&mut version as *mut u32) as u64,
            flags: 0,
        };
        bpf(BPF_MAP_LOOKUP_ELEM, &mut attr)?;
        let end = key.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        out.insert(String::from_utf8_lossy(&key[..end]).into_owned(), version);
    }
    Err(io::Error::other(format!("more than {MAX_ENTRIES} entries")))
}

/// Records this build's versions for the next agent: `LB_SCHEMA` bound to each loaded
/// program of `names` in `ebpf`, and pinned in `pins` when pinning is on. A kernel that
/// cannot bind (before 5.10) only loses the record: the next agent then judges the maps
/// by layout, as for a build from before versions; the warning says so.
pub fn record(ebpf: &aya::Ebpf, names: &[&'static str], pins: Option<&super::pin::PinDir>) {
    let done = create().and_then(|map| {
        for &name in names {
            let prog: &aya::programs::Xdp = ebpf
                .program(name)
                .and_then(|p| p.try_into().ok())
                .ok_or_else(|| io::Error::other(format!("no XDP program `{name}`")))?;
            let fd = prog.fd().map_err(|e| io::Error::other(e.to_string()))?;
            bind(fd.as_fd(), map.as_fd())?;
        }
        if let Some(p) = pins {
            pin(map.as_fd(), &p.map(schema::META_MAP))?;
        }
        Ok(())
    });
    if let Err(error) = done {
        tracing::warn!(
            %error,
            "could not record the maps' schema versions ({}): the next agent judges these \
             maps by layout alone (BPF_PROG_BIND_MAP needs Linux 5.10)",
            schema::META_MAP
        );
    }
}
