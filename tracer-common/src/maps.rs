//! Keys and values of the maps shared by the eBPF programs and user space.

use crate::hist::{bucket_of, NBUCKETS};

/// A phase id (see [`phase_id`]): the same width on both sides of the map,
/// so that no phase change ever wraps into another phase's counts.
pub type PhaseId = u32;

/// One class of one process in one phase: how user space keys the counts
/// it adds up from the kernel's `STATS` entries (whose key is
/// [`ClassSetKey`], one per set of classes). 12 bytes, the padding
/// explicit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatKey {
    pub tgid: u32,
    pub phase: PhaseId,
    /// A [`KernelClass`](crate::KernelClass) as u16.
    pub class: u16,
    pub _pad: u16,
}

impl StatKey {
    #[inline(always)]
    pub const fn new(tgid: u32, phase: PhaseId, class: u16) -> StatKey {
        StatKey { tgid, phase, class, _pad: 0 }
    }
}

/// Key of the kernel's `STATS` per-CPU hash: one entry per (process, phase,
/// set of classes). An event is counted once, under the set of all the
/// classes it falls in (a reuse fault: faults, write_faults, wp_faults,
/// reuse), so a fault costs one map update and one histogram update, not
/// one per class. User space adds each entry to every class of its set
/// ([`ClassSetKey::stat_keys`]): each class's count and histogram are the
/// sums over the sets that hold it, exactly.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClassSetKey {
    pub tgid: u32,
    pub phase: PhaseId,
    /// `ClassSet` bits.
    pub set: u32,
}

impl ClassSetKey {
    /// The per-class keys this entry counts for.
    pub fn stat_keys(&self) -> impl Iterator<Item = StatKey> + '_ {
        crate::class::KernelClass::ALL
            .into_iter()
            .filter(|c| self.set & c.bit() != 0)
            .map(|c| StatKey::new(self.tgid, self.phase, c as u16))
    }
}

/// The `CONFIG` map's one value: every entry, read by a program once per
/// run (one lookup, not one per entry).
pub type ConfigValues = [u32; Config::COUNT];

/// Value of `STATS`: a count and, for classes timed at the fault's return,
/// the latency distribution in nanoseconds: the fault's time in the kernel
/// less the time faultscope's own programs nested inside it measured
/// (`hist`, `sum_ns`, `max_ns`), and the whole time (`raw_hist`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Stat {
    pub count: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
    pub hist: [u64; NBUCKETS],
    /// The nested programs' own time, summed (taken out of `sum_ns`).
    pub own_ns: u64,
    pub raw_max_ns: u64,
    pub raw_hist: [u64; NBUCKETS],
}

impl Stat {
    pub const ZERO: Stat = Stat {
        count: 0,
        sum_ns: 0,
        max_ns: 0,
        hist: [0; NBUCKETS],
        own_ns: 0,
        raw_max_ns: 0,
        raw_hist: [0; NBUCKETS],
    };

    /// Account one event; `ns == None` for classes that are only counted.
    /// Per-CPU, so no atomics are needed.
    #[inline(always)]
    pub fn record(&mut self, ns: Option<u64>) {
        match ns {
            Some(ns) => self.record_timed(ns, 0),
            None => self.count += 1,
        }
    }

    /// Account one timed event of `raw_ns` in the kernel, `own_ns` of which
    /// faultscope's nested programs spent.
    #[inline(always)]
    pub fn record_timed(&mut self, raw_ns: u64, own_ns: u64) {
        self.count += 1;
        let own = if own_ns > raw_ns { raw_ns } else { own_ns };
        let ns = raw_ns - own;
        self.sum_ns += ns;
        self.own_ns += own;
        if ns > self.max_ns {
            self.max_ns = ns;
        }
        if raw_ns > self.raw_max_ns {
            self.raw_max_ns = raw_ns;
        }
        let b = bucket_of(ns);
        if b < NBUCKETS {
            self.hist[b] += 1;
        }
        let b = bucket_of(raw_ns);
        if b < NBUCKETS {
            self.raw_hist[b] += 1;
        }
    }

