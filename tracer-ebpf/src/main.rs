//! faultscope's eBPF programs: one small program per concern.
//!
//! Data flow: probes -> per-thread state (`THREADS`) -> per-CPU aggregates
//! (`STATS`, keyed by process, phase and class). Nothing is sent to user space
//! per fault; only process lifecycle events go through the `EVENTS` ring.
//!
//! Every program filters on the traced set (`TARGETS`, keyed by tgid) first,
//! or, inside a fault, on the thread state that only traced user faults
//! create, so untraced processes pay one hash lookup.
#![no_std]
#![no_main]
// Inline asm on BPF, for the one atomic add (core has no atomic RMW there).
#![feature(asm_experimental_arch)]

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{kprobe, kretprobe, map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use aya_log_ebpf::debug;
use faultscope_common::{
    class::{Class, ClassSet},
    fault::{
        classify_x86_error_code, ExcArch, ThreadFault, FAULT_FLAG_USER, SEEN_ACCESS, SEEN_DIRTY_SHARED,
        SEEN_HUGE_WP, SEEN_NEW_ANON, SEEN_WP,
    },
    maps::{
        phase_id, LifeEvent, LifeKind, Stat, StatKey, TargetInfo, CONFIG_EXCEPTIONS, CONFIG_TP_CLASSES,
        DROP_EVENTS_FULL, DROP_LOST_RETURN, DROP_STATS_FULL, DROP_TARGETS_FULL, DROP_THREADS_FULL, NCONFIG,
        NDROPS, PHASE_LIFECYCLE, PHASE_MARKS, TARGET_FOLLOW_CHILDREN, TARGET_PENDING_EXEC,
    },
};

const BPF_ANY: u64 = 0;
const BPF_NOEXIST: u64 = 1;
const CLONE_THREAD: u64 = 0x0001_0000;

// ---- maps ---------------------------------------------------------------

/// The traced set, keyed by tgid. Written by user space (-p, spawned command)
/// and by the fork program (children of followed processes).
#[map]
static TARGETS: HashMap<u32, TargetInfo> = HashMap::with_max_entries(4096, 0);

/// Per-thread fault state, keyed by tid. LRU so that threads that die in the
/// middle of a fault cannot leak entries.
#[map]
static THREADS: LruHashMap<u32, ThreadFault> = LruHashMap::with_max_entries(16384, 0);

/// The aggregates: per (tgid, phase, class) count and latency histogram.
/// User space may resize it before load.
#[map]
static STATS: PerCpuHashMap<StatKey, Stat> = PerCpuHashMap::with_max_entries(2048, 0);

/// A zeroed `Stat` to insert from: a `Stat` does not fit on the BPF stack.
#[map]
static ZERO: PerCpuArray<Stat> = PerCpuArray::with_max_entries(1, 0);

/// Phase counters: [PHASE_LIFECYCLE] bumped here on forks and child
/// exits/execs of traced processes, [PHASE_MARKS] written by user space.
#[map]
static PHASE: Array<u64> = Array::with_max_entries(2, 0);

/// Children of traced processes that still share their memory (forked, not
/// yet exited or exec'd): child pid -> parent tgid.
#[map]
static CHILDREN: HashMap<u32, u32> = HashMap::with_max_entries(4096, 0);

/// What the tracepoint records (see `CONFIG_TP_CLASSES`).
#[map]
static CONFIG: Array<u32> = Array::with_max_entries(NCONFIG, 0);

/// Counters of things the kernel side could not record (full maps).
#[map]
static DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(NDROPS, 0);

/// Process lifecycle events for user space.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

// ---- configuration, set by user space at load time ------------------------
// Tracepoint field offsets are read from tracefs `format` files at start-up,
// so that no kernel's layout is compiled in.

#[no_mangle]
static PF_ADDRESS_OFF: u32 = 8;
#[no_mangle]
static PF_ERROR_CODE_OFF: u32 = 24;
#[no_mangle]
static NEWTASK_PID_OFF: u32 = 8;
#[no_mangle]
static NEWTASK_CLONE_FLAGS_OFF: u32 = 32;

#[inline(always)]
fn cfg(v: &'static u32) -> usize {
    unsafe { core::ptr::read_volatile(v) as usize }
}

// ---- helpers --------------------------------------------------------------

#[inline(always)]
fn drop_count(idx: u32) {
    if let Some(p) = DROPS.get_ptr_mut(idx) {
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn pid_tgid() -> (u32, u32) {
    let v = bpf_get_current_pid_tgid();
    (v as u32, (v >> 32) as u32)
}

/// The traced process the current task belongs to, if its faults count now.
#[inline(always)]
fn counted_target(tgid: u32) -> Option<TargetInfo> {
    let t = unsafe { TARGETS.get(&tgid) }?;
    if t.flags & TARGET_PENDING_EXEC != 0 {
        return None;
    }
    Some(*t)
}

#[inline(always)]
fn phase_counter(idx: u32) -> u32 {
    PHASE.get(idx).copied().unwrap_or(0) as u32
}

/// The current phase (see `phase_id`).
#[inline(always)]
fn current_phase() -> u32 {
    phase_id(phase_counter(PHASE_LIFECYCLE), phase_counter(PHASE_MARKS))
}

/// Starts a new phase on a lifecycle change; returns its id.
#[inline(always)]
fn bump_phase() -> u32 {
    if let Some(p) = PHASE.get_ptr_mut(PHASE_LIFECYCLE) {
        // BPF_XADD: core offers no atomic read-modify-write on BPF. Two
        // changes on two CPUs at once may then read the same new value; the
        // phase is then shared, never lost.
        unsafe { core::arch::asm!("lock *(u64 *)({p} + 0) += {v}", p = in(reg) p, v = in(reg) 1u64) };
        return current_phase();
    }
    0
}

/// `ns` for classes that are only counted.
const UNTIMED: u64 = u64::MAX;

/// Not inlined: one BPF subprogram (four scalar arguments) instead of a copy
/// per call site keeps the verifier's work per program small.
#[inline(never)]
fn record(tgid: u32, phase: u32, class: u32, ns: u64) {
    let key = StatKey { tgid, phase: phase as u16, class: class as u16 };
    let mut p = STATS.get_ptr_mut(&key);
    if p.is_none() {
        if let Some(z) = ZERO.get_ptr(0) {
            // NOEXIST: another CPU may have inserted it meanwhile; fine.
            let _ = STATS.insert(&key, unsafe { &*z }, BPF_NOEXIST);
        }
        p = STATS.get_ptr_mut(&key);
    }
    match p {
        Some(s) => unsafe { (*s).record(if ns == UNTIMED { None } else { Some(ns) }) },
        None => drop_count(DROP_STATS_FULL),
    }
}

#[inline(always)]
fn record_set(tgid: u32, phase: u32, candidates: &[Class], set: ClassSet, ns: u64) {
    for &c in candidates {
        if set.has(c) {
            record(tgid, phase, c as u32, ns);
        }
    }
}

/// The thread's fault state, created on first use.
#[inline(always)]
fn thread_state(tid: u32) -> Option<*mut ThreadFault> {
    if let Some(p) = THREADS.get_ptr_mut(&tid) {
        return Some(p);
    }
    let fresh = ThreadFault::default();
    if THREADS.insert(&tid, &fresh, BPF_ANY).is_err() {
        drop_count(DROP_THREADS_FULL);
        return None;
    }
    THREADS.get_ptr_mut(&tid)
}

// ---- the exception: error code / ESR ---------------------------------------

/// x86 `exceptions:page_fault_user`: counts every user fault by error code
/// (the whole of the tracepoint-only mode), and remembers the error code so
/// that the kretprobe can tell a write to a present page (spurious rule).
#[tracepoint]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    let (tid, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return 0;
    }
    let code: u64 = unsafe { ctx.read_at(cfg(&PF_ERROR_CODE_OFF)) }.unwrap_or(0);
    // Only the classes the report takes from here (all of them without
    // kprobes, first_touch alone with them).
    let wanted = CONFIG.get(CONFIG_TP_CLASSES).copied().unwrap_or(0);
    let set = ClassSet(classify_x86_error_code(code).0 & wanted);
    if set.0 != 0 {
        record_set(tgid, current_phase(), &Class::ERROR_CODE, set, UNTIMED);
    }
    if CONFIG.get(CONFIG_EXCEPTIONS).copied().unwrap_or(0) != 0 {
        let addr: u64 = unsafe { ctx.read_at(cfg(&PF_ADDRESS_OFF)) }.unwrap_or(0);
        if let Some(s) = thread_state(tid) {
            unsafe { (*s).on_exception(ExcArch::X86, addr, code) };
        }
    }
    0
}

/// arm64 `do_mem_abort(far, esr, regs)`: no tracepoint carries the ESR there.
#[kprobe]
pub fn mem_abort(ctx: ProbeContext) -> u32 {
    let (tid, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return 0;
    }
    let far: u64 = ctx.arg(0).unwrap_or(0);
    let esr: u64 = ctx.arg(1).unwrap_or(0);
    if let Some(s) = thread_state(tid) {
        unsafe { (*s).on_exception(ExcArch::Arm64, far, esr) };
    }
    0
}

// ---- handle_mm_fault ----------------------------------------------------------

/// `handle_mm_fault(vma, address, flags, regs)` entry: user faults only
/// (`regs != NULL` and FAULT_FLAG_USER; GUP, KSM and iommu call it too).
#[kprobe]
pub fn fault_entry(ctx: ProbeContext) -> u32 {
    let flags: u64 = ctx.arg(2).unwrap_or(0);
    let regs: u64 = ctx.arg(3).unwrap_or(0);
    if regs == 0 || (flags as u32) & FAULT_FLAG_USER == 0 {
        return 0;
    }
    let (tid, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return 0;
    }
    let addr: u64 = ctx.arg(1).unwrap_or(0);
    if let Some(s) = thread_state(tid) {
        if unsafe { (*s).on_entry(bpf_ktime_get_ns(), addr, flags as u32) } {
            drop_count(DROP_LOST_RETURN);
        }
    }
    0
}

/// `handle_mm_fault` return: classify the fault and account its latency in
/// every class it falls in.
#[kretprobe]
pub fn fault_return(ctx: RetProbeContext) -> u32 {
    let (tid, tgid) = pid_tgid();
    let Some(s) = THREADS.get_ptr_mut(&tid) else {
        return 0;
    };
    let ret: u64 = ctx.ret();
    let now = unsafe { bpf_ktime_get_ns() };
    let st = unsafe { &mut *s };
    let Some(set) = st.on_return(ret as u32) else {
        return 0;
    };
    // The phase is read at return: a fault belongs to the phase it ends in.
    record_set(tgid, current_phase(), &Class::FAULT_RETURN, set, now.saturating_sub(st.start_ns));
    0
}

// ---- marks inside a fault -----------------------------------------------------

#[inline(always)]
fn mark(bit: u32) -> u32 {
    let (tid, _) = pid_tgid();
    if let Some(s) = THREADS.get_ptr_mut(&tid) {
        unsafe { (*s).mark(bit) };
    }
    0
}

/// `do_wp_page`: a write-protect fault on a present PTE.
#[kprobe]
pub fn wp_page(_ctx: ProbeContext) -> u32 {
    mark(SEEN_WP)
}

/// `do_huge_pmd_wp_page`: a write-protect fault on a PMD-mapped THP.
#[kprobe]
pub fn huge_pmd_wp(_ctx: ProbeContext) -> u32 {
    mark(SEEN_HUGE_WP)
}

/// `folio_add_new_anon_rmap`: a new anon folio was mapped; inside a
/// `do_wp_page` fault that is a COW copy.
#[kprobe]
pub fn new_anon_rmap(_ctx: ProbeContext) -> u32 {
    mark(SEEN_NEW_ANON)
}

/// `fault_dirty_shared_page`: the fault dirtied a shared mapping's page;
/// inside a `do_wp_page` fault that is write-notify (`wp_shared`), not COW.
#[kprobe]
pub fn dirty_shared(_ctx: ProbeContext) -> u32 {
    mark(SEEN_DIRTY_SHARED)
}

/// `ptep_set_access_flags` (x86) / `__ptep_set_access_flags` (arm64): the
/// present-entry tail of `handle_pte_fault`.
#[kprobe]
pub fn access_flags(_ctx: ProbeContext) -> u32 {
    mark(SEEN_ACCESS)
}

/// arm64 `contpte_ptep_set_access_flags`: the same for a contpte block.
#[kprobe]
pub fn access_flags_cont(_ctx: ProbeContext) -> u32 {
    mark(SEEN_ACCESS)
}

/// `huge_pmd_set_accessed`: the same for a PMD-mapped THP.
#[kprobe]
pub fn huge_accessed(_ctx: ProbeContext) -> u32 {
    mark(SEEN_ACCESS)
}

// ---- arm64 contpte ------------------------------------------------------------

#[inline(always)]
fn count_current(class: Class) -> u32 {
    let (_, tgid) = pid_tgid();
    if counted_target(tgid).is_some() {
        record(tgid, current_phase(), class as u32, UNTIMED);
    }
    0
}

/// `__contpte_try_unfold` (6.12 unfolds through it to change one PTE).
#[kprobe]
pub fn contpte_unfold(_ctx: ProbeContext) -> u32 {
    count_current(Class::ContpteTryUnfold)
}

/// arm64 PTE_CONT: the contiguous hint of a PTE.
const PTE_CONT: u64 = 1 << 52;

/// `contpte_convert(mm, addr, ptep, pte)`: a block is rewritten; `pte`
/// carries PTE_CONT when it is folded, not when it is unfolded.
#[kprobe]
pub fn contpte_convert(ctx: ProbeContext) -> u32 {
    let pte: u64 = ctx.arg(3).unwrap_or(0);
    count_current(Class::ContpteConvert);
    count_current(if pte & PTE_CONT != 0 { Class::ContpteFold } else { Class::ContpteUnfold })
}

/// `__contpte_try_fold`: an attempt to fold a block (most fail).
#[kprobe]
pub fn contpte_fold(_ctx: ProbeContext) -> u32 {
    count_current(Class::ContpteFoldAttempt)
}

// ---- process lifecycle --------------------------------------------------------

#[inline(always)]
fn send(kind: LifeKind, tgid: u32, pid: u32, aux: u32, phase: u32) {
    match EVENTS.reserve::<LifeEvent>(0) {
        Some(mut e) => {
            let comm = bpf_get_current_comm().unwrap_or([0; 16]);
            e.write(LifeEvent {
                ts_ns: unsafe { bpf_ktime_get_ns() },
                kind: kind as u32,
                tgid,
                pid,
                aux,
                phase,
                _pad: 0,
                comm,
            });
            e.submit(0);
        }
        None => drop_count(DROP_EVENTS_FULL),
    }
}

/// `task:task_newtask` (in the parent, before the child can run). Unlike
/// `sched_process_fork` it carries `clone_flags`, which tell a new process
/// from a new thread. A followed parent's child joins the traced set here, so
/// none of its faults is missed.
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let (_, tgid) = pid_tgid();
    let Some(t) = (unsafe { TARGETS.get(&tgid) }).copied() else {
        return 0;
    };
    let clone_flags: u64 = unsafe { ctx.read_at(cfg(&NEWTASK_CLONE_FLAGS_OFF)) }.unwrap_or(0);
    if clone_flags & CLONE_THREAD != 0 {
        return 0;
    }
    let child: i32 = unsafe { ctx.read_at(cfg(&NEWTASK_PID_OFF)) }.unwrap_or(0);
    let child = child as u32;
    let follow = t.flags & TARGET_FOLLOW_CHILDREN != 0;
    if follow {
        let info = TargetInfo { flags: t.flags & !TARGET_PENDING_EXEC, _reserved: 0 };
        if TARGETS.insert(&child, &info, BPF_ANY).is_err() {
            drop_count(DROP_TARGETS_FULL);
        }
    }
    if CHILDREN.insert(&child, &tgid, BPF_ANY).is_err() {
        drop_count(DROP_TARGETS_FULL);
    }
    let phase = bump_phase();
    debug!(&ctx, "traced process {} forked {}: phase {}", tgid, child, phase);
    send(LifeKind::Fork, tgid, child, follow as u32, phase);
    0
}

