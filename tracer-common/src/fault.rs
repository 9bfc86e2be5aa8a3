//! Per-thread fault state machine and the classification rule.
//!
//! One [`ThreadFault`] per traced thread lives in the thread's task-local
//! storage. The probes feed it in the order the kernel runs them:
//!
//! ```text
//! exception (x86 tracepoints page_fault_user/page_fault_kernel, arm64 do_mem_abort)
//!   -> handle_mm_fault entry        (every call by a traced task: its Origin)
//!      -> do_wp_page | do_huge_pmd_wp_page | folio_add_new_anon_rmap  (marks)
//!   <- handle_mm_fault return       (classify, account, clear)
//! ```
//!
//! In exit-only mode (x86 with fexit) there is no entry program: the
//! exception opens the fault ([`ThreadFault::open_at_exception`]), the
//! fexit reads the call's arguments and closes it
//! ([`ThreadFault::at_return`]); a call no exception opened
//! (get_user_pages) is opened by its first mark or its return, untimed, and
//! a retried call by the return that retried it.
//!
//! Every fault the kernel accounts to the task (`mm_account_fault()`: the
//! task's `min_flt`/`maj_flt`) goes through `handle_mm_fault` with the task
//! as `current`, whatever its origin: a user-mode fault, a fault the kernel
//! takes on user memory inside a system call (`copy_to_user`), or
//! get_user_pages on the task's behalf.
//!
//! A fault retried after `VM_FAULT_RETRY` enters `handle_mm_fault` again and is
//! classified again, exactly as the kernel (and tracefs' kprobe_profile) sees it.

use crate::class::{ClassSet, KernelClass};

/// `enum fault_flag` (include/linux/mm_types.h), stable since 5.x.
pub const FAULT_FLAG_WRITE: u32 = 1 << 0;
/// The fault was retried after `VM_FAULT_RETRY`: `mm_account_fault()`
/// then counts it as major.
pub const FAULT_FLAG_TRIED: u32 = 1 << 5;
pub const FAULT_FLAG_USER: u32 = 1 << 6;

crate::catalogue! {
    /// Who asked `handle_mm_fault` for a fault of the current task.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    pub enum Origin: u32 {
        /// The CPU faulted in user mode (`regs` set, `FAULT_FLAG_USER`).
        User = 0,
        /// The kernel faulted on user memory while it ran a system call for the
        /// task (`copy_to_user`, `copy_from_user`, futex): `regs` set, no
        /// `FAULT_FLAG_USER`.
        Kernel = 1,
        /// get_user_pages for the task (`/proc/PID/mem`, `process_vm_writev`,
        /// O_DIRECT, io_uring, ptrace, exec's argument copy): `regs == NULL`.
        Gup = 2,
    }
}

impl Origin {
    /// The origin of `handle_mm_fault(vma, address, flags, regs)`.
    #[inline(always)]
    pub const fn of(flags: u32, regs: u64) -> Origin {
        if regs == 0 {
            Origin::Gup
        } else if flags & FAULT_FLAG_USER != 0 {
            Origin::User
        } else {
            Origin::Kernel
        }
    }

    /// From its number (`ClassSet::origin`); an unknown number is `User`.
    #[inline(always)]
    pub const fn from_u32(v: u32) -> Origin {
        match v {
            1 => Origin::Kernel,
            2 => Origin::Gup,
            _ => Origin::User,
        }
    }

    /// The report's name (JSON key, `serve`'s `origin` label).
    pub const fn name(self) -> &'static str {
        match self {
            Origin::User => "user",
            Origin::Kernel => "kernel",
            Origin::Gup => "gup",
        }
    }
}

/// `vm_fault_t` bits (include/linux/mm_types.h).
pub const VM_FAULT_OOM: u32 = 0x0001;
pub const VM_FAULT_SIGBUS: u32 = 0x0002;
pub const VM_FAULT_MAJOR: u32 = 0x0004;
pub const VM_FAULT_HWPOISON: u32 = 0x0010;
pub const VM_FAULT_HWPOISON_LARGE: u32 = 0x0020;
pub const VM_FAULT_SIGSEGV: u32 = 0x0040;
pub const VM_FAULT_RETRY: u32 = 0x0400;
pub const VM_FAULT_FALLBACK: u32 = 0x0800;
/// The fault completed with the mmap lock (or the VMA's) already dropped.
pub const VM_FAULT_COMPLETED: u32 = 0x4000;

/// Whether a `handle_mm_fault` that returned `ret` still holds its VMA's
/// lock (no retry, not completed unlocked): only then is its `vma` valid
/// at the return.
#[inline(always)]
pub const fn vma_kept(ret: u32) -> bool {
    ret & (VM_FAULT_RETRY | VM_FAULT_COMPLETED) == 0
}
pub const VM_FAULT_ERROR: u32 = VM_FAULT_OOM
    | VM_FAULT_SIGBUS
    | VM_FAULT_SIGSEGV
    | VM_FAULT_HWPOISON
    | VM_FAULT_HWPOISON_LARGE
    | VM_FAULT_FALLBACK;

/// x86 page-fault error code bits (arch/x86/include/asm/trap_pf.h).
pub const X86_PF_PROT: u64 = 1 << 0;
pub const X86_PF_WRITE: u64 = 1 << 1;
pub const X86_PF_USER: u64 = 1 << 2;

/// arm64 ESR: fault status code type (ESR_ELx_FSC_TYPE) and permission fault.
pub const ESR_ELX_FSC_TYPE: u64 = 0x3c;
pub const ESR_ELX_FSC_PERM: u64 = 0x0c;

/// Which exception record the thread state holds, so that user space can say
/// how "present" was decided.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExcArch {
    X86 = 1,
    Arm64 = 2,
}

