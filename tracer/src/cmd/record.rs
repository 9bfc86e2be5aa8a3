//! `faultscope record`: resolve probes, attach, trace the targets until
//! Ctrl-C, SIGTERM, SIGHUP, --duration, the exit of every target or a
//! closed stdout, then report and detach. A [`Recording`] is that run
//! (start, tick, mark, finish); the [`Recorder`] inside it is the traced
//! session with its phase timeline, which `bench` also uses to trace itself.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::Result;
use clap::Args;
use faultscope_common::maps::{TARGET_FOLLOW_CHILDREN, TARGET_PENDING_EXEC};
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt as _, BufReader},
    net::UnixStream,
    signal::unix::{signal, Signal, SignalKind},
    task::JoinSet,
};

use super::mark as marks;
use crate::{
    collect::{
        attribution::AttribOpts,
        collector::Snapshot,
        engine::{ProbeOpts, Recorder},
        select::{Bound, SelectOpts, Selection, DEFAULT_BOUND},
        target,
    },
    error::Refusal,
    kernel::{
        self,
        classes::{Availability, ReportClass},
        footprint,
    },
    report::{build, file, findings, live, provenance, schema::Report, text},
};

#[derive(Args, Debug)]
pub struct RecordOpts {
    /// Trace this process (repeatable).
    #[arg(short = 'p', long = "pid")]
    pub pids: Vec<u32>,
    /// With these, the run lasts until a signal, --duration or --count:
    /// new processes of the selection may come at any time.
    #[command(flatten)]
    pub select: SelectOpts,
    /// Stop after this many seconds.
    #[arg(short = 'd', long, allow_hyphen_values = true)]
    pub duration: Option<f64>,
    /// Print a table of what happened in each interval of this many seconds.
    #[arg(short = 'i', long, allow_hyphen_values = true)]
    pub interval: Option<f64>,
    /// Stop after this many intervals.
    #[arg(short = 'c', long, requires = "interval")]
    pub count: Option<u64>,
    /// Write the final report as JSON (schema faultscope/1) to this file;
    /// `-` (or `/dev/stdout`) is standard output (the tables then go to
    /// standard error), `/dev/fd/N` this process's descriptor N. A FIFO or a
    /// character device is written in place, a regular file replaced whole
    /// (through a link of root's or this user's, which stays a link);
    /// another user's link or FIFO, and anything else, is refused before
    /// the run.
    #[arg(short = 'j', long)]
    pub json: Option<PathBuf>,
    /// Write the text report (the tables and the findings) to this file,
    /// as --json writes its file. Without it the text goes to standard
    /// output, or to standard error when a started command shares
    /// standard output (as `perf stat` does) or the JSON has it.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// Print only errors and what --json and --output ask for: no tables,
    /// no start-up or end lines.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// The live view's and each interval's processes by the count of this
    /// class, most first (by default in pid order).
    #[arg(long, value_name = "CLASS", value_parser = ReportClass::parse)]
    pub sort: Option<ReportClass>,
    /// Show only the first N processes of each interval (in --sort's
    /// order); the others are summed on one row.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
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

impl RecordOpts {
    /// What is traced, for the report's provenance.
    fn target(&self) -> String {
        let mut parts: Vec<String> = self.pids.iter().map(|p| format!("pid {p}")).collect();
        if !self.command.is_empty() {
            parts.push(format!("command {}", self.command.join(" ")));
        }
        parts.extend(self.select.comm.iter().map(|c| format!("comm {c}")));
        parts.extend(self.select.cgroup.iter().map(|c| format!("cgroup {}", c.display())));
        if self.follow_children {
            parts.push("and their children".into());
        }
        parts.join(", ")
    }
}

/// record's and bench's most stats entries by default.
pub const DEFAULT_STATS: u32 = 2048;
/// The same for `-a` (record and serve): the processes alive at once, a
/// few class sets each, and those exited in the last half second (their
/// entries then leave the map).
pub const SYSTEM_WIDE_STATS: u32 = 16384;

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
    /// `--comm` and `--cgroup`.
    sel: Selection,
}

/// Why a run ends when its stdout is closed.
pub const STDOUT_CLOSED: &str = "stdout closed";

