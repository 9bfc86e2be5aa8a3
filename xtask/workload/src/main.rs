//! fs-workload, the test workload (not part of the product): populate,
//! fork, write, with known page arithmetic.
//!
//! Populate anonymous memory, fork, let the child exit (COW reuse) or stay
//! alive (COW copy), then write one byte per page. It reports its own view of
//! each phase (getrusage minor faults, wall time), which tests use as an
//! oracle independent of the tracer.
//!
//! With `--mappings`, the fork/write runs over three mappings of different
//! kinds and page counts, each written after the fork by a function of its
//! own (what attribution must name): a named anonymous region (the plain
//! one, named with `PR_SET_VMA_ANON_NAME`), a private mapping of a file it
//! creates (read before the fork, so its pages are the file's page cache,
//! mapped read-only: every write copies), and pages it adds to `[heap]`
//! with `sbrk`.

use std::{fmt::Write as _, fs, path::PathBuf, time::Instant};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, ValueEnum};
use serde_json::json;

use faultscope::{
    attrib::mapping::{parse_maps, MappingName},
    error::Refusal,
    memory::{
        fork_child, map_aligned, map_aligned_with, phase, read_pages, usage, write_pages, Child, ChildLife,
        Usage,
    },
    units::parse_size,
};

mod userfault;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Thp {
    /// MADV_NOHUGEPAGE: 4K pages whatever the system setting.
    Never,
    /// MADV_HUGEPAGE: THP / mTHP where the system enables them for madvise.
    Madvise,
    /// No madvise: the system's default.
    System,
}

