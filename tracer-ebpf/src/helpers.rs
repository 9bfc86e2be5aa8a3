//! What every program shares: the current task, the traced-set filter, the
//! phase, accounting into `STATS`, per-thread state, drop counters, and
//! context reads that count their failures.
//!
//! `record` is this file's one non-inlined function (attrib.rs has three
//! more, vma.rs three, exception.rs one). Each is a static BPF subprogram:
//! one copy of its instructions per program rather than one per call site,
//! and a frame of its own on the verifier's stack bound (512 bytes for the
//! frames of a call chain together). The verifier still walks a static
//! subprogram at each call, in its caller's state, as it walks inlined code.

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_kernel, generated::bpf_get_current_task_btf,
    },
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{
        tracing::StackIdContext, FEntryContext, FExitContext, ProbeContext, RetProbeContext,
        TracePointContext,
    },
};
use faultscope_common::{
    class::ClassSet,
    fault::{WpPage, NO_GEN, SEEN_EXC, SEEN_IN_FAULT},
    maps::{
        phase_id, ClassSetKey, DropKind, FltCount, LifeEvent, LifeKind, PhaseId, TargetInfo, UntracedNote,
        ADOPT_AT_EXEC, ADOPT_BY_COMM, TARGET_PENDING_EXEC,
    },
    pending::{self, PendingStat, Slot, FLUSHED_FAULTS, FLUSH_GENERATION, LOST_FAULTS},
    ThreadFault,
};

use crate::maps::{
    cfg, Conf, CGROUPS, CGROUP_FILTER, CHILDREN, COMMS, COMM_FILTER, DROPS, EVENTS, FLUSHES, OPEN,
    PENDING_STATS, PHASE, STATS, TARGETS, TARGETS_EPOCH, TASK_MAJ_FLT_OFF, TASK_MIN_FLT_OFF,
    TASK_PAGEFAULT_DISABLED_OFF, THREADS, TRACE_ALL, UNTRACED, WP_PAGES, ZERO,
};

pub const BPF_ANY: u64 = 0;
pub const BPF_NOEXIST: u64 = 1;

/// A program's only failure: a context read failed (already counted in
/// `DROPS`); the event is left unclassified.
pub struct ReadFailed;

/// Counts one event lost for reason `d`.
#[inline(always)]
pub fn drop_count(d: DropKind) {
    if let Some(p) = DROPS.get_ptr_mut(d.index()) {
        unsafe { *p += 1 };
    }
}

/// A failed context read: counted, and the error to return.
#[inline(always)]
pub fn read_failed() -> ReadFailed {
    drop_count(DropKind::ReadFailed);
    ReadFailed
}

/// The context of a program on a kernel function, whichever way it is
/// attached: a kprobe reads the arguments from `pt_regs`, its fentry twin
/// from the trampoline's argument array. The same code runs on both.
pub trait FnContext: StackIdContext {
    /// Argument `n` of the probed function, or a counted failure.
    fn arg(&self, n: usize) -> Result<u64, ReadFailed>;

    /// The return address into the probed function's caller, where the
    /// kernel's own stack of this program lacks it (see
    /// `StackKey::kernel_caller`); 0 where it has it or none is known.
    #[inline(always)]
    fn entry_caller(&self, _conf: &Conf) -> u64 {
        0
    }

    /// The u64 at `ptr + off` in kernel memory, `ptr` being a pointer
    /// argument: a checked copy from a kprobe, a plain load from fentry,
    /// whose BTF-typed arguments the verifier lets it read (a fault there
    /// reads 0, as a failed copy would be counted).
    fn read_at(&self, ptr: u64, off: u64) -> Result<u64, ReadFailed> {
        let p = (ptr + off) as *const u64;
        unsafe { bpf_probe_read_kernel(p) }.map_err(|_| read_failed())
    }
}

impl FnContext for ProbeContext {
    #[inline(always)]
    fn arg(&self, n: usize) -> Result<u64, ReadFailed> {
        ProbeContext::arg(self, n).ok_or_else(read_failed)
    }

