//! A shared read-write `mmap` of an mmapable BPF array (`BPF_F_MMAPABLE`), unmapped on
//! drop: how the agent writes the Maglev and VIP index tables without syscalls.

use std::{
    os::fd::{AsFd, AsRawFd},
    ptr,
};

use aya::maps::MapData;

use crate::dataplane::DataplaneError;

/// A shared read-write mapping of an mmapable BPF array, unmapped on drop.
pub(in crate::dataplane) struct Mapping {
    pub(in crate::dataplane) addr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is the process's, not a thread's: any thread may use it and
// unmap it on drop.
unsafe impl Send for Mapping {}
// SAFETY: a shared `Mapping` gives only its address and length; the memory is plain
// shared memory, written only through `&mut self` methods of the owner, and the
// generation words are accessed atomically.
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(in crate::dataplane) fn new(
        map: &MapData,
        bytes: usize,
        name: &'static str,
    ) -> Result<Self, DataplaneError> {
        let len = bytes.next_multiple_of(page_size());
        // SAFETY: mapping an mmapable BPF array of at least `bytes` bytes; the fd is
        // valid for the duration of the call and the mapping outlives it.
        let addr = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(DataplaneError::Io {
                what: name,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self { addr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the region mapped in `new`.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}
