//! The flow and nat tables counted: how many ways hold a flow (or a nat source port)
//! that is still in use, and how many of them each backend holds. The tables are plain
//! arrays (75 MB and 54 MB at the floor of `agent.max_flows`), too large to read at every
//! scrape: a thread of its own reads them every few seconds in `BPF_MAP_LOOKUP_BATCH`
//! chunks, off the agent's task, and the snapshot shows the last count. The same reads
//! find, in cluster mode, the nat entries that carried traffic since a given time
//! ([`TableReader::nat_seen_since`]: the connections whose refreshes the other nodes need).

use std::{
    collections::HashMap,
    io,
    mem::size_of,
    os::fd::{AsFd, AsRawFd, OwnedFd},
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::maps::MapData;
use aya_obj::generated::{bpf_attr, bpf_cmd};
use lb_common::{
    maps::{FlowKey, NatValue, nat_reclaimable, nat_seconds},
    table::{FlowBucket, NatBucket, SLOT_LIVE, TABLE_WAYS, flow_reclaimable},
};

/// Buckets read per syscall (288 KB of `LB_FLOWS`, 416 KB of `LB_NAT`).
const CHUNK: u32 = 1024;

/// One count of both tables.
#[derive(Clone, Debug)]
pub struct TableCensus {
    /// Flows held: live ways neither idle nor failed (`flow_reclaimable`).
    pub flow_entries: u64,
    /// Ways of `LB_FLOWS`.
    pub flow_capacity: u64,
    /// nat entries whose source port is held (not `nat_reclaimable`).
    pub nat_entries: u64,
    /// Ways of `LB_NAT`.
    pub nat_capacity: u64,
    /// Held flows by backend id.
    pub flows_by_backend: HashMap<u32, u64>,
    /// Held nat entries by backend id (a nat flow whose connection closed drops out of
    /// it within seconds, as its port becomes reclaimable).
    pub nat_by_backend: HashMap<u32, u64>,
    /// How long the scan took.
    pub scan: Duration,
    /// When it ended.
    pub taken: Instant,
}

impl TableCensus {
    fn empty(flow_buckets: u32, nat_buckets: u32) -> Self {
        Self {
            flow_entries: 0,
            flow_capacity: u64::from(flow_buckets) * u64::from(TABLE_WAYS),
            nat_entries: 0,
            nat_capacity: u64::from(nat_buckets) * u64::from(TABLE_WAYS),
            flows_by_backend: HashMap::new(),
            nat_by_backend: HashMap::new(),
            scan: Duration::ZERO,
            taken: Instant::now(),
        }
    }
}

/// Descriptors of the two tables, for scans from any thread.
#[derive(Debug)]
pub struct TableReader {
    flows: OwnedFd,
    nat: OwnedFd,
    /// The buckets each was created with (`agent.max_flows`, docs/capacity.md).
    flow_buckets: u32,
    nat_buckets: u32,
}

impl TableReader {
    pub fn new(flows: &MapData, nat: &MapData) -> io::Result<Self> {
        let entries = |m: &MapData| {
            m.info()
                .map(|i| i.max_entries())
                .map_err(|e| io::Error::other(e.to_string()))
        };
        Ok(Self {
            flows: flows.fd().as_fd().try_clone_to_owned()?,
            nat: nat.fd().as_fd().try_clone_to_owned()?,
            flow_buckets: entries(flows)?,
            nat_buckets: entries(nat)?,
        })
    }

    /// Counts both tables now.
    pub fn scan(&self) -> io::Result<TableCensus> {
        let start = Instant::now();
        let now_ns = monotonic_ns();
        let mut c = TableCensus::empty(self.flow_buckets, self.nat_buckets);
        // Plain loops over the ways, only the word read for a free one: most are free,
        // and the debug build the tests run pays for every iterator adapter.
        read_chunks::<FlowBucket>(&self.flows, self.flow_buckets, |buckets| {
            for b in buckets {
                for slot in &b.ways {
                    if slot.word & SLOT_LIVE != 0 && !flow_reclaimable(&slot.value, now_ns) {
                        c.flow_entries += 1;
                        *c.flows_by_backend.entry(slot.value.backend_id).or_default() += 1;
                    }
                }
            }
        })?;
        let now = nat_seconds(now_ns);
        read_chunks::<NatBucket>(&self.nat, self.nat_buckets, |buckets| {
            for b in buckets {
                for slot in &b.ways {
                    if slot.word & SLOT_LIVE != 0
                        && !nat_reclaimable(&slot.value, slot.key.proto, now)
                    {
                        c.nat_entries += 1;
                        *c.nat_by_backend.entry(slot.value.backend_id).or_default() += 1;
                    }
                }
            }
        })?;
        c.scan = start.elapsed();
        c.taken = Instant::now();
        Ok(c)
    }
}

impl TableReader {
    /// The live `LB_NAT` entries whose `last_seen` is `since` or later (both in
    /// `nat_seconds`, [`nat_clock`]): the connections that carried a packet since then,
    /// with their reply 5-tuples.
    pub fn nat_seen_since(&self, since: u32) -> io::Result<Vec<(FlowKey, NatValue)>> {
        let mut out = Vec::new();
        read_chunks::<NatBucket>(&self.nat, self.nat_buckets, |buckets| {
            for b in buckets {
                for slot in &b.ways {
                    // Signed: `last_seen` wraps.
                    if slot.word & SLOT_LIVE != 0
                        && slot.value.last_seen.wrapping_sub(since) as i32 >= 0
                    {
                        out.push((slot.key, slot.value));
                    }
                }
            }
        })?;
        Ok(out)
    }
}

/// The data plane's nat clock now: `nat_seconds` of `CLOCK_MONOTONIC`, as `LB_NAT`'s
/// `last_seen` is stamped.
pub fn nat_clock() -> u32 {
    nat_seconds(monotonic_ns())
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock of the tables' timestamps.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the struct.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Reads entries `0..total` of the array map `fd` (values of type `V`), `CHUNK` at a
/// time, handing each chunk to `f` (also the flood scenario's reads of the running
/// agent's `LB_FLOWS`).
pub fn read_chunks<V: Copy + Default>(
    fd: &OwnedFd,
    total: u32,
    mut f: impl FnMut(&[V]),
) -> io::Result<()> {
    let mut keys = vec![0u32; CHUNK as usize];
    let mut values = vec![V::default(); CHUNK as usize];
    let mut next = 0u32;
    let mut read = 0u32;
    while read < total {
        let mut out_batch = 0u32;
        let mut in_batch = next;
        // SAFETY: bpf_attr is plain data; zero is a valid value of every field.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the `batch` member of the zeroed union; the buffers live
        // across the call and hold `CHUNK` keys and values, as the kernel writes them.
        let (rc, filled) = unsafe {
            attr.batch.in_batch = if read == 0 {
                0
            } else {
                (&raw mut in_batch) as u64
            };
            attr.batch.out_batch = (&raw mut out_batch) as u64;
            attr.batch.keys = keys.as_mut_ptr() as u64;
            attr.batch.values = values.as_mut_ptr() as u64;
            attr.batch.count = CHUNK;
            attr.batch.map_fd = fd.as_raw_fd() as u32;
            let rc = libc::syscall(
                libc::SYS_bpf,
                bpf_cmd::BPF_MAP_LOOKUP_BATCH as libc::c_long,
                &raw mut attr,
                size_of::<bpf_attr>(),
            );
            (rc, attr.batch.count)
        };
        let end = rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
        if rc < 0 && !end {
            return Err(io::Error::last_os_error());
        }
        f(&values[..filled as usize]);
        read += filled;
        next = out_batch;
        if end || filled == 0 {
            break;
        }
    }
    Ok(())
}

/// Scans the tables every `every` on a thread of its own; stops when dropped.
#[derive(Debug)]
pub struct CensusSampler {
    latest: Arc<Mutex<Option<Arc<TableCensus>>>>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl CensusSampler {
    pub fn start(reader: TableReader, every: Duration) -> io::Result<Self> {
        let latest = Arc::new(Mutex::new(None));
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = latest.clone();
        let thread = std::thread::Builder::new()
            .name("lb-table-census".into())
            .spawn(move || {
                loop {
                    match reader.scan() {
                        Ok(c) => *shared.lock().expect("census lock") = Some(Arc::new(c)),
                        Err(err) => tracing::warn!("counting the flow and nat tables: {err}"),
                    }
                    match stopped.recv_timeout(every) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        _ => return,
                    }
                }
            })?;
        Ok(Self {
            latest,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The last count, if one finished.
    pub fn latest(&self) -> Option<Arc<TableCensus>> {
        self.latest.lock().expect("census lock").clone()
    }
}

impl Drop for CensusSampler {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
