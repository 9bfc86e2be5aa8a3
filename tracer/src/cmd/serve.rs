//! `faultscope serve`: trace until SIGINT/SIGTERM and export OpenMetrics on
//! `http://127.0.0.1:PORT/metrics` (another address only with `--listen`).
//!
//! Targets: `-p PID`, `--comm NAME` and `--cgroup PATH`, as record has
//! them (`collect::select`).
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
//! most 64 connections: with all 64 taken, a new connection ends the one
//! that has waited longest for a request (idle, or its headers still
//! incomplete), so clients that hold connections without asking cannot
//! keep a scrape out (counted in
//! `faultscope_http_connections_dropped_total{reason="evicted"}`). A
//! request's headers must be in within 5 s of the start of the wait for
//! them, and every read and write is bounded by 10 s. The format and the
//! encoding are negotiated by RFC 9110 (`Accept`, `Accept-Encoding`:
//! q-values, wildcards): OpenMetrics or the Prometheus text format 0.0.4,
//! gzip or not.

use crate::kernel::drops::DropReason;
use std::{
    collections::{BTreeMap, BTreeSet},
    convert::Infallible,
    fmt::Write as _,
    io::Write as _,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, OnceLock},
    task::{ready, Context, Poll},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use aya::maps::PerCpuHashMap;
use clap::Args;
use faultscope_common::{maps::ClassSetKey, PhaseId, Stat};
use http_body_util::Full;
use hyper::{
    body::{Body, Bytes, Frame, SizeHint},
    header, Method, Request, Response, StatusCode,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpSocket, TcpStream},
    signal::unix::{signal, SignalKind},
    task::JoinHandle,
};

use crate::collect::engine::{Filters, ProbeOpts, Recorder};
use crate::{
    collect::{
        attribution::AttribOpts,
        collector::Snapshot,
        container::{Container, Containers},
        select::{SelectOpts, Selection},
        target,
    },
    error::Refusal,
    kernel,
    report::metrics::{to_text_004, BuildInfo, LabelOpts, Metrics, ProcLabels},
};

#[derive(Args, Debug)]
pub struct ServeOpts {
    /// Trace this process (repeatable).
    #[arg(short = 'p', long = "pid")]
    pub pids: Vec<u32>,
    #[command(flatten)]
    pub select: SelectOpts,
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
    /// Add container_id, pod_uid, qos (cAdvisor's names) and service
    /// labels to the fault counters and histograms, read from each
    /// process's cgroup v2 path (Kubernetes' systemd and cgroupfs drivers,
    /// Docker, Podman, systemd services); at most --max-containers distinct
    /// places, the rest `other`.
    #[arg(long)]
    pub label_container: bool,
    /// The most distinct containers, pods and services labelled.
    #[arg(long, default_value_t = 256)]
    pub max_containers: usize,
    /// Have the kernel account each of faultscope's programs' runs and
    /// run time (faultscope_program_runs_total, _run_seconds_total) for
    /// this run: two clock reads per program run.
    #[arg(long)]
    pub prog_stats: bool,
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
    /// Which faults are timed (see `record --latency`). A daemon runs on
    /// every fault of the processes it serves for as long as they live:
    /// by default one in 16 is timed, which keeps the latency histograms'
    /// shape at a fraction of the timing's cost (docs/cost.md); the counts
    /// stay exact. `faultscope_latency_sample_every` says which.
    #[arg(long, value_name = "all|sample=N|off", value_parser = crate::kernel::latency::parse, default_value = "sample=16")]
    pub latency: crate::kernel::latency::LatencyTier,
}

/// The shortest tick: each reads every map and /proc (a shorter one would
/// keep a CPU busy for nothing Prometheus scrapes).
const MIN_TICK_S: f64 = 0.1;

/// Connections served at once. With all of them taken, a new one makes
/// room by ending the one that has waited longest for a request
/// ([`victim`]); only when every one is replying is the new one closed at
/// once. Either way serve holds at most this many connections' descriptors.
const MAX_CONNECTIONS: usize = 64;

/// The pause after a failed accept (no descriptor left).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The longest a connection waits for a request's headers to be complete,
/// from its accept or the end of its last reply (hyper's header read
/// timeout): an idle client, or one that trickles its headers a byte at a
/// time, lets go of its slot after this even when no new connection evicts
/// it. Prometheus sends a request's headers at once.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a connection waits for a read or a write: a non-reading
/// client lets go of its slot after this, and a reply not written out
/// within it may be evicted ([`victim`]).
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// serve's most stats entries by default.
pub const DEFAULT_STATS: u32 = 4096;

/// Phases the timeline keeps.
const KEEP_PHASES: usize = 16;

