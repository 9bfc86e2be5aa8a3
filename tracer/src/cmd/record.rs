//! `faultscope record`: resolve probes, attach, trace the targets until
//! Ctrl-C, SIGTERM, SIGHUP, --duration, the exit of every target or a
//! closed stdout, then report and detach. A [`Recording`] is that run
//! (start, tick, mark, finish); the [`Recorder`] inside it is the traced
//! session with its phase timeline, which `bench` also uses to trace itself.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Result;
use clap::Args;
use faultscope_common::{
    maps::{
        Config, LifeEvent, LifeKind, TargetInfo, ADOPT_AT_EXEC, TARGET_FOLLOW_CHILDREN, TARGET_PENDING_EXEC,
    },
    Program,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt as _, BufReader},
    net::UnixStream,
    signal::unix::{signal, Signal, SignalKind},
    task::JoinSet,
};

use super::mark as marks;
use crate::{
    collect::{
        accounting::{self, Bracket, End, KernelCount, Start},
        attribution::{attributable_here, mappings_availability, AttribOpts, Attribution},
        children,
        collector::{stack_frames, Snapshot},
        phases::{Lifetime, ProcessKinds, Timeline},
        target,
    },
    error::Refusal,
    kernel::{
        self,
        btf::KernelBtf,
        classes::{self, Availability, Metric},
        footprint::{self, Sizes},
        probes::{self, BackendChoice},
        session::Session,
    },
    report::{attribution::Namer, build, file, findings, live, schema::Report, text},
};