/// The test workload of faultscope's host and guest tests: its own
/// getrusage view of each phase is the oracle the tests compare with.
#[derive(Parser, Clone, Debug)]
#[command(name = "fs-workload", version)]
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
    /// Three mappings instead of one: the region of --size named
    /// `[anon:faultscope-named]`, a MAP_PRIVATE file mapping of --size/2
    /// (a file it creates in the temporary directory, read before the fork:
    /// every write after it is a COW copy of a page-cache page), and
    /// --size/4 of pages added to `[heap]` with sbrk. Each is written after
    /// the fork by its own function (`write_named_region`,
    /// `write_file_mapping`, `write_heap`); `--out` lists them (`regions`)
    /// with the class each write must be. 4K pages: needs `--thp never`.
    #[arg(long, conflicts_with_all = ["shared", "clear_soft_dirty"])]
    pub mappings: bool,
    /// With --mappings: also write the regions as lines `NAME=0xSTART-0xEND`
    /// (the address ranges the guest tests' oracle splits its counts by).
    #[arg(long, requires = "mappings")]
    pub regions_out: Option<PathBuf>,
    /// Sleep this many seconds after the writes, mappings in place: a
    /// tracer names mappings from /proc/PID/maps snapshots taken at phase
    /// changes, and a mapping made, faulted and unmapped between two of its
    /// polls (50 ms) is left unnamed (`unresolved 0x…`).
    #[arg(long, default_value_t = 0.0)]
    pub linger: f64,
    /// After the measured fork and write, go on with rounds of `--repeat-by`
    /// and a write of one byte per page until this many seconds have passed
    /// since the first write: a steady storm of faults, one per page per
    /// round, for measuring what a tracer costs over time (`cargo xtask
    /// overhead`). `--out` gets the rounds and their faults.
    #[arg(long, conflicts_with_all = ["mappings", "shared", "clear_soft_dirty", "child_lifetime"])]
    pub repeat_for: Option<f64>,
    /// What each round of `--repeat-for` does before its writes.
    #[arg(long, value_enum, default_value = "fork", requires = "repeat_for")]
    pub repeat_by: RepeatBy,
    /// Every origin of a fault: the memory is two halves, each written in
    /// thirds three ways, one byte per page: by `read(2)` from /dev/zero
    /// (the kernel's faults in a system call), by `pwrite(2)` to
    /// /proc/self/mem (get_user_pages) and by user-mode stores. The first
    /// half while a forked child shares it (COW copies), the second after
    /// the child is killed (reuse). `--out` has `origins`: the pages per
    /// third and getrusage of each half.
    #[arg(long, conflicts_with_all = ["mappings", "shared", "clear_soft_dirty", "child_lifetime", "repeat_for", "leader_exit"])]
    pub origins: bool,
    /// A threaded storm across phase changes: two mappings of --size/2
    /// (`a` and `b`), populated, then shared with a forked child; this many
    /// threads write one byte per page, each its own pages, `a` and `b`
    /// alternately. When half the pages are written the child is killed,
    /// and at three quarters a second child is forked and exits at once:
    /// every page takes one write-protect fault (a copy while a child
    /// shares it, else a reuse), in phases that change under the threads.
    /// `--regions-out` gets the two ranges.
    #[arg(long, conflicts_with_all = ["mappings", "shared", "clear_soft_dirty", "child_lifetime", "repeat_for", "leader_exit", "origins"])]
    pub threads: Option<usize>,
    /// Faults that sleep: a userfaultfd region of --size written by two
    /// threads, one byte per page, each fault held this many milliseconds
    /// by a handler thread before it fills the page; meanwhile a third
    /// thread takes first-touch faults of a region of its own, pass after
    /// pass. `--regions-out` gets the ranges (`held`, `busy`); `--out` the
    /// pages and the busy passes.
    #[arg(long, conflicts_with_all = ["mappings", "shared", "clear_soft_dirty", "child_lifetime", "repeat_for", "leader_exit", "origins", "threads"])]
    pub userfault: Option<f64>,
    /// A short life: map this file privately, read then write one byte per
    /// page (first touch, then a COW copy of each page-cache page), unmap
    /// it and exit at once, well before a tracer's next poll of its maps.
    #[arg(long, conflicts_with_all = ["mappings", "shared", "clear_soft_dirty", "child_lifetime", "repeat_for", "leader_exit", "origins", "threads", "userfault"])]
    pub map_file: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum RepeatBy {
    /// Fork (the child exits at once): each write is a write-protect fault
    /// (COW reuse), and each round a fork and a child's exit.
    Fork,
    /// MADV_DONTNEED the memory: each write is a first-touch fault on a
    /// fresh zeroed page, and nothing else happens.
    Dontneed,
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

/// `prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, ...)` (include/uapi/linux/prctl.h;
/// not in the libc crate).
const PR_SET_VMA: libc::c_int = 0x5356_4d41;
const PR_SET_VMA_ANON_NAME: libc::c_ulong = 0;

/// The name of `--mappings`' anonymous region (`[anon:faultscope-named]` in
/// /proc/PID/maps).
pub const ANON_NAME: &str = "faultscope-named";

/// One byte per page, volatile, inlined into each writer below so that the
/// faulting instruction is in the writer itself.
///
/// # Safety
/// `base..base + len` must be writable memory of this process.
#[inline(always)]
unsafe fn store_pages(base: *mut u8, len: usize, page: usize, val: u8) {
    let mut off = 0;
    while off < len {
        // SAFETY: off < len, inside the mapping (the caller's promise).
        unsafe { std::ptr::write_volatile(base.add(off), val) };
        off += page;
    }
}

// The three writers of `--mappings`, each the only code writing its region
// after the fork. They store different values so that LLVM's function
// merging cannot make them one symbol.

/// # Safety
/// As [`store_pages`].
#[inline(never)]
unsafe fn write_named_region(base: *mut u8, len: usize, page: usize) {
    unsafe { store_pages(std::hint::black_box(base), len, page, 0x11) }
}

/// # Safety
/// As [`store_pages`].
#[inline(never)]
unsafe fn write_file_mapping(base: *mut u8, len: usize, page: usize) {
    unsafe { store_pages(std::hint::black_box(base), len, page, 0x22) }
}

/// # Safety
/// As [`store_pages`].
#[inline(never)]
unsafe fn write_heap(base: *mut u8, len: usize, page: usize) {
    unsafe { store_pages(std::hint::black_box(base), len, page, 0x33) }
}

/// A region of `--mappings`.
struct Region {
    /// `named`, `file`, `heap`: the oracle's range names.
    role: &'static str,
    base: *mut u8,
    len: usize,
    /// The function that writes it after the fork.
    writer: &'static str,
    write: unsafe fn(*mut u8, usize, usize),
    /// Each write after the fork is a COW copy whether the child lives or
    /// not (a page-cache page is never reused).
    always_copied: bool,
}

/// The mapping of /proc/self/maps holding `addr`: (start, end, name), the
/// name as the maps column has it (empty for unnamed anonymous memory).
fn mapping_of(maps: &str, addr: u64) -> Result<(u64, u64, String)> {
    let m = parse_maps(maps)?
        .into_iter()
        .find(|m| m.contains(addr))
        .with_context(|| format!("no mapping of /proc/self/maps holds {addr:#x}"))?;
    let name = match m.name {
        MappingName::Anon { .. } => String::new(),
        MappingName::File { path, deleted: true } => format!("{path} (deleted)"),
        MappingName::File { path, deleted: false } => path,
        n => n.to_string(),
    };
    Ok((m.start, m.end, name))
}

/// The regions of `--mappings` besides the named one: the file mapping and
/// the heap pages, populated (the file's pages read, the heap's written).
struct Mappings {
    /// The name of the anonymous region is set, or why not.
    anon_name: Result<(), String>,
    regions: Vec<Region>,
    file: PathBuf,
}

/// Names the anonymous region `[anon:faultscope-named]`. A kernel built
/// without CONFIG_ANON_VMA_NAME (Debian's 6.12 and 7.3 among them) refuses
/// with EINVAL: the region stays unnamed, which is said on stderr and in
/// the JSON (`anon_name.refused`), never passed over. Any other error fails.
fn name_anon(addr: *mut u8, len: usize) -> Result<Result<(), String>> {
    let cname = std::ffi::CString::new(ANON_NAME)?;
    // SAFETY: naming our own mapping; the name outlives the call.
    let r =
        unsafe { libc::prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, addr as libc::c_ulong, len, cname.as_ptr()) };
    if r == 0 {
        return Ok(Ok(()));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EINVAL) {
        bail!("prctl(PR_SET_VMA_ANON_NAME): {e}");
    }
    let why = format!(
        "prctl(PR_SET_VMA_ANON_NAME) refused: {e} (a kernel without CONFIG_ANON_VMA_NAME cannot name anonymous memory)"
    );
    eprintln!("fs-workload: WARNING: {why}: the region [anon:{ANON_NAME}] stays unnamed");
    Ok(Err(why))
}