struct Serve {
    rec: Recorder,
    metrics: Metrics,
    /// Phases whose kernel entries are kept (the current and the one before).
    prev_phase: PhaseId,
    /// `--comm` and `--cgroup`.
    sel: Selection,
    /// Connections that could not be accepted (no descriptor left).
    accept_errors: u64,
    /// (process, phase) counts held back at the last tick: their phase was
    /// newer than the lifecycle events read.
    waiting: BTreeSet<(u32, PhaseId)>,
    /// Each process's container, pod or service (`--label-container`).
    containers: Option<Containers>,
}

impl Serve {
    fn tick(&mut self) -> Result<()> {
        self.rec.drain_events()?;
        self.sel.tick(&mut self.rec)?;
        for comm in self.rec.fork_comms.as_mut().map(std::mem::take).unwrap_or_default() {
            self.metrics.fork(&comm);
        }
        // Exited: seen by the kernel's exit event (out of `live`) or gone
        // from /proc.
        let gone: BTreeSet<u32> = self
            .rec
            .comms
            .keys()
            .copied()
            .filter(|p| (self.rec.system_wide.is_none() && !self.rec.live.contains(p)) || target::is_gone(*p))
            .collect();
        let snap = self.rec.snapshot()?;
        // Under -a: every process is counted, and named once it faults.
        self.rec.name_processes(&snap);
        // The events of every phase change made before the read: a fault
        // counted in a phase has seen its change, whose event the kernel
        // sends just after it.
        self.rec.drain_events()?;
        // A CPU's pending slot still holds counts of these: the kernel moves
        // them into its maps later, so they are folded in at a later tick.
        let gone: BTreeSet<u32> =
            gone.into_iter().filter(|p| !snap.pending.iter().any(|(t, _)| t == p)).collect();
        let hold = held_back(&snap, self.rec.timeline.current().id, &gone, &self.waiting);
        let rec = &self.rec;
        let kinds = rec.kinds.as_ref().expect("serve keeps each process's phase kinds");
        let cg = &self.sel.cgroup_of;
        // Read once a process is named, while it is still there to read.
        let places: BTreeMap<u32, Container> = match self.containers.as_mut() {
            Some(cs) => rec
                .comms
                .keys()
                .map(|&pid| (pid, cs.of(pid, rec.containers.get(&pid).unwrap_or(&Container::default()))))
                .collect(),
            None => BTreeMap::new(),
        };
        self.metrics.update(
            &snap,
            |pid, ph| (!hold.contains(&(pid, ph))).then(|| kinds.kind(pid, ph)),
            |pid| {
                rec.comms.get(&pid).map(|c| ProcLabels {
                    comm: c.clone(),
                    cgroup: cg.get(&pid).cloned(),
                    container: places.get(&pid).cloned(),
                })
            },
        );
        self.waiting = hold;
        let mut drops = self.rec.drops()?;
        drops.set(DropReason::AcceptErrors, self.accept_errors);
        self.metrics.update_drops(&drops);
        self.metrics.update_flow(&snap.flow);
        let session = &self.rec.session;
        self.metrics.update_own(&session.status, session.program_costs()?.as_deref(), &session.map_fill());
        // A read torn by a flush gave `update` none of its counts: nothing
        // it read may leave the kernel or our state before a clean read
        // has counted it.
        if snap.torn {
            return Ok(());
        }
        // Folded in: the entries of exited processes, and of phases before
        // the previous one, leave the kernel and our state. Nothing can add
        // to them any more; a phase newer than the timeline knows is still
        // counting, and stays.
        let cur = self.rec.timeline.current().id;
        let prev = std::mem::replace(&mut self.prev_phase, cur);
        let stale = |tgid: u32, phase: PhaseId| {
            (gone.contains(&tgid) || phase < prev) && !snap.pending.contains(&(tgid, phase))
        };
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
            self.rec.forget(*pid);
            self.sel.forget(*pid);
            if let Some(cs) = self.containers.as_mut() {
                cs.forget(*pid);
            }
            if let Some(k) = self.rec.kinds.as_mut() {
                k.forget(*pid);
            }
            self.rec.session.remove_target(*pid);
        }
        self.rec.timeline.keep_last(KEEP_PHASES);
        Ok(())
    }
}

/// The (process, phase) counts to leave for a later tick: a phase newer than
/// the last one user space knows began after the events were read (its event
/// was still on its way), so its kind is not known yet, and a counter cannot
/// take back counts given to the wrong kind. Counted at the next tick all the
/// same (a lost event leaves the newest known kind), and at once for a
/// process that is gone (its entries are deleted at this tick).
fn held_back(
    snap: &Snapshot,
    known: PhaseId,
    gone: &BTreeSet<u32>,
    waited: &BTreeSet<(u32, PhaseId)>,
) -> BTreeSet<(u32, PhaseId)> {
    snap.stats
        .keys()
        .map(|k| (k.tgid, k.phase))
        .filter(|&(tgid, ph)| ph > known && !gone.contains(&tgid) && !waited.contains(&(tgid, ph)))
        .collect()
}

