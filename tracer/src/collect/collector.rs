//! Reads the kernel's per-CPU aggregates into one snapshot: per (process,
//! phase, class), the sum over CPUs. Snapshots subtract, for interval tables.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use anyhow::{anyhow, Result};

use aya::{
    maps::{PerCpuArray, PerCpuHashMap, StackTraceMap},
    Ebpf, Pod,
};
use faultscope_common::{
    attrib::{ClassCounts, MappingKey, SiteKey, StackKey, VmaInfo, VmaKey},
    class::ClassSet,
    fault::Origin,
    hist,
    maps::ClassSetKey,
    pending::{
        faults_of, PendingMapping, PendingStat, FLUSHED_FAULTS, FLUSH_GENERATION, LOST_FAULTS, PENDING_SLOTS,
    },
    KernelClass, PhaseId, Stat, StatKey,
};

use crate::kernel::classes::{PmdOutcome, ReportClass};

/// Counts per [`Origin`], in `Origin::ALL` order.
pub type ByOrigin = [u64; Origin::COUNT];

/// (process, phase, class, folio order): `copy` or `not_present`, and the
/// order of the new anon folio (0: a base page).
pub type FolioKey = (u32, PhaseId, ReportClass, u32);

/// What the kernel's own count of a process (`mm_account_fault()`: its
/// `min_flt` + `maj_flt`) is compared with, per (process, phase).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accounted {
    /// `handle_mm_fault` returns without `VM_FAULT_RETRY` or an error: the
    /// faults the kernel accounts (a retried fault once, at its end).
    pub completed: u64,
    /// Of those, the ones that returned `VM_FAULT_MAJOR`.
    pub major: u64,
    /// Page-fault exceptions (the tracepoint-only mode's count), by origin
    /// (never GUP: get_user_pages takes no exception).
    pub exceptions: ByOrigin,
}

impl Accounted {
    fn add(&mut self, o: &Accounted) {
        self.completed += o.completed;
        self.major += o.major;
        for (a, b) in self.exceptions.iter_mut().zip(o.exceptions) {
            *a += b;
        }
    }

    fn sub(&self, o: &Accounted) -> Accounted {
        let mut e = self.exceptions;
        for (a, b) in e.iter_mut().zip(o.exceptions) {
            *a = a.saturating_sub(b);
        }
        Accounted {
            completed: self.completed.saturating_sub(o.completed),
            major: self.major.saturating_sub(o.major),
            exceptions: e,
        }
    }
}

#[derive(Clone, Default)]
pub struct Snapshot {
    pub stats: BTreeMap<StatKey, Stat>,
    /// Per (process, phase, class): its count split by origin.
    pub origins: BTreeMap<StatKey, ByOrigin>,
    /// Per (process, phase, class, folio order): the new anon folios the
    /// class's faults mapped (see [`per_folio`]).
    pub folios: BTreeMap<FolioKey, u64>,
    /// Per (process, phase, outcome): the write-protect faults on
    /// PMD-mapped THPs by what came of them.
    pub pmd_outcomes: BTreeMap<(u32, PhaseId, PmdOutcome), u64>,
    /// Per (process, phase, kind of `classes::FAULT_KINDS`): the faults,
    /// partitioned.
    pub kinds: BTreeMap<(u32, PhaseId, &'static str), u64>,
    /// Per (process, phase): what the kernel check compares.
    pub accounted: BTreeMap<(u32, PhaseId), Accounted>,
    /// The kernel's own `STATS` keys that `stats` was read from (a set of
    /// classes each), for deleting exactly what was read.
    pub stat_sets: Vec<ClassSetKey>,
    /// Per (process, phase, mapping): a count per kernel class.
    pub mappings: BTreeMap<MappingKey, ClassCounts>,
    /// Per (process, phase, user ip, class).
    pub sites: BTreeMap<SiteKey, u64>,
    /// Per (process, phase, class, stack ids).
    pub stacks: BTreeMap<StackKey, u64>,
    /// The (process, phase) pairs that some CPU still holds counts of in a
    /// pending slot: the kernel adds them to its maps later, so their
    /// entries must not be deleted yet.
    pub pending: BTreeSet<(u32, PhaseId)>,
    /// The counts kept moving between CPUs' slots and the maps through
    /// every retry: this snapshot may count a flush twice or not at all.
    pub torn: bool,
    /// The faults that reached the kernel's maps, by the kernel's own count.
    pub flow: FaultFlow,
}

/// The faults the programs brought to `STATS` since the run began, counted
/// apart from `STATS` itself: `seen` (flushed from a CPU's slot, or still
/// in one) is what was counted there plus what was `lost` (`STATS` full).
/// What user space served must add up to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultFlow {
    pub seen: u64,
    pub lost: u64,
}