impl Recording {
    /// Checks the request, attaches, adds the targets and starts the
    /// command; refuses bad input before anything is attached.
    /// Also returns the mark socket, bound before anything is attached (a
    /// run that cannot listen is refused before it starts a command) and
    /// named once the run is attached.
    pub fn start(mut o: RecordOpts) -> Result<(Recording, marks::Socket)> {
        if o.select.all {
            system_wide_only(&o.pids, &o.select, !o.command.is_empty(), o.follow_children, &mut o.attrib)?;
        }
        if o.pids.is_empty() && o.command.is_empty() && o.select.is_empty() {
            return Err(Refusal::new(
                "nothing to trace: give -p PID, --comm NAME, --cgroup PATH or -- COMMAND",
            )
            .into());
        }
        let filters = o.select.filters()?;
        let duration = crate::units::seconds("--duration", o.duration, 1e-3)?;
        let interval = crate::units::seconds("--interval", o.interval, crate::units::MIN_INTERVAL_S)?;
        if o.count == Some(0) {
            return Err(Refusal::new("--count 0: give at least 1 interval").into());
        }
        if o.top == Some(0) {
            return Err(Refusal::new("--top 0: give at least 1 process").into());
        }
        let default_stats = if o.select.all { SYSTEM_WIDE_STATS } else { DEFAULT_STATS };
        footprint::stats_entries(o.max_stats, default_stats, footprint::cpus())?;
        o.attrib.stack_entries()?;
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
        for p in [&o.json, &o.output].into_iter().flatten() {
            crate::output::check(p)?;
        }
        o.attrib.check_writable()?;
        if o.quiet {
            crate::term::quiet();
        }
        let outs: Vec<(&str, &std::path::Path)> =
            [("--json", o.json.as_deref()), ("--output", o.output.as_deref())]
                .into_iter()
                .filter_map(|(f, p)| Some((f, p?)))
                .chain(o.attrib.stack_outputs())
                .collect();
        crate::output::check_distinct(&outs)?;
        let mut sock = marks::Socket::bind(std::process::id())?;
        let probe = ProbeOpts { quiet: o.quiet || o.probe.quiet, ..o.probe.clone() };
        let mut rec = Recorder::start(o.max_stats, default_stats, o.attrib.clone(), &probe, &filters)?;
        if let Some(m) = o.sort {
            if let Some((_, Availability::NotMeasurable(why))) = rec.avail.iter().find(|(c, _)| *c == m) {
                return Err(Refusal::new(format!("--sort {m}: not measurable here ({why})")).into());
            }
        }
        if o.select.all {
            rec.bound = Some(Bound {
                sort: o.sort.unwrap_or(DEFAULT_BOUND.sort),
                top: o.top.unwrap_or(DEFAULT_BOUND.top),
            });
        }
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
        sock.publish(std::process::id())?;
        let started = Instant::now();
        let live_view = live::enabled();
        // On a terminal the live view redraws every interval (1 s by default).
        let interval = interval.or(live_view.then_some(Duration::from_secs(1)));
        let r = Recording {
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
            sel: Selection::new(o.select.clone(), &filters),
            opts: o,
        };
        Ok((r, sock))
    }

    /// Starts a `mark:LABEL` phase; says its name on stderr.
    pub fn mark(&mut self, label: &str) -> Result<String> {
        let name = self.rec.mark(label)?;
        crate::term::say(&format!("faultscope: phase {}", crate::term::safe(&name)));
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
        self.sel.tick(&mut self.rec)?;
        self.rec.fold_exited()?;
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
        if self.rec.live.is_empty() && self.sel.is_empty() {
            return Ok(Some("all targets exited"));
        }
        Ok(None)
    }

    /// One interval: the live frame or the plain table, and its point of
    /// the time series. The outer error is the run's; the inner one says
    /// that stdout is gone (EPIPE: `record --interval 1 | head`), which
    /// ends the run like a signal.
    /// The live view's order of processes (`--sort`, `--top`).
    fn order(&self) -> live::Order {
        match self.rec.bound {
            Some(b) => live::Order { sort: Some(b.sort), top: Some(b.top) },
            None => live::Order { sort: self.opts.sort, top: self.opts.top },
        }
    }

