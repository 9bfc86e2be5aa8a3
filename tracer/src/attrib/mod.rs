//! "Where and why": user-space blocks that attribute faults to mappings,
//! code sites and stacks from what the kernel side counts per VMA start,
//! per user ip and per stack id.
//!
//! - `mapping`: /proc/PID/maps snapshots over time, VMA start -> name,
//!   top-N folding with an honest `other` bucket.
//! - `sites`: user ips -> `func+0x3c (module)` with blazesym, after exit too.
//! - `stacks`: folded stacks and inferno flame graphs.
//! - `btf`: struct member offsets from the kernel's BTF for the eBPF side.

pub mod btf;
pub mod mapping;
pub mod sites;
pub mod stacks;
