//! A program by id (`BPF_PROG_GET_FD_BY_ID`) with its name and map ids
//! (`BPF_OBJ_GET_INFO_BY_FD`). aya (0.14 to 0.16) reaches a program by id only through
//! `loaded_programs()`, which opens and queries every program on the host to find it.

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `bpf_attr` for `*_GET_FD_BY_ID`.
#[repr(C)]
struct GetFdById {
    id: u32,
    next_id: u32,
    open_flags: u32,
}

/// `bpf_attr` for `BPF_OBJ_GET_INFO_BY_FD`.
#[repr(C)]
struct GetInfo {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_prog_info` up to `name`; the kernel fills what fits.
#[repr(C)]
#[derive(Default)]
struct ProgInfoHead {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

/// What the kernel says about a loaded program.
#[derive(Clone, Debug)]
pub struct ProgInfo {
    pub name: String,
    pub map_ids: Vec<u32>,
}

pub(super) fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a properly laid out prefix of `union bpf_attr` for `cmd`; the
    // kernel reads at most `size_of::<T>()` bytes of it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// A new descriptor of program `id` (needs CAP_SYS_ADMIN).
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = GetFdById {
        id,
        next_id: 0,
        open_flags: 0,
    };
    let fd = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Id, name and map ids of the program behind `fd`.
pub fn prog_info(fd: BorrowedFd<'_>) -> io::Result<ProgInfo> {
    let mut head = ProgInfoHead::default();
    get_info(fd, &mut head)?;
    let mut map_ids = vec![0u32; head.nr_map_ids as usize];
    if !map_ids.is_empty() {
        let wanted = map_ids.len() as u32;
        head = ProgInfoHead {
            nr_map_ids: wanted,
            map_ids: map_ids.as_mut_ptr() as u64,
            ..Default::default()
        };
        get_info(fd, &mut head)?;
        map_ids.truncate(head.nr_map_ids.min(wanted) as usize);
    }
    let end = head.name.iter().position(|&b| b == 0).unwrap_or(16);
    Ok(ProgInfo {
        name: String::from_utf8_lossy(&head.name[..end]).into_owned(),
        map_ids,
    })
}

fn get_info(fd: BorrowedFd<'_>, head: &mut ProgInfoHead) -> io::Result<()> {
    let mut attr = GetInfo {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<ProgInfoHead>() as u32,
        info: (head as *mut ProgInfoHead) as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map(|_| ())
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;

/// `bpf_attr` for `BPF_MAP_LOOKUP_ELEM`.
#[repr(C)]
struct MapLookup {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The program id at `index` of the program array `map` (`None`: the entry is empty).
pub fn prog_array_entry(map: BorrowedFd<'_>, index: u32) -> io::Result<Option<u32>> {
    let mut id = 0u32;
    let mut attr = MapLookup {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: (&index as *const u32) as u64,
        value: (&mut id as *mut u32) as u64,
        flags: 0,
    };
    match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
        Ok(_) => Ok(Some(id)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}
