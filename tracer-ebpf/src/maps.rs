//! Every map of the object and the globals user space sets at load time.
//!
//! One place for the kernel side's state, so that what user space reads
//! (by map name) and what the programs write can be checked side by side.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{
        bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE, BPF_F_MMAPABLE, BPF_F_NO_PREALLOC,
        BPF_LOCAL_STORAGE_GET_F_CREATE,
    },
    helpers::generated::{bpf_get_current_task_btf, bpf_task_storage_get},
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf, StackTrace},
};
use faultscope_common::{
    attrib::{ClassCounts, LastVma, MappingKey, SiteKey, StackKey, VmaInfo, VmaKey, VMAS_ENTRIES},
    fault::{WpPage, WP_PAGE_BUCKETS},
    maps::{
        ClassSetKey, Config, ConfigValues, DropKind, FltCount, OpenFault, Stat, TargetInfo, UntracedNote,
    },
    pending::{PendingMapping, PendingStat, FLUSH_COUNTERS, PENDING_SLOTS},
    ThreadFault,
};

/// The traced set, keyed by tgid. Written by user space (-p, spawned command)
/// and by the fork program (children of followed processes).
#[map]
pub static TARGETS: HashMap<u32, TargetInfo> = HashMap::with_max_entries(4096, 0);

/// Moved whenever the traced set may have changed: by user space on every
/// insert, removal and rewrite of `TARGETS` and insert into `CGROUPS`, and
/// by the programs that insert (fork, adoption), start a process's
/// counting (exec) or remove an exited process. A thread's cached "traced" (`ThreadFault::traced`) and
/// a CPU's `UNTRACED` note hold while it has not moved.
#[map]
pub static TARGETS_EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// Per CPU, the last thread found untraced there and the epoch it was found
/// at. A task-storage lookup costs about 120 instructions even when it
/// misses; this note lets the opening programs of an untraced thread's
/// later faults on this CPU stop after a per-CPU read. One entry per CPU.
#[map]
pub static UNTRACED: PerCpuArray<UntracedNote> = PerCpuArray::with_max_entries(1, 0);

/// A task-local storage map (BPF_MAP_TYPE_TASK_STORAGE, 5.11+): one value
/// per task, kept in the task itself, freed with it. aya-ebpf 0.2.1 has the
/// cgroup, inode and socket kinds but not this one; this is its BTF map
/// definition (the layout aya's `btf_map_def!` gives the others: the loader
/// reads type, key, value, entries and flags from these members' BTF).
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: placeholders the loader reads from BTF; never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        TaskStorage {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
        }
    }

    /// The current task's value, zeroed and created first if `create`.
    /// `None`: none yet (or, with `create`, no memory, or the storage busy
    /// on this CPU under a nested program).
    #[inline(always)]
    pub fn current(&self, create: bool) -> Option<*mut T> {
        let flags = if create { BPF_LOCAL_STORAGE_GET_F_CREATE as u64 } else { 0 };
        // SAFETY: the helper takes the map and a trusted task pointer.
        let p = unsafe {
            bpf_task_storage_get(
                self as *const Self as *mut c_void,
                bpf_get_current_task_btf(),
                ptr::null_mut(),
                flags,
            )
        };
        (!p.is_null()).then_some(p as *mut T)
    }
}

/// Per CPU, the fault state of the thread running there that opened a
/// fault (see `OpenFault`): the fault path's programs read it with no
/// helper call. One entry per CPU.
#[map]
pub static OPEN: PerCpuArray<OpenFault> = PerCpuArray::with_max_entries(1, 0);

/// Per (process, page) bucket, the write-protect fault last seen there:
/// what splits spurious faults into stale TLB and race (see `WpPage`).
/// A plain array, shared by all CPUs: the bucket a write-protect fault
/// writes is read by another thread's spurious fault on another CPU.
#[map]
pub static WP_PAGES: Array<WpPage> = Array::with_max_entries(WP_PAGE_BUCKETS, 0);

