//! `faultscope bench MODE`: the fork/COW measurements of the "reuse the whole
//! exclusive large folio on a write fault" patch as one command (faults per
//! step and per folio size, fault latency, spurious faults, contpte
//! unfolds). The process traces itself: it attaches, sets up folios of the size asked for,
//! populates, forks (the child exits or stays), writes in the chosen pattern,
//! and marks each of these phases, so the tracer's counts per phase sit
//! beside the workload's own numbers (pages, folios, getrusage, wall time,
//! store latency) in one report.
//!
//! With `--runs N`, or lists of modes and folio sizes, it is a series: each
//! (mode, folio) cell is run N times, round by round, and the statistics
//! over each cell's runs are printed and written (`report::bench_series`).

use crate::term::safe;
use std::{
    path::PathBuf,
    sync::{Arc, Barrier, Condvar, Mutex},
    time::Instant,
};

use anyhow::{anyhow, bail, Result};
use clap::{Args, ValueEnum};

use super::{
    folio::{self, FolioCheck, Knobs},
    hotpatch::{self, Poke},
    record,
};
use crate::{
    attrib::mapping::{self, MappingName},
    collect::engine::{Filters, ProbeOpts, Recorder},
    error::Refusal,
    kernel::{self, classes::ReportClass},
    memory::{self, map_aligned, usage, Child, Usage},
    report::{
        bench_series::{self, Cell, Series},
        file, findings, provenance,
        schema::{self, BenchStep, ExecMapping, Mode as TraceMode, Report, StoreLatency},
    },
    units::{PAGE, PMD_SIZE},
};

/// The write pattern after fork.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Mode {
    /// One byte per page, ascending.
    Seq,
    /// One byte per page, in random order.
    Random,
    /// memset() of all of it.
    Memset,
    /// N threads (--threads), one byte per page in random order, each its
    /// own share of the pages.
    Threads,
    /// N threads each writing every page in its own random order: threads
    /// race on the same pages (spurious faults from races).
    ThreadsSame,
    /// One byte per folio.
    PerFolio,
    /// Read every page of a folio, then store to each (stale read-only TLB
    /// entries: spurious faults on real hardware).
    ReadThenStore,
    /// Two threads on two CPUs: the reader reads every page, the writer
    /// then stores to every page (COW reuse faults, which make the PTEs
    /// writable without flushing the reader's CPU), then the reader stores
    /// to every page: spurious faults wherever its CPU kept the read-only
    /// TLB entries (`--time-stores` times the reader's stores).
    ReaderWriter,
    /// No fork: a private executable mapping of a file in --file-dir,
    /// backed by file THPs (--folio 2M), read, then patched as a hot
    /// patcher does: mprotect() to writable, one store per folio (COW of a
    /// private file page).
    Hotpatch,
    /// The same, written as a debugger or uprobe does: one byte per folio
    /// through /proc/self/mem, the mapping left read-only and executable.
    HotpatchMem,
}