#[derive(Args, Debug)]
pub struct RecordOpts {
    /// Trace this process (repeatable).
    #[arg(short = 'p', long = "pid")]
    pub pids: Vec<u32>,
    /// Stop after this many seconds.
    #[arg(long, allow_hyphen_values = true)]
    pub duration: Option<f64>,
    /// Print a table of what happened in each interval of this many seconds.
    #[arg(long, allow_hyphen_values = true)]
    pub interval: Option<f64>,
    /// Stop after this many intervals.
    #[arg(long, requires = "interval")]
    pub count: Option<u64>,
    /// Write the final report as JSON (schema faultscope/1) to this file;
    /// `-` is standard output (the tables then go to standard error). A
    /// FIFO or a character device is written in place, a regular file
    /// replaced whole; anything else is refused before the run.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// On --duration, Ctrl-C, SIGTERM or SIGHUP, leave the command running
    /// (by default it gets the same signal, SIGTERM for --duration, and
    /// faultscope waits up to 5 s for it to exit).
    #[arg(long)]
    pub keep_command: bool,
    /// Trace the children that traced processes fork (added in the kernel at
    /// fork time, so none of their faults is missed).
    #[arg(long)]
    pub follow_children: bool,
    /// Start a new phase each time faultscope receives this signal (USR1,
    /// USR2 or HUP).
    #[arg(long, value_parser = marks::parse_signal)]
    pub mark_on_signal: Option<i32>,
    /// Entries of the in-kernel stats map (process x phase x set of
    /// classes), a per-CPU map: by default the most that fit in 128 MiB on
    /// this machine's CPUs, at most 2048; refused past 1 GiB.
    #[arg(long)]
    pub max_stats: Option<u32>,
    #[command(flatten)]
    pub attrib: AttribOpts,
    #[command(flatten)]
    pub probe: ProbeOpts,
    /// Command to start and trace from its exec.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// How the probes attach, and whether their cost is measured.
#[derive(Args, Debug, Clone, Default)]
pub struct ProbeOpts {
    /// How probes on kernel functions attach: auto takes fentry/fexit (a
    /// BPF trampoline) where the kernel's BTF describes the function, else
    /// a kprobe, per probe; kprobe or fentry take only that way (fentry
    /// refuses to start where a probe cannot have it).
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Measure each attached program with the kernel's own accounting
    /// (bpf_stats: run count and run time, on only for this run) and report
    /// it (`programs[]`). The accounting itself adds two clock reads per
    /// program run.
    #[arg(long)]
    pub prog_stats: bool,
}

/// A tracing session with its phase timeline and the processes it knows.
pub struct Recorder {
    pub session: Session,
    pub avail: Vec<(Metric, Availability)>,
    pub timeline: Timeline,
    pub comms: BTreeMap<u32, String>,
    /// Traced processes still running.
    pub live: BTreeSet<u32>,
    /// When each traced process existed: it carries only those phases.
    pub lifetimes: BTreeMap<u32, Lifetime>,
    started: Instant,
    /// tracefs `trace_marker`: each mark is also written to the ftrace
    /// buffer, so traces taken beside faultscope can be split by phase.
    marker: Option<fs::File>,
    /// What is attributed, and the maps histories that name where.
    pub attrib: Attribution,
    /// A process tracing itself (bench) takes maps snapshots only at attach
    /// and at the end: reading its own maps faults, and would add to the
    /// step it measures.
    pub self_traced: bool,
    /// The comm of each fork seen since the caller last took them (serve's
    /// `faultscope_forks_total`); record leaves it empty.
    pub fork_comms: Option<Vec<String>>,
    /// Each process's own phase kinds (serve's `phase_kind`); record has
    /// none: its phases are the run's.
    pub kinds: Option<ProcessKinds>,
    /// Processes the kernel's filters added (pid, the cgroup's index or
    /// `ADOPT_BY_COMM`), taken by `serve`.
    pub adopted: Vec<(u32, u32)>,
    /// The kernel's own count of each traced process's faults, bracketed
    /// (the kernel check of the report).
    pub accounting: BTreeMap<u32, KernelCount>,
    /// The maps' sizes (their kernel memory goes in the report).
    sizes: Sizes,
}

/// Entries of the stack map when stacks are asked for.
const STACK_ENTRIES: u32 = 16384;

/// Which processes the kernel adds to the traced set by itself (serve).
#[derive(Debug, Default)]
pub struct Filters {
    /// cgroup v2 ids: a process of one joins at its first event.
    pub cgroups: Vec<u64>,
    /// comms (NUL-padded): a program exec'd under one joins at its exec.
    pub comms: Vec<[u8; 16]>,
    /// An exec in a traced process starts a phase.
    pub exec_phase: bool,
}

/// record's and bench's most stats entries by default.
pub const DEFAULT_STATS: u32 = 2048;

impl Recorder {
    /// Checks the system, resolves the probe table and attaches. Prints the
    /// one line saying what is measured here.
    /// `filters`: the kernel's adoption of new processes (none for off).
    /// `max_stats`: `--max-stats`, else the default for the machine, at
    /// most `default_stats` (see `kernel::footprint`).
    pub fn start(
        max_stats: Option<u32>,
        default_stats: u32,
        attrib: AttribOpts,
        probe: &ProbeOpts,
        filters: &Filters,
    ) -> Result<Recorder> {
        let max_stats = footprint::stats_entries(max_stats, default_stats, footprint::cpus())?;
        kernel::require_root()?;
        let tracefs = kernel::tracefs()?;
        kernel::require_btf()?;
        // Read and parsed once for the whole start-up.
        let btf = KernelBtf::load();
        let resolved = probes::resolve_here(&tracefs, &btf, probe.backend);
        let stacks = if attrib.stacks.0.is_empty() { 0 } else { STACK_ENTRIES };
        let sizes = Sizes {
            stats: max_stats,
            stacks,
            cgroups: filters.cgroups.len() as u32,
            comms: filters.comms.len() as u32,
            exec_phase: filters.exec_phase,
        };
        let mut session = Session::attach(&tracefs, &resolved, sizes, &btf, probe.backend)?;
        if probe.prog_stats {
            session.enable_program_stats()?;
        }
        for (i, &id) in filters.cgroups.iter().enumerate() {
            session.add_cgroup(id, i as u32)?;
        }
        for &comm in &filters.comms {
            session.add_comm(comm)?;
        }
        let avail = classes::availability(|p| session.attached(p), |p| session.reason(p).map(str::to_string));
        let fault_probe = session.attached(Program::FaultEntry) && session.attached(Program::FaultReturn);
        let no_mappings = attrib.no_mappings;
        let attrib =
            Attribution::new(attrib, mappings_availability(fault_probe, &session.vma_offset, no_mappings));
        // Before any target is added: no fault is counted before this.
        let mut config = vec![
            (Config::TpClasses, classes::error_code_classes(&avail)),
            (Config::Exceptions, session.attached(Program::FaultReturn) as u32),
        ];
        config.extend(attrib.config(&avail));
        session.configure(&config)?;
        eprintln!("{}", text::measured_line(&avail));
        if let Err(why) = &attrib.mappings {
            super::say(&format!("faultscope: per-mapping counts not measurable here: {why}"));
        }
        // Classes not measurable here are said by the line above; a class
        // measured without a fault path to attribute is said here.
        for (what, list) in [("sites", &attrib.opts.sites), ("stacks", &attrib.opts.stacks)] {
            let counted_elsewhere = list.0.iter().any(|m| {
                avail.iter().any(|(x, a)| {
                    x == m
                        && matches!(a, Availability::Measured { class, .. } if faultscope_common::Class::ERROR_CODE.contains(class))
                })
            });
            if let (true, (_, Some(why))) = (counted_elsewhere, attributable_here(list, &avail)) {
                super::say(&format!("faultscope: --{what}: {why}"));
            }
        }
        let (stacks, why) = attributable_here(&attrib.opts.stacks, &avail);
        if stacks.is_empty() && (attrib.opts.folded.is_some() || attrib.opts.flamegraph.is_some()) {
            return Err(Refusal::new(format!(
                "--folded/--flamegraph: no stack can be counted here ({}): nothing would be written",
                why.unwrap_or_else(|| "no class given to --stacks".into())
            ))
            .into());
        }
        let timeline = Timeline::new(session.current_phase()?, kernel::monotonic_ns());
        let marker = fs::OpenOptions::new().write(true).open(tracefs.join("trace_marker")).ok();
        Ok(Recorder {
            marker,
            session,
            avail,
            timeline,
            comms: BTreeMap::new(),
            live: BTreeSet::new(),
            lifetimes: BTreeMap::new(),
            started: Instant::now(),
            attrib,
            self_traced: false,
            fork_comms: None,
            kinds: None,
            adopted: Vec::new(),
            accounting: BTreeMap::new(),
            sizes,
        })
    }

