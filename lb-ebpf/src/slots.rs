//! The set-associative tables in `ARRAY` maps (`lb_common::table`: `LB_FLOWS`, `LB_NAT`): a
//! lookup hashes the key, reads the bucket's ways (inlined array reads, no call into
//! the kernel's hash table) and compares keys; writers take the bucket with a
//! compare-and-swap on way 0's word and publish a slot by its word.
//!
//! Protocol (the argument in full: docs/internals/fast-path.md, "The nat table"):
//! - a writer holds the bucket lock (`SLOT_LOCK` in way 0's word, taken by
//!   `BPF_CMPXCHG`; never waited for: a busy bucket is reported, the caller moves on);
//! - it rewrites a slot by swapping its word to "not live, generation + 1", writing key
//!   and value, then swapping the word to "live" (both `BPF_XCHG`, fully ordered);
//! - a reader reads the word (live?), compares the key, and reads the word again: a
//!   different word means the slot changed under it and is skipped. Values are then
//!   read and updated field by field in place.

use core::{
    intrinsics::{AtomicOrdering::SeqCst, atomic_and, atomic_xchg},
    ptr::{addr_of, addr_of_mut, read_volatile},
};

use lb_common::{
    maps::FlowKey,
    table::{
        Bucket, PENDING_WAYS_MAX, SLOT_LIVE, SLOT_LOCK, SLOT_TAG_SHIFT, Slot, TABLE_WAYS,
        free_word, live_word, second_choice,
    },
};

/// A table: its map and its hash.
pub trait Table {
    type Value: Copy + 'static;
    /// `key`'s hash: the bucket is taken from it, and it is the slot's tag.
    fn hash(key: &FlowKey) -> u32;
    /// The index of the bucket of hash `hash`.
    fn index(hash: u32) -> u32;
    /// Bucket `index` (one inlined array lookup).
    fn at(index: u32) -> Option<*mut Bucket<Self::Value>>;
}

// [`claim_admitted`]'s ranks of the ways it may take when none is free: a way
// `reusable` lets go (the first), else an unconfirmed entry's (the oldest), else a
// confirmed entry's idle at least `limit` (idle longest; age + 1, so 0 is none).
const RANK_REUSABLE: u64 = 3 << 62;
const RANK_PENDING: u64 = 2 << 62;
/// Ages kept below the class bits (36 years of nanoseconds).
const RANK_AGE: u64 = (1 << 60) - 1;

/// [`find`]'s answer when the key is absent.
pub const NOT_FOUND: u64 = u64::MAX;

/// Whether the slot key at `a` equals the key at `b`, word by word behind the tag
/// check (raw pointers: LLVM may not load the probe key ahead of it).
#[inline(always)]
fn same_key(a: *const FlowKey, b: *const FlowKey) -> bool {
    let (a, b) = (a.cast::<u32>(), b.cast::<u32>());
    let mut i = 0;
    while i < 10 {
        // SAFETY: `i < 10`: a word of a whole, 4-byte aligned 40-byte key (padding
        // included: it is zero in every key the program builds and stores).
        if unsafe { a.add(i).read() != b.add(i).read() } {
            return false;
        }
        i += 1;
    }
    true
}

/// The key of slot `s`.
#[inline(always)]
fn key_of<V>(s: *mut Slot<V>) -> *const FlowKey {
    // SAFETY: a field address of a map value, not a read.
    unsafe { addr_of!((*s).key) }
}

/// Whether a slot word is live and tagged `hash`.
#[inline(always)]
fn live_tagged(w: u64, hash: u32) -> bool {
    w & SLOT_LIVE != 0 && (w >> SLOT_TAG_SHIFT) as u32 == hash
}

/// Way `w` of bucket `b`.
#[inline(always)]
fn way<V>(b: *mut Bucket<V>, w: u32) -> *mut Slot<V> {
    // SAFETY: `w < TABLE_WAYS` at every caller: a field of the same map value.
    unsafe { addr_of_mut!((*b).ways[w as usize]) }
}

