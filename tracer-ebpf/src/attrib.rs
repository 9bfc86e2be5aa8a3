//! Attribution: where a counted event happened (its mapping), which user
//! instruction took it (its site), and the stacks asked for. Each is one
//! per-CPU map update per event, done only for what user space switched on
//! in `CONFIG`, so attribution off costs a config read.

use aya_ebpf::{
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_task_pt_regs},
    },
    programs::tracing::StackIdContext,
};
#[cfg(not(bpf_target_arch = "aarch64"))]
use faultscope_common::attrib::{PT_REGS_IP_X86_64, PT_REGS_SYSCALL_X86_64};
#[cfg(bpf_target_arch = "aarch64")]
use faultscope_common::attrib::{PT_REGS_PC_AARCH64, PT_REGS_SYSCALL_AARCH64};
use faultscope_common::{
    attrib::{syscall_key, MappingKey, SiteKey, StackKey, NO_STACK},
    class::{ClassSet, KernelClass},
    fault::Origin,
    maps::{Config, DropKind, PhaseId},
    pending::{self, PendingMapping},
};

use crate::{
    helpers::{drop_count, entry, pending_slot, FnContext, ReadFailed, BPF_NOEXIST},
    maps::{
        cfg, Conf, MAPPINGS, PENDING_MAPPINGS, SITES, STACK_COUNTS, STACK_TRACES, VMA_START_OFF, ZERO_COUNTS,
    },
    vma::describe,
};

/// `BPF_F_USER_STACK`: the user stack of the current task.
const BPF_F_USER_STACK: u64 = 1 << 8;

#[cfg(bpf_target_arch = "aarch64")]
const PT_REGS_IP: u64 = PT_REGS_PC_AARCH64;
#[cfg(not(bpf_target_arch = "aarch64"))]
const PT_REGS_IP: u64 = PT_REGS_IP_X86_64;

/// The system call number in the user `pt_regs` (x86-64 `orig_ax`, a
/// long; arm64 `syscallno`, an int): -1 outside a system call.
#[cfg(bpf_target_arch = "aarch64")]
#[inline(always)]
fn syscall_nr(regs: u64) -> i64 {
    unsafe { bpf_probe_read_kernel((regs + PT_REGS_SYSCALL_AARCH64) as *const i32) }.map_or(-1, |v| v as i64)
}
#[cfg(not(bpf_target_arch = "aarch64"))]
#[inline(always)]
fn syscall_nr(regs: u64) -> i64 {
    unsafe { bpf_probe_read_kernel((regs + PT_REGS_SYSCALL_X86_64) as *const i64) }.unwrap_or(-1)
}

/// The VMA start of `handle_mm_fault`'s `vma`, when mappings are counted.
#[inline(always)]
pub fn vma_start<C: FnContext>(ctx: &C, conf: &Conf, vma: u64) -> Result<u64, ReadFailed> {
    if conf.get(Config::Mappings) == 0 {
        return Ok(0);
    }
    ctx.read_at(vma, cfg(&VMA_START_OFF) as u64)
}

/// The site of a fault, when sites are counted: the faulting user
/// instruction from the fault's `pt_regs`; for a fault the kernel took for
/// the task (kernel or GUP origin), the user instruction that entered the
/// kernel and the system call it made (`SiteKey::syscall`), from the
/// task's user `pt_regs`.
#[inline(always)]
pub fn fault_site<C: FnContext>(
    ctx: &C,
    conf: &Conf,
    origin: Origin,
    regs: u64,
) -> Result<(u64, u32), ReadFailed> {
    if conf.get(Config::SiteClasses) == 0 {
        return Ok((0, 0));
    }
    if origin == Origin::User {
        return Ok((ctx.read_at(regs, PT_REGS_IP)?, 0));
    }
    Ok(task_site())
}

/// The user instruction that entered the kernel, and its system call, from
/// the current task's user `pt_regs`: the site of a fault the kernel took
/// for the task.
#[inline(always)]
pub fn task_site() -> (u64, u32) {
    // SAFETY: the helper takes the current task's trusted pointer.
    let user = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    if user == 0 {
        return (0, syscall_key(-1));
    }
    let ip = unsafe { bpf_probe_read_kernel((user + PT_REGS_IP) as *const u64) }.unwrap_or(0);
    (ip, syscall_key(syscall_nr(user)))
}

/// `pt_regs`' instruction pointer at `regs` (a kernel pointer).
#[inline(always)]
pub fn regs_ip(regs: u64) -> u64 {
    unsafe { bpf_probe_read_kernel((regs + PT_REGS_IP) as *const u64) }.unwrap_or(0)
}

