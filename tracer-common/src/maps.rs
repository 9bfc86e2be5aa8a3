//! Keys and values of the maps shared by the eBPF programs and user space.

use crate::hist::{bucket_of, NBUCKETS};

/// Key of the `STATS` per-CPU hash: one entry per (process, phase, class).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatKey {
    pub tgid: u32,
    pub phase: u16,
    pub class: u16,
}

/// Value of `STATS`: a count and, for classes timed by the kretprobe, the
/// latency distribution in nanoseconds.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Stat {
    pub count: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
    pub hist: [u64; NBUCKETS],
}

impl Stat {
    pub const ZERO: Stat = Stat { count: 0, sum_ns: 0, max_ns: 0, hist: [0; NBUCKETS] };

    /// Account one event; `ns == None` for classes that are only counted.
    /// Per-CPU, so no atomics are needed.
    #[inline(always)]
    pub fn record(&mut self, ns: Option<u64>) {
        self.count += 1;
        if let Some(ns) = ns {
            self.sum_ns += ns;
            if ns > self.max_ns {
                self.max_ns = ns;
            }
            let b = bucket_of(ns);
            if b < NBUCKETS {
                self.hist[b] += 1;
            }
        }
    }

    /// Sum of per-CPU values (user space).
    pub fn merge(&mut self, other: &Stat) {
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
        for (a, b) in self.hist.iter_mut().zip(other.hist.iter()) {
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

/// Index in the `PHASE` array (u64 values: BPF has 64-bit atomics only) of the count of lifecycle changes (forks,
/// child exits and execs of traced processes), bumped by the kernel.
pub const PHASE_LIFECYCLE: u32 = 0;
/// Index of the count of marks, written only by user space.
pub const PHASE_MARKS: u32 = 1;

/// The phase a fault is accounted to: both counters only grow, so their sum
/// names each phase of the run uniquely, and neither side ever has to
/// read-modify-write the other's counter.
#[inline(always)]
pub const fn phase_id(lifecycle: u32, marks: u32) -> u32 {
    lifecycle.wrapping_add(marks)
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
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LifeEvent {
    pub ts_ns: u64,
    pub kind: u32,
    /// The traced process (the parent for `Fork`).
    pub tgid: u32,
    /// The thread that did it; for `Fork`, the new child's pid.
    pub pid: u32,
    /// `Fork`: 1 if the child is followed (traced too).
    pub aux: u32,
    /// The phase that starts with this event (Fork, ChildExit, ChildExec).
    pub phase: u32,
    pub _pad: u32,
    pub comm: [u8; 16],
}

/// `CONFIG` array, written by user space once the probes are attached and
/// before any target is added: what the tracepoint must record, so that
/// no fault pays for counts the report will not show.
/// The `ClassSet` bits of the error-code classes to count.
pub const CONFIG_TP_CLASSES: u32 = 0;
/// Non-zero when the kretprobe classifies faults and needs the exception
/// record (error code) of each.
pub const CONFIG_EXCEPTIONS: u32 = 1;
pub const NCONFIG: u32 = 2;

/// Index of counters in the `DROPS` per-CPU array: things that went wrong in
/// the kernel and must be reported, never silently lost.
pub const DROP_STATS_FULL: u32 = 0;
pub const DROP_THREADS_FULL: u32 = 1;
pub const DROP_TARGETS_FULL: u32 = 2;
pub const DROP_EVENTS_FULL: u32 = 3;
/// A user fault entered `handle_mm_fault` and its kretprobe never ran (the
/// kernel had no free kretprobe instance): that fault was not classified.
/// Seen when the thread's next fault enters.
pub const DROP_LOST_RETURN: u32 = 4;
pub const NDROPS: u32 = 5;

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::StatKey {}
    unsafe impl aya::Pod for super::Stat {}
    unsafe impl aya::Pod for super::TargetInfo {}
    unsafe impl aya::Pod for super::LifeEvent {}
}