/// What [`claim`] did.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Claim {
    /// The key was absent and now holds the value (a free way, or one whose entry
    /// `reusable` let go).
    Fresh,
    /// The key was present, `reusable` let its entry go, and it now holds the value.
    Replaced,
    /// The key is present (and was not replaced).
    Taken,
    /// Every way holds a live entry of another key that `reusable` keeps.
    Full,
    /// Another writer holds the bucket.
    Busy,
    /// Every way held a live entry of another key that `reusable` keeps, and (the
    /// caller allowed eviction) the one `age` called oldest now holds the value.
    Evicted,
    /// An unconfirmed entry (`claim_admitted`'s `pending`) gave its way to the value.
    Displaced,
}

impl Claim {
    /// As a number (the result of a BPF global function is a scalar).
    #[inline(always)]
    pub fn code(self) -> u64 {
        self as u64
    }

    /// Back from [`Claim::code`] (anything unknown is `Busy`: nothing was done).
    #[inline(always)]
    pub fn from_code(code: u64) -> Self {
        match code {
            0 => Claim::Fresh,
            1 => Claim::Replaced,
            2 => Claim::Taken,
            3 => Claim::Full,
            5 => Claim::Evicted,
            6 => Claim::Displaced,
            _ => Claim::Busy,
        }
    }
}

// The target has no 64-bit atomic read-modify-write in `core::sync::atomic` (its spec
// leaves them out), so the intrinsics (and, for compare-and-swap, assembly) are used
// directly: LLVM's BPF backend emits 64-bit `BPF_ATOMIC` `BPF_CMPXCHG`, `BPF_XCHG` and
// `BPF_AND` without any CPU feature (`alu32` is only needed for 32-bit ones), and the
// kernel's JITs make them fully ordered. SAFETY for all three: `word` is the first, 8-byte aligned
// field of a map value that lives as long as the program.

/// `BPF_CMPXCHG` on the slot word: whether it held `old` (and now holds `new`).
///
/// Inline assembly: the pinned nightly's LLVM writes a `cmpxchg` into the bitcode that
/// its bpf-linker cannot read back ("Invalid record"), while `xchg` and `and` go through.
#[inline(always)]
fn cas<V>(s: *mut Slot<V>, old: u64, new: u64) -> bool {
    let mut seen = old;
    // SAFETY: see above; the instruction touches only the word and r0.
    unsafe {
        core::arch::asm!(
            "r0 = cmpxchg_64({p} + 0, r0, {n})",
            p = in(reg) addr_of_mut!((*s).word),
            n = in(reg) new,
            inout("r0") seen,
            options(nostack),
        );
    }
    seen == old
}

/// `BPF_XCHG` on the slot word.
#[inline(always)]
fn store<V>(s: *mut Slot<V>, new: u64) {
    // SAFETY: see above.
    unsafe { atomic_xchg::<u64, { SeqCst }>(addr_of_mut!((*s).word), new) };
}

/// The slot word as it is now (a fresh load, never merged with another).
#[inline(always)]
fn word<V>(s: *const Slot<V>) -> u64 {
    // SAFETY: as in `atomic`.
    unsafe { read_volatile(addr_of!((*s).word)) }
}

/// Where `key` lives: `bucket index << 8 | way`, or [`NOT_FOUND`]. A number, not a
/// pointer, so that a BPF global function can return it ([`value_at`] turns it into
/// the value).
#[inline(always)]
pub fn find<T: Table>(key: *const FlowKey) -> u64 {
    // SAFETY: the caller passes a whole key.
    let hash = T::hash(unsafe { &*key });
    find_in::<T>(key, hash, T::index(hash))
}

/// [`find`] in one of the two buckets of a key in a two-choice table (the peer tables,
/// whose writer puts each key into the less full of two): its own (`SECOND` false) or
/// its second choice (`lb_common::table::second_choice`). One bucket per call, the
/// choice a constant: a search of both in one function, or one told which at run time,
/// keeps one more value across the hash and spills it to the stack, which the
/// allocation's call chain has no room for.
#[inline(always)]
pub fn find_choice<T: Table, const SECOND: bool>(key: *const FlowKey) -> u64 {
    // SAFETY: the caller passes a whole key.
    let hash = T::hash(unsafe { &*key });
    let choice = if SECOND { second_choice(hash) } else { hash };
    find_in::<T>(key, hash, T::index(choice))
}

/// Whether a two-choice table holds `key`, whose hash `hash` the caller computed (with
/// the table's seed): [`find_choice`] of both buckets, in a function that keeps to
/// registers (no hash to compute).
#[inline(always)]
pub fn holds_hashed<T: Table>(key: *const FlowKey, hash: u32) -> bool {
    find_in::<T>(key, hash, T::index(hash)) != NOT_FOUND
        || find_in::<T>(key, hash, T::index(second_choice(hash))) != NOT_FOUND
}

