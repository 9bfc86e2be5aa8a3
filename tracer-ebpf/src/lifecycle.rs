//! Process lifecycle of traced processes: fork (and following children into
//! the traced set), exec, exit, and the ring-buffer events that tell user
//! space about them; and the cgroups made, which name where they ran.
//!
//! These start the phases a fault is accounted to: a fork, a child's exit or
//! exec changes what the parent's COW faults mean.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel_str_bytes},
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use aya_log_ebpf::debug;
use faultscope_common::maps::{
    CgroupDir, DropKind, FltCount, LifeKind, TargetInfo, ADOPT_AT_EXEC, CGROUP_PATH_MAX,
    TARGET_FOLLOW_CHILDREN, TARGET_PENDING_EXEC,
};

use crate::{
    helpers::{
        adopt, adopt_by_cgroup, adopt_by_comm, atomic_add, bump_phase, current_flt, current_id,
        current_phase, drop_count, field, kernel_read, pid_tgid, release_slot, send, targets_changed,
        ReadFailed, BPF_ANY, BPF_NOEXIST,
    },
    maps::{
        cfg, CGROUP_DIRS, CGROUP_KN_OFF, CGROUP_ROOT_OFF, CHILDREN, EXEC_PHASE, EXITED, EXIT_GROUP_DEAD_OFF,
        KERNFS_ID_OFF, MKDIR_ID_OFF, MKDIR_PATH_OFF, MKDIR_ROOT_OFF, NEWTASK_CLONE_FLAGS_OFF,
        NEWTASK_PID_OFF, ROOT_HIERARCHY_ID_OFF, SIGNAL_LIVE_OFF, TARGETS, TASK_PID_OFF, TASK_SIGNAL_OFF,
        TRACE_ALL,
    },
};

const CLONE_THREAD: u64 = 0x0001_0000;

/// `task:task_newtask` (in the parent, before the child can run). Unlike
/// `sched_process_fork` it carries `clone_flags`, which tell a new process
/// from a new thread. A followed parent's child joins the traced set here, so
/// none of its faults is missed.
#[tracepoint]
pub fn task_newtask(ctx: TracePointContext) -> u32 {
    let clone_flags = || field(&ctx, cfg(&NEWTASK_CLONE_FLAGS_OFF));
    let child = || field::<i32>(&ctx, cfg(&NEWTASK_PID_OFF));
    try_task_newtask(&ctx, clone_flags, child).unwrap_or(0)
}

/// The same as a BTF tracepoint, `task_newtask(task, clone_flags)`: no
/// trace record built, and a tp_btf program detaches in a few
/// milliseconds where a classic one waits for a grace period. The child's
/// pid is read from its `task_struct` (`TASK_PID_OFF`, from BTF).
#[btf_tracepoint(function = "task_newtask")]
pub fn task_newtask_fe(ctx: BtfTracePointContext) -> u32 {
    let clone_flags = || Ok(ctx.arg::<u64>(1));
    let child = || task_pid(ctx.arg::<u64>(0));
    try_task_newtask(&ctx, clone_flags, child).unwrap_or(0)
}

/// The pid of the task at `task`.
#[inline(always)]
fn task_pid(task: u64) -> Result<i32, ReadFailed> {
    kernel_read(task, &TASK_PID_OFF)
}

/// `clone_flags` and `child` read the tracepoint's arguments, when needed.
#[inline(always)]
fn try_task_newtask<C: EbpfContext>(
    ctx: &C,
    clone_flags: impl FnOnce() -> Result<u64, ReadFailed>,
    child: impl FnOnce() -> Result<i32, ReadFailed>,
) -> Result<u32, ReadFailed> {
    let (_, tgid) = pid_tgid();
    // A process of a filtered cgroup whose first event is a fork joins here.
    let Some(t) = (unsafe { TARGETS.get(&tgid) }).copied().or_else(|| adopt(tgid)) else {
        return Ok(0);
    };
    if clone_flags()? & CLONE_THREAD != 0 {
        return Ok(0);
    }
    let child = child()? as u32;
    let follow = t.flags & TARGET_FOLLOW_CHILDREN != 0;
    if follow {
        let info = TargetInfo { flags: t.flags & !TARGET_PENDING_EXEC, _reserved: 0 };
        match TARGETS.insert(&child, &info, BPF_ANY) {
            Ok(()) => targets_changed(),
            Err(_) => drop_count(DropKind::TargetsFull),
        }
    }
    if CHILDREN.insert(&child, &tgid, BPF_ANY).is_err() {
        drop_count(DropKind::TargetsFull);
    }
    let phase = bump_phase();
    debug!(ctx, "traced process {} forked {}: phase {}", tgid, child, phase);
    send(LifeKind::Fork, tgid, child, follow as u32, phase);
    Ok(0)
}