    pub fn add(&mut self, pid: u32, flags: u32, comm: String) -> Result<()> {
        let info = TargetInfo { flags, _reserved: 0 };
        if flags & TARGET_PENDING_EXEC != 0 {
            // Its count starts at its exec, which the kernel reads.
            self.session.add_target(pid, info)?;
        } else {
            let mut added = Ok(());
            let start = accounting::start_at_attach(pid, || added = self.session.add_target(pid, info));
            added?;
            self.accounting.insert(pid, KernelCount::new(start));
        }
        self.comms.insert(pid, comm);
        self.live.insert(pid);
        self.lifetimes.insert(pid, Lifetime::from(kernel::monotonic_ns()));
        // A command not yet exec'd has faultscope's own maps: its snapshot
        // comes at its exec.
        if flags & TARGET_PENDING_EXEC == 0 {
            self.attrib.snapshot(pid, kernel::monotonic_ns(), "attach");
        }
        Ok(())
    }

    /// Maps snapshots of every live traced process (at a phase change).
    fn snapshot_maps(&mut self, label: &str) {
        if self.self_traced && label != "end" {
            return;
        }
        let now = kernel::monotonic_ns();
        for &pid in &self.live {
            self.attrib.snapshot(pid, now, label);
        }
    }

    /// Children that the `targets` forked before attach and that still
    /// share their memory go into the kernel's children map, so that their
    /// exit or exec starts a phase; the first phase says they are alive.
    /// Returns them.
    pub fn attach_children(&mut self, targets: &[u32]) -> Result<Vec<u32>> {
        let mut found = Vec::new();
        for &parent in targets {
            for child in children::sharing_memory(parent) {
                self.session.add_child(child, parent)?;
                found.push((child, parent));
            }
        }
        // One that exited or exec'd before the kernel knew it left no event:
        // take it out again. If the kernel took it out first, its event
        // comes and finds it alive.
        let mut alive = Vec::new();
        for &(child, parent) in &found {
            if children::shares_memory(parent, child) || !self.session.remove_child(child) {
                alive.push(child);
            }
        }
        self.timeline.attached_children(&alive);
        if let Some(k) = self.kinds.as_mut() {
            let id = self.timeline.current().id;
            for &parent in targets {
                let mine: Vec<u32> = found
                    .iter()
                    .filter(|(c, p)| *p == parent && alive.contains(c))
                    .map(|(c, _)| *c)
                    .collect();
                k.attached(parent, id, &mine);
            }
        }
        for (child, parent) in found.iter().filter(|(c, _)| alive.contains(c)) {
            eprintln!(
                "faultscope: pid {child}, forked by {parent} before attach, still shares its memory; its exit or exec starts a phase"
            );
        }
        Ok(alive)
    }

    /// Writes "faultscope phase LABEL" to tracefs' trace_marker: the points
    /// where faultscope attached and detached, in any ftrace trace taken
    /// beside it.
    pub fn trace_mark(&self, label: &str) {
        write_marker(self.marker.as_ref(), &marker_line(label));
    }

    /// Starts a phase named `mark:LABEL`; returns its name.
    pub fn mark(&mut self, label: &str) -> Result<String> {
        // Events first, so the mark lands after the lifecycle changes that
        // happened before it; the maps as they are when it starts (taken
        // before the switch: a process tracing itself faults doing it).
        self.drain_events()?;
        self.snapshot_maps(&format!("mark:{label}"));
        // Formatted before the switch: nothing between the switch and the
        // marker may touch new memory.
        let line = marker_line(&format!("mark:{label}"));
        let marker = self.marker.as_ref();
        let id = self.session.mark(|| write_marker(marker, &line))?;
        self.timeline.mark(id, kernel::monotonic_ns(), label);
        Ok(self.timeline.current().name.clone())
    }

