//! `faultscope record`: resolve probes, attach, trace the targets until
//! Ctrl-C, SIGTERM, --duration or the exit of every target, then report and
//! detach. [`Recorder`] is also what `bench` uses to trace itself.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use clap::Args;
use faultscope_common::maps::{LifeEvent, LifeKind, TargetInfo, TARGET_FOLLOW_CHILDREN, TARGET_PENDING_EXEC};
use serde_json::{json, Value};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    signal::unix::{signal, SignalKind},
};

use crate::{
    classes::{self, Availability},
    collector::Snapshot,
    error::Refusal,
    kernel, marks,
    phases::Timeline,
    probes, report,
    session::Session,
    target,
};

#[derive(Args, Debug)]
pub struct RecordOpts {
    /// Trace this process (repeatable).
    #[arg(short = 'p', long = "pid")]
    pub pids: Vec<u32>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Print a table of what happened in each interval of this many seconds.
    #[arg(long)]
    pub interval: Option<f64>,
    /// Stop after this many intervals.
    #[arg(long, requires = "interval")]
    pub count: Option<u64>,
    /// Write the final report as JSON (schema faultscope/1) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Trace the children that traced processes fork (added in the kernel at
    /// fork time, so none of their faults is missed).
    #[arg(long)]
    pub follow_children: bool,
    /// Start a new phase each time faultscope receives this signal (USR1,
    /// USR2 or HUP).
    #[arg(long, value_parser = marks::parse_signal)]
    pub mark_on_signal: Option<i32>,
    /// Entries of the in-kernel stats map (process x phase x class).
    #[arg(long, default_value_t = 2048)]
    pub max_stats: u32,
    /// Command to start and trace from its exec.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// A tracing session with its phase timeline and the processes it knows.
pub struct Recorder {
    pub session: Session,
    pub avail: Vec<(&'static str, Availability)>,
    pub timeline: Timeline,
    pub comms: BTreeMap<u32, String>,
    /// Traced processes still running.
    pub live: BTreeSet<u32>,
    started: Instant,
    /// tracefs `trace_marker`: each mark is also written to the ftrace
    /// buffer, so traces taken beside faultscope can be split by phase.
    marker: Option<fs::File>,
}

impl Recorder {
    /// Checks the system, resolves the probe table and attaches. Prints the
    /// one line saying what is measured here.
    pub fn start(max_stats: u32) -> Result<Recorder> {
        kernel::require_root()?;
        let tracefs = kernel::tracefs()?;
        kernel::require_btf()?;
        let resolved = probes::resolve_here(&tracefs);
        let mut session = Session::attach(&tracefs, &resolved, max_stats)?;
        let avail = classes::availability(|p| session.attached(p), |p| session.reason(p).map(str::to_string));
        // Before any target is added: no fault is counted before this.
        session.configure(
            classes::error_code_classes(&avail),
            session.attached(faultscope_common::Program::FaultReturn),
        )?;
        eprintln!("{}", report::measured_line(&avail));
        let timeline = Timeline::new(session.current_phase()?, kernel::monotonic_ns());
        let marker = fs::OpenOptions::new().write(true).open(tracefs.join("trace_marker")).ok();
        Ok(Recorder {
            marker,
            session,
            avail,
            timeline,
            comms: BTreeMap::new(),
            live: BTreeSet::new(),
            started: Instant::now(),
        })
    }

    pub fn add(&mut self, pid: u32, flags: u32, comm: String) -> Result<()> {
        self.session.add_target(pid, TargetInfo { flags, _reserved: 0 })?;
        self.comms.insert(pid, comm);
        self.live.insert(pid);
        Ok(())
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
        // happened before it.
        self.drain_events()?;
        // Formatted before the switch: nothing between the switch and the
        // marker may touch new memory.
        let line = marker_line(&format!("mark:{label}"));
        let marker = self.marker.as_ref();
        let id = self.session.mark(|| write_marker(marker, &line))?;
        self.timeline.mark(id, kernel::monotonic_ns(), label);
        Ok(self.timeline.current().name.clone())
    }