    /// Sum of per-CPU values (user space).
    pub fn merge(&mut self, other: &Stat) {
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
        self.own_ns += other.own_ns;
        self.raw_max_ns = self.raw_max_ns.max(other.raw_max_ns);
        for (a, b) in self.hist.iter_mut().zip(other.hist.iter()) {
            *a += *b;
        }
        for (a, b) in self.raw_hist.iter_mut().zip(other.raw_hist.iter()) {
            *a += *b;
        }
    }

    pub fn timed(&self) -> u64 {
        self.hist.iter().sum()
    }
}

/// `TargetInfo.flags`: the process is in the traced set but its faults are
/// not counted yet (a command faultscope started, before its `exec`).
pub const TARGET_PENDING_EXEC: u32 = 1 << 0;
/// Children forked by this process are added to the traced set in the kernel
/// (at fork time, before the child can fault).
pub const TARGET_FOLLOW_CHILDREN: u32 = 1 << 1;

/// Value of the `TARGETS` hash, keyed by tgid: the traced set, filtered in
/// the kernel on every probe.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetInfo {
    pub flags: u32,
    pub _reserved: u32,
}

/// A CPU's `UNTRACED` note: the thread last found untraced there, by pid
/// and tgid (`bpf_get_current_pid_tgid`), its cgroup under the cgroup
/// filter (else 0), and the `TARGETS_EPOCH` of the finding (as the thread
/// caches hold it: never 0, so an unused note matches no thread).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UntracedNote {
    pub pid_tgid: u64,
    pub cgroup: u64,
    pub epoch: u64,
}

/// A CPU's `OPEN` slot: the fault state of the thread that last opened a
/// fault there (`owner`, its `bpf_get_current_pid_tgid`; 0: none). While
/// the owner runs on that CPU its programs find the state with a per-CPU
/// read instead of a task-storage lookup (about 120 instructions on 6.12);
/// when it is switched out the state moves to its task storage (`THREADS`)
/// if a fault or an exception record is open, and the slot is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFault {
    pub owner: u64,
    /// Faults opened on this CPU until the next timed one, under
    /// `Config::LatencyEvery` N > 1 (the CPU's, whoever owns the slot).
    pub countdown: u64,
    pub fault: crate::ThreadFault,
}

/// The phase a fault is accounted to: the count of phase changes (forks,
/// child exits and execs of traced processes, marks) when it was counted.
/// Every change adds 1 atomically and takes the sum as its id, the kernel
/// (`bump_phase`) and user space (a mark, through the `PHASE` array mapped
/// into its memory) alike, so each change has its own id, ordered as the
/// changes were, and each fault the id of the last change before it.
#[inline(always)]
pub const fn phase_id(changes: u64) -> PhaseId {
    changes as PhaseId
}

/// Process lifecycle events, sent to user space through a ring buffer. These
/// are rare (fork/exec/exit of traced processes), never per fault.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifeKind {
    /// A traced process forked a child (`pid`); a new phase starts.
    Fork = 1,
    /// A traced process exec'd.
    Exec = 2,
    /// A traced process exited.
    Exit = 3,
    /// A child of a traced process (`pid`) exited; a new phase starts.
    ChildExit = 4,
    /// A child of a traced process (`pid`) exec'd: it no longer shares the
    /// parent's memory; a new phase starts.
    ChildExec = 5,
    /// A process of a `--cgroup` filter's cgroup (`aux`: the filter's
    /// value, user space's index of the cgroup) joined the traced set at its
    /// first event.
    Adopt = 6,
}

