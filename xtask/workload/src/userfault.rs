//! `--userfault HOLD_MS`: faults that sleep. A region registered with
//! userfaultfd (missing pages) is written by two threads, one byte per
//! page; each fault waits in the kernel (`handle_userfault`) until a
//! handler thread, after holding it HOLD_MS, fills the page (UFFDIO_COPY)
//! and wakes it. Meanwhile a third thread takes first-touch faults of a
//! region of its own, zapped with MADV_DONTNEED after each pass, so that
//! other faults run on the CPUs the sleeping ones left.
//!
//! The arithmetic: each held page takes two `handle_mm_fault` calls, the
//! first returning VM_FAULT_RETRY after the wait, the retry completing;
//! the busy region takes one fault per page per pass.

use std::{
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::Duration,
};

use anyhow::{bail, Result};
use serde_json::json;

use faultscope::memory::{map_aligned, phase, usage};

use crate::WorkloadOpts;

/// The uapi of linux/userfaultfd.h (stable since 4.3); libc has only the
/// system call's number.
const UFFD_API: u64 = 0xaa;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
/// `_IOWR(0xAA, nr, size)`: the same number on x86-64 and arm64.
const fn uffd_iowr(nr: u64, size: usize) -> libc::c_ulong {
    ((3u64 << 30) | ((size as u64) << 16) | (0xaa << 8) | nr) as libc::c_ulong
}

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRegister {
    start: u64,
    len: u64,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

/// `struct uffd_msg`: the event, and for a page fault its flags and
/// address.
#[repr(C)]
#[derive(Default)]
struct UffdMsg {
    event: u8,
    _reserved: [u8; 7],
    flags: u64,
    address: u64,
    _feat: u64,
}

const UFFDIO_API: libc::c_ulong = uffd_iowr(0x3f, size_of::<UffdioApi>());
const UFFDIO_REGISTER: libc::c_ulong = uffd_iowr(0x00, size_of::<UffdioRegister>());
const UFFDIO_COPY: libc::c_ulong = uffd_iowr(0x03, size_of::<UffdioCopy>());

/// Pages of the busy thread's region, and the most passes it makes (the
/// guests' tracefs oracle keeps every fault in its ring).
const BUSY_PAGES: usize = 256;
const BUSY_PASSES: usize = 64;

fn ioctl<T>(fd: i32, req: libc::c_ulong, arg: &mut T, what: &str) -> Result<()> {
    // SAFETY: `arg` is the request's own struct, alive for the call.
    if unsafe { libc::ioctl(fd, req, arg as *mut T) } != 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// A userfaultfd handling missing pages of `len` bytes at `at`.
fn register(at: *mut u8, len: usize) -> Result<i32> {
    // SAFETY: the system call takes flags only.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as i32;
    if fd < 0 {
        bail!(
            "userfaultfd: {} (CONFIG_USERFAULTFD, and root or vm.unprivileged_userfaultfd)",
            std::io::Error::last_os_error()
        );
    }
    ioctl(fd, UFFDIO_API, &mut UffdioApi { api: UFFD_API, features: 0, ioctls: 0 }, "UFFDIO_API")?;
    let mut reg =
        UffdioRegister { start: at as u64, len: len as u64, mode: UFFDIO_REGISTER_MODE_MISSING, ioctls: 0 };
    ioctl(fd, UFFDIO_REGISTER, &mut reg, "UFFDIO_REGISTER")?;
    Ok(fd)
}

/// Resolves `pages` page faults of `fd`, each after `hold`, from the page
/// at `src`.
fn handle(fd: i32, pages: usize, page: usize, src: u64, hold: Duration) -> Result<()> {
    let mut done = 0;
    while done < pages {
        let mut m = UffdMsg::default();
        // SAFETY: reads one message into `m`, its size.
        let n = unsafe { libc::read(fd, (&mut m as *mut UffdMsg).cast(), size_of::<UffdMsg>()) };
        if n != size_of::<UffdMsg>() as isize {
            bail!("read of the userfaultfd: {}", std::io::Error::last_os_error());
        }
        if m.event != UFFD_EVENT_PAGEFAULT {
            continue;
        }
        std::thread::sleep(hold);
        let dst = m.address & !(page as u64 - 1);
        let mut c = UffdioCopy { dst, src, len: page as u64, mode: 0, copy: 0 };
        ioctl(fd, UFFDIO_COPY, &mut c, "UFFDIO_COPY")?;
        done += 1;
    }
    Ok(())
}

pub fn run(o: &WorkloadOpts, hold_ms: f64) -> Result<()> {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = o.size as usize;
    if len == 0 || !len.is_multiple_of(page) {
        bail!("--userfault needs --size a multiple of the page size");
    }
    if !(0.0..=1000.0).contains(&hold_ms) {
        bail!("--userfault {hold_ms}: give 0 to 1000 milliseconds");
    }
    let pages = len / page;
    let nohuge = Some(libc::MADV_NOHUGEPAGE);
    // Each region meant as its own VMA (madvise splits it out of the
    // mapping), the source page not advised. A guest once showed the busy
    // region inside a VMA from its mapping's start to the held region: a
    // check takes the row that holds a region, and other faults in it fail
    // the oracle's range count.
    let (held, busy, src) =
        (map_aligned(len, nohuge)?, map_aligned(BUSY_PAGES * page, nohuge)?, map_aligned(page, None)?);
    // SAFETY: the source page just mapped.
    unsafe { src.write_bytes(7, page) };
    let fd = register(held, len)?;
    let (held_at, busy_at, src_at) = (held as usize, busy as usize, src as u64);
    let hold = Duration::from_secs_f64(hold_ms / 1000.0);
    let stop = AtomicBool::new(false);
    let passes = AtomicUsize::new(0);
    let t0 = usage();
    std::thread::scope(|sc| -> Result<()> {
        let handler = sc.spawn(move || handle(fd, pages, page, src_at, hold));
        let (stop, passes) = (&stop, &passes);
        sc.spawn(move || {
            while !stop.load(Ordering::Acquire) && passes.load(Ordering::Acquire) < BUSY_PASSES {
                for i in 0..BUSY_PAGES {
                    // SAFETY: page i of the busy region, this thread's alone.
                    unsafe { ((busy_at + i * page) as *mut u8).write_volatile(1) };
                }
                // SAFETY: the busy region, zapped for the next pass.
                unsafe {
                    libc::madvise(busy_at as *mut libc::c_void, BUSY_PAGES * page, libc::MADV_DONTNEED)
                };
                passes.fetch_add(1, Ordering::AcqRel);
            }
        });
        let writers: Vec<_> = (0..2)
            .map(|t| {
                sc.spawn(move || {
                    for i in (t..pages).step_by(2) {
                        // SAFETY: page i of the held region, this thread's alone.
                        unsafe { ((held_at + i * page) as *mut u8).write_volatile(1) };
                    }
                })
            })
            .collect();
        for w in writers {
            let _ = w.join();
        }
        stop.store(true, Ordering::Release);
        handler.join().map_err(|_| anyhow::anyhow!("the userfaultfd handler panicked"))?
    })?;
    let t1 = usage();
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    if let Some(p) = &o.regions_out {
        let ranges = format!(
            "held={held_at:#x}-{:#x}\nbusy={busy_at:#x}-{:#x}\n",
            held_at + len,
            busy_at + BUSY_PAGES * page
        );
        faultscope::output::write(p, ranges.as_bytes())?;
    }
    let report = json!({
        "workload": "userfault",
        "pid": std::process::id(),
        "page_size": page,
        "hold_ns": hold.as_nanos() as u64,
        "regions": [
            {"role": "held", "start": held_at, "end": held_at + len, "pages": pages},
            {"role": "busy", "start": busy_at, "end": busy_at + BUSY_PAGES * page, "pages": BUSY_PAGES,
             "passes": passes.load(Ordering::Acquire)},
        ],
        "phases": {"write": phase(t0, t1)},
        "minflt_total": t1.minflt,
        "majflt_total": t1.majflt,
    });
    crate::emit(o, &report)
}
