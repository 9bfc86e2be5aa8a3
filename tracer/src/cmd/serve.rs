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
//! most 64 connections, a 10 s bound on every read and write, and gzip
//! when the client accepts it.

use crate::kernel::drops::DropReason;
use std::{
    collections::BTreeSet,
    convert::Infallible,
    io::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::maps::PerCpuHashMap;
use clap::Args;
use faultscope_common::{maps::ClassSetKey, PhaseId, Stat};
use http_body_util::Full;
use hyper::{body::Bytes, header, Method, Request, Response, StatusCode};
use tokio::{
    net::{TcpSocket, TcpStream},
    signal::unix::{signal, SignalKind},
};

use super::record::{Filters, Recorder};
use crate::{
    collect::{
        attribution::AttribOpts,
        collector::Snapshot,
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
    /// Phases whose kernel entries are kept (the current and the one before).
    prev_phase: PhaseId,
    /// `--comm` and `--cgroup`.
    sel: Selection,
    /// Connections that could not be accepted (no descriptor left).
    accept_errors: u64,
    /// (process, phase) counts held back at the last tick: their phase was
    /// newer than the lifecycle events read.
    waiting: BTreeSet<(u32, PhaseId)>,
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
            .filter(|p| !self.rec.live.contains(p) || target::is_gone(*p))
            .collect();
        let snap = self.rec.snapshot()?;
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
        self.metrics.update(
            &snap,
            |pid, ph| (!hold.contains(&(pid, ph))).then(|| kinds.kind(pid, ph)),
            |pid| rec.comms.get(&pid).map(|c| ProcLabels { comm: c.clone(), cgroup: cg.get(&pid).cloned() }),
        );
        self.waiting = hold;
        let mut drops = self.rec.drops()?;
        drops.set(DropReason::AcceptErrors, self.accept_errors);
        self.metrics.update_drops(&drops);
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
            self.rec.live.remove(pid);
            self.rec.comms.remove(pid);
            self.rec.lifetimes.remove(pid);
            self.rec.accounting.remove(pid);
            self.sel.forget(*pid);
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
        return Err(Refusal::new("nothing to trace: give -p PID, --comm NAME or --cgroup PATH").into());
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
    let attrib = AttribOpts {
        sites: Default::default(),
        stacks: Default::default(),
        no_mappings: true,
        ..AttribOpts::default()
    };
    let probe = super::record::ProbeOpts { backend: o.backend, prog_stats: false, quiet: false };
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
    for comm in o.select.comm.iter().chain(rec.comms.values()) {
        metrics.declare(comm);
    }
    let prev_phase = rec.timeline.current().id;
    let tick = Duration::from_secs_f64(o.tick);
    let sel = Selection::new(o.select.clone(), &filters);
    let mut s = Serve { rec, metrics, prev_phase, sel, accept_errors: 0, waiting: BTreeSet::new() };
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
}
