//! The built-in workload: populate, fork, write, with known page arithmetic.
//!
//! Populate anonymous memory, fork, let the child exit (COW reuse) or stay
//! alive (COW copy), then write one byte per page. It reports its own view of
//! each phase (getrusage minor faults, wall time), which tests use as an
//! oracle independent of the tracer.

use std::{fs, path::PathBuf, time::Instant};

use anyhow::{bail, Context as _, Result};
use clap::{Args, ValueEnum};
use serde_json::json;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Thp {
    /// MADV_NOHUGEPAGE: 4K pages whatever the system setting.
    Never,
    /// MADV_HUGEPAGE: THP / mTHP where the system enables them for madvise.
    Madvise,
    /// No madvise: the system's default.
    System,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Child {
    /// The child exits before the parent writes: writes reuse.
    Exit,
    /// The child stays alive while the parent writes: writes copy.
    Alive,
}

#[derive(Args, Clone, Debug)]
pub struct WorkloadOpts {
    /// Anonymous memory to use, e.g. 64M, 256M, 1G.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub size: u64,
    #[arg(long, value_enum, default_value = "never")]
    pub thp: Thp,
    #[arg(long, value_enum, default_value = "exit")]
    pub child: Child,
    /// With `--child exit`: the child lives this many seconds (or until
    /// something kills it) before it exits, and the parent waits for it.
    /// Time for a tracer to attach with -p while the child is alive.
    #[arg(long)]
    pub child_lifetime: Option<f64>,
    /// Write the workload's own report (JSON) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// MAP_SHARED anonymous memory (shmem) instead of private: fork shares
    /// it, nothing is copied on write.
    #[arg(long)]
    pub shared: bool,
    /// Before the write phase, clear the soft-dirty bits
    /// (/proc/self/clear_refs 4, as CRIU's pre-dump does): every page is
    /// write-protected again, so each write is a write-protect fault, a
    /// reuse on private memory and write-notify (`wp_shared`) on shared.
    #[arg(long)]
    pub clear_soft_dirty: bool,
    /// Sleep this many seconds before starting (time for a tracer to attach
    /// with -p).
    #[arg(long, default_value_t = 0.0)]
    pub start_delay: f64,
    /// The main thread exits alone at once (as `pthread_exit` in `main`);
    /// a second thread waits this many seconds, runs the workload and ends
    /// the process. For tests of a process outliving its main thread.
    #[arg(long, hide = true)]
    pub leader_exit: Option<f64>,
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let m = match s[i..].to_ascii_uppercase().trim_end_matches(['B', 'I']) {
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "" => 1,
                other => return Err(format!("unknown size suffix {other:?} in {s:?}")),
            };
            (&s[..i], m)
        }
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    n.checked_mul(mult).filter(|v| *v > 0).ok_or_else(|| format!("bad size {s:?}"))
}

/// getrusage(RUSAGE_SELF) and the time: the workload's own view of a phase.
#[derive(Clone, Copy)]
pub struct Usage {
    pub minflt: i64,
    pub majflt: i64,
    pub at: Instant,
}

pub fn usage() -> Usage {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    Usage { minflt: ru.ru_minflt, majflt: ru.ru_majflt, at: Instant::now() }
}

pub fn phase(a: Usage, b: Usage) -> serde_json::Value {
    json!({
        "minflt": b.minflt - a.minflt,
        "majflt": b.majflt - a.majflt,
        "wall_ns": (b.at - a.at).as_nanos() as u64,
    })
}

/// Touches one byte per page with volatile stores, so the compiler keeps
/// every store.
///
/// # Safety
/// `base..base + len` must be writable memory of this process.
pub unsafe fn write_pages(base: *mut u8, len: usize, page: usize, val: u8) {
    let mut off = 0;
    while off < len {
        // SAFETY: off < len, inside the mapping (the caller's promise).
        unsafe { std::ptr::write_volatile(base.add(off), val) };
        off += page;
    }
}

/// Anonymous private memory of `len` bytes aligned to 2M (so THPs and
/// mTHPs of any order fit), with `advice` applied. Never unmapped: the
/// process ends after using it.
pub fn map_aligned(len: usize, advice: Option<libc::c_int>) -> Result<*mut u8> {
    map_aligned_with(len, advice, libc::MAP_PRIVATE)
}

/// [`map_aligned`], MAP_PRIVATE or MAP_SHARED.
fn map_aligned_with(len: usize, advice: Option<libc::c_int>, sharing: libc::c_int) -> Result<*mut u8> {
    let align = 2 << 20;
    let map_len = len + align;
    // SAFETY: anonymous private mapping; checked for MAP_FAILED.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            sharing | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        bail!("mmap of {map_len} bytes: {}", std::io::Error::last_os_error());
    }
    let base = ((raw as usize + align - 1) & !(align - 1)) as *mut u8;
    if let Some(a) = advice {
        // SAFETY: advising our own mapping.
        if unsafe { libc::madvise(base.cast(), len, a) } != 0 {
            bail!("madvise: {}", std::io::Error::last_os_error());
        }
    }
    Ok(base)
}

/// pagemap's soft-dirty bit (Documentation/admin-guide/mm/soft-dirty.rst).
const PM_SOFT_DIRTY: u64 = 1 << 55;