    fn interval_table(&mut self, now: Instant) -> Result<std::io::Result<()>> {
        let snap = self.rec.snapshot()?;
        self.rec.name_processes(&snap);
        let snap = snap.clean_or(&self.last);
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let delta = snap.since(&self.last);
        let iv = build::interval(&delta, &self.rec.context()?, elapsed);
        // An interval across a phase change shows each phase it holds.
        let phase = if iv.phases.len() > 1 { iv.phases.join(" + ") } else { iv.phase.clone() };
        let cols = live::columns(&self.rec.avail);
        let counts = self.rec.counts(&delta)?;
        let shown = if self.opts.quiet {
            Ok(())
        } else if self.live_view {
            let footer = live::footer(self.opts.json.as_deref(), self.opts.interval.is_some());
            let every = self.interval.map_or(1.0, |d| d.as_secs_f64());
            crate::term::out(&live::frame(&counts, &cols, self.order(), &phase, elapsed, every, &footer))
        } else {
            let mut text = if self.ticks == 0 { live::line_header(&cols) } else { String::new() };
            text.push_str(&live::lines(&counts, &cols, self.order(), &live::time_of_day(), &phase));
            if text.is_empty() && crate::term::stdout_gone() {
                Err(std::io::ErrorKind::BrokenPipe.into())
            } else {
                crate::term::out(&text)
            }
        };
        self.series.push(iv);
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
            crate::term::say(&format!(
                "faultscope: the command (pid {pid}) is left running (--keep-command)"
            ));
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
            crate::term::say(&format!(
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
        self.rec.name_processes(&snap);
        let mut report = self.rec.finish(&snap)?;
        report.provenance = Some(provenance::here(self.opts.target(), self.rec.anchor));
        crate::term::say(&format!("faultscope: {why} after {:.2}s", self.started.elapsed().as_secs_f64()));
        let found = findings::attach(&mut report);
        let tables = format!("{}{found}", text::to_text(&report));
        let shared =
            self.opts.json.as_deref().is_some_and(crate::output::is_stdout) || self.spawned.is_some();
        match &self.opts.output {
            Some(p) => crate::output::write(p, tables.as_bytes())?,
            None if self.opts.quiet => {}
            // The JSON or the command has standard output.
            None if shared => {
                let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), tables.as_bytes());
            }
            // A reader gone now (EPIPE) costs only these tables.
            None if !self.stdout_closed => {
                let _ = crate::term::out(&tables);
            }
            None => {}
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
    // A signal meant for marks, sent without --mark-on-signal, would kill
    // faultscope and leave the command untraced: it is ignored, and said.
    let stray = |s: i32| -> Result<Option<Signal>> {
        Ok(if mark_signal == Some(s) { None } else { Some(signal(SignalKind::from_raw(s))?) })
    };
    let (mut usr1, mut usr2) = (stray(libc::SIGUSR1)?, stray(libc::SIGUSR2)?);
    let mut stray_said = false;
    let (mut r, sock) = Recording::start(o)?;
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
            Some(()) = recv(usr1.as_mut()) => stray_said = said_stray("USR1", stray_said),
            Some(()) = recv(usr2.as_mut()) => stray_said = said_stray("USR2", stray_said),
            Ok((stream, _)) = sock.listener.accept() => {
                requests.spawn(read_request(stream));
            }
            Some(Ok(Some((label, stream)))) = requests.join_next(), if !requests.is_empty() => {
                let reply = match label {
                    Ok(label) => match r.mark(&label) {
                        Ok(name) => format!("ok {name}\n"),
                        Err(e) => {
                            crate::term::say(&format!("faultscope: mark request failed: {e:#}"));
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
    if o.stack_outputs().next().is_none() {
        return Ok(());
    }
    if let Some(p) = &o.pprof {
        crate::output::write(p, &crate::report::pprof::encode(report)?)?;
    }
    let f = crate::report::attribution::folded(report);
    if let Some(p) = &o.folded {
        crate::output::write(p, f.to_folded().as_bytes())?;
    }
    if let Some(p) = &o.flamegraph {
        if f.is_empty() {
            crate::term::say(&format!("faultscope: no stacks were counted; {} not written", p.display()));
        } else {
            crate::output::write(p, f.to_svg("faultscope: stacks by class")?.as_bytes())?;
        }
    }
    Ok(())
}

/// What `-a` cannot be given with, refused; and what it turns off
/// (attribution needs each process's maps), said.
pub fn system_wide_only(
    pids: &[u32],
    select: &SelectOpts,
    command: bool,
    follow_children: bool,
    attrib: &mut AttribOpts,
) -> Result<(), Refusal> {
    let clash = if !pids.is_empty() {
        Some("-p")
    } else if !select.comm.is_empty() || !select.cgroup.is_empty() {
        Some("--comm or --cgroup")
    } else if command {
        Some("command")
    } else if follow_children {
        Some("--follow-children")
    } else if !attrib.stacks.0.is_empty() || attrib.stack_outputs().next().is_some() {
        Some("--stacks, --folded, --flamegraph or --pprof")
    } else {
        None
    };
    if let Some(what) = clash {
        return Err(Refusal::new(format!(
            "-a traces every process; it takes no {what} (without -a, -p, --comm and --cgroup choose the processes)"
        )));
    }
    attrib.no_mappings = true;
    attrib.sites.0.clear();
    Ok(())
}

/// Says once that a mark signal came without --mark-on-signal.
fn said_stray(name: &str, said: bool) -> bool {
    if !said {
        crate::term::say(&format!(
            "faultscope: SIG{name} ignored: give --mark-on-signal {name} to mark a phase with it"
        ));
    }
    true
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
