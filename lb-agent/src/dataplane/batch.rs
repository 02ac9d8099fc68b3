//! The `BPF_MAP_LOOKUP_BATCH` call aya does not offer: many entries in one `bpf(2)` call
//! instead of one call each. [`PerCpuBatchReader`] reads the first entries of a per-CPU
//! array summed over CPUs (every backend's counters, twice a second).

use std::{
    io,
    mem::size_of,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use aya::maps::MapData;
use aya_obj::generated::{bpf_attr, bpf_cmd};

/// A duplicate of a per-CPU array map's descriptor, for batch reads.
#[derive(Debug)]
pub struct PerCpuBatchReader {
    fd: OwnedFd,
    cpus: usize,
}

impl PerCpuBatchReader {
    /// A reader of `map` (a per-CPU array).
    pub fn new(map: &MapData) -> io::Result<Self> {
        let fd = map.fd().as_fd().try_clone_to_owned()?;
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?.get() as usize;
        Ok(Self { fd, cpus })
    }

    /// Entries `0..count` (fewer if the map is smaller), each summed over CPUs; index =
    /// key.
    ///
    /// `V` must be the map's value type, a multiple of 8 bytes (the kernel strides
    /// per-CPU values by their size rounded up to 8).
    pub fn read_summed<V: Copy + Default + std::iter::Sum>(
        &self,
        count: u32,
    ) -> io::Result<Vec<V>> {
        assert!(
            size_of::<V>().is_multiple_of(8),
            "per-CPU values are 8-byte strided"
        );
        if count == 0 {
            return Ok(Vec::new());
        }
        let mut keys = vec![0u32; count as usize];
        let mut values = vec![V::default(); count as usize * self.cpus];
        let mut out_batch = 0u32;
        // SAFETY: bpf_attr is plain data; zero is a valid value of every field.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the `batch` member of the zeroed union. The pointers handed
        // to the kernel point at buffers that live across the call and hold `count`
        // keys and `count * cpus` values, as the kernel writes them.
        let filled = unsafe {
            attr.batch.in_batch = 0; // from the start
            attr.batch.out_batch = (&raw mut out_batch) as u64;
            attr.batch.keys = keys.as_mut_ptr() as u64;
            attr.batch.values = values.as_mut_ptr() as u64;
            attr.batch.count = count;
            attr.batch.map_fd = self.fd.as_raw_fd() as u32;
            let rc = libc::syscall(
                libc::SYS_bpf,
                bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_long,
                &raw mut attr,
                size_of::<bpf_attr>(),
            );
            // ENOENT: the map ended before `count`; `count` says how many were read.
            if rc < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT) {
                return Err(io::Error::last_os_error());
            }
            attr.batch.count as usize
        };
        let mut sums = vec![V::default(); filled];
        for (i, &key) in keys.iter().take(filled).enumerate() {
            if let Some(slot) = sums.get_mut(key as usize) {
                let per_cpu = &values[i * self.cpus..(i + 1) * self.cpus];
                *slot = per_cpu.iter().copied().sum();
            }
        }
        Ok(sums)
    }
}
