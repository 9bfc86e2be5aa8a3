//! The commands: each drives the pipeline (kernel -> collect -> report) for
//! one use. `record` and `bench` trace; `mark` talks to a running record;
//! `probes` shows the probe table; `workload` is the test workload.

pub mod bench;
pub mod folio;
pub mod mark;
pub mod probes;
pub mod record;
pub mod workload;
