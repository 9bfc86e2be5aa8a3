//! faultscope-common (package `faultscope-common`): types and pure logic
//! shared by faultscope's eBPF programs and its user-space collector.
//!
//! Everything the kernel side decides (which class a fault falls in, which
//! latency bucket it goes to) lives here as plain functions, so the very same
//! code runs in the BPF programs and in the unit tests that feed it synthetic
//! event sequences.
#![no_std]

pub mod attrib;
pub mod class;
pub mod fault;
pub mod hist;
pub mod maps;
pub mod pending;
pub mod program;

pub use class::KernelClass;
pub use fault::{ExcArch, Origin, ThreadFault};
pub use hist::{bucket_of, NBUCKETS};
pub use maps::{FltCount, LifeEvent, LifeKind, PhaseId, Stat, StatKey, TargetInfo};
pub use program::Program;
