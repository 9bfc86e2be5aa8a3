//! The page-fault exception itself, before the kernel handles it: the x86
//! error code (tracepoint) or the arm64 ESR (kprobe on `do_mem_abort`).
//!
//! On x86 the tracepoint is the whole of the tracepoint-only mode; with
//! kprobes it also leaves the exception record in the thread state, so that
//! the kretprobe can tell a write to a present page (the spurious rule).

use aya_ebpf::{
    macros::{fentry, kprobe, tracepoint},
    programs::{FEntryContext, ProbeContext, TracePointContext},
};
use faultscope_common::{
    class::{Class, ClassSet},
    fault::{classify_x86_error_code, ExcArch},
    maps::Config,
};

use crate::{
    helpers::{
        arg, counted_target, current_phase, field, pid_tgid, record_set, thread_state, FnContext, ReadFailed,
        UNTIMED,
    },
    maps::{cfg, config, PF_ADDRESS_OFF, PF_ERROR_CODE_OFF},
};

/// x86 `exceptions:page_fault_user`: counts every user fault by error code
/// (the whole of the tracepoint-only mode), and remembers the error code so
/// that the kretprobe can tell a write to a present page (spurious rule).
#[tracepoint]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    match try_page_fault_user(ctx) {
        Ok(r) => r,
        Err(_) => 0,
    }
}

fn try_page_fault_user(ctx: TracePointContext) -> Result<u32, ReadFailed> {
    let (tid, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return Ok(0);
    }
    let code: u64 = field(&ctx, cfg(&PF_ERROR_CODE_OFF))?;
    // Only the classes the report takes from here (all of them without
    // kprobes, first_touch alone with them).
    let wanted = config(Config::TpClasses);
    let set = ClassSet(classify_x86_error_code(code).0 & wanted);
    if set.0 != 0 {
        record_set(tgid, current_phase(), &Class::ERROR_CODE, set, UNTIMED);
    }
    if config(Config::Exceptions) != 0 {
        let addr: u64 = field(&ctx, cfg(&PF_ADDRESS_OFF))?;
        if let Some(s) = thread_state(tid) {
            unsafe { (*s).on_exception(ExcArch::X86, addr, code) };
        }
    }
    Ok(0)
}

/// arm64 `do_mem_abort(far, esr, regs)`: no tracepoint carries the ESR there.
#[kprobe]
pub fn mem_abort(ctx: ProbeContext) -> u32 {
    try_mem_abort(&ctx).unwrap_or(0)
}

#[fentry]
pub fn mem_abort_fe(ctx: FEntryContext) -> u32 {
    try_mem_abort(&ctx).unwrap_or(0)
}

#[inline(always)]
fn try_mem_abort<C: FnContext>(ctx: &C) -> Result<u32, ReadFailed> {
    let (tid, tgid) = pid_tgid();
    if counted_target(tgid).is_none() {
        return Ok(0);
    }
    let far = arg(ctx, 0)?;
    let esr = arg(ctx, 1)?;
    if let Some(s) = thread_state(tid) {
        unsafe { (*s).on_exception(ExcArch::Arm64, far, esr) };
    }
    Ok(0)
}
