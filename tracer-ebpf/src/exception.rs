//! The page-fault exception itself, before the kernel handles it: the x86
//! error code (tracepoint) or the arm64 ESR (kprobe on `do_mem_abort`).
//!
//! On x86 the tracepoint is the whole of the tracepoint-only mode; with
//! kprobes it also leaves the exception record in the thread state, so that
//! the kretprobe can tell a write to a present page (the spurious rule); in
//! exit-only mode (fexit) it opens the fault.

use aya_ebpf::{
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, tracepoint},
    programs::{tracing::StackIdContext, BtfTracePointContext, TracePointContext},
    EbpfContext,
};
use faultscope_common::{
    attrib::addr_key,
    class::{ClassSet, KernelClass},
    fault::{classify_x86_error_code, ExcArch, Origin, NO_GEN, X86_PF_PROT, X86_PF_WRITE},
    maps::Config,
    ThreadFault,
};

use crate::{
    attrib::{attribute, count_mapping, regs_ip, task_site},
    helpers::{
        current_id, current_phase, field, noted_untraced, pagefault_disabled, record_set, targets_epoch,
        tgid_of, timed_fault, traced_thread, traced_thread_not_noted, wp_gen, FnContext, ReadFailed, UNTIMED,
    },
    maps::{cfg, Conf, EXIT_ONLY, PF_ADDRESS_OFF, PF_ERROR_CODE_OFF, PF_IP_OFF},
    vma::vma_start_at,
};

/// A u64 tracepoint field at `off` (from the kernel's format file), read
/// straight from the context, with no helper call, when it is at `AT`, the
/// offset every kernel since 3.13 has: the verifier allows a context load
/// only at an offset in the instruction itself, and it knows `off` (a
/// frozen `.rodata` value), so the other branch is dropped at load.
/// Elsewhere a checked copy.
#[inline(always)]
fn tp_u64<const AT: usize>(ctx: &TracePointContext, off: usize) -> Result<u64, ReadFailed> {
    if off == AT {
        Ok(unsafe { core::ptr::read_volatile((ctx.as_ptr() as *const u8).wrapping_add(AT) as *const u64) })
    } else {
        field(ctx, off)
    }
}

/// x86-64's offsets of `page_fault_user`'s `address`, `ip` and `error_code`.
const PF_ADDRESS_AT: usize = 8;
const PF_IP_AT: usize = 16;
const PF_ERROR_CODE_AT: usize = 24;

/// x86 `exceptions:page_fault_user`: counts every user fault by error code
/// (the whole of the tracepoint-only mode), and, where the fault path is
/// probed, leaves the error code in the thread's state for its return to
/// tell a write to a present page (spurious rule).
#[tracepoint]
pub fn page_fault_user(ctx: TracePointContext) -> u32 {
    let code = || tp_u64::<PF_ERROR_CODE_AT>(&ctx, cfg(&PF_ERROR_CODE_OFF));
    let addr = || tp_u64::<PF_ADDRESS_AT>(&ctx, cfg(&PF_ADDRESS_OFF));
    let ip = || tp_u64::<PF_IP_AT>(&ctx, cfg(&PF_IP_OFF)).unwrap_or(0);
    on_page_fault(&ctx, Origin::User, code, addr, ip).unwrap_or(0)
}

/// The same as a BTF tracepoint, `page_fault_user(address, regs,
/// error_code)`: the arguments as the kernel passes them, without the trace
/// record a classic tracepoint builds first.
#[btf_tracepoint(function = "page_fault_user")]
pub fn page_fault_user_fe(ctx: BtfTracePointContext) -> u32 {
    let code = || Ok(ctx.arg::<u64>(2));
    let addr = || Ok(ctx.arg::<u64>(0));
    let ip = || regs_ip(ctx.arg::<u64>(1));
    on_page_fault(&ctx, Origin::User, code, addr, ip).unwrap_or(0)
}

/// x86 `exceptions:page_fault_kernel` (the same event class and fields):
/// a fault the CPU took in kernel mode. On a user address, while a traced
/// task runs a system call (`copy_to_user` in read, recv, futex), it is a
/// kernel-origin fault of that task; kernel addresses are left out.
#[tracepoint]
pub fn page_fault_kernel(ctx: TracePointContext) -> u32 {
    let code = || tp_u64::<PF_ERROR_CODE_AT>(&ctx, cfg(&PF_ERROR_CODE_OFF));
    let addr = || tp_u64::<PF_ADDRESS_AT>(&ctx, cfg(&PF_ADDRESS_OFF));
    on_page_fault(&ctx, Origin::Kernel, code, addr, || 0).unwrap_or(0)
}

/// `page_fault_kernel` as a BTF tracepoint.
#[btf_tracepoint(function = "page_fault_kernel")]
pub fn page_fault_kernel_fe(ctx: BtfTracePointContext) -> u32 {
    let code = || Ok(ctx.arg::<u64>(2));
    let addr = || Ok(ctx.arg::<u64>(0));
    on_page_fault(&ctx, Origin::Kernel, code, addr, || 0).unwrap_or(0)
}

/// x86-64 user addresses have bit 63 clear (kernel ones set: canonical
/// high half), with 4- and 5-level page tables alike.
#[inline(always)]
fn user_address(addr: u64) -> bool {
    (addr as i64) >= 0
}