/// [`find`] in bucket `index`, for a key of hash `hash`.
#[inline(always)]
fn find_in<T: Table>(key: *const FlowKey, hash: u32, index: u32) -> u64 {
    let Some(b) = T::at(index) else {
        return NOT_FOUND;
    };
    let mut w = 0;
    while w < TABLE_WAYS {
        let s = way(b, w);
        let before = word(s);
        // The key is only rewritten while the word is not live, which the second read
        // of the word catches.
        if live_tagged(before, hash) && same_key(key_of(s), key) {
            // The lock bit (way 0) changes with other ways' writes: not this slot's.
            if (word(s) ^ before) & !SLOT_LOCK == 0 {
                return ((index as u64) << 8) | w as u64;
            }
        }
        w += 1;
    }
    NOT_FOUND
}

/// Copies the value [`find`] or [`find_choice`] located for `key` to `out`: `true` if
/// its slot still held `key`, unchanged, across the copy (its word the same before and
/// after). For the tables a writer rewrites whole under the program (the peer tables,
/// which the agent writes), where a value read in place could be half of one entry and
/// half of the next. Into the caller's frame, as `write` copies into a slot (a value
/// returned would take a frame of its own).
#[inline(always)]
pub fn copy_at<T: Table>(key: *const FlowKey, code: u64, out: *mut T::Value) -> bool {
    if code == NOT_FOUND {
        return false;
    }
    let Some(b) = T::at((code >> 8) as u32) else {
        return false;
    };
    let s = way(b, (code as u32) & (TABLE_WAYS - 1));
    let before = word(s);
    if before & SLOT_LIVE == 0 || !same_key(key_of(s), key) {
        return false;
    }
    // SAFETY: a map value copied whole into the caller's `out`; the copy counts only if
    // the word check below accepts it.
    unsafe { core::ptr::copy_nonoverlapping(addr_of!((*s).value), out, 1) };
    (word(s) ^ before) & !SLOT_LOCK == 0
}

/// The value [`find`] located.
#[inline(always)]
pub fn value_at<T: Table>(code: u64) -> Option<&'static mut T::Value> {
    if code == NOT_FOUND {
        return None;
    }
    let b = T::at((code >> 8) as u32)?;
    // SAFETY: a map value; values are read and updated field by field in place.
    Some(unsafe { &mut (*way(b, (code as u32) & (TABLE_WAYS - 1))).value })
}

/// [`find`] and [`value_at`] in one, inlined where it is called: the value of `key`
/// from one bucket lookup and no BPF-to-BPF call. For the one path that reads a single
/// key and nothing else of its table per packet (the nat reply); the other callers go
/// through BPF global functions, which the verifier checks once for all of them.
#[inline(always)]
pub fn find_value<T: Table>(key: &FlowKey) -> Option<&'static mut T::Value> {
    let hash = T::hash(key);
    let b = T::at(T::index(hash))?;
    let mut w = 0;
    while w < TABLE_WAYS {
        let s = way(b, w);
        let before = word(s);
        // As in `find`.
        if live_tagged(before, hash)
            && same_key(key_of(s), key)
            && (word(s) ^ before) & !SLOT_LOCK == 0
        {
            // SAFETY: as in `value_at`.
            return Some(unsafe { &mut (*s).value });
        }
        w += 1;
    }
    None
}

/// [`claim`]'s `evict` for a table whose entries are never evicted (nat: a live
/// reverse entry owns its port).
pub const NO_EVICTION: Option<fn(&lb_common::maps::NatValue) -> u64> = None;

/// Takes bucket `first` (way 0's lock bit), or `None` if another writer has it.
#[inline(always)]
fn lock<V>(way0: *mut Slot<V>) -> bool {
    let w = word(way0);
    w & SLOT_LOCK == 0 && cas(way0, w, w | SLOT_LOCK)
}

#[inline(always)]
fn unlock<V>(way0: *mut Slot<V>) {
    // SAFETY: see `cas`.
    unsafe { atomic_and::<u64, u64, { SeqCst }>(addr_of_mut!((*way0).word), !SLOT_LOCK) };
}

