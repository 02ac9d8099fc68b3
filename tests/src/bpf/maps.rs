//! Whole-map operations on a loaded XDP object, in a few syscalls each: putting its maps
//! back where a fresh load leaves them — every array entry zero, every hash map empty —
//! so that one verified load serves many fixtures; counting what differs from that
//! state, to check it; and reading a large array whole (`BPF_MAP_LOOKUP_BATCH`), as the
//! fixtures do to count live flows after every packet.
//!
//! Arrays are read whole with `BPF_MAP_LOOKUP_BATCH` and only their non-zero entries
//! written back as zero (`BPF_MAP_UPDATE_BATCH`); the mmapable ones (the Maglev and VIP
//! tables) are zeroed through a shared mapping; hash maps are emptied key by key. The
//! ring buffer and `LB_PROGRAMS` are left to [`crate::bpf::object::Lb`], which knows how to drain
//! and refill them. The object's read-only data (`.rodata`: the table layout set at
//! load) is never written.

use std::os::fd::{AsFd, AsRawFd};

use crate::util::error::Error;
use aya::{
    Ebpf,
    maps::{Map, MapData},
};

const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// Values written or read per syscall, at most (bytes).
const CHUNK_BYTES: usize = 4 << 20;

/// How a map is put back.
enum Kind {
    /// Arrays and per-CPU arrays: every value zero.
    Array { per_cpu: bool },
    /// Hash maps: no key.
    Hash,
    /// Left to the caller (ring buffer, program array) or read-only (`.rodata`).
    Skip,
}

fn kind(name: &str, map: &Map) -> Result<Kind, Error> {
    if name.starts_with(".rodata") {
        return Ok(Kind::Skip);
    }
    if name.starts_with('.') {
        // .data/.bss would need their initial image, which the object does not have today.
        return Err(Error::Unexpected(format!(
            "map {name}: a global data map, which a fixture object does not have and this cannot reset"
        )));
    }
    Ok(match map {
        Map::Array(_) => Kind::Array { per_cpu: false },
        Map::PerCpuArray(_) => Kind::Array { per_cpu: true },
        Map::HashMap(_) | Map::LruHashMap(_) => Kind::Hash,
        Map::RingBuf(_) | Map::ProgramArray(_) => Kind::Skip,
        _ => {
            return Err(Error::Unexpected(format!(
                "map {name}: a other map, which a fixture object does not have and this cannot reset"
            )));
        }
    })
}

fn data(map: &Map) -> &MapData {
    match map {
        Map::Array(d)
        | Map::PerCpuArray(d)
        | Map::HashMap(d)
        | Map::LruHashMap(d)
        | Map::RingBuf(d)
        | Map::ProgramArray(d) => d,
        _ => unreachable!("kind() refused it"),
    }
}

/// Geometry of one map as the kernel holds it.
struct Geometry {
    fd: i32,
    key_size: usize,
    /// Bytes of one value as the syscalls move it (per-CPU: all CPUs, 8-byte aligned).
    value_size: usize,
    entries: u32,
}

fn geometry(name: &str, map: &Map, per_cpu: bool) -> Result<Geometry, Error> {
    let d = data(map);
    let info = d.info().map_err(|source| Error::Bpf {
        what: format!("map {name}: reading its info"),
        source: Box::new(source),
    })?;
    let mut value_size = info.value_size() as usize;
    if per_cpu {
        let cpus = aya::util::nr_cpus().map_err(|(what, source)| Error::Io {
            what: format!("the number of possible CPUs: {what}"),
            source,
        })?;
        value_size = value_size.div_ceil(8) * 8 * cpus.get() as usize;
    }
    Ok(Geometry {
        fd: d.fd().as_fd().as_raw_fd(),
        key_size: info.key_size() as usize,
        value_size,
        entries: info.max_entries(),
    })
}

/// `bpf_attr` for the element commands.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// `bpf_attr` for the batch commands.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<()> {
    // SAFETY: `attr` is a `bpf_attr` prefix for `cmd` whose pointers point at live
    // buffers of the sizes the map's geometry gives; the kernel reads `size_of::<T>()`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Zeroes every array entry and empties every hash map of `ebpf` (see the module doc for