/// Per-thread fault state, in the task itself, for a thread switched out
/// with a fault or an exception record open in `OPEN` (a fault that
/// sleeps: the page lock, I/O, userfaultfd, an mmap_lock retry). No table
/// to fill; a thread that dies takes its state with it.
#[btf_map]
pub static THREADS: TaskStorage<ThreadFault> = TaskStorage::new();

/// The aggregates: per (tgid, phase, set of classes) count and latency
/// histogram (see `ClassSetKey`). User space may resize it before load.
#[map]
pub static STATS: PerCpuHashMap<ClassSetKey, Stat> = PerCpuHashMap::with_max_entries(2048, 0);

/// The per-CPU cache in front of `STATS` (see `faultscope_common::pending`):
/// `PENDING_SLOTS` slots per CPU, flushed into `STATS` when another key
/// takes the slot over.
#[map]
pub static PENDING_STATS: PerCpuArray<PendingStat> = PerCpuArray::with_max_entries(PENDING_SLOTS, 0);

/// The same in front of `MAPPINGS`.
#[map]
pub static PENDING_MAPPINGS: PerCpuArray<PendingMapping> = PerCpuArray::with_max_entries(PENDING_SLOTS, 0);

/// Per CPU, the flushes of its pending slots into the hash maps, twice
/// each: odd while one runs (the readers' seqlock); and the faults the
/// flushes carried (see `faultscope_common::pending::FLUSHED_FAULTS`).
#[map]
pub static FLUSHES: PerCpuArray<u64> = PerCpuArray::with_max_entries(FLUSH_COUNTERS, 0);

/// A zeroed `Stat` to insert from: a `Stat` does not fit on the BPF stack.
#[map]
pub static ZERO: PerCpuArray<Stat> = PerCpuArray::with_max_entries(1, 0);

/// The count of phase changes (see `phase_id`): one u64, added to
/// atomically by the programs that start a phase and by user space's marks
/// (it maps the array into its memory: `BPF_F_MMAPABLE`).
#[map]
pub static PHASE: Array<u64> = Array::with_max_entries(1, BPF_F_MMAPABLE);

/// Children of traced processes that still share their memory (forked, not
/// yet exited or exec'd): child pid -> parent tgid.
#[map]
pub static CHILDREN: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// The cgroup filter (`serve --cgroup`): cgroup v2 id -> user space's
/// index of that cgroup. Read only when `CGROUP_FILTER` is set. User space
/// sizes it at load.
#[map]
pub static CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(1, 0);

/// The comm filter (`serve --comm`): the comm (NUL-padded, as
/// `bpf_get_current_comm` gives it) -> 0. Read only at exec, when
/// `COMM_FILTER` is set. User space sizes it at load.
#[map]
pub static COMMS: HashMap<[u8; 16], u32> = HashMap::with_max_entries(1, 0);

/// What the programs record (see `Config`): one value, read once per run.
#[map]
pub static CONFIG: Array<ConfigValues> = Array::with_max_entries(1, 0);

/// Counters of things the kernel side could not record (see `DropKind`).
#[map]
pub static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DropKind::COUNT as u32, 0);

/// Attribution by mapping: per (tgid, phase, VMA start) a counter per
/// class. User space may resize it before load.
#[map]
pub static MAPPINGS: PerCpuHashMap<MappingKey, ClassCounts> = PerCpuHashMap::with_max_entries(4096, 0);

/// What names each counted mapping without `/proc/PID/maps` (see
/// `VmaInfo`): written the first time a mapping is counted on a CPU. LRU:
/// never full; user space copies it every tick, so an entry evicted
/// before it was read is all that can be lost. Bound: `VMAS_ENTRIES`.
#[map]
pub static VMAS: LruHashMap<VmaKey, VmaInfo> = LruHashMap::with_max_entries(VMAS_ENTRIES, 0);

/// A `VmaInfo` to fill in place: it does not fit on the BPF stack beside
/// the callers' frames. One entry per CPU.
#[map]
pub static VMA_SCRATCH: PerCpuArray<VmaInfo> = PerCpuArray::with_max_entries(1, 0);