impl Mappings {
    /// Names the region `named` (the plain one), maps a file of `len / 2`
    /// and adds `len / 4` to the heap.
    fn new(named: *mut u8, len: usize, page: usize) -> Result<Mappings> {
        let (flen, hlen) = (len / 2, len / 4);
        if hlen < page || !hlen.is_multiple_of(page) {
            bail!("--mappings needs --size a multiple of 4 pages");
        }
        let anon_name = name_anon(named, len)?;
        // A new file under a name nobody can guess, created exclusively and
        // never through a link (the temporary directory is everyone's).
        let (mut w, file) = tempfile::Builder::new()
            .prefix("faultscope-workload-")
            .suffix(".dat")
            .tempfile()
            .context("creating the mapped file in the temporary directory")?
            .keep()
            .context("keeping the mapped file")?;
        // Written a page at a time: a buffer of flen would be a transient
        // mmap by malloc, and the file mapping could then land on addresses
        // it had, which an address-only oracle would mix up with it.
        let chunk = vec![0x5au8; page];
        for _ in 0..flen / page {
            std::io::Write::write_all(&mut w, &chunk)
                .with_context(|| format!("writing {}", file.display()))?;
        }
        drop(w);
        let f = fs::File::open(&file).with_context(|| format!("opening {}", file.display()))?;
        let fbase = map_private(&f, flen, &file)?;
        // Read, not written: the page-cache pages are mapped read-only, so
        // each write after the fork copies (do_wp_page -> wp_page_copy).
        // SAFETY: the mapping just made.
        std::hint::black_box(unsafe { read_pages(fbase, flen, page) });
        // The heap: from the first page boundary at or after the break, so
        // that no page is shared with malloc's chunks.
        // SAFETY: sbrk(0) reads the break.
        let cur = unsafe { libc::sbrk(0) } as usize;
        let hbase = cur.next_multiple_of(page);
        // SAFETY: moves the break; checked.
        if unsafe { libc::sbrk((hbase - cur + hlen) as libc::intptr_t) } as isize == -1 {
            bail!("sbrk of {hlen} bytes: {}", std::io::Error::last_os_error());
        }
        let hbase = hbase as *mut u8;
        // SAFETY: the pages just added to the heap.
        unsafe { store_pages(hbase, hlen, page, 1) };
        let region = |role, base, len, writer, write: unsafe fn(*mut u8, usize, usize), always_copied| {
            Region { role, base, len, writer, write, always_copied }
        };
        Ok(Mappings {
            anon_name,
            regions: vec![
                region("named", named, len, "write_named_region", write_named_region, false),
                region("file", fbase, flen, "write_file_mapping", write_file_mapping, true),
                region("heap", hbase, hlen, "write_heap", write_heap, false),
            ],
            file,
        })
    }

