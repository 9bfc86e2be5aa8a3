//! The commands: each drives the pipeline (kernel -> collect -> report) for
//! one use. `record` and `bench` trace; `mark` talks to a running record;
//! `probes` shows the probe table; `cli` declares them all, and
//! `generate` derives the man pages and completions from that.

pub mod bench;
pub mod cli;
pub mod diff;
pub mod folio;
pub mod generate;
pub mod hotpatch;
pub mod mark;
pub mod plot;
pub mod probes;
pub mod record;
pub mod serve;
pub mod verify;

/// What an earlier faultscope killed by SIGKILL (or the OOM killer, or a
/// panic) can leave behind, repaired by the next faultscope run as root:
/// the THP settings a bench changed (restored from its state file) and
/// the sockets of recorders that are gone (removed quietly). Nothing is
/// left in the kernel: BPF links and programs die with the process that
/// held them.
pub fn recover() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    if let Some(msg) = folio::recover_stale() {
        crate::term::say(&format!("faultscope: {msg}"));
    }
    mark::remove_stale_sockets();
}