    /// Applies lifecycle events: phases, followed children joining the live
    /// set, exits leaving it, and when each process existed.
    pub fn drain_events(&mut self) -> Result<()> {
        let mut evs = Vec::new();
        {
            let mut ring = self.session.events()?;
            while let Some(item) = ring.next() {
                if item.len() >= std::mem::size_of::<LifeEvent>() {
                    // SAFETY: the kernel wrote a LifeEvent; read unaligned.
                    evs.push(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const LifeEvent) });
                }
            }
        }
        evs.sort_by_key(|e| e.ts_ns);
        let phase_changed = evs.iter().any(|e| {
            [LifeKind::Fork, LifeKind::ChildExit, LifeKind::ChildExec, LifeKind::Exec]
                .iter()
                .any(|k| *k as u32 == e.kind)
        });
        for e in evs {
            let comm = String::from_utf8_lossy(&e.comm).trim_end_matches('\0').to_string();
            match e.kind {
                k if k == LifeKind::Fork as u32 => {
                    self.timeline.fork(e.phase, e.ts_ns, e.pid);
                    if let Some(k) = self.kinds.as_mut() {
                        k.fork(e.tgid, e.phase, e.pid);
                    }
                    if let Some(f) = self.fork_comms.as_mut() {
                        f.push(comm.clone());
                    }
                    if e.aux != 0 {
                        // A new process's count starts at 0, and it is
                        // counted from its fork.
                        self.accounting
                            .insert(e.pid, KernelCount::new(Start::Exact(Default::default(), "its fork")));
                        self.live.insert(e.pid);
                        self.comms.insert(e.pid, comm);
                        self.lifetimes.insert(e.pid, Lifetime::from(e.ts_ns));
                        // A child that is gone before its snapshot had its
                        // parent's maps at fork.
                        self.attrib.inherit(e.pid, e.tgid, e.ts_ns);
                    }
                }
                k if k == LifeKind::ChildExit as u32 || k == LifeKind::ChildExec as u32 => {
                    let exec = k == LifeKind::ChildExec as u32;
                    self.timeline.child_gone(e.phase, e.ts_ns, e.pid, exec);
                    if let Some(k) = self.kinds.as_mut() {
                        k.child_gone(e.tgid, e.phase, e.pid, exec);
                    }
                    // A followed child's own life goes on after an exec, as
                    // another program.
                    if !exec {
                        if let Some(l) = self.lifetimes.get_mut(&e.pid) {
                            l.end(e.ts_ns);
                        }
                    }
                }
                k if k == LifeKind::Exec as u32 => {
                    // The kernel started a phase for the new program
                    // (`Filters::exec_phase`).
                    if e.phase != self.timeline.current().id {
                        self.timeline.exec(e.phase, e.ts_ns, e.tgid);
                        if let Some(k) = self.kinds.as_mut() {
                            k.exec(e.tgid, e.phase);
                        }
                    }
                    // A started command counts from its exec (a traced
                    // process that execs again keeps its start).
                    self.accounting
                        .entry(e.tgid)
                        .or_insert_with(|| KernelCount::new(Start::Exact(e.flt, "its exec")));
                    self.comms.insert(e.tgid, comm);
                    // The maps before the exec were another program's.
                    self.attrib.exec(e.tgid, e.ts_ns);
                }
                // The cgroup filter added it at its first event (unless
                // serve's scan of cgroup.procs added it meanwhile).
                k if k == LifeKind::Adopt as u32 && self.live.insert(e.tgid) => {
                    let at_exec = e.aux & ADOPT_AT_EXEC != 0;
                    self.accounting.entry(e.tgid).or_insert_with(|| {
                        KernelCount::new(if at_exec {
                            Start::Exact(e.flt, "its exec")
                        } else {
                            Start::Unknown(
                                "adopted by the cgroup filter at its first event: the counts of its other threads before it are not known".into(),
                            )
                        })
                    });
                    self.comms.insert(e.tgid, comm);
                    self.lifetimes.insert(e.tgid, Lifetime::from(e.ts_ns));
                    self.attrib.snapshot(e.tgid, e.ts_ns, "attach");
                    self.adopted.push((e.tgid, e.aux & !ADOPT_AT_EXEC));
                }
                // The kernel took it out of the traced set at its exit (so
                // that a new process with its pid is not counted as it).
                k if k == LifeKind::Exit as u32 => {
                    let exited = self.session.take_exited(e.tgid);
                    if let Some(k) = self.accounting.get_mut(&e.tgid) {
                        match exited {
                            Some(total) => k.exited(total),
                            None => {
                                k.start =
                                    Start::Unknown("no thread's final count was kept at its exit".into())
                            }
                        }
                    }
                    self.live.remove(&e.tgid);
                    if let Some(l) = self.lifetimes.get_mut(&e.tgid) {
                        l.end(e.ts_ns);
                    }
                }
                _ => {}
            }
        }
        if phase_changed {
            let name = self.timeline.current().name.clone();
            self.snapshot_maps(&name);
        }
        self.session.flush_logs();
        Ok(())
    }

    pub fn snapshot(&self) -> Result<Snapshot> {
        Snapshot::read(&self.session.bpf)
    }

    /// The run's last read of the counts, with the kernel's count of each
    /// process still running read from `/proc` just before and after it
    /// (the end of its kernel check).
    pub fn final_snapshot(&mut self) -> Result<Snapshot> {
        self.drain_events()?;
        let live: Vec<u32> = self.live.iter().copied().collect();
        let before: Vec<_> = live.iter().map(|&p| accounting::process_flt(p)).collect();
        let snap = self.snapshot()?;
        for (pid, lo) in live.into_iter().zip(before) {
            if let (Some(lo), Some(hi), Some(k)) =
                (lo, accounting::process_flt(pid), self.accounting.get_mut(&pid))
            {
                if k.end.is_none() {
                    k.end = Some(End::Proc(Bracket { lo, hi }));
                }
            }
        }
        Ok(snap)
    }

    pub fn context(&self) -> Result<build::Context<'_>> {
        Ok(build::Context {
            kernel: kernel::release(),
            arch: std::env::consts::ARCH,
            availability: &self.avail,
            probes: &self.session.status,
            comms: &self.comms,
            lifetimes: &self.lifetimes,
            accounting: &self.accounting,
            kernel_exceptions: self.session.attached(Program::PageFaultKernel),
            drops: self.session.drops()?,
            duration_ns: self.started.elapsed().as_nanos() as u64,
            timeline: &self.timeline,
            namer: None,
            now_ns: kernel::monotonic_ns(),
        })
    }

    /// The counts in `snap` (an interval, the live view), without names.
    pub fn counts(&self, snap: &Snapshot) -> Result<Report> {
        Ok(build::build(snap, &self.context()?))
    }

    /// The report of `snap` with its attribution named.
    pub fn report(&self, snap: &Snapshot) -> Result<Report> {
        let frames = |id: i32| stack_frames(&self.session.bpf, id);
        let namer = Namer::new(&self.attrib, &self.avail, &frames);
        let mut ctx = self.context()?;
        ctx.namer = Some(&namer);
        Ok(build::build(snap, &ctx))
    }

    /// Ends the last phase and builds the final report.
    pub fn finish(&mut self, snap: &Snapshot) -> Result<Report> {
        self.drain_events()?;
        self.snapshot_maps("end");
        self.timeline.end(kernel::monotonic_ns());
        let mut report = self.report(snap)?;
        report.programs = self.session.program_costs()?;
        report.kernel_memory = Some(kernel_memory(self.sizes));
        Ok(report)
    }
}

