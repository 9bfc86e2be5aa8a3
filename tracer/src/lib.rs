//! faultscope (package `faultscope`): counts and times what the Linux fault
//! path does to a process. This library is the whole tool; `main.rs` only
//! dispatches, and the tests and xtask read reports through its types.
//!
//! Data flow, one directory per stage:
//! `kernel` (probe table, class catalogue, load and attach)
//! -> kernel maps (tracer-ebpf, tracer-common)
//! -> `collect` (snapshots of the maps, phases, targets)
//! -> `report` (typed report, text, findings, diff, verify)
//! and `cmd`, the commands that drive it; `output` writes every file they
//! write, and `error` is the refusal they share.

/// Attribution building blocks (mapping names, code sites, stacks, BTF
/// offsets), used by `collect` and `report`.
pub mod attrib;
pub mod cmd;
pub mod collect;
pub mod error;
pub mod kernel;
pub mod memory;
pub mod output;
pub mod report;
pub mod signals;
pub mod term;
pub mod units;