impl Mode {
    /// The mode's way of patching a file mapping, for the hotpatch modes.
    fn poke(self) -> Option<Poke> {
        match self {
            Mode::Hotpatch => Some(Poke::Mprotect),
            Mode::HotpatchMem => Some(Poke::ProcMem),
            _ => None,
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchOpts {
    /// The write pattern after the fork; a comma-separated list
    /// (seq,random) runs each (see --runs).
    #[arg(value_enum, value_delimiter = ',', default_value = "seq")]
    pub mode: Vec<Mode>,
    /// Anonymous memory, aligned to the folio size.
    #[arg(long, default_value = "256M", value_parser = crate::units::parse_size)]
    pub size: u64,
    /// Folio size: 4K, 16K, 32K, 64K, 128K ... 2M; a comma-separated list
    /// (4K,64K,2M) runs each (see --runs).
    #[arg(long, value_delimiter = ',', default_value = "4K")]
    pub folio: Vec<String>,
    /// Runs of each (mode, folio) cell, 1 to 1000, made round by round (one
    /// run of every cell per round) so that a drift of the machine spreads
    /// over all cells. With more than one run or cell, bench prints per
    /// cell and step the median, min-max and mean ± sample stddev of the
    /// times, minflt and counts, and --json writes a faultscope-bench/1
    /// series that keeps every run's report.
    #[arg(long, default_value_t = 1)]
    pub runs: u64,
    /// With --folio 2M: keep the THPs mapped by PMDs (default: PTE-mapped,
    /// the PMD split without splitting the folio).
    #[arg(long)]
    pub pmd: bool,
    /// What the forked child does: exit before the writes, or stay alive
    /// through them.
    #[arg(long, value_enum, default_value = "exit")]
    pub child: Child,
    /// Writer threads of the threaded modes.
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// Time every store by itself (a clock read between stores, as the
    /// whole-folio-reuse patch's cover letter measured).
    #[arg(long)]
    pub time_stores: bool,
    /// Seed of the random orders.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the report as JSON to this file (`-`: standard output), as
    /// `record --json`.
    #[arg(short = 'j', long)]
    pub json: Option<PathBuf>,
    /// As `record --max-stats`.
    #[arg(long)]
    pub max_stats: Option<u32>,
    /// The hotpatch modes' file is created (and its name removed at once)
    /// here: tmpfs mounted huge=always, or a file system with large folios.
    #[arg(long, default_value = "/tmp")]
    pub file_dir: PathBuf,
    /// Run the workload without the tracer (for overhead: compare wall
    /// times with and without, in one session).
    #[arg(long)]
    pub no_trace: bool,
    /// Stop (SIGSTOP) right before each write step, until continued: the
    /// overhead benchmark reads the kernel's per-program statistics there,
    /// so that they are of the write step alone.
    #[arg(long, hide = true)]
    pub stop_before_write: bool,
    #[command(flatten)]
    pub attrib: crate::collect::attribution::AttribOpts,
    #[command(flatten)]
    pub probe: ProbeOpts,
}

/// One workload step as the workload saw it.
struct Step {
    label: &'static str,
    from: Usage,
    to: Usage,
}

impl Step {
    fn schema(&self) -> BenchStep {
        BenchStep {
            name: self.label.into(),
            minflt: self.to.minflt - self.from.minflt,
            majflt: self.to.majflt - self.from.majflt,
            wall_ns: (self.to.at - self.from.at).as_nanos() as u64,
            cpu_ns: self.to.cpu_ns.saturating_sub(self.from.cpu_ns),
        }
    }
}

struct Memory {
    base: *mut u8,
    len: usize,
}

// The region is only shared with the writer threads, which write disjoint
// bytes or race on purpose (the race is what ThreadsSame measures).
unsafe impl Send for Memory {}
unsafe impl Sync for Memory {}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: the region this run mapped, no longer used by anyone (the
        // writers are joined; the fork's child has its own copy). The
        // alignment slack of `map_aligned` stays mapped, never touched.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// Why the bench's own process has no kernel check: its own reading of
/// the counts is left out of its report (the `report` phase), and each
/// step's getrusage stands beside its counts instead.
const BENCH_NOT_CHECKED: &str =
    "not made for the bench's own process: its reading of its counts faults, outside the report (each step has its getrusage count)";

/// The most runs of a cell `--runs` takes.
pub const MAX_RUNS: u64 = 1000;

/// The most writer threads of a threaded mode: far past the cores of any
/// machine the write step is timed on, and within what a process can
/// start (each thread has a stack, and the kernel's `threads-max`).
pub const MAX_THREADS: usize = 1024;

/// One (mode, folio) cell: what a single run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CellOpts {
    mode: Mode,
    folio: u64,
}

/// The THP/mTHP knobs of one folio size, held from the run that set them
/// until a run of another size (or the end): a series sets them once per
/// folio size when it has one size, and otherwise once each time the size
/// changes, which with runs interleaved round by round is once per run of
/// each size in every round (the knobs cannot ask for two sizes at once).
#[derive(Default)]
struct HeldKnobs(Option<(u64, Knobs)>);

impl HeldKnobs {
    /// The knobs set for `folio` (restoring another size's first).
    fn hold(&mut self, folio: u64) -> Result<()> {
        if self.0.as_ref().map(|(f, _)| *f) != Some(folio) {
            self.release();
            self.0 = Some((folio, Knobs::set_for(folio)?));
        }
        Ok(())
    }

    /// Restores the knobs as they were found.
    fn release(&mut self) {
        drop(self.0.take());
    }
}

/// Maps every page of this process's own executable (`/proc/self/exe`'s
/// read-only mappings: code and constants) with `MADV_POPULATE_READ` (5.14+;
/// elsewhere nothing happens). A process that traces itself switches a
/// phase and then writes the phase's tracefs marker: a first run of the
/// code between the two would fault on a page of its text after the switch
/// and before the marker, counted in the new phase by faultscope and in the
/// old one by a tracefs trace. Writable mappings are left alone: their pages
/// mapped for reading would take a copy fault at their first write instead
/// of the fault they take.
fn populate_own_image() {
    let (Ok(exe), Ok(maps)) =
        (std::fs::read_link("/proc/self/exe"), mapping::snapshot_pid(std::process::id()))
    else {
        return;
    };
    let own = |m: &mapping::Mapping| {
        !m.perms.write
            && matches!(&m.name, MappingName::File { path, deleted: false } if exe.as_os_str() == path.as_str())
    };
    for m in maps.iter().filter(|m| own(m)) {
        // SAFETY: a range of this process's own mappings; the advice only
        // faults its pages in.
        unsafe { libc::madvise(m.start as *mut libc::c_void, m.size() as usize, libc::MADV_POPULATE_READ) };
    }
}

/// A bench run: the tracer (unless --no-trace), the memory, and each
/// step's numbers (the sysfs knobs are held by the caller: `HeldKnobs`).
struct Run<'a> {
    o: &'a BenchOpts,
    c: CellOpts,
    rec: Option<Recorder>,
    mem: Arc<Memory>,
    pages: usize,
    steps: Vec<Step>,
    check: FolioCheck,
    child: libc::pid_t,
    stores: Option<Vec<u64>>,
    /// A hotpatch mode's mapping after populate, and its file system.
    exec_before: Option<ExecMapping>,
    file_system: Option<String>,
    /// A hotpatch mode's writes the kernel refused.
    refused: hotpatch::Refused,
    /// The start, for the provenance of a run without the tracer.
    anchor: kernel::ClockAnchor,
}

impl<'a> Run<'a> {
    /// Attaches (unless --no-trace), sets the knobs for the cell's folio
    /// size and maps the memory. `quiet`: without the lines saying what is
    /// measured here (a series says them at its first run).
    fn start(o: &'a BenchOpts, c: CellOpts, knobs: &mut HeldKnobs, quiet: bool) -> Result<Run<'a>> {
        let rec = if o.no_trace {
            kernel::require_root()?;
            None
        } else {
            let probe = ProbeOpts { quiet, ..o.probe.clone() };
            let mut r = Recorder::start(
                o.max_stats,
                record::DEFAULT_STATS,
                o.attrib.clone(),
                &probe,
                &Filters::default(),
            )?;
            r.self_traced = true;
            // Before it is traced: these faults are no step's.
            populate_own_image();
            r.add(std::process::id(), 0, "faultscope-bench".into())?;
            Some(r)
        };
        knobs.hold(c.folio)?;
        let len = o.size as usize;
        // 4K: no THP at all. 2M: MADV_HUGEPAGE lets the fault compact memory
        // for a THP (defrag=madvise). mTHP sizes need only their knob.
        let advice = match c.folio {
            PAGE => Some(libc::MADV_NOHUGEPAGE),
            PMD_SIZE => Some(libc::MADV_HUGEPAGE),
            _ => None,
        };
        let (base, file_system) = match c.mode.poke() {
            Some(_) => {
                let (b, fs) = hotpatch::map_exec_file(&o.file_dir, len)?;
                (b, Some(fs))
            }
            None => (map_aligned(len, advice)?, None),
        };
        let mem = Arc::new(Memory { base, len });
        Ok(Run {
            o,
            c,
            rec,
            mem,
            pages: len / PAGE as usize,
            steps: Vec::new(),
            check: FolioCheck::default(),
            child: 0,
            stores: None,
            exec_before: None,
            file_system,
            refused: hotpatch::Refused::default(),
            anchor: kernel::ClockAnchor::now(),
        })
    }

    /// A bench step starts: a mark (also written to tracefs' trace_marker).
    fn mark(&mut self, label: &str) -> Result<()> {
        match &mut self.rec {
            Some(r) => r.mark(label).map(drop),
            None => Ok(()),
        }
    }

    /// Touches every page, then checks that the memory is what was asked
    /// for: whole folios of the size, PTE- or PMD-mapped.
    fn populate(&mut self) -> Result<()> {
        self.mark("populate")?;
        let from = usage();
        // SAFETY: the region this run mapped (a file mapping: read only).
        unsafe {
            match self.c.mode.poke() {
                Some(_) => drop(memory::read_pages(self.mem.base, self.mem.len, PAGE as usize)),
                None => memory::write_pages(self.mem.base, self.mem.len, PAGE as usize, 1),
            }
        }
        self.steps.push(Step { label: "populate", from, to: usage() });
        if self.c.mode.poke().is_some() {
            self.exec_before = Some(hotpatch::exec_mapping(self.mem.base as usize)?);
        }
        if self.c.folio == PMD_SIZE && !self.o.pmd && self.c.mode.poke().is_none() {
            split_pmds(self.mem.base, self.mem.len)?;
        }
        self.check = folio::check(self.mem.base as usize, self.o.size, self.c.folio)?;
        verify(&self.check, self.o, self.c)
    }

    /// Forks; the child exits (and is waited for) or stays alive.
    fn fork(&mut self, plan: &Plan) -> Result<Vec<Vec<u64>>> {
        self.mark("fork")?;
        let from = usage();
        // An alive child dies with the bench, whatever kills it.
        let child = memory::fork_child(match self.o.child {
            Child::Alive => memory::ChildLife::Stay,
            Child::Exit => memory::ChildLife::Exit(None),
        })?;
        self.child = child;
        if self.o.child == Child::Exit {
            unsafe { libc::waitpid(child, std::ptr::null_mut(), 0) };
        }
        let lat = latency_buffers(plan, self.o.time_stores);
        self.steps.push(Step { label: "fork", from, to: usage() });
        Ok(lat)
    }

    fn write(&mut self, plan: Plan, lat: Vec<Vec<u64>>) -> Result<()> {
        if self.o.stop_before_write {
            // SAFETY: raise has no preconditions.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        self.mark("write")?;
        let from = usage();
        match plan {
            Plan::Poke(how, pages) => {
                let base = self.mem.base as usize;
                let addrs: Vec<usize> = pages.iter().map(|p| base + p * PAGE as usize).collect();
                self.refused = hotpatch::poke(how, self.mem.base, self.mem.len, &addrs)?;
            }
            plan => self.stores = write(plan, self.c.folio, &self.mem, lat)?,
        }
        self.steps.push(Step { label: "write", from, to: usage() });
        log::debug!("bench: steps done");
        self.mark("done")
    }

    /// Checks the mapping held, releases the knobs (unless `keep`: the next
    /// run is of the same folio size) and the child, and builds the report
    /// (the tracer's counts per step beside the workload's own numbers).
    fn finish(mut self, knobs: &mut HeldKnobs, keep: bool) -> Result<Report> {
        // The knobs (and khugepaged's pause) held until here: khugepaged must
        // not collapse the region into PMD-mapped THPs during the run. Check
        // that nothing did.
        let after = folio::check(self.mem.base as usize, self.o.size, self.c.folio)?;
        if !keep {
            knobs.release();
        }
        let after_write = (self.o.child == Child::Alive).then(|| after.clone());
        // A write-protect fault on a THP the live child shares splits its
        // PMD (the kernel's COW of a PMD-mapped THP): fewer PMD-mapped bytes
        // is then the write step's outcome, not a change of scenario.
        let split_by_cow = (self.o.child == Child::Alive || self.c.mode.poke().is_some())
            && after.pmd_mapped_bytes < self.check.pmd_mapped_bytes;
        if after.pmd_mapped_bytes != self.check.pmd_mapped_bytes && !split_by_cow {
            bail!(
                "the memory's mapping changed during the run ({} -> {} bytes PMD-mapped): the counts are not of the scenario asked for; run again",
                self.check.pmd_mapped_bytes,
                after.pmd_mapped_bytes
            );
        }
        if self.child > 0 && self.o.child == Child::Alive {
            unsafe {
                libc::kill(self.child, libc::SIGKILL);
                libc::waitpid(self.child, std::ptr::null_mut(), 0);
            }
        }
        // Reading the counters is itself done by this (traced) process, and a
        // map is not read atomically: the faults of reading would land in the
        // phase being read. So reading gets a phase of its own, left out,
        // and this process leaves the traced set first: its reading's faults
        // would take pending slots over, and each flush tears the read.
        self.mark("report")?;
        let mut report = match self.rec.as_mut() {
            Some(r) => {
                r.leave(std::process::id(), BENCH_NOT_CHECKED);
                let reading = r.timeline.current().id;
                let snap = r.exact_snapshot()?.without_phase(std::process::id(), reading);
                log::debug!("bench: counts read");
                r.timeline.drop_current();
                r.finish(&snap)?
            }
            None => Report {
                schema: schema::SCHEMA.into(),
                kernel: kernel::release(),
                arch: std::env::consts::ARCH.into(),
                mode: TraceMode::Off,
                ..Report::default()
            },
        };
        let (o, c) = (self.o, self.c);
        report.bench = Some(schema::Bench {
            mode: format!("{:?}", c.mode).to_lowercase(),
            size: o.size,
            folio: crate::units::size(c.folio),
            mapping: if c.folio == PMD_SIZE && (o.pmd || c.mode.poke().is_some()) { "pmd" } else { "pte" }
                .into(),
            // A hot patch forks no child.
            child: if c.mode.poke().is_some() {
                "none".into()
            } else {
                format!("{:?}", o.child).to_lowercase()
            },
            threads: if matches!(c.mode, Mode::Threads | Mode::ThreadsSame) { o.threads as u64 } else { 1 },
            pages: self.pages as u64,
            folios: o.size / c.folio,
            folio_check: self.check.clone(),
            after_write,
            pid: std::process::id(),
            child_pid: self.child,
            steps: self.steps.iter().map(Step::schema).collect(),
            store_latency: self.stores.take().map(store_latency),
            hotpatch: match (c.mode.poke(), self.exec_before) {
                (Some(how), Some(before)) => Some(schema::Hotpatch {
                    poke: how.name().into(),
                    writes: o.size / c.folio,
                    refused: self.refused.writes,
                    refused_error: self.refused.first.take(),
                    file_system: self.file_system.clone().unwrap_or_default(),
                    before,
                    after: hotpatch::exec_mapping(self.mem.base as usize)?,
                }),
                _ => None,
            },
        });
        let anchor = self.rec.as_ref().map_or(self.anchor, |r| r.anchor);
        report.provenance = Some(provenance::here(format!("bench {:?}", c.mode).to_lowercase(), anchor));
        Ok(report)
    }
}

fn store_latency(mut v: Vec<u64>) -> StoreLatency {
    v.sort_unstable();
    let q = |f: f64| v[((v.len() - 1) as f64 * f).round() as usize];
    StoreLatency {
        n: v.len() as u64,
        p50_ns: q(0.5),
        p99_ns: q(0.99),
        max_ns: v[v.len() - 1],
        mean_ns: v.iter().sum::<u64>() / v.len() as u64,
    }
}

/// The cells of the command line, folio size by folio size (so that runs
/// of one size follow each other within a round), or why not.
fn cells(o: &BenchOpts) -> Result<Vec<CellOpts>, Refusal> {
    if o.runs == 0 || o.runs > MAX_RUNS {
        return Err(Refusal::new(format!("--runs {}: give 1 to {MAX_RUNS} runs of each cell", o.runs)));
    }
    let mut folios: Vec<u64> = Vec::new();
    for f in &o.folio {
        let v = folio::parse_folio(f).map_err(Refusal::new)?;
        if folios.contains(&v) {
            return Err(Refusal::new(format!("--folio {}: {} is listed twice", o.folio.join(","), f.trim())));
        }
        folios.push(v);
    }
    let name =
        |m: &Mode| m.to_possible_value().map_or_else(|| format!("{m:?}"), |v| v.get_name().to_string());
    for (i, m) in o.mode.iter().enumerate() {
        if o.mode[..i].contains(m) {
            let all: Vec<String> = o.mode.iter().map(name).collect();
            return Err(Refusal::new(format!("bench {}: {} is listed twice", all.join(","), name(m))));
        }
    }
    Ok(folios.iter().flat_map(|&folio| o.mode.iter().map(move |&mode| CellOpts { mode, folio })).collect())
}

pub fn run(o: &BenchOpts) -> Result<i32> {
    let cells = cells(o)?;
    let series = cells.len() > 1 || o.runs > 1;
    if cells.iter().any(|c| c.mode.poke().is_some() && c.folio != PMD_SIZE) {
        return Err(Refusal::new("the hotpatch modes map a file's THPs: give --folio 2M").into());
    }
    if o.pmd && cells.iter().any(|c| c.folio != PMD_SIZE) {
        return Err(Refusal::new("--pmd goes with --folio 2M").into());
    }
    if let Some(c) = cells.iter().find(|c| !o.size.is_multiple_of(c.folio)) {
        return Err(Refusal::new(format!(
            "--size must be a multiple of the folio size {}",
            crate::units::size(c.folio)
        ))
        .into());
    }
    let threaded = o.mode.iter().any(|m| matches!(m, Mode::Threads | Mode::ThreadsSame));
    let most = MAX_THREADS.min((o.size / crate::units::PAGE) as usize);
    if threaded && !(1..=most).contains(&o.threads) {
        return Err(Refusal::new(format!(
            "--threads {}: give 1 to {most} writer threads (at most {MAX_THREADS}, and no more than --size has pages)",
            o.threads
        ))
        .into());
    }
    if o.mode.contains(&Mode::ReaderWriter) {
        let cpus = affinity::allowed()?;
        if cpus.len() < 2 {
            return Err(Refusal::new(format!(
                "reader-writer needs two CPUs for its two threads, and this process may run on {} ({cpus:?}: see taskset)",
                cpus.len()
            ))
            .into());
        }
    }
    if series && (o.attrib.folded.is_some() || o.attrib.flamegraph.is_some()) {
        return Err(Refusal::new(
            "--folded/--flamegraph take one run; a series keeps each run's stacks in its --json reports",
        )
        .into());
    }
    if let Some(p) = &o.json {
        crate::output::check(p)?;
    }
    o.attrib.check_writable()?;
    // A folio size the kernel cannot give is refused before the probes
    // attach (one line, exit 2).
    for c in &cells {
        folio::require(c.folio)?;
    }
    // Declared first, so dropped last: Ctrl-C or SIGTERM waits until the
    // sysfs knobs are restored and the probes detached, then takes effect.
    let signals = crate::signals::HeldSignals::new();
    let mut knobs = HeldKnobs::default();
    if series {
        return run_series(o, &cells, &signals, &mut knobs);
    }
    let mut report = one(o, cells[0], &mut knobs, false, false)?;
    log::debug!("bench: report built");
    let found = findings::attach(&mut report);
    // A closed stdout (`| head`) costs the tables, not the report.
    let _ = crate::term::out(&format!("{}{found}", summary(&report)));
    if let Some(p) = &o.json {
        file::write(p, &report)?;
        log::debug!("bench: JSON written");
    }
    // After the report: a failure here must not cost it.
    super::record::write_stacks(&o.attrib, &report)?;
    Ok(0)
}

/// One run of a cell, to its report (without findings). `keep`: the knobs
/// stay set for the next run; `quiet`: see [`Run::start`].
fn one(o: &BenchOpts, c: CellOpts, knobs: &mut HeldKnobs, keep: bool, quiet: bool) -> Result<Report> {
    let mut run = Run::start(o, c, knobs, quiet)?;
    log::debug!("bench: started");
    run.populate()?;
    let plan = plan(o, c, run.pages);
    // A hot patch needs no fork: a private file page is copied on write.
    let lat = if c.mode.poke().is_some() { Vec::new() } else { run.fork(&plan)? };
    run.write(plan, lat)?;
    run.finish(knobs, keep)
}

/// `--runs N` or several cells: every cell's runs round by round, then the
/// statistics per cell. Ctrl-C or SIGTERM ends the series after the run
/// under way (the knobs restored, the probes detached), with nothing
/// written.
fn run_series(
    o: &BenchOpts,
    cells: &[CellOpts],
    signals: &crate::signals::HeldSignals,
    knobs: &mut HeldKnobs,
) -> Result<i32> {
    let anchor = kernel::ClockAnchor::now();
    let order: Vec<usize> = (0..o.runs).flat_map(|_| 0..cells.len()).collect();
    let mut runs: Vec<Vec<Report>> = cells.iter().map(|_| Vec::new()).collect();
    for (i, &ci) in order.iter().enumerate() {
        if signals.pending() {
            knobs.release();
            bail!("interrupted after {i} of {} runs: nothing written", order.len());
        }
        let keep = order.get(i + 1).is_some_and(|&next| cells[next].folio == cells[ci].folio);
        let mut report = one(o, cells[ci], knobs, keep, i > 0)?;
        findings::attach(&mut report);
        runs[ci].push(report);
    }
    let series = Series {
        schema: bench_series::SCHEMA.into(),
        kernel: kernel::release(),
        arch: std::env::consts::ARCH.into(),
        runs: o.runs,
        cells: runs.into_iter().map(Cell::of_runs).collect(),
        provenance: Some(provenance::here(
            format!("bench series: {} runs of each of {} cells", o.runs, cells.len()),
            anchor,
        )),
    };
    let _ = crate::term::out(&bench_series::text(&series));
    if let Some(p) = &o.json {
        bench_series::write(p, &series)?;
    }
    Ok(0)
}

/// Maps each 2M THP by PTEs without splitting the folio: mprotect() of one
/// page splits the PMD, and the second call restores the protection.
///
/// MADV_NOHUGEPAGE first: khugepaged would otherwise collapse a PTE-mapped
/// THP back into a new PMD-mapped one (writing its sleep knob wakes it
/// for one pass, also under TCG). Once madvise returns, a collapse
/// cannot start, and one already under way fails its VMA recheck; the
/// folios stay as they are, and neither fork nor the COW paths look at the
/// flag.
fn split_pmds(base: *mut u8, len: usize) -> Result<()> {
    // SAFETY: advising our own mapping.
    if unsafe { libc::madvise(base.cast(), len, libc::MADV_NOHUGEPAGE) } != 0 {
        bail!("madvise(MADV_NOHUGEPAGE): {}", std::io::Error::last_os_error());
    }
    let mut off = 0;
    while off < len {
        for prot in [libc::PROT_READ, libc::PROT_READ | libc::PROT_WRITE] {
            // SAFETY: our own mapping.
            if unsafe { libc::mprotect(base.add(off).cast(), PAGE as usize, prot) } != 0 {
                bail!("mprotect: {}", std::io::Error::last_os_error());
            }
        }
        off += PMD_SIZE as usize;
    }
    Ok(())
}

fn verify(c: &FolioCheck, o: &BenchOpts, cell: CellOpts) -> Result<()> {
    let folio = cell.folio;
    let what = crate::units::size(folio);
    // A file's THPs come from its file system, not the anon knobs.
    let remedy = match cell.mode.poke() {
        Some(_) => format!(
            "the file in --file-dir {} is not in PMD-mapped THPs: use tmpfs mounted huge=always, or a file system with large folios",
            safe(&o.file_dir.display().to_string())
        ),
        None => "free memory or lower --size".to_string(),
    };
    if c.whole_folios != c.blocks {
        return Err(Refusal::new(format!(
            "only {} of {} {what} blocks are backed by one {what} folio (mTHP/THP allocation fell back); {remedy}",
            c.whole_folios, c.blocks
        ))
        .into());
    }
    let want_pmd = if folio == PMD_SIZE && (o.pmd || cell.mode.poke().is_some()) { o.size } else { 0 };
    if c.pmd_mapped_bytes != want_pmd {
        return Err(Refusal::new(format!(
            "{} bytes are mapped by PMDs, expected {want_pmd} ({}){}",
            c.pmd_mapped_bytes,
            if want_pmd == 0 { "PTE-mapped" } else { "PMD-mapped" },
            if cell.mode.poke().is_some() { format!("; {remedy}") } else { String::new() }
        ))
        .into());
    }
    Ok(())
}

/// What the write phase will do, built before fork so that building it
/// (allocations, page lists) adds no fault to the phases it measures.
enum Plan {
    Memset,
    /// Pages per writer (one writer unless a threads mode), and whether to
    /// read each folio's pages before storing.
    Stores {
        writers: Vec<Vec<usize>>,
        read_first: bool,
    },
    /// The pages of `ReaderWriter`.
    ReaderWriter(Vec<usize>),
    /// A hot patch: one byte written into each of the pages.
    Poke(Poke, Vec<usize>),
}

fn plan(o: &BenchOpts, c: CellOpts, pages: usize) -> Plan {
    let order = |seed: u64| {
        let mut v: Vec<usize> = (0..pages).collect();
        fastrand::Rng::with_seed(seed).shuffle(&mut v);
        v
    };
    let n = o.threads.max(1);
    // One page a folio: its first.
    let per_folio = || (0..pages).step_by((c.folio / PAGE) as usize).collect::<Vec<usize>>();
    let writers = match c.mode {
        Mode::Memset => return Plan::Memset,
        Mode::Seq | Mode::ReadThenStore => vec![(0..pages).collect()],
        Mode::Random => vec![order(o.seed)],
        Mode::PerFolio => vec![per_folio()],
        Mode::Threads => {
            let all = order(o.seed);
            (0..n).map(|i| all.iter().copied().skip(i).step_by(n).collect()).collect()
        }
        Mode::ThreadsSame => (0..n).map(|i| order(o.seed + i as u64)).collect(),
        Mode::ReaderWriter => return Plan::ReaderWriter((0..pages).collect()),
        Mode::Hotpatch => return Plan::Poke(Poke::Mprotect, per_folio()),
        Mode::HotpatchMem => return Plan::Poke(Poke::ProcMem, per_folio()),
    };
    Plan::Stores { writers, read_first: c.mode == Mode::ReadThenStore }
}

/// Buffers for store latencies, one per writer. Allocated and touched after
/// fork, before the write phase: memory that existed at fork would take a
/// COW fault of its own when written, and fresh memory a first-touch fault.
fn latency_buffers(plan: &Plan, time: bool) -> Vec<Vec<u64>> {
    match plan {
        Plan::Stores { writers, .. } if time => writers.iter().map(|w| vec![1u64; w.len()]).collect(),
        Plan::ReaderWriter(pages) if time => vec![vec![1u64; pages.len()]],
        _ => Vec::new(),
    }
}

/// Runs the plan; fills `lat` (when timed) with each store's latency.
fn write(plan: Plan, folio: u64, mem: &Arc<Memory>, mut lat: Vec<Vec<u64>>) -> Result<Option<Vec<u64>>> {
    let (writers, read_first) = match plan {
        Plan::Memset => {
            // SAFETY: the whole region is ours.
            unsafe { std::ptr::write_bytes(mem.base, 3, mem.len) };
            return Ok(None);
        }
        Plan::Stores { writers, read_first } => (writers, read_first),
        Plan::ReaderWriter(pages) => return reader_writer(mem, pages, lat.pop()),
        Plan::Poke(..) => bail!("a hot patch is written by its run (Run::write)"),
    };
    let per_folio = (folio / PAGE) as usize;
    let timed = !lat.is_empty();
    if writers.len() == 1 {
        let list = &writers[0];
        let mut out = lat.pop();
        if !read_first {
            store_pages(mem, list, out.as_deref_mut());
            return Ok(out);
        }
        // Folio by folio: read its pages, then store to them.
        for (i, chunk) in list.chunks(per_folio).enumerate() {
            let mut sum = 0u8;
            for &p in chunk {
                // SAFETY: inside the region.
                sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(mem.base.add(p * PAGE as usize)) });
            }
            std::hint::black_box(sum);
            let slot = out.as_deref_mut().map(|o| &mut o[i * per_folio..i * per_folio + chunk.len()]);
            store_pages(mem, chunk, slot);
        }
        return Ok(out);
    }
    // Every writer is started before any writes: the gate opens once all
    // exist (or closes, and they return, when one could not be started);
    // the barrier then lines them up.
    let n = writers.len();
    let gate = Arc::new((Mutex::new(None::<bool>), Condvar::new()));
    let barrier = Arc::new(Barrier::new(n));
    let mut bufs: Vec<Option<Vec<u64>>> = (0..n).map(|i| lat.get_mut(i).map(std::mem::take)).collect();
    let mut handles = Vec::with_capacity(n);
    let mut failed = None;
    for (i, (mine, mut buf)) in writers.into_iter().zip(bufs.iter_mut().map(Option::take)).enumerate() {
        let (mem, gate, barrier) = (Arc::clone(mem), Arc::clone(&gate), Arc::clone(&barrier));
        let spawned = std::thread::Builder::new().name(format!("writer{i}")).spawn(move || {
            let (open, cv) = &*gate;
            let go = *cv.wait_while(open.lock().unwrap(), |g| g.is_none()).unwrap();
            if go == Some(true) {
                barrier.wait();
                store_pages(&mem, &mine, buf.as_deref_mut());
            }
            buf
        });
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                failed = Some(anyhow!("could not start writer thread {} of {n}: {e}", i + 1));
                break;
            }
        }
    }
    {
        let (open, cv) = &*gate;
        *open.lock().unwrap() = Some(failed.is_none());
        cv.notify_all();
    }
    let mut all = Vec::new();
    for h in handles {
        match h.join() {
            Ok(buf) => all.extend(buf.unwrap_or_default()),
            Err(_) => failed = failed.or(Some(anyhow!("a writer thread panicked"))),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(timed.then_some(all)),
    }
}

/// `Mode::ReaderWriter`: this thread is the reader, on one CPU of the
/// process's affinity, the writer a thread on another; the reader's
/// affinity is restored after.
fn reader_writer(
    mem: &Arc<Memory>,
    pages: Vec<usize>,
    mut lat: Option<Vec<u64>>,
) -> Result<Option<Vec<u64>>> {
    let allowed = affinity::allowed()?;
    let [reader_cpu, writer_cpu, ..] = allowed[..] else {
        bail!("reader-writer needs two CPUs, and this process may now run on {allowed:?}");
    };
    let _restore = affinity::pin(reader_cpu)?;
    let mut sum = 0u8;
    for &p in &pages {
        // SAFETY: inside the region.
        sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(mem.base.add(p * PAGE as usize)) });
    }
    std::hint::black_box(sum);
    // The reader spins while the writer works: sleeping in join() could
    // let its CPU switch to another process, whose page tables' switch
    // flushes the entries the reads cached (without PCID).
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (mem, pages, done) = (Arc::clone(mem), pages.clone(), Arc::clone(&done));
        std::thread::Builder::new().name("writer".into()).spawn(move || -> Result<()> {
            let pinned = affinity::pin(writer_cpu).inspect(|_| store_pages(&mem, &pages, None));
            done.store(true, std::sync::atomic::Ordering::Release);
            pinned.map(drop)
        })?
    };
    while !done.load(std::sync::atomic::Ordering::Acquire) {
        std::hint::spin_loop();
    }
    writer.join().map_err(|_| anyhow!("the writer thread panicked"))??;
    store_pages(mem, &pages, lat.as_deref_mut());
    Ok(lat)
}

