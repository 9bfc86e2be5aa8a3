//! arm64 contiguous-PTE blocks (`CONFIG_ARM64_CONTPTE`, 6.9+): folds,
//! unfolds and the calls that attempt them, counted per traced process.
//!
//! Not tied to a fault: a block is unfolded by mprotect, munmap or a COW
//! inside it as well, so these count for the current task whatever it does.

use aya_ebpf::{macros::kprobe, programs::ProbeContext};
use faultscope_common::{
    attrib::addr_key,
    class::{Class, ClassSet},
};

use crate::{
    attrib::attribute,
    helpers::{arg, counted_target, current_phase, pid_tgid, record, ReadFailed, UNTIMED},
    maps::THREADS,
};

/// The classes counted here, for attribution.
const CONTPTE: [Class; 5] = [
    Class::ContpteUnfold,
    Class::ContpteFold,
    Class::ContpteConvert,
    Class::ContpteTryUnfold,
    Class::ContpteFoldAttempt,
];

/// The link register at the probed function's entry: the return address
/// into its direct caller, which a kernel stack taken here lacks on arm64
/// (`StackKey::kernel_caller`). Read only when kernel stacks are asked for;
/// 0 when the read fails (the stack then lacks that frame, as the kernel's
/// own does).
#[inline(always)]
fn entry_caller(ctx: &ProbeContext) -> u64 {
    #[cfg(bpf_target_arch = "aarch64")]
    {
        use aya_ebpf::helpers::bpf_probe_read_kernel;
        use faultscope_common::{attrib::PT_REGS_LR_AARCH64, maps::Config};

        if crate::maps::config(Config::KernelStackClasses) == 0 {
            return 0;
        }
        let p = (ctx.regs as u64 + PT_REGS_LR_AARCH64) as *const u64;
        unsafe { bpf_probe_read_kernel(p) }.unwrap_or(0)
    }
    #[cfg(not(bpf_target_arch = "aarch64"))]
    {
        let _ = ctx;
        0
    }
}

/// Attributes a contpte event at user address `addr`: inside a traced
/// fault of this thread to the fault's mapping and instruction, else (a
/// syscall) to the address's granule, with no instruction.
#[inline(always)]
fn attribute_here(ctx: &ProbeContext, tid: u32, tgid: u32, phase: u32, set: ClassSet, addr: u64) {
    let (start, ip) = match THREADS.get_ptr(&tid) {
        Some(s) if unsafe { (*s).in_fault() } => unsafe { ((*s).vma_start, (*s).ip) },
        _ => (addr_key(addr), 0),
    };
    attribute(ctx, tgid, phase, &CONTPTE, set, start, ip, entry_caller(ctx));
}

/// arm64 PTE_CONT: the contiguous hint of a PTE.
const PTE_CONT: u64 = 1 << 52;

/// `fn(mm, addr, ...)` probes that count one class.
#[inline(always)]
fn try_count(ctx: &ProbeContext, class: Class) -> Result<u32, ReadFailed> {
    let (tid, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return Ok(0);
    }
    let addr = arg(ctx, 1)?;
    let phase = current_phase();
    record(tgid, phase, class as u32, UNTIMED);
    attribute_here(ctx, tid, tgid, phase, ClassSet::default().with(class), addr);
    Ok(0)
}

/// `__contpte_try_unfold(mm, addr, ptep, pte)` (6.12 unfolds through it to
/// change one PTE).
#[kprobe]
pub fn contpte_try_unfold(ctx: ProbeContext) -> u32 {
    match try_count(&ctx, Class::ContpteTryUnfold) {
        Ok(r) => r,
        Err(_) => 0,
    }
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
    let (tid, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return Ok(0);
    }
    // The direction comes from the new PTE: without it the conversion is
    // not classified (counted in DROPS), never guessed to be an unfold.
    let pte = arg(&ctx, 3)?;
    let addr = arg(&ctx, 1)?;
    let phase = current_phase();
    record(tgid, phase, Class::ContpteConvert as u32, UNTIMED);
    let class = if pte & PTE_CONT != 0 { Class::ContpteFold } else { Class::ContpteUnfold };
    record(tgid, phase, class as u32, UNTIMED);
    attribute_here(&ctx, tid, tgid, phase, ClassSet::default().with(Class::ContpteConvert).with(class), addr);
    Ok(0)
}

/// `__contpte_try_fold(mm, addr, ptep, pte)`: an attempt to fold a block
/// (most fail).
#[kprobe]
pub fn contpte_try_fold(ctx: ProbeContext) -> u32 {
    match try_count(&ctx, Class::ContpteFoldAttempt) {
        Ok(r) => r,
        Err(_) => 0,
    }
}