/// What maps of `sizes` take on this machine.
pub fn kernel_memory(sizes: Sizes) -> crate::report::schema::KernelMemory {
    let cpus = footprint::cpus();
    let maps = footprint::maps(&sizes, cpus);
    crate::report::schema::KernelMemory {
        cpus,
        bytes: footprint::total(&maps),
        maps: maps
            .into_iter()
            .map(|m| {
                (m.name.to_string(), crate::report::schema::MapMemory { entries: m.entries, bytes: m.bytes })
            })
            .collect(),
    }
}

/// The trace_marker line of a phase (the guest oracle splits on it).
fn marker_line(label: &str) -> String {
    format!("faultscope phase {label}\n")
}

/// A failed write costs the ftrace trace beside faultscope its phase
/// boundary, never faultscope's own counts; it is said on stderr, since a
/// trace split at the wrong place would be misread.
fn write_marker(marker: Option<&fs::File>, line: &str) {
    if let Some(mut f) = marker {
        use std::io::Write as _;
        if let Err(e) = f.write_all(line.as_bytes()) {
            eprintln!("faultscope: could not write {:?} to tracefs trace_marker: {e}", line.trim_end());
        }
    }
}

/// A bad number of seconds (negative, NaN, infinite, too large for a
/// Duration) is refused before anything is attached.
pub(crate) fn seconds(flag: &str, v: Option<f64>) -> Result<Option<Duration>, Refusal> {
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s <= 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(Refusal::new(format!("{flag} {s}: give a number of seconds above 0 (at most 1e9)"))),
    }
}