/// Rewrites slot `s` (bucket held) to `key` -> `value`: not live with the next
/// generation, key and value, live.
#[inline(always)]
fn write<V: Copy>(s: *mut Slot<V>, key: &FlowKey, value: &V, hash: u32) {
    let next = free_word(word(s));
    store(s, next);
    // SAFETY: a map value this writer holds (bucket lock); readers skip it until live.
    // The sources are the caller's stack: a plain assignment would be copied through a
    // stack temporary (LLVM cannot rule out overlap), which this frame has no room for.
    unsafe {
        core::ptr::copy_nonoverlapping(key, addr_of_mut!((*s).key), 1);
        core::ptr::copy_nonoverlapping(value, addr_of_mut!((*s).value), 1);
    }
    store(s, live_word(next, hash));
}

/// Frees slot `s` (bucket held): not live, next generation.
#[inline(always)]
fn clear<V>(s: *mut Slot<V>) {
    store(s, free_word(word(s)));
}

/// Puts `key` -> `value` into its bucket: into a free way, else into the first way
/// whose entry `reusable` lets go (`reusable(value, key)`). A present key is replaced
/// only when `replace` lets its own entry go (`replace(value, key)`). With `evict`, a bucket
/// full of kept entries gives the way whose entry has the largest `age` (idle longest)
/// to the key. Never waits. (The table of entries that are never evicted: nat's.)
#[inline(always)]
pub fn claim<T: Table>(
    key: &FlowKey,
    value: &T::Value,
    replace: impl Fn(&T::Value, &FlowKey) -> bool,
    reusable: impl Fn(&T::Value, &FlowKey) -> bool,
    evict: Option<impl Fn(&T::Value) -> u64>,
) -> Claim {
    claim_admitted::<T>(key, value, replace, reusable, evict, |_| false, 0)
}

/// [`claim`] with unconfirmed entries admitted apart (`LB_FLOWS`' handshakes, as
/// conntrack and Cilium keep unconfirmed entries apart from confirmed ones): an entry
/// is unconfirmed when `pending` says so; the new one is unconfirmed when `limit` is not
/// 0, and may then take a confirmed entry's way only if that entry's `age` is at least
/// `limit` (`u64::MAX`: never).
///
/// - A new unconfirmed entry takes a free way only while fewer than
///   [`PENDING_WAYS_MAX`] ways of the bucket hold live unconfirmed entries that
///   `reusable` keeps; past that share it takes a reusable way, else the oldest
///   unconfirmed entry's (`Displaced`): the free ways stay for confirmed flows.
/// - With no free way, a reusable way goes first, then the oldest unconfirmed entry's
///   (`Displaced`), then the confirmed entry idle longest (`Evicted`) — for a new
///   unconfirmed entry only one idle at least `limit`. Else the new entry is refused
///   (`Full`).
#[inline(always)]
pub fn claim_admitted<T: Table>(
    key: &FlowKey,
    value: &T::Value,
    replace: impl Fn(&T::Value, &FlowKey) -> bool,
    reusable: impl Fn(&T::Value, &FlowKey) -> bool,
    evict: Option<impl Fn(&T::Value) -> u64>,
    pending: impl Fn(&T::Value) -> bool,
    limit: u64,
) -> Claim {
    let hash = T::hash(key);
    let Some(b) = T::at(T::index(hash)) else {
        return Claim::Busy;
    };
    let way0 = way(b, 0);
    if !lock(way0) {
        return Claim::Busy;
    }
    // Way numbers, not pointers, in one register (the frame has no room for more
    // kept across the loop): the first free way (bits 0..4), the way to take when none
    // is free (bits 4..8, by `victim_rank`: one rank, not a way and an age per kind; 0:
    // none), and the count of unconfirmed entries (from bit 8). `TABLE_WAYS`: none.
    let mut at = TABLE_WAYS | (TABLE_WAYS << 4);
    let mut victim_rank = 0u64;
    let mut outcome = Claim::Full;
    let mut w = 0;
    while w < TABLE_WAYS {
        let s = way(b, w);
        if word(s) & SLOT_LIVE == 0 {
            if at & 0xf == TABLE_WAYS {
                at = (at & !0xf) | w;
            }
        } else {
            // SAFETY: bucket held: no other writer; the value's fields may still be
            // refreshed by readers (a stale read only misjudges one reuse by a tick).
            let (k, v) = unsafe { (&(*s).key, &(*s).value) };
            if live_tagged(word(s), hash) && same_key(k, key) {
                outcome = if replace(v, k) {
                    write(s, key, value, hash);
                    Claim::Replaced
                } else {
                    Claim::Taken
                };
                break;
            }
            let rank = if reusable(v, k) {
                RANK_REUSABLE
            } else if let Some(age) = &evict {
                let a = age(v) & RANK_AGE;
                if pending(v) {
                    at += 1 << 8;
                    RANK_PENDING | a
                } else if a >= limit {
                    a + 1
                } else {
                    0
                }
            } else {
                0
            };
            if rank > victim_rank {
                victim_rank = rank;
                at = (at & !0xf0) | (w << 4);
            }
        }
        w += 1;
    }
    if outcome == Claim::Full {
        // Past its share an unconfirmed newcomer leaves the free ways to confirmed flows:
        // it takes a reusable way, else the oldest unconfirmed entry's.
        let free = at & 0xf;
        let crowded = limit != 0 && at >> 8 >= PENDING_WAYS_MAX;
        let target = if free < TABLE_WAYS && !crowded {
            free
        } else {
            (at >> 4) & 0xf
        };
        if target < TABLE_WAYS {
            write(way(b, target), key, value, hash);
            outcome = if target == free || victim_rank >= RANK_REUSABLE {
                Claim::Fresh
            } else if victim_rank >= RANK_PENDING {
                Claim::Displaced
            } else {
                Claim::Evicted
            };
        }
    }
    unlock(way0);
    outcome
}

