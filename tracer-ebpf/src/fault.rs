//! The fault itself: `handle_mm_fault` entry and return (the per-thread
//! state machine of `faultscope_common::fault`), and the probes inside a
//! fault that only leave a mark in that state (`do_wp_page`, new anon
//! folio, shared page dirtied, present-entry tail).
//!
//! Classification happens once, at the return, from the marks: the marks
//! themselves cost one lookup of the thread's state and no map write.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{fexit, kretprobe},
    programs::{FExitContext, RetProbeContext},
};
use faultscope_common::{
    class::{ClassSet, KernelClass},
    fault::{
        split_spurious, vma_kept, Origin, WpPage, FAULT_FLAG_WRITE, NO_GEN, SEEN_ACCESS, SEEN_DIRTY_SHARED,
        SEEN_HUGE_WP, SEEN_NEW_ANON, SEEN_WP, VM_FAULT_RETRY,
    },
    maps::{Config, DropKind},
    ThreadFault,
};

use crate::{
    attrib::{attribute, count_mapping, fault_site, vma_start},
    helpers::{
        current_id, current_phase, drop_count, fault_state, read_failed, record_set, tgid_of,
        thread_state_if_any, timed_fault, traced_thread, wp_gen, FnContext, ReadFailed, UNTIMED,
    },
    maps::{cfg, Conf, EXIT_ONLY, FOLIO_HEAD_BIT, FOLIO_ORDER_OFF, WP_PAGES},
};

// ---- write-protect faults by page (the spurious split) ------------------------

/// A write of thread `id` opens on `addr`: notes its page bucket's
/// generation.
#[inline(always)]
fn note_wp_gen(st: &mut ThreadFault, id: u64, addr: u64) {
    let gen = wp_gen(id, addr);
    if gen != NO_GEN {
        st.note_wp_gen(gen as u32);
    }
}

/// A fault of thread `id` returned with classes `set` (`gen` its
/// `gen_at_open`, read before the return forgot it): a write-protect fault
/// leaves its page's bucket, a spurious one is split by it.
#[inline(always)]
fn wp_page_returned(st: &ThreadFault, id: u64, gen: u64, set: ClassSet) -> ClassSet {
    let wp = set.has(KernelClass::WpFaults);
    if !wp && !set.has(KernelClass::Spurious) {
        return set;
    }
    let Some(b) = WP_PAGES.get_ptr_mut(WpPage::bucket(tgid_of(id), st.fault_addr)) else {
        return set;
    };
    let b = unsafe { &mut *b };
    if wp {
        b.leave(id, st.fault_addr);
        return set;
    }
    split_spurious(set, b.raced(id, st.fault_addr, gen))
}

// ---- handle_mm_fault ----------------------------------------------------------

kprobe_and_fentry!(
    /// `handle_mm_fault(vma, address, flags, regs)` entry: every call made
    /// with a traced task as `current`, whatever its origin (user mode,
    /// the kernel inside a system call, get_user_pages): the faults
    /// `mm_account_fault()` counts for the task. KSM, khugepaged, iommu
    /// and another process writing this one's memory run as other tasks.
    fault_entry, fault_entry_fe, |ctx| try_fault_entry(ctx).unwrap_or(0)
);