/// One run of `record`: the recorder and what the run loop keeps.
pub struct Recording {
    pub rec: Recorder,
    opts: RecordOpts,
    started: Instant,
    /// The command record started, and its exit status once reaped.
    spawned: Option<u32>,
    cmd_status: Option<i32>,
    /// Redraw a live table (stdout is a terminal) instead of interval tables.
    live_view: bool,
    interval: Option<Duration>,
    next_tick: Option<Instant>,
    deadline: Option<Instant>,
    ticks: u64,
    last: Snapshot,
    /// The time series of `--interval`.
    series: Vec<crate::report::schema::Interval>,
    signal_marks: u32,
    /// stdout is gone: the final tables are not printed (the JSON is
    /// still written).
    stdout_closed: bool,
}

/// Why a run ends when its stdout is closed.
pub const STDOUT_CLOSED: &str = "stdout closed";

impl Recording {
    /// Checks the request, attaches, adds the targets and starts the
    /// command; refuses bad input before anything is attached.
    pub fn start(o: RecordOpts) -> Result<Recording> {
        if o.pids.is_empty() && o.command.is_empty() {
            return Err(Refusal::new("nothing to trace: give -p PID or -- COMMAND").into());
        }
        let duration = seconds("--duration", o.duration)?;
        let interval = seconds("--interval", o.interval)?;
        if o.count == Some(0) {
            return Err(Refusal::new("--count 0: give at least 1 interval").into());
        }
        footprint::stats_entries(o.max_stats, DEFAULT_STATS, footprint::cpus())?;
        kernel::require_root()?;
        let mut comms = BTreeMap::new();
        for &pid in &o.pids {
            comms.insert(pid, target::check_pid(pid)?);
        }
        if !o.command.is_empty() {
            target::resolve_command(&o.command)?;
        }
        // Fail on an unwritable report path now, not after the run; an
        // existing report stays as it is until the new one is complete.
        if let Some(p) = &o.json {
            crate::output::check(p)?;
        }
        o.attrib.check_writable()?;
        let outs: Vec<(&str, &std::path::Path)> = [
            ("--json", o.json.as_deref()),
            ("--folded", o.attrib.folded.as_deref()),
            ("--flamegraph", o.attrib.flamegraph.as_deref()),
        ]
        .into_iter()
        .filter_map(|(f, p)| Some((f, p?)))
        .collect();
        crate::output::check_distinct(&outs)?;
        let mut rec =
            Recorder::start(o.max_stats, DEFAULT_STATS, o.attrib.clone(), &o.probe, &Filters::default())?;
        let follow = if o.follow_children { TARGET_FOLLOW_CHILDREN } else { 0 };
        for (pid, comm) in comms {
            rec.add(pid, follow, comm)?;
        }
        rec.attach_children(&o.pids)?;
        let mut spawned = None;
        if !o.command.is_empty() {
            let paused = target::spawn_paused(&o.command)?;
            let pid = paused.pid;
            let comm = o.command[0].rsplit('/').next().unwrap_or_default().to_string();
            rec.add(pid, follow | TARGET_PENDING_EXEC, comm)?;
            paused.release()?;
            spawned = Some(pid);
        }
        rec.trace_mark("attach");
        let started = Instant::now();
        let live_view = live::enabled();
        // On a terminal the live view redraws every interval (1 s by default).
        let interval = interval.or(live_view.then_some(Duration::from_secs(1)));
        Ok(Recording {
            rec,
            started,
            spawned,
            cmd_status: None,
            live_view,
            interval,
            next_tick: interval.map(|d| started + d),
            deadline: duration.map(|d| started + d),
            ticks: 0,
            last: Snapshot::default(),
            series: Vec::new(),
            signal_marks: 0,
            stdout_closed: false,
            opts: o,
        })
    }

    /// Starts a `mark:LABEL` phase; says its name on stderr.
    pub fn mark(&mut self, label: &str) -> Result<String> {
        let name = self.rec.mark(label)?;
        super::say(&format!("faultscope: phase {}", text::safe(&name)));
        Ok(name)
    }

    /// A phase for the `--mark-on-signal` signal.
    pub fn signal_mark(&mut self) -> Result<()> {
        self.signal_marks += 1;
        self.mark(&format!("signal#{}", self.signal_marks)).map(drop)
    }