/// `seen` bits of [`ThreadFault`].
pub const SEEN_IN_FAULT: u32 = 1 << 0;
pub const SEEN_WP: u32 = 1 << 1;
pub const SEEN_HUGE_WP: u32 = 1 << 2;
pub const SEEN_NEW_ANON: u32 = 1 << 3;
pub const SEEN_EXC: u32 = 1 << 4;
/// `ptep_set_access_flags` (or its contpte / PMD variants) ran: the fault
/// reached `handle_pte_fault`'s tail on a present entry that needed no
/// write-protect handling. Tells "present" where no exception record can
/// (arm64's `do_mem_abort` is on the kprobe blacklist).
pub const SEEN_ACCESS: u32 = 1 << 5;
/// `fault_dirty_shared_page` ran: the fault wrote to a shared mapping's page
/// (`wp_page_shared` after `do_wp_page`, or `do_shared_fault` on a page not
/// yet mapped). `wp_page_shared` is inline; this is its probeable tail.
pub const SEEN_DIRTY_SHARED: u32 = 1 << 6;
/// The fault in progress is timed (`--latency`): its entry read the clock,
/// and its marks and return read it too.
pub const SEEN_TIMED: u32 = 1 << 7;
/// Exit-only mode: the fault in progress was opened by its exception
/// (`start_ns` is the exception's time, `fault_addr` its address).
pub const SEEN_FROM_EXC: u32 = 1 << 8;
/// `wp_gen` holds the generation of the page's bucket ([`WpPage`]) when a
/// write to it opened: at its exception (x86, interrupts still off), else
/// at `handle_mm_fault`'s entry.
pub const SEEN_WP_GEN: u32 = 1 << 9;
/// The call before this one was a write-protect fault on a PMD-mapped THP
/// that returned `VM_FAULT_RETRY` (a private file THP's PMD split, then the
/// PTE path asked for the mmap lock): this retried call's new anon folio,
/// with no write-protect fault of its own, is that write's copy
/// (`do_cow_fault` on the entry the split dropped).
pub const SEEN_HUGE_WP_RETRIED: u32 = 1 << 10;
const _: () = assert!(SEEN_HUGE_WP_RETRIED == VM_FAULT_RETRY && SEEN_HUGE_WP << 8 == SEEN_HUGE_WP_RETRIED);
/// Bits [`SEEN_FOLIO_SHIFT`].. of `seen`: the order of the new anon folio
/// the fault mapped, plus one (see [`ThreadFault::note_folio`]), carried
/// into the set's [`crate::class::FOLIO_SHIFT`] bits at the return.
pub const SEEN_FOLIO_SHIFT: u32 = 24;
const SEEN_FOLIO_MASK: u32 = 0b1_1111 << SEEN_FOLIO_SHIFT;

/// Pages are 4K on every kernel the tool targets for exception matching; a
/// coarser page only makes the match looser, never wrong for one thread.
const PAGE_MASK: u64 = !0xfff;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadFault {
    pub start_ns: u64,
    pub fault_addr: u64,
    /// Faulting address of the last exception this thread took.
    pub exc_addr: u64,
    /// x86 error code or arm64 ESR of that exception.
    pub exc_code: u64,
    pub exc_arch: u32,
    pub flags: u32,
    pub seen: u32,
    /// The fault's [`Origin`].
    pub origin: u32,
    /// The faulting VMA's start (attribution by mapping; 0 when off).
    pub vma_start: u64,
    /// The faulting VMA itself (a kernel pointer; 0 when mappings are
    /// off), valid until the call returns without dropping its lock.
    pub vma: u64,
    /// The faulting user instruction (attribution by site; 0 when off);
    /// for a kernel or GUP fault, where user mode entered the kernel.
    pub ip: u64,
    /// `SiteKey::syscall` of the fault (0 for a user-mode fault).
    pub syscall: u32,
    /// The `TARGETS_EPOCH` (plus 1) at which the thread's process was last
    /// found in the traced set; 0: not known to be traced.
    pub traced: u32,
    /// The time faultscope's programs nested in the fault in progress
    /// measured of themselves (taken out of its latency).
    pub own_ns: u64,
    /// The classes of the fault last classified, as [`Self::opaque`] reads
    /// them back.
    pub set: u32,
    /// See [`SEEN_WP_GEN`].
    pub wp_gen: u32,
}

impl ThreadFault {
    /// `set`, stored in this thread's state and read back. In the kernel the
    /// state is map memory, whose contents the verifier does not track: it
    /// then sees one unknown value instead of each of the constants that
    /// `on_return`'s branches combine (hundreds), every one of which it
    /// would otherwise walk the rest of the program with, flushes included.
    #[inline(always)]
    pub fn opaque(&mut self, set: ClassSet) -> ClassSet {
        // SAFETY: a valid, aligned field of `self`.
        unsafe {
            core::ptr::write_volatile(&mut self.set, set.0);
            ClassSet(core::ptr::read_volatile(&self.set))
        }
    }

    /// The CPU raised a page-fault exception (before the kernel handles it).
    #[inline(always)]
    pub fn on_exception(&mut self, arch: ExcArch, addr: u64, code: u64) {
        self.exc_arch = arch as u32;
        self.exc_addr = addr;
        self.exc_code = code;
        // A new exception is a new fault: no retry carries into it.
        self.seen &= !(SEEN_WP_GEN | SEEN_HUGE_WP_RETRIED);
        self.seen |= SEEN_EXC;
    }

    /// Exit-only mode (x86 with fexit: the exception opens a fault, the
    /// return closes it, no entry program): the CPU raised a page-fault
    /// exception, which opens the fault `handle_mm_fault` is about to
    /// handle, timed from `start_ns` when `timed`. Whatever an earlier
    /// exception left open (one the kernel never handed to
    /// `handle_mm_fault`: a SIGSEGV, a fixup) is forgotten.
    #[inline(always)]
    pub fn open_at_exception(&mut self, arch: ExcArch, addr: u64, code: u64, timed: bool, start_ns: u64) {
        self.on_exception(arch, addr, code);
        self.start_ns = start_ns;
        self.fault_addr = addr;
        self.own_ns = 0;
        let timed = if timed { SEEN_TIMED } else { 0 };
        self.seen = SEEN_EXC | SEEN_FROM_EXC | SEEN_IN_FAULT | timed;
    }

    /// Exit-only mode: a call of `handle_mm_fault` that no exception opened
    /// (get_user_pages) reached a mark or its return first: opened there,
    /// untimed, keeping the exception record.
    #[inline(always)]
    pub fn open_untimed(&mut self) {
        self.start_ns = 0;
        self.fault_addr = 0;
        self.own_ns = 0;
        self.seen = (self.seen & SEEN_EXC) | SEEN_IN_FAULT;
    }