/// `Adopt`'s `aux` bit: the process joined at its exec, so the kernel's own
/// count starts exactly there (the event's `flt`).
pub const ADOPT_AT_EXEC: u32 = 1 << 31;
/// `Adopt`'s `aux` index for a process the comm filter adopted.
pub const ADOPT_BY_COMM: u32 = ADOPT_AT_EXEC - 1;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LifeEvent {
    pub ts_ns: u64,
    pub kind: u32,
    /// The traced process (the parent for `Fork`).
    pub tgid: u32,
    /// The thread that did it; for `Fork`, the new child's pid.
    pub pid: u32,
    /// `Fork`: 1 if the child is followed (traced too); `Adopt`: the
    /// cgroup's value in `CGROUPS` ([`ADOPT_BY_COMM`] for the comm
    /// filter), with [`ADOPT_AT_EXEC`] when it joined at its exec.
    pub aux: u32,
    /// The phase that starts with this event (Fork, ChildExit, ChildExec;
    /// Exec when the kernel starts a phase at exec: see `EXEC_PHASE`).
    pub phase: PhaseId,
    pub _pad: u32,
    pub comm: [u8; 16],
    /// `Exec`, `Adopt`: the faults the kernel had accounted to the current
    /// thread by then (its `min_flt`/`maj_flt`): where the kernel's own
    /// count of a process that starts to count there starts from.
    pub flt: FltCount,
    /// The thread's cgroup v2 id (`bpf_get_current_cgroup_id`, the cgroup
    /// directory's inode number): names the container of a process that
    /// exits before user space reads its `/proc/PID/cgroup`.
    pub cgroup: u64,
}

/// The longest cgroup path [`CgroupDir`] carries; a longer one is left to
/// user space's walk of the cgroup tree.
pub const CGROUP_PATH_MAX: usize = 512;

/// A cgroup v2 directory made (`cgroup:cgroup_mkdir`), sent through
/// `CGROUP_DIRS`: its id and path as the kernel has them at that moment,
/// so that a container's processes are named even when its cgroup is gone
/// before user space reads it. Rare (one per cgroup made), never per fault.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CgroupDir {
    pub id: u64,
    /// Bytes of `path` before its NUL (`CGROUP_PATH_MAX`: cut short).
    pub len: u32,
    pub _pad: u32,
    pub path: [u8; CGROUP_PATH_MAX],
}

/// The kernel's own fault count of a task (`task_struct.min_flt` and
/// `maj_flt`, which `mm_account_fault()` keeps): what getrusage and
/// `/proc/PID/stat` add up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FltCount {
    pub min: u64,
    pub maj: u64,
}

impl FltCount {
    pub const fn total(&self) -> u64 {
        self.min + self.maj
    }
}

crate::catalogue! {
    /// Indices of the `CONFIG` value ([`ConfigValues`]), written by user space once the probes are
    /// attached and before any target is added: what the tracepoint must record,
    /// so that no fault pays for counts the report will not show.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Config: u32 {
        /// The `ClassSet` bits of the error-code classes to count.
        TpClasses = 0,
        /// Non-zero when the kretprobe classifies faults and needs the exception
        /// record (error code) of each.
        Exceptions = 1,
        /// Non-zero: count every class per mapping too (`MAPPINGS`).
        Mappings = 2,
        /// The `ClassSet` bits of the classes whose faulting instruction is
        /// counted (`SITES`).
        SiteClasses = 3,
        /// The `ClassSet` bits of the classes whose user stacks are counted.
        UserStackClasses = 4,
        /// The `ClassSet` bits of the classes whose kernel stacks are counted
        /// (the contpte classes: which kernel path unfolded a block).
        KernelStackClasses = 5,
        /// Which faults are timed (`--latency`): 0 none, 1 every fault, N one
        /// in N on each CPU.
        LatencyEvery = 6,
    }
}

impl Config {
    /// The array index.
    #[inline(always)]
    pub const fn index(self) -> u32 {
        self as u32
    }
}