    /// Applies what happened since the last tick (lifecycle events, exits,
    /// an interval's table); returns why the run ends, when it does.
    pub fn tick(&mut self) -> Result<Option<&'static str>> {
        self.rec.drain_events()?;
        if let (Some(pid), None) = (self.spawned, self.cmd_status) {
            self.cmd_status = target::try_reap(pid);
            if self.cmd_status.is_some() {
                self.rec.live.remove(&pid);
            }
        }
        self.rec.live.retain(|&p| !target::is_gone(p));
        let now = Instant::now();
        if let (Some(t), Some(d)) = (self.next_tick, self.interval) {
            if now >= t {
                if self.interval_table(now)?.is_err() {
                    self.stdout_closed = true;
                    return Ok(Some(STDOUT_CLOSED));
                }
                self.next_tick = Some(t + d);
                if self.opts.count.is_some_and(|c| self.ticks >= c) {
                    return Ok(Some("interval count reached"));
                }
            }
        }
        if self.deadline.is_some_and(|d| now >= d) {
            return Ok(Some("duration reached"));
        }
        if self.rec.live.is_empty() {
            return Ok(Some("all targets exited"));
        }
        Ok(None)
    }

    /// One interval: the live frame or the plain table, and its point of
    /// the time series. The outer error is the run's; the inner one says
    /// that stdout is gone (EPIPE: `record --interval 1 | head`), which
    /// ends the run like a signal.
    fn interval_table(&mut self, now: Instant) -> Result<std::io::Result<()>> {
        let snap = self.rec.snapshot()?;
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let phase = self.rec.timeline.current().name.clone();
        let delta = snap.since(&self.last);
        let shown = if self.live_view {
            let footer = live::footer(self.opts.json.as_deref(), self.opts.interval.is_some());
            super::out(&live::frame(&self.rec.counts(&snap)?, &phase, elapsed, &footer))
        } else {
            super::out(&format!(
                "--- interval {} ({elapsed:.1}s), phase {} ---\n{}",
                self.ticks + 1,
                text::safe(&phase),
                text::to_text(&self.rec.counts(&delta)?)
            ))
        };
        self.series.push(build::interval(&delta, &self.rec.context()?, elapsed));
        self.last = snap;
        self.ticks += 1;
        Ok(shown)
    }

    /// The command faultscope started, when the run ends before it: sent
    /// the signal that ended the run (SIGTERM for a duration or count),
    /// unless `--keep-command`, and waited for up to 5 s.
    fn end_command(&mut self, why: &str) {
        let (Some(pid), None) = (self.spawned, self.cmd_status) else { return };
        if why == "all targets exited" {
            // Its exit event may come before it can be reaped: reap it now.
            self.cmd_status = target::wait(pid);
            return;
        }
        if self.opts.keep_command {
            super::say(&format!("faultscope: the command (pid {pid}) is left running (--keep-command)"));
            return;
        }
        let sig = match why {
            "interrupted" => libc::SIGINT,
            "hung up" => libc::SIGHUP,
            _ => libc::SIGTERM,
        };
        // Reaps it if it exits within `d`.
        let reap_within = |d: Duration| {
            let until = Instant::now() + d;
            loop {
                std::thread::sleep(Duration::from_millis(20));
                let st = target::try_reap(pid);
                if st.is_some() || Instant::now() >= until {
                    return st;
                }
            }
        };
        // Ctrl-C on a terminal reaches the command itself too: a moment
        // for it to exit of its own before a second signal.
        self.cmd_status = reap_within(Duration::from_millis(200));
        if self.cmd_status.is_none() {
            // SAFETY: a signal to our own child, not yet reaped.
            unsafe { libc::kill(pid as libc::pid_t, sig) };
            self.cmd_status = reap_within(Duration::from_secs(5));
        }
        if self.cmd_status.is_none() {
            super::say(&format!(
                "faultscope: the command (pid {pid}) did not exit within 5 s of signal {sig}; it is left running"
            ));
        }
        self.rec.live.remove(&pid);
    }

    /// Detaches after the last read, prints the report and the findings,
    /// and writes the JSON. Returns the exit code: the command's status
    /// when faultscope started one and it exited (128 + N for a signal, as
    /// a shell gives), else 0.
    pub fn finish(mut self, why: &str) -> Result<i32> {
        self.end_command(why);
        self.rec.trace_mark("detach");
        let snap = self.rec.final_snapshot()?;
        let mut report = self.rec.finish(&snap)?;
        super::say(&format!("faultscope: {why} after {:.2}s", self.started.elapsed().as_secs_f64()));
        let found = findings::attach(&mut report);
        let tables = format!("{}{found}", text::to_text(&report));
        if self.opts.json.as_deref().is_some_and(|p| p.as_os_str() == "-") {
            // The JSON has standard output.
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), tables.as_bytes());
        } else if !self.stdout_closed {
            // A reader gone now (EPIPE) costs only these tables.
            let _ = super::out(&tables);
        }
        if let Some(p) = &self.opts.json {
            report.end = Some(why.to_string());
            if self.opts.interval.is_some() {
                // The last, partial interval up to the end of the run.
                let elapsed = self.started.elapsed().as_secs_f64();
                self.series.push(build::interval(&snap.since(&self.last), &self.rec.context()?, elapsed));
                report.intervals = Some(std::mem::take(&mut self.series));
            }
            report.command_exit_status = self.cmd_status;
            file::write(p, &report)?;
        }
        // After the report: a failure here must not cost it.
        write_stacks(&self.opts.attrib, &report)?;
        Ok(match (self.spawned, self.cmd_status) {
            (Some(_), Some(st)) if st >= 0 => st,
            _ => 0,
        })
    }
}

