//! The fault itself: `handle_mm_fault` entry and return (the per-thread
//! state machine of `faultscope_common::fault`), and the probes inside a
//! fault that only leave a mark in that state (`do_wp_page`, new anon
//! folio, shared page dirtied, present-entry tail).
//!
//! Classification happens once, at the return, from the marks: the marks
//! themselves cost one lookup of the thread's state and no map write.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{kprobe, kretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use faultscope_common::{
    class::Class,
    fault::{FAULT_FLAG_USER, SEEN_ACCESS, SEEN_DIRTY_SHARED, SEEN_HUGE_WP, SEEN_NEW_ANON, SEEN_WP},
    maps::Drop,
};

use crate::{
    attrib::{attribute, user_ip, vma_start},
    helpers::{
        arg, counted_target, current_phase, drop_count, pid_tgid, read_failed, record_set, thread_state,
        ReadFailed,
    },
    maps::THREADS,
};

// ---- handle_mm_fault ----------------------------------------------------------

/// `handle_mm_fault(vma, address, flags, regs)` entry: user faults only
/// (`regs != NULL` and FAULT_FLAG_USER; GUP, KSM and iommu call it too).
#[kprobe]
pub fn fault_entry(ctx: ProbeContext) -> u32 {
    match try_fault_entry(ctx) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

fn try_fault_entry(ctx: ProbeContext) -> Result<u32, ReadFailed> {
    // Read before the (costlier) traced-set lookup: every process's faults
    // come through here. A failed read is counted only for a traced one.
    let (Some(flags), Some(regs)) = (ctx.arg::<u64>(2), ctx.arg::<u64>(3)) else {
        let (_, tgid) = pid_tgid();
        return match counted_target(tgid) {
            Some(_) => Err(read_failed()),
            None => Ok(0),
        };
    };
    if regs == 0 || (flags as u32) & FAULT_FLAG_USER == 0 {
        return Ok(0);
    }
    let (tid, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return Ok(0);
    }
    let addr = arg(&ctx, 1)?;
    let start = vma_start(arg(&ctx, 0)?)?;
    let ip = user_ip(regs)?;
    if let Some(s) = thread_state(tid) {
        let st = unsafe { &mut *s };
        if st.on_entry(unsafe { bpf_ktime_get_ns() }, addr, flags as u32) {
            drop_count(Drop::LostReturn);
        }
        st.vma_start = start;
        st.ip = ip;
    }
    Ok(0)
}

/// `handle_mm_fault` return: classify the fault and account its latency in
/// every class it falls in.
#[kretprobe]
pub fn fault_return(ctx: RetProbeContext) -> u32 {
    match try_fault_return(ctx) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

fn try_fault_return(ctx: RetProbeContext) -> Result<u32, ReadFailed> {
    let (tid, tgid) = pid_tgid();
    let Some(s) = THREADS.get_ptr_mut(&tid) else {
        return Ok(0);
    };
    // The return register is always there (no read that can fail).
    let ret: u64 = ctx.ret();
    let now = unsafe { bpf_ktime_get_ns() };
    let st = unsafe { &mut *s };
    let Some(set) = st.on_return(ret as u32) else {
        return Ok(0);
    };
    // The phase is read at return: a fault belongs to the phase it ends in.
    // Only the classes `on_return` can produce are walked.
    let phase = current_phase();
    record_set(tgid, phase, &Class::FAULT_RETURN, set, now.saturating_sub(st.start_ns));
    // No kernel stacks here (they are for the contpte classes): no caller.
    attribute(&ctx, tgid, phase, &Class::FAULT_RETURN, set, st.vma_start, st.ip, 0);
    Ok(0)
}

// ---- marks inside a fault -----------------------------------------------------

/// Marks the current thread's fault, if it is in a traced user fault.
#[inline(always)]
fn try_mark(bit: u32) -> Result<u32, ReadFailed> {
    let (tid, _) = pid_tgid();
    if let Some(s) = THREADS.get_ptr_mut(&tid) {
        unsafe { (*s).mark(bit) };
    }
    Ok(0)
}

/// `do_wp_page`: a write-protect fault on a present PTE.
#[kprobe]
pub fn wp_page(_ctx: ProbeContext) -> u32 {
    match try_mark(SEEN_WP) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

/// `do_huge_pmd_wp_page`: a write-protect fault on a PMD-mapped THP.
#[kprobe]
pub fn huge_pmd_wp(_ctx: ProbeContext) -> u32 {
    match try_mark(SEEN_HUGE_WP) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

/// `folio_add_new_anon_rmap`: a new anon folio was mapped; inside a
/// `do_wp_page` fault that is a COW copy.
#[kprobe]
pub fn new_anon_rmap(_ctx: ProbeContext) -> u32 {
    match try_mark(SEEN_NEW_ANON) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

/// `fault_dirty_shared_page`: the fault dirtied a shared mapping's page;
/// inside a `do_wp_page` fault that is write-notify (`wp_shared`), not COW.
#[kprobe]
pub fn dirty_shared(_ctx: ProbeContext) -> u32 {
    match try_mark(SEEN_DIRTY_SHARED) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

/// `ptep_set_access_flags` (x86) / `__ptep_set_access_flags` (arm64): the
/// present-entry tail of `handle_pte_fault`.
#[kprobe]
pub fn access_flags(_ctx: ProbeContext) -> u32 {
    match try_mark(SEEN_ACCESS) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

/// arm64 `contpte_ptep_set_access_flags`: the same for a contpte block.
#[kprobe]
pub fn access_flags_cont(_ctx: ProbeContext) -> u32 {
    match try_mark(SEEN_ACCESS) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

/// `huge_pmd_set_accessed`: the same for a PMD-mapped THP.
#[kprobe]
pub fn huge_accessed(_ctx: ProbeContext) -> u32 {
    match try_mark(SEEN_ACCESS) {
        Ok(r) => r,
        Err(_) => 0,
    }
}
