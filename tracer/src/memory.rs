//! The memory a bench writes (and the test workload, which shares this):
//! 2M-aligned anonymous mappings, one store per page, a forked child that
//! shares them, and the process's own getrusage view of each step.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::ValueEnum;
use serde_json::json;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Child {
    /// The child exits before the parent writes: writes reuse.
    Exit,
    /// The child stays alive while the parent writes: writes copy.
    Alive,
}

/// getrusage(RUSAGE_SELF) and the time: the process's own view of a step.
#[derive(Clone, Copy)]
pub struct Usage {
    pub minflt: i64,
    pub majflt: i64,
    pub at: Instant,
    /// The process's CPU time so far (CLOCK_PROCESS_CPUTIME_ID), ns.
    pub cpu_ns: u64,
}

pub fn usage() -> Usage {
    // SAFETY: getrusage and clock_gettime fill the structs.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    let cpu_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    Usage { minflt: ru.ru_minflt, majflt: ru.ru_majflt, at: Instant::now(), cpu_ns }
}

pub fn phase(a: Usage, b: Usage) -> serde_json::Value {
    json!({
        "minflt": b.minflt - a.minflt,
        "majflt": b.majflt - a.majflt,
        "wall_ns": (b.at - a.at).as_nanos() as u64,
        "cpu_ns": b.cpu_ns.saturating_sub(a.cpu_ns),
    })
}

/// What a forked child does with the memory it shares.
#[derive(Clone, Copy, Debug)]
pub enum ChildLife {
    /// Stays until killed, and dies with its parent (`PR_SET_PDEATHSIG`).
    Stay,
    /// Exits, after sleeping this long if given.
    Exit(Option<std::time::Duration>),
}

/// Forks a child sharing this process's memory that does only what
/// `life` says (async-signal-safe calls alone, as a forked child of a
/// threaded process needs). Returns its pid.
pub fn fork_child(life: ChildLife) -> Result<libc::pid_t> {
    // The parent's pid, for the child to tell that it was orphaned before
    // PR_SET_PDEATHSIG took effect (it may be reparented to a subreaper,
    // not only to init).
    let parent = unsafe { libc::getpid() };
    let sleep = match life {
        ChildLife::Exit(Some(d)) => Some(libc::timespec {
            tv_sec: d.as_secs() as libc::time_t,
            tv_nsec: d.subsec_nanos() as libc::c_long,
        }),
        _ => None,
    };
    // SAFETY: fork; the child only pauses, sleeps or exits.
    let child = unsafe { libc::fork() };
    if child < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if child == 0 {
        unsafe {
            if let ChildLife::Stay = life {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if libc::getppid() != parent {
                    libc::_exit(0);
                }
                loop {
                    libc::pause();
                }
            }
            if let Some(t) = sleep {
                libc::nanosleep(&t, std::ptr::null_mut());
            }
            libc::_exit(0);
        }
    }
    Ok(child)
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

/// Reads one byte of every page (read faults: a file mapping's folios
/// mapped); returns their sum, so that the reads are not optimised away.
///
/// # Safety
/// `base..base + len` must be readable memory of this process.
pub unsafe fn read_pages(base: *const u8, len: usize, page: usize) -> u8 {
    let mut sum = 0u8;
    let mut off = 0;
    while off < len {
        // SAFETY: inside the mapping (the caller's promise).
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(base.add(off)) });
        off += page;
    }
    sum
}

/// Anonymous private memory of `len` bytes aligned to 2M (so THPs and
/// mTHPs of any order fit), with `advice` applied. Never unmapped: the
/// process ends after using it.
pub fn map_aligned(len: usize, advice: Option<libc::c_int>) -> Result<*mut u8> {
    map_aligned_with(len, advice, libc::MAP_PRIVATE)
}

/// [`map_aligned`], MAP_PRIVATE or MAP_SHARED.
pub fn map_aligned_with(len: usize, advice: Option<libc::c_int>, sharing: libc::c_int) -> Result<*mut u8> {
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
