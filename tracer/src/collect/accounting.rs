//! The kernel's own count of a traced process's faults over the run, the
//! independent count that every report is checked against.
//!
//! `mm_account_fault()` adds every completed fault to the current task's
//! `min_flt` or `maj_flt` (what getrusage and `/proc/PID/stat` add up):
//! user-mode faults, the kernel's faults on user memory in a system call,
//! and get_user_pages faults. A retried fault counts once, when it
//! completes; a fault that fails (`VM_FAULT_ERROR`) does not count.
//!
//! The window is bracketed at both ends. Where counting starts in the
//! kernel (a started command at its exec, a followed child at its fork)
//! the kernel reads the count at that instant; at a thread's exit the
//! kernel adds its final count (`EXITED`). Where it cannot (attaching to a
//! running process, a process still running at the end), `/proc` is read
//! just before and just after the instant, and the difference of the two
//! reads is the uncertainty.

use std::{fs, path::Path};

use faultscope_common::FltCount;

/// Two reads of a count around an instant that cannot be read atomically.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bracket {
    pub lo: FltCount,
    pub hi: FltCount,
}

impl Bracket {
    /// The same count read twice, `read` around `at`: `None` when either
    /// read failed (the process is gone).
    pub fn around(read: impl Fn() -> Option<FltCount>, at: impl FnOnce()) -> Option<Bracket> {
        let lo = read();
        at();
        Some(Bracket { lo: lo?, hi: read()? })
    }

    pub fn exact(c: FltCount) -> Bracket {
        Bracket { lo: c, hi: c }
    }
}

/// Where the kernel's count of a process starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// Read by the kernel at the instant counting started: `how` says when.
    Exact(FltCount, &'static str),
    /// `/proc` at attach, before and after the process joined the traced
    /// set: the whole process (`/proc/PID/stat`: live threads and those
    /// that exited before), and its live threads alone (`task/*/stat`).
    Proc { whole: Bracket, threads: Bracket },
    /// Not known, and why.
    Unknown(String),
}

/// Where it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Every thread exited while counted: the kernel's sum of their final
    /// counts.
    Exited(FltCount),
    /// The process still ran: `/proc/PID/stat` before and after the last
    /// read of faultscope's counts.
    Proc(Bracket),
    /// It left the traced set while it ran (`Recorder::leave`): no end is
    /// read, for the reason given.
    Left(&'static str),
}

/// One traced process's bracket, filled in as the run goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCount {
    pub start: Start,
    pub end: Option<End>,
}

/// The kernel's count over the run: each of minor and major as a range
/// `(low, high)`, and how the range was made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    pub min: (u64, u64),
    pub maj: (u64, u64),
    pub how: String,
}

impl Window {
    pub fn total(&self) -> (u64, u64) {
        (self.min.0 + self.maj.0, self.min.1 + self.maj.1)
    }
}

/// `(end - start)` as a range, for ends and starts that are ranges.
fn span(end: (u64, u64), start: (u64, u64)) -> (u64, u64) {
    (end.0.saturating_sub(start.1), end.1.saturating_sub(start.0))
}

fn mins(b: &Bracket) -> (u64, u64) {
    (b.lo.min, b.hi.min)
}

fn majs(b: &Bracket) -> (u64, u64) {
    (b.lo.maj, b.hi.maj)
}

impl KernelCount {
    pub fn new(start: Start) -> KernelCount {
        KernelCount { start, end: None }
    }

    /// The process exited with every thread's final count summed by the
    /// kernel. An end read from `/proc` before (the last read of the run
    /// raced with the exit) keeps its low side.
    pub fn exited(&mut self, total: FltCount) {
        self.end = Some(match self.end {
            Some(End::Proc(b)) => End::Proc(Bracket { lo: b.lo, hi: total }),
            _ => End::Exited(total),
        });
    }

    /// The kernel's count between start and end, or why there is none.
    pub fn window(&self) -> Result<Window, String> {
        let Some(end) = self.end else {
            return Err("its end was not read (it left before the run's last read, with no exit seen)".into());
        };
        let (start_whole, start_threads, from) = match &self.start {
            Start::Exact(c, how) => {
                (Bracket::exact(*c), Bracket::exact(*c), format!("from {how} (read by the kernel)"))
            }
            Start::Proc { whole, threads } => {
                (*whole, *threads, "from /proc at attach (read before and after it joined)".to_string())
            }
            Start::Unknown(why) => return Err(why.clone()),
        };
        let (min, maj, to) = match end {
            // Only the threads alive at the start exit while counted: the
            // ones that exited before are in the whole process's count.
            End::Exited(e) => {
                let e = Bracket::exact(e);
                (
                    span(mins(&e), mins(&start_threads)),
                    span(majs(&e), majs(&start_threads)),
                    "to its exit (every thread's final count, summed by the kernel)",
                )
            }
            End::Proc(b) => (
                span(mins(&b), mins(&start_whole)),
                span(majs(&b), majs(&start_whole)),
                "to /proc/PID/stat around the run's last read",
            ),
            End::Left(why) => return Err(why.into()),
        };
        Ok(Window { min, maj, how: format!("{from} {to}") })
    }
}