pub async fn run(o: ServeOpts) -> Result<i32> {
    if o.pids.is_empty() && o.select.is_empty() {
        return Err(Refusal::new("nothing to trace: give -p PID, --comm NAME, --cgroup PATH or -a").into());
    }
    if o.select.all {
        super::record::system_wide_only(&o.pids, &o.select, false, false, &mut AttribOpts::default())?;
    }
    if !(o.tick.is_finite() && (MIN_TICK_S..=3600.0).contains(&o.tick)) {
        return Err(Refusal::new(format!("--tick {}: give seconds from {MIN_TICK_S} to 3600", o.tick)).into());
    }
    let filters = Filters { exec_phase: true, ..o.select.filters()? };
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
    let mut s = attach(&o, filters, comms)?;
    s.tick()?;
    let listener = socket.listen(1024).map_err(cannot)?;
    // The port the kernel gave (`--port 0`).
    let bound = listener.local_addr().unwrap_or(addr);
    crate::term::say(&format!("faultscope: serving OpenMetrics on http://{bound}/metrics"));
    let why = serve_until_signal(&mut s, listener, Duration::from_secs_f64(o.tick)).await?;
    s.rec.trace_mark("detach");
    crate::term::say(&format!("faultscope: {why}; detached"));
    Ok(0)
}

/// Attaches to what `o` selects (`comms`: the pids asked for, checked)
/// and reads once.
fn attach(o: &ServeOpts, filters: Filters, comms: Vec<(u32, String)>) -> Result<Serve> {
    let attrib = AttribOpts {
        sites: Default::default(),
        stacks: Default::default(),
        no_mappings: true,
        ..AttribOpts::default()
    };
    let probe =
        ProbeOpts { backend: o.backend, prog_stats: o.prog_stats, latency: Some(o.latency), quiet: false };
    let default_stats = if o.select.all { super::record::SYSTEM_WIDE_STATS } else { DEFAULT_STATS };
    let mut rec = Recorder::start(o.max_stats, default_stats, attrib, &probe, &filters)?;
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
        latency: rec.latency,
    };
    let mut metrics = Metrics::new(
        &info,
        &rec.avail,
        LabelOpts { pid: o.label_pid, cgroup: o.label_cgroup, container: o.label_container },
    );
    for comm in o.select.comm.iter().chain(rec.comms.values()) {
        metrics.declare(comm);
    }
    let prev_phase = rec.timeline.current().id;
    let sel = Selection::new(o.select.clone(), &filters);
    let containers = o.label_container.then(|| Containers::new(o.max_containers));
    Ok(Serve { rec, metrics, prev_phase, sel, accept_errors: 0, waiting: BTreeSet::new(), containers })
}

