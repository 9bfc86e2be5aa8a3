//! Fault classes: what the kernel did with a fault, named after the kernel
//! path that did it.

use crate::fault::Origin;

/// Declares a `#[repr]` enum with its values, and `ALL` (every variant, in
/// declaration order) and `COUNT` from the same list, so that no variant can
/// be left out of either. The `keyed` form gives each variant its key (the
/// JSON key, the metric label) and a description for a human, as `key()`
/// and `describe()`.
#[macro_export]
macro_rules! catalogue {
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $repr:ident keyed {
            $($(#[$vmeta:meta])* $variant:ident = $value:literal => $key:literal, $what:literal;)*
        }
    ) => {
        $crate::catalogue! {
            $(#[$meta])*
            pub enum $name: $repr {
                $($(#[$vmeta])* $variant = $value,)*
            }
        }

        impl $name {
            /// The key in the report's JSON and in metric labels.
            pub const fn key(self) -> &'static str {
                match self {
                    $($name::$variant => $key,)*
                }
            }

            /// What it is, for a human.
            pub const fn describe(self) -> &'static str {
                match self {
                    $($name::$variant => $what,)*
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $name:ident: $repr:ty {
            $($(#[$vmeta:meta])* $variant:ident = $value:expr,)*
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)*
        }

        impl $name {
            pub const COUNT: usize = [$(stringify!($variant)),*].len();
            pub const ALL: [$name; $name::COUNT] = [$($name::$variant),*];
        }
    };
}

catalogue! {
    /// One counter (and, where it applies, one latency histogram) per
    /// process.
    ///
    /// The numeric values are the `class` field of [`crate::StatKey`]; they
    /// are an ABI between the eBPF object and user space, so only append.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub enum KernelClass: u16 {
        /// A user fault handled by `handle_mm_fault` (each call, retries included).
        Faults = 0,
        /// ... with `FAULT_FLAG_WRITE`.
        WriteFaults = 1,
        /// ... that reached `do_wp_page` (write-protect fault on a present PTE).
        WpFaults = 2,
        /// `do_wp_page` on a private mapping that did not install a new anon
        /// folio: COW **reuse**.
        Reuse = 3,
        /// `do_wp_page` that installed a new anon folio (`folio_add_new_anon_rmap`): COW **copy**.
        Copy = 4,
        /// A write fault on a present PTE that needed no write-protect handling:
        /// the PTE was already writable (stale TLB entry, or a racing thread).
        Spurious = 5,
        /// `do_huge_pmd_wp_page`: write-protect fault on a PMD-mapped THP.
        HugePmdWp = 6,
        /// arm64 `contpte_convert` to non-contiguous PTEs: a contpte block was
        /// unfolded (through `__contpte_try_unfold`, or directly as 7.x does
        /// from `contpte_ptep_set_access_flags`).
        ContpteUnfold = 7,
        /// arm64 `contpte_convert`: a block was rewritten (fold or unfold).
        ContpteConvert = 8,
        /// arm64 `__contpte_try_fold`: an attempt to fold (most fail).
        ContpteFoldAttempt = 9,
        /// `handle_mm_fault` returned `VM_FAULT_RETRY` (the fault is taken again).
        Retry = 10,
        /// `handle_mm_fault` returned an error (`VM_FAULT_ERROR`: SIGSEGV, SIGBUS, OOM...).
        Error = 11,
        /// `handle_mm_fault` returned `VM_FAULT_MAJOR` (I/O was needed).
        Major = 12,
        /// Tracepoint `exceptions:page_fault_user`: every user page-fault exception.
        TpFaults = 13,
        /// ... whose error code has the WRITE bit.
        TpWrite = 14,
        /// ... whose error code has PROT|WRITE: a write to a present page.
        TpPresentWrite = 15,
        /// ... whose error code lacks PROT: the page was not present (first touch,
        /// swap-in, NUMA hinting).
        TpNotPresent = 16,
        /// arm64 `__contpte_try_unfold` calls (6.12 unfolds through it).
        ContpteTryUnfold = 17,
        /// arm64 `contpte_convert` to contiguous PTEs: a block was folded.
        ContpteFold = 18,
        /// `do_wp_page` on a shared mapping (`wp_page_shared`, seen through its
        /// `fault_dirty_shared_page`): write-notify for dirty tracking
        /// (writeback, soft-dirty, `page_mkwrite`), no COW at all.
        WpShared = 19,
        /// A spurious fault while no other thread of the process was in a
        /// write-protect fault on that page: the CPU used a read-only TLB
        /// entry that outlived the PTE's upgrade to writable.
        SpuriousStaleTlb = 20,
        /// A spurious fault while another thread of the process was in a
        /// write-protect fault on that page (from its `do_wp_page` to its
        /// return): that thread made the PTE writable first.
        SpuriousRace = 21,
    }
}

impl KernelClass {
    /// The classes `ThreadFault::on_return` can produce: the kretprobe only
    /// walks these (walking all would make the verifier's work explode).
    pub const FAULT_RETURN: [KernelClass; 13] = [
        KernelClass::Faults,
        KernelClass::WriteFaults,
        KernelClass::WpFaults,
        KernelClass::Reuse,
        KernelClass::Copy,
        KernelClass::WpShared,
        KernelClass::Spurious,
        KernelClass::SpuriousStaleTlb,
        KernelClass::SpuriousRace,
        KernelClass::HugePmdWp,
        KernelClass::Retry,
        KernelClass::Error,
        KernelClass::Major,
    ];

    /// The arm64 contpte events (counted outside the fault path, attributed
    /// with the kernel's stack).
    pub const CONTPTE: [KernelClass; 5] = [
        KernelClass::ContpteUnfold,
        KernelClass::ContpteFold,
        KernelClass::ContpteConvert,
        KernelClass::ContpteTryUnfold,
        KernelClass::ContpteFoldAttempt,
    ];

    /// The classes `classify_x86_error_code` can produce.
    pub const ERROR_CODE: [KernelClass; 4] =
        [KernelClass::TpFaults, KernelClass::TpWrite, KernelClass::TpPresentWrite, KernelClass::TpNotPresent];

    pub const fn bit(self) -> u32 {
        1 << (self as u16)
    }
}

/// A set of classes, as a bit mask: one fault can fall in several classes
/// (a reuse is also a wp fault, a write fault and a fault). Bits
/// [`ORIGIN_SHIFT`].. hold the event's [`Origin`] (0: user) and bits
/// [`FOLIO_SHIFT`].. the order of the anon folio the fault mapped, so that
/// one entry of the kernel's `STATS` counts one (classes, origin, folio
/// size) triple.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassSet(pub u32);

/// Where a [`ClassSet`] keeps its origin: above every class bit.
pub const ORIGIN_SHIFT: u32 = 29;
pub const ORIGIN_MASK: u32 = 0b11 << ORIGIN_SHIFT;
/// Where a [`ClassSet`] keeps the order of the new anon folio its fault
/// mapped, plus one (0: the fault mapped none, or its order was not read):
/// below the origin, above every class bit. Five bits: orders 0 to 30.
pub const FOLIO_SHIFT: u32 = 24;
pub const FOLIO_MASK: u32 = 0b1_1111 << FOLIO_SHIFT;
const _: () = assert!(KernelClass::COUNT <= FOLIO_SHIFT as usize);
const _: () = assert!(FOLIO_MASK & ORIGIN_MASK == 0);

impl ClassSet {
    pub const fn with(self, c: KernelClass) -> ClassSet {
        ClassSet(self.0 | c.bit())
    }
    pub const fn has(self, c: KernelClass) -> bool {
        self.0 & c.bit() != 0
    }
    /// Whether the set is a fault's: it has a fault class, the fault path's
    /// or the tracepoint's (a contpte event's set has neither).
    pub const fn is_fault(self) -> bool {
        self.has(KernelClass::Faults) || self.has(KernelClass::TpFaults)
    }
    /// The same classes, of origin `o`.
    pub const fn with_origin(self, o: Origin) -> ClassSet {
        ClassSet((self.0 & !ORIGIN_MASK) | ((o as u32) << ORIGIN_SHIFT))
    }
    /// The same classes, of the origin numbered `o` as a thread's state
    /// stores it (a number `Origin::from_u32` does not know reads as user).
    /// Bit arithmetic, no branch: the verifier then walks what follows once,
    /// not once per origin.
    pub const fn with_origin_number(self, o: u32) -> ClassSet {
        ClassSet((self.0 & !ORIGIN_MASK) | ((o << ORIGIN_SHIFT) & ORIGIN_MASK))
    }
    /// With `c` where `flag` is 1, without it where 0 (only its low bit
    /// counts). No branch, as [`ClassSet::with_origin_number`].
    pub const fn with_flag(self, c: KernelClass, flag: u32) -> ClassSet {
        ClassSet(self.0 | ((flag & 1) << (c as u16)))
    }
    pub const fn origin(self) -> Origin {
        Origin::from_u32((self.0 & ORIGIN_MASK) >> ORIGIN_SHIFT)
    }
    /// The class bits alone.
    pub const fn classes(self) -> u32 {
        self.0 & !(ORIGIN_MASK | FOLIO_MASK)
    }
    /// The same classes, with a new anon folio of `order + 1` (0: none)
    /// mapped; orders past the field's 30 read as none.
    pub const fn with_folio(self, order_plus_1: u32) -> ClassSet {
        let f = if order_plus_1 > (FOLIO_MASK >> FOLIO_SHIFT) { 0 } else { order_plus_1 };
        ClassSet((self.0 & !FOLIO_MASK) | (f << FOLIO_SHIFT))
    }
    /// The order of the new anon folio the fault mapped, if it mapped one
    /// and its order was read.
    pub const fn folio_order(self) -> Option<u32> {
        match (self.0 & FOLIO_MASK) >> FOLIO_SHIFT {
            0 => None,
            f => Some(f - 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folio_order_and_origin_leave_the_classes_alone() {
        let s = ClassSet::default().with(KernelClass::Copy).with_origin(Origin::Gup).with_folio(5);
        assert_eq!(s.classes(), KernelClass::Copy.bit());
        assert_eq!((s.folio_order(), s.origin()), (Some(4), Origin::Gup));
        assert_eq!(s.with_folio(0).folio_order(), None);
        // Past the field's range: none, never a wrong order.
        assert_eq!(s.with_folio(32).folio_order(), None);
        assert_eq!(s.with_folio(31).folio_order(), Some(30));
    }

    #[test]
    fn the_branchless_forms_agree_with_the_named_ones() {
        let s = ClassSet::default().with(KernelClass::ContpteConvert).with_folio(3);
        for o in [Origin::User, Origin::Kernel, Origin::Gup] {
            assert_eq!(s.with_origin_number(o as u32), s.with_origin(o));
        }
        // An unknown number stays in its field and reads as user.
        assert_eq!(s.with_origin_number(7).origin(), Origin::User);
        assert_eq!(s.with_origin_number(7).classes(), s.classes());
        assert_eq!(s.with_flag(KernelClass::ContpteFold, 1), s.with(KernelClass::ContpteFold));
        assert_eq!(s.with_flag(KernelClass::ContpteFold, 0), s);
        assert_eq!(s.with_flag(KernelClass::ContpteFold, 2), s);
    }
}