    /// Exit-only mode: `handle_mm_fault(.., addr, flags, ..)` of `origin`
    /// returns. Opens the call untimed if nothing did; it stays timed only
    /// if what opened it was this call's: the exception of this page (not
    /// for get_user_pages, which raises none) or this page's retry.
    /// Returns whether it is timed.
    #[inline(always)]
    pub fn at_return(&mut self, addr: u64, flags: u32, origin: Origin) -> bool {
        if self.seen & SEEN_IN_FAULT == 0 {
            self.open_untimed();
        }
        let ours = (self.fault_addr & PAGE_MASK) == (addr & PAGE_MASK)
            && !(origin as u32 == Origin::Gup as u32 && self.seen & SEEN_FROM_EXC != 0);
        if !ours {
            self.seen &= !(SEEN_TIMED | SEEN_WP_GEN);
        }
        self.fault_addr = addr;
        self.flags = flags;
        self.origin = origin as u32;
        self.timed()
    }

    /// Exit-only mode, after [`Self::on_return`] of a call that returned
    /// `VM_FAULT_RETRY`: the kernel calls again for the same address, with
    /// no new exception. That call opens here, timed from `start_ns` (this
    /// return) when `timed`. (Plain arguments, not an `Option`: a `None`'s
    /// undefined payload spilled to the stack fails older verifiers.)
    #[inline(always)]
    pub fn reopen_for_retry(&mut self, timed: bool, start_ns: u64) {
        self.start_ns = start_ns;
        self.own_ns = 0;
        let timed = if timed { SEEN_TIMED } else { 0 };
        self.seen = (self.seen & (SEEN_EXC | SEEN_HUGE_WP_RETRIED)) | SEEN_IN_FAULT | timed;
    }

    /// `handle_mm_fault` entered for a fault of this thread. Returns true
    /// when the thread's previous fault never returned (its kretprobe was
    /// missed): that one was not classified. `start_ns`: the clock at
    /// entry, for a fault that is timed.
    #[inline(always)]
    pub fn on_entry(&mut self, start_ns: Option<u64>, addr: u64, flags: u32, origin: Origin) -> bool {
        let lost = self.seen & SEEN_IN_FAULT != 0;
        self.start_ns = start_ns.unwrap_or(0);
        self.fault_addr = addr;
        self.flags = flags;
        self.origin = origin as u32;
        self.own_ns = 0;
        // Keep the exception record, and its generation if it is this
        // fault's; forget the marks of the previous fault.
        let timed = if start_ns.is_some() { SEEN_TIMED } else { 0 };
        let keep =
            SEEN_EXC | SEEN_HUGE_WP_RETRIED | if self.own_exception(self.seen) { SEEN_WP_GEN } else { 0 };
        self.seen = (self.seen & keep) | SEEN_IN_FAULT | timed;
        lost
    }

    /// A write opens on a page whose bucket is at generation `gen`
    /// ([`WpPage`]): the spurious split compares it at the return.
    #[inline(always)]
    pub fn note_wp_gen(&mut self, gen: u32) {
        self.wp_gen = gen;
        self.seen |= SEEN_WP_GEN;
    }

    /// Whether the fault in progress has its own exception's record: not
    /// get_user_pages, which raises none, and of its page.
    #[inline(always)]
    fn own_exception(&self, seen: u32) -> bool {
        seen & SEEN_EXC != 0
            && self.origin != Origin::Gup as u32
            && (self.exc_addr & PAGE_MASK) == (self.fault_addr & PAGE_MASK)
    }

    /// The generation noted when the fault in progress opened, or
    /// [`NO_GEN`] (read before [`Self::on_return`], which forgets it).
    #[inline(always)]
    pub fn gen_at_open(&self) -> u64 {
        if self.seen & SEEN_WP_GEN != 0 {
            self.wp_gen as u64
        } else {
            NO_GEN
        }
    }

    /// Whether the fault in progress is timed.
    #[inline(always)]
    pub fn timed(&self) -> bool {
        self.seen & (SEEN_IN_FAULT | SEEN_TIMED) == SEEN_IN_FAULT | SEEN_TIMED
    }

    /// Whether a fault of this thread is in progress.
    #[inline(always)]
    pub fn in_fault(&self) -> bool {
        self.seen & SEEN_IN_FAULT != 0
    }

    /// A probe inside the fault fired (do_wp_page, ...): remember it, but only
    /// while a fault of this thread is in progress (the same functions run
    /// outside faults too: mprotect, KSM, khugepaged).
    #[inline(always)]
    pub fn mark(&mut self, bit: u32) {
        if self.seen & SEEN_IN_FAULT != 0 {
            self.seen |= bit;
        }
    }

    /// The fault in progress mapped a new anon folio of `order` (the last
    /// one it mapped, if it mapped several).
    #[inline(always)]
    pub fn note_folio(&mut self, order: u32) {
        if self.seen & SEEN_IN_FAULT != 0 {
            let f = if order < 31 { order + 1 } else { 0 };
            self.seen = (self.seen & !SEEN_FOLIO_MASK) | (f << SEEN_FOLIO_SHIFT);
        }
    }

    /// A program nested in the fault in progress ran from `from_ns` to
    /// `to_ns` (its own clock reads): not the fault's time.
    #[inline(always)]
    pub fn own_time(&mut self, from_ns: u64, to_ns: u64) {
        if self.timed() {
            self.own_ns += to_ns.saturating_sub(from_ns);
        }
    }

    /// Whether the page was present, given what the fault has `seen`: from
    /// the exception record when it is the one being handled (a permission
    /// fault, not a translation fault), else from the kernel having taken
    /// the present-entry path.
    #[inline(always)]
    fn present_with(&self, seen: u32) -> Option<bool> {
        // get_user_pages takes no exception: a record is another fault's.
        if !self.own_exception(seen) {
            return if seen & SEEN_ACCESS != 0 { Some(true) } else { None };
        }
        if self.exc_arch == ExcArch::X86 as u32 {
            Some(self.exc_code & X86_PF_PROT != 0)
        } else if self.exc_arch == ExcArch::Arm64 as u32 {
            Some(self.exc_code & ESR_ELX_FSC_TYPE == ESR_ELX_FSC_PERM)
        } else {
            None
        }
    }