#[inline(always)]
fn try_fault_entry<C: FnContext>(ctx: &C) -> Result<u32, ReadFailed> {
    let id = current_id();
    let Some(s) = traced_thread(id) else {
        return Ok(0);
    };
    let tgid = tgid_of(id);
    let flags = ctx.arg(2)? as u32;
    let regs = ctx.arg(3)?;
    let origin = Origin::of(flags, regs);
    let conf = Conf::load();
    let addr = ctx.arg(1)?;
    // Read at entry: at the return the VMA may be gone (a retry drops the
    // lock that held it).
    let vma = ctx.arg(0)?;
    let start = vma_start(ctx, &conf, vma)?;
    let (ip, syscall) = fault_site(ctx, &conf, origin, regs)?;
    let st = unsafe { &mut *s };
    // The thread's previous fault never returned to us (a kretprobe out of
    // instances): it is counted here, from its marks, untimed, its return
    // value unknown (taken as completed). A fault cannot nest in another of
    // the same thread, so this is the only way to be in a fault here.
    if st.in_fault() {
        drop_count(DropKind::LostReturn);
        let gen = st.gen_at_open();
        if let Some(set) = st.on_return(0) {
            let set = st.opaque(set);
            let set = wp_page_returned(st, id, gen, set);
            let phase = current_phase();
            record_set(tgid, phase, set, UNTIMED, 0);
            if conf.get(Config::Mappings) != 0 {
                count_mapping(tgid, phase, st.vma_start, set.classes(), 0);
            }
        }
    }
    st.vma_start = start;
    st.vma = if start != 0 { vma } else { 0 };
    st.ip = ip;
    st.syscall = syscall;
    // The clock last: the fault's time starts where this program's ends.
    let timed = timed_fault(conf.get(Config::LatencyEvery));
    st.on_entry(if timed { Some(unsafe { bpf_ktime_get_ns() }) } else { None }, addr, flags, origin);
    // A write's generation, for the spurious split, where its exception
    // did not note it (arm64, get_user_pages).
    if flags & FAULT_FLAG_WRITE != 0 && st.gen_at_open() == NO_GEN {
        note_wp_gen(st, id, addr);
    }
    Ok(0)
}

/// `handle_mm_fault` return: classify the fault and account its latency in
/// every class it falls in.
#[kretprobe]
pub fn fault_return(ctx: RetProbeContext) -> u32 {
    // The return register is always there (no read that can fail).
    let ret: u64 = ctx.ret();
    try_fault_return(&ctx, ret).unwrap_or(0)
}

/// fexit sees the return value without a kretprobe's trampoline, and the
/// arguments: in exit-only mode it is the whole of the fault's own work.
#[fexit]
pub fn fault_return_fe(ctx: FExitContext) -> u32 {
    match ctx.ret::<u64>() {
        Ok(ret) if cfg(&EXIT_ONLY) != 0 => try_fault_close(&ctx, ret).unwrap_or(0),
        Ok(ret) => try_fault_return(&ctx, ret).unwrap_or(0),
        Err(_) => {
            if !thread_state_if_any(current_id()).is_null() {
                read_failed();
            }
            0
        }
    }
}

/// Exit-only mode: `handle_mm_fault(vma, address, flags, regs)` returns
/// `ret`. The exception opened the fault (or its first mark did, or
/// nothing: get_user_pages); this reads what an entry program would have
/// (origin, mapping, site), classifies, and accounts it. A retried call
/// opens here, for the call the kernel makes next.
#[inline(always)]
fn try_fault_close(ctx: &FExitContext, ret: u64) -> Result<u32, ReadFailed> {
    let id = current_id();
    let s = fault_state(id, true);
    if s.is_null() {
        return Ok(0);
    }
    let st = unsafe { &mut *s };
    let arg = |n| FnContext::arg(ctx, n);
    let (addr, flags, regs) = (arg(1)?, arg(2)? as u32, arg(3)?);
    let origin = Origin::of(flags, regs);
    let ns = if st.at_return(addr, flags, origin) {
        unsafe { bpf_ktime_get_ns() }.saturating_sub(st.start_ns)
    } else {
        UNTIMED
    };
    let own_ns = st.own_ns;
    let gen = st.gen_at_open();
    let Some(set) = st.on_return(ret as u32) else {
        return Ok(0);
    };
    let set = st.opaque(set);
    let set = wp_page_returned(st, id, gen, set);
    let tgid = tgid_of(id);
    let phase = current_phase();
    record_set(tgid, phase, set, ns, own_ns);
    let conf = Conf::load();
    // The VMA is read at the return: the call holds its lock until then,
    // except a retry's or a completed-unlocked one, whose VMA is still
    // memory the kernel frees only after an RCU grace period (the read is
    // a checked load either way).
    let vma = arg(0)?;
    let start = vma_start(ctx, &conf, vma)?;
    let (ip, syscall) = fault_site(ctx, &conf, origin, regs)?;
    // Described only while the call still holds the VMA.
    let mapping = Some((start, if vma_kept(ret as u32) { vma } else { 0 }));
    attribute(ctx, &conf, tgid, phase, &KernelClass::FAULT_RETURN, set, mapping, ip, syscall, 0);
    if ret as u32 & VM_FAULT_RETRY != 0 {
        // The clock last: the retried call's time starts where this ends.
        let timed = timed_fault(conf.get(Config::LatencyEvery));
        st.reopen_for_retry(timed, if timed { unsafe { bpf_ktime_get_ns() } } else { 0 });
        if flags & FAULT_FLAG_WRITE != 0 {
            note_wp_gen(st, id, addr);
        }
    }
    Ok(0)
}

