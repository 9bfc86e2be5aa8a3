//! `faultscope record`: resolve probes, attach, trace the targets until
//! Ctrl-C, SIGTERM, --duration or the exit of every target, then report and
//! detach.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use clap::Args;
use faultscope_common::maps::{
    LifeEvent, LifeKind, TargetInfo, TARGET_FOLLOW_CHILDREN, TARGET_PENDING_EXEC,
};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    classes::{self, Availability},
    collector::Snapshot,
    error::Refusal,
    kernel::{self, Kallsyms},
    probes::{self, KernelFacts},
    report,
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
    /// Entries of the in-kernel stats map (process x phase x class).
    #[arg(long, default_value_t = 2048)]
    pub max_stats: u32,
    /// Command to start and trace from its exec.
    #[arg(last = true)]
    pub command: Vec<String>,
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
        fs::write(p, b"")
            .map_err(|e| Refusal::new(format!("cannot write {}: {e}", p.display())))?;
    }
    let tracefs = kernel::tracefs()?;
    kernel::require_btf()?;

    let kallsyms = Kallsyms::load().ok();
    let blacklist = kernel::kprobe_blacklist();
    let facts = KernelFacts {
        tracefs: &tracefs,
        kallsyms: kallsyms.as_ref(),
        kprobe_pmu: kernel::has_kprobe_pmu(),
        blacklist: &blacklist,
        lockdown: kernel::lockdown(),
    };
    let resolved = probes::resolve(&facts);
    let mut session = Session::attach(&tracefs, &resolved, o.max_stats)?;
    let avail = classes::availability(
        |p| session.attached(p),
        |p| session.reason(p).map(str::to_string),
    );
    eprintln!("{}", report::measured_line(&avail));

    let follow = if o.follow_children {
        TARGET_FOLLOW_CHILDREN
    } else {
        0
    };
    let mut live: BTreeSet<u32> = BTreeSet::new();
    for &pid in &o.pids {
        session.add_target(
            pid,
            TargetInfo {
                phase: 0,
                flags: follow,
            },
        )?;
        live.insert(pid);
    }
    let mut spawned = None;
    if !o.command.is_empty() {
        let paused = target::spawn_paused(&o.command)?;
        let pid = paused.pid;
        session.add_target(
            pid,
            TargetInfo {
                phase: 0,
                flags: follow | TARGET_PENDING_EXEC,
            },
        )?;
        comms.insert(
            pid,
            o.command[0]
                .rsplit('/')
                .next()
                .unwrap_or_default()
                .to_string(),
        );
        live.insert(pid);
        paused.release();
        spawned = Some(pid);
    }

    let started = Instant::now();
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    let interval = o.interval.map(Duration::from_secs_f64);
    let mut next_tick = interval.map(|d| started + d);
    let deadline = o.duration.map(|d| started + Duration::from_secs_f64(d));
    let mut ticks = 0u64;
    let mut last = Snapshot::default();
    let mut cmd_status = None;
    let why = loop {
        tokio::select! {
            _ = sigint.recv() => break "interrupted",
            _ = sigterm.recv() => break "terminated",
            _ = poll.tick() => {}
        }
        session.flush_logs();
        drain_events(&mut session, &mut live, &mut comms)?;
        if let Some(pid) = spawned {
            if cmd_status.is_none() {
                cmd_status = target::try_reap(pid);
                if cmd_status.is_some() {
                    live.remove(&pid);
                }
            }
        }
        live.retain(|&p| !target::is_gone(p));
        let now = Instant::now();
        if let (Some(t), Some(d)) = (next_tick, interval) {
            if now >= t {
                let snap = Snapshot::read(&session.bpf)?;
                let ctx = context(&session, &avail, &comms, started)?;
                println!(
                    "--- interval {} ({:.1}s) ---",
                    ticks + 1,
                    now.duration_since(started).as_secs_f64()
                );
                print!("{}", report::to_text(&snap.since(&last), &ctx));
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
        if live.is_empty() {
            break "all targets exited";
        }
    };
    // Final read after the targets are gone or the run was stopped.
    drain_events(&mut session, &mut live, &mut comms)?;
    let snap = Snapshot::read(&session.bpf)?;
    let ctx = context(&session, &avail, &comms, started)?;
    eprintln!(
        "faultscope: {why} after {:.2}s",
        started.elapsed().as_secs_f64()
    );
    print!("{}", report::to_text(&snap, &ctx));
    if let Some(p) = &o.json {
        let mut j = report::to_json(&snap, &ctx);
        j["end"] = serde_json::json!(why);
        if let Some(st) = cmd_status {
            j["command_exit_status"] = serde_json::json!(st);
        }
        let tmp = p.with_extension("tmp");
        fs::write(&tmp, serde_json::to_string_pretty(&j)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        fs::rename(&tmp, p).with_context(|| format!("writing {}", p.display()))?;
    }
    // A command still running (Ctrl-C/--duration) is left to run, detached.
    drop(session);
    Ok(0)
}

fn context<'a>(
    session: &'a Session,
    avail: &'a [(&'static str, Availability)],
    comms: &'a BTreeMap<u32, String>,
    started: Instant,
) -> Result<report::Context<'a>> {
    Ok(report::Context {
        kernel: kernel::release(),
        arch: std::env::consts::ARCH,
        availability: avail,
        probes: &session.status,
        comms,
        drops: session.drops()?,
        duration_ns: started.elapsed().as_nanos() as u64,
    })
}

/// Applies lifecycle events: followed children join the live set, exits
/// leave it (and the traced set, so a reused pid is not traced).
fn drain_events(
    session: &mut Session,
    live: &mut BTreeSet<u32>,
    comms: &mut BTreeMap<u32, String>,
) -> Result<()> {
    let mut evs = Vec::new();
    {
        let mut ring = session.events()?;
        while let Some(item) = ring.next() {
            if item.len() >= std::mem::size_of::<LifeEvent>() {
                // SAFETY: the kernel wrote a LifeEvent; read unaligned.
                evs.push(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const LifeEvent) });
            }
        }
    }
    for e in evs {
        let comm = String::from_utf8_lossy(&e.comm)
            .trim_end_matches('\0')
            .to_string();
        match e.kind {
            k if k == LifeKind::Fork as u32 => {
                if e.aux != 0 {
                    live.insert(e.pid);
                    comms.insert(e.pid, comm);
                }
            }
            k if k == LifeKind::Exec as u32 => {
                comms.insert(e.tgid, comm);
            }
            k if k == LifeKind::Exit as u32 => {
                live.remove(&e.tgid);
                session.remove_target(e.tgid);
            }
            _ => {}
        }
    }
    Ok(())
}
