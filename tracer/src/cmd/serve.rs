//! `faultscope serve`: trace until SIGINT/SIGTERM and export OpenMetrics on
//! `http://127.0.0.1:PORT/metrics` (another address only with `--listen`).
//!
//! Targets: `-p PID`; `--comm NAME`, matched by the kernel at each exec (a
//! program exec'd under that comm joins the traced set there, so one that
//! lives less than a tick is counted from its exec), and by a scan of
//! `/proc` at start and each tick for those already running (a child of a
//! traced process, such as Redis' BGSAVE child, is not: it is the parent's
//! phase); `--cgroup PATH`, filtered in the kernel by cgroup id (the cgroup
//! v2 directory's inode number): a process of that cgroup joins the traced
//! set at its first fault, fork or exec, so that one that faults and exits
//! within a tick is counted too; the processes already in the cgroup's
//! `cgroup.procs` are added at start (and each tick, for one that has not
//! had an event yet). A cgroup directory removed and created again (a
//! service restart) is a new id: it is noticed at the next tick.
//!
//! An exec in a traced process starts a phase in the kernel, so that the new
//! program's faults are of its own phase kind (before its first fork).
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
//!
//! An entry of the kernel's stats map is deleted only once nothing can add
//! to it: its process has exited, or its phase is older than the previous
//! tick's current one. (A phase newer than user space knows is kept: it is
//! still counting.)
//!
//! HTTP is hyper's (HTTP/1.1 keep-alive, HEAD, bare-LF requests), with at
//! most 64 connections, a 10 s bound on every read and write, and gzip
//! when the client accepts it.

use crate::kernel::drops::DropReason;
use std::{
    collections::BTreeSet,
    convert::Infallible,
    fs,
    io::Write as _,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::maps::PerCpuHashMap;
use clap::Args;
use faultscope_common::{
    maps::{ClassSetKey, ADOPT_BY_COMM},
    PhaseId, Stat,
};
use http_body_util::Full;
use hyper::{body::Bytes, header, Method, Request, Response, StatusCode};
use tokio::{
    net::{TcpSocket, TcpStream},
    signal::unix::{signal, SignalKind},
};

use super::record::{Filters, Recorder};
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
    /// Trace every process with this comm (at most 15 bytes, as the kernel
    /// keeps it): those running, and each program exec'd under it, from
    /// its exec (repeatable).
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

/// Connections served at once; more are closed at once.
const MAX_CONNECTIONS: usize = 64;

/// The pause after a failed accept (no descriptor left).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The longest a connection waits for a read or a write: an idle or a
/// non-reading client lets go of its slot after this.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Each `--cgroup` directory's id in the kernel's filter (None while
    /// the directory is gone).
    cgroup_ids: Vec<Option<u64>>,
    /// Connections that could not be accepted (no descriptor left).
    accept_errors: u64,
}

