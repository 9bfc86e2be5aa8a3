//! The commands: each drives the pipeline (kernel -> collect -> report) for
//! one use. `record` and `bench` trace; `mark` talks to a running record;
//! `probes` shows the probe table; `workload` is the test workload.

pub mod bench;
pub mod folio;
pub mod mark;
pub mod plot;
pub mod probes;
pub mod record;
pub mod serve;
pub mod workload;

use std::io::Write as _;

/// Writes to stdout and flushes. An error means stdout is gone (EPIPE from
/// `| head`, or a full disk): the caller ends its run as if interrupted and
/// still writes its report, where `print!` would panic.
pub fn out(s: &str) -> std::io::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes()).and_then(|()| o.flush())
}

/// A line on stderr, best effort: a closed stderr is no reason to lose a
/// run (`eprintln!` would panic).
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

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
        say(&format!("faultscope: {msg}"));
    }
    mark::remove_stale_sockets();
}

/// SIGINT, SIGTERM and SIGHUP blocked while alive: taken with `wait`
/// (verify passes them on to its run), or delivered when dropped (bench:
/// after the sysfs knobs are restored and the probes detached). A child
/// started meanwhile gets an empty mask from std's spawn.
pub struct HeldSignals(libc::sigset_t);

impl HeldSignals {
    pub fn new() -> HeldSignals {
        // SAFETY: plain signal-set calls on a zeroed set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, s);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            HeldSignals(set)
        }
    }

    /// A held signal that arrived within `t`.
    pub fn wait(&self, t: std::time::Duration) -> Option<i32> {
        let ts = libc::timespec { tv_sec: t.as_secs() as _, tv_nsec: t.subsec_nanos() as _ };
        // SAFETY: waits for a signal of our blocked set.
        let sig = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

impl Default for HeldSignals {
    fn default() -> Self {
        HeldSignals::new()
    }
}

impl Drop for HeldSignals {
    fn drop(&mut self) {
        // SAFETY: unblocks what `new` blocked; one still pending is
        // delivered now.
        unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.0, std::ptr::null_mut()) };
    }
}
