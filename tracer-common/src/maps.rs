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
    pub const ZERO: Stat = Stat {
        count: 0,
        sum_ns: 0,
        max_ns: 0,
        hist: [0; NBUCKETS],
    };

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
    pub phase: u32,
    pub flags: u32,
}

/// Process lifecycle events, sent to user space through a ring buffer. These
/// are rare (fork/exec/exit of traced processes), never per fault.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifeKind {
    Fork = 1,
    Exec = 2,
    Exit = 3,
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
    /// `Exit`: exit code as in `task->exit_code`; `Fork`: 1 if followed.
    pub aux: u32,
    pub comm: [u8; 16],
}

/// Index of counters in the `DROPS` per-CPU array: things that went wrong in
/// the kernel and must be reported, never silently lost.
pub const DROP_STATS_FULL: u32 = 0;
pub const DROP_THREADS_FULL: u32 = 1;
pub const DROP_TARGETS_FULL: u32 = 2;
pub const DROP_EVENTS_FULL: u32 = 3;
pub const NDROPS: u32 = 4;

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::StatKey {}
    unsafe impl aya::Pod for super::Stat {}
    unsafe impl aya::Pod for super::TargetInfo {}
    unsafe impl aya::Pod for super::LifeEvent {}
}