impl Serve {
    fn tick(&mut self) -> Result<()> {
        self.rec.drain_events()?;
        for (pid, idx) in std::mem::take(&mut self.rec.adopted) {
            if let Some(dir) = self.opts.cgroup.get(idx as usize).filter(|_| idx != ADOPT_BY_COMM) {
                self.cgroups.insert(pid, dir.display().to_string());
            }
            let comm = self.rec.comms.get(&pid).cloned().unwrap_or_default();
            crate::term::say(&format!("faultscope: tracing pid {pid} ({})", crate::term::safe(&comm)));
        }
        for comm in self.rec.fork_comms.as_mut().map(std::mem::take).unwrap_or_default() {
            self.metrics.fork(&comm);
        }
        self.follow_cgroups()?;
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
        let mut drops = self.rec.drops()?;
        drops.set(DropReason::AcceptErrors, self.accept_errors);
        self.metrics.update_drops(&drops);
        // Folded in: the entries of exited processes, and of phases before
        // the previous one, leave the kernel and our state. Nothing can add
        // to them any more; a phase newer than the timeline knows is still
        // counting, and stays.
        let cur = self.rec.timeline.current().id;
        let prev = std::mem::replace(&mut self.prev_phase, cur);
        let stale = |tgid: u32, phase: PhaseId| gone.contains(&tgid) || phase < prev;
        {
            let m = self.rec.session.bpf.map_mut("STATS").context("no STATS map")?;
            let mut stats: PerCpuHashMap<_, ClassSetKey, Stat> = PerCpuHashMap::try_from(m)?;
            // Only what this tick read: an entry made since is counted at
            // the next tick.
            for k in snap.stat_sets.iter().filter(|k| stale(k.tgid, k.phase)) {
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

    /// A `--cgroup` directory removed and created again has a new id: the
    /// kernel's filter follows it (the old id can have no process left).
    fn follow_cgroups(&mut self) -> Result<()> {
        for (i, dir) in self.opts.cgroup.iter().enumerate() {
            let now = cgroup_id(dir).ok();
            let was = self.cgroup_ids[i];
            if now == was {
                continue;
            }
            if let Some(old) = was {
                let _ = self.rec.session.remove_cgroup(old);
            }
            let d = crate::term::safe(&dir.display().to_string());
            match now {
                Some(id) => {
                    self.rec.session.add_cgroup(id, i as u32)?;
                    let what = if was.is_some() { "was created again" } else { "is back" };
                    crate::term::say(&format!("faultscope: cgroup {d} {what} (id {id}): following it"));
                }
                None => {
                    crate::term::say(&format!("faultscope: cgroup {d} is gone; waiting for it to come back"))
                }
            }
            self.cgroup_ids[i] = now;
        }
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
                crate::term::say(&format!("faultscope: tracing pid {pid} ({})", crate::term::safe(&comm)));
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

/// The kernel keeps a comm in 16 bytes, NUL included.
const COMM_LEN: usize = 16;

/// `--comm NAME` as the kernel's filter holds it, or why it can never
/// match.
fn comm_key(name: &str) -> Result<[u8; COMM_LEN]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= COMM_LEN || b.contains(&0) {
        return Err(Refusal::new(format!(
            "--comm {}: a comm is 1 to {} bytes without NUL (the kernel cuts longer names to that, so this one could never match)",
            crate::term::safe(name),
            COMM_LEN - 1
        ))
        .into());
    }
    let mut k = [0u8; COMM_LEN];
    k[..b.len()].copy_from_slice(b);
    Ok(k)
}

pub async fn run(o: ServeOpts) -> Result<i32> {
    if o.pids.is_empty() && o.comm.is_empty() && o.cgroup.is_empty() {
        return Err(Refusal::new("nothing to trace: give -p PID, --comm NAME or --cgroup PATH").into());
    }
    if !(o.tick.is_finite() && (MIN_TICK_S..=3600.0).contains(&o.tick)) {
        return Err(Refusal::new(format!("--tick {}: give seconds from {MIN_TICK_S} to 3600", o.tick)).into());
    }
    let mut filters = Filters { exec_phase: true, ..Filters::default() };
    for dir in &o.cgroup {
        filters.cgroups.push(cgroup_id(dir)?);
    }
    for c in &o.comm {
        filters.comms.push(comm_key(c)?);
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
    let mut rec = Recorder::start(o.max_stats, DEFAULT_STATS, attrib, &probe, &filters)?;
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
    let cgroup_ids = filters.cgroups.iter().map(|&id| Some(id)).collect();
    let mut s = Serve {
        rec,
        metrics,
        opts: o,
        prev_phase,
        cgroups: Default::default(),
        cgroup_ids,
        accept_errors: 0,
    };
    s.tick()?;
    let listener = socket.listen(1024).map_err(cannot)?;
    let scrape = Arc::new(Mutex::new(Arc::new(Scrape::new(s.metrics.encode()))));
    // The port the kernel gave (`--port 0`).
    let bound = listener.local_addr().unwrap_or(addr);
    crate::term::say(&format!("faultscope: serving OpenMetrics on http://{bound}/metrics"));
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
            accepted = listener.accept() => match accepted {
                // Past the cap a connection is closed at once: idle
                // clients cannot take every descriptor.
                Ok((stream, _)) => {
                    if let Ok(slot) = slots.clone().try_acquire_owned() {
                        let scrape = scrape.clone();
                        tokio::spawn(async move {
                            connection(stream, scrape).await;
                            drop(slot);
                        });
                    }
                }
                // Out of descriptors (EMFILE) or another failure: the
                // pending connection stays queued, so accepting again at
                // once would spin. Counting goes on at the next tick.
                Err(e) => {
                    if s.accept_errors == 0 {
                        crate::term::say(&format!("faultscope: cannot accept a connection: {e} (counting goes on; counted in drops{{reason=\"accept_errors\"}})"));
                    }
                    s.accept_errors += 1;
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            _ = every.tick() => {
                s.tick()?;
                *scrape.lock().unwrap() = Arc::new(Scrape::new(s.metrics.encode()));
            }
        }
    };
    s.rec.trace_mark("detach");
    crate::term::say(&format!("faultscope: {why}; detached"));
    Ok(0)
}

/// One tick's metrics, in each form a client may ask for, each made at the
/// first request that needs it.
struct Scrape {
    openmetrics: Bytes,
    /// The Prometheus text format 0.0.4.
    text: OnceLock<Bytes>,
    /// gzip of [openmetrics, text].
    gzip: [OnceLock<Bytes>; 2],
}

impl Scrape {
    fn new(openmetrics: String) -> Scrape {
        Scrape { openmetrics: Bytes::from(openmetrics), text: OnceLock::new(), gzip: Default::default() }
    }

    fn body(&self, openmetrics: bool, gzip: bool) -> Bytes {
        let plain = |om: bool| {
            if om {
                self.openmetrics.clone()
            } else {
                self.text
                    .get_or_init(|| {
                        Bytes::from(to_text_004(std::str::from_utf8(&self.openmetrics).unwrap_or_default()))
                    })
                    .clone()
            }
        };
        if !gzip {
            return plain(openmetrics);
        }
        self.gzip[!openmetrics as usize]
            .get_or_init(|| {
                let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                let _ = z.write_all(&plain(openmetrics));
                Bytes::from(z.finish().unwrap_or_default())
            })
            .clone()
    }
}

/// Serves one connection (keep-alive) until the client closes it, or a read
/// or a write waits longer than `IO_TIMEOUT`.
async fn connection(stream: TcpStream, scrape: Arc<Mutex<Arc<Scrape>>>) {
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_read_timeout(Some(IO_TIMEOUT));
    io.set_write_timeout(Some(IO_TIMEOUT));
    let io = hyper_util::rt::TokioIo::new(Box::pin(io));
    let service = hyper::service::service_fn(move |req| {
        let current = scrape.lock().unwrap().clone();
        async move { Ok::<_, Infallible>(respond(&req, &current)) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(IO_TIMEOUT)
        .serve_connection(io, service)
        .await;
}

/// `GET`/`HEAD` of `/metrics` (OpenMetrics for a client that asks for it,
/// as Prometheus does, else the Prometheus text format for curl and
/// promtool; gzip when accepted) and of `/` (a page that links to it).
fn respond<B>(req: &Request<B>, scrape: &Scrape) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, ctype: &str, body: Bytes| {
        let mut r = Response::new(Full::new(body));
        *r.status_mut() = status;
        if let Ok(v) = header::HeaderValue::from_str(ctype) {
            r.headers_mut().insert(header::CONTENT_TYPE, v);
        }
        r
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", Bytes::from_static(b"GET or HEAD\n"));
        r.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let accepts = |h: header::HeaderName, what: &str| {
        req.headers().get_all(h).iter().any(|v| v.to_str().is_ok_and(|v| v.contains(what)))
    };
    match req.uri().path() {
        "/metrics" => {
            let om = accepts(header::ACCEPT, "application/openmetrics-text");
            let gzip = accepts(header::ACCEPT_ENCODING, "gzip");
            let ctype = if om {
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            } else {
                "text/plain; version=0.0.4; charset=utf-8"
            };
            let mut r = reply(StatusCode::OK, ctype, scrape.body(om, gzip));
            if gzip {
                r.headers_mut().insert(header::CONTENT_ENCODING, header::HeaderValue::from_static("gzip"));
            }
            r.headers_mut().insert(header::VARY, header::HeaderValue::from_static("Accept, Accept-Encoding"));
            r
        }
        "/" => reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            Bytes::from_static(b"<html><head><title>faultscope</title></head><body><h1>faultscope</h1><p><a href=\"/metrics\">/metrics</a></p></body></html>\n"),
        ),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", Bytes::from_static(b"not found\n")),
    }
}