pub async fn run(o: RecordOpts) -> Result<i32> {
    let mark_signal = o.mark_on_signal;
    // Before the attach: a signal while it goes on ends the run once it is
    // done, with a report, instead of killing faultscope half attached.
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    // SIGHUP (the terminal went away) ends the run like SIGTERM, unless it
    // is the --mark-on-signal signal.
    let mut sighup =
        if mark_signal == Some(libc::SIGHUP) { None } else { Some(signal(SignalKind::hangup())?) };
    let mut sigmark = match mark_signal {
        Some(s) => Some(signal(SignalKind::from_raw(s))?),
        None => None,
    };
    let mut r = Recording::start(o)?;
    let sock = marks::Socket::listen(std::process::id())?;
    // Each mark client is read by a task of its own, so that one that
    // connects and says nothing cannot hold up the run.
    let mut requests: JoinSet<Option<(Result<String, String>, UnixStream)>> = JoinSet::new();
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    let why = loop {
        tokio::select! {
            _ = sigint.recv() => break "interrupted",
            _ = sigterm.recv() => break "terminated",
            Some(()) = recv(sighup.as_mut()) => break "hung up",
            Some(()) = recv(sigmark.as_mut()) => {
                r.signal_mark()?;
            }
            Ok((stream, _)) = sock.listener.accept() => {
                requests.spawn(read_request(stream));
            }
            Some(Ok(Some((label, stream)))) = requests.join_next(), if !requests.is_empty() => {
                let reply = match label {
                    Ok(label) => match r.mark(&label) {
                        Ok(name) => format!("ok {name}\n"),
                        Err(e) => {
                            super::say(&format!("faultscope: mark request failed: {e:#}"));
                            format!("error {e:#}\n")
                        }
                    },
                    Err(e) => format!("error {e}\n"),
                };
                // A short line into an empty socket buffer: never blocks.
                let _ = stream.try_write(reply.as_bytes());
            }
            _ = poll.tick() => {}
        }
        if let Some(why) = r.tick()? {
            break why;
        }
    };
    requests.abort_all();
    drop(sock);
    r.finish(why)
}

/// `--folded` and `--flamegraph`: the stacks of the report.
pub fn write_stacks(o: &AttribOpts, report: &Report) -> Result<()> {
    if o.folded.is_none() && o.flamegraph.is_none() {
        return Ok(());
    }
    let f = crate::report::attribution::folded(report);
    if let Some(p) = &o.folded {
        crate::output::write(p, f.to_folded().as_bytes())?;
    }
    if let Some(p) = &o.flamegraph {
        if f.is_empty() {
            super::say(&format!("faultscope: no stacks were counted; {} not written", p.display()));
        } else {
            crate::output::write(p, f.to_svg("faultscope: stacks by class")?.as_bytes())?;
        }
    }
    Ok(())
}

/// The next delivery of an optional signal (never, without one).
async fn recv(s: Option<&mut Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Reads one `faultscope mark` request, "mark LABEL\n" (at most 2 s and
/// 256 bytes); the reply "ok PHASE-NAME\n" or "error WHY\n" goes back on the
/// stream. A client that closes without a byte (a liveness probe) gets none.
async fn read_request(mut stream: UnixStream) -> Option<(Result<String, String>, UnixStream)> {
    let mut line = String::new();
    let mut reader = BufReader::new((&mut stream).take(256));
    let label = match tokio::time::timeout(Duration::from_secs(2), reader.read_line(&mut line)).await {
        Ok(Ok(0)) => return None,
        Ok(Ok(_)) => marks::parse_request(&line),
        Ok(Err(e)) => Err(format!("reading the request: {e}")),
        Err(_) => Err("timed out reading the request".to_string()),
    };
    drop(reader);
    Some((label, stream))
}
