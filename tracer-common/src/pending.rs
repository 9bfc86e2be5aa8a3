//! Per-CPU caches in front of `STATS` and `MAPPINGS`: a fault adds to a
//! slot of a per-CPU array (an index, no hashing) and only a slot taken over
//! by another key is flushed into the hash map. Consecutive faults of a
//! thread mostly share their key (same process, phase, set of classes, VMA),
//! so the common fault does no hash-map operation.
//!
//! A slot is found by its key's hash among two ways (`ways`). The phase is
//! left out of the hash, so the first fault of a new phase takes over the
//! slot of the same set in the old phase: the old phase is flushed as soon
//! as the CPU faults in the new one.
//!
//! User space reads a slot's counts as part of its key's total (hash map
//! plus every CPU's slots). A flush moves counts from a slot to the map; it
//! runs between two increments of the CPU's `FLUSHES` counter, odd while it
//! runs, so that a reader that sees the same even counters before and after
//! its reads of both has seen every count exactly once (a seqlock).
//!
//! A slot whose map is full is not taken over: it keeps its counts, which
//! user space may already have served, and the new key's event is the one
//! lost. So a count, once read, never vanishes from its key's total.

use crate::{
    attrib::{ClassCounts, MappingKey},
    class::{ClassSet, KernelClass},
    maps::{ClassSetKey, Stat},
    NBUCKETS,
};

/// Slots per CPU, per cache (a power of two).
pub const PENDING_SLOTS: u32 = 16;

/// `FLUSHES` indices: the seqlock's generation; the faults that left this
/// CPU without a slot: flushed into `STATS`, or lost there (`STATS` full
/// and their slot's ways held); the lost ones. With the faults still in
/// slots, what the kernel saw reach its maps: user space's identity
/// `seen = counted + lost`.
pub const FLUSH_GENERATION: u32 = 0;
pub const FLUSHED_FAULTS: u32 = 1;
pub const LOST_FAULTS: u32 = 2;
pub const FLUSH_COUNTERS: u32 = 3;

/// The faults among `count` events of class set `set`: all of them for a
/// fault's set ([`ClassSet::is_fault`]), none for a contpte event's.
#[inline(always)]
pub const fn faults_of(set: u32, count: u64) -> u64 {
    if ClassSet(set).is_fault() {
        count
    } else {
        0
    }
}

/// A `STATS` slot. `key.tgid == 0`: empty (no traced process has tgid 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PendingStat {
    pub key: ClassSetKey,
    pub _pad: u32,
    pub stat: Stat,
}

/// A `MAPPINGS` slot. `key.tgid == 0`: empty. Consecutive events of one
/// set of classes (a run of reuse faults) are counted as a run, `run`
/// events of `set`, added to `counts` class by class only when the set
/// changes or the slot is flushed: one add per event, not one per class.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PendingMapping {
    pub key: MappingKey,
    pub counts: ClassCounts,
    /// The `ClassSet` class bits of the current run.
    pub set: u32,
    pub run: u32,
}

impl PendingMapping {
    /// One event of the classes in `bits`.
    #[inline(always)]
    pub fn add(&mut self, bits: u32) {
        if bits != self.set || self.run == u32::MAX {
            self.end_run();
            self.set = bits;
        }
        self.run += 1;
    }

    /// Adds the current run to `counts`.
    #[inline(always)]
    pub fn end_run(&mut self) {
        let mut i = 0;
        while i < KernelClass::COUNT {
            if self.set & (1 << i) != 0 {
                self.counts.counts[i] += self.run as u64;
            }
            i += 1;
        }
        self.run = 0;
    }

    /// The slot's counts, its current run included (user space).
    pub fn total(&self) -> ClassCounts {
        let mut c = *self;
        c.end_run();
        c.counts
    }
}