/// Every CPU's value of index `i` of a per-CPU array.
fn per_cpu_at<V: Pod>(bpf: &Ebpf, name: &str, i: u32) -> Result<Vec<V>> {
    let m = bpf.map(name).ok_or_else(|| anyhow!("no {name} map"))?;
    let arr: PerCpuArray<_, V> = PerCpuArray::try_from(m)?;
    Ok(arr.get(&i, 0)?.iter().copied().collect())
}

/// The kernel's aggregates: the hash maps plus every CPU's pending slots.
struct Aggregates {
    sets: BTreeMap<ClassSetKey, Stat>,
    mappings: BTreeMap<MappingKey, ClassCounts>,
    pending: BTreeSet<(u32, PhaseId)>,
    torn: bool,
    flow: FaultFlow,
}

/// Attempts at a read no flush ran through, before taking one that may be
/// torn (flushes are rare: a slot taken over by a new phase or set).
const READ_TRIES: u32 = 200;

/// Time after which an interval's read takes the try it has, torn or not:
/// under a storm that keeps flushing (tracepoint mode's per-mapping counts
/// take a slot over every 16 faults of a sequential write) no try is
/// clean, and retrying would hold the collector past its next interval. A
/// torn read counts nothing (`Snapshot::clean_or`): its faults are in the
/// next clean read's interval; the run's totals come from its last read.
pub const INTERVAL_READ_WITHIN: Duration = Duration::from_millis(20);
/// The same for a read whose counts are a report's (the run's last,
/// bench's): no later read shows what a torn one missed.
pub const FINAL_READ_WITHIN: Duration = Duration::from_secs(5);