    /// The link register at the probed function's entry: arm64's unwinder
    /// leaves the direct caller out at a kprobe. Read only when kernel
    /// stacks are asked for; 0 when the read fails (the stack then lacks
    /// that frame, as the kernel's own does).
    #[inline(always)]
    fn entry_caller(&self, conf: &Conf) -> u64 {
        #[cfg(bpf_target_arch = "aarch64")]
        {
            use faultscope_common::{attrib::PT_REGS_LR_AARCH64, maps::Config};

            if conf.get(Config::KernelStackClasses) == 0 {
                return 0;
            }
            let p = (self.regs as u64 + PT_REGS_LR_AARCH64) as *const u64;
            unsafe { bpf_probe_read_kernel(p) }.unwrap_or(0)
        }
        #[cfg(not(bpf_target_arch = "aarch64"))]
        {
            let _ = conf;
            0
        }
    }
}

impl FnContext for RetProbeContext {
    #[inline(always)]
    fn arg(&self, _n: usize) -> Result<u64, ReadFailed> {
        // A kretprobe's registers are those at the return.
        Err(read_failed())
    }
}

impl FnContext for FEntryContext {
    #[inline(always)]
    fn arg(&self, n: usize) -> Result<u64, ReadFailed> {
        Ok(FEntryContext::arg(self, n))
    }

    #[inline(always)]
    fn read_at(&self, ptr: u64, off: u64) -> Result<u64, ReadFailed> {
        Ok(unsafe { core::ptr::read_volatile((ptr as *const u8).wrapping_add(off as usize) as *const u64) })
    }
}

impl FnContext for FExitContext {
    #[inline(always)]
    fn arg(&self, n: usize) -> Result<u64, ReadFailed> {
        Ok(FExitContext::arg(self, n))
    }

    /// As from fentry: fexit's arguments are BTF-typed too.
    #[inline(always)]
    fn read_at(&self, ptr: u64, off: u64) -> Result<u64, ReadFailed> {
        Ok(unsafe { core::ptr::read_volatile((ptr as *const u8).wrapping_add(off as usize) as *const u64) })
    }
}

/// The `T` at kernel pointer `base` plus the load-time BTF offset `off` (0:
/// unknown), or a counted failure.
#[inline(always)]
pub fn kernel_read<T>(base: u64, off: &'static u32) -> Result<T, ReadFailed> {
    let off = crate::maps::cfg(off) as u64;
    if off == 0 || base == 0 {
        return Err(read_failed());
    }
    unsafe { bpf_probe_read_kernel((base + off) as *const T) }.map_err(|_| read_failed())
}

/// A tracepoint field at `off`, or a counted failure.
#[inline(always)]
pub fn field<T>(ctx: &TracePointContext, off: usize) -> Result<T, ReadFailed> {
    unsafe { ctx.read_at(off) }.map_err(|_| read_failed())
}

#[inline(always)]
pub fn pid_tgid() -> (u32, u32) {
    let v = current_id();
    (v as u32, tgid_of(v))
}

/// The current thread's id as `bpf_get_current_pid_tgid` gives it: its pid
/// in the low half, its process's (tgid) in the high one.
#[inline(always)]
pub fn current_id() -> u64 {
    bpf_get_current_pid_tgid()
}

#[inline(always)]
pub fn tgid_of(id: u64) -> u32 {
    (id >> 32) as u32
}

/// The current thread's own fault count, read from its `task_struct`
/// (BTF offsets from user space; zero when they are unknown). A direct
/// load through the task's BTF pointer, not a probe-read helper, so that
/// it also runs where lockdown refuses those.
#[inline(always)]
pub fn current_flt() -> FltCount {
    let (min, maj) = (cfg(&TASK_MIN_FLT_OFF), cfg(&TASK_MAJ_FLT_OFF));
    if min == 0 || maj == 0 {
        return FltCount::default();
    }
    // SAFETY: the helper returns the current task, which BTF types; the
    // verifier checks the offsets against task_struct.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    unsafe {
        FltCount {
            min: core::ptr::read_volatile(task.wrapping_add(min) as *const u64),
            maj: core::ptr::read_volatile(task.wrapping_add(maj) as *const u64),
        }
    }
}

