//! VMAs as the kernel has them: a description of each counted mapping
//! (`VMAS`), which names it once its process is gone and `/proc/PID/maps`
//! with it, and, for the exception tracepoint, which has no VMA of its own,
//! the start of the VMA a fault's address falls in.

use core::ffi::c_void;

use aya_ebpf::helpers::{
    bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    generated::{bpf_find_vma, bpf_get_current_task_btf},
};
use faultscope_common::attrib::{LastVma, VmaKey};

use crate::{
    helpers::BPF_NOEXIST,
    maps::{
        cfg, DENTRY_NAME_OFF, FILE_DENTRY_OFF, FILE_INODE_OFF, INODE_INO_OFF, INODE_SB_OFF, LAST_VMA,
        MM_LOCK_SEQ_OFF, SB_DEV_OFF, TASK_MM_OFF, VMAS, VMA_DESCRIBED, VMA_END_OFF, VMA_FILE_OFF,
        VMA_FLAGS_OFF, VMA_PGOFF_OFF, VMA_SCRATCH, VMA_START_OFF,
    },
};

/// The u64 at `p + off` (a kernel pointer and a BTF offset), 0 if unreadable.
#[inline(always)]
fn read(p: u64, off: &'static u32) -> u64 {
    unsafe { bpf_probe_read_kernel((p + cfg(off) as u64) as *const u64) }.unwrap_or(0)
}

/// Records the VMA at `vma` (a kernel pointer the caller holds valid) as
/// process `tgid`'s mapping at `start`, unless it is there already.
#[inline(never)]
pub fn describe(tgid: u32, start: u64, vma: u64) {
    if cfg(&VMA_DESCRIBED) == 0 {
        return;
    }
    let key = VmaKey { tgid, _pad: 0, start };
    if VMAS.get_ptr(&key).is_some() {
        return;
    }
    let Some(v) = VMA_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let v = unsafe { &mut *v };
    v.at = unsafe { bpf_ktime_get_ns() };
    v.end = read(vma, &VMA_END_OFF);
    v.pgoff = read(vma, &VMA_PGOFF_OFF);
    v.flags = read(vma, &VMA_FLAGS_OFF);
    let file = read(vma, &VMA_FILE_OFF);
    v.file = (file != 0) as u32;
    v.ino = 0;
    v.dev = 0;
    v.name[0] = 0;
    if file != 0 {
        let inode = read(file, &FILE_INODE_OFF);
        if inode != 0 {
            v.ino = read(inode, &INODE_INO_OFF);
            let sb = read(inode, &INODE_SB_OFF);
            if sb != 0 {
                // `s_dev` is a 32-bit dev_t: the low half (little-endian).
                v.dev = read(sb, &SB_DEV_OFF) as u32;
            }
        }
        let dentry = read(file, &FILE_DENTRY_OFF);
        let name = if dentry != 0 { read(dentry, &DENTRY_NAME_OFF) } else { 0 };
        if name != 0 {
            let _ = unsafe { bpf_probe_read_kernel_str_bytes(name as *const u8, &mut v.name) };
        }
    }
    let _ = VMAS.insert(&key, v, BPF_NOEXIST);
}

/// The current address space's write sequence, 0 where the kernel has
/// none (see `LastVma`). Plain loads through the task's BTF pointer (the
/// verifier checks them against BTF and makes a faulting one read 0): no
/// helper call on the tracepoint's every fault.
#[inline(always)]
fn mm_seq() -> u32 {
    if cfg(&MM_LOCK_SEQ_OFF) == 0 {
        return 0;
    }
    let task = unsafe { bpf_get_current_task_btf() } as *const u8;
    let mm = unsafe { core::ptr::read_volatile(task.wrapping_add(cfg(&TASK_MM_OFF)) as *const u64) };
    if mm == 0 {
        return 0;
    }
    unsafe { core::ptr::read_volatile((mm as *const u8).wrapping_add(cfg(&MM_LOCK_SEQ_OFF)) as *const u32) }
}

/// What `bpf_find_vma`'s callback gives back.
#[repr(C)]
struct Found {
    tgid: u32,
    start: u64,
    end: u64,
}

/// `bpf_find_vma`'s callback: the VMA is valid (its mm's lock held) only
/// here, so it is described here.
#[inline(never)]
extern "C" fn on_vma(_task: *mut c_void, vma: *mut c_void, found: *mut c_void) -> i64 {
    let f = unsafe { &mut *(found as *mut Found) };
    let vma = vma as u64;
    f.start = read(vma, &VMA_START_OFF);
    f.end = read(vma, &VMA_END_OFF);
    describe(f.tgid, f.start, vma);
    0
}

/// The start of the current process's (`tgid`'s) VMA containing `addr`, or
/// 0 when it cannot be had: the mmap lock busy (`bpf_find_vma` only tries
/// it), no VMA there, or no `vm_end` offset. A miss in `LAST_VMA` costs a
/// VMA lookup under the lock, whose release the kernel defers to an
/// irq_work (the tracepoint runs with interrupts off).
#[inline(never)]
pub fn vma_start_at(tgid: u32, addr: u64) -> u64 {
    if cfg(&VMA_END_OFF) == 0 {
        return 0;
    }
    let Some(c) = LAST_VMA.get_ptr_mut(0) else {
        return 0;
    };
    let c = unsafe { &mut *c };
    let seq = mm_seq();
    if c.tgid == tgid && c.start <= addr && addr < c.end && c.seq == seq {
        return c.start;
    }
    let mut found = Found { tgid, start: 0, end: 0 };
    let r = unsafe {
        bpf_find_vma(
            bpf_get_current_task_btf(),
            addr,
            on_vma as *mut c_void,
            &mut found as *mut Found as *mut c_void,
            0,
        )
    };
    if r != 0 || found.start == 0 || found.end <= addr {
        return 0;
    }
    *c = LastVma { tgid, seq, start: found.start, end: found.end };
    found.start
}
