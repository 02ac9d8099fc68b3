//! The `BPF_MAP_*_BATCH` calls aya does not offer: many entries in one `bpf(2)` call
//! instead of one call each. [`PerCpuBatchReader`] reads the first entries of a per-CPU
//! array summed over CPUs (every backend's counters, twice a second); [`update_all`] and
//! [`delete_all`] write and remove hash map entries (the peer tables, thousands of
//! replicas a second).

use std::{
    io,
    mem::size_of,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use aya::{
    Pod,
    maps::{HashMap, IterableMap, MapData},
};
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

/// What a batch write or removal left undone: the entries the kernel refused, and the
/// first refusal's error.
#[derive(Debug)]
pub struct Refused {
    pub count: usize,
    pub first: io::Error,
}

/// Writes `keys[i]` → `values[i]` (`BPF_ANY`) into `map` in `BPF_MAP_UPDATE_BATCH` calls.
/// An entry the kernel refuses (the map full) is skipped and the rest still written.
pub fn update_all<K: Pod, V: Pod>(
    map: &HashMap<MapData, K, V>,
    keys: &[K],
    values: &[V],
) -> Result<(), Refused> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let values = values.as_ptr() as u64;
    each_entry(keys.len(), None, |from| {
        // SAFETY: the map's key and value sizes are `K`'s and `V`'s (aya checked them
        // when it made `map`); `keys[from..]` and `values[from..]` hold as many entries
        // as the call names and live across it.
        unsafe {
            batch_call(
                bpf_cmd::BPF_MAP_UPDATE_BATCH,
                map.map(),
                keys[from..].as_ptr() as u64,
                values + (from * size_of::<V>()) as u64,
                (keys.len() - from) as u32,
            )
        }
    })
}

/// Removes `keys` from `map` in `BPF_MAP_DELETE_BATCH` calls; a key that is not there is
/// passed over.
pub fn delete_all<K: Pod, V: Pod>(map: &HashMap<MapData, K, V>, keys: &[K]) -> Result<(), Refused> {
    each_entry(keys.len(), Some(libc::ENOENT), |from| {
        // SAFETY: the map's key size is `K`'s (aya checked it when it made `map`);
        // `keys[from..]` holds as many keys as the call names and lives across it.
        unsafe {
            batch_call(
                bpf_cmd::BPF_MAP_DELETE_BATCH,
                map.map(),
                keys[from..].as_ptr() as u64,
                0,
                (keys.len() - from) as u32,
            )
        }
    })
}

/// Runs `call` from entry 0 on until every one of `len` entries was done or refused:
/// a batch call stops at the first entry the kernel refuses and says how many it did
/// before; that entry is counted (unless its error is `passed_over`) and skipped.
fn each_entry(
    len: usize,
    passed_over: Option<i32>,
    mut call: impl FnMut(usize) -> (usize, Option<io::Error>),
) -> Result<(), Refused> {
    let mut from = 0;
    let mut refused: Option<Refused> = None;
    while from < len {
        let (done, error) = call(from);
        from += done;
        let Some(error) = error else {
            // The kernel did them all.
            break;
        };
        from += 1;
        if error.raw_os_error().is_some() && error.raw_os_error() == passed_over {
            continue;
        }
        match &mut refused {
            Some(r) => r.count += 1,
            None => {
                refused = Some(Refused {
                    count: 1,
                    first: error,
                })
            }
        }
    }
    refused.map_or(Ok(()), Err)
}

/// One `BPF_MAP_*_BATCH` write call (`values` 0 for a removal): how many entries it did,
/// and the error that stopped it.
///
/// # Safety
/// `keys` (and `values`, when not 0) must point at `count` keys (values) of the map's
/// sizes, valid for reads across the call.
unsafe fn batch_call(
    cmd: bpf_cmd,
    map: &MapData,
    keys: u64,
    values: u64,
    count: u32,
) -> (usize, Option<io::Error>) {
    // SAFETY: bpf_attr is plain data; zero is a valid value of every field.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing and reading the `batch` member of the zeroed union; the kernel
    // reads `count` keys and values from the caller's buffers (this function's
    // contract) and writes back how many it did.
    unsafe {
        attr.batch.keys = keys;
        attr.batch.values = values;
        attr.batch.count = count;
        attr.batch.map_fd = map.fd().as_fd().as_raw_fd() as u32;
        let rc = libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            &raw mut attr,
            size_of::<bpf_attr>(),
        );
        let error = (rc < 0).then(io::Error::last_os_error);
        ((attr.batch.count as usize).min(count as usize), error)
    }
}