/// what is left to the caller).
pub fn reset_maps(ebpf: &Ebpf) -> Result<(), Error> {
    for (name, map) in ebpf.maps() {
        match kind(name, map)? {
            Kind::Array { per_cpu } => zero_array(name, &geometry(name, map, per_cpu)?, per_cpu)?,
            Kind::Hash => empty_hash(name, &geometry(name, map, false)?)?,
            Kind::Skip => {}
        }
    }
    Ok(())
}

fn zero_array(name: &str, g: &Geometry, per_cpu: bool) -> Result<(), Error> {
    if !per_cpu && zero_mapped(g) {
        return Ok(());
    }
    // Reading is a copy per chunk; writing is an update per entry: write only the
    // entries a fixture changed.
    let raw = read_raw(name, g)?;
    let dirty: Vec<u32> = raw
        .chunks_exact(g.value_size)
        .enumerate()
        .filter(|(_, v)| !all_zero(v))
        .map(|(i, _)| i as u32)
        .collect();
    let per_call = (CHUNK_BYTES / g.value_size).clamp(1, dirty.len().max(1));
    let zeros = vec![0u8; per_call * g.value_size];
    for keys in dirty.chunks(per_call) {
        let n = keys.len();
        let mut attr = BatchAttr {
            keys: keys.as_ptr() as u64,
            values: zeros.as_ptr() as u64,
            count: n as u32,
            map_fd: g.fd as u32,
            ..BatchAttr::default()
        };
        bpf(BPF_MAP_UPDATE_BATCH, &mut attr).map_err(|source| Error::Io {
            what: format!("map {name}: zeroing entries (BPF_MAP_UPDATE_BATCH)"),
            source,
        })?;
        if attr.count as usize != n {
            return Err(Error::Io {
                what: format!("map {name}: zeroing entries (BPF_MAP_UPDATE_BATCH wrote fewer)"),
                source: std::io::Error::other(format!("{} of {n}", attr.count)),
            });
        }
    }
    Ok(())
}

/// Whether every byte of `value` is zero: a comparison against a zero block (one
/// `memcmp` per block even in a debug build, where a byte-by-byte scan of the large
/// arrays was most of a fixture's reset).
fn all_zero(value: &[u8]) -> bool {
    const ZERO: [u8; 256] = [0; 256];
    value.chunks(ZERO.len()).all(|c| c == &ZERO[..c.len()])
}

/// Zeroes a `BPF_F_MMAPABLE` array through a shared mapping of its values (the large
/// Maglev and VIP tables: a write per page instead of a copy per entry). False when the
/// map cannot be mapped (not mmapable), for the caller to write it entry by entry.
fn zero_mapped(g: &Geometry) -> bool {
    let len = g.value_size.div_ceil(8) * 8 * g.entries as usize;
    if len == 0 {
        return true;
    }
    // SAFETY: a fresh shared mapping of the map's values, `len` bytes as the kernel lays
    // an array out (values 8-byte aligned), unmapped before returning.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            g.fd,
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        std::ptr::write_bytes(p.cast::<u8>(), 0, len);
        libc::munmap(p, len);
    }
    true
}

/// The first key of a hash map, if any.
fn first_key(name: &str, g: &Geometry) -> Result<Option<Vec<u8>>, Error> {
    let mut next = vec![0u8; g.key_size];
    let mut attr = ElemAttr {
        map_fd: g.fd as u32,
        key: 0,
        value: next.as_mut_ptr() as u64,
        ..ElemAttr::default()
    };
    match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
        Ok(()) => Ok(Some(next)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(source) => Err(Error::Io {
            what: format!("map {name}: listing keys (BPF_MAP_GET_NEXT_KEY)"),
            source,
        }),
    }
}

fn empty_hash(name: &str, g: &Geometry) -> Result<(), Error> {
    // Deleting the first key each time: bounded by the map's size (+1 to see it empty).
    for _ in 0..=g.entries {
        let Some(key) = first_key(name, g)? else {
            return Ok(());
        };
        let mut attr = ElemAttr {
            map_fd: g.fd as u32,
            key: key.as_ptr() as u64,
            ..ElemAttr::default()
        };
        match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(source) => {
                return Err(Error::Io {
                    what: format!("map {name}: deleting a key (BPF_MAP_DELETE_ELEM)"),
                    source,
                });
            }
        }
    }
    match first_key(name, g)? {
        None => Ok(()),
        Some(_) => Err(Error::Io {
            what: format!("map {name}: emptying"),
            source: std::io::Error::other("keys keep coming back"),
        }),
    }
}

