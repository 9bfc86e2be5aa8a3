//! Keys and values of the attribution maps: where a fault happened (its
//! mapping), which user instruction took it (its code site), and how the
//! code got there (user and kernel stacks). Aggregated in the kernel like
//! the class counts; nothing is sent per fault.

use crate::{class::KernelClass, maps::PhaseId};

/// `MappingKey::start` with this bit set is an address granule, not a VMA
/// start: the event had no fault (so no VMA) around it (a contpte unfold
/// from mprotect or madvise), and user space names it by the mapping that
/// contains the address. VMA starts are page-aligned, so the bit is free.
pub const START_IS_ADDR: u64 = 1;

/// The granule of an address key (a contpte block of 4K pages): bounded
/// keys for events outside a fault.
pub const ADDR_GRANULE: u64 = 64 << 10;

/// The key of an event outside a fault, at address `addr`.
#[inline(always)]
pub const fn addr_key(addr: u64) -> u64 {
    (addr & !(ADDR_GRANULE - 1)) | START_IS_ADDR
}

/// Key of `MAPPINGS`: per (process, phase, mapping).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappingKey {
    pub tgid: u32,
    pub phase: PhaseId,
    /// The VMA's `vm_start`, or an `addr_key`.
    pub start: u64,
}

/// Value of `MAPPINGS`: one counter per class, so one fault costs one map
/// update whatever the number of classes it falls in.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassCounts {
    pub counts: [u64; KernelClass::COUNT],
}

impl ClassCounts {
    pub const ZERO: ClassCounts = ClassCounts { counts: [0; KernelClass::COUNT] };

    /// Sum of per-CPU values (user space).
    pub fn merge(&mut self, other: &ClassCounts) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += *b;
        }
    }
}

/// Key of `SITES`: per (process, phase, class, user instruction pointer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteKey {
    pub tgid: u32,
    pub phase: PhaseId,
    /// The faulting user instruction (`pt_regs` ip/pc); for a fault the
    /// kernel took for the task (kernel or GUP origin), the user
    /// instruction that entered the kernel (the task's user `pt_regs`); 0
    /// when the event was not a fault (a syscall unfolding a contpte
    /// block).
    pub ip: u64,
    pub class: u32,
    /// For a fault the kernel took for the task: the system call it was
    /// in, plus 1 ([`syscall_key`]); 0 for a user-mode fault.
    pub syscall: u32,
}

/// `SiteKey::syscall` of a fault taken inside system call `nr` (the user
/// `pt_regs`' `orig_ax`/`syscallno`; negative outside one).
#[inline(always)]
pub const fn syscall_key(nr: i64) -> u32 {
    if nr < 0 || nr >= u32::MAX as i64 {
        NOT_IN_SYSCALL
    } else {
        nr as u32 + 1
    }
}

/// `SiteKey::syscall` of a kernel-side fault outside any system call
/// (signal delivery, an io_uring worker).
pub const NOT_IN_SYSCALL: u32 = u32::MAX;

/// A stack that was not asked for, or could not be taken.
pub const NO_STACK: i32 = -1;

/// Key of `STACK_COUNTS`: per (process, phase, class, user stack, kernel
/// stack, kernel caller), the stacks being ids in the `STACK_TRACES` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey {
    pub tgid: u32,
    pub phase: PhaseId,
    pub class: u32,
    pub user_stack: i32,
    pub kernel_stack: i32,
    pub _pad: u32,
    /// arm64: the link register at the probed function's entry, the return
    /// address into its direct caller, which the kernel's unwinder leaves
    /// out of a stack taken there (it starts from pc and the frame pointer,
    /// and the callee has not saved lr in a frame record yet). User space
    /// puts it back as the second frame. 0 elsewhere and without a kernel
    /// stack.
    pub kernel_caller: u64,
}

/// `pt_regs` offset of the user instruction pointer, in bytes: x86-64 `ip`
/// (checked against BTF by a tracer unit test) and arm64 `pc`. `pt_regs`
/// is the user-visible register layout, fixed per architecture.
pub const PT_REGS_IP_X86_64: u64 = 128;
pub const PT_REGS_PC_AARCH64: u64 = 256;
/// arm64 `pt_regs` offset of x30, the link register.
pub const PT_REGS_LR_AARCH64: u64 = 240;
/// `pt_regs` offset of the system call number: x86-64 `orig_ax` (checked
/// against BTF by a tracer unit test), arm64 `syscallno` (after
/// `user_regs` and `orig_x0`).
pub const PT_REGS_SYSCALL_X86_64: u64 = 120;
pub const PT_REGS_SYSCALL_AARCH64: u64 = 280;

/// Key of `VMAS`: a VMA of a process, by its start.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VmaKey {
    pub tgid: u32,
    pub _pad: u32,
    pub start: u64,
}

/// `VMAS`' bound: descriptions not yet read by user space (it takes them
/// out every tick).
pub const VMAS_ENTRIES: u32 = 16384;

/// Bytes of a VMA's file name kept in `VmaInfo` (NUL-terminated).
pub const VMA_NAME_LEN: usize = 64;

/// Value of `VMAS`: what names a mapping without `/proc/PID/maps`, read
/// from the VMA the first time a fault of the process counts in it, so
/// that a process gone before user space could read its maps still has
/// its mappings named.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmaInfo {
    /// `bpf_ktime_get_ns` when it was read: the VMA existed then.
    pub at: u64,
    pub end: u64,
    /// `vm_pgoff`: the file offset of `start`, in pages.
    pub pgoff: u64,
    pub flags: u64,
    /// The file's inode number and its superblock's `s_dev` (the kernel's
    /// encoding: major << 20 | minor); 0 for anonymous memory.
    pub ino: u64,
    pub dev: u32,
    /// Non-zero: the VMA maps a file (`vm_file`).
    pub file: u32,
    /// The file's name (its dentry's, not a path), NUL-terminated.
    pub name: [u8; VMA_NAME_LEN],
}

impl VmaInfo {
    pub const ZERO: VmaInfo =
        VmaInfo { at: 0, end: 0, pgoff: 0, flags: 0, ino: 0, dev: 0, file: 0, name: [0; VMA_NAME_LEN] };
}

/// Per CPU, the VMA the exception tracepoint last found for a fault (the
/// tracepoint has no VMA; finding one takes the mmap lock): the next fault
/// of the same process inside `[start, end)` takes its start from here
/// while the address space's write sequence (`mm_lock_seq`, where the
/// kernel has one) is `seq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LastVma {
    pub tgid: u32,
    pub seq: u32,
    pub start: u64,
    pub end: u64,
}

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::MappingKey {}
    unsafe impl aya::Pod for super::ClassCounts {}
    unsafe impl aya::Pod for super::SiteKey {}
    unsafe impl aya::Pod for super::StackKey {}
    unsafe impl aya::Pod for super::VmaKey {}
    unsafe impl aya::Pod for super::VmaInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_keys_are_granules_never_vma_starts() {
        let k = addr_key(0x7f12_3456_7000);
        assert_eq!(k & START_IS_ADDR, START_IS_ADDR);
        assert_eq!(k & !START_IS_ADDR, 0x7f12_3456_0000);
        assert_eq!(core::mem::size_of::<MappingKey>(), 16);
        assert_eq!(core::mem::size_of::<SiteKey>(), 24);
        assert_eq!(core::mem::size_of::<StackKey>(), 32);
    }

    #[test]
    fn syscall_keys() {
        assert_eq!(syscall_key(0), 1);
        assert_eq!(syscall_key(-1), NOT_IN_SYSCALL);
        assert_eq!(syscall_key(63), 64);
    }
}
