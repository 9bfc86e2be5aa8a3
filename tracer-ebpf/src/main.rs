//! faultscope-ebpf (package `faultscope-ebpf`, object `faultscope-ebpf`):
//! faultscope's eBPF programs, one small program per concern.
//!
//! Data flow: probes -> per-thread state (this CPU's `OPEN` slot, or
//! `THREADS` for a fault that slept) -> this CPU's pending slots
//! (`PENDING_STATS`, `PENDING_MAPPINGS`: an index, no hashing, for a run of
//! faults of one key) -> per-CPU aggregates (`STATS`, keyed by process,
//! phase and set of classes; `MAPPINGS`), into which a slot is flushed when
//! another key takes it over (`FLUSHES` is the readers' seqlock). Nothing
//! is sent to user space per fault; only process lifecycle events go
//! through the `EVENTS` ring, and the cgroups made through `CGROUP_DIRS`.
//!
//! Every program filters on the traced set (`TARGETS`, keyed by tgid) first,
//! or, inside a fault, on the thread state that only traced faults create;
//! a thread found untraced is noted per CPU (`UNTRACED`), and the opening
//! programs of its later faults there stop at the note.
//!
//! Each program is `fn x(ctx) -> u32 { try_x(&ctx).unwrap_or(0) }`, a
//! program on a kernel function declared with its fentry twin by
//! `kprobe_and_fentry!`: a context read that fails is counted in `DROPS` (`DropKind::ReadFailed`) and the event
//! is left unclassified, never taken as a zero.
//!
//! The program names are a contract with user space
//! (`faultscope_common::Program`; a tracer unit test compares the object).
#![no_std]
#![no_main]
// Inline asm on BPF, for the one atomic add (core has no atomic RMW there).
#![feature(asm_experimental_arch)]

/// A program on a kernel function, as a kprobe and as its fentry twin
/// (`NAME_fe`, chosen per probe by user space): one body, run with the
/// kprobe's or the fentry's context bound to `ctx` (an `FnContext`).
macro_rules! kprobe_and_fentry {
    ($(#[$doc:meta])* $kprobe:ident, $fentry:ident, |$ctx:ident| $body:expr) => {
        $(#[$doc])*
        #[aya_ebpf::macros::kprobe]
        pub fn $kprobe(ctx: aya_ebpf::programs::ProbeContext) -> u32 {
            let $ctx = &ctx;
            $body
        }

        #[aya_ebpf::macros::fentry]
        pub fn $fentry(ctx: aya_ebpf::programs::FEntryContext) -> u32 {
            let $ctx = &ctx;
            $body
        }
    };
}

mod attrib;
mod contpte;
mod exception;
mod fault;
mod helpers;
mod lifecycle;
mod maps;
mod switch;
mod vma;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