impl Aggregates {
    /// `STATS` and `MAPPINGS` with the pending slots added, read between two
    /// equal, even readings of every CPU's `FLUSHES` (see
    /// `faultscope_common::pending`), so that each count is seen once.
    fn read(bpf: &Ebpf, within: Duration) -> Result<Aggregates> {
        let mut tries = 0;
        let started = std::time::Instant::now();
        loop {
            tries += 1;
            let before: Vec<u64> = per_cpu_at(bpf, "FLUSHES", FLUSH_GENERATION)?;
            let in_flush = before.iter().any(|g| g % 2 == 1);
            let mut sets = per_cpu_sums(bpf, "STATS", Stat::ZERO, Stat::merge)?;
            let mut mappings = per_cpu_sums(bpf, "MAPPINGS", ClassCounts::ZERO, ClassCounts::merge)?;
            let mut pending = BTreeSet::new();
            let mut in_slots = 0;
            for i in 0..PENDING_SLOTS {
                for p in per_cpu_at::<PendingStat>(bpf, "PENDING_STATS", i)? {
                    if p.key.tgid != 0 && p.stat.count > 0 {
                        sets.entry(p.key).or_insert(Stat::ZERO).merge(&p.stat);
                        pending.insert((p.key.tgid, p.key.phase));
                        in_slots += faults_of(p.key.set, p.stat.count);
                    }
                }
                for p in per_cpu_at::<PendingMapping>(bpf, "PENDING_MAPPINGS", i)? {
                    let counts = p.total();
                    if p.key.tgid != 0 && counts.counts.iter().any(|n| *n > 0) {
                        mappings.entry(p.key).or_insert(ClassCounts::ZERO).merge(&counts);
                        pending.insert((p.key.tgid, p.key.phase));
                    }
                }
            }
            // Read after the maps and the slots: a flush while they were read
            // (a torn read) moved faults this read missed, never counted
            // twice, and seen counts them, so counted + lost <= seen holds
            // on every read and is equal on a clean one.
            let flow = FaultFlow {
                seen: per_cpu_at::<u64>(bpf, "FLUSHES", FLUSHED_FAULTS)?.iter().sum::<u64>() + in_slots,
                lost: per_cpu_at::<u64>(bpf, "FLUSHES", LOST_FAULTS)?.iter().sum(),
            };
            let after: Vec<u64> = per_cpu_at(bpf, "FLUSHES", FLUSH_GENERATION)?;
            let clean = !in_flush && before == after;
            if clean || tries >= READ_TRIES || started.elapsed() >= within {
                log::debug!("counts read: {tries} tries, {:?}, clean {clean}", started.elapsed());
                return Ok(Aggregates { sets, mappings, pending, torn: !clean, flow });
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

/// Every entry of a per-CPU hash map, summed over CPUs.
fn per_cpu_sums<K: Pod + Ord, V: Pod>(
    bpf: &Ebpf,
    name: &str,
    zero: V,
    merge: impl Fn(&mut V, &V),
) -> Result<BTreeMap<K, V>> {
    let m = bpf.map(name).ok_or_else(|| anyhow!("no {name} map"))?;
    let map: PerCpuHashMap<_, K, V> = PerCpuHashMap::try_from(m)?;
    let mut out = BTreeMap::new();
    for item in map.iter() {
        let (key, values) = item?;
        let mut sum = zero;
        for v in values.iter() {
            merge(&mut sum, v);
        }
        out.insert(key, sum);
    }
    Ok(out)
}

/// Moves the `STATS` entries of `gone` (processes that have exited) into
/// `into` and deletes them from the kernel's map, so that a run over every
/// process keeps the map to the processes alive. A process some CPU still
/// holds counts of in a pending slot, or any CPU is flushing a slot while
/// they are looked for, is left for a later call: once neither holds, no
/// flush can write its entries again (it faults no more). Returns the
/// processes folded.
pub fn fold(
    bpf: &mut Ebpf,
    gone: &BTreeSet<u32>,
    into: &mut BTreeMap<ClassSetKey, Stat>,
) -> Result<BTreeSet<u32>> {
    if gone.is_empty() {
        return Ok(BTreeSet::new());
    }
    if per_cpu_at::<u64>(bpf, "FLUSHES", FLUSH_GENERATION)?.iter().any(|g| g % 2 == 1) {
        return Ok(BTreeSet::new());
    }
    let mut ready = gone.clone();
    for i in 0..PENDING_SLOTS {
        for p in per_cpu_at::<PendingStat>(bpf, "PENDING_STATS", i)? {
            if p.stat.count > 0 {
                ready.remove(&p.key.tgid);
            }
        }
    }
    let m = bpf.map_mut("STATS").ok_or_else(|| anyhow!("no STATS map"))?;
    let mut map: PerCpuHashMap<_, ClassSetKey, Stat> = PerCpuHashMap::try_from(m)?;
    let keys: Vec<ClassSetKey> =
        map.keys().filter_map(|k| k.ok()).filter(|k| ready.contains(&k.tgid)).collect();
    for k in keys {
        if let Ok(values) = map.get(&k, 0) {
            let sum = into.entry(k).or_insert(Stat::ZERO);
            for v in values.iter() {
                sum.merge(v);
            }
            let _ = map.remove(&k);
        }
    }
    Ok(ready)
}

/// Takes the VMA descriptions the kernel wrote since the last call out of
/// `VMAS` (see `VmaInfo`): a description is read once, and the map holds
/// only what is new.
pub fn take_vmas(bpf: &mut Ebpf) -> Result<Vec<(VmaKey, VmaInfo)>> {
    let Some(m) = bpf.map_mut("VMAS") else {
        return Ok(Vec::new());
    };
    let mut map: aya::maps::HashMap<_, VmaKey, VmaInfo> = aya::maps::HashMap::try_from(m)?;
    let keys: Vec<VmaKey> = map.keys().filter_map(|k| k.ok()).collect();
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        if let Ok(v) = map.get(&k, 0) {
            out.push((k, v));
        }
        let _ = map.remove(&k);
    }
    Ok(out)
}

/// The kernel's entries per set of classes, added to each class of their
/// set (see `ClassSetKey`).
pub fn per_class(sets: &BTreeMap<ClassSetKey, Stat>) -> BTreeMap<StatKey, Stat> {
    let mut out: BTreeMap<StatKey, Stat> = BTreeMap::new();
    for (k, v) in sets {
        for sk in k.stat_keys() {
            out.entry(sk).or_insert(Stat::ZERO).merge(v);
        }
    }
    out
}

/// Each class's count split by the origin its sets carry.
pub fn per_origin(sets: &BTreeMap<ClassSetKey, Stat>) -> BTreeMap<StatKey, ByOrigin> {
    let mut out: BTreeMap<StatKey, ByOrigin> = BTreeMap::new();
    for (k, v) in sets {
        let o = ClassSet(k.set).origin() as usize;
        for sk in k.stat_keys() {
            out.entry(sk).or_default()[o] += v.count;
        }
    }
    out
}

/// The new anon folios mapped by faults, by order: a COW copy's (`copy`),
/// and a fault on a page not present's (`not_present`: a first touch of
/// anon memory, or of a private file page written, a swap-in into a new
/// folio). A write-protect fault that mapped one without being a copy
/// (none on the kernels faultscope knows) is not counted.
pub fn per_folio(sets: &BTreeMap<ClassSetKey, Stat>) -> BTreeMap<FolioKey, u64> {
    let mut out = BTreeMap::new();
    for (k, v) in sets {
        let set = ClassSet(k.set);
        let Some(order) = set.folio_order() else { continue };
        let class = if set.has(KernelClass::Copy) {
            ReportClass::Copy
        } else if !set.has(KernelClass::WpFaults) && !set.has(KernelClass::HugePmdWp) {
            ReportClass::NotPresent
        } else {
            continue;
        };
        *out.entry((k.tgid, k.phase, class, order)).or_default() += v.count;
    }
    out
}

/// The faults of each (process, phase) summed by what `of` makes of their
/// class set (sets it makes nothing of left out).
fn tally<K: Ord>(
    sets: &BTreeMap<ClassSetKey, Stat>,
    of: impl Fn(ClassSet) -> Option<K>,
) -> BTreeMap<(u32, PhaseId, K), u64> {
    let mut out = BTreeMap::new();
    for (k, v) in sets {
        if let Some(x) = of(ClassSet(k.set)) {
            *out.entry((k.tgid, k.phase, x)).or_default() += v.count;
        }
    }
    out
}

/// The write-protect faults on PMD-mapped THPs of each (process, phase),
/// by outcome.
pub fn per_pmd_outcome(sets: &BTreeMap<ClassSetKey, Stat>) -> BTreeMap<(u32, PhaseId, PmdOutcome), u64> {
    tally(sets, PmdOutcome::of)
}

/// The faults of each (process, phase) by kind (a partition).
pub fn per_kind(sets: &BTreeMap<ClassSetKey, Stat>) -> BTreeMap<(u32, PhaseId, &'static str), u64> {
    tally(sets, crate::kernel::classes::fault_kind)
}

/// Per (process, phase), the faults the kernel accounts as
/// `mm_account_fault()` does (no retry, no error), and the exceptions.
pub fn accounted(sets: &BTreeMap<ClassSetKey, Stat>) -> BTreeMap<(u32, PhaseId), Accounted> {
    let mut out: BTreeMap<(u32, PhaseId), Accounted> = BTreeMap::new();
    for (k, v) in sets {
        let set = ClassSet(k.set);
        let a = out.entry((k.tgid, k.phase)).or_default();
        if set.has(KernelClass::Faults) && !set.has(KernelClass::Retry) && !set.has(KernelClass::Error) {
            a.completed += v.count;
            if set.has(KernelClass::Major) {
                a.major += v.count;
            }
        }
        if set.has(KernelClass::TpFaults) {
            a.exceptions[set.origin() as usize] += v.count;
        }
    }
    out
}

impl Snapshot {
    /// Reads every map; `within`: see [`INTERVAL_READ_WITHIN`]. `folded`:
    /// counts taken out of `STATS` earlier (see [`fold`]), added back.
    pub fn read(bpf: &Ebpf, within: Duration, folded: &BTreeMap<ClassSetKey, Stat>) -> Result<Snapshot> {
        let Aggregates { mut sets, mappings, pending, torn, flow } = Aggregates::read(bpf, within)?;
        let stat_sets = sets.keys().copied().collect();
        for (k, v) in folded {
            sets.entry(*k).or_insert(Stat::ZERO).merge(v);
        }
        Ok(Snapshot {
            stats: per_class(&sets),
            origins: per_origin(&sets),
            folios: per_folio(&sets),
            pmd_outcomes: per_pmd_outcome(&sets),
            kinds: per_kind(&sets),
            accounted: accounted(&sets),
            stat_sets,
            mappings,
            sites: per_cpu_sums(bpf, "SITES", 0u64, |a, b| *a += *b)?,
            stacks: per_cpu_sums(bpf, "STACK_COUNTS", 0u64, |a, b| *a += *b)?,
            pending,
            torn,
            flow,
        })
    }

    pub fn pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.stats.keys().map(|k| k.tgid).collect();
        v.dedup();
        v
    }

    /// One class of one process, summed over phases (`phase == None`) or in
    /// one phase.
    pub fn get_in(&self, tgid: u32, phase: Option<PhaseId>, class: KernelClass) -> Option<Stat> {
        if let Some(p) = phase {
            // One key: a lookup, not a walk over the process's phases.
            return self.stats.get(&StatKey::new(tgid, p, class as u16)).copied();
        }
        let mut out: Option<Stat> = None;
        for (k, v) in self.of(tgid) {
            if k.class == class as u16 && phase.is_none_or(|p| p == k.phase) {
                out.get_or_insert(Stat::ZERO).merge(v);
            }
        }
        out
    }

    pub fn get(&self, tgid: u32, class: KernelClass) -> Option<Stat> {
        self.get_in(tgid, None, class)
    }

    /// One class's count by origin, over the run or in one phase.
    pub fn origins_in(&self, tgid: u32, phase: Option<PhaseId>, class: KernelClass) -> ByOrigin {
        let mut out = ByOrigin::default();
        let lo = StatKey { tgid, ..StatKey::default() };
        for (k, v) in self.origins.range(lo..).take_while(|(k, _)| k.tgid == tgid) {
            if k.class == class as u16 && phase.is_none_or(|p| p == k.phase) {
                for (a, b) in out.iter_mut().zip(v) {
                    *a += b;
                }
            }
        }
        out
    }

    /// The new anon folios `class`'s faults mapped, by order, over the run
    /// or in one phase.
    pub fn folios_in(&self, tgid: u32, phase: Option<PhaseId>, class: ReportClass) -> BTreeMap<u32, u64> {
        let mut out = BTreeMap::new();
        let lo = (tgid, 0, ReportClass::Faults, 0);
        for ((_, p, c, order), n) in self.folios.range(lo..).take_while(|(k, _)| k.0 == tgid) {
            if *c == class && phase.is_none_or(|want| want == *p) {
                *out.entry(*order).or_default() += n;
            }
        }
        out
    }

    /// What the kernel check compares, for a process's whole run.
    pub fn accounted_of(&self, tgid: u32) -> Accounted {
        let mut out = Accounted::default();
        for (_, a) in self.accounted.range((tgid, 0)..=(tgid, PhaseId::MAX)) {
            out.add(a);
        }
        out
    }

    /// The entries of one process (the map is ordered by tgid first).
    fn of(&self, tgid: u32) -> impl Iterator<Item = (&StatKey, &Stat)> {
        let lo = StatKey { tgid, ..StatKey::default() };
        self.stats.range(lo..).take_while(move |(k, _)| k.tgid == tgid)
    }

    /// Phase keys in which the process has any count.
    pub fn phases_of(&self, tgid: u32) -> Vec<PhaseId> {
        let mut v: Vec<PhaseId> = self.of(tgid).map(|(k, _)| k.phase).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The snapshot without one phase of one process.
    pub fn without_phase(mut self, tgid: u32, phase: PhaseId) -> Snapshot {
        self.stats.retain(|k, _| !(k.tgid == tgid && k.phase == phase));
        self.origins.retain(|k, _| !(k.tgid == tgid && k.phase == phase));
        self.folios.retain(|k, _| !(k.0 == tgid && k.1 == phase));
        self.pmd_outcomes.retain(|k, _| !(k.0 == tgid && k.1 == phase));
        self.accounted.remove(&(tgid, phase));
        self.mappings.retain(|k, _| !(k.tgid == tgid && k.phase == phase));
        self.sites.retain(|k, _| !(k.tgid == tgid && k.phase == phase));
        self.stacks.retain(|k, _| !(k.tgid == tgid && k.phase == phase));
        self
    }

    /// `self`, or `last` if `self` is a read torn by a flush: one that may
    /// count a flushed slot twice (the slot read before the flush emptied
    /// it, `STATS` after the flush added it) or not at all. A count taken
    /// from such a read can be higher than the next clean read's, and no
    /// interval or counter can give it back; its faults wait for the next
    /// clean read instead.
    pub fn clean_or(self, last: &Snapshot) -> Snapshot {
        if self.torn {
            Snapshot { torn: true, ..last.clone() }
        } else {
            self
        }
    }

    /// `self - earlier`: what happened between two snapshots.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let mut stats = BTreeMap::new();
        for (k, v) in &self.stats {
            let mut d = *v;
            if let Some(e) = earlier.stats.get(k) {
                d.count -= e.count.min(d.count);
                d.sum_ns -= e.sum_ns.min(d.sum_ns);
                d.own_ns -= e.own_ns.min(d.own_ns);
                for (a, b) in d.hist.iter_mut().zip(e.hist.iter()) {
                    *a -= (*b).min(*a);
                }
                for (a, b) in d.raw_hist.iter_mut().zip(e.raw_hist.iter()) {
                    *a -= (*b).min(*a);
                }
                // The max of an interval is not recoverable from two maxima;
                // keep it only when it grew.
                if e.max_ns >= d.max_ns {
                    d.max_ns = 0;
                }
                if e.raw_max_ns >= d.raw_max_ns {
                    d.raw_max_ns = 0;
                }
            }
            if d.count > 0 {
                stats.insert(*k, d);
            }
        }
        let mut origins = BTreeMap::new();
        for (k, v) in &self.origins {
            let mut d = *v;
            if let Some(e) = earlier.origins.get(k) {
                for (a, b) in d.iter_mut().zip(e) {
                    *a = a.saturating_sub(*b);
                }
            }
            if d.iter().any(|n| *n > 0) {
                origins.insert(*k, d);
            }
        }
        let folios = counts_since(&self.folios, &earlier.folios);
        let pmd_outcomes = counts_since(&self.pmd_outcomes, &earlier.pmd_outcomes);
        let accounted = self
            .accounted
            .iter()
            .map(|(k, v)| (*k, earlier.accounted.get(k).map_or(*v, |e| v.sub(e))))
            .collect();
        // Intervals show class counts only.
        Snapshot { stats, origins, folios, pmd_outcomes, accounted, ..Snapshot::default() }
    }

    /// The PMD write-protect faults of `tgid` by outcome, over the run or
    /// in one phase.
    pub fn pmd_outcomes_in(&self, tgid: u32, phase: Option<PhaseId>) -> BTreeMap<PmdOutcome, u64> {
        let mut out = BTreeMap::new();
        for ((_, p, o), n) in
            self.pmd_outcomes.range((tgid, 0, PmdOutcome::Reused)..).take_while(|(k, _)| k.0 == tgid)
        {
            if phase.is_none_or(|want| want == *p) {
                *out.entry(*o).or_default() += n;
            }
        }
        out
    }
}

/// `now - earlier` per key, the keys left at 0 dropped.
fn counts_since<K: Ord + Copy>(now: &BTreeMap<K, u64>, earlier: &BTreeMap<K, u64>) -> BTreeMap<K, u64> {
    now.iter()
        .map(|(k, v)| (*k, v.saturating_sub(earlier.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// The frames of a stack in `STACK_TRACES` (leaf first), or none when the
/// id is not there (a lost stack is counted in `drops`).
pub fn stack_frames(bpf: &Ebpf, id: i32) -> Vec<u64> {
    if id < 0 {
        return Vec::new();
    }
    let Some(m) = bpf.map("STACK_TRACES") else { return Vec::new() };
    let Ok(map) = StackTraceMap::try_from(m) else { return Vec::new() };
    match map.get(&(id as u32), 0) {
        Ok(st) => st.frames().iter().map(|f| f.ip).collect(),
        Err(_) => Vec::new(),
    }
}

/// Latency summary of a timed class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latency {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
    /// The timed faults' time, summed.
    pub sum_ns: u64,
}

/// The latency of a timed class, faultscope's nested programs' own time
/// taken out.
pub fn latency(s: &Stat) -> Option<Latency> {
    let n = s.timed();
    if n == 0 {
        return None;
    }
    Some(Latency {
        p50_ns: percentile(&s.hist, 0.50, s.max_ns),
        p99_ns: percentile(&s.hist, 0.99, s.max_ns),
        max_ns: s.max_ns,
        mean_ns: s.sum_ns / n,
        sum_ns: s.sum_ns,
    })
}

/// The same with that time left in (`Stat::raw_hist`), and the mean of
/// the time taken out; `None` from a kernel side that kept no raw figures.
pub fn raw_latency(s: &Stat) -> Option<(Latency, u64)> {
    let n: u64 = s.raw_hist.iter().sum();
    if n == 0 {
        return None;
    }
    let l = Latency {
        p50_ns: percentile(&s.raw_hist, 0.50, s.raw_max_ns),
        p99_ns: percentile(&s.raw_hist, 0.99, s.raw_max_ns),
        max_ns: s.raw_max_ns,
        mean_ns: (s.sum_ns + s.own_ns) / n,
        sum_ns: s.sum_ns + s.own_ns,
    };
    Some((l, s.own_ns / n))
}

/// The q-quantile of a log-linear histogram, interpolated inside its bucket
/// and never above the exact maximum (when known).
pub fn percentile(h: &[u64], q: f64, max_ns: u64) -> u64 {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut cum = 0u64;
    for (i, &c) in h.iter().enumerate() {
        if c == 0 {
            continue;
        }
        if cum + c >= rank {
            let (lo, hi) = hist::bucket_range(i);
            let frac = (rank - cum) as f64 / c as f64;
            let v = lo as f64 + frac * (hi - lo) as f64;
            let v = v.floor() as u64;
            return if max_ns > 0 { v.min(max_ns) } else { v };
        }
        cum += c;
    }
    max_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_of(vals: &[u64]) -> Stat {
        let mut s = Stat::ZERO;
        for v in vals {
            s.record(Some(*v));
        }
        s
    }

    #[test]
    fn percentiles_within_bucket_error() {
        // 1000 values 1..=1000 ns: p50 = 500, p99 = 990.
        let vals: Vec<u64> = (1..=1000).collect();
        let s = stat_of(&vals);
        let l = latency(&s).unwrap();
        assert!((l.p50_ns as f64 - 500.0).abs() / 500.0 < 0.2, "{l:?}");
        assert!((l.p99_ns as f64 - 990.0).abs() / 990.0 < 0.2, "{l:?}");
        assert_eq!(l.max_ns, 1000);
        assert_eq!(l.mean_ns, 500);
    }

    #[test]
    fn percentile_never_exceeds_max() {
        let s = stat_of(&[420; 100]);
        let l = latency(&s).unwrap();
        assert!(l.p50_ns <= 420 && l.p50_ns >= 384, "{l:?}");
        assert_eq!(l.p99_ns.min(420), l.p99_ns);
    }

    #[test]
    fn untimed_class_has_no_latency() {
        let mut s = Stat::ZERO;
        s.record(None);
        s.record(None);
        assert_eq!(s.count, 2);
        assert!(latency(&s).is_none());
    }

    #[test]
    fn per_cpu_merge_and_since() {
        let a = stat_of(&[100, 200]);
        let b = stat_of(&[300]);
        let mut m = Stat::ZERO;
        m.merge(&a);
        m.merge(&b);
        assert_eq!(m.count, 3);
        assert_eq!(m.max_ns, 300);
        assert_eq!(m.sum_ns, 600);

        let key = StatKey::new(7, 0, KernelClass::Faults as u16);
        let early = Snapshot { stats: [(key, a)].into(), ..Snapshot::default() };
        let late = Snapshot { stats: [(key, m)].into(), ..Snapshot::default() };
        let d = late.since(&early);
        let ds = d.stats[&key];
        assert_eq!(ds.count, 1);
        assert_eq!(ds.sum_ns, 300);
        assert_eq!(ds.max_ns, 300);
        assert_eq!(late.get(7, KernelClass::Faults).unwrap().count, 3);
        assert!(late.get(7, KernelClass::Copy).is_none());
        assert!(late.get(8, KernelClass::Faults).is_none());
    }

    /// Reads torn high (a flushed slot counted twice: 5 for 3) and low (2
    /// for 4) between clean ones: the intervals add up to the last read.
    #[test]
    fn intervals_over_torn_reads_add_up_to_the_last_read() {
        let key = StatKey::new(7, 0, KernelClass::Faults as u16);
        let snap = |n: usize, torn: bool| Snapshot {
            stats: [(key, stat_of(&vec![1; n]))].into(),
            torn,
            ..Snapshot::default()
        };
        let reads = [snap(1, false), snap(5, true), snap(3, false), snap(2, true), snap(6, false)];
        let (mut last, mut sum) = (Snapshot::default(), 0);
        for r in reads {
            let r = r.clean_or(&last);
            sum += r.since(&last).stats.get(&key).map_or(0, |s| s.count);
            last = r;
        }
        assert_eq!(sum, 6);
    }

    /// What the kernel check compares: `mm_account_fault()` counts a
    /// completed fault once (a retried one at its end, not its retry) and
    /// no failed one; the origins split each class.
    #[test]
    fn accounted_faults_leave_out_retries_and_errors() {
        use faultscope_common::class::ClassSet;
        let set = |cs: &[KernelClass], o: Origin| {
            cs.iter().fold(ClassSet::default(), |s, c| s.with(*c)).with_origin(o).0
        };
        let n = |k: u64| Stat { count: k, ..Stat::ZERO };
        let mut sets = BTreeMap::new();
        let key = |s| ClassSetKey { tgid: 7, phase: 1, set: s };
        sets.insert(key(set(&[KernelClass::Faults, KernelClass::Reuse], Origin::User)), n(10));
        sets.insert(key(set(&[KernelClass::Faults, KernelClass::Copy], Origin::Kernel)), n(4));
        sets.insert(key(set(&[KernelClass::Faults, KernelClass::Copy], Origin::Gup)), n(3));
        sets.insert(key(set(&[KernelClass::Faults, KernelClass::Retry], Origin::User)), n(2));
        sets.insert(key(set(&[KernelClass::Faults, KernelClass::Major], Origin::User)), n(2));
        sets.insert(key(set(&[KernelClass::Faults, KernelClass::Error], Origin::Kernel)), n(1));
        sets.insert(key(set(&[KernelClass::TpFaults], Origin::Kernel)), n(5));
        let a = accounted(&sets)[&(7, 1)];
        assert_eq!((a.completed, a.major), (10 + 4 + 3 + 2, 2));
        assert_eq!(a.exceptions, [0, 5, 0]);
        let o = per_origin(&sets);
        assert_eq!(o[&StatKey::new(7, 1, KernelClass::Copy as u16)], [0, 4, 3]);
        assert_eq!(o[&StatKey::new(7, 1, KernelClass::Faults as u16)], [14, 5, 3]);
        // The per-class totals are those of every origin.
        assert_eq!(per_class(&sets)[&StatKey::new(7, 1, KernelClass::Copy as u16)].count, 7);
        let snap = Snapshot { origins: o, accounted: accounted(&sets), ..Snapshot::default() };
        assert_eq!(snap.origins_in(7, None, KernelClass::Copy), [0, 4, 3]);
        assert_eq!(snap.accounted_of(7).completed, 19);
        assert_eq!(snap.since(&snap).accounted_of(7).completed, 0);
    }

    /// A set's folio bits split `copy` and `not_present` by folio order,
    /// and never reach the class counts.
    #[test]
    fn new_folios_by_order() {
        use faultscope_common::class::ClassSet;
        let set = |cs: &[KernelClass], folio: u32| {
            cs.iter().fold(ClassSet::default(), |s, c| s.with(*c)).with_folio(folio).0
        };
        let n = |k: u64| Stat { count: k, ..Stat::ZERO };
        let key = |phase, s| ClassSetKey { tgid: 7, phase, set: s };
        let copy = [KernelClass::Faults, KernelClass::WpFaults, KernelClass::Copy];
        let mut sets = BTreeMap::new();
        sets.insert(key(1, set(&copy, 1)), n(10));
        sets.insert(key(1, set(&copy, 5)), n(2));
        sets.insert(key(2, set(&copy, 1)), n(3));
        // First touches: of a 2M THP, of a base page; a fault that mapped
        // none; a reuse.
        sets.insert(key(1, set(&[KernelClass::Faults], 10)), n(4));
        sets.insert(key(1, set(&[KernelClass::Faults], 1)), n(6));
        sets.insert(key(1, set(&[KernelClass::Faults], 0)), n(50));
        sets.insert(key(1, set(&[KernelClass::Faults, KernelClass::WpFaults, KernelClass::Reuse], 0)), n(9));
        let snap = Snapshot { folios: per_folio(&sets), ..Snapshot::default() };
        assert_eq!(snap.folios_in(7, None, ReportClass::Copy), [(0, 13), (4, 2)].into());
        assert_eq!(snap.folios_in(7, Some(2), ReportClass::Copy), [(0, 3)].into());
        assert_eq!(snap.folios_in(7, None, ReportClass::NotPresent), [(0, 6), (9, 4)].into());
        assert!(snap.folios_in(8, None, ReportClass::Copy).is_empty());
        assert_eq!(per_class(&sets)[&StatKey::new(7, 1, KernelClass::Copy as u16)].count, 12);
        let since = snap
            .since(&Snapshot { folios: [((7, 1, ReportClass::Copy, 0), 4)].into(), ..Snapshot::default() });
        assert_eq!(since.folios_in(7, Some(1), ReportClass::Copy), [(0, 6), (4, 2)].into());
        assert!(snap.without_phase(7, 1).folios_in(7, Some(1), ReportClass::Copy).is_empty());
    }

    /// Phase ids are as wide as the kernel's: past 65,535 phase changes,
    /// counts stay in their own phase.
    #[test]
    fn phase_ids_above_u16_round_trip() {
        let wide: PhaseId = 65_536 + 7;
        let mut stats = BTreeMap::new();
        stats.insert(StatKey::new(7, wide, KernelClass::Faults as u16), stat_of(&[100, 200]));
        stats.insert(StatKey::new(7, 7, KernelClass::Faults as u16), stat_of(&[300]));
        stats.insert(StatKey::new(7, PhaseId::MAX, KernelClass::Faults as u16), stat_of(&[400]));
        let snap = Snapshot { stats, ..Snapshot::default() };
        assert_eq!(snap.get_in(7, Some(wide), KernelClass::Faults).unwrap().count, 2);
        assert_eq!(snap.get_in(7, Some(7), KernelClass::Faults).unwrap().count, 1);
        assert_eq!(snap.get_in(7, Some(PhaseId::MAX), KernelClass::Faults).unwrap().count, 1);
        assert_eq!(snap.get(7, KernelClass::Faults).unwrap().count, 4);
        assert_eq!(snap.phases_of(7), vec![7, wide, PhaseId::MAX]);
        let rest = snap.without_phase(7, wide);
        assert!(rest.get_in(7, Some(wide), KernelClass::Faults).is_none());
        assert_eq!(rest.get(7, KernelClass::Faults).unwrap().count, 2);
    }
}