    /// Writes each region, one byte per page, each by its own function.
    fn write(&self, page: usize) {
        for r in &self.regions {
            // SAFETY: the region's own memory.
            unsafe { (r.write)(r.base, r.len, page) };
        }
    }

    /// The regions as /proc/self/maps shows them now, with the class of
    /// their writes after the fork, and the oracle's ranges (one
    /// `NAME=0xSTART-0xEND` per line; `heap-vma` is the whole `[heap]`).
    fn describe(&self, page: usize, child: Child) -> Result<(serde_json::Value, serde_json::Value, String)> {
        let maps = fs::read_to_string("/proc/self/maps").context("reading /proc/self/maps")?;
        let (mut rows, mut ranges) = (Vec::new(), String::new());
        for r in &self.regions {
            let (start, end) = (r.base as u64, r.base as u64 + r.len as u64);
            let (vs, ve, name) = mapping_of(&maps, start)?;
            let want = match r.role {
                "named" if self.anon_name.is_ok() => format!("[anon:{ANON_NAME}]"),
                "named" => String::new(),
                "file" => self.file.display().to_string(),
                _ => "[heap]".into(),
            };
            // The named region and the file are mappings of their own; the
            // heap pages are part of [heap].
            let whole = r.role != "heap";
            if name != want || (whole && (vs, ve) != (start, end)) || end > ve {
                bail!(
                    "{} region {start:#x}-{end:#x} is in mapping {vs:#x}-{ve:#x} {name:?}, not its own {want:?}",
                    r.role
                );
            }
            let class = if r.always_copied || child == Child::Alive { "copy" } else { "reuse" };
            rows.push(json!({
                "role": r.role, "mapping": name, "start": start, "end": end,
                "vma_start": vs, "vma_end": ve, "pages": r.len / page,
                "class": class, "writer": r.writer,
            }));
            let _ = writeln!(ranges, "{}={start:#x}-{end:#x}", r.role);
            if !whole {
                let _ = writeln!(ranges, "{}-vma={vs:#x}-{ve:#x}", r.role);
            }
        }
        let anon_name = match &self.anon_name {
            Ok(()) => json!({"requested": ANON_NAME, "set": true}),
            Err(why) => json!({"requested": ANON_NAME, "set": false, "refused": why}),
        };
        Ok((serde_json::Value::Array(rows), anon_name, ranges))
    }
}

impl Drop for Mappings {
    fn drop(&mut self) {
        if let Some(f) = self.regions.iter().find(|r| r.role == "file") {
            // SAFETY: our file mapping, no longer used.
            unsafe { libc::munmap(f.base.cast(), f.len) };
        }
        let _ = fs::remove_file(&self.file);
    }
}

fn main() -> std::process::ExitCode {
    let o = WorkloadOpts::parse();
    match run(&o) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fs-workload: error: {}", faultscope::term::safe(&format!("{e:#}")));
            let refused = e.downcast_ref::<Refusal>().is_some();
            std::process::ExitCode::from(if refused { faultscope::error::EXIT_REFUSED as u8 } else { 1 })
        }
    }
}

fn run(o: &WorkloadOpts) -> Result<()> {
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
                eprintln!("fs-workload: {e:#}");
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

/// `len` bytes of `f` (at `path`) mapped private and writable: a write is
/// a COW copy of its page-cache page.
fn map_private(f: &fs::File, len: usize, path: &std::path::Path) -> Result<*mut u8> {
    use std::os::fd::AsRawFd as _;
    // SAFETY: a fresh mapping of an open file; the caller unmaps it or
    // keeps it for the process's life.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        bail!("mmap of {}: {}", path.display(), std::io::Error::last_os_error());
    }
    Ok(p.cast())
}

/// `--map-file`.
fn map_file(path: &std::path::Path) -> Result<()> {
    let f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len() as usize;
    if len == 0 {
        bail!("{} is empty", path.display());
    }
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let base = map_private(&f, len, path)?;
    let mut sum = 0u8;
    for off in (0..len).step_by(page) {
        // SAFETY: inside the mapping.
        unsafe {
            sum = sum.wrapping_add(std::ptr::read_volatile(base.add(off)));
            std::ptr::write_volatile(base.add(off), sum);
        }
    }
    unsafe { libc::munmap(base.cast(), len) };
    std::hint::black_box(sum);
    Ok(())
}