/// The calling thread's CPU affinity (`sched_getaffinity`/`sched_setaffinity`
/// with pid 0: this thread only).
mod affinity {
    use anyhow::{bail, Result};

    /// The CPUs this thread may run on.
    pub fn allowed() -> Result<Vec<usize>> {
        let set = get()?;
        Ok((0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect())
    }

    fn get() -> Result<libc::cpu_set_t> {
        // SAFETY: a zeroed cpu_set_t is an empty set; the call fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) } != 0 {
            bail!("sched_getaffinity: {}", std::io::Error::last_os_error());
        }
        Ok(set)
    }

    fn set(set: &libc::cpu_set_t) -> Result<()> {
        if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(set), set) } != 0 {
            bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Restores the affinity it was made from when dropped.
    pub struct Pinned(libc::cpu_set_t);

    impl Drop for Pinned {
        fn drop(&mut self) {
            let _ = set(&self.0);
        }
    }

    /// Pins this thread to `cpu` until the result is dropped.
    pub fn pin(cpu: usize) -> Result<Pinned> {
        let old = get()?;
        // SAFETY: as in `get`; `cpu` < CPU_SETSIZE (from `allowed`).
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe { libc::CPU_SET(cpu, &mut one) };
        set(&one)?;
        Ok(Pinned(old))
    }
}

