//! The collect stage: the kernel's per-CPU maps read into snapshots
//! (`collector`), the lifecycle events turned into named phases (`phases`),
//! and the processes traced (`target`).

pub mod children;
pub mod collector;
pub mod phases;
pub mod target;
