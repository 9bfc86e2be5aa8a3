//! arm64 contiguous-PTE blocks (`CONFIG_ARM64_CONTPTE`, 6.9+): folds,
//! unfolds and the calls that attempt them, counted per traced process.
//!
//! Not tied to a fault: a block is unfolded by mprotect, munmap or a COW
//! inside it as well, so these count for the current task whatever it does.

use aya_ebpf::{macros::kprobe, programs::ProbeContext};
use faultscope_common::class::Class;

use crate::helpers::{arg, counted_target, current_phase, pid_tgid, record, ReadFailed, UNTIMED};

/// arm64 PTE_CONT: the contiguous hint of a PTE.
const PTE_CONT: u64 = 1 << 52;

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
pub fn contpte_try_unfold(_ctx: ProbeContext) -> u32 {
    match try_count(Class::ContpteTryUnfold) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

#[inline(always)]
fn try_count(class: Class) -> Result<u32, ReadFailed> {
    Ok(count_current(class))
}

/// `contpte_convert(mm, addr, ptep, pte)`: a block is rewritten; `pte`
/// carries PTE_CONT when it is folded, not when it is unfolded.
#[kprobe]
pub fn contpte_convert(ctx: ProbeContext) -> u32 {
    match try_contpte_convert(ctx) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

fn try_contpte_convert(ctx: ProbeContext) -> Result<u32, ReadFailed> {
    let (_, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return Ok(0);
    }
    // The direction comes from the new PTE: without it the conversion is
    // not classified (counted in DROPS), never guessed to be an unfold.
    let pte = arg(&ctx, 3)?;
    let phase = current_phase();
    record(tgid, phase, Class::ContpteConvert as u32, UNTIMED);
    let class = if pte & PTE_CONT != 0 { Class::ContpteFold } else { Class::ContpteUnfold };
    record(tgid, phase, class as u32, UNTIMED);
    Ok(0)
}

/// `__contpte_try_fold`: an attempt to fold a block (most fail).
#[kprobe]
pub fn contpte_try_fold(_ctx: ProbeContext) -> u32 {
    match try_count(Class::ContpteFoldAttempt) {
        Ok(r) => r,
        Err(_) => 0,
    }
}