/// Whether the current task runs with page faults disabled (a `*_nofault`
/// copy: a BPF stack walk or probe read, faultscope's own among them). The
/// kernel never handles such a fault (`do_user_addr_fault` fixes it up at
/// once) nor counts it, so neither does faultscope. False where BTF does not
/// give the offset.
#[inline(always)]
pub fn pagefault_disabled() -> bool {
    let off = cfg(&TASK_PAGEFAULT_DISABLED_OFF);
    if off == 0 {
        return false;
    }
    // SAFETY: as in `current_flt`: the current task, typed by BTF, at an
    // offset the verifier checks against task_struct.
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    unsafe { core::ptr::read_volatile(task.wrapping_add(off) as *const i32) != 0 }
}

/// `*p += v`, atomically (BPF_XADD): core offers no atomic read-modify-write
/// on BPF.
#[inline(always)]
pub fn atomic_add(p: *mut u64, v: u64) {
    unsafe { core::arch::asm!("lock *(u64 *)({p} + 0) += {v}", p = in(reg) p, v = in(reg) v) };
}

/// Sends a lifecycle event to user space, with the current thread's fault
/// count (counted in `DROPS` when the ring is full).
#[inline(always)]
pub fn send(kind: LifeKind, tgid: u32, pid: u32, aux: u32, phase: PhaseId) {
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
                flt: current_flt(),
                cgroup: unsafe { bpf_get_current_cgroup_id() },
            });
            e.submit(0);
        }
        None => drop_count(DropKind::EventsFull),
    }
}

/// With the cgroup filter on (`CGROUP_FILTER`, a load-time constant: off,
/// this is no code), a process of a filtered cgroup that is not a child
/// sharing a traced parent's memory joins the traced set; the program that
/// inserts it tells user space (`Adopt`). For an untraced task the filter
/// costs the cgroup id and one `CGROUPS` lookup.
#[inline(always)]
pub fn adopt(tgid: u32) -> Option<TargetInfo> {
    adopt_by_cgroup(tgid, 0)
}

/// [`adopt`], telling user space `flags` (`ADOPT_AT_EXEC`) with the index.
#[inline(always)]
pub fn adopt_by_cgroup(tgid: u32, flags: u32) -> Option<TargetInfo> {
    if cfg(&CGROUP_FILTER) == 0 {
        return None;
    }
    let cg = unsafe { bpf_get_current_cgroup_id() };
    let idx = *unsafe { CGROUPS.get(&cg) }?;
    if unsafe { CHILDREN.get(&tgid) }.is_some() {
        return None;
    }
    join(tgid, idx | flags)
}

/// With the comm filter on (`COMM_FILTER`), a program exec'd under a comm
/// of `COMMS` joins the traced set (called at its exec, where the comm is
/// the new program's).
#[inline(always)]
pub fn adopt_by_comm(tgid: u32) -> Option<TargetInfo> {
    if cfg(&COMM_FILTER) == 0 {
        return None;
    }
    let comm = bpf_get_current_comm().ok()?;
    unsafe { COMMS.get(&comm) }?;
    join(tgid, ADOPT_BY_COMM | ADOPT_AT_EXEC)
}

/// Inserts `tgid` into the traced set; the program that inserts it tells
/// user space (`Adopt`, with `aux`).
#[inline(always)]
fn join(tgid: u32, aux: u32) -> Option<TargetInfo> {
    let info = TargetInfo { flags: 0, _reserved: 0 };
    match TARGETS.insert(&tgid, &info, BPF_NOEXIST) {
        Ok(()) => {
            targets_changed();
            send(LifeKind::Adopt, tgid, tgid, aux, current_phase())
        }
        // Another CPU inserted it first (and told), or the map is full.
        Err(_) => {
            if unsafe { TARGETS.get(&tgid) }.is_none() {
                drop_count(DropKind::TargetsFull);
                return None;
            }
        }
    }
    Some(info)
}