/// A child of a traced process stopped sharing its memory (exit or exec):
/// the parent's COW faults change nature, so a new phase starts. Only the
/// program that removes the entry starts it, so that two threads of a child
/// seeing its end at once start one phase.
#[inline(always)]
fn child_gone(kind: LifeKind, child: u32) {
    if let Some(parent) = unsafe { CHILDREN.get(&child) }.copied() {
        if CHILDREN.remove(&child).is_ok() {
            let phase = bump_phase();
            send(kind, parent, child, 0, phase);
        }
    }
}

/// `sched:sched_process_exec`: a command faultscope started begins to count
/// at its exec; other targets report their new comm; a child of a target
/// that execs ends its phase.
#[tracepoint]
pub fn process_exec(_ctx: TracePointContext) -> u32 {
    try_process_exec().unwrap_or(0)
}

/// The same as a BTF tracepoint.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn process_exec_fe(_ctx: BtfTracePointContext) -> u32 {
    try_process_exec().unwrap_or(0)
}

#[inline(always)]
fn try_process_exec() -> Result<u32, ReadFailed> {
    let (tid, tgid) = pid_tgid();
    child_gone(LifeKind::ChildExec, tgid);
    let Some(t) = TARGETS.get_ptr_mut(&tgid) else {
        // A program exec'd in a filtered cgroup, or under a filtered comm,
        // joins at its exec (a child that execs no longer shares its
        // parent's memory: its own target).
        if adopt_by_cgroup(tgid, ADOPT_AT_EXEC).is_none() {
            adopt_by_comm(tgid);
        }
        return Ok(0);
    };
    let started = unsafe { (*t).flags } & TARGET_PENDING_EXEC != 0;
    unsafe { (*t).flags &= !TARGET_PENDING_EXEC };
    if started {
        targets_changed();
    }
    // A traced process that runs another program: with `EXEC_PHASE`, the
    // new program's faults are a phase of their own.
    let phase = if !started && cfg(&EXEC_PHASE) != 0 { bump_phase() } else { current_phase() };
    send(LifeKind::Exec, tgid, tid, 0, phase);
    Ok(0)
}

/// `sched:sched_process_exit`, run by every exiting thread: when the last
/// thread of a traced process (or of a child sharing its memory) exits, the
/// process is gone. It leaves the traced set here, in the kernel, so that a
/// new process that takes its pid is never counted as it; user space learns
/// of it from the `Exit` event.
#[tracepoint]
pub fn process_exit(ctx: TracePointContext) -> u32 {
    try_process_exit(|| field::<u8>(&ctx, cfg(&EXIT_GROUP_DEAD_OFF))).unwrap_or(0)
}

/// The same as a BTF tracepoint, `sched_process_exit(p[, group_dead])`:
/// `group_dead` is its second argument where the format has the field.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit_fe(ctx: BtfTracePointContext) -> u32 {
    try_process_exit(|| Ok(ctx.arg::<u64>(1) as u8)).unwrap_or(0)
}

/// Whether the exiting thread is the last of its process: the tracepoint's
/// `group_dead` (newer kernels), else `current->signal->live`, which `do_exit`
/// decrements before this tracepoint (it only reaches 0 once every thread
/// is exiting; two threads exiting at once may both read 0, which the
/// removals below make harmless), else, without BTF, the leader's exit.
/// `dead` reads the tracepoint's `group_dead`, read only where the kernel
/// has it (`EXIT_GROUP_DEAD_OFF`, a load-time constant: elsewhere the
/// verifier drops the read, which a tp_btf program could not make).
#[inline(always)]
fn group_dead(
    dead: impl FnOnce() -> Result<u8, ReadFailed>,
    tid: u32,
    tgid: u32,
) -> Result<bool, ReadFailed> {
    if cfg(&EXIT_GROUP_DEAD_OFF) != 0 {
        return Ok(dead()? != 0);
    }
    if cfg(&TASK_SIGNAL_OFF) != 0 {
        let signal: u64 = kernel_read(unsafe { bpf_get_current_task() }, &TASK_SIGNAL_OFF)?;
        let live: i32 = kernel_read(signal, &SIGNAL_LIVE_OFF)?;
        return Ok(live == 0);
    }
    Ok(tid == tgid)
}

/// Adds the exiting thread's own fault count to its process's `EXITED`
/// entry: it is final here (`exit_mm` is done, so no fault can follow).
#[inline(always)]
fn count_exited(tgid: u32) {
    let flt = current_flt();
    let mut p = EXITED.get_ptr_mut(&tgid);
    if p.is_none() {
        // Another thread's insert may come first: then add to it.
        let _ = EXITED.insert(&tgid, &FltCount::default(), BPF_NOEXIST);
        p = EXITED.get_ptr_mut(&tgid);
    }
    match p {
        Some(e) => unsafe {
            atomic_add(&mut (*e).min, flt.min);
            atomic_add(&mut (*e).maj, flt.maj);
        },
        None => drop_count(DropKind::ExitedFull),
    }
}