/// `min_flt` and `maj_flt` of a `/proc/.../stat` line (fields 10 and 12),
/// read after the comm's closing parenthesis (a comm may hold spaces and
/// parentheses).
pub fn parse_stat(line: &str) -> Option<FltCount> {
    let rest = &line[line.rfind(')')? + 1..];
    // Fields from 3 (state) on: minflt is field 10, majflt 12.
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(FltCount { min: f.get(7)?.parse().ok()?, maj: f.get(9)?.parse().ok()? })
}

/// Read as bytes: the comm in it need not be UTF-8 (the fields after it
/// are).
fn read_stat(path: &Path) -> Option<FltCount> {
    parse_stat(&String::from_utf8_lossy(&fs::read(path).ok()?))
}

/// The whole process's count (`/proc/PID/stat`: its live threads and those
/// that exited).
pub fn process_flt(pid: u32) -> Option<FltCount> {
    read_stat(Path::new(&format!("/proc/{pid}/stat")))
}

/// Its live threads' own counts, summed (`/proc/PID/task/*/stat`).
pub fn threads_flt(pid: u32) -> Option<FltCount> {
    let mut sum = FltCount::default();
    for e in fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        if let Some(c) = read_stat(&e.path().join("stat")) {
            sum.min += c.min;
            sum.maj += c.maj;
        }
    }
    Some(sum)
}

/// The start of a process joined while it runs (`-p`): `/proc` around
/// `join`.
pub fn start_at_attach(pid: u32, join: impl FnOnce()) -> Start {
    let read = || Some((process_flt(pid)?, threads_flt(pid)?));
    let before = read();
    join();
    match (before, read()) {
        (Some((w0, t0)), Some((w1, t1))) => {
            Start::Proc { whole: Bracket { lo: w0, hi: w1 }, threads: Bracket { lo: t0, hi: t1 } }
        }
        _ if super::target::is_gone(pid) => Start::Unknown("it exited before attach".into()),
        _ => Start::Unknown("its /proc/PID/stat could not be read at attach".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(min: u64, maj: u64) -> FltCount {
        FltCount { min, maj }
    }

    #[test]
    fn a_target_gone_during_the_attach_is_said_to_have_exited() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let start = start_at_attach(pid, || {
            child.kill().unwrap();
            child.wait().unwrap();
        });
        assert!(matches!(&start, Start::Unknown(why) if why == "it exited before attach"), "{start:?}");
    }

    #[test]
    fn stat_fields_after_a_hostile_comm() {
        let line = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 12345 77 3 9 10 20 0 0 20 0 1 0 1 1 1";
        assert_eq!(parse_stat(line), Some(c(12345, 3)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1"), None);
    }

    #[test]
    fn exec_to_exit_is_exact() {
        let mut k = KernelCount::new(Start::Exact(c(120, 1), "its exec"));
        k.exited(c(4216, 1));
        let w = k.window().unwrap();
        assert_eq!((w.min, w.maj), ((4096, 4096), (0, 0)));
        assert_eq!(w.total(), (4096, 4096));
        assert!(w.how.contains("exec") && w.how.contains("exit"), "{}", w.how);
    }

    #[test]
    fn attach_to_exit_counts_only_the_threads_alive_at_attach() {
        // 500 faults of threads that exited before attach are in the whole
        // count, not in the threads' own; 3 faults raced with the join.
        let start = Start::Proc {
            whole: Bracket { lo: c(1500, 0), hi: c(1503, 0) },
            threads: Bracket { lo: c(1000, 0), hi: c(1003, 0) },
        };
        let mut k = KernelCount::new(start);
        k.exited(c(9003, 0));
        assert_eq!(k.window().unwrap().total(), (8000, 8003));
    }

    #[test]
    fn attach_to_a_running_end_is_a_range() {
        let start = Start::Proc { whole: Bracket::exact(c(100, 2)), threads: Bracket::exact(c(90, 2)) };
        let mut k = KernelCount::new(start);
        k.end = Some(End::Proc(Bracket { lo: c(600, 2), hi: c(610, 3) }));
        let w = k.window().unwrap();
        assert_eq!((w.min, w.maj), ((500, 510), (0, 1)));
        // An exit seen after the last read keeps the read's low side.
        k.exited(c(620, 3));
        assert_eq!(k.window().unwrap().total(), (500, 521));
    }

    #[test]
    fn a_process_that_left_says_why() {
        let mut k = KernelCount::new(Start::Exact(c(1, 0), "its fork"));
        k.end = Some(End::Left("it left"));
        assert_eq!(k.window().unwrap_err(), "it left");
    }

    #[test]
    fn no_start_or_end_is_said() {
        let k = KernelCount::new(Start::Unknown("adopted".into()));
        assert!(k.window().unwrap_err().contains("end"));
        let mut k = KernelCount::new(Start::Unknown("adopted".into()));
        k.exited(c(1, 0));
        assert_eq!(k.window().unwrap_err(), "adopted");
    }

    #[test]
    fn this_process_reads_its_own_count() {
        let me = std::process::id();
        let whole = process_flt(me).unwrap();
        let threads = threads_flt(me).unwrap();
        assert!(whole.min > 0 && threads.min > 0 && threads.min <= whole.min + 1000);
    }
}