/// The traced process the current task belongs to, if its faults count now
/// (adopting it first under the cgroup filter).
#[inline(always)]
pub fn counted_target(tgid: u32) -> Option<TargetInfo> {
    if cfg(&TRACE_ALL) != 0 {
        return Some(TargetInfo { flags: 0, _reserved: 0 });
    }
    let Some(t) = (unsafe { TARGETS.get(&tgid) }) else {
        return adopt(tgid);
    };
    if t.flags & TARGET_PENDING_EXEC != 0 {
        return None;
    }
    Some(*t)
}

/// The current phase (see `phase_id`).
#[inline(always)]
pub fn current_phase() -> PhaseId {
    phase_id(PHASE.get(0).copied().unwrap_or(0))
}

/// Starts a new phase on a lifecycle change; returns its id: the count
/// this change made (an atomic fetch-and-add), never another change's.
#[inline(always)]
pub fn bump_phase() -> PhaseId {
    match PHASE.get_ptr_mut(0) {
        Some(p) => phase_id(fetch_add(p, 1) + 1),
        None => 0,
    }
}

/// `*p += v`, atomically, returning the value before (BPF_FETCH, 5.12+).
#[inline(always)]
pub fn fetch_add(p: *mut u64, v: u64) -> u64 {
    let mut v = v;
    unsafe {
        core::arch::asm!("{v} = atomic_fetch_add((u64 *)({p} + 0), {v})", p = in(reg) p, v = inout(reg) v)
    };
    v
}

/// `ns` for classes that are only counted.
pub const UNTIMED: u64 = u64::MAX;

/// Runs `flush` between the two increments of this CPU's `FLUSHES` (see
/// `faultscope_common::pending`).
#[inline(always)]
pub fn flushing(flush: impl FnOnce()) {
    let gen = FLUSHES.get_ptr_mut(FLUSH_GENERATION);
    if let Some(g) = gen {
        unsafe { *g += 1 };
    }
    flush();
    if let Some(g) = gen {
        unsafe { *g += 1 };
    }
}

/// The entry of `key` in a per-CPU hash, inserted from `zero` if missing.
#[inline(always)]
pub fn entry<K, V>(map: &PerCpuHashMap<K, V>, zero: &PerCpuArray<V>, key: &K) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    if let Some(z) = zero.get_ptr(0) {
        // NOEXIST: another CPU may have inserted it meanwhile; fine.
        let _ = map.insert(key, unsafe { &*z }, BPF_NOEXIST);
    }
    map.get_ptr_mut(key)
}

/// This CPU's slot for `key` among `slots` (at `hash`'s two ways): the way
/// that holds it, else an empty one, else one taken over once `flush` has
/// moved its counts into their hash map. None when `flush` could not (the
/// map full): the slot keeps its counts, which user space may already have
/// read and served, and `key`'s event is the one lost.
#[inline(always)]
pub fn pending_slot<S: Slot>(
    slots: &PerCpuArray<S>,
    hash: u32,
    key: &S::Key,
    flush: impl FnOnce(&mut S) -> bool,
) -> Option<*mut S> {
    let (a, b) = pending::ways(hash);
    let pa = slots.get_ptr_mut(a)?;
    let pb = slots.get_ptr_mut(b)?;
    unsafe {
        if *(*pa).key() == *key {
            return Some(pa);
        }
        if *(*pb).key() == *key {
            return Some(pb);
        }
        let ((ta, fa), (tb, fb)) = (S::owner((*pa).key()), S::owner((*pb).key()));
        let v = if ta == 0 {
            pa
        } else if tb == 0 || pending::victim(fa, fb, S::owner(key).1) {
            pb
        } else {
            pa
        };
        let mut taken = true;
        flushing(|| {
            if S::owner((*v).key()).0 != 0 {
                taken = flush(&mut *v);
            }
            if taken {
                (*v).set_key(*key);
            }
        });
        taken.then_some(v)
    }
}

