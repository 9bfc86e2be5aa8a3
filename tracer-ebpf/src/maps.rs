//! Every map of the object and the globals user space sets at load time.
//!
//! One place for the kernel side's state, so that what user space reads
//! (by map name) and what the programs write can be checked side by side.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
};
use faultscope_common::{
    attrib::{ClassCounts, MappingKey, SiteKey, StackKey},
    maps::{Config, Drop, PhaseCounter, Stat, StatKey, TargetInfo},
    ThreadFault,
};

/// The traced set, keyed by tgid. Written by user space (-p, spawned command)
/// and by the fork program (children of followed processes).
#[map]
pub static TARGETS: HashMap<u32, TargetInfo> = HashMap::with_max_entries(4096, 0);

/// Per-thread fault state, keyed by tid. LRU so that threads that die in the
/// middle of a fault cannot leak entries.
#[map]
pub static THREADS: LruHashMap<u32, ThreadFault> = LruHashMap::with_max_entries(16384, 0);

/// The aggregates: per (tgid, phase, class) count and latency histogram.
/// User space may resize it before load.
#[map]
pub static STATS: PerCpuHashMap<StatKey, Stat> = PerCpuHashMap::with_max_entries(2048, 0);

/// A zeroed `Stat` to insert from: a `Stat` does not fit on the BPF stack.
#[map]
pub static ZERO: PerCpuArray<Stat> = PerCpuArray::with_max_entries(1, 0);

/// Phase counters (`PhaseCounter`): `Lifecycle` bumped here on forks and
/// child exits/execs of traced processes, `Marks` written by user space.
#[map]
pub static PHASE: Array<u64> = Array::with_max_entries(PhaseCounter::COUNT as u32, 0);

/// Children of traced processes that still share their memory (forked, not
/// yet exited or exec'd): child pid -> parent tgid.
#[map]
pub static CHILDREN: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// The cgroup filter (`serve --cgroup`): cgroup v2 id -> user space's
/// index of that cgroup. Read only when `CGROUP_FILTER` is set. User space
/// sizes it at load.
#[map]
pub static CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(1, 0);

/// What the tracepoint records (see `Config`).
#[map]
pub static CONFIG: Array<u32> = Array::with_max_entries(Config::COUNT as u32, 0);

/// Counters of things the kernel side could not record (see `Drop`).
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Drop::COUNT as u32, 0);

/// Attribution by mapping: per (tgid, phase, VMA start) a counter per
/// class. User space may resize it before load.
#[map]
pub static MAPPINGS: PerCpuHashMap<MappingKey, ClassCounts> = PerCpuHashMap::with_max_entries(4096, 0);

/// A zeroed `ClassCounts` to insert from.
#[map]
pub static ZERO_COUNTS: PerCpuArray<ClassCounts> = PerCpuArray::with_max_entries(1, 0);

/// Attribution by code site: per (tgid, phase, user ip, class) a count.
#[map]
pub static SITES: PerCpuHashMap<SiteKey, u64> = PerCpuHashMap::with_max_entries(4096, 0);

/// Stacks asked for (`--stacks`): counts per (tgid, phase, class, stacks).
#[map]
pub static STACK_COUNTS: PerCpuHashMap<StackKey, u64> = PerCpuHashMap::with_max_entries(4096, 0);

/// The stacks themselves, by id. One entry unless user space sizes it for
/// `--stacks` at load (a stack map preallocates every entry).
#[map]
pub static STACK_TRACES: StackTrace = StackTrace::with_max_entries(1, 0);

/// Process lifecycle events for user space.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

// ---- configuration, set by user space at load time ------------------------
// Tracepoint field offsets are read from tracefs `format` files at start-up,
// so that no kernel's layout is compiled in; these are x86-64's, used only
// when the format cannot be read (user space says so on stderr).

#[no_mangle]
pub static PF_ADDRESS_OFF: u32 = 8;
#[no_mangle]
pub static PF_ERROR_CODE_OFF: u32 = 24;
#[no_mangle]
pub static NEWTASK_PID_OFF: u32 = 8;
#[no_mangle]
pub static NEWTASK_CLONE_FLAGS_OFF: u32 = 32;
/// `vm_area_struct.vm_start`, from the running kernel's BTF (0 on current
/// kernels); per-mapping counting is off when BTF does not have it.
#[no_mangle]
pub static VMA_START_OFF: u32 = 0;

/// Non-zero: a task of a cgroup in `CGROUPS` that is not traced joins the
/// traced set at its first event (see `helpers::adopt`). A load-time
/// constant, so that without the filter no program pays for it.
#[no_mangle]
pub static CGROUP_FILTER: u32 = 0;

// How `sched_process_exit` tells the last thread of a process (see
// lifecycle.rs): the tracepoint's `group_dead` field where the kernel has it
// (0: it has not), else `current->signal->live` at these BTF offsets (0:
// unknown), else the thread-group leader's exit.
#[no_mangle]
pub static EXIT_GROUP_DEAD_OFF: u32 = 0;
#[no_mangle]
pub static TASK_SIGNAL_OFF: u32 = 0;
#[no_mangle]
pub static SIGNAL_LIVE_OFF: u32 = 0;

/// A load-time global, read so that the compiler cannot fold the default in.
#[inline(always)]
pub fn cfg(v: &'static u32) -> usize {
    unsafe { core::ptr::read_volatile(v) as usize }
}

/// A `CONFIG` entry (0 when unset).
#[inline(always)]
pub fn config(c: Config) -> u32 {
    CONFIG.get(c.index()).copied().unwrap_or(0)
}