/// The exception tracepoint's per-CPU cache of the last VMA it found (see
/// `LastVma`). One entry per CPU.
#[map]
pub static LAST_VMA: PerCpuArray<LastVma> = PerCpuArray::with_max_entries(1, 0);

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

/// The kernel's own fault counts (`min_flt`, `maj_flt`) of the threads of
/// a traced process that exited while it was counted, added up at each
/// thread's exit: with the count at the start (the `Exec` event, or
/// `/proc` at attach) it brackets what the kernel accounted to the process
/// over the run. User space takes an entry at the process's `Exit`. As
/// large as `TARGETS`.
#[map]
pub static EXITED: HashMap<u32, FltCount> = HashMap::with_max_entries(4096, 0);

/// Process lifecycle events for user space.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// cgroup v2 directories made (`CgroupDir`, 528 bytes each: about 120
/// between two reads of user space before one is lost, counted in
/// `DROPS`).
#[map]
pub static CGROUP_DIRS: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

// ---- configuration, set by user space at load time ------------------------
// Tracepoint field offsets are read from tracefs `format` files at start-up,
// so that no kernel's layout is compiled in; these are x86-64's, used only
// when the format cannot be read (user space says so on stderr).

#[no_mangle]
pub static PF_ADDRESS_OFF: u32 = 8;
#[no_mangle]
pub static PF_ERROR_CODE_OFF: u32 = 24;
#[no_mangle]
pub static PF_IP_OFF: u32 = 16;
#[no_mangle]
pub static NEWTASK_PID_OFF: u32 = 8;
#[no_mangle]
pub static NEWTASK_CLONE_FLAGS_OFF: u32 = 32;
#[no_mangle]
pub static MKDIR_ROOT_OFF: u32 = 8;
#[no_mangle]
pub static MKDIR_ID_OFF: u32 = 16;
#[no_mangle]
pub static MKDIR_PATH_OFF: u32 = 24;
/// Where a large folio keeps its order (the low byte of `folio._flags_1`,
/// 6.1's `folio._folio_order`), and the `PG_head` bit of its flags that
/// says it is large, from the running kernel's BTF. `FOLIO_ORDER_OFF` 0:
/// not found there, and no fault's folio order is read.
#[no_mangle]
pub static FOLIO_ORDER_OFF: u32 = 0;
#[no_mangle]
pub static FOLIO_HEAD_BIT: u32 = 0;

/// `vm_area_struct.vm_start`, from the running kernel's BTF (0 on current
/// kernels); per-mapping counting is off when BTF does not have it.
#[no_mangle]
pub static VMA_START_OFF: u32 = 0;

/// Where a VMA's description is (`VmaInfo`), from BTF: the VMA's end, page
/// offset, flags and file; the file's dentry (`f_path.dentry`) and inode;
/// the inode's number and superblock; the superblock's `s_dev`; the
/// dentry's name pointer (`d_name.name`). `VMA_DESCRIBED` is non-zero only
/// when user space found them all.
#[no_mangle]
pub static VMA_DESCRIBED: u32 = 0;
#[no_mangle]
pub static VMA_END_OFF: u32 = 0;
#[no_mangle]
pub static VMA_PGOFF_OFF: u32 = 0;
#[no_mangle]
pub static VMA_FLAGS_OFF: u32 = 0;
#[no_mangle]
pub static VMA_FILE_OFF: u32 = 0;
#[no_mangle]
pub static FILE_DENTRY_OFF: u32 = 0;
#[no_mangle]
pub static FILE_INODE_OFF: u32 = 0;
#[no_mangle]
pub static INODE_INO_OFF: u32 = 0;
#[no_mangle]
pub static INODE_SB_OFF: u32 = 0;
#[no_mangle]
pub static SB_DEV_OFF: u32 = 0;
#[no_mangle]
pub static DENTRY_NAME_OFF: u32 = 0;
/// `task_struct.mm` and `mm_struct.mm_lock_seq` (0: the kernel has no
/// write sequence, and `LAST_VMA` holds until the process or range changes).
#[no_mangle]
pub static TASK_MM_OFF: u32 = 0;
#[no_mangle]
pub static MM_LOCK_SEQ_OFF: u32 = 0;

