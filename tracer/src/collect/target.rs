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

/// Refuses pids that are no process that can fault: none there, a thread
/// (not a process), a kernel thread (no user memory), a zombie or a
/// process in its exit. Returns its comm (for display: not UTF-8 is
/// replaced, as for the kernel's comms).
pub fn check_pid(pid: u32) -> Result<String, Refusal> {
    let none = || Refusal::new(format!("no process with pid {pid}"));
    // Bytes: the comm in `Name:` (and in stat) need not be UTF-8.
    let status = fs::read(format!("/proc/{pid}/status")).map_err(|_| none())?;
    let tgid = status_field(&status, b"Tgid:");
    if tgid != Some(pid) {
        return Err(Refusal::new(format!(
            "pid {pid} is a thread of process {}; pass the process id",
            tgid.map(|t| t.to_string()).unwrap_or_else(|| "?".into())
        )));
    }
    let stat = fs::read(format!("/proc/{pid}/stat")).ok().and_then(|s| Stat::parse(&s)).ok_or_else(none)?;
    if stat.flags & PF_KTHREAD != 0 {
        return Err(Refusal::new(format!("pid {pid} is a kernel thread: it has no user memory to fault")));
    }
    if is_gone(pid) {
        return Err(Refusal::new(match stat.state {
            b'Z' => format!("pid {pid} has exited (a zombie)"),
            b'X' | b'x' => format!("pid {pid} has exited"),
            _ => format!("pid {pid} is exiting"),
        }));
    }
    Ok(comm_of(pid).unwrap_or_default())
}

/// A number field of /proc/PID/status (`Tgid:`), read as bytes.
fn status_field(status: &[u8], name: &[u8]) -> Option<u32> {
    let v = status.split(|&b| b == b'\n').find_map(|l| l.strip_prefix(name))?;
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

/// The comm as the kernel holds it, byte for byte: /proc/PID/comm less the
/// one newline /proc adds (a comm may begin or end with spaces, hold a
/// newline, or be no UTF-8).
pub fn comm_bytes(pid: u32) -> Option<Vec<u8>> {
    fs::read(format!("/proc/{pid}/comm")).ok().map(|b| strip_newline(&b).to_vec())
}

fn strip_newline(b: &[u8]) -> &[u8] {
    b.strip_suffix(b"\n").unwrap_or(b)
}

/// [`comm_bytes`] for display: not UTF-8 is replaced (U+FFFD), as in the
/// comms the kernel's events give; print it through `term::safe`.
pub fn comm_of(pid: u32) -> Option<String> {
    comm_bytes(pid).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The fields of a /proc/PID/stat (or task/TID/stat) that say whether the
/// task can still run user code, and its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: R, S, D, Z, X, ...
    pub state: u8,
    /// Field 4.
    pub ppid: u32,
    /// Field 9: PF_* flags.
    pub flags: u64,
    /// Field 23: 0 when the task has no mm (a kernel thread, or past
    /// `exit_mm`).
    pub vsize: u64,
}

impl Stat {
    /// Parses the bytes of a stat file; the comm (field 2) may hold
    /// anything, `)` and invalid UTF-8 included, so fields are counted
    /// from the last `)`.
    pub fn parse(s: &[u8]) -> Option<Stat> {
        let close = s.iter().rposition(|&b| b == b')')?;
        let rest = std::str::from_utf8(&s[close + 1..]).ok()?;
        // Fields 3 on of proc(5).
        let f: Vec<&str> = rest.split_ascii_whitespace().collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        Some(Stat {
            state: *f.first()?.as_bytes().first()?,
            ppid: u32::try_from(num(1)?).ok()?,
            flags: num(6)?,
            vsize: num(20)?,
        })
    }

    /// Whether the task can run user code: not a zombie, dead or exiting,
    /// and it has an mm.
    fn runs(&self) -> bool {
        !matches!(self.state, b'Z' | b'X' | b'x') && self.flags & PF_EXITING == 0 && self.vsize != 0
    }
}

/// A process's /proc/PID/stat.
pub fn stat_of(pid: u32) -> Option<Stat> {
    Stat::parse(&fs::read(format!("/proc/{pid}/stat")).ok()?)
}

/// The processes in `/proc` now (tgids).
pub fn running() -> std::collections::BTreeSet<u32> {
    std::fs::read_dir("/proc")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
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
        crate::term::say(&format!("faultscope: warning: reading /proc/{pid} failed ({e}); not taken for an exit (counted in drops.proc_errors)"));
    }
}

