//! arm64 contiguous-PTE blocks (`CONFIG_ARM64_CONTPTE`, 6.9+): folds,
//! unfolds and the calls that attempt them, counted per traced process.
//!
//! Not tied to a fault: a block is unfolded by mprotect, munmap or a COW
//! inside it as well, so these count for the current task whatever it does.

use aya_ebpf::helpers::bpf_ktime_get_ns;
use faultscope_common::{
    attrib::addr_key,
    class::{ClassSet, KernelClass},
    fault::Origin,
};

use crate::{
    attrib::attribute,
    helpers::{
        counted_target, current_id, current_phase, pid_tgid, record, thread_state_if_any, FnContext,
        ReadFailed, UNTIMED,
    },
    maps::Conf,
};

/// Counts and attributes a contpte event of `set` at user address `addr`:
/// inside a traced fault of this thread with the fault's origin, mapping
/// and instruction, else (the kernel inside a syscall: mprotect, munmap)
/// as the kernel's, at the address's granule, with no instruction. Inside
/// a fault, the program's own time from `from_ns` on is the fault's
/// `own_ns`.
#[inline(always)]
fn count_here<C: FnContext>(ctx: &C, tgid: u32, set: ClassSet, addr: u64, from_ns: u64) {
    let state = thread_state_if_any(current_id());
    // The origin as a number, never matched: one path on from here.
    let (start, ip, syscall, origin) = if !state.is_null() && unsafe { (*state).in_fault() } {
        unsafe { ((*state).vma_start, (*state).ip, (*state).syscall, (*state).origin) }
    } else {
        (addr_key(addr), 0, 0, Origin::Kernel as u32)
    };
    let phase = current_phase();
    let set = set.with_origin_number(origin);
    record(tgid, phase, set.0, UNTIMED, 0);
    let conf = Conf::load();
    attribute(
        ctx,
        &conf,
        tgid,
        phase,
        &KernelClass::CONTPTE,
        set,
        Some((start, 0)),
        ip,
        syscall,
        ctx.entry_caller(&conf),
    );
    if !state.is_null() {
        unsafe { (*state).own_time(from_ns, bpf_ktime_get_ns()) };
    }
}

/// arm64 PTE_CONT: the contiguous hint of a PTE.
const PTE_CONT: u64 = 1 << 52;

/// `fn(mm, addr, ...)` probes that count one class.
#[inline(always)]
fn try_count<C: FnContext>(ctx: &C, class: KernelClass) -> Result<u32, ReadFailed> {
    let from = unsafe { bpf_ktime_get_ns() };
    let (_, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return Ok(0);
    }
    let addr = ctx.arg(1)?;
    count_here(ctx, tgid, ClassSet::default().with(class), addr, from);
    Ok(0)
}

/// `contpte_convert(mm, addr, ptep, pte)`: a block is rewritten; `pte`
/// carries PTE_CONT when it is folded, not when it is unfolded.
#[inline(always)]
fn try_contpte_convert<C: FnContext>(ctx: &C) -> Result<u32, ReadFailed> {
    let from = unsafe { bpf_ktime_get_ns() };
    let (_, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return Ok(0);
    }
    // The direction comes from the new PTE: without it the conversion is
    // not classified (counted in DROPS), never guessed to be an unfold. It
    // is a bit, not a branch, so that the count is verified once
    // (`black_box`, or LLVM makes the two sets a branch again).
    let pte: u64 = ctx.arg(3)?;
    let addr = ctx.arg(1)?;
    let fold = core::hint::black_box(((pte & PTE_CONT) >> PTE_CONT.trailing_zeros()) as u32);
    let set = ClassSet::default()
        .with(KernelClass::ContpteConvert)
        .with_flag(KernelClass::ContpteFold, fold)
        .with_flag(KernelClass::ContpteUnfold, fold ^ 1);
    count_here(ctx, tgid, set, addr, from);
    Ok(0)
}

kprobe_and_fentry!(
    /// `__contpte_try_unfold(mm, addr, ptep, pte)` (6.12 unfolds through it
    /// to change one PTE).
    contpte_try_unfold, contpte_try_unfold_fe, |ctx| try_count(ctx, KernelClass::ContpteTryUnfold).unwrap_or(0)
);
kprobe_and_fentry!(
    /// `contpte_convert(mm, addr, ptep, pte)`: see `try_contpte_convert`.
    contpte_convert, contpte_convert_fe, |ctx| try_contpte_convert(ctx).unwrap_or(0)
);
kprobe_and_fentry!(
    /// `__contpte_try_fold(mm, addr, ptep, pte)`: an attempt to fold a block
    /// (most fail).
    contpte_try_fold, contpte_try_fold_fe, |ctx| try_count(ctx, KernelClass::ContpteFoldAttempt).unwrap_or(0)
);