crate::catalogue! {
    /// Indices of counters in the `DROPS` per-CPU array: things that went
    /// wrong in the kernel and must be reported, never silently lost. Only
    /// append: the index is an ABI between the eBPF object and user space.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub enum DropKind: u32 keyed {
        /// `STATS` was full: an event of a new (process, phase, set of
        /// classes) was lost (the slot it needed kept counts the map had no
        /// room for).
        StatsFull = 0 => "stats_map_full", "stats map full";
        /// No `THREADS` state for a thread (its task storage could not be
        /// allocated, or was busy under a nested program on that CPU): its
        /// fault was not followed. `threads_map_full` in older reports.
        ThreadStateFailed = 1 => "thread_state_failed", "thread state not created (task storage out of memory or busy)";
        /// `TARGETS` or `CHILDREN` was full: a child was not traced or followed.
        TargetsFull = 2 => "targets_map_full", "targets map full";
        /// The `EVENTS` ring was full: a lifecycle event was lost.
        EventsFull = 3 => "events_ring_full", "events ring full";
        /// A fault entered `handle_mm_fault` and its kretprobe never ran (the
        /// kernel had no free kretprobe instance). Seen when the thread's
        /// next fault enters, which counts it then from its marks: untimed,
        /// and with its return value unknown (taken as completed, not
        /// retried).
        LostReturn = 4 => "lost_kretprobe_returns", "faults whose kretprobe was missed (counted untimed at the next fault)";
        /// A read of a program's context (probe argument, tracepoint field)
        /// failed: that event was not classified.
        ReadFailed = 5 => "context_read_failed", "events whose context could not be read";
        /// `MAPPINGS` was full: an event was not attributed to its mapping
        /// (the slot it needed kept counts the map had no room for).
        MappingsFull = 6 => "mappings_map_full", "mappings map full";
        /// `SITES` was full: an event was not attributed to its code site.
        SitesFull = 7 => "sites_map_full", "sites map full";
        /// `STACK_COUNTS` was full: a stack was not counted.
        StacksFull = 8 => "stacks_map_full", "stack counts map full";
        /// `bpf_get_stackid` failed (a hash collision in `STACK_TRACES`, or
        /// it was full): the event's stack is missing.
        StackLost = 9 => "stack_ids_lost", "stacks lost (a hash collision in the stack map, or no stack to read)";
        /// `EXITED` was full: an exiting thread's own fault count was not
        /// kept, so its process's kernel check cannot be exact.
        ExitedFull = 10 => "exited_map_full", "exited threads whose fault count was not kept";
        /// The `CGROUP_DIRS` ring was full: a cgroup made was not told, so a
        /// process that exits from it before user space reads its place is
        /// named by user space's walk of the cgroup tree, if that is still
        /// there.
        CgroupDirsFull = 11 => "cgroup_dirs_ring_full", "cgroups made whose path was not told";
    }
}

impl DropKind {
    /// The array index.
    #[inline(always)]
    pub const fn index(self) -> u32 {
        self as u32
    }
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::StatKey {}
    unsafe impl aya::Pod for super::ClassSetKey {}
    unsafe impl aya::Pod for super::Stat {}
    unsafe impl aya::Pod for super::TargetInfo {}
    unsafe impl aya::Pod for super::LifeEvent {}
    unsafe impl aya::Pod for super::CgroupDir {}
    unsafe impl aya::Pod for super::FltCount {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_are_positions() {
        for (i, d) in DropKind::ALL.iter().enumerate() {
            assert_eq!(d.index() as usize, i);
        }
        for (i, c) in Config::ALL.iter().enumerate() {
            assert_eq!(c.index() as usize, i);
        }
    }

    #[test]
    fn drop_keys_are_unique() {
        for a in DropKind::ALL {
            for b in DropKind::ALL {
                assert!(a == b || (a.key() != b.key() && a.describe() != b.describe()), "{a:?} {b:?}");
            }
        }
    }

    #[test]
    fn stat_key_layout() {
        assert_eq!(core::mem::size_of::<StatKey>(), 12);
        assert_eq!(core::mem::align_of::<StatKey>(), 4);
    }

    #[test]
    fn a_set_counts_for_each_of_its_classes() {
        use crate::class::{ClassSet, KernelClass};
        let set = ClassSet::default()
            .with(KernelClass::Faults)
            .with(KernelClass::WriteFaults)
            .with(KernelClass::Reuse);
        let k = ClassSetKey { tgid: 7, phase: 3, set: set.0 };
        let want = [KernelClass::Faults, KernelClass::WriteFaults, KernelClass::Reuse]
            .map(|c| StatKey::new(7, 3, c as u16));
        assert!(k.stat_keys().eq(want));
        assert_eq!(core::mem::size_of::<ClassSetKey>(), 12);
    }

    #[test]
    fn phase_ids_above_u16_stay_apart() {
        let a = StatKey::new(1, 65_536 + 3, 0);
        let b = StatKey::new(1, 3, 0);
        assert_ne!(a, b);
        assert_eq!(a.phase, 65_539);
        assert_eq!(phase_id(65_536), 65_536);
    }
}
