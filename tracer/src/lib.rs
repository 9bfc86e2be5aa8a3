//! faultscope (package `faultscope`): counts and times what the Linux fault
//! path does to a process. This library is the whole tool; `main.rs` only
//! dispatches, and the tests and xtask read reports through its types.
//!
//! Data flow, one directory per stage:
//! `kernel` (probe table, class catalogue, load and attach)
//! -> kernel maps (tracer-ebpf, tracer-common)
//! -> `collect` (snapshots of the maps, phases, targets, and `engine`, the
//!    Recorder that drives the stages for the commands)
//! -> `report` (typed report, text, findings, the checks of diff and verify)
//! -> `cmd`, the commands. Leaves any stage may use: `units`, `term`
//! (terminal output, foreign strings), `signals`, `output` (every file
//! written), `memory` (bench's mappings and forked child), `error` (the
//! refusal).

/// The version line: the package's version and the commit it was built
/// from (`unknown` for a build outside a git checkout).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("FAULTSCOPE_COMMIT"), ")");

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
