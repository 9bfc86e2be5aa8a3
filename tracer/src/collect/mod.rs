//! The collect stage: the kernel's per-CPU maps read into snapshots
//! (`collector`), the lifecycle events turned into named phases (`phases`),
//! the processes traced (`target`), and the maps that name where faults
//! happened (`attribution`).

pub mod attribution;
pub mod children;
pub mod collector;
pub mod phases;
pub mod target;