/// This CPU's pending slot for a `STATS` key.
#[inline(always)]
fn stat_slot(key: &ClassSetKey) -> Option<*mut PendingStat> {
    pending_slot(&PENDING_STATS, pending::stat_slot(key), key, |v| {
        let Some(dst) = entry(&STATS, &ZERO, &v.key) else { return false };
        flush_count(FLUSHED_FAULTS, pending::faults_of(v.key.set, v.stat.count));
        pending::drain_stat(unsafe { &mut *dst }, &mut v.stat);
        true
    })
}

/// Adds `n` to this CPU's `FLUSHES` counter `i`.
#[inline(always)]
fn flush_count(i: u32, n: u64) {
    if let Some(p) = FLUSHES.get_ptr_mut(i) {
        unsafe { *p += n };
    }
}

/// Counts one event of every class in `set` (one `STATS` entry per set:
/// see `ClassSetKey`), with its latency `ns` (or `UNTIMED`), in this CPU's
/// pending slot. Not inlined: one BPF subprogram (scalar arguments)
/// instead of a copy per call site keeps each program's code small.
/// `own_ns`: of `ns`, the time faultscope's nested programs took.
#[inline(never)]
pub fn record(tgid: u32, phase: PhaseId, set: u32, ns: u64, own_ns: u64) {
    if set == 0 {
        return;
    }
    let key = ClassSetKey { tgid, phase, set };
    match stat_slot(&key) {
        Some(s) if ns == UNTIMED => unsafe { (*s).stat.record(None) },
        Some(s) => unsafe { (*s).stat.record_timed(ns, own_ns) },
        None => {
            drop_count(DropKind::StatsFull);
            let faults = pending::faults_of(set, 1);
            flush_count(FLUSHED_FAULTS, faults);
            flush_count(LOST_FAULTS, faults);
        }
    }
}

/// Counts one event of the classes in `set`.
#[inline(always)]
pub fn record_set(tgid: u32, phase: PhaseId, set: ClassSet, ns: u64, own_ns: u64) {
    record(tgid, phase, set.0, ns, own_ns);
}

/// The generation of the bucket of thread `id`'s page `addr` in
/// `WP_PAGES` (see `WpPage`), or `NO_GEN`: the exception and the entry
/// note it where a write opens.
#[inline(always)]
pub fn wp_gen(id: u64, addr: u64) -> u64 {
    match WP_PAGES.get_ptr(WpPage::bucket(tgid_of(id), addr)) {
        Some(b) => unsafe { (*b).gen as u64 },
        None => NO_GEN,
    }
}

/// `TARGETS_EPOCH` as the caches hold it: never 0, which a new thread
/// state and an unused `UNTRACED` note hold.
#[inline(always)]
pub fn targets_epoch() -> u32 {
    (TARGETS_EPOCH.get(0).copied().unwrap_or(0) as u32).wrapping_add(1).max(1)
}

/// The epoch for a decision about to be taken from `TARGETS` and `CGROUPS`.
/// An arm64 CPU may take a later load before an earlier one: read as an
/// atomic (`LDADDAL`, acquire), no lookup after it can see the traced set
/// older than this epoch. x86 keeps loads in order.
#[inline(always)]
fn targets_epoch_acquire() -> u32 {
    #[cfg(bpf_target_arch = "aarch64")]
    if let Some(p) = TARGETS_EPOCH.get_ptr_mut(0) {
        return (fetch_add(p, 0) as u32).wrapping_add(1).max(1);
    }
    targets_epoch()
}