    /// Applies lifecycle events: phases, followed children joining the live
    /// set, exits leaving it (and the traced set, so a reused pid is not
    /// traced).
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
        for e in evs {
            let comm = String::from_utf8_lossy(&e.comm).trim_end_matches('\0').to_string();
            match e.kind {
                k if k == LifeKind::Fork as u32 => {
                    self.timeline.fork(e.phase, e.ts_ns, e.pid);
                    if e.aux != 0 {
                        self.live.insert(e.pid);
                        self.comms.insert(e.pid, comm);
                    }
                }
                k if k == LifeKind::ChildExit as u32 => {
                    self.timeline.child_gone(e.phase, e.ts_ns, e.pid, false)
                }
                k if k == LifeKind::ChildExec as u32 => {
                    self.timeline.child_gone(e.phase, e.ts_ns, e.pid, true)
                }
                k if k == LifeKind::Exec as u32 => {
                    self.comms.insert(e.tgid, comm);
                }
                k if k == LifeKind::Exit as u32 => {
                    self.live.remove(&e.tgid);
                    self.session.remove_target(e.tgid);
                }
                _ => {}
            }
        }
        self.session.flush_logs();
        Ok(())
    }

    pub fn snapshot(&self) -> Result<Snapshot> {
        Snapshot::read(&self.session.bpf)
    }

    pub fn context(&self) -> Result<report::Context<'_>> {
        Ok(report::Context {
            kernel: kernel::release(),
            arch: std::env::consts::ARCH,
            availability: &self.avail,
            probes: &self.session.status,
            comms: &self.comms,
            drops: self.session.drops()?,
            duration_ns: self.started.elapsed().as_nanos() as u64,
            timeline: &self.timeline,
        })
    }