#[inline(always)]
fn try_process_exit(dead: impl FnOnce() -> Result<u8, ReadFailed>) -> Result<u32, ReadFailed> {
    // The slot is keyed by pid_tgid, which a later task may be given.
    release_slot(current_id());
    let (tid, tgid) = pid_tgid();
    let all = cfg(&TRACE_ALL) != 0;
    let info = if all { None } else { unsafe { TARGETS.get(&tgid) }.copied() };
    // Every thread of a counted process, and one that exits just after its
    // group's last (whose exit took the process out of TARGETS) while user
    // space has not taken the entry yet.
    let counted = all || info.is_some_and(|t| t.flags & TARGET_PENDING_EXEC == 0);
    if counted || unsafe { EXITED.get(&tgid) }.is_some() {
        count_exited(tgid);
    }
    let target = all || info.is_some();
    if !target && unsafe { CHILDREN.get(&tgid) }.is_none() {
        return Ok(0);
    }
    if !group_dead(dead, tid, tgid)? {
        return Ok(0);
    }
    if all {
        // Nothing to remove: every process is counted.
        send(LifeKind::Exit, tgid, tid, 0, current_phase());
        return Ok(0);
    }
    child_gone(LifeKind::ChildExit, tgid);
    if target && TARGETS.remove(&tgid).is_ok() {
        // No thread may keep "traced" for this tgid past its exit.
        targets_changed();
        send(LifeKind::Exit, tgid, tid, 0, current_phase());
    }
    Ok(0)
}

/// `cgroup:cgroup_mkdir`: each cgroup v2 directory made, with its id and
/// path, to user space (`CGROUP_DIRS`), which names the container of a
/// process from its id at exit even when the directory is gone by then.
/// v1 hierarchies (`root` non-zero) are skipped: ids are v2's.
#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    let root = || field::<i32>(&ctx, cfg(&MKDIR_ROOT_OFF));
    let id = || field::<u64>(&ctx, cfg(&MKDIR_ID_OFF));
    // `__data_loc`: the string's offset in the record (low half) and length.
    let path = || -> Result<*const u8, ReadFailed> {
        let loc: u32 = field(&ctx, cfg(&MKDIR_PATH_OFF))?;
        Ok((ctx.as_ptr() as *const u8).wrapping_add((loc & 0xffff) as usize))
    };
    try_cgroup_mkdir(root, id, path).unwrap_or(0)
}

/// The same as a BTF tracepoint, `cgroup_mkdir(cgrp, path)`: the
/// hierarchy (`cgrp->root->hierarchy_id`) and the id (`cgrp->kn->id`) read
/// at BTF's offsets, as the classic tracepoint's record has them.
#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir_fe(ctx: BtfTracePointContext) -> u32 {
    let cgrp = ctx.arg::<u64>(0);
    let root = || kernel_read::<i32>(kernel_read::<u64>(cgrp, &CGROUP_ROOT_OFF)?, &ROOT_HIERARCHY_ID_OFF);
    let id = || kernel_read::<u64>(kernel_read::<u64>(cgrp, &CGROUP_KN_OFF)?, &KERNFS_ID_OFF);
    let path = || Ok(ctx.arg::<u64>(1) as *const u8);
    try_cgroup_mkdir(root, id, path).unwrap_or(0)
}

/// `root`, `id` and `path` read the hierarchy, the cgroup's id and where
/// its path is, when needed.
#[inline(always)]
fn try_cgroup_mkdir(
    root: impl FnOnce() -> Result<i32, ReadFailed>,
    id: impl FnOnce() -> Result<u64, ReadFailed>,
    path: impl FnOnce() -> Result<*const u8, ReadFailed>,
) -> Result<u32, ReadFailed> {
    if root()? != 0 {
        return Ok(0);
    }
    let id = id()?;
    let src = path()?;
    let Some(mut e) = CGROUP_DIRS.reserve::<CgroupDir>(0) else {
        drop_count(DropKind::CgroupDirsFull);
        return Ok(0);
    };
    let d = e.as_mut_ptr();
    // SAFETY: `d` is the reserved record; the kernel bounds the copy.
    let len = unsafe {
        (*d).id = id;
        (*d)._pad = 0;
        bpf_probe_read_kernel_str_bytes(src, &mut (*d).path).map(|s| s.len()).unwrap_or(CGROUP_PATH_MAX)
    };
    unsafe { (*d).len = len as u32 };
    e.submit(0);
    Ok(0)
}