/// One volatile byte store per listed page; with `lat`, the latency of each
/// store (the clock read between stores).
fn store_pages(mem: &Memory, pages: &[usize], lat: Option<&mut [u64]>) {
    match lat {
        None => {
            for &p in pages {
                // SAFETY: inside the region.
                unsafe { std::ptr::write_volatile(mem.base.add(p * PAGE as usize), 2) };
            }
        }
        Some(lat) => {
            for (slot, &p) in lat.iter_mut().zip(pages) {
                let t = Instant::now();
                unsafe { std::ptr::write_volatile(mem.base.add(p * PAGE as usize), 2) };
                *slot = t.elapsed().as_nanos() as u64;
            }
        }
    }
}

/// The table of the patch's cover letter: per bench step, the workload's
/// numbers beside the tracer's counts.
fn summary(r: &Report) -> String {
    use std::fmt::Write as _;
    let Some(b) = &r.bench else { return String::new() };
    let traced = r.mode != TraceMode::Off;
    let proc_ = r.bench_process();
    // A class's count over a bench step: None when not measurable here.
    let step_count = |step: &str, m: ReportClass| -> Option<u64> {
        proc_?.span(&format!("mark:{step}")).and_then(|s| s.count(m))
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "faultscope bench {}: {} MiB, {} folios ({}-mapped), child {}, kernel {}{}",
        b.mode,
        b.size >> 20,
        b.folio,
        b.mapping,
        b.child,
        safe(&r.kernel),
        if traced { "" } else { " (tracer off)" }
    );
    let _ = write!(out, "{:<10} {:>9} {:>8}", "phase", "wall(ms)", "minflt");
    for m in ReportClass::summary() {
        let _ = write!(out, " {:>12}", m.name());
    }
    out.push('\n');
    for step in &b.steps {
        let ms = step.wall_ns as f64 / 1e6;
        let _ = write!(out, "{:<10} {ms:>9.2} {:>8}", step.name, step.minflt);
        for m in ReportClass::summary() {
            let cell = match (traced, step_count(&step.name, m)) {
                (false, _) => "off".to_string(),
                (_, Some(n)) => n.to_string(),
                (_, None) => "n/m".to_string(),
            };
            let _ = write!(out, " {cell:>12}");
        }
        out.push('\n');
    }
    // The latency of the write step's first phase (its mark).
    let write_lat = proc_.and_then(|p| p.phases.iter().find(|ph| ph.name == "mark:write")).and_then(|ph| {
        match ph.classes.get(&ReportClass::Faults) {
            Some(schema::ClassValue::Measured(m)) => m.latency.clone(),
            _ => None,
        }
    });
    if let Some(l) = write_lat {
        let _ = writeln!(
            out,
            "write-phase fault latency: p50 {} p99 {} max {}",
            crate::units::ns(l.p50_ns),
            crate::units::ns(l.p99_ns),
            crate::units::ns(l.max_ns)
        );
    }
    // Per folio and per 64K block: the cover letter's "16 faults per 64K folio".
    let folios = b.folios.max(1);
    let blocks64k = (b.size >> 16).max(1);
    let per: Vec<String> = [
        (ReportClass::WriteFaults, folios, "per folio"),
        (ReportClass::Reuse, folios, "per folio"),
        (ReportClass::Copy, folios, "per folio"),
        (ReportClass::ContpteUnfold, blocks64k, "per 64K block"),
    ]
    .iter()
    .filter_map(|(m, denom, what)| {
        step_count("write", *m).map(|n| format!("{m} {:.2} {what}", n as f64 / *denom as f64))
    })
    .collect();
    if !per.is_empty() {
        let _ = writeln!(out, "write phase: {}", per.join(", "));
    }
    if let Some(s) = &b.store_latency {
        let _ = writeln!(
            out,
            "store latency (ns): p50 {} p99 {} max {} (n={})",
            s.p50_ns, s.p99_ns, s.max_ns, s.n
        );
    }
    if let Some(h) = &b.hotpatch {
        let kb = |v: u64| v >> 10;
        let _ = writeln!(
            out,
            "exec mapping of a {} file (smaps), {} bytes written by {}: Rss {} -> {} kB, anonymous {} kB ({} kB in THPs), file PMD-mapped {} -> {} kB",
            safe(&h.file_system),
            h.writes,
            h.poke,
            kb(h.before.rss),
            kb(h.after.rss),
            kb(h.after.anonymous),
            kb(h.after.anon_huge),
            kb(h.before.file_pmd_mapped),
            kb(h.after.file_pmd_mapped)
        );
        if let Some(e) = &h.refused_error {
            let _ = writeln!(out, "the kernel refused {} of the writes: {}", h.refused, safe(e));
        }
    }
    out
}