fn run_here(o: &WorkloadOpts) -> Result<()> {
    if o.start_delay > 0.0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(o.start_delay));
    }
    if o.origins {
        return run_origins(o);
    }
    if let Some(n) = o.threads {
        return run_threads(o, n);
    }
    if let Some(hold_ms) = o.userfault {
        return userfault::run(o, hold_ms);
    }
    if let Some(path) = &o.map_file {
        return map_file(path);
    }
    run_fork_write(o)
}

/// The default workload: populate, fork, the child's exit or life, one
/// write per page (`--mappings`: per mapping), and the storm of
/// `--repeat-for`.
fn run_fork_write(o: &WorkloadOpts) -> Result<()> {
    let repeat_for = faultscope::units::seconds("--repeat-for", o.repeat_for, 1e-3)?;
    if repeat_for.is_some() && o.child == Child::Alive {
        return Err(Refusal::new("--repeat-for goes with --child exit").into());
    }
    let start = usage();
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = o.size as usize;
    if !len.is_multiple_of(page) {
        bail!("--size must be a multiple of the page size ({page})");
    }
    let advice = thp_advice(o.thp);
    if o.mappings && !matches!(o.thp, Thp::Never) {
        bail!("--mappings counts 4K pages: use --thp never");
    }
    let sharing = if o.shared { libc::MAP_SHARED } else { libc::MAP_PRIVATE };
    let base = map_aligned_with(len, advice, sharing)?;
    let pages = len / page;

    let t0 = usage();
    // SAFETY: the mapping of len bytes just made.
    unsafe { write_pages(base, len, page, 1) };
    let mappings = if o.mappings { Some(Mappings::new(base, len, page)?) } else { None };
    let t1 = usage();

    let child = fork_as_asked(o)?;
    if o.clear_soft_dirty {
        clear_soft_dirty(base)?;
    }
    let t2 = usage();
    match &mappings {
        Some(m) => m.write(page),
        // SAFETY: the same mapping.
        None => unsafe { write_pages(base, len, page, 2) },
    }
    let t3 = usage();
    let storm = match repeat_for {
        Some(d) => Some(repeat_write(o.repeat_by, base, len, page, t2.at + d)?),
        None => None,
    };
    let regions = match &mappings {
        Some(m) => {
            let (rows, anon_name, ranges) = m.describe(page, o.child)?;
            if let Some(p) = &o.regions_out {
                faultscope::output::write(p, ranges.as_bytes())?;
            }
            Some((rows, anon_name))
        }
        None => None,
    };
    // The mappings (the file one too) stay for a tracer to read the maps
    // after the last phase change: a mapping gone before its poll is
    // unnamed (`unresolved 0x…`).
    if o.linger > 0.0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(o.linger));
    }
    drop(mappings);
    if o.child == Child::Alive {
        reap(child);
    }
    let end = usage();
    let mut report = json!({
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
    if let Some((rounds, from, to)) = storm {
        report["repeat"] = json!({
            "by": format!("{:?}", o.repeat_by).to_lowercase(),
            "rounds": rounds,
            "phase": phase(from, to),
        });
    }
    if let Some((rows, anon_name)) = regions {
        report["regions"] = rows;
        report["anon_name"] = anon_name;
    }
    emit(o, &report)
}

/// The ways `--origins` writes a third of a half, in order.
const ORIGIN_WRITERS: [&str; 3] = ["kernel", "gup", "user"];

/// Writes one byte per page of `n` pages at `base` the way `how` names:
/// `kernel` by read(2) from `zero` (/dev/zero) straight into them, `gup` by
/// pwrite(2) of `src` (one page, faulted in before) to `mem`
/// (/proc/self/mem) a page at a time, `user` by stores.
fn write_via(
    how: &str,
    base: *mut u8,
    n: usize,
    page: usize,
    zero: &fs::File,
    mem: &fs::File,
    src: &[u8],
) -> Result<()> {
    use std::os::{fd::AsRawFd as _, unix::fs::FileExt as _};
    match how {
        "kernel" => {
            let mut done = 0;
            while done < n * page {
                // SAFETY: reads into our own mapping.
                let r = unsafe { libc::read(zero.as_raw_fd(), base.add(done).cast(), n * page - done) };
                if r <= 0 {
                    bail!("read(/dev/zero): {}", std::io::Error::last_os_error());
                }
                done += r as usize;
            }
        }
        "gup" => {
            for i in 0..n {
                let at = base as u64 + (i * page) as u64;
                mem.write_all_at(src, at).with_context(|| format!("pwrite(/proc/self/mem) at {at:#x}"))?;
            }
        }
        // SAFETY: our own mapping.
        _ => unsafe { write_pages(base, n * page, page, 7) },
    }
    Ok(())
}

/// `--origins`: see the option.
fn run_origins(o: &WorkloadOpts) -> Result<()> {
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = o.size as usize;
    let n = len / page / 6;
    if n == 0 || len != n * 6 * page {
        bail!("--origins needs --size a multiple of 6 pages");
    }
    let advice = thp_advice(o.thp);
    let base = map_aligned(len, advice)?;
    // Everything the writes use exists before the fork: no fault of their
    // own after it.
    let zero = fs::File::open("/dev/zero").context("opening /dev/zero")?;
    let mem = fs::OpenOptions::new().write(true).open("/proc/self/mem").context("opening /proc/self/mem")?;
    let src = vec![0x5au8; page];
    let t0 = usage();
    // SAFETY: the mapping just made.
    unsafe { write_pages(base, len, page, 1) };
    let t1 = usage();
    let child = fork_child(ChildLife::Stay)?;
    let half = |h: usize, i: usize| unsafe { base.add((h * 3 + i) * n * page) };
    let t2 = usage();
    for (i, how) in ORIGIN_WRITERS.iter().enumerate() {
        write_via(how, half(0, i), n, page, &zero, &mem, &src)?;
    }
    let t3 = usage();
    reap(child);
    let t4 = usage();
    for (i, how) in ORIGIN_WRITERS.iter().enumerate() {
        write_via(how, half(1, i), n, page, &zero, &mem, &src)?;
    }
    let t5 = usage();
    let report = json!({
        "workload": "origins",
        "pid": std::process::id(),
        "child_pid": child,
        "page_size": page,
        "bytes": len,
        "pages": len / page,
        "origins": {
            "pages_per_origin": n,
            "writers": ORIGIN_WRITERS,
            "alive": phase(t2, t3),
            "after_exit": phase(t4, t5),
        },
        "phases": {"populate": phase(t0, t1), "fork": phase(t1, t2)},
        "minflt_total": t5.minflt,
        "majflt_total": t5.majflt,
    });
    emit(o, &report)
}

/// `--repeat-for`: rounds of `by` and one byte written per page, until
/// `until`. Returns the rounds and the workload's view of them.
fn repeat_write(
    by: RepeatBy,
    base: *mut u8,
    len: usize,
    page: usize,
    until: Instant,
) -> Result<(u64, Usage, Usage)> {
    let from = usage();
    let mut rounds = 0u64;
    while Instant::now() < until {
        match by {
            RepeatBy::Fork => {
                let child = fork_child(ChildLife::Exit(None))?;
                unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
            }
            // SAFETY: our own mapping; its pages read as zero afterwards.
            RepeatBy::Dontneed => {
                if unsafe { libc::madvise(base.cast(), len, libc::MADV_DONTNEED) } != 0 {
                    bail!("madvise(MADV_DONTNEED): {}", std::io::Error::last_os_error());
                }
            }
        }
        // SAFETY: the workload's own mapping of len bytes.
        unsafe { write_pages(base, len, page, 3 + (rounds % 2) as u8) };
        rounds += 1;
    }
    Ok((rounds, from, usage()))
}

/// `--threads N`: see the option.
fn run_threads(o: &WorkloadOpts, n: usize) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let half = o.size as usize / 2;
    if n == 0 || n > 64 {
        return Err(Refusal::new(format!("--threads {n}: give 1 to 64")).into());
    }
    if half == 0 || !half.is_multiple_of(page) {
        bail!("--threads needs --size a multiple of two pages");
    }
    let advice = thp_advice(o.thp);
    let (a, b) = map_two_guarded(half, advice)?;
    let pages = half / page;
    let t0 = usage();
    // SAFETY: the two mappings just made.
    unsafe {
        write_pages(a, half, page, 1);
        write_pages(b, half, page, 1);
    }
    let t1 = usage();
    let first = fork_child(ChildLife::Stay)?;
    let t2 = usage();
    // Thread t writes pages t, t+n, ...: its share ends its segments at a
    // half and three quarters of it, where it waits for the main thread's
    // phase change (`stage`), so that each segment's pages are known.
    let share_ends = |t: usize| {
        let k = (pages + n - 1 - t) / n;
        [k / 2, k * 3 / 4, k]
    };
    let arrived = AtomicUsize::new(0);
    let stage = AtomicUsize::new(0);
    let (a_at, b_at) = (a as usize, b as usize);
    let mut second = 0;
    std::thread::scope(|sc| -> Result<()> {
        for t in 0..n {
            let (arrived, stage) = (&arrived, &stage);
            sc.spawn(move || {
                let mut j = 0;
                for (seg, end) in share_ends(t).into_iter().enumerate() {
                    while stage.load(Ordering::Acquire) < seg {
                        std::thread::yield_now();
                    }
                    while j < end {
                        let i = t + j * n;
                        // SAFETY: page i of each mapping, this thread's alone.
                        unsafe {
                            ((a_at + i * page) as *mut u8).write_volatile(2);
                            ((b_at + i * page) as *mut u8).write_volatile(2);
                        }
                        j += 1;
                    }
                    arrived.fetch_add(1, Ordering::AcqRel);
                }
            });
        }
        let all_at = |seg: usize| {
            while arrived.load(Ordering::Acquire) < n * seg {
                std::thread::yield_now();
            }
        };
        all_at(1);
        reap(first);
        stage.store(1, Ordering::Release);
        all_at(2);
        second = fork_child(ChildLife::Exit(None))?;
        unsafe { libc::waitpid(second, std::ptr::null_mut(), 0) };
        stage.store(2, Ordering::Release);
        Ok(())
    })?;
    let t3 = usage();
    if let Some(p) = &o.regions_out {
        let ranges = format!("a={a_at:#x}-{:#x}\nb={b_at:#x}-{:#x}\n", a_at + half, b_at + half);
        faultscope::output::write(p, ranges.as_bytes())?;
    }
    let segments = segment_pages(n, share_ends);
    let report = json!({
        "workload": "threads",
        "pid": std::process::id(),
        "child_pids": [first, second],
        "threads": n,
        "page_size": page,
        "bytes": 2 * half,
        "pages": 2 * pages,
        "segments": segments,
        "regions": [
            {"role": "a", "start": a_at, "end": a_at + half, "pages": pages},
            {"role": "b", "start": b_at, "end": b_at + half, "pages": pages},
        ],
        "phases": {"populate": phase(t0, t1), "fork": phase(t1, t2), "write": phase(t2, t3)},
        "minflt_total": t3.minflt,
        "majflt_total": t3.majflt,
    });
    emit(o, &report)
}