fn soft_dirty(addr: *const u8) -> Result<bool> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let mut f = fs::File::open("/proc/self/pagemap").context("opening /proc/self/pagemap")?;
    f.seek(SeekFrom::Start(addr as u64 / page * 8))?;
    let mut b = [0u8; 8];
    f.read_exact(&mut b).context("reading /proc/self/pagemap")?;
    Ok(u64::from_le_bytes(b) & PM_SOFT_DIRTY != 0)
}

/// Clears the soft-dirty bits of the whole process. A kernel without
/// CONFIG_MEM_SOFT_DIRTY accepts the write and does nothing; a page just
/// written is soft-dirty where the kernel tracks it, so that is checked
/// first rather than measuring a write phase with no faults.
fn clear_soft_dirty(written: *const u8) -> Result<()> {
    if !soft_dirty(written)? {
        bail!("this kernel does not track soft-dirty pages (CONFIG_MEM_SOFT_DIRTY): --clear-soft-dirty cannot write-protect anything");
    }
    fs::write("/proc/self/clear_refs", "4").context("clearing soft-dirty bits (/proc/self/clear_refs)")?;
    if soft_dirty(written)? {
        bail!("/proc/self/clear_refs 4 left the pages soft-dirty");
    }
    Ok(())
}

pub fn run(o: &WorkloadOpts) -> Result<()> {
    match o.leader_exit {
        Some(delay) => leader_exit(o.clone(), delay),
        None => run_here(o),
    }
}

/// `--leader-exit`: the workload in a second thread, after the main thread
/// has exited.
fn leader_exit(o: WorkloadOpts, delay: f64) -> Result<()> {
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs_f64(delay.max(0.0)));
        let code = match run_here(&o) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("faultscope workload: {e:#}");
                1
            }
        };
        std::process::exit(code);
    });
    // SAFETY: exit(2), not exit_group(2): only this thread ends, without
    // unwinding; the process lives on in the thread above.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("exit(2) returned")
}

fn run_here(o: &WorkloadOpts) -> Result<()> {
    if o.start_delay > 0.0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(o.start_delay));
    }
    let start = usage();
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = o.size as usize;
    if !len.is_multiple_of(page) {
        bail!("--size must be a multiple of the page size ({page})");
    }
    let advice = match o.thp {
        Thp::Never => Some(libc::MADV_NOHUGEPAGE),
        Thp::Madvise => Some(libc::MADV_HUGEPAGE),
        Thp::System => None,
    };
    let sharing = if o.shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
    let base = map_aligned_with(len, advice, sharing)?;
    let pages = len / page;

    let t0 = usage();
    // SAFETY: the mapping of len bytes just made.
    unsafe { write_pages(base, len, page, 1) };
    let t1 = usage();

    // The parent's pid, for the child to tell that it was orphaned before
    // PR_SET_PDEATHSIG took effect (it may be reparented to a subreaper,
    // not only to init).
    let parent = unsafe { libc::getpid() };
    let lifetime = o.child_lifetime.map(|s| libc::timespec {
        tv_sec: s.max(0.0).trunc() as libc::time_t,
        tv_nsec: (s.max(0.0).fract() * 1e9) as libc::c_long,
    });
    // SAFETY: fork; the child only sleeps/exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if child == 0 {
        if o.child == Child::Alive {
            // Stay until the parent kills us, or dies.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
            }
            loop {
                unsafe { libc::pause() };
            }
        }
        if let Some(t) = lifetime {
            // nanosleep is async-signal-safe, as a forked child needs.
            unsafe { libc::nanosleep(&t, std::ptr::null_mut()) };
        }
        unsafe { libc::_exit(0) };
    }
    if o.child == Child::Exit {
        let mut st = 0;
        unsafe { libc::waitpid(child, &mut st, 0) };
    }
    if o.clear_soft_dirty {
        clear_soft_dirty(base)?;
    }
    let t2 = usage();
    // SAFETY: the same mapping.
    unsafe { write_pages(base, len, page, 2) };
    let t3 = usage();
    if o.child == Child::Alive {
        unsafe {
            libc::kill(child, libc::SIGKILL);
            libc::waitpid(child, std::ptr::null_mut(), 0);
        }
    }
    let end = usage();
    let report = json!({
        "workload": "fork-write",
        "pid": std::process::id(),
        "child_pid": child,
        "child": format!("{:?}", o.child).to_lowercase(),
        "thp": format!("{:?}", o.thp).to_lowercase(),
        "mapping": if o.shared { "shared" } else { "private" },
        "clear_soft_dirty": o.clear_soft_dirty,
        "page_size": page,
        "bytes": len,
        "pages": pages,
        "phases": {
            "populate": phase(t0, t1),
            "fork": phase(t1, t2),
            "write": phase(t2, t3),
        },
        "minflt_total": end.minflt,
        "majflt_total": end.majflt,
        "minflt_since_main": end.minflt - start.minflt,
    });
    let text = serde_json::to_string_pretty(&report)?;
    match &o.out {
        Some(p) => fs::write(p, text).with_context(|| format!("writing {}", p.display()))?,
        None => println!("{text}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("").is_err());
    }
}