#[inline(always)]
fn try_fault_return<C: FnContext>(ctx: &C, ret: u64) -> Result<u32, ReadFailed> {
    let id = current_id();
    let s = thread_state_if_any(id);
    if s.is_null() {
        return Ok(0);
    }
    let st = unsafe { &mut *s };
    let ns = if st.timed() { unsafe { bpf_ktime_get_ns() }.saturating_sub(st.start_ns) } else { UNTIMED };
    let gen = st.gen_at_open();
    let Some(set) = st.on_return(ret as u32) else {
        return Ok(0);
    };
    let set = st.opaque(set);
    let set = wp_page_returned(st, id, gen, set);
    let tgid = tgid_of(id);
    // The phase is read at return: a fault belongs to the phase it ends in.
    // One entry for all the fault's classes: one histogram update.
    let phase = current_phase();
    record_set(tgid, phase, set, ns, st.own_ns);
    // No kernel stacks here (they are for the contpte classes): no caller.
    let conf = Conf::load();
    attribute(
        ctx,
        &conf,
        tgid,
        phase,
        &KernelClass::FAULT_RETURN,
        set,
        Some((st.vma_start, if vma_kept(ret as u32) { st.vma } else { 0 })),
        st.ip,
        st.syscall,
        0,
    );
    Ok(0)
}

// ---- marks inside a fault -----------------------------------------------------

/// Marks the current thread's fault, if it is in a traced fault, and adds
/// this program's own time (from its state lookup on) to the fault's
/// `own_ns`. The clock is read only once the thread is found in a timed
/// fault: an untraced task's call costs the lookup alone, an untimed
/// fault's the mark. In exit-only mode a mark of a function that runs only
/// inside a fault (`opens`) opens a traced thread's fault if none is open
/// (get_user_pages raises no exception).
///
/// `then` runs after the mark, inside the program's own time, with the
/// thread's id and state.
#[inline(always)]
fn try_mark(bit: u32, opens: bool, then: impl FnOnce(u64, &mut ThreadFault)) -> Result<u32, ReadFailed> {
    let open = opens && cfg(&EXIT_ONLY) != 0;
    let id = current_id();
    let s = fault_state(id, open);
    if !s.is_null() {
        let st = unsafe { &mut *s };
        if st.timed() {
            let from = unsafe { bpf_ktime_get_ns() };
            st.mark(bit);
            then(id, st);
            st.own_time(from, unsafe { bpf_ktime_get_ns() });
        } else {
            if open && !st.in_fault() {
                st.open_untimed();
            }
            st.mark(bit);
            then(id, st);
        }
    }
    Ok(0)
}

/// The mark alone.
#[inline(always)]
fn mark_only(bit: u32, opens: bool) -> Result<u32, ReadFailed> {
    try_mark(bit, opens, |_, _| {})
}

/// `do_wp_page` of a fault on a known page (get_user_pages in exit-only
/// mode opens with none) enters that page's bucket.
#[inline(always)]
fn enter_wp_page(id: u64, st: &mut ThreadFault) {
    if st.in_fault() && st.fault_addr != 0 {
        if let Some(b) = WP_PAGES.get_ptr_mut(WpPage::bucket(tgid_of(id), st.fault_addr)) {
            unsafe { (*b).enter(id, st.fault_addr) };
        }
    }
}