/// The child of `--child`: forked, and waited for if it exits.
fn fork_as_asked(o: &WorkloadOpts) -> Result<libc::pid_t> {
    let child = fork_child(match o.child {
        Child::Alive => ChildLife::Stay,
        Child::Exit => {
            ChildLife::Exit(o.child_lifetime.map(|s| std::time::Duration::from_secs_f64(s.max(0.0))))
        }
    })?;
    if o.child == Child::Exit {
        let mut st = 0;
        unsafe { libc::waitpid(child, &mut st, 0) };
    }
    Ok(child)
}

/// Kills a child that stays and waits for it.
fn reap(child: libc::pid_t) {
    // SAFETY: our own child, not yet waited for.
    unsafe {
        libc::kill(child, libc::SIGKILL);
        libc::waitpid(child, std::ptr::null_mut(), 0);
    }
}

/// The report's JSON to `--out`, else to stdout.
fn emit(o: &WorkloadOpts, report: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    match &o.out {
        Some(p) => faultscope::output::write(p, text.as_bytes())?,
        None => println!("{text}"),
    }
    Ok(())
}

/// The madvise that `--thp` asks of a mapping.
fn thp_advice(thp: Thp) -> Option<libc::c_int> {
    match thp {
        Thp::Never => Some(libc::MADV_NOHUGEPAGE),
        Thp::Madvise => Some(libc::MADV_HUGEPAGE),
        Thp::System => None,
    }
}

