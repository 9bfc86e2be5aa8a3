//! `faultscope serve`: trace until SIGINT/SIGTERM and export OpenMetrics on
//! `http://127.0.0.1:PORT/metrics` (another address only with `--listen`).
//!
//! Targets: `-p PID`; `--comm NAME`, found by scanning `/proc` every tick
//! for processes with that comm that are not traced yet (a child of a
//! traced process, such as Redis' BGSAVE child, is not: it is the parent's
//! phase), so a restarted Redis is followed under its new pid within a
//! tick; `--cgroup PATH`, filtered in the kernel by cgroup id (the cgroup
//! v2 directory's inode number): a process of that cgroup joins the traced
//! set at its first fault, fork or exec, so that one that faults and exits
//! within a tick is counted too; the processes already in the cgroup's
//! `cgroup.procs` are added at start (and each tick, for one that has not
//! had an event yet).
//!
//! A process's `phase_kind` is its own (`ProcessKinds`): the kernel's phase
//! ids are one sequence for all traced processes, but another process's
//! BGSAVE does not make this one's faults `child-alive`, and a restarted
//! Redis starts `before-fork`.
//!
//! Memory is bounded over days: the metric series by classes x phase kinds x
//! comms; per process, the kernel's entries and the last counts of the
//! current and the previous phase only (older phases' entries are folded
//! into the counters and deleted from the kernel's stats map) and its last
//! 16 phase kind changes, and nothing at all once the process has exited;
//! the timeline keeps its last 16 phases.

use std::{
    collections::BTreeSet,
    fs,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::maps::PerCpuHashMap;
use clap::Args;
use faultscope_common::{maps::ClassSetKey, PhaseId, Stat, StatKey};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpSocket, TcpStream},
    signal::unix::{signal, SignalKind},
};

use super::record::Recorder;
use crate::{
    collect::{attribution::AttribOpts, target},
    error::Refusal,
    kernel,
    report::metrics::{to_text_004, BuildInfo, LabelOpts, Metrics, ProcLabels},
};

#[derive(Args, Debug)]
pub struct ServeOpts {
    /// Trace this process (repeatable).
    #[arg(short = 'p', long = "pid")]
    pub pids: Vec<u32>,
    /// Trace every process with this comm, as it starts (repeatable).
    #[arg(long)]
    pub comm: Vec<String>,
    /// Trace the processes of this cgroup v2 directory (repeatable),
    /// filtered in the kernel by cgroup id: from their first event.
    #[arg(long)]
    pub cgroup: Vec<PathBuf>,
    /// Port on 127.0.0.1.
    #[arg(long, default_value_t = 9853)]
    pub port: u16,
    /// Listen on this address instead (e.g. 0.0.0.0:9853): explicit only.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Add a pid label to the fault counters and histograms (unbounded).
    #[arg(long)]
    pub label_pid: bool,
    /// Add a cgroup label to the fault counters (one series per cgroup).
    #[arg(long)]
    pub label_cgroup: bool,
    /// How often to read the kernel's counts and look for new targets.
    #[arg(long, default_value_t = 1.0)]
    pub tick: f64,
    /// Entries of the in-kernel stats map (process x phase x set of
    /// classes), a per-CPU map: by default the most that fit in 128 MiB on
    /// this machine's CPUs, at most 4096; refused past 1 GiB.
    #[arg(long)]
    pub max_stats: Option<u32>,
    /// How probes on kernel functions attach (see `record --backend`).
    #[arg(long, value_enum, default_value_t = crate::kernel::probes::BackendChoice::Auto)]
    pub backend: crate::kernel::probes::BackendChoice,
}

/// The shortest tick: each reads every map and /proc (a shorter one would
/// keep a CPU busy for nothing Prometheus scrapes).
const MIN_TICK_S: f64 = 0.1;

/// Scrapes served at once; more connections are closed at once.
const MAX_CONNECTIONS: usize = 64;

/// serve's most stats entries by default.
pub const DEFAULT_STATS: u32 = 4096;

/// Phases the timeline keeps.
const KEEP_PHASES: usize = 16;

struct Serve {
    rec: Recorder,
    metrics: Metrics,
    opts: ServeOpts,
    /// Phases whose kernel entries are kept (the current and the one before).
    prev_phase: PhaseId,
    /// Each traced pid's cgroup (with --cgroup).
    cgroups: std::collections::BTreeMap<u32, String>,
}

