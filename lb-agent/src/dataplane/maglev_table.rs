//! Atomic Maglev table publication: a fresh inner map per table, filled through `mmap`,
//! then swapped into `LB_MAGLEV` (an array of maps) with one update.
//!
//! The kernel swaps the inner-map pointer under RCU, so a packet sees either the old
//! table or the new one, never a mix; the old map is freed once no program uses it.
//! Filling 65537 slots through `mmap` is one `memcpy` instead of 65537 syscalls.

use std::{os::fd::AsRawFd, ptr};

use aya::maps::{ArrayOfMaps, MapData};
use lb_common::{BPF_F_MMAPABLE, MAGLEV_RING_SIZE, map_names};

use super::DataplaneError;

const BPF_MAP_TYPE_ARRAY: u32 = 2;

/// Builds an inner map holding `table` and swaps it in at `service_id`.
pub(super) fn publish(
    outer: &mut ArrayOfMaps<MapData, MapData>,
    service_id: u32,
    table: &[u32],
) -> Result<(), DataplaneError> {
    if table.len() != MAGLEV_RING_SIZE as usize {
        return Err(DataplaneError::TableSize {
            service_id,
            len: table.len(),
            expected: MAGLEV_RING_SIZE,
        });
    }
    let inner = create_filled(table)?;
    outer
        .set(service_id, &inner, 0)
        .map_err(|source| DataplaneError::Map {
            name: map_names::MAGLEV,
            source,
        })
    // `inner` drops here: the outer map keeps the only reference.
}

fn create_filled(table: &[u32]) -> Result<MapData, DataplaneError> {
    let def =
        aya_obj::Map::new_from_params(BPF_MAP_TYPE_ARRAY, 4, 4, MAGLEV_RING_SIZE, BPF_F_MMAPABLE);
    let inner =
        MapData::create(def, "lb_maglev_in", None).map_err(|source| DataplaneError::Map {
            name: "maglev inner table",
            source,
        })?;
    let bytes = std::mem::size_of_val(table);
    let len = bytes.next_multiple_of(page_size());
    let fd = inner.fd().as_fd_raw();
    // SAFETY: mapping a BPF_F_MMAPABLE array of `bytes` bytes (rounded to pages) that we
    // own; the mapping is written once below and unmapped before returning.
    let addr = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(DataplaneError::Io {
            what: "mmap of a Maglev inner table",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `addr` points to at least `bytes` writable bytes; the regions don't overlap.
    unsafe {
        ptr::copy_nonoverlapping(table.as_ptr(), addr.cast::<u32>(), table.len());
        libc::munmap(addr, len);
    }
    Ok(inner)
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

trait AsFdRaw {
    fn as_fd_raw(&self) -> i32;
}

impl AsFdRaw for aya::maps::MapFd {
    fn as_fd_raw(&self) -> i32 {
        use std::os::fd::AsFd;
        self.as_fd().as_raw_fd()
    }
}