/// Frees the slot [`find`] located for `key` if it still holds `key`. `false` when
/// another writer held the bucket (nothing was done).
#[inline(always)]
pub fn remove_at<T: Table>(key: *const FlowKey, code: u64) -> bool {
    if code == NOT_FOUND {
        return true;
    }
    let Some(b) = T::at((code >> 8) as u32) else {
        return true;
    };
    let way0 = way(b, 0);
    if !lock(way0) {
        return false;
    }
    let s = way(b, (code as u32) & (TABLE_WAYS - 1));
    if word(s) & SLOT_LIVE != 0 && same_key(key_of(s), key) {
        clear(s);
    }
    unlock(way0);
    true
}

/// Starts the reads of two buckets at once: `a`'s in table `A` and `b`'s in table `B`,
/// the word of each of their four ways, eight loads back to back whose values are not
/// used (BPF has no prefetch instruction; a load nobody waits for is the nearest
/// thing). Back to back in one assembly block, both addresses computed before the
/// first load: on this machine a cold read overlaps a later one only if a few dozen
/// instructions separate them (`lab/reduced_nat.rs` measures it), and LLVM would
/// otherwise compute the second address between the two.
#[inline(always)]
pub fn prefetch2<A: Table, B: Table>(a: &FlowKey, b: &FlowKey) {
    let (Some(ba), Some(bb)) = (A::at(A::index(A::hash(a))), B::at(B::index(B::hash(b)))) else {
        return;
    };
    // SAFETY: loads within two map values (each offset is a way's word, inside the
    // bucket); only the scratch register is written.
    unsafe {
        core::arch::asm!(
            "{t} = *(u64 *)({a} + 0)",
            "{t} = *(u64 *)({b} + 0)",
            "{t} = *(u64 *)({a} + {sa})",
            "{t} = *(u64 *)({b} + {sb})",
            "{t} = *(u64 *)({a} + {sa2})",
            "{t} = *(u64 *)({b} + {sb2})",
            "{t} = *(u64 *)({a} + {sa3})",
            "{t} = *(u64 *)({b} + {sb3})",
            a = in(reg) ba,
            b = in(reg) bb,
            t = out(reg) _,
            sa = const core::mem::size_of::<Slot<A::Value>>(),
            sb = const core::mem::size_of::<Slot<B::Value>>(),
            sa2 = const 2 * core::mem::size_of::<Slot<A::Value>>(),
            sb2 = const 2 * core::mem::size_of::<Slot<B::Value>>(),
            sa3 = const 3 * core::mem::size_of::<Slot<A::Value>>(),
            sb3 = const 3 * core::mem::size_of::<Slot<B::Value>>(),
            options(nostack, readonly),
        );
    }
}
