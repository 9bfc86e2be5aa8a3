//! The processes to trace: existing pids, or a command faultscope starts
//! paused, so that it is in the traced set before its `exec`.

use std::{
    ffi::CString,
    fs,
    os::unix::ffi::OsStrExt,
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::error::Refusal;

/// Refuses pids that do not exist (or are threads, not processes).
pub fn check_pid(pid: u32) -> Result<String, Refusal> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| Refusal::new(format!("no process with pid {pid}")))?;
    let tgid =
        status.lines().find_map(|l| l.strip_prefix("Tgid:")).and_then(|v| v.trim().parse::<u32>().ok());
    if tgid != Some(pid) {
        return Err(Refusal::new(format!(
            "pid {pid} is a thread of process {}; pass the process id",
            tgid.map(|t| t.to_string()).unwrap_or_else(|| "?".into())
        )));
    }
    Ok(comm_of(pid).unwrap_or_default())
}

pub fn comm_of(pid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm")).ok().map(|s| s.trim().to_string())
}

/// Whether the process is gone: none of its threads can run user code any
/// more (each is a zombie, dead, or exiting). A zombie main thread is not
/// enough: after `pthread_exit` in `main` the other threads run on. Only a
/// `/proc` entry that is not there says gone: another error (no file
/// descriptor left, a permission) keeps the process, and is said once.
pub fn is_gone(pid: u32) -> bool {
    match fs::read_dir(format!("/proc/{pid}/task")) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => {
            proc_error(pid, &e);
            false
        }
        Ok(tasks) => !tasks.flatten().any(|t| thread_runs(&t.path().join("stat"))),
    }
}

/// `/proc` errors that are no exit, counted (`proc_errors`) and said once.
pub static PROC_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn proc_error(pid: u32, e: &std::io::Error) {
    if PROC_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
        eprintln!("faultscope: warning: reading /proc/{pid} failed ({e}); not taken for an exit (counted in drops.proc_errors)");
    }
}

/// `PF_EXITING` in /proc/.../stat's flags: the thread is in `do_exit`.
const PF_EXITING: u64 = 0x4;

/// A thread's /proc stat: running (not a zombie, dead or exiting).
fn thread_runs(stat: &Path) -> bool {
    let s = match fs::read_to_string(stat) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return false,
        // Not readable now is not an exit.
        Err(_) => return true,
    };
    let Some((_, rest)) = s.rsplit_once(')') else {
        return false;
    };
    // Fields 3 (state) and 9 (flags) of proc(5).
    let mut f = rest.split_whitespace();
    let state = f.next().unwrap_or("X");
    let flags: u64 = f.nth(5).and_then(|v| v.parse().ok()).unwrap_or(0);
    !matches!(state, "Z" | "X" | "x") && flags & PF_EXITING == 0
}

fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return is_executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// The executable a command line runs, looked up in PATH now, so that a
/// typo is refused before anything is attached.
pub fn resolve_command(argv: &[String]) -> Result<PathBuf, Refusal> {
    let Some(first) = argv.first() else {
        return Err(Refusal::new("no command given after --"));
    };
    find_program(first).ok_or_else(|| {
        if first.contains('/') && Path::new(first).is_file() {
            Refusal::new(format!("{first}: not executable"))
        } else {
            Refusal::new(format!("command not found: {first}"))
        }
    })
}

/// The command after `--` could not be executed (e.g. not a binary it can
/// run): said on stderr, exit status 127 as a shell does.
#[derive(Debug)]
pub struct ExecFailed(pub String);

impl std::fmt::Display for ExecFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ExecFailed {}

/// Exit status when the command could not be executed.
pub const EXIT_EXEC_FAILED: i32 = 127;

/// A command forked and held before `exec` until [`Paused::release`].
pub struct Paused {
    pub pid: u32,
    go: libc::c_int,
    /// Read end of a close-on-exec pipe: EOF once the exec succeeded, the
    /// errno of a failed exec otherwise.
    exec_err: libc::c_int,
    path: PathBuf,
}