/// `code` and `addr` read the error code and the address, when needed;
/// `ip`, the faulting user instruction (of a user-mode fault).
#[inline(always)]
fn on_page_fault<C: StackIdContext>(
    ctx: &C,
    origin: Origin,
    code: impl FnOnce() -> Result<u64, ReadFailed>,
    addr: impl Fn() -> Result<u64, ReadFailed>,
    ip: impl FnOnce() -> u64,
) -> Result<u32, ReadFailed> {
    // A kernel-mode fault counts only on a user address (read first: most
    // kernel-mode faults of untraced tasks stop here), and only if the
    // kernel handles it: not one raised with page faults disabled, such as
    // the user-stack walk of faultscope's own `--stacks`.
    if origin == Origin::Kernel && (!user_address(addr()?) || pagefault_disabled()) {
        return Ok(0);
    }
    // A thread noted untraced on this CPU stops here, before any field read.
    let id = current_id();
    let epoch = targets_epoch();
    if noted_untraced(id, epoch) {
        return Ok(0);
    }
    let tgid = tgid_of(id);
    let conf = Conf::load();
    let code = code()?;
    let Some(s) = traced_thread_not_noted(id, epoch) else {
        return Ok(0);
    };
    // Only the classes the report takes from here: all of them without the
    // fault path probed, not_present alone with it (a page not present).
    // Opaque: the verifier walks the rest once, not once per error code.
    let set = ClassSet(classify_x86_error_code(code).0 & conf.get(Config::TpClasses)).with_origin(origin);
    let set = unsafe { &mut *s }.opaque(set);
    // With the kprobes (or fentry) counting the fault, this leaves its error
    // code for the fault's return (an untraced thread never gets a state,
    // and a record left by one no longer traced is never used: only a
    // traced fault's entry opens a fault), and counts not_present. In
    // exit-only mode it opens the fault. Without them it counts every
    // class. One path for both, so that the verifier walks `counted` once.
    let exceptions = conf.get(Config::Exceptions) != 0;
    if set.classes() != 0 {
        let phase = counted(ctx, &conf, tgid, set, origin, ip);
        // No fault path: the VMA the kernel finds at the address (a
        // user-mode fault's only: the mmap lock stays held until interrupts
        // are back on, which a kernel-mode fault may not turn on), else the
        // address's granule, named by user space from the maps snapshots.
        if !exceptions && conf.get(Config::Mappings) != 0 {
            let a = addr()?;
            let start = if origin == Origin::User { vma_start_at(tgid, a) } else { 0 };
            let key = if start != 0 { start } else { addr_key(a) };
            count_mapping(tgid, phase, key, set.classes(), 0);
        }
    }
    if exceptions {
        on_exception(s, id, addr()?, code, conf.get(Config::LatencyEvery));
    }
    Ok(0)
}

/// The exception of a traced thread (`id`, state `s`) where the fault
/// path is probed: in exit-only mode it opens the fault (timed under
/// `every`, the clock last, so that the fault's time starts where this
/// program's ends), else it leaves its record for the fault's return. A
/// write to a present page notes its page bucket's generation either way,
/// interrupts still off: the spurious split needs it. Not inlined: the
/// tracepoint programs' frames stay within the verifier's combined stack
/// bound (512 bytes) on 6.1.
#[inline(never)]
fn on_exception(s: *mut ThreadFault, id: u64, addr: u64, code: u64, every: u32) {
    let st = unsafe { &mut *s };
    let present_write = code & (X86_PF_PROT | X86_PF_WRITE) == X86_PF_PROT | X86_PF_WRITE;
    let gen = if present_write { wp_gen(id, addr) } else { NO_GEN };
    if cfg(&EXIT_ONLY) != 0 {
        let timed = timed_fault(every);
        let start = if timed { unsafe { bpf_ktime_get_ns() } } else { 0 };
        st.open_at_exception(ExcArch::X86, addr, code, timed, start);
    } else {
        st.on_exception(ExcArch::X86, addr, code);
    }
    if gen != NO_GEN {
        st.note_wp_gen(gen as u32);
    }
}

/// A traced fault of the classes in `set`: counted, and attributed to its
/// site and stacks where asked for (a tracepoint has no VMA: no mapping
/// here). Returns the phase it was counted in.
#[inline(always)]
fn counted<C: StackIdContext>(
    ctx: &C,
    conf: &Conf,
    tgid: u32,
    set: ClassSet,
    origin: Origin,
    ip: impl FnOnce() -> u64,
) -> faultscope_common::maps::PhaseId {
    let phase = current_phase();
    record_set(tgid, phase, set, UNTIMED, 0);
    let asked = conf.get(Config::SiteClasses)
        | conf.get(Config::UserStackClasses)
        | conf.get(Config::KernelStackClasses);
    if set.0 & asked != 0 {
        let (ip, syscall) = if origin == Origin::User { (ip(), 0) } else { task_site() };
        attribute(ctx, conf, tgid, phase, &KernelClass::ERROR_CODE, set, None, ip, syscall, 0);
    }
    phase
}

kprobe_and_fentry!(
    /// arm64 `do_mem_abort(far, esr, regs)`: no tracepoint carries the ESR
    /// there.
    mem_abort, mem_abort_fe, |ctx| try_mem_abort(ctx).unwrap_or(0)
);

#[inline(always)]
fn try_mem_abort<C: FnContext>(ctx: &C) -> Result<u32, ReadFailed> {
    let Some(s) = traced_thread(current_id()) else {
        return Ok(0);
    };
    let far = ctx.arg(0)?;
    let esr = ctx.arg(1)?;
    unsafe { (*s).on_exception(ExcArch::Arm64, far, esr) };
    Ok(0)
}
