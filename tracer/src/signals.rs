//! Signals held while a run must not be cut short.

/// SIGINT, SIGTERM and SIGHUP blocked while alive: taken with `wait`
/// (verify passes them on to its run), or delivered when dropped (bench:
/// after the sysfs knobs are restored and the probes detached). A child
/// inherits the mask across fork and exec: start one with
/// [`empty_mask_in_child`].
pub struct HeldSignals(libc::sigset_t);

/// Makes `cmd`'s child start with no signal blocked, whatever this thread
/// holds (std's spawn keeps the caller's mask).
pub fn empty_mask_in_child(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: the closure runs between fork and exec and makes only
    // async-signal-safe calls on its own stack.
    unsafe {
        cmd.pre_exec(|| {
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            if libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

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

impl HeldSignals {
    /// Whether a held signal has arrived (it stays pending: delivered when
    /// this is dropped). A bench series stops between runs on one.
    pub fn pending(&self) -> bool {
        // SAFETY: plain signal-set calls on a zeroed set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigpending(&mut set) == 0
                && [libc::SIGINT, libc::SIGTERM, libc::SIGHUP]
                    .iter()
                    .any(|&s| libc::sigismember(&set, s) == 1)
        }
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