/// Non-zero: a task of a cgroup in `CGROUPS` that is not traced joins the
/// traced set at its first event (see `helpers::adopt`). A load-time
/// constant, so that without the filter no program pays for it.
#[no_mangle]
pub static CGROUP_FILTER: u32 = 0;

/// Non-zero: every process on the host is counted (`-a`), with no
/// `TARGETS` lookup; no lifecycle phase starts (a fork anywhere would start
/// one for every process), and each process's exit is told to user space
/// with its threads' final counts (`EXITED`). A load-time constant.
#[no_mangle]
pub static TRACE_ALL: u32 = 0;

/// Non-zero: a program whose comm is in `COMMS` joins the traced set at its
/// exec (see `lifecycle::process_exec`).
#[no_mangle]
pub static COMM_FILTER: u32 = 0;

/// Non-zero: exit-only mode (x86 with fexit on `handle_mm_fault`): the
/// exception tracepoints open each fault, the fexit reads the call's
/// arguments and closes it, and no entry program runs (one program less
/// on every fault). A load-time constant.
#[no_mangle]
pub static EXIT_ONLY: u32 = 0;

/// Non-zero: an exec in a traced process starts a phase (serve: the new
/// program's faults are its own phase kind's, not the old program's).
#[no_mangle]
pub static EXEC_PHASE: u32 = 0;

// How `sched_process_exit` tells the last thread of a process (see
// lifecycle.rs): the tracepoint's `group_dead` field where the kernel has it
// (0: it has not), else `current->signal->live` at these BTF offsets (0:
// unknown), else the thread-group leader's exit.
#[no_mangle]
pub static EXIT_GROUP_DEAD_OFF: u32 = 0;
#[no_mangle]
pub static TASK_SIGNAL_OFF: u32 = 0;
/// `task_struct.pid`, from BTF: the child's pid of `task_newtask`'s tp_btf
/// twin (0: unknown, its read fails).
#[no_mangle]
pub static TASK_PID_OFF: u32 = 0;
/// `cgroup.root`, `cgroup_root.hierarchy_id`, `cgroup.kn` and
/// `kernfs_node.id`, from BTF: what `cgroup_mkdir`'s tp_btf twin reads of
/// its cgroup (0: unknown, its reads fail).
#[no_mangle]
pub static CGROUP_ROOT_OFF: u32 = 0;
#[no_mangle]
pub static ROOT_HIERARCHY_ID_OFF: u32 = 0;
#[no_mangle]
pub static CGROUP_KN_OFF: u32 = 0;
#[no_mangle]
pub static KERNFS_ID_OFF: u32 = 0;

/// `task_struct.min_flt` and `maj_flt`, from BTF (0: unknown, the kernel
/// check is then not made).
#[no_mangle]
pub static TASK_MIN_FLT_OFF: u32 = 0;
#[no_mangle]
pub static TASK_MAJ_FLT_OFF: u32 = 0;
#[no_mangle]
pub static SIGNAL_LIVE_OFF: u32 = 0;

/// `task_struct.pagefault_disabled`, from BTF (0: unknown, every
/// kernel-mode fault is counted).
#[no_mangle]
pub static TASK_PAGEFAULT_DISABLED_OFF: u32 = 0;

/// A load-time global, read so that the compiler cannot fold the default in.
#[inline(always)]
pub fn cfg(v: &'static u32) -> usize {
    unsafe { core::ptr::read_volatile(v) as usize }
}

/// `CONFIG`, read once by a program run.
#[derive(Clone, Copy)]
pub struct Conf(ConfigValues);

impl Conf {
    #[inline(always)]
    pub fn load() -> Conf {
        Conf(CONFIG.get(0).copied().unwrap_or([0; Config::COUNT]))
    }

    /// An entry (0 when unset).
    #[inline(always)]
    pub fn get(&self, c: Config) -> u32 {
        self.0[c.index() as usize]
    }
}