/// A slot of either cache, for the one lookup both share.
pub trait Slot {
    type Key: Copy + PartialEq;
    fn key(&self) -> &Self::Key;
    fn set_key(&mut self, k: Self::Key);
    /// A key's process and phase (tgid 0: an empty slot).
    fn owner(k: &Self::Key) -> (u32, u32);
}

impl Slot for PendingStat {
    type Key = ClassSetKey;
    #[inline(always)]
    fn key(&self) -> &ClassSetKey {
        &self.key
    }
    #[inline(always)]
    fn set_key(&mut self, k: ClassSetKey) {
        self.key = k;
    }
    #[inline(always)]
    fn owner(k: &ClassSetKey) -> (u32, u32) {
        (k.tgid, k.phase)
    }
}

impl Slot for PendingMapping {
    type Key = MappingKey;
    #[inline(always)]
    fn key(&self) -> &MappingKey {
        &self.key
    }
    #[inline(always)]
    fn set_key(&mut self, k: MappingKey) {
        self.key = k;
    }
    #[inline(always)]
    fn owner(k: &MappingKey) -> (u32, u32) {
        (k.tgid, k.phase)
    }
}

/// Fibonacci hashing to the top bits: slot numbers for nearby keys differ.
#[inline(always)]
const fn spread(v: u32) -> u32 {
    v.wrapping_mul(0x9E37_79B1) >> (32 - PENDING_SLOTS.trailing_zeros())
}

/// The two slots a key may take: `(h, h ^ 1)`.
#[inline(always)]
pub const fn ways(h: u32) -> (u32, u32) {
    (h, h ^ 1)
}

/// The slot hash of a `STATS` key (its phase left out: see the module).
#[inline(always)]
pub const fn stat_slot(k: &ClassSetKey) -> u32 {
    spread(k.set ^ k.tgid.rotate_left(16))
}

/// The slot hash of a `MAPPINGS` key (its phase left out).
#[inline(always)]
pub const fn mapping_slot(k: &MappingKey) -> u32 {
    spread((k.start >> 12) as u32 ^ (k.start >> 44) as u32 ^ k.tgid.rotate_left(16))
}

/// Which of the two ways to evict when neither holds the key nor is empty:
/// the one of another phase, else the first.
#[inline(always)]
pub const fn victim(first_phase: u32, second_phase: u32, phase: u32) -> bool {
    first_phase == phase && second_phase != phase
}

/// `*dst += *src` and `*src = 0`: a flush of a `Stat` slot.
#[inline(always)]
pub fn drain_stat(dst: &mut Stat, src: &mut Stat) {
    dst.count += src.count;
    dst.sum_ns += src.sum_ns;
    dst.own_ns += src.own_ns;
    if src.max_ns > dst.max_ns {
        dst.max_ns = src.max_ns;
    }
    if src.raw_max_ns > dst.raw_max_ns {
        dst.raw_max_ns = src.raw_max_ns;
    }
    let mut i = 0;
    while i < NBUCKETS {
        dst.hist[i] += src.hist[i];
        dst.raw_hist[i] += src.raw_hist[i];
        i += 1;
    }
    zero(&mut src.count);
    zero(&mut src.sum_ns);
    zero(&mut src.max_ns);
    zero(&mut src.own_ns);
    zero(&mut src.raw_max_ns);
    let mut i = 0;
    while i < NBUCKETS {
        zero(&mut src.hist[i]);
        zero(&mut src.raw_hist[i]);
        i += 1;
    }
}

/// `*v = 0` as one 8-byte store: a loop of plain stores of 0 becomes a
/// call of `memset`, which on BPF is a byte loop that the verifier walks
/// to its limit.
#[inline(always)]
fn zero(v: &mut u64) {
    // SAFETY: a valid, aligned `&mut u64`.
    unsafe { core::ptr::write_volatile(v, 0) };
}

