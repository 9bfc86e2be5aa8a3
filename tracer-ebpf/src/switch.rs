//! The context switch: a thread switched out with a fault open in its
//! CPU's `OPEN` slot takes the fault's state to its task storage, where
//! the rest of the fault finds it, on whichever CPU it resumes.

use aya_ebpf::{
    macros::{btf_tracepoint, tracepoint},
    programs::{BtfTracePointContext, TracePointContext},
};

use crate::helpers::spill;

/// `sched:sched_switch`, which runs with the thread switched out as
/// `current`.
#[tracepoint]
pub fn sched_switch(_ctx: TracePointContext) -> u32 {
    spill();
    0
}

/// The same as a BTF tracepoint (no trace record built first).
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch_fe(_ctx: BtfTracePointContext) -> u32 {
    spill();
    0
}