/// `PF_EXITING` in /proc/.../stat's flags: the thread is in `do_exit`.
const PF_EXITING: u64 = 0x4;
/// `PF_KTHREAD`: a kernel thread (no user memory of its own).
const PF_KTHREAD: u64 = 0x0020_0000;

/// A thread's /proc stat: running (not a zombie, dead or exiting, and
/// with an mm). Read as bytes: its comm need not be UTF-8.
fn thread_runs(stat: &Path) -> bool {
    match fs::read(stat) {
        Ok(s) => Stat::parse(&s).is_some_and(|t| t.runs()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        // Not readable now is not an exit.
        Err(_) => true,
    }
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
    fn comm_keeps_its_bytes_less_one_newline() {
        assert_eq!(strip_newline(b" x  \n"), b" x  ");
        assert_eq!(strip_newline(b"x\t\n"), b"x\t");
        assert_eq!(strip_newline(b"x\n\n"), b"x\n");
        assert_eq!(strip_newline(b"x"), b"x");
        assert_eq!(strip_newline(b"fs\xffu\n"), b"fs\xffu");
    }

    #[test]
    fn stat_is_parsed_from_bytes_after_the_last_paren() {
        let line = b"77 (a) Z\xff) S 1 77 77 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 26 2260992 0 18446744073709551615\n";
        let st = Stat::parse(line).unwrap();
        assert_eq!(st, Stat { state: b'S', ppid: 1, flags: 4194560, vsize: 2260992 });
        assert!(st.runs());
        assert!(!Stat { state: b'Z', ..st }.runs());
        assert!(!Stat { state: b'X', ..st }.runs());
        assert!(!Stat { flags: st.flags | PF_EXITING, ..st }.runs());
        assert!(!Stat { vsize: 0, ..st }.runs(), "no mm: cannot run user code");
        assert_eq!(Stat::parse(b"77 (a S 1"), None);
    }

    /// Forks a child that runs `f` (async-signal-safe calls only) and then
    /// `_exit(0)`s; the caller reaps it.
    fn fork_child(f: impl FnOnce()) -> u32 {
        // SAFETY: the child only makes raw syscalls and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            f();
            unsafe { libc::_exit(0) };
        }
        pid as u32
    }

    fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("not within 10 s: {what}");
    }

    #[test]
    fn a_zombie_is_refused_and_gone() {
        let pid = fork_child(|| ());
        wait_until("the child is a zombie", || stat_of(pid).is_some_and(|s| s.state == b'Z'));
        let e = check_pid(pid).unwrap_err();
        assert_eq!(e.0, format!("pid {pid} has exited (a zombie)"));
        assert!(is_gone(pid));
        assert_eq!(wait(pid), Some(0));
    }

    #[test]
    fn a_non_utf8_comm_is_accepted_and_its_bytes_kept() {
        // PR_SET_NAME takes up to 15 bytes and a NUL.
        let name = *b"fs\xffu\x1b[2J\0";
        let pid = fork_child(move || unsafe {
            libc::prctl(libc::PR_SET_NAME, name.as_ptr());
            libc::pause();
        });
        let renamed = (0..1000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            comm_bytes(pid).as_deref() == Some(&name[..name.len() - 1])
        });
        let (comm, gone) = (check_pid(pid), is_gone(pid));
        // Ended before any check can fail.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        wait(pid);
        assert!(renamed, "the child did not rename itself within 10 s");
        assert!(!gone);
        assert_eq!(comm.unwrap(), "fs\u{fffd}u\x1b[2J");
    }

    #[test]
    fn a_kernel_thread_is_refused() {
        // kthreadd and its threads: none where /proc is another pid
        // namespace's.
        let Some(k) = fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|&p| stat_of(p).is_some_and(|s| s.flags & PF_KTHREAD != 0))
        else {
            eprintln!("no kernel thread in this /proc: not checked");
            return;
        };
        let e = check_pid(k).unwrap_err();
        assert_eq!(e.0, format!("pid {k} is a kernel thread: it has no user memory to fault"));
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