    /// Ends the last phase and builds the final JSON report.
    pub fn finish(&mut self, snap: &Snapshot) -> Result<Value> {
        self.drain_events()?;
        self.timeline.end(kernel::monotonic_ns());
        Ok(report::to_json(snap, &self.context()?))
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

/// Writes a JSON file whole or not at all.
pub fn write_json(p: &Path, j: &Value) -> Result<()> {
    let tmp = p.with_extension("tmp");
    fs::write(&tmp, serde_json::to_string_pretty(j)?)
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, p).with_context(|| format!("writing {}", p.display()))
}

pub async fn run(o: RecordOpts) -> Result<i32> {
    if o.pids.is_empty() && o.command.is_empty() {
        return Err(Refusal::new("nothing to trace: give -p PID or -- COMMAND").into());
    }
    kernel::require_root()?;
    let mut comms = BTreeMap::new();
    for &pid in &o.pids {
        comms.insert(pid, target::check_pid(pid)?);
    }
    if !o.command.is_empty() {
        target::resolve_command(&o.command)?;
    }
    // Fail on an unwritable report path now, not after the run.
    if let Some(p) = &o.json {
        fs::write(p, b"").map_err(|e| Refusal::new(format!("cannot write {}: {e}", p.display())))?;
    }
    let mut rec = Recorder::start(o.max_stats)?;
    let follow = if o.follow_children { TARGET_FOLLOW_CHILDREN } else { 0 };
    for (pid, comm) in comms {
        rec.add(pid, follow, comm)?;
    }
    let mut spawned = None;
    if !o.command.is_empty() {
        let paused = target::spawn_paused(&o.command)?;
        let pid = paused.pid;
        let comm = o.command[0].rsplit('/').next().unwrap_or_default().to_string();
        rec.add(pid, follow | TARGET_PENDING_EXEC, comm)?;
        paused.release();
        spawned = Some(pid);
    }
    rec.trace_mark("attach");
    let sock_path = marks::socket_path(std::process::id());
    let listener = marks::listen(&sock_path)?;

    let started = Instant::now();
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigmark = match o.mark_on_signal {
        Some(s) => Some(signal(SignalKind::from_raw(s))?),
        None => None,
    };
    let mut signal_marks = 0u32;
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    let live_view = crate::live::enabled();
    // On a terminal the live view redraws every interval (1 s by default).
    let interval = o.interval.or(live_view.then_some(1.0)).map(Duration::from_secs_f64);
    let mut next_tick = interval.map(|d| started + d);
    let deadline = o.duration.map(|d| started + Duration::from_secs_f64(d));
    let mut ticks = 0u64;
    let mut last = Snapshot::default();
    // The time series: per interval, its phase and each process's counts.
    let mut series: Vec<Value> = Vec::new();
    let mut cmd_status = None;
    let why = loop {
        tokio::select! {
            _ = sigint.recv() => break "interrupted",
            _ = sigterm.recv() => break "terminated",
            Some(()) = async { match sigmark.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => {
                signal_marks += 1;
                let name = rec.mark(&format!("signal#{signal_marks}"))?;
                eprintln!("faultscope: phase {name}");
            }
            Ok((stream, _)) = listener.accept() => {
                if let Err(e) = serve_mark(&mut rec, stream).await {
                    eprintln!("faultscope: mark request failed: {e:#}");
                }
            }
            _ = poll.tick() => {}
        }
        rec.drain_events()?;
        if let Some(pid) = spawned {
            if cmd_status.is_none() {
                cmd_status = target::try_reap(pid);
                if cmd_status.is_some() {
                    rec.live.remove(&pid);
                }
            }
        }
        rec.live.retain(|&p| !target::is_gone(p));
        let now = Instant::now();
        if let (Some(t), Some(d)) = (next_tick, interval) {
            if now >= t {
                let snap = rec.snapshot()?;
                let elapsed = now.duration_since(started).as_secs_f64();
                if live_view {
                    print!("{}", crate::live::frame(&snap, &rec.context()?, elapsed));
                } else {
                    println!(
                        "--- interval {} ({elapsed:.1}s), phase {} ---",
                        ticks + 1,
                        rec.timeline.current().name
                    );
                    print!("{}", report::to_text(&snap.since(&last), &rec.context()?));
                }
                series.push(interval_json(&snap.since(&last), &rec, elapsed));
                last = snap;
                ticks += 1;
                next_tick = Some(t + d);
                if o.count.is_some_and(|c| ticks >= c) {
                    break "interval count reached";
                }
            }
        }
        if deadline.is_some_and(|d| now >= d) {
            break "duration reached";
        }
        if rec.live.is_empty() {
            break "all targets exited";
        }
    };
    drop(listener);
    let _ = fs::remove_file(&sock_path);
    // Its exit event may come before it can be reaped: reap it now.
    if let (Some(pid), None, "all targets exited") = (spawned, cmd_status, why) {
        cmd_status = target::wait(pid);
    }
    // Final read after the targets are gone or the run was stopped.
    rec.trace_mark("detach");
    let snap = rec.snapshot()?;
    let mut j = rec.finish(&snap)?;
    eprintln!("faultscope: {why} after {:.2}s", started.elapsed().as_secs_f64());
    print!("{}", report::to_text(&snap, &rec.context()?));
    print!("{}", crate::findings::attach(&mut j));
    if let Some(p) = &o.json {
        j["end"] = json!(why);
        if o.interval.is_some() {
            // The last, partial interval up to the end of the run.
            series.push(interval_json(&snap.since(&last), &rec, started.elapsed().as_secs_f64()));
            j["intervals"] = json!(series);
        }
        if let Some(st) = cmd_status {
            j["command_exit_status"] = json!(st);
        }
        write_json(p, &j)?;
    }
    // A command still running (Ctrl-C/--duration) is left to run, detached.
    drop(rec);
    Ok(0)
}

/// One interval of the time series: what each process did in it, in the
/// phase that was current at its end.
fn interval_json(delta: &Snapshot, rec: &Recorder, elapsed_s: f64) -> Value {
    let procs: Vec<Value> = delta
        .pids()
        .into_iter()
        .map(|pid| {
            let mut classes = serde_json::Map::new();
            for (name, a) in &rec.avail {
                if let Availability::Measured { class, .. } = a {
                    classes
                        .insert((*name).into(), json!(delta.get(pid, *class).map(|s| s.count).unwrap_or(0)));
                }
            }
            json!({"pid": pid, "counts": classes})
        })
        .collect();
    json!({"t_s": elapsed_s, "phase": rec.timeline.current().name, "processes": procs})
}

/// One `faultscope mark` request: "mark LABEL\n" -> "ok PHASE-NAME\n".
async fn serve_mark(rec: &mut Recorder, stream: tokio::net::UnixStream) -> Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(2), BufReader::new(r).read_line(&mut line))
        .await
        .context("timed out reading the request")??;
    let reply = match marks::parse_request(&line) {
        Ok(label) => {
            let name = rec.mark(&label)?;
            eprintln!("faultscope: phase {name}");
            format!("ok {name}\n")
        }
        Err(e) => format!("error {e}\n"),
    };
    w.write_all(reply.as_bytes()).await?;
    Ok(())
}
