//! Keys and values of the attribution maps: where a fault happened (its
//! mapping), which user instruction took it (its code site), and how the
//! code got there (user and kernel stacks). Aggregated in the kernel like
//! the class counts; nothing is sent per fault.

use crate::{class::Class, maps::PhaseId};

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
    pub counts: [u64; Class::COUNT],
}

impl ClassCounts {
    pub const ZERO: ClassCounts = ClassCounts { counts: [0; Class::COUNT] };

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
    /// The faulting user instruction (`pt_regs` ip/pc); 0 when the event
    /// was not a fault (a syscall unfolding a contpte block).
    pub ip: u64,
    pub class: u32,
    pub _pad: u32,
}

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

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::MappingKey {}
    unsafe impl aya::Pod for super::ClassCounts {}
    unsafe impl aya::Pod for super::SiteKey {}
    unsafe impl aya::Pod for super::StackKey {}
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
}