impl Serve {
    fn tick(&mut self) -> Result<()> {
        self.rec.drain_events()?;
        for (pid, idx) in std::mem::take(&mut self.rec.adopted) {
            if let Some(dir) = self.opts.cgroup.get(idx as usize) {
                self.cgroups.insert(pid, dir.display().to_string());
            }
            let comm = self.rec.comms.get(&pid).cloned().unwrap_or_default();
            super::say(&format!("faultscope: tracing pid {pid} ({})", crate::report::text::safe(&comm)));
        }
        for comm in self.rec.fork_comms.as_mut().map(std::mem::take).unwrap_or_default() {
            self.metrics.fork(&comm);
        }
        self.discover()?;
        // Exited: seen by the kernel's exit event (out of `live`) or gone
        // from /proc.
        let gone: BTreeSet<u32> = self
            .rec
            .comms
            .keys()
            .copied()
            .filter(|p| !self.rec.live.contains(p) || target::is_gone(*p))
            .collect();
        let snap = self.rec.snapshot()?;
        let rec = &self.rec;
        let kinds = rec.kinds.as_ref().expect("serve keeps each process's phase kinds");
        let cg = &self.cgroups;
        self.metrics.update(
            &snap,
            |pid, ph| kinds.kind(pid, ph),
            |pid| rec.comms.get(&pid).map(|c| ProcLabels { comm: c.clone(), cgroup: cg.get(&pid).cloned() }),
        );
        self.metrics.update_drops(&self.rec.session.drops()?);
        // Folded in: the entries of exited processes, and of phases before
        // the previous one, leave the kernel and our state.
        let cur = self.rec.timeline.current().id;
        let prev = std::mem::replace(&mut self.prev_phase, cur);
        let stale = |k: &StatKey| gone.contains(&k.tgid) || (k.phase != cur && k.phase != prev);
        {
            let m = self.rec.session.bpf.map_mut("STATS").context("no STATS map")?;
            let mut stats: PerCpuHashMap<_, ClassSetKey, Stat> = PerCpuHashMap::try_from(m)?;
            // Only what this tick read: an entry made since (a phase user
            // space does not know yet) is counted at the next tick.
            for k in snap.stat_sets.iter().filter(|k| stale(&StatKey::new(k.tgid, k.phase, 0))) {
                let _ = stats.remove(k);
            }
        }
        self.metrics.forget(stale);
        for pid in &gone {
            self.rec.live.remove(pid);
            self.rec.comms.remove(pid);
            self.rec.lifetimes.remove(pid);
            self.rec.accounting.remove(pid);
            self.cgroups.remove(pid);
            if let Some(k) = self.rec.kinds.as_mut() {
                k.forget(*pid);
            }
            self.rec.session.remove_target(*pid);
        }
        self.rec.timeline.keep_last(KEEP_PHASES);
        Ok(())
    }

    /// New processes of `--comm` and `--cgroup`.
    fn discover(&mut self) -> Result<()> {
        let mut new: Vec<(u32, Option<String>)> = Vec::new();
        if !self.opts.comm.is_empty() {
            for pid in all_pids() {
                if self.rec.live.contains(&pid) {
                    continue;
                }
                if target::comm_of(pid).is_some_and(|c| self.opts.comm.contains(&c))
                    && !parent_of(pid).is_some_and(|pp| self.rec.live.contains(&pp))
                {
                    new.push((pid, None));
                }
            }
        }
        for dir in &self.opts.cgroup {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if !self.rec.live.contains(&pid) && !new.iter().any(|(p, _)| *p == pid) {
                    new.push((pid, Some(dir.display().to_string())));
                }
            }
        }
        for (pid, cg) in new {
            let Some(comm) = target::comm_of(pid) else { continue };
            // A thread id is not a process.
            if target::check_pid(pid).is_err() {
                continue;
            }
            if self.rec.add(pid, 0, comm.clone()).is_ok() {
                super::say(&format!("faultscope: tracing pid {pid} ({})", crate::report::text::safe(&comm)));
                if let Some(cg) = cg {
                    self.cgroups.insert(pid, cg);
                }
            }
        }
        Ok(())
    }
}

/// A cgroup v2 directory's id: its inode number (what
/// `bpf_get_current_cgroup_id` returns for a task in it).
fn cgroup_id(dir: &std::path::Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let v2 = fs::metadata(dir.join("cgroup.procs")).is_ok_and(|m| m.is_file()) && is_cgroup2(dir);
    if !v2 {
        return Err(Refusal::new(format!("{}: not a cgroup v2 directory", dir.display())).into());
    }
    Ok(fs::metadata(dir).with_context(|| dir.display().to_string())?.ino())
}

/// Whether `dir` lies on a cgroup2 file system (a v1 hierarchy has
/// `cgroup.procs` too, and other ids).
fn is_cgroup2(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC }
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