/// This CPU's pending slot for a `MAPPINGS` key.
#[inline(always)]
fn mapping_slot(key: &MappingKey) -> Option<*mut PendingMapping> {
    pending_slot(&PENDING_MAPPINGS, pending::mapping_slot(key), key, |v| {
        let Some(dst) = entry(&MAPPINGS, &ZERO_COUNTS, &v.key) else { return false };
        v.end_run();
        pending::drain_counts(unsafe { &mut *dst }, &mut v.counts);
        true
    })
}

/// One event in every class of `bits` (a `ClassSet`) for its mapping, in
/// this CPU's pending slot. A slot taken over for this key (`run` 0) is
/// the first event of the mapping on this CPU in a while: the VMA at `vma`
/// (a kernel pointer; 0: none to hand) is described then, so that a
/// mapping costs one description, not one per fault. Not inlined: one
/// subprogram for the fault and the contpte programs.
#[inline(never)]
pub fn count_mapping(tgid: u32, phase: PhaseId, start: u64, bits: u32, vma: u64) {
    let key = MappingKey { tgid, phase, start };
    match mapping_slot(&key) {
        Some(v) => unsafe {
            if vma != 0 && (*v).run == 0 {
                describe(tgid, start, vma);
            }
            (*v).add(bits)
        },
        None => drop_count(DropKind::MappingsFull),
    }
}

#[inline(never)]
fn count_site(tgid: u32, phase: PhaseId, ip: u64, class: u32, syscall: u32) {
    let key = SiteKey { tgid, phase, ip, class, syscall };
    if let Some(n) = SITES.get_ptr_mut(&key) {
        unsafe { *n += 1 };
    } else if SITES.insert(&key, &1, BPF_NOEXIST).is_err() {
        // Another CPU's insert of the same key, or the map is full.
        match SITES.get_ptr_mut(&key) {
            Some(n) => unsafe { *n += 1 },
            None => drop_count(DropKind::SitesFull),
        }
    }
}

#[inline(never)]
fn count_stack(key: &StackKey) {
    if let Some(n) = STACK_COUNTS.get_ptr_mut(key) {
        unsafe { *n += 1 };
    } else if STACK_COUNTS.insert(key, &1, BPF_NOEXIST).is_err() {
        match STACK_COUNTS.get_ptr_mut(key) {
            Some(n) => unsafe { *n += 1 },
            None => drop_count(DropKind::StacksFull),
        }
    }
}

#[inline(always)]
fn stack_id<C: StackIdContext>(ctx: &C, flags: u64) -> i32 {
    match ctx.get_stackid(&STACK_TRACES, flags) {
        Ok(id) => id as i32,
        Err(_) => {
            drop_count(DropKind::StackLost);
            NO_STACK
        }
    }
}

/// Attributes an event of the classes in `set` (among `candidates`): to its
/// mapping (`mapping`: the VMA's start, and the VMA itself where it is
/// still valid, else 0; None where the program has no VMA), and,
/// for the classes switched on, to its site (`ip`, and `syscall`: see
/// `SiteKey::syscall`) and stacks. `caller`: see `StackKey::kernel_caller`
/// (0 where there is none).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn attribute<C: StackIdContext>(
    ctx: &C,
    conf: &Conf,
    tgid: u32,
    phase: PhaseId,
    candidates: &[KernelClass],
    set: ClassSet,
    mapping: Option<(u64, u64)>,
    ip: u64,
    syscall: u32,
    caller: u64,
) {
    if let (true, Some((start, vma))) = (conf.get(Config::Mappings) != 0, mapping) {
        count_mapping(tgid, phase, start, set.classes(), vma);
    }
    let sites = set.0 & conf.get(Config::SiteClasses);
    if sites != 0 {
        for &c in candidates {
            if sites & c.bit() != 0 {
                count_site(tgid, phase, ip, c as u32, syscall);
            }
        }
    }
    let user = set.0 & conf.get(Config::UserStackClasses);
    let kernel = set.0 & conf.get(Config::KernelStackClasses);
    if user | kernel != 0 {
        let u = if user != 0 { stack_id(ctx, BPF_F_USER_STACK) } else { NO_STACK };
        let k = if kernel != 0 { stack_id(ctx, 0) } else { NO_STACK };
        for &c in candidates {
            if (user | kernel) & c.bit() != 0 {
                let key = StackKey {
                    tgid,
                    phase,
                    class: c as u32,
                    user_stack: if user & c.bit() != 0 { u } else { NO_STACK },
                    kernel_stack: if kernel & c.bit() != 0 { k } else { NO_STACK },
                    _pad: 0,
                    kernel_caller: if kernel & c.bit() != 0 { caller } else { 0 },
                };
                count_stack(&key);
            }
        }
    }
}