/// Forks the command and stops it before `exec`: the child blocks reading a
/// pipe, so the caller can add it to the traced set first. (std's Command
/// cannot do this: its spawn waits for the exec.)
///
/// The command starts with an empty signal mask and SIGPIPE at its default
/// action (the Rust runtime ignores SIGPIPE, and an ignored signal stays
/// ignored across exec); other dispositions are inherited as from a shell,
/// so `nohup faultscope record -- CMD` still protects CMD.
pub fn spawn_paused(argv: &[String]) -> Result<Paused, Refusal> {
    let path = resolve_command(argv)?;
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Refusal::new("command path contains a NUL byte"))?;
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| Refusal::new("an argument contains a NUL byte"))?;
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());

    let mut fds = [0 as libc::c_int; 2];
    let mut errfds = [0 as libc::c_int; 2];
    // SAFETY: fds and errfds are valid arrays of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0
        || unsafe { libc::pipe2(errfds.as_mut_ptr(), libc::O_CLOEXEC) } != 0
    {
        return Err(Refusal::new(format!("pipe: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: the child only calls async-signal-safe functions (close, read,
    // sigprocmask, signal, execv, write, _exit) on memory prepared before
    // the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(Refusal::new(format!("fork: {}", std::io::Error::last_os_error())));
    }
    if pid == 0 {
        unsafe {
            libc::close(fds[1]);
            libc::close(errfds[0]);
            let mut b = 0u8;
            let n = libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
            if n != 1 {
                // faultscope gave up before releasing us.
                libc::_exit(126);
            }
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            libc::execv(cpath.as_ptr(), ptrs.as_ptr());
            let errno = *libc::__errno_location();
            libc::write(errfds[1], (&errno as *const libc::c_int).cast(), std::mem::size_of::<libc::c_int>());
            libc::_exit(EXIT_EXEC_FAILED);
        }
    }
    unsafe {
        libc::close(fds[0]);
        libc::close(errfds[1]);
    }
    Ok(Paused { pid: pid as u32, go: fds[1], exec_err: errfds[0], path })
}

impl Paused {
    /// Lets the command exec, and waits until it has: an exec that failed
    /// is an [`ExecFailed`] (the child is reaped).
    pub fn release(self) -> Result<(), ExecFailed> {
        let b = b"g";
        let mut errno: libc::c_int = 0;
        // SAFETY: one byte to our end of the pipe, then reading the exec
        // status pipe, which the child's exec closes (EOF) or fills.
        let n = unsafe {
            libc::write(self.go, b.as_ptr().cast(), 1);
            libc::close(self.go);
            let n = loop {
                let n = libc::read(
                    self.exec_err,
                    (&mut errno as *mut libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>(),
                );
                if n >= 0 || *libc::__errno_location() != libc::EINTR {
                    break n;
                }
            };
            libc::close(self.exec_err);
            n
        };
        let (pid, path) = (self.pid, self.path.clone());
        std::mem::forget(self);
        if n == std::mem::size_of::<libc::c_int>() as isize {
            wait(pid);
            return Err(ExecFailed(format!(
                "cannot run {}: {}",
                path.display(),
                std::io::Error::from_raw_os_error(errno)
            )));
        }
        Ok(())
    }
}

impl Drop for Paused {
    /// Not released: the child reads EOF and exits without running the command.
    fn drop(&mut self) {
        unsafe {
            libc::close(self.go);
            libc::close(self.exec_err);
            libc::waitpid(self.pid as i32, std::ptr::null_mut(), 0);
        }
    }
}

/// Reaps a child without blocking: `Some(exit status)` once it has exited.
pub fn try_reap(pid: u32) -> Option<i32> {
    reap(pid, libc::WNOHANG)
}

/// Reaps a child that is known to be exiting (blocks until it is).
pub fn wait(pid: u32) -> Option<i32> {
    reap(pid, 0)
}

fn reap(pid: u32, flags: libc::c_int) -> Option<i32> {
    let mut status = 0;
    // SAFETY: plain waitpid on our own child.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, flags) };
    if r == pid as i32 {
        if libc::WIFEXITED(status) {
            Some(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Some(128 + libc::WTERMSIG(status))
        } else {
            None
        }
    } else if r < 0 {
        Some(-1)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_pid_is_refused() {
        // pid_max is at most 2^22, so this pid cannot exist.
        let e = check_pid(u32::MAX - 1).unwrap_err();
        assert_eq!(e.0, format!("no process with pid {}", u32::MAX - 1));
    }

    #[test]
    fn own_pid_is_accepted() {
        assert!(check_pid(std::process::id()).is_ok());
        assert!(!is_gone(std::process::id()));
    }

    #[test]
    fn unknown_command_is_refused() {
        let e = spawn_paused(&["/nonexistent/faultscope-nothing".into()]).err().unwrap();
        assert!(e.0.contains("command not found"));
    }

    #[test]
    fn a_failed_exec_is_said() {
        let dir = std::env::temp_dir().join(format!("faultscope-exec-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("not-a-binary");
        fs::write(&bad, [0u8, 1, 2, 3]).unwrap();
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&bad, fs::Permissions::from_mode(0o755)).unwrap();
        let e = spawn_paused(&[bad.to_string_lossy().into_owned()]).unwrap().release().unwrap_err();
        assert!(e.0.contains("cannot run") && e.0.contains("format error"), "{e}");
        fs::set_permissions(&bad, fs::Permissions::from_mode(0o644)).unwrap();
        let e = resolve_command(&[bad.to_string_lossy().into_owned()]).unwrap_err();
        assert!(e.0.ends_with("not executable"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn paused_child_runs_only_when_released() {
        let p = spawn_paused(&["true".into()]).unwrap();
        let pid = p.pid;
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(try_reap(pid), None, "child must wait for release");
        p.release().unwrap();
        let mut st = None;
        for _ in 0..200 {
            st = try_reap(pid);
            if st.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(st, Some(0));
    }
}