pub async fn run(o: ServeOpts) -> Result<i32> {
    if o.pids.is_empty() && o.comm.is_empty() && o.cgroup.is_empty() {
        return Err(Refusal::new("nothing to trace: give -p PID, --comm NAME or --cgroup PATH").into());
    }
    if !(o.tick.is_finite() && (MIN_TICK_S..=3600.0).contains(&o.tick)) {
        return Err(Refusal::new(format!("--tick {}: give seconds from {MIN_TICK_S} to 3600", o.tick)).into());
    }
    let mut cgroup_ids = Vec::new();
    for dir in &o.cgroup {
        cgroup_ids.push(cgroup_id(dir)?);
    }
    kernel::require_root()?;
    let mut comms = Vec::new();
    for &pid in &o.pids {
        comms.push((pid, target::check_pid(pid)?));
    }
    let addr = o.listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], o.port)));
    // Bound now, so that a taken port fails before the slow attach; listening
    // only once measuring, so that a client that can connect (a test, a
    // readiness probe) knows that what runs from then on is counted.
    let cannot = |e: std::io::Error| Refusal::new(format!("cannot listen on {addr}: {e}"));
    let socket = if addr.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }.map_err(cannot)?;
    socket.set_reuseaddr(true).map_err(cannot)?;
    socket.bind(addr).map_err(cannot)?;
    let attrib = AttribOpts {
        sites: Default::default(),
        stacks: Default::default(),
        no_mappings: true,
        ..AttribOpts::default()
    };
    let probe = super::record::ProbeOpts { backend: o.backend, prog_stats: false };
    let mut rec = Recorder::start(o.max_stats, DEFAULT_STATS, attrib, &probe, &cgroup_ids)?;
    rec.fork_comms = Some(Vec::new());
    rec.kinds = Some(Default::default());
    for (pid, comm) in comms {
        rec.add(pid, 0, comm)?;
    }
    rec.attach_children(&o.pids)?;
    rec.trace_mark("attach");
    let info = BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: kernel::release(),
        arch: std::env::consts::ARCH.to_string(),
        backend: rec.session.fault_path_backend().to_string(),
    };
    let mut metrics = Metrics::new(&info, &rec.avail, LabelOpts { pid: o.label_pid, cgroup: o.label_cgroup });
    for comm in o.comm.iter().chain(rec.comms.values()) {
        metrics.declare(comm);
    }
    let prev_phase = rec.timeline.current().id;
    let tick = Duration::from_secs_f64(o.tick);
    let mut s = Serve { rec, metrics, opts: o, prev_phase, cgroups: Default::default() };
    s.tick()?;
    let listener = socket.listen(1024).map_err(cannot)?;
    let text = Arc::new(Mutex::new(s.metrics.encode()));
    // The port the kernel gave (`--port 0`).
    let bound = listener.local_addr().unwrap_or(addr);
    super::say(&format!("faultscope: serving OpenMetrics on http://{bound}/metrics"));
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut every = tokio::time::interval(tick);
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let why = loop {
        tokio::select! {
            _ = sigint.recv() => break "interrupted",
            _ = sigterm.recv() => break "terminated",
            _ = sighup.recv() => break "hung up",
            Ok((stream, _)) = listener.accept() => {
                // Past the cap a connection is closed at once: idle
                // clients cannot take every descriptor.
                if let Ok(slot) = slots.clone().try_acquire_owned() {
                    let text = text.clone();
                    tokio::spawn(async move {
                        respond(stream, text).await;
                        drop(slot);
                    });
                }
            }
            _ = every.tick() => {
                s.tick()?;
                *text.lock().unwrap() = s.metrics.encode();
            }
        }
    };
    s.rec.trace_mark("detach");
    super::say(&format!("faultscope: {why}; detached"));
    Ok(0)
}

/// One HTTP/1.1 exchange: `GET /metrics` gets the last tick's metrics,
/// anything else 404; the connection is closed after the reply.
async fn respond(mut stream: TcpStream, text: Arc<Mutex<String>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let read = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), read).await.is_err() {
        return;
    }
    let head = String::from_utf8_lossy(&buf);
    let target = head.lines().next().unwrap_or("").trim_end();
    let head_only = target.starts_with("HEAD ");
    let target =
        target.strip_prefix("HEAD ").map(|t| format!("GET {t}")).unwrap_or_else(|| target.to_string());
    let target = format!("{target} ");
    let target = target.as_str();
    // OpenMetrics for who asks for it (Prometheus does), else the
    // Prometheus text format (curl, promtool).
    let om = head
        .lines()
        .any(|l| l.to_ascii_lowercase().starts_with("accept:") && l.contains("application/openmetrics-text"));
    let reply = if target.starts_with("GET /metrics ") || target.starts_with("GET /metrics?") {
        let body = text.lock().unwrap().clone();
        let (body, ctype) = if om {
            (body, "application/openmetrics-text; version=1.0.0; charset=utf-8")
        } else {
            (to_text_004(&body), "text/plain; version=0.0.4; charset=utf-8")
        };
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    } else if target.starts_with("GET / ") {
        let body = "<html><head><title>faultscope</title></head><body><h1>faultscope</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n";
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    } else {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\nConnection: close\r\n\r\nnot found\n".to_string()
    };
    // HEAD: the headers alone.
    let reply = if head_only {
        reply.split_once("\r\n\r\n").map_or(reply.clone(), |(h, _)| format!("{h}\r\n\r\n"))
    } else {
        reply
    };
    // A client that does not read gets 10 s.
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.write_all(reply.as_bytes())).await;
    let _ = stream.shutdown().await;
}