/// `--threads`' two mappings of `half` bytes each: one mapping cut by
/// PROT_NONE guards into guard, `a`, guard, `b`, guard, so that `a` and `b`
/// stay two VMAs of their own whatever the kernel merges (the threads'
/// stacks are mapped next to them later), `b` as aligned as `a`.
fn map_two_guarded(half: usize, advice: Option<libc::c_int>) -> Result<(*mut u8, *mut u8)> {
    const GUARD: usize = 2 << 20;
    let base = map_aligned(2 * half + 3 * GUARD, advice)?;
    for at in [0, GUARD + half, 2 * (GUARD + half)] {
        // SAFETY: each guard is inside the mapping just made.
        if unsafe { libc::mprotect(base.add(at).cast(), GUARD, libc::PROT_NONE) } != 0 {
            bail!("mprotect of a guard: {}", std::io::Error::last_os_error());
        }
    }
    Ok(unsafe { (base.add(GUARD), base.add(2 * GUARD + half)) })
}

/// Pages written (both mappings) in each of `--threads`' segments: while
/// the first child lived, after its exit, after the second child's exit.
/// `ends(t)` is where thread `t`'s share ends each segment.
fn segment_pages(n: usize, ends: impl Fn(usize) -> [usize; 3]) -> [usize; 3] {
    let mut segments = [0usize; 3];
    for t in 0..n {
        let e = ends(t);
        for (k, s) in segments.iter_mut().enumerate() {
            *s += 2 * (e[k] - if k == 0 { 0 } else { e[k - 1] });
        }
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines() {
        let maps = "\
55d0c000-55d0e000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000400000 rw-p 00000000 00:00 0                  [anon:faultscope-named]
7f0000400000-7f0000600000 rw-p 00000000 00:19 12                 /tmp/a b.dat
7f0000600000-7f0000800000 rw-p 00000000 00:00 0 
";
        assert_eq!(mapping_of(maps, 0x55d0d000).unwrap(), (0x55d0c000, 0x55d0e000, "[heap]".into()));
        assert_eq!(mapping_of(maps, 0x7f0000400000).unwrap().2, "/tmp/a b.dat");
        assert_eq!(mapping_of(maps, 0x7f00003fffff).unwrap().2, "[anon:faultscope-named]");
        assert_eq!(mapping_of(maps, 0x7f0000600000).unwrap().2, "");
        assert!(mapping_of(maps, 0x7f0000800000).is_err());
    }

    /// The three regions, named and placed as the guest test expects; the
    /// writes after a fork are not needed for that.
    #[test]
    fn mappings_are_three_kinds_of_mapping() {
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = 16 * page;
        let base = map_aligned(len, Some(libc::MADV_NOHUGEPAGE)).unwrap();
        unsafe { write_pages(base, len, page, 1) };
        let m = Mappings::new(base, len, page).unwrap();
        m.write(page);
        let (rows, anon_name, ranges) = m.describe(page, Child::Exit).unwrap();
        let rows = rows.as_array().unwrap();
        let get = |role: &str, k: &str| rows.iter().find(|r| r["role"] == role).unwrap()[k].clone();
        // Named where the kernel can (CONFIG_ANON_VMA_NAME), else unnamed
        // and the refusal said.
        match m.anon_name {
            Ok(()) => assert_eq!(get("named", "mapping"), "[anon:faultscope-named]"),
            Err(ref why) => {
                assert_eq!(get("named", "mapping"), "");
                assert!(why.contains("CONFIG_ANON_VMA_NAME"), "{why}");
                assert_eq!(anon_name["refused"], why.as_str());
            }
        }
        assert_eq!(
            (get("named", "pages"), get("file", "pages"), get("heap", "pages")),
            (16.into(), 8.into(), 4.into())
        );
        assert_eq!(
            (get("named", "class"), get("file", "class"), get("heap", "class")),
            ("reuse".into(), "copy".into(), "reuse".into())
        );
        assert_eq!(get("heap", "mapping"), "[heap]");
        assert!(get("file", "mapping").as_str().unwrap().ends_with(".dat"));
        assert_eq!(ranges.lines().count(), 4, "{ranges}");
        assert!(
            ranges.contains(&format!("named={:#x}-{:#x}\n", base as u64, base as u64 + len as u64)),
            "{ranges}"
        );
        let file = m.file.clone();
        drop(m);
        assert!(!file.exists());
    }
}