kprobe_and_fentry!(
    /// `do_wp_page`: a write-protect fault on a present PTE.
    wp_page, wp_page_fe, |_ctx| try_mark(SEEN_WP, true, enter_wp_page).unwrap_or(0)
);
kprobe_and_fentry!(
    /// `do_huge_pmd_wp_page`: a write-protect fault on a PMD-mapped THP.
    huge_pmd_wp, huge_pmd_wp_fe, |_ctx| mark_only(SEEN_HUGE_WP, true).unwrap_or(0)
);
kprobe_and_fentry!(
    /// `__split_huge_pmd`: within a write fault, the write-protect fault of
    /// a PMD-mapped THP that `wp_huge_pmd` splits without
    /// `do_huge_pmd_wp_page` (a private file THP); outside a fault, nothing.
    split_huge_pmd, split_huge_pmd_fe, |_ctx| mark_only(SEEN_HUGE_WP, true).unwrap_or(0)
);
kprobe_and_fentry!(
    /// `do_huge_pmd_exec_cow` (a patched kernel's): the write-protect fault
    /// of a private executable file THP, copied whole into an anon THP.
    huge_pmd_exec_cow, huge_pmd_exec_cow_fe, |_ctx| mark_only(SEEN_HUGE_WP, true).unwrap_or(0)
);
kprobe_and_fentry!(
    /// `folio_add_new_anon_rmap(folio, ...)` (6.1: `page_add_new_anon_rmap`
    /// of the head page): a new anon folio was mapped, of the order noted;
    /// inside a `do_wp_page` fault that is a COW copy.
    new_anon_rmap, new_anon_rmap_fe, |ctx| {
        try_mark(SEEN_NEW_ANON, false, |_, st| {
            if let Some(order) = FnContext::arg(ctx, 0).ok().and_then(folio_order) {
                st.note_folio(order);
            }
        })
        .unwrap_or(0)
    }
);

/// The order of the folio at `folio` (0 unless its flags have `PG_head`),
/// or none where BTF did not say where it is or a read failed (counted).
/// Read with `bpf_probe_read_kernel`: the offsets are user space's, not
/// the argument's BTF type (6.1 passes a page).
#[inline(always)]
fn folio_order(folio: u64) -> Option<u32> {
    let off = cfg(&FOLIO_ORDER_OFF) as u64;
    if off == 0 {
        return None;
    }
    let flags: u64 = unsafe { bpf_probe_read_kernel(folio as *const u64) }.map_err(|_| read_failed()).ok()?;
    if (flags >> (cfg(&FOLIO_HEAD_BIT) & 63)) & 1 == 0 {
        return Some(0);
    }
    let order: u8 =
        unsafe { bpf_probe_read_kernel((folio + off) as *const u8) }.map_err(|_| read_failed()).ok()?;
    Some(order as u32)
}
kprobe_and_fentry!(
    /// `fault_dirty_shared_page`: the fault dirtied a shared mapping's page;
    /// inside a `do_wp_page` fault that is write-notify (`wp_shared`), not COW.
    dirty_shared, dirty_shared_fe, |_ctx| mark_only(SEEN_DIRTY_SHARED, true).unwrap_or(0)
);
kprobe_and_fentry!(
    /// `ptep_set_access_flags` (x86) / `__ptep_set_access_flags` (arm64): the
    /// present-entry tail of `handle_pte_fault`.
    access_flags, access_flags_fe, |_ctx| mark_only(SEEN_ACCESS, true).unwrap_or(0)
);
kprobe_and_fentry!(
    /// arm64 `contpte_ptep_set_access_flags`: the same for a contpte block.
    access_flags_cont, access_flags_cont_fe, |_ctx| mark_only(SEEN_ACCESS, true).unwrap_or(0)
);
kprobe_and_fentry!(
    /// `huge_pmd_set_accessed`: the same for a PMD-mapped THP.
    huge_accessed, huge_accessed_fe, |_ctx| mark_only(SEEN_ACCESS, true).unwrap_or(0)
);