/// A child of a traced process stopped sharing its memory (exit or exec):
/// the parent's COW faults change nature, so a new phase starts.
#[inline(always)]
fn child_gone(kind: LifeKind, child: u32) {
    if let Some(parent) = unsafe { CHILDREN.get(&child) }.copied() {
        let _ = CHILDREN.remove(&child);
        let phase = bump_phase();
        send(kind, parent, child, 0, phase);
    }
}

/// `sched:sched_process_exec`: a command faultscope started begins to count
/// at its exec; other targets report their new comm; a child of a target
/// that execs ends its phase.
#[tracepoint]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    let (tid, tgid) = pid_tgid();
    child_gone(LifeKind::ChildExec, tgid);
    let Some(t) = TARGETS.get_ptr_mut(&tgid) else {
        return 0;
    };
    unsafe { (*t).flags &= !TARGET_PENDING_EXEC };
    send(LifeKind::Exec, tgid, tid, 0, current_phase());
    0
}

/// `sched:sched_process_exit`: the thread-group leader is exiting.
#[tracepoint]
pub fn process_exit(_ctx: TracePointContext) -> u32 {
    let (tid, tgid) = pid_tgid();
    if tid != tgid {
        return 0;
    }
    child_gone(LifeKind::ChildExit, tgid);
    if unsafe { TARGETS.get(&tgid) }.is_none() {
        return 0;
    }
    send(LifeKind::Exit, tgid, tid, 0, current_phase());
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