/// The same for a `ClassCounts` slot.
#[inline(always)]
pub fn drain_counts(dst: &mut ClassCounts, src: &mut ClassCounts) {
    let mut i = 0;
    while i < KernelClass::COUNT {
        dst.counts[i] += src.counts[i];
        zero(&mut src.counts[i]);
        i += 1;
    }
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::PendingStat {}
    unsafe impl aya::Pod for super::PendingMapping {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_in_range_and_ways_pair_up() {
        for tgid in [1u32, 2, 77, 4_000_000] {
            for set in 0..4096u32 {
                let h = stat_slot(&ClassSetKey { tgid, phase: 9, set });
                assert!(h < PENDING_SLOTS);
                let (a, b) = ways(h);
                assert!(a < PENDING_SLOTS && b < PENDING_SLOTS && a != b && a ^ b == 1);
            }
            for page in 0..4096u64 {
                let k = MappingKey { tgid, phase: 1, start: 0x7f00_0000_0000 + (page << 12) };
                assert!(mapping_slot(&k) < PENDING_SLOTS);
            }
        }
    }

    #[test]
    fn a_new_phase_lands_where_the_old_one_was() {
        let k = ClassSetKey { tgid: 5, phase: 1, set: 0b1011 };
        assert_eq!(stat_slot(&k), stat_slot(&ClassSetKey { phase: 2, ..k }));
        let m = MappingKey { tgid: 5, phase: 1, start: 0x5555_0000 };
        assert_eq!(mapping_slot(&m), mapping_slot(&MappingKey { phase: 7, ..m }));
    }

    #[test]
    fn common_sets_of_one_process_spread_over_slots() {
        // The sets a COW workload produces: not all in one pair of ways.
        let sets = [0b1, 0b11, 0b1111, 0b1_0111, 0b100_0000_0000_0001];
        let pairs = sets.map(|set| stat_slot(&ClassSetKey { tgid: 1234, phase: 0, set }) / 2);
        let distinct = (0..pairs.len()).filter(|&i| !pairs[..i].contains(&pairs[i])).count();
        assert!(distinct >= 3, "{pairs:?}");
    }

    #[test]
    fn runs_of_one_set_count_once_per_class() {
        let mut m = PendingMapping {
            key: MappingKey { tgid: 1, phase: 0, start: 0x1000 },
            counts: ClassCounts::ZERO,
            set: 0,
            run: 0,
        };
        for _ in 0..5 {
            m.add(0b1011);
        }
        m.add(0b1);
        m.add(0b1011);
        let t = m.total();
        assert_eq!((t.counts[0], t.counts[1], t.counts[2], t.counts[3]), (7, 6, 0, 6));
        assert_eq!(m.run, 1, "the current run is not ended by reading it");
        m.end_run();
        assert_eq!(m.counts.counts, t.counts);
    }

    #[test]
    fn the_victim_is_the_stale_phase() {
        assert!(!victim(1, 1, 2), "both stale: the first");
        assert!(victim(2, 1, 2), "the first current, the second stale: the second");
        assert!(!victim(1, 2, 2));
        assert!(!victim(2, 2, 2));
    }

    #[test]
    fn a_drain_moves_everything_once() {
        let mut dst = Stat::ZERO;
        dst.record(Some(100));
        let mut src = Stat::ZERO;
        src.record_timed(5_300, 300);
        src.record(None);
        drain_stat(&mut dst, &mut src);
        assert_eq!((dst.count, dst.sum_ns, dst.max_ns, dst.timed()), (3, 5_100, 5_000, 2));
        assert_eq!((dst.own_ns, dst.raw_max_ns, dst.raw_hist.iter().sum::<u64>()), (300, 5_300, 2));
        assert_eq!((src.count, src.sum_ns, src.max_ns, src.timed(), src.own_ns), (0, 0, 0, 0, 0));
        assert_eq!(src.raw_hist.iter().sum::<u64>(), 0);
        let mut a = ClassCounts::ZERO;
        let mut b = ClassCounts::ZERO;
        b.counts[3] = 4;
        drain_counts(&mut a, &mut b);
        assert_eq!((a.counts[3], b.counts[3]), (4, 0));
    }
}