    /// `handle_mm_fault` returned `ret`: the classes this call falls in,
    /// with the fault's origin. Returns `None` when no fault of this
    /// thread was in progress.
    ///
    /// The rules:
    /// - `faults`: every return; `write_faults`: FAULT_FLAG_WRITE.
    /// - `wp_faults`: reached `do_wp_page`; of those, `wp_shared` if it also
    ///   reached `fault_dirty_shared_page` (a shared mapping: write-notify,
    ///   not COW), else `copy` if it reached `folio_add_new_anon_rmap` (a
    ///   new anon folio replaced the old one), else `reuse` (`wp_page_reuse`
    ///   is inline and cannot be probed).
    /// - `huge_pmd_wp`: reached `do_huge_pmd_wp_page`, or within the fault
    ///   `__split_huge_pmd` (a private file THP) or `do_huge_pmd_exec_cow`;
    ///   with a new anon folio and no `do_wp_page` it is also a `copy` (the
    ///   THP copied whole, or a file THP's page copied after the split).
    /// - `spurious`: a write fault, completed (no RETRY, no error), on a page
    ///   that was present (x86: the exception's error code has PROT; else:
    ///   the kernel reached `ptep_set_access_flags` & co.), that reached
    ///   neither write-protect handler nor a path installing a new anon
    ///   folio: the kernel found the PTE writable already
    ///   (`handle_pte_fault`'s "already writable" path), i.e. the CPU faulted
    ///   on a stale read-only TLB entry or lost a race.
    #[inline(always)]
    pub fn on_return(&mut self, ret: u32) -> Option<ClassSet> {
        if self.seen & SEEN_IN_FAULT == 0 {
            return None;
        }
        let seen = self.seen;
        // A retry enters again without a new exception: it keeps the
        // record. A completed fault's record serves no later fault (each
        // raises its own; get_user_pages ignores it), and a thread with
        // nothing open leaves no state behind when switched out.
        self.seen &= if ret & VM_FAULT_RETRY != 0 { SEEN_EXC } else { 0 };
        // A retried PMD write-protect fault leaves its bit, without a
        // branch (the verifier walks the rest of the program once per
        // branch): `VM_FAULT_RETRY` and `SEEN_HUGE_WP << 8` are that bit.
        self.seen |= ret & VM_FAULT_RETRY & ((seen & SEEN_HUGE_WP) << 8);
        let mut set =
            ClassSet::default().with(KernelClass::Faults).with_origin(Origin::from_u32(self.origin));
        let write = self.flags & FAULT_FLAG_WRITE != 0;
        if write {
            set = set.with(KernelClass::WriteFaults);
        }
        if ret & VM_FAULT_RETRY != 0 {
            set = set.with(KernelClass::Retry);
        }
        if ret & VM_FAULT_ERROR != 0 {
            set = set.with(KernelClass::Error);
        }
        if ret & VM_FAULT_MAJOR != 0 {
            set = set.with(KernelClass::Major);
        }
        if seen & SEEN_WP != 0 {
            set = set.with(KernelClass::WpFaults);
            set = set.with(if seen & SEEN_DIRTY_SHARED != 0 {
                KernelClass::WpShared
            } else if seen & SEEN_NEW_ANON != 0 {
                KernelClass::Copy
            } else {
                KernelClass::Reuse
            });
        }
        if seen & SEEN_HUGE_WP != 0 {
            set = set.with(KernelClass::HugePmdWp);
        }
        // A new anon folio with no PTE write-protect fault, in a PMD
        // write-protect fault or the call that retried one (its bit `>> 8`
        // is `SEEN_HUGE_WP`): the THP itself copied, or a private file
        // THP's PMD dropped and the page written copied from the file
        // (`do_cow_fault`).
        let pmd = seen | ((seen & SEEN_HUGE_WP_RETRIED) >> 8);
        if pmd & (SEEN_HUGE_WP | SEEN_WP | SEEN_NEW_ANON) == SEEN_HUGE_WP | SEEN_NEW_ANON {
            set = set.with(KernelClass::Copy);
        }
        let handled = seen & (SEEN_WP | SEEN_HUGE_WP | SEEN_NEW_ANON | SEEN_DIRTY_SHARED) != 0;
        let completed = ret & (VM_FAULT_RETRY | VM_FAULT_ERROR) == 0;
        if write && !handled && completed && self.present_with(seen) == Some(true) {
            set = set.with(KernelClass::Spurious);
        }
        Some(set.with_folio((seen & SEEN_FOLIO_MASK) >> SEEN_FOLIO_SHIFT))
    }
}

/// No bucket generation was noted when the fault opened.
pub const NO_GEN: u64 = u64::MAX;

/// Buckets of the `WP_PAGES` array (24 bytes each: 96 KiB).
pub const WP_PAGE_BUCKETS: u32 = 4096;

/// The write-protect fault last seen on the pages of one bucket of
/// (process, page): what tells a spurious fault that lost a race to
/// another thread from one taken on a stale TLB entry. A write-protect
/// fault enters it at `do_wp_page` (busy) and leaves it at its return (not
/// busy, the generation moved); a write notes the generation when it opens.
/// A spurious fault raced when another thread of its process was in a
/// write-protect fault on its page at some time from its open to its
/// return: busy then, or left since. A race whose winner returned between
/// the CPU's page walk and the fault's open reads as stale TLB: on x86 the
/// open is the exception, with interrupts still off; on arm64 it is
/// `handle_mm_fault`'s entry, after the VMA lookup, where a thread
/// preempted since its exception can lose a whole race unseen (fentry on
/// `do_mem_abort` would close that window at about 280 ns on every fault
/// of every process: docs/cost.md). Two pages that share a bucket overwrite
/// each other's entry, so a race whose entry was overwritten before the
/// spurious fault returned reads as stale TLB too (with 4,096 buckets,
/// only a thread that takes write-protect faults on thousands of pages
/// during one fault of another could do that).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WpPage {
    /// The page's address (`PAGE_MASK`ed).
    pub page: u64,
    /// `pid_tgid` of the thread whose write-protect fault it was.
    pub id: u64,
    /// Write-protect faults that returned on this bucket (wraps).
    pub gen: u32,
    /// 1 from that fault's `do_wp_page` to its return.
    pub busy: u32,
}

impl WpPage {
    /// The bucket of `addr` in process `tgid`.
    #[inline(always)]
    pub const fn bucket(tgid: u32, addr: u64) -> u32 {
        let page = addr >> 12;
        ((page ^ (page >> 16) ^ (tgid as u64).wrapping_mul(0x9e37_79b9)) as u32) & (WP_PAGE_BUCKETS - 1)
    }

    /// Thread `id` reached `do_wp_page` for `addr`.
    #[inline(always)]
    pub fn enter(&mut self, id: u64, addr: u64) {
        self.page = addr & PAGE_MASK;
        self.id = id;
        self.busy = 1;
    }