/// What identifies the current thread's `UNTRACED` note: its pid and tgid
/// (a new thread never shares both with a noted one while its note can
/// last), and, under the cgroup filter, its cgroup (a process moved into a
/// filtered cgroup is adopted at its next fault).
#[inline(always)]
fn untraced_key(id: u64, epoch: u32) -> UntracedNote {
    let cgroup = if cfg(&CGROUP_FILTER) != 0 { unsafe { bpf_get_current_cgroup_id() } } else { 0 };
    UntracedNote { pid_tgid: id, cgroup, epoch: epoch as u64 }
}

/// Whether this CPU's note says the current thread is not traced, at
/// `epoch` (the current one): then an opening program stops, without a
/// storage or `TARGETS` lookup.
#[inline(always)]
pub fn noted_untraced(id: u64, epoch: u32) -> bool {
    match UNTRACED.get_ptr(0) {
        Some(n) => unsafe { *n == untraced_key(id, epoch) },
        None => false,
    }
}

#[inline(always)]
fn note_untraced(id: u64, epoch: u32) {
    if let Some(n) = UNTRACED.get_ptr_mut(0) {
        unsafe { *n = untraced_key(id, epoch) };
    }
}

/// Moves `TARGETS_EPOCH` from a program that changed the traced set (an
/// insert, or a rewrite that starts a process's counting): no cache may
/// hold a decision taken before.
#[inline(always)]
pub fn targets_changed() {
    if let Some(p) = TARGETS_EPOCH.get_ptr_mut(0) {
        atomic_add(p, 1);
    }
}

/// The current thread's state, if its process is counted now, in this
/// CPU's `OPEN` slot (claimed for it). A thread found traced at the
/// current `TARGETS_EPOCH` is not looked up again: a traced thread's fault
/// reads its slot, no hash and no storage. A thread found untraced is noted
/// in this CPU's `UNTRACED`: the opening programs of its later faults here
/// stop at the note.
#[inline(always)]
pub fn traced_thread(id: u64) -> Option<*mut ThreadFault> {
    let epoch = targets_epoch();
    if noted_untraced(id, epoch) {
        return None;
    }
    traced_thread_not_noted(id, epoch)
}

/// [`traced_thread`] for a thread its caller found not noted untraced at
/// `epoch` (the current one).
#[inline(always)]
pub fn traced_thread_not_noted(id: u64, epoch: u32) -> Option<*mut ThreadFault> {
    // Raw pointers, null for none: the verifier refuses the spill of an
    // `Option`'s undefined payload that the compiler may emit.
    let held = held_state(id);
    if !held.is_null() && unsafe { (*held).traced } == epoch {
        return Some(held);
    }
    // Not held: the thread ran elsewhere since, and what it left open is
    // in its storage.
    let stored = if held.is_null() {
        THREADS.current(false).unwrap_or(core::ptr::null_mut())
    } else {
        core::ptr::null_mut()
    };
    if !stored.is_null() && unsafe { (*stored).traced } == epoch {
        return claim(id, stored);
    }
    // Read before the lookup: a change after it moves the epoch.
    let epoch = targets_epoch_acquire();
    if counted_target(tgid_of(id)).is_none() {
        note_untraced(id, epoch);
        return None;
    }
    let s = if held.is_null() { claim(id, stored)? } else { held };
    unsafe { (*s).traced = epoch };
    Some(s)
}

/// The current thread's state in this CPU's `OPEN` slot if it holds it,
/// else null. A raw pointer, not an `Option`: the compiler may read a
/// `None`'s undefined payload back from the stack before it chooses null,
/// which older verifiers (6.1) refuse.
#[inline(always)]
fn held_state(id: u64) -> *mut ThreadFault {
    match OPEN.get_ptr_mut(0) {
        // SAFETY: this CPU's entry; programs on one CPU do not interleave
        // on it (a fault's programs run with the thread on the CPU).
        Some(o) if unsafe { (*o).owner == id } => unsafe { core::ptr::addr_of_mut!((*o).fault) },
        _ => core::ptr::null_mut(),
    }
}