/// Serves scrapes and ticks until a signal; says which.
async fn serve_until_signal(s: &mut Serve, listener: TcpListener, tick: Duration) -> Result<&'static str> {
    let mut conns = Conns::default();
    let scrape = Arc::new(Mutex::new(Arc::new(Scrape::new(with_http(s.metrics.encode(), &conns)))));
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut every = tokio::time::interval(tick);
    Ok(loop {
        tokio::select! {
            _ = sigint.recv() => break "interrupted",
            _ = sigterm.recv() => break "terminated",
            _ = sighup.recv() => break "hung up",
            accepted = listener.accept() => match accepted {
                // At the cap a connection that waits for a request makes
                // room (else the new one is closed at once): clients that
                // hold connections can neither take every descriptor nor
                // keep a scrape out.
                Ok((stream, _)) => {
                    if conns.make_room().await {
                        conns.spawn(stream, scrape.clone());
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
                *scrape.lock().unwrap() = Arc::new(Scrape::new(with_http(s.metrics.encode(), &conns)));
            }
        }
    })
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

/// Serves one connection (keep-alive) until the client closes it, its
/// request's headers take longer than `HEADER_TIMEOUT`, a read or a write
/// waits longer than `IO_TIMEOUT`, or it is evicted (its task aborted).
/// What it is doing is kept in `activity` for the choice of a [`victim`].
async fn connection(stream: TcpStream, scrape: Arc<Mutex<Arc<Scrape>>>, activity: Shared) {
    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
    io.set_read_timeout(Some(IO_TIMEOUT));
    io.set_write_timeout(Some(IO_TIMEOUT));
    let io = hyper_util::rt::TokioIo::new(Tracked { io: Box::pin(io), activity: activity.clone() });
    let service = hyper::service::service_fn(move |req| {
        lock(&activity).replying();
        let current = scrape.lock().unwrap().clone();
        let reply = respond(&req, &current).map(|body| Reply { body, activity: activity.clone() });
        async move { Ok::<_, Infallible>(reply) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(io, service)
        .await;
}

/// What a connection is doing, for the choice of one to evict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Doing {
    /// Waiting for a request, or for the rest of its headers: idle.
    Waiting,
    /// Its request's headers are in: its reply is made and written out.
    Replying,
}

/// A connection's [`Doing`], since when, and whether hyper has taken all of
/// its reply's body (the reply is written out at the next flush).
struct Activity {
    doing: Doing,
    since: Instant,
    body_taken: bool,
}

impl Activity {
    fn new() -> Activity {
        Activity { doing: Doing::Waiting, since: Instant::now(), body_taken: false }
    }

    /// A request's headers are in.
    fn replying(&mut self) {
        *self = Activity { doing: Doing::Replying, ..Activity::new() };
    }

    /// A flush went through: once the body was taken, the reply is out and
    /// the connection waits for its next request.
    fn flushed(&mut self) {
        if self.doing == Doing::Replying && self.body_taken {
            *self = Activity::new();
        }
    }
}

type Shared = Arc<Mutex<Activity>>;

/// A connection's [`Activity`] (a task that panicked leaves it as it was).
fn lock(a: &Shared) -> MutexGuard<'_, Activity> {
    a.lock().unwrap_or_else(|e| e.into_inner())
}

/// The connection to end for a new one when all `MAX_CONNECTIONS` are
/// taken, from each one's (doing, since): the one that has waited longest
/// for a request (idle, or its headers incomplete), where a reply that has
/// not been written out within `IO_TIMEOUT` (a client that does not read
/// it) counts as waiting since its request. None when every connection is
/// replying, and not for long.
fn victim(conns: &[(Doing, Instant)], now: Instant) -> Option<usize> {
    conns
        .iter()
        .enumerate()
        .filter(|(_, &(doing, since))| {
            doing == Doing::Waiting || now.saturating_duration_since(since) > IO_TIMEOUT
        })
        .min_by_key(|(_, &(_, since))| since)
        .map(|(i, _)| i)
}

/// serve's connections, each a task and its [`Activity`] (at most
/// `MAX_CONNECTIONS` of them unfinished), and the connections closed to
/// keep to that.
#[derive(Default)]
struct Conns {
    live: Vec<(JoinHandle<()>, Shared)>,
    /// Ended to make room for a new one.
    evicted: u64,
    /// New ones closed at once: every connection was replying.
    refused: u64,
}

impl Conns {
    /// Room for one more connection: the ended ones are forgotten and, with
    /// all `MAX_CONNECTIONS` taken, the [`victim`] is ended, and awaited,
    /// so that its descriptor is closed before another is taken. False when
    /// there is none to end.
    async fn make_room(&mut self) -> bool {
        self.live.retain(|(task, _)| !task.is_finished());
        if self.live.len() < MAX_CONNECTIONS {
            return true;
        }
        let now = Instant::now();
        let doing: Vec<(Doing, Instant)> = self
            .live
            .iter()
            .map(|(_, a)| {
                let a = lock(a);
                (a.doing, a.since)
            })
            .collect();
        let Some(i) = victim(&doing, now) else {
            self.refused += 1;
            return false;
        };
        let (task, _) = self.live.swap_remove(i);
        task.abort();
        // Cancelled: its future, and so its stream, dropped.
        let _ = task.await;
        self.evicted += 1;
        true
    }

    fn spawn(&mut self, stream: TcpStream, scrape: Arc<Mutex<Arc<Scrape>>>) {
        let activity = Arc::new(Mutex::new(Activity::new()));
        let task = tokio::spawn(connection(stream, scrape, activity.clone()));
        self.live.push((task, activity));
    }
}

/// The OpenMetrics text of the metrics (ending in `# EOF`) with serve's own
/// count of the connections it closed to stay within `MAX_CONNECTIONS`
/// before its end.
fn with_http(mut openmetrics: String, conns: &Conns) -> String {
    if openmetrics.ends_with("# EOF\n") {
        openmetrics.truncate(openmetrics.len() - "# EOF\n".len());
    }
    let name = "faultscope_http_connections_dropped";
    let _ = write!(
        openmetrics,
        "# HELP {name} Connections serve closed to keep to {MAX_CONNECTIONS} at once: evicted (one that waited \
         longest for a request, idle or its headers incomplete, ended for a new one), refused (a new one, \
         every other replying).\n\
         # TYPE {name} counter\n\
         {name}_total{{reason=\"evicted\"}} {}\n\
         {name}_total{{reason=\"refused\"}} {}\n\
         # EOF\n",
        conns.evicted, conns.refused
    );
    openmetrics
}

/// A connection's stream, which notes the end of each reply: a flush that
/// goes through once hyper has taken all of the reply's body (so all of it
/// is written).
struct Tracked<S> {
    io: S,
    activity: Shared,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let r = ready!(Pin::new(&mut this.io).poll_flush(cx));
        if r.is_ok() {
            lock(&this.activity).flushed();
        }
        Poll::Ready(r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A reply's body. hyper drops it once it has taken all of it (for HEAD,
/// none), after which the reply is written out at the next flush.
struct Reply {
    body: Full<Bytes>,
    activity: Shared,
}

impl Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Reply {
    fn drop(&mut self) {
        lock(&self.activity).body_taken = true;
    }
}

/// `GET`/`HEAD` of `/metrics` (OpenMetrics for a client that asks for it,
/// as Prometheus does, else the Prometheus text format for curl and
/// promtool; gzip when accepted: [`wants_openmetrics`], [`wants_gzip`])
/// and of `/` (a page that links to it).
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
    match req.uri().path() {
        "/metrics" => {
            let om = wants_openmetrics(members(req.headers(), header::ACCEPT).as_deref());
            let gzip = wants_gzip(members(req.headers(), header::ACCEPT_ENCODING).as_deref());
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

/// One member of a header's comma-separated list (RFC 9110 5.6.1): its
/// value (a media range or a content coding, lowercased), its parameters
/// before the weight (names lowercased, values unquoted), and its weight in
/// thousandths (1000 without one).
#[derive(Debug, PartialEq)]
struct Member {
    value: String,
    params: Vec<(String, String)>,
    q: u16,
}

/// The members of every line of header `name`, in order; None when the
/// request has no such header. A member with a malformed weight (`q=2`,
/// `q=0.0001`, `q="1"`) or parameter is left out, as are empty ones and
/// lines that are not visible ASCII.
fn members(headers: &header::HeaderMap, name: header::HeaderName) -> Option<Vec<Member>> {
    let mut lines = headers.get_all(name).iter().peekable();
    lines.peek()?;
    Some(
        lines
            .filter_map(|v| v.to_str().ok())
            .flat_map(|l| split_unquoted(l, ','))
            .filter_map(member)
            .collect(),
    )
}

/// `s` split at each `sep` outside a quoted string (where `\` quotes the
/// next character).
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let (mut out, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&s[start..]);
    out
}

/// A member of a list: `value *( OWS ";" OWS [ name "=" value ] )`, where
/// the parameter `q` is the weight and ends it (RFC 9110 12.4.2: what
/// follows is no parameter of the media type).
fn member(s: &str) -> Option<Member> {
    let mut parts = split_unquoted(s, ';').into_iter();
    let value = parts.next()?.trim().to_ascii_lowercase();
    if value.is_empty() {
        return None;
    }
    let mut params = Vec::new();
    for p in parts.map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = p.split_once('=')?;
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "q" {
            return Some(Member { value, params, q: qvalue(v)? });
        }
        params.push((k, unquote(v)));
    }
    Some(Member { value, params, q: 1000 })
}

/// A parameter's value, a token or a quoted string.
fn unquote(v: &str) -> String {
    let Some(inner) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else { return v.to_string() };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        out.push(if c == '\\' { chars.next().unwrap_or(c) } else { c });
    }
    out
}

/// A q-value (RFC 9110 12.4.2: `0` to `1` with at most three decimals) in
/// thousandths; None when malformed.
fn qvalue(s: &str) -> Option<u16> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths: u16 = format!("{frac:0<3}").parse().ok()?;
    match int {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// A form of `/metrics`: its media type, and the versions a client may
/// ask it by.
struct Format {
    media: &'static str,
    versions: &'static [&'static str],
}

/// OpenMetrics 1.0; Prometheus before 2.43 asks for it as `version=0.0.1`
/// (the same text, as client_golang serves both).
const OPENMETRICS: Format = Format { media: "application/openmetrics-text", versions: &["1.0.0", "0.0.1"] };
const TEXT_004: Format = Format { media: "text/plain", versions: &["0.0.4"] };

/// How specifically the media range `range` names `f`: None when it does
/// not match; 0 for `*/*`, 1 for `type/*`, 2 and its parameters' count for
/// the type itself. Of the parameters, `version` must be one of `f`'s and
/// `charset` UTF-8; others (Prometheus' `escaping`) ask for nothing that
/// faultscope's names and labels would not meet.
fn specificity(range: &Member, f: &Format) -> Option<usize> {
    let (ty, sub) = range.value.split_once('/')?;
    let (fty, fsub) = f.media.split_once('/')?;
    let level = match (ty, sub) {
        ("*", "*") => 0,
        (t, "*") if t == fty => 1,
        (t, s) if t == fty && s == fsub => 2 + range.params.len(),
        _ => return None,
    };
    let fits = range.params.iter().all(|(k, v)| match k.as_str() {
        "version" => f.versions.contains(&v.as_str()),
        "charset" => v.eq_ignore_ascii_case("utf-8"),
        _ => true,
    });
    fits.then_some(level)
}

/// The weight `accept` gives `f` (RFC 9110 12.5.1): that of the most
/// specific range that matches it (the highest of equally specific ones),
/// 0 when none does; and whether that range names f's type itself.
fn weight(accept: &[Member], f: &Format) -> (u16, bool) {
    accept
        .iter()
        .filter_map(|m| Some((specificity(m, f)?, m.q)))
        .max()
        .map_or((0, false), |(level, q)| (q, level >= 2))
}

/// Whether `/metrics` is OpenMetrics for this `Accept` (RFC 9110 12.5.1):
/// the form of the higher weight; at a tie OpenMetrics when a range names
/// its type (as Prometheus asks, beside text at a lower weight), else the
/// text format (curl's `*/*`). Falls back to the Prometheus text format
/// 0.0.4 with no `Accept`, and when neither form is acceptable (each at
/// q=0, or only other types asked for: nothing else is offered, and a
/// scrape is better answered than refused with 406).
fn wants_openmetrics(accept: Option<&[Member]>) -> bool {
    let Some(accept) = accept else { return false };
    let (om, named) = weight(accept, &OPENMETRICS);
    let (text, _) = weight(accept, &TEXT_004);
    om > 0 && (om > text || (om == text && named))
}

/// Whether to gzip for this `Accept-Encoding` (RFC 9110 12.5.3): gzip's
/// weight (`gzip` or its alias `x-gzip`, else `*`; 0 when unlisted) above 0
/// and at least identity's (`identity`, else `*`; identity unlisted is
/// acceptable but preferred by no one), the highest where a coding is
/// listed twice. Falls back to identity with no `Accept-Encoding` (a
/// client that does not ask gets no gzip) and when gzip is not acceptable,
/// even if identity is excluded too (nothing else is offered).
fn wants_gzip(accept_encoding: Option<&[Member]>) -> bool {
    let Some(codings) = accept_encoding else { return false };
    let q = |names: &[&str]| codings.iter().filter(|m| names.contains(&m.value.as_str())).map(|m| m.q).max();
    let any = q(&["*"]);
    let gzip = q(&["gzip", "x-gzip"]).or(any).unwrap_or(0);
    let identity = q(&["identity"]).or(any).unwrap_or(0);
    gzip > 0 && gzip >= identity
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultscope_common::{KernelClass, StatKey};

    #[test]
    fn a_phase_newer_than_the_events_waits_one_tick() {
        let mut snap = Snapshot::default();
        for (pid, ph) in [(7, 3), (7, 4), (8, 4), (9, 5)] {
            snap.stats.insert(StatKey::new(pid, ph, KernelClass::Faults as u16), Stat::ZERO);
        }
        let gone = BTreeSet::from([8]);
        let hold = held_back(&snap, 3, &gone, &BTreeSet::new());
        // Known phases go on; a gone process's entries are counted now.
        assert_eq!(hold, BTreeSet::from([(7, 4), (9, 5)]));
        // Still unknown at the next tick (its event lost): counted then.
        let hold = held_back(&snap, 4, &BTreeSet::new(), &hold);
        assert_eq!(hold, BTreeSet::new());
    }

    /// The request headers `(name, value)`, parsed as `respond` does.
    fn negotiate(lines: &[(&str, &str)]) -> (bool, bool) {
        let mut h = header::HeaderMap::new();
        for &(k, v) in lines {
            h.append(header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        (
            wants_openmetrics(members(&h, header::ACCEPT).as_deref()),
            wants_gzip(members(&h, header::ACCEPT_ENCODING).as_deref()),
        )
    }

    fn format(accept: &str) -> bool {
        negotiate(&[("accept", accept)]).0
    }

    fn gzip(accept_encoding: &str) -> bool {
        negotiate(&[("accept-encoding", accept_encoding)]).1
    }

    #[test]
    fn q_values_are_rfc_9110s() {
        for (s, q) in
            [("0", 0), ("0.", 0), ("0.5", 500), ("0.05", 50), ("0.123", 123), ("1", 1000), ("1.", 1000)]
        {
            assert_eq!(qvalue(s), Some(q), "{s}");
        }
        for s in ["1.000", "0.000"] {
            assert!(qvalue(s).is_some(), "{s}");
        }
        for s in ["", ".5", "1.5", "1.001", "2", "-1", "0.1234", "0,5", "0.5x", "1e0", " 1", "\"1\"", "+1"] {
            assert_eq!(qvalue(s), None, "{s:?}");
        }
    }

    #[test]
    fn members_keep_quoted_commas_and_semicolons() {
        let m = member("Text/Plain; Version=\"0.0.4\" ;charset=UTF-8;Q=0.5;ext=1").unwrap();
        assert_eq!(
            m,
            Member {
                value: "text/plain".into(),
                params: vec![("version".into(), "0.0.4".into()), ("charset".into(), "UTF-8".into())],
                q: 500,
            }
        );
        assert_eq!(split_unquoted(r#"a;x="1,\"2;3",b"#, ','), vec![r#"a;x="1,\"2;3""#, "b"]);
        assert_eq!(unquote(r#""a\"b\\c""#), r#"a"b\c"#);
        // A malformed member is left out, the others kept; empty ones too.
        let mut h = header::HeaderMap::new();
        h.append(header::ACCEPT, "text/plain;q=2, , application/*;q=0.3,,text/html;x".parse().unwrap());
        h.append(header::ACCEPT, "image/png".parse().unwrap());
        let ms = members(&h, header::ACCEPT).unwrap();
        let values: Vec<_> = ms.iter().map(|m| (m.value.as_str(), m.q)).collect();
        assert_eq!(values, [("application/*", 300), ("image/png", 1000)]);
        assert_eq!(members(&header::HeaderMap::new(), header::ACCEPT), None);
    }

    #[test]
    fn accept_chooses_the_highest_acceptable_format() {
        // No Accept, or nothing acceptable: text 0.0.4.
        assert!(!negotiate(&[]).0);
        for accept in [
            "",
            "text/html",
            "application/openmetrics-text;q=0",
            "application/openmetrics-text;q=0, text/plain;q=0",
            "application/openmetrics-text;version=2.0.0",
            "application/openmetrics-text;charset=latin1",
            "*/plain",
            "application/openmetrics-text;q=1.5",
            "application/openmetrics-text;q=abc",
        ] {
            assert!(!format(accept), "{accept:?}");
        }
        // The review's case: OpenMetrics excluded.
        assert!(!format("application/openmetrics-text;q=0, text/plain"));
        // Prometheus 2 and 3.
        assert!(format("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"));
        // Prometheus 2.42 (Debian bookworm's).
        assert!(format(
            "application/openmetrics-text;version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        ));
        assert!(format("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"));
        // Prometheus asking for text only.
        assert!(!format("text/plain;version=0.0.4;q=1,*/*;q=0.1"));
        // Weights, case, whitespace.
        assert!(!format("text/plain;q=0.5, application/openmetrics-text;q=0.4"));
        assert!(format("APPLICATION/OpenMetrics-Text ; Q=0.9 , text/plain;q=0.5"));
        assert!(format("application/openmetrics-text;q=0.001"));
        assert!(!format("application/openmetrics-text;q=0.000, text/plain;q=0.001"));
        assert!(format("application/openmetrics-text; charset=UTF-8"));
        // Wildcards: */* is curl's, text; application/* names OpenMetrics.
        assert!(!format("*/*"));
        assert!(format("application/*"));
        assert!(!format("text/*, application/*"));
        assert!(format("*/*;q=0.5, application/openmetrics-text"));
        // The most specific range decides, whatever a wildcard says.
        assert!(format("application/openmetrics-text;q=0.8, */*;q=0.9, text/plain;q=0.1"));
        assert!(!format(
            "application/*;q=0, application/openmetrics-text;version=1.0.0;q=0.1, text/plain;q=0.2"
        ));
        assert!(format("*/*;q=0, application/openmetrics-text"));
        assert!(!format("*/*;q=0.3, application/openmetrics-text;q=0, text/*;q=0.2"));
        // At a tie, OpenMetrics when named.
        assert!(format("text/plain, application/openmetrics-text"));
        // A quoted comma is no separator: the q of OpenMetrics is 0.1.
        assert!(!format("application/openmetrics-text;x=\"a,text/plain;q=1\";q=0.1, text/plain;q=0.5"));
        // Several lines are one list.
        assert!(negotiate(&[("accept", "text/plain;q=0.2"), ("accept", "application/openmetrics-text")]).0);
    }

    #[test]
    fn accept_encoding_chooses_gzip_only_when_acceptable_and_preferred() {
        assert!(!negotiate(&[]).1);
        for e in [
            "",
            "gzip;q=0",
            "notgzip",
            "gzipx, deflate",
            "br",
            "identity",
            "gzip;q=0.5, identity;q=0.8",
            "*;q=0",
            "*;q=0, identity",
            "gzip;q=0, identity;q=0",
            "gzip;q=1.5",
            "gzip;q=-1",
            "*;q=0.5, gzip;q=0.3",
            "gzip;q=0, *",
        ] {
            assert!(!gzip(e), "{e:?}");
        }
        for e in [
            "gzip",
            "GZIP;Q=0.5",
            "gzip;q=0.001",
            "x-gzip",
            "*",
            "identity;q=0.5, gzip",
            "gzip, identity",
            "deflate, gzip;q=1.0, *;q=0.5",
            "identity;q=0, *",
            "br;q=1, gzip;q=0.8",
        ] {
            assert!(gzip(e), "{e:?}");
        }
        assert!(negotiate(&[("accept-encoding", "br"), ("accept-encoding", "gzip")]).1);
    }

    #[test]
    fn the_victim_is_the_longest_waiting_or_an_unread_reply() {
        let now = Instant::now();
        let ago = |s: u64| now - Duration::from_secs(s);
        let (w, r) = (Doing::Waiting, Doing::Replying);
        assert_eq!(victim(&[], now), None);
        // Replies under way are kept, even older ones.
        assert_eq!(victim(&[(r, ago(5)), (w, ago(1)), (w, ago(3)), (r, ago(9))], now), Some(2));
        assert_eq!(victim(&[(r, ago(5)), (r, ago(1))], now), None);
        // A reply unread for longer than IO_TIMEOUT goes first.
        assert_eq!(victim(&[(w, ago(4)), (r, ago(11)), (w, ago(3))], now), Some(1));
    }

    /// A loopback connection: (the client's end, serve's end).
    async fn pair(listener: &tokio::net::TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        (client, server)
    }

    /// One reply read off `c` (its head and its Content-Length's body).
    async fn read_reply(c: &mut TcpStream) -> String {
        use tokio::io::AsyncReadExt as _;
        let mut buf = Vec::new();
        loop {
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_string))
                    .map_or(0, |v| v.parse().unwrap());
                if body.len() >= len || head.starts_with("HEAD") {
                    return text;
                }
            }
            let mut chunk = [0u8; 4096];
            let n = c.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed: {text}");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn scrape_of(text: &str) -> Arc<Mutex<Arc<Scrape>>> {
        Arc::new(Mutex::new(Arc::new(Scrape::new(text.to_string()))))
    }

    /// A kept-alive connection waits again, evictable, once each reply is
    /// written, GET and HEAD alike.
    #[tokio::test(flavor = "current_thread")]
    async fn a_connection_waits_again_once_its_reply_is_written() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (mut c, server) = pair(&listener).await;
        let activity = Arc::new(Mutex::new(Activity::new()));
        let task = tokio::spawn(connection(server, scrape_of("# EOF\n"), activity.clone()));
        for req in ["GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"] {
            let asked = Instant::now();
            c.write_all(req.as_bytes()).await.unwrap();
            let reply = read_reply(&mut c).await;
            assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
            let a = lock(&activity);
            assert!(a.doing == Doing::Waiting && a.since >= asked, "{req}: {:?}", a.doing);
        }
        task.abort();
    }

    /// With every slot taken, a new connection evicts the one idle longest,
    /// whose client sees it closed; the table stays at the cap.
    #[tokio::test(flavor = "current_thread")]
    async fn a_full_table_evicts_the_connection_idle_longest() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scrape = scrape_of("# EOF\n");
        let mut clients = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            clients.push(pair(&listener).await);
        }
        let mut conns = Conns::default();
        let mut ends = Vec::new();
        for (c, server) in clients {
            assert!(conns.make_room().await);
            conns.spawn(server, scrape.clone());
            ends.push(c);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // The second one sends half a request line: still waiting, but
        // since its accept, after the first.
        ends[1].write_all(b"GET /met").await.unwrap();
        let (mut newer, server) = pair(&listener).await;
        assert!(conns.make_room().await);
        conns.spawn(server, scrape.clone());
        assert_eq!((conns.live.len(), conns.evicted, conns.refused), (MAX_CONNECTIONS, 1, 0));
        let mut b = [0u8; 16];
        assert_eq!(ends[0].read(&mut b).await.unwrap(), 0, "the oldest is closed");
        // The next eviction is the half-sent request's.
        let (_newest, server) = pair(&listener).await;
        assert!(conns.make_room().await);
        conns.spawn(server, scrape);
        assert!(ends[1].read(&mut b).await.map_or(true, |n| n == 0), "the half-sent request is closed");
        // The new one is served.
        newer.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        assert!(read_reply(&mut newer).await.starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn the_http_counters_end_the_scrape_in_both_formats() {
        let conns = Conns { evicted: 3, refused: 1, ..Conns::default() };
        let om = with_http("# HELP a x.\n# TYPE a counter\na_total 1\n# EOF\n".into(), &conns);
        assert!(om.ends_with(
            "# TYPE faultscope_http_connections_dropped counter\n\
             faultscope_http_connections_dropped_total{reason=\"evicted\"} 3\n\
             faultscope_http_connections_dropped_total{reason=\"refused\"} 1\n# EOF\n"
        ));
        assert_eq!(om.matches("# EOF").count(), 1, "{om}");
        let text = to_text_004(&om);
        assert!(text.contains("# TYPE faultscope_http_connections_dropped_total counter\n"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }
}