    /// Thread `id`'s write-protect fault on `addr` returned.
    #[inline(always)]
    pub fn leave(&mut self, id: u64, addr: u64) {
        if self.id == id && self.page == addr & PAGE_MASK {
            self.busy = 0;
        }
        self.gen = self.gen.wrapping_add(1);
    }

    /// Whether a spurious fault of thread `id` on `addr`, opened when this
    /// bucket was at `gen_at_open` (or [`NO_GEN`]: then only a fault busy
    /// now counts), raced another thread's write-protect fault.
    #[inline(always)]
    pub fn raced(&self, id: u64, addr: u64, gen_at_open: u64) -> bool {
        self.page == addr & PAGE_MASK
            && self.id >> 32 == id >> 32
            && self.id != id
            && (self.busy != 0 || (gen_at_open != NO_GEN && gen_at_open != self.gen as u64))
    }
}

/// A spurious fault's `set`, with the half of the split `raced` says.
#[inline(always)]
pub fn split_spurious(set: ClassSet, raced: bool) -> ClassSet {
    set.with(if raced { KernelClass::SpuriousRace } else { KernelClass::SpuriousStaleTlb })
}

/// Classes of one `exceptions:page_fault_user` event (x86 error code), the
/// tracepoint-only view of a fault.
#[inline(always)]
pub fn classify_x86_error_code(code: u64) -> ClassSet {
    let mut set = ClassSet::default().with(KernelClass::TpFaults);
    if code & X86_PF_WRITE != 0 {
        set = set.with(KernelClass::TpWrite);
        if code & X86_PF_PROT != 0 {
            set = set.with(KernelClass::TpPresentWrite);
        }
    }
    if code & X86_PF_PROT == 0 {
        set = set.with(KernelClass::TpNotPresent);
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u32 = FAULT_FLAG_WRITE | FAULT_FLAG_USER;
    const R: u32 = FAULT_FLAG_USER;
    const A: u64 = 0x7f00_0000_1000;

    /// One fault through the state machine: exception, entry, marks, return.
    fn fault(
        t: &mut ThreadFault,
        exc: Option<(ExcArch, u64)>,
        flags: u32,
        marks: &[u32],
        ret: u32,
    ) -> ClassSet {
        if let Some((arch, code)) = exc {
            t.on_exception(arch, A + 0x10, code);
        }
        assert!(!t.on_entry(Some(1_000), A + 0x20, flags, Origin::of(flags, 1)), "no fault left open");
        for m in marks {
            t.mark(*m);
        }
        t.on_return(ret).expect("a user fault was in progress")
    }

    const T: u64 = (7 << 32) | 7;
    const U: u64 = (7 << 32) | 8;

    #[test]
    fn a_new_folios_order_goes_with_its_fault_only() {
        let mut t = ThreadFault::default();
        // Outside a fault (khugepaged, a fork's copy): nothing noted.
        t.note_folio(9);
        assert!(!t.on_entry(None, A, W, Origin::User));
        t.mark(SEEN_WP);
        t.mark(SEEN_NEW_ANON);
        t.note_folio(4);
        let s = t.on_return(0).unwrap();
        assert!(s.has(KernelClass::Copy));
        assert_eq!(
            (s.folio_order(), s.classes() & !KernelClass::ALL.iter().fold(0, |m, c| m | c.bit())),
            (Some(4), 0)
        );
        // The next fault maps none; a retried one keeps none either.
        let s = fault(&mut t, None, W, &[SEEN_WP], 0);
        assert_eq!(s.folio_order(), None);
        assert!(!t.on_entry(None, A, W, Origin::User));
        t.note_folio(0);
        assert_eq!(t.on_return(VM_FAULT_RETRY).unwrap().folio_order(), Some(0));
        assert_eq!(fault(&mut t, None, W, &[], 0).folio_order(), None);
    }

    #[test]
    fn a_spurious_fault_raced_only_a_write_protect_fault_of_another_thread_during_it() {
        let mut b = WpPage::default();
        // Another thread's fault on the page returned before this one
        // opened: the generation noted at the open already counts it.
        b.enter(U, A);
        b.leave(U, A);
        let gen = b.gen as u64;
        assert!(!b.raced(T, A + 8, gen), "over before: a stale TLB entry");
        // Busy now, or returned since the open: a race.
        b.enter(U, A);
        assert!(b.raced(T, A, gen));
        b.leave(U, A);
        assert!(b.raced(T, A, gen));
        assert!(!b.raced(T, A, NO_GEN), "no generation noted: only a busy fault counts");
        // Its own fault, another page, another process: no race.
        b.enter(T, A);
        assert!(!b.raced(T, A, gen));
        b.enter(U, A + 4096);
        assert!(!b.raced(T, A, gen));
        b.enter((9 << 32) | 8, A);
        assert!(!b.raced(T, A, gen));
        // A leave by another thread than the entry's keeps it busy.
        b.leave(U, A);
        assert_eq!(b.busy, 1);
        assert!(split_spurious(ClassSet::default(), true).has(KernelClass::SpuriousRace));
        assert!(split_spurious(ClassSet::default(), false).has(KernelClass::SpuriousStaleTlb));
    }

    #[test]
    fn the_generation_noted_at_the_open_is_the_faults_own() {
        let mut t = ThreadFault::default();
        // Noted at the entry (arm64): kept until the return.
        assert!(!t.on_entry(None, A, W, Origin::User));
        assert_eq!(t.gen_at_open(), NO_GEN);
        t.note_wp_gen(5);
        assert_eq!(t.gen_at_open(), 5);
        t.on_return(0);
        assert_eq!(t.gen_at_open(), NO_GEN, "forgotten at the return");
        // Noted at the exception (x86 with kprobes): the entry keeps it for
        // the exception's page only.
        t.on_exception(ExcArch::X86, A + 8, X86_PF_PROT | X86_PF_WRITE);
        t.note_wp_gen(3);
        assert!(!t.on_entry(None, A, W, Origin::User));
        assert_eq!(t.gen_at_open(), 3);
        t.on_return(0);
        t.on_exception(ExcArch::X86, A + 8, X86_PF_PROT | X86_PF_WRITE);
        t.note_wp_gen(3);
        t.on_entry(None, A + 4096, W, Origin::User);
        assert_eq!(t.gen_at_open(), NO_GEN, "another page's exception");
        // A new exception forgets the last one's generation.
        t.on_return(0);
        t.on_exception(ExcArch::X86, A, X86_PF_WRITE);
        t.on_entry(None, A, W, Origin::User);
        assert_eq!(t.gen_at_open(), NO_GEN);
        let b = WpPage::bucket(7, A);
        assert!(b < WP_PAGE_BUCKETS);
        assert_eq!(b, WpPage::bucket(7, A + 0xfff), "one bucket per page");
    }

    #[test]
    fn reuse_copy_and_huge() {
        let mut t = ThreadFault::default();
        let x86_wp = Some((ExcArch::X86, X86_PF_PROT | X86_PF_WRITE | X86_PF_USER));
        let s = fault(&mut t, x86_wp, W, &[SEEN_WP], 0);
        assert!(
            s.has(KernelClass::Faults) && s.has(KernelClass::WriteFaults) && s.has(KernelClass::WpFaults)
        );
        assert!(s.has(KernelClass::Reuse) && !s.has(KernelClass::Copy) && !s.has(KernelClass::Spurious));
        let s = fault(&mut t, x86_wp, W, &[SEEN_WP, SEEN_NEW_ANON], 0);
        assert!(s.has(KernelClass::Copy) && !s.has(KernelClass::Reuse));
        let s = fault(&mut t, x86_wp, W, &[SEEN_HUGE_WP], 0);
        assert!(
            s.has(KernelClass::HugePmdWp) && !s.has(KernelClass::WpFaults) && !s.has(KernelClass::Spurious)
        );
        assert!(!s.has(KernelClass::Copy));
        // The THP copied whole (exec THP COW): a copy, not a PTE wp fault.
        let s = fault(&mut t, x86_wp, W, &[SEEN_HUGE_WP, SEEN_NEW_ANON], 0);
        assert!(s.has(KernelClass::HugePmdWp) && s.has(KernelClass::Copy) && !s.has(KernelClass::WpFaults));
        // Split, then the PTE's copy: one copy, from do_wp_page.
        let s = fault(&mut t, x86_wp, W, &[SEEN_HUGE_WP, SEEN_WP, SEEN_NEW_ANON], 0);
        assert!(s.has(KernelClass::Copy) && s.has(KernelClass::WpFaults));
    }

    #[test]
    fn shared_mapping_write_protect_is_neither_reuse_nor_copy() {
        let mut t = ThreadFault::default();
        let x86_wp = Some((ExcArch::X86, X86_PF_PROT | X86_PF_WRITE | X86_PF_USER));
        let s = fault(&mut t, x86_wp, W, &[SEEN_WP, SEEN_DIRTY_SHARED], 0);
        assert!(s.has(KernelClass::WpFaults) && s.has(KernelClass::WpShared));
        assert!(!s.has(KernelClass::Reuse) && !s.has(KernelClass::Copy) && !s.has(KernelClass::Spurious));
        // do_shared_fault: the first write to a shared file page, not present.
        let s = fault(&mut t, Some((ExcArch::X86, X86_PF_WRITE)), W, &[SEEN_DIRTY_SHARED], 0);
        assert!(
            !s.has(KernelClass::WpFaults) && !s.has(KernelClass::WpShared) && !s.has(KernelClass::Spurious)
        );
        // No exception record (arm64): dirtying a shared page is handling.
        let s = fault(&mut t, None, W, &[SEEN_DIRTY_SHARED, SEEN_ACCESS], 0);
        assert!(!s.has(KernelClass::Spurious));
    }

    #[test]
    fn marks_of_one_fault_do_not_leak_into_the_next() {
        let mut t = ThreadFault::default();
        let wp = Some((ExcArch::X86, X86_PF_PROT | X86_PF_WRITE));
        fault(&mut t, wp, W, &[SEEN_WP, SEEN_NEW_ANON], 0);
        let s = fault(&mut t, wp, W, &[], 0);
        assert!(!s.has(KernelClass::WpFaults) && !s.has(KernelClass::Copy));
        assert!(s.has(KernelClass::Spurious), "present write that reached nothing: spurious");
    }

    #[test]
    fn spurious_rule() {
        let mut t = ThreadFault::default();
        // x86: PROT|WRITE, nothing reached, completed.
        let s = fault(&mut t, Some((ExcArch::X86, X86_PF_PROT | X86_PF_WRITE)), W, &[], 0);
        assert!(s.has(KernelClass::Spurious));
        // Not present (first touch): not spurious, even if nothing was marked.
        let s = fault(&mut t, Some((ExcArch::X86, X86_PF_WRITE)), W, &[], 0);
        assert!(!s.has(KernelClass::Spurious));
        // A read fault is never spurious in this sense.
        let s = fault(&mut t, Some((ExcArch::X86, X86_PF_PROT)), R, &[], 0);
        assert!(!s.has(KernelClass::Spurious) && !s.has(KernelClass::WriteFaults));
        // Retried or failed faults did not complete.
        let s = fault(&mut t, Some((ExcArch::X86, 3)), W, &[], VM_FAULT_RETRY);
        assert!(!s.has(KernelClass::Spurious) && s.has(KernelClass::Retry));
        let s = fault(&mut t, Some((ExcArch::X86, 3)), W, &[], VM_FAULT_SIGSEGV);
        assert!(!s.has(KernelClass::Spurious) && s.has(KernelClass::Error));
        // A new anon folio (the PTE was zapped meanwhile): not spurious.
        let s = fault(&mut t, Some((ExcArch::X86, 3)), W, &[SEEN_NEW_ANON], 0);
        assert!(!s.has(KernelClass::Spurious));
        // arm64: permission fault (FSC 0x0f = level 3) vs translation (0x07).
        let s = fault(&mut t, Some((ExcArch::Arm64, 0x9200_004f)), W, &[], 0);
        assert!(s.has(KernelClass::Spurious));
        let s = fault(&mut t, Some((ExcArch::Arm64, 0x9200_0047)), W, &[], 0);
        assert!(!s.has(KernelClass::Spurious));
    }

    #[test]
    fn access_flags_path_tells_present_without_an_exception_record() {
        let mut t = ThreadFault::default();
        let s = fault(&mut t, None, W, &[SEEN_ACCESS], 0);
        assert!(s.has(KernelClass::Spurious));
        // Reached through do_wp_page (wp_page_reuse sets access flags too).
        let s = fault(&mut t, None, W, &[SEEN_WP, SEEN_ACCESS], 0);
        assert!(!s.has(KernelClass::Spurious) && s.has(KernelClass::Reuse));
        // The mark is per fault.
        let s = fault(&mut t, None, W, &[], 0);
        assert!(!s.has(KernelClass::Spurious));
    }

    #[test]
    fn exception_of_another_page_is_not_used() {
        let mut t = ThreadFault::default();
        t.on_exception(ExcArch::X86, A + 0x5000, 3);
        t.on_entry(Some(0), A, W, Origin::User);
        assert_eq!(t.present_with(t.seen), None);
        let s = t.on_return(0).unwrap();
        assert!(!s.has(KernelClass::Spurious), "unknown presence is not spurious");
    }

    #[test]
    fn a_retry_keeps_the_exception_record_and_a_completed_fault_clears_it() {
        let mut t = ThreadFault::default();
        t.on_exception(ExcArch::X86, A, X86_PF_PROT | X86_PF_WRITE | X86_PF_USER);
        t.on_entry(Some(0), A, W, Origin::User);
        assert!(t.on_return(VM_FAULT_RETRY).unwrap().has(KernelClass::Retry));
        assert_eq!(t.seen, SEEN_EXC, "the retry's record stays");
        t.on_entry(Some(0), A, W, Origin::User);
        assert!(t.on_return(0).unwrap().has(KernelClass::Spurious), "the retry used its exception");
        assert_eq!(t.seen, 0, "nothing open after a completed fault");
    }

    #[test]
    fn an_untimed_fault_is_classified_alike_and_takes_no_own_time() {
        let mut t = ThreadFault::default();
        t.on_exception(ExcArch::X86, A, X86_PF_PROT | X86_PF_WRITE | X86_PF_USER);
        t.on_entry(None, A, W, Origin::User);
        assert!(!t.timed());
        t.mark(SEEN_WP);
        t.own_time(10, 20);
        assert_eq!(t.own_ns, 0);
        assert!(t.on_return(0).unwrap().has(KernelClass::Reuse));
        t.on_entry(Some(5), A, W, Origin::User);
        assert!(t.timed());
        t.own_time(10, 20);
        assert_eq!((t.start_ns, t.own_ns), (5, 10));
        t.on_return(0);
        assert!(!t.timed(), "nothing timed once it returned");
    }

    #[test]
    fn a_missed_return_is_seen_at_the_next_entry() {
        let mut t = ThreadFault::default();
        assert!(!t.on_entry(Some(0), A, W, Origin::User));
        assert!(t.on_entry(Some(1), A, W, Origin::User), "the first fault never returned");
        assert!(t.on_return(0).is_some());
        assert!(!t.on_entry(Some(2), A, W, Origin::User));
    }

    #[test]
    fn marks_outside_a_user_fault_are_ignored() {
        let mut t = ThreadFault::default();
        // GUP's do_wp_page with no user fault around it.
        t.mark(SEEN_WP);
        assert_eq!(t.on_return(0), None);
        // A retry enters again: each call is one fault, as kprobe_profile counts.
        t.on_entry(Some(0), A, W, Origin::User);
        assert!(t.on_return(VM_FAULT_RETRY).unwrap().has(KernelClass::Retry));
        t.on_entry(Some(0), A, W, Origin::User);
        t.mark(SEEN_WP);
        assert!(t.on_return(0).unwrap().has(KernelClass::Reuse));
        assert_eq!(t.on_return(0), None, "a return without an entry");
    }

    /// Exit-only mode: the exception opens, the marks mark, the return
    /// closes; a call no exception opened is counted untimed.
    #[test]
    fn exit_only_exception_opens_and_return_closes() {
        let mut t = ThreadFault::default();
        let wp = X86_PF_PROT | X86_PF_WRITE | X86_PF_USER;
        t.open_at_exception(ExcArch::X86, A + 0x10, wp, true, 1_000);
        t.mark(SEEN_WP);
        assert!(t.at_return(A + 0x20, W, Origin::User), "timed from its exception");
        let s = t.on_return(0).unwrap();
        assert!(s.has(KernelClass::Reuse) && s.has(KernelClass::WpFaults) && !s.has(KernelClass::Spurious));
        assert_eq!(t.seen, 0, "a completed fault leaves nothing open");
        // get_user_pages: no exception; do_wp_page opens it, untimed.
        t.open_untimed();
        t.mark(SEEN_WP);
        t.mark(SEEN_NEW_ANON);
        assert!(!t.at_return(A, W, Origin::Gup));
        assert!(t.on_return(0).unwrap().has(KernelClass::Copy));
        // A return with nothing open: counted, untimed.
        assert!(!t.at_return(A, R, Origin::Gup));
        assert!(t.on_return(0).unwrap().has(KernelClass::Faults));
    }

    /// A private file THP's write: the PMD split, then the PTE path asks
    /// for the mmap lock (`VM_FAULT_RETRY`); the retried call copies the
    /// page from the file (`do_cow_fault`) with no write-protect fault of
    /// its own: that is the write's copy, in both modes, and the PMD fault
    /// is counted once. A new exception carries nothing over.
    #[test]
    fn a_retried_pmd_write_protect_faults_copy_is_a_copy() {
        let wp = X86_PF_PROT | X86_PF_WRITE | X86_PF_USER;
        let check = |first: ClassSet, second: ClassSet| {
            assert!(first.has(KernelClass::HugePmdWp) && first.has(KernelClass::Retry), "{first:?}");
            assert!(!first.has(KernelClass::Copy));
            assert!(second.has(KernelClass::Copy) && !second.has(KernelClass::HugePmdWp), "{second:?}");
            assert!(!second.has(KernelClass::Spurious) && !second.has(KernelClass::WpFaults));
        };
        // kprobe mode: the exception, then two calls.
        let mut t = ThreadFault::default();
        let first = fault(&mut t, Some((ExcArch::X86, wp)), W, &[SEEN_HUGE_WP], VM_FAULT_RETRY);
        let second = fault(&mut t, None, W, &[SEEN_NEW_ANON], 0);
        check(first, second);
        // The next fault, a new exception: a new anon folio alone is no copy.
        let s = fault(&mut t, Some((ExcArch::X86, X86_PF_WRITE | X86_PF_USER)), W, &[SEEN_NEW_ANON], 0);
        assert!(!s.has(KernelClass::Copy), "{s:?}");
        // A retried call that is not a PMD fault's carries nothing.
        let _ = fault(&mut t, Some((ExcArch::X86, wp)), W, &[], VM_FAULT_RETRY);
        assert!(!fault(&mut t, None, W, &[SEEN_NEW_ANON], 0).has(KernelClass::Copy));
        // Exit-only mode: the return reopens the retried call.
        let mut t = ThreadFault::default();
        t.open_at_exception(ExcArch::X86, A + 0x10, wp, false, 0);
        t.mark(SEEN_HUGE_WP);
        t.at_return(A + 0x20, W, Origin::User);
        let first = t.on_return(VM_FAULT_RETRY).unwrap();
        t.reopen_for_retry(false, 0);
        t.mark(SEEN_NEW_ANON);
        t.at_return(A + 0x20, W, Origin::User);
        check(first, t.on_return(0).unwrap());
        assert_eq!(t.seen, 0, "a completed fault leaves nothing open");
    }

    #[test]
    fn exit_only_timing_is_only_from_this_calls_opening() {
        let mut t = ThreadFault::default();
        // An exception the kernel never handled (a SIGSEGV), then a GUP
        // fault of the same page: not timed from that exception.
        t.open_at_exception(ExcArch::X86, A, X86_PF_WRITE | X86_PF_USER, true, 1_000);
        assert!(!t.at_return(A, W, Origin::Gup));
        t.on_return(0);
        // An exception of another page: not this call's either.
        t.open_at_exception(ExcArch::X86, A + 0x5000, X86_PF_WRITE | X86_PF_USER, true, 1_000);
        assert!(!t.at_return(A, W, Origin::User));
        t.on_return(0);
        // A retry: the retried call is timed from the return that retried it
        // and keeps the exception record (present rule).
        t.open_at_exception(ExcArch::X86, A, X86_PF_PROT | X86_PF_WRITE | X86_PF_USER, true, 1_000);
        assert!(t.at_return(A, W, Origin::User));
        assert!(t.on_return(VM_FAULT_RETRY).unwrap().has(KernelClass::Retry));
        t.reopen_for_retry(true, 5_000);
        assert!(t.at_return(A, W | FAULT_FLAG_TRIED, Origin::User));
        assert_eq!(t.start_ns, 5_000);
        let s = t.on_return(0).unwrap();
        assert!(s.has(KernelClass::Spurious), "present write that reached nothing, by the kept record");
    }

    #[test]
    fn origin_of_a_fault() {
        assert_eq!(Origin::of(W, 0xffff_8000_0000_0000), Origin::User);
        assert_eq!(Origin::of(FAULT_FLAG_WRITE, 0xffff_8000_0000_0000), Origin::Kernel);
        assert_eq!(Origin::of(FAULT_FLAG_WRITE, 0), Origin::Gup);
        // GUP passes no regs even with FAULT_FLAG_USER in flags.
        assert_eq!(Origin::of(W, 0), Origin::Gup);
        for o in Origin::ALL {
            assert_eq!(Origin::from_u32(o as u32), o);
        }
    }

    #[test]
    fn the_set_carries_the_origin() {
        let mut t = ThreadFault::default();
        for o in Origin::ALL {
            t.on_entry(Some(0), A, FAULT_FLAG_WRITE, o);
            t.mark(SEEN_WP);
            let s = t.on_return(0).unwrap();
            assert_eq!(s.origin(), o);
            assert!(s.has(KernelClass::Reuse) && s.has(KernelClass::Faults));
        }
    }

    #[test]
    fn a_gup_fault_ignores_the_last_exception_record() {
        let mut t = ThreadFault::default();
        // A user fault on A left a PROT|WRITE record; GUP then faults on A.
        t.on_exception(ExcArch::X86, A, X86_PF_PROT | X86_PF_WRITE | X86_PF_USER);
        t.on_entry(Some(0), A, FAULT_FLAG_WRITE, Origin::Gup);
        assert_eq!(t.present_with(t.seen), None);
        assert!(!t.on_return(0).unwrap().has(KernelClass::Spurious));
        // A kernel-mode fault has its own exception (page_fault_kernel).
        t.on_exception(ExcArch::X86, A, X86_PF_PROT | X86_PF_WRITE);
        t.on_entry(Some(0), A, FAULT_FLAG_WRITE, Origin::Kernel);
        assert!(t.on_return(0).unwrap().has(KernelClass::Spurious));
    }

    #[test]
    fn error_codes() {
        let s = classify_x86_error_code(X86_PF_PROT | X86_PF_WRITE | X86_PF_USER);
        assert!(
            s.has(KernelClass::TpFaults) && s.has(KernelClass::TpWrite) && s.has(KernelClass::TpPresentWrite)
        );
        assert!(!s.has(KernelClass::TpNotPresent));
        let s = classify_x86_error_code(X86_PF_WRITE | X86_PF_USER);
        assert!(s.has(KernelClass::TpNotPresent) && !s.has(KernelClass::TpPresentWrite));
        let s = classify_x86_error_code(X86_PF_PROT | X86_PF_USER);
        assert!(!s.has(KernelClass::TpWrite));
    }
}

#[cfg(test)]
mod candidate_tests {
    use super::*;

    /// The kretprobe records only `KernelClass::FAULT_RETURN`: every class
    /// `on_return` can set must be in it (and likewise for error codes).
    #[test]
    fn candidates_cover_what_can_be_produced() {
        let mut t = ThreadFault::default();
        for marks in
            [0, SEEN_WP, SEEN_WP | SEEN_NEW_ANON, SEEN_WP | SEEN_DIRTY_SHARED, SEEN_HUGE_WP, SEEN_ACCESS]
        {
            for ret in [0, VM_FAULT_RETRY, VM_FAULT_SIGSEGV, VM_FAULT_MAJOR] {
                t.on_exception(ExcArch::X86, 0, X86_PF_PROT | X86_PF_WRITE);
                t.on_entry(Some(0), 0, FAULT_FLAG_WRITE | FAULT_FLAG_USER, Origin::User);
                t.mark(marks);
                let set = t.on_return(ret).unwrap();
                for c in KernelClass::ALL {
                    assert!(!set.has(c) || KernelClass::FAULT_RETURN.contains(&c), "{c:?}");
                }
            }
        }
        for code in 0..8 {
            let set = classify_x86_error_code(code);
            for c in KernelClass::ALL {
                assert!(!set.has(c) || KernelClass::ERROR_CODE.contains(&c), "{c:?}");
            }
        }
    }
}
