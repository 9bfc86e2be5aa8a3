//! The collect stage: the kernel's per-CPU maps read into snapshots
//! (`collector`), the lifecycle events turned into named phases (`phases`),
//! the processes traced (`target`), and the maps that name where faults
//! happened (`attribution`), and the kernel's own count of each traced
//! process's faults that every report is checked against (`accounting`),
//! and the container, pod or service a process runs in (`container`);
//! `engine` drives them all for the commands.

pub mod accounting;
pub mod attribution;
pub mod children;
pub mod collector;
pub mod container;
pub mod engine;
pub mod phases;
pub mod select;
pub mod target;