/// Per map that [`reset_maps`] covers, how far it is from a fresh load: the number of
/// array entries that are not all zero, or of keys in a hash map. Sorted by name.
pub fn dirty_entries(ebpf: &Ebpf) -> Result<Vec<(String, u64)>, Error> {
    let mut out = Vec::new();
    for (name, map) in ebpf.maps() {
        let dirty = match kind(name, map)? {
            Kind::Array { per_cpu } => {
                let g = geometry(name, map, per_cpu)?;
                read_raw(name, &g)?
                    .chunks_exact(g.value_size)
                    .filter(|v| !all_zero(v))
                    .count() as u64
            }
            Kind::Hash => {
                let g = geometry(name, map, false)?;
                let mut n = 0u64;
                let mut key = first_key(name, &g)?;
                while let Some(k) = key {
                    n += 1;
                    let mut next = vec![0u8; g.key_size];
                    let mut attr = ElemAttr {
                        map_fd: g.fd as u32,
                        key: k.as_ptr() as u64,
                        value: next.as_mut_ptr() as u64,
                        ..ElemAttr::default()
                    };
                    key = match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
                        Ok(()) if n <= u64::from(g.entries) => Some(next),
                        Ok(()) => None,
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                        Err(source) => {
                            return Err(Error::Io {
                                what: format!("map {name}: listing keys (BPF_MAP_GET_NEXT_KEY)"),
                                source,
                            });
                        }
                    };
                }
                n
            }
            Kind::Skip => continue,
        };
        out.push((name.to_owned(), dirty));
    }
    out.sort();
    Ok(out)
}

/// Every value of the array `map` (not per-CPU), in index order, read in chunks with
/// `BPF_MAP_LOOKUP_BATCH`.
pub fn read_array<T: aya::Pod>(name: &str, map: &MapData) -> Result<Vec<T>, Error> {
    let info = map.info().map_err(|source| Error::Bpf {
        what: format!("map {name}: reading its info"),
        source: Box::new(source),
    })?;
    assert_eq!(
        info.value_size() as usize,
        size_of::<T>(),
        "{name}: value size"
    );
    let g = Geometry {
        fd: map.fd().as_fd().as_raw_fd(),
        key_size: 4,
        value_size: size_of::<T>(),
        entries: info.max_entries(),
    };
    let raw = read_raw(name, &g)?;
    Ok(raw
        .chunks_exact(g.value_size)
        // SAFETY: `T` is plain data of exactly this size; read unaligned from the bytes.
        .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<T>()) })
        .collect())
}

/// Every value of an array (`value_size` bytes each, as [`geometry`] gives), in index
/// order, read in chunks with `BPF_MAP_LOOKUP_BATCH`.
fn read_raw(name: &str, g: &Geometry) -> Result<Vec<u8>, Error> {
    let entries = g.entries as usize;
    let per_call = (CHUNK_BYTES / g.value_size.max(1)).clamp(1, entries.max(1));
    let mut out = vec![0u8; entries * g.value_size];
    let mut keys = vec![0u32; per_call];
    let mut token = 0u32;
    let mut read = 0usize;
    while read < entries {
        let want = per_call.min(entries - read);
        let mut attr = BatchAttr {
            in_batch: if read == 0 {
                0
            } else {
                &token as *const u32 as u64
            },
            out_batch: &mut token as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: out[read * g.value_size..].as_mut_ptr() as u64,
            count: want as u32,
            map_fd: g.fd as u32,
            ..BatchAttr::default()
        };
        let done = match bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) {
            Ok(()) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(source) => {
                return Err(Error::Io {
                    what: format!("map {name}: reading entries (BPF_MAP_LOOKUP_BATCH)"),
                    source,
                });
            }
        };
        read += (attr.count as usize).min(want);
        if done || attr.count == 0 {
            break;
        }
    }
    if read != entries {
        return Err(Error::Io {
            what: format!("map {name}: reading entries (BPF_MAP_LOOKUP_BATCH read fewer)"),
            source: std::io::Error::other(format!("{read} of {entries}")),
        });
    }
    Ok(out)
}