/// Makes the current thread (`id`) the owner of this CPU's `OPEN` slot,
/// with the state it left in its storage (`stored`, then marked empty
/// there: the slot holds it now) or, if null, a new one. The slot is free:
/// its last owner's state left with it at the switch (`spill`).
#[inline(always)]
fn claim(id: u64, stored: *mut ThreadFault) -> Option<*mut ThreadFault> {
    let o = OPEN.get_ptr_mut(0)?;
    unsafe {
        if stored.is_null() {
            (*o).fault = ThreadFault::default();
        } else {
            (*o).fault = *stored;
            (*stored).seen = 0;
        }
        (*o).owner = id;
        Some(core::ptr::addr_of_mut!((*o).fault))
    }
}

/// Whether the fault opening now is timed, under `Config::LatencyEvery`
/// (`every`): 0 none, 1 all, N one in N of the faults opened on this CPU
/// (a countdown in its slot: no division, no shared counter).
#[inline(always)]
pub fn timed_fault(every: u32) -> bool {
    if every <= 1 {
        return every == 1;
    }
    let Some(o) = OPEN.get_ptr_mut(0) else {
        return false;
    };
    unsafe {
        if (*o).countdown == 0 {
            (*o).countdown = every as u64 - 1;
            true
        } else {
            (*o).countdown -= 1;
            false
        }
    }
}

/// The current thread's fault state, if it has one (else null): in this
/// CPU's slot, else in its storage (a fault that slept, switched out, and
/// resumed here or on another CPU). A thread this CPU noted untraced has
/// none that counts, and skips the storage lookup (about 120
/// instructions). Raw pointers, null for none, as in
/// [`traced_thread_not_noted`].
#[inline(always)]
pub fn thread_state_if_any(id: u64) -> *mut ThreadFault {
    fault_state(id, false)
}

/// [`thread_state_if_any`]; with `open`, for a traced thread with no
/// fault open, its state to open one in (exit-only mode: a call no
/// exception opened). An untraced thread stops at its note either way.
#[inline(always)]
pub fn fault_state(id: u64, open: bool) -> *mut ThreadFault {
    let null = core::ptr::null_mut();
    let held = held_state(id);
    if !held.is_null() {
        if !open || unsafe { (*held).in_fault() } {
            return held;
        }
        return traced_thread_not_noted(id, targets_epoch()).unwrap_or(null);
    }
    // Read only past the slot: a traced fault's marks and return stop there.
    let epoch = targets_epoch();
    if noted_untraced(id, epoch) {
        return null;
    }
    let stored = THREADS.current(false).unwrap_or(null);
    if !open || (!stored.is_null() && unsafe { (*stored).in_fault() }) {
        return stored;
    }
    traced_thread_not_noted(id, epoch).unwrap_or(null)
}

/// Frees this CPU's `OPEN` slot if thread `id` holds it: at the thread's
/// exit, so that a later task given the same pid and tgid does not find
/// it (tracepoint mode has no `sched_switch` to free it).
#[inline(always)]
pub fn release_slot(id: u64) {
    if let Some(o) = OPEN.get_ptr_mut(0) {
        unsafe {
            if (*o).owner == id {
                (*o).owner = 0;
            }
        }
    }
}

/// At a context switch (`current` is the thread switched out): a thread
/// that holds this CPU's `OPEN` slot with a fault or an exception record
/// open takes its state to its storage; the slot is freed either way, so
/// that the next thread here finds it free.
#[inline(always)]
pub fn spill() {
    let Some(o) = OPEN.get_ptr_mut(0) else {
        return;
    };
    let id = current_id();
    unsafe {
        // The idle task's id is 0, which is also "no owner".
        if (*o).owner != id || id == 0 {
            return;
        }
        (*o).owner = 0;
        if (*o).fault.seen & (SEEN_IN_FAULT | SEEN_EXC) == 0 {
            return;
        }
        match THREADS.current(true) {
            Some(s) => *s = (*o).fault,
            None => drop_count(DropKind::ThreadStateFailed),
        }
    }
}
