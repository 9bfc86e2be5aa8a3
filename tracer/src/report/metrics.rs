//! OpenMetrics export (`faultscope serve`): a `prometheus-client` registry
//! fed from the kernel's snapshots.
//!
//! - `faultscope_faults_total{kind, phase_kind, comm}`: every fault, of
//!   exactly one `kind` (`classes::FAULT_KINDS`: copy, reuse, wp_shared,
//!   huge_pmd_wp, spurious, wp_other, present_write, other_write, read), so
//!   that a sum over `kind` is all faults.
//! - `faultscope_class_faults_total{class, phase_kind, comm}`: each class
//!   of the report (they nest: faults ⊇ write_faults ⊇ wp_faults ⊇ reuse;
//!   never sum over `class`). `pid` and `cgroup` labels only when asked
//!   for: they are unbounded. `container_id`, `pod_uid`, `qos` and `service`
//!   when asked for (`collect::container`: bounded by serve). Each update adds what every (process, phase,
//!   class) counted since the last one, so a series only grows: across
//!   phases, across a process's exit (its last counts stay folded into its
//!   comm's series) and a restart under a new pid (which counts on from
//!   there).
//! - `faultscope_fault_origins_total{class, origin, phase_kind, comm}`: the
//!   same counts split by who asked for the faults (`origin`: user, kernel,
//!   gup: three values), beside the totals so that a query without the
//!   label is unchanged.
//! - `faultscope_fault_duration_seconds{class, comm}`: the kernel's own
//!   log-linear buckets, cumulative, as `le` buckets (no resampling). A
//!   kernel bucket holds the integer nanoseconds `[lo, hi)`, so its `le` is
//!   `(hi - 1) ns`; the buckets add up to `_count` exactly, `_sum` is the
//!   kernel's sum. Every series has all of the kernel's buckets from its
//!   first scrape on: a bucket that appeared only once a slow fault used
//!   it would start with a count that `rate()` never sees grow, and
//!   `histogram_quantile` would put the p99 at the top bucket.
//! - `faultscope_class_measurable{class, reason}`: 1, or 0 with a short
//!   reason code (`needs:PROGRAM`; the prose is in serve's log at start): a
//!   class that cannot be measured here never shows as a 0 count.
//! - `faultscope_faults_seen_total`, `faultscope_faults_lost_total`: the
//!   faults the kernel counted reaching its maps, apart from the maps, and
//!   those lost there: `sum(faultscope_faults_total) +
//!   faultscope_faults_lost_total == faultscope_faults_seen_total` once every
//!   process seen is served (see `collect::collector::FaultFlow`).
//! - `faultscope_drops_total{reason}`, `faultscope_forks_total{comm}`,
//!   `faultscope_build_info{version, kernel, arch, backend}`.
//!
//! The phase kinds are those of serve's processes: before-fork,
//! child-alive, after-child-exit, after-child-exec (serve takes no marks).
//! Series come out sorted by their labels, the same order every scrape.
//!
//! Memory: the series are bounded by classes x 5 phase kinds x comms; the
//! per-process state (the last counts of each live (process, phase, class))
//! is dropped by [`Metrics::forget`] when the process or the phase is gone.

use crate::kernel::drops::Drops;
use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
};

use faultscope_common::{hist, KernelClass, Origin, PhaseId, Stat, StatKey};
use prometheus_client::{
    encoding::{text::encode, EncodeMetric, MetricEncoder, NoLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, MetricType, TypedMetric},
    registry::Registry,
};

use crate::{
    collect::{
        collector::{FaultFlow, FolioKey, Snapshot},
        container::Container,
        phases::PhaseKind,
    },
    kernel::{
        classes::{self, Availability, ReportClass},
        latency::LatencyTier,
        session::{MapFill, ProbeStatus, ProgramCost},
    },
};

type Labels = Vec<(&'static str, String)>;

/// A label value as the text formats quote it: `\`, `"` and newlines
/// escaped (prometheus-client's text encoder writes values as they are, so
/// a process named `x"} 9e9` could otherwise forge a series).
pub fn esc(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Which unbounded labels to add.
#[derive(Clone, Copy, Debug, Default)]
pub struct LabelOpts {
    pub pid: bool,
    pub cgroup: bool,
    /// container_id, pod_uid, qos and service (bounded by serve).
    pub container: bool,
}

/// What `faultscope_build_info` says.
pub struct BuildInfo {
    pub version: String,
    pub kernel: String,
    pub arch: String,
    /// How the fault path's first program is attached, in the kernel's
    /// words: fentry, kprobe, tp_btf, tracepoint or none.
    pub backend: String,
    /// Which faults are timed (none known in tracepoint mode).
    pub latency: Option<LatencyTier>,
}

/// A histogram kept as the kernel's buckets.
#[derive(Clone, Debug, Default)]
pub struct KernelHistogram(Arc<Mutex<HistState>>);

#[derive(Debug, Default)]
struct HistState {
    sum_ns: u64,
    buckets: Vec<u64>,
}

impl KernelHistogram {
    /// Adds an interval's buckets and sum (nanoseconds).
    pub fn add(&self, hist: &[u64], sum_ns: u64) {
        let mut s = self.0.lock().unwrap();
        s.sum_ns += sum_ns;
        s.buckets.resize(hist::NBUCKETS, 0);
        for (a, b) in s.buckets.iter_mut().zip(hist) {
            *a += b;
        }
    }

    /// (le in seconds, count in that bucket alone), then +Inf; the sum in
    /// seconds and the count.
    pub fn buckets(&self) -> (Vec<(f64, u64)>, f64, u64) {
        let s = self.0.lock().unwrap();
        // The kernel's last bucket also holds everything above 2^40 ns:
        // it is +Inf's alone.
        let last = hist::NBUCKETS - 1;
        let at = |i: usize| s.buckets.get(i).copied().unwrap_or(0);
        let mut out: Vec<(f64, u64)> = (0..last).map(|i| (le_seconds(i), at(i))).collect();
        out.push((f64::MAX, at(last)));
        (out, s.sum_ns as f64 / 1e9, s.buckets.iter().sum())
    }
}

/// The inclusive upper bound of kernel bucket `i`, in seconds.
pub fn le_seconds(i: usize) -> f64 {
    let (_, hi) = hist::bucket_range(i);
    (hi - 1) as f64 / 1e9
}

impl TypedMetric for KernelHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for KernelHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (buckets, sum, count) = self.buckets();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl LabelOpts {
    /// The unbounded labels asked for, of process `tgid`.
    fn extend(&self, labels: &mut Labels, tgid: u32, p: &ProcLabels) {
        if self.pid {
            labels.push(("pid", tgid.to_string()));
        }
        if self.cgroup {
            labels.push(("cgroup", esc(p.cgroup.as_deref().unwrap_or_default())));
        }
        self.extend_container(labels, p);
    }

    fn extend_container(&self, labels: &mut Labels, p: &ProcLabels) {
        if let (true, Some(c)) = (self.container, &p.container) {
            for (k, v) in [
                ("container_id", &c.container_id),
                ("pod_uid", &c.pod_uid),
                ("qos", &c.qos),
                ("service", &c.service),
            ] {
                labels.push((k, esc(v)));
            }
        }
    }
}

/// faultscope's own programs and maps, as ebpf_exporter exports them.
struct Own {
    attached: Family<Labels, Gauge>,
    stats_enabled: Gauge,
    runs: Family<Labels, Counter>,
    run_seconds: Family<Labels, Counter<f64, std::sync::atomic::AtomicU64>>,
    /// The kernel's last (runs, run time) of each program.
    last_runs: HashMap<String, (u64, u64)>,
    capacity: Family<Labels, Gauge>,
    entries: Family<Labels, Gauge>,
}

impl Own {
    fn register(r: &mut Registry) -> Own {
        let o = Own {
            attached: Default::default(),
            stats_enabled: Default::default(),
            runs: Default::default(),
            run_seconds: Default::default(),
            last_runs: HashMap::new(),
            capacity: Default::default(),
            entries: Default::default(),
        };
        r.register("faultscope_program_attached", "1 when faultscope's program for this probe is attached, 0 when it is not (the reason is in serve's log)", o.attached.clone());
        r.register("faultscope_program_stats_enabled", "1 when the kernel accounts faultscope's program runs (serve --prog-stats, or kernel.bpf_stats_enabled); without it there are no faultscope_program_runs series", o.stats_enabled.clone());
        r.register(
            "faultscope_program_runs",
            "Runs of each of faultscope's attached programs, by the kernel's accounting",
            o.runs.clone(),
        );
        r.register("faultscope_program_run_seconds", "Time in each of faultscope's attached programs, by the kernel's accounting (two clock reads a run while it is on)", o.run_seconds.clone());
        r.register(
            "faultscope_map_capacity_entries",
            "The bound of each of faultscope's hash maps",
            o.capacity.clone(),
        );
        r.register("faultscope_map_entries", "Entries each of faultscope's hash maps holds now (at the bound, the next insert is a drop: faultscope_drops_total)", o.entries.clone());
        o
    }
}

/// How a process is named in the labels.
pub struct ProcLabels {
    pub comm: String,
    pub cgroup: Option<String>,
    /// Its container, pod or service (with `LabelOpts::container`).
    pub container: Option<Container>,
}

pub struct Metrics {
    registry: Registry,
    opts: LabelOpts,
    /// The partition by kind.
    faults: Family<Labels, Counter>,
    class_faults: Family<Labels, Counter>,
    origins: Family<Labels, Counter>,
    durations: Family<Labels, KernelHistogram>,
    drops: Family<Labels, Counter>,
    forks: Family<Labels, Counter>,
    /// faultscope's own programs and maps.
    own: Own,
    /// The last counts seen of each (process, phase, class).
    last: HashMap<StatKey, Stat>,
    /// The same, by origin.
    last_origins: HashMap<StatKey, crate::collect::collector::ByOrigin>,
    /// The last count of each (process, phase, kind).
    last_kinds: HashMap<(u32, PhaseId, &'static str), u64>,
    new_folios: Family<Labels, Counter>,
    cow_bytes: Family<Labels, Counter>,
    /// The last count of each (process, phase, class, folio order).
    last_folios: HashMap<FolioKey, u64>,
    pmd_outcomes: Family<Labels, Counter>,
    last_pmd_outcomes: HashMap<(u32, PhaseId, classes::PmdOutcome), u64>,
    /// The kinds that can occur here.
    kinds: Vec<&'static str>,
    last_drops: Drops,
    seen: Counter,
    lost: Counter,
    last_flow: FaultFlow,
    /// Timed metrics, by kernel class.
    classes: Vec<(ReportClass, KernelClass, bool)>,
}

impl Metrics {
    pub fn new(info: &BuildInfo, avail: &[(ReportClass, Availability)], opts: LabelOpts) -> Metrics {
        let mut registry = Registry::default();
        let r = &mut registry;
        let faults = metric(r, "faultscope_faults", "Page faults (every origin) by what the kernel did with each (one kind per fault: a sum over kind is all faults), the kind of workload phase they happened in, and process name");
        let class_faults = metric(r, "faultscope_class_faults", "Page faults by report class (classes nest: faults includes write_faults includes wp_faults includes reuse; do not sum over class), phase kind and process name");
        let new_folios = metric(r, "faultscope_new_folios", "New anon folios mapped by faults, by class (copy: a COW copy's; not_present: a first touch's and the like), folio size, phase kind and process name");
        let cow_bytes = metric(
            r,
            "faultscope_cow_copied_bytes",
            "Bytes of the new anon folios COW copies allocated, by folio size, phase kind and process name",
        );
        let pmd_outcomes = metric(
            r,
            "faultscope_huge_pmd_wp_outcomes",
            "Write-protect faults on a PMD-mapped THP (huge_pmd_wp) by what came of each: reused (the PMD made writable), copied (a THP copied whole), split (the PMD split, the page written then copied by PTE), other (retried or failed); by phase kind and process name",
        );
        let origins = metric(r, "faultscope_fault_origins", "Page faults by class and origin (user: user mode; kernel: the kernel inside a system call; gup: get_user_pages), phase kind and process name");
        let durations = metric(r, "faultscope_fault_duration_seconds", "Time in handle_mm_fault, in the kernel's log-linear buckets (le is each bucket's last nanosecond)");
        let measurable = metric(r, "faultscope_class_measurable", "1 when the class is measured on this kernel, 0 with the missing probe when it cannot be (the reason is in serve's log)");
        let drops = metric(
            r,
            "faultscope_drops",
            "Events the kernel side, or serve reading /proc, could not record, by reason",
        );
        let forks = metric(r, "faultscope_forks", "Forks of traced processes, by process name");
        let seen = metric(r, "faultscope_faults_seen", "Faults faultscope's programs brought to the kernel's maps, by a count kept apart from them: sum(faultscope_faults_total) + faultscope_faults_lost_total is this once every process seen is served (a process not yet named, or a phase held back for a tick, is served at a later scrape)");
        let lost = metric(r, "faultscope_faults_lost", "Faults lost at the kernel's maps (the stats map full): in faultscope_faults_seen_total, in no faultscope_faults_total series");
        let own = Own::register(r);
        register_build_info(r, info);
        Metrics {
            registry,
            opts,
            own,
            faults,
            class_faults,
            origins,
            last_origins: HashMap::new(),
            last_kinds: HashMap::new(),
            new_folios,
            cow_bytes,
            last_folios: HashMap::new(),
            pmd_outcomes,
            last_pmd_outcomes: HashMap::new(),
            kinds: classes::fault_kinds_here(avail),
            durations,
            drops,
            forks,
            last: HashMap::new(),
            last_drops: Drops::default(),
            seen,
            lost,
            last_flow: FaultFlow::default(),
            classes: set_measurable(&measurable, avail),
        }
    }

    /// Creates the counters of a process name known before its processes
    /// fault (`serve --comm NAME`, `-p PID`) at 0: every measured class x
    /// phase kind, and the forks. A series that first appears with a count
    /// already in it loses that count to `rate()` and `increase()` (the
    /// first BGSAVE's copies, the first fork). Histograms are not declared:
    /// all of the kernel's buckets each, for classes that may never happen,
    /// to save a quantile one tick. With the pid or cgroup labels the
    /// series are not known in advance.
    pub fn declare(&mut self, comm: &str) {
        if self.opts.pid || self.opts.cgroup || self.opts.container {
            return;
        }
        for kind in SERVE_KINDS {
            for &(metric, _, _) in &self.classes {
                let _ = self.class_faults.get_or_create(&vec![
                    ("class", metric.name().to_string()),
                    ("phase_kind", kind_name(kind).to_string()),
                    ("comm", esc(comm)),
                ]);
            }
            for &k in &self.kinds {
                let _ = self.faults.get_or_create(&vec![
                    ("kind", k.to_string()),
                    ("phase_kind", kind_name(kind).to_string()),
                    ("comm", esc(comm)),
                ]);
            }
        }
        let _ = self.forks.get_or_create(&vec![("comm", esc(comm))]);
    }

    /// Adds what happened since the last update. `kind` gives the kind of
    /// a process's phase, or None for a phase whose start user space has
    /// not read yet: its counts wait for a later update (a counter cannot
    /// take back what it was given under the wrong kind). `proc` gives a
    /// process's names (None: not traced, skipped). A read torn by a flush
    /// adds nothing (see `Snapshot::clean_or`): a counter cannot take back
    /// a flushed slot counted twice.
    pub fn update(
        &mut self,
        snap: &Snapshot,
        kind: impl Fn(u32, PhaseId) -> Option<PhaseKind>,
        proc: impl Fn(u32) -> Option<ProcLabels>,
    ) {
        if snap.torn {
            return;
        }
        for (k, v) in &snap.stats {
            let Some(&(metric, _, timed)) = self.classes.iter().find(|(_, c, _)| *c as u16 == k.class) else {
                continue;
            };
            let Some(p) = proc(k.tgid) else { continue };
            let Some(kind) = kind(k.tgid, k.phase) else { continue };
            let last = self.last.get(k).copied().unwrap_or(Stat::ZERO);
            // A count never goes down; if an entry was recreated, it
            // counts from 0 again.
            let base = if v.count < last.count { Stat::ZERO } else { last };
            let d_count = v.count - base.count;
            if d_count == 0 {
                continue;
            }
            let kind = kind_name(kind);
            let mut labels: Labels = vec![
                ("class", metric.name().to_string()),
                ("phase_kind", kind.to_string()),
                ("comm", esc(&p.comm)),
            ];
            self.opts.extend(&mut labels, k.tgid, &p);
            self.class_faults.get_or_create(&labels).inc_by(d_count);
            if timed {
                let mut h = v.hist;
                for (a, b) in h.iter_mut().zip(base.hist.iter()) {
                    *a = a.saturating_sub(*b);
                }
                let mut hl: Labels = vec![("class", metric.name().to_string()), ("comm", esc(&p.comm))];
                if self.opts.pid {
                    hl.push(("pid", k.tgid.to_string()));
                }
                self.opts.extend_container(&mut hl, &p);
                self.durations.get_or_create(&hl).add(&h, v.sum_ns.saturating_sub(base.sum_ns));
            }
            self.last.insert(*k, *v);
        }
        for (k, v) in &snap.origins {
            let Some(&(metric, _, _)) = self.classes.iter().find(|(_, c, _)| *c as u16 == k.class) else {
                continue;
            };
            let Some(p) = proc(k.tgid) else { continue };
            let Some(kind) = kind(k.tgid, k.phase) else { continue };
            let kind = kind_name(kind);
            let last = self.last_origins.get(k).copied().unwrap_or_default();
            // An entry recreated counts from 0 again.
            let base = if v.iter().zip(last).any(|(a, b)| *a < b) { Default::default() } else { last };
            for o in Origin::ALL {
                let d = v[o as usize] - base[o as usize];
                if d == 0 {
                    continue;
                }
                let mut labels: Labels = vec![
                    ("class", metric.name().to_string()),
                    ("origin", o.name().to_string()),
                    ("phase_kind", kind.to_string()),
                    ("comm", esc(&p.comm)),
                ];
                self.opts.extend(&mut labels, k.tgid, &p);
                self.origins.get_or_create(&labels).inc_by(d);
            }
            self.last_origins.insert(*k, *v);
        }
        self.update_kinds(snap, &kind, &proc);
        self.update_folios(snap, &kind, &proc);
        self.update_pmd_outcomes(snap, &kind, &proc);
    }

    /// The outcomes of PMD write-protect faults; `outcome` is bounded (four
    /// values).
    fn update_pmd_outcomes(
        &mut self,
        snap: &Snapshot,
        kind: &impl Fn(u32, PhaseId) -> Option<PhaseKind>,
        proc: &impl Fn(u32) -> Option<ProcLabels>,
    ) {
        let name = |o: classes::PmdOutcome| super::schema::PmdOutcomes::NAMES[o as usize];
        let parts = Parts { family: &self.pmd_outcomes, label: "outcome", opts: &self.opts };
        parts.add(&snap.pmd_outcomes, &mut self.last_pmd_outcomes, name, kind, proc);
    }

    /// The partition by kind.
    fn update_kinds(
        &mut self,
        snap: &Snapshot,
        kind: &impl Fn(u32, PhaseId) -> Option<PhaseKind>,
        proc: &impl Fn(u32) -> Option<ProcLabels>,
    ) {
        let parts = Parts { family: &self.faults, label: "kind", opts: &self.opts };
        parts.add(&snap.kinds, &mut self.last_kinds, |k| k, kind, proc);
    }

    /// The new anon folios by size, and the bytes COW copies allocated.
    /// `folio_size` is bounded: one value per folio order (at most 31).
    fn update_folios(
        &mut self,
        snap: &Snapshot,
        kind: &impl Fn(u32, PhaseId) -> Option<PhaseKind>,
        proc: &impl Fn(u32) -> Option<ProcLabels>,
    ) {
        for (&key, &v) in &snap.folios {
            let (tgid, phase, class, order) = key;
            let Some(p) = proc(tgid) else { continue };
            let Some(kind) = kind(tgid, phase) else { continue };
            let d = delta(&mut self.last_folios, key, v);
            if d == 0 {
                continue;
            }
            let bytes = crate::units::PAGE << order.min(30);
            let mut labels: Labels = vec![
                ("folio_size", crate::units::size(bytes)),
                ("phase_kind", kind_name(kind).to_string()),
                ("comm", esc(&p.comm)),
            ];
            self.opts.extend(&mut labels, tgid, &p);
            if class == ReportClass::Copy {
                self.cow_bytes.get_or_create(&labels).inc_by(d * bytes);
            }
            labels.insert(0, ("class", class.name().to_string()));
            self.new_folios.get_or_create(&labels).inc_by(d);
        }
    }

    /// The kernel's drop counters (cumulative over the session).
    pub fn update_drops(&mut self, drops: &Drops) {
        for (&reason, v) in &drops.0 {
            let last = self.last_drops.get(reason);
            let c = self.drops.get_or_create(&vec![("reason", reason.key().to_string())]);
            if *v > last {
                c.inc_by(v - last);
            }
            self.last_drops.set(reason, *v);
        }
    }

    /// The kernel's count of the faults that reached its maps, and of those
    /// lost there (cumulative over the session).
    pub fn update_flow(&mut self, flow: &FaultFlow) {
        self.seen.inc_by(flow.seen.saturating_sub(self.last_flow.seen));
        self.lost.inc_by(flow.lost.saturating_sub(self.last_flow.lost));
        self.last_flow = *flow;
    }

    /// faultscope's own state: which programs are attached, their runs and
    /// run time where the kernel accounts them (else said by
    /// `faultscope_program_stats_enabled 0`), and its maps' fill.
    pub fn update_own(&mut self, probes: &[ProbeStatus], costs: Option<&[ProgramCost]>, maps: &[MapFill]) {
        let o = &mut self.own;
        for p in probes {
            let labels = vec![("program", p.program.to_string()), ("target", esc(&p.target))];
            o.attached.get_or_create(&labels).set(p.attached as i64);
        }
        o.stats_enabled.set(costs.is_some() as i64);
        for c in costs.unwrap_or_default() {
            let labels = vec![("program", esc(&c.name)), ("backend", esc(&c.backend))];
            let (runs, ns) = o.last_runs.get(&c.name).copied().unwrap_or_default();
            // Counted from 0 again if the accounting restarted.
            let (d_runs, d_ns) =
                if c.runs < runs { (c.runs, c.run_time_ns) } else { (c.runs - runs, c.run_time_ns - ns) };
            o.runs.get_or_create(&labels).inc_by(d_runs);
            o.run_seconds.get_or_create(&labels).inc_by(d_ns as f64 / 1e9);
            o.last_runs.insert(c.name.clone(), (c.runs, c.run_time_ns));
        }
        for m in maps {
            let labels = vec![("map", m.name.to_string())];
            o.capacity.get_or_create(&labels).set(m.capacity as i64);
            o.entries.get_or_create(&labels).set(m.entries as i64);
        }
    }

    pub fn fork(&mut self, comm: &str) {
        self.forks.get_or_create(&vec![("comm", esc(comm))]).inc();
    }

    /// Forgets the last counts of the entries `gone` says are gone (an
    /// exited process, an ended phase), once their last counts are in.
    pub fn forget(&mut self, gone: impl Fn(u32, PhaseId) -> bool) {
        self.last.retain(|k, _| !gone(k.tgid, k.phase));
        self.last_origins.retain(|k, _| !gone(k.tgid, k.phase));
        self.last_kinds.retain(|k, _| !gone(k.0, k.1));
        self.last_folios.retain(|k, _| !gone(k.0, k.1));
    }

    /// Entries of per-process state held (for the memory bound).
    pub fn held(&self) -> usize {
        self.last.len() + self.last_origins.len() + self.last_kinds.len() + self.last_folios.len()
    }

    /// The OpenMetrics text, ending in `# EOF`, each family's series sorted
    /// by their labels (prometheus-client keeps them in hash maps).
    pub fn encode(&self) -> String {
        let mut s = String::new();
        encode(&mut s, &self.registry).expect("writing to a String");
        sorted_series(&s)
    }
}

/// A metric made and registered under `name`, with its help text.
fn metric<M: prometheus_client::registry::Metric + Clone + Default>(
    r: &mut Registry,
    name: &str,
    help: &str,
) -> M {
    let m = M::default();
    r.register(name, help, m.clone());
    m
}

/// `faultscope_build_info` and, with a latency tier, which faults the
/// histograms are of.
fn register_build_info(r: &mut Registry, info: &BuildInfo) {
    // A gauge of 1 rather than an OpenMetrics info: the Prometheus text
    // format (and promtool) know no info type.
    let build: Family<Labels, Gauge> = metric(
        r,
        "faultscope_build_info",
        "faultscope's version, the kernel, the architecture and the fault backend",
    );
    build
        .get_or_create(&vec![
            ("version", esc(&info.version)),
            ("kernel", esc(&info.kernel)),
            ("arch", esc(&info.arch)),
            ("backend", esc(&info.backend)),
        ])
        .set(1);
    if let Some(tier) = info.latency {
        let every: Gauge<i64> = metric(r, "faultscope_latency_sample_every", "Which faults faultscope_fault_duration_seconds is of (serve --latency): 1 every fault, N one in N on each CPU (each stands for N), 0 none; the fault counts are of every fault");
        every.set(tier.every().into());
    }
}

/// `faultscope_class_measurable` of every class; returns the measured
/// ones, with their kernel class and whether they are timed.
fn set_measurable(
    measurable: &Family<Labels, Gauge>,
    avail: &[(ReportClass, Availability)],
) -> Vec<(ReportClass, KernelClass, bool)> {
    let mut classes = Vec::new();
    for (m, a) in avail {
        match a {
            Availability::Measured { class, timed, .. } => {
                measurable
                    .get_or_create(&vec![("class", m.name().to_string()), ("reason", String::new())])
                    .set(1);
                classes.push((*m, *class, *timed));
            }
            Availability::NotMeasurable(why) => {
                measurable
                    .get_or_create(&vec![
                        ("class", m.name().to_string()),
                        ("reason", esc(&classes::reason_code(why))),
                    ])
                    .set(0);
            }
        }
    }
    classes
}

/// The phase kinds of serve's processes.
const SERVE_KINDS: [PhaseKind; 4] =
    [PhaseKind::BeforeFork, PhaseKind::ChildAlive, PhaseKind::AfterChildExit, PhaseKind::AfterChildExec];

/// `text` with the samples of each family in a stable order: a series'
/// lines (a histogram's buckets, sum and count) stay together and in their
/// order; series are sorted by their labels without `le`.
fn sorted_series(text: &str) -> String {
    fn series_key(line: &str) -> String {
        let Some((_, rest)) = line.split_once('{') else { return String::new() };
        let labels = rest.rsplit_once('}').map_or(rest, |(l, _)| l);
        // `le` comes first in prometheus-client's bucket lines.
        let labels = match labels.strip_prefix("le=\"") {
            Some(r) => r.split_once("\",").map_or("", |(_, t)| t),
            None => labels,
        };
        labels.to_string()
    }
    let mut out = String::with_capacity(text.len());
    // Series of the current family: (key, its lines), in first-seen order.
    let mut block: Vec<(String, Vec<&str>)> = Vec::new();
    let flush = |block: &mut Vec<(String, Vec<&str>)>, out: &mut String| {
        block.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, lines) in block.drain(..) {
            for l in lines {
                out.push_str(l);
                out.push('\n');
            }
        }
    };
    for line in text.lines() {
        if line.starts_with('#') {
            flush(&mut block, &mut out);
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let key = series_key(line);
        match block.last_mut() {
            Some((k, lines)) if *k == key => lines.push(line),
            _ => block.push((key, vec![line])),
        }
    }
    flush(&mut block, &mut out);
    out
}

/// The same metrics in the Prometheus text format 0.0.4 (for scrapers and
/// tools that do not ask for OpenMetrics, such as `promtool check
/// metrics`): a counter's HELP and TYPE carry its `_total` name, there is
/// no `# EOF`.
pub fn to_text_004(openmetrics: &str) -> String {
    let counters: BTreeSet<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::new();
    for l in openmetrics.lines() {
        if l == "# EOF" || l.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = l.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(l));
        out.push('\n');
    }
    out
}

pub fn kind_name(k: PhaseKind) -> &'static str {
    match k {
        PhaseKind::BeforeFork => "before-fork",
        PhaseKind::ChildAlive => "child-alive",
        PhaseKind::AfterChildExit => "after-child-exit",
        PhaseKind::AfterChildExec => "after-child-exec",
        PhaseKind::Mark => "mark",
    }
}

/// A counter family of the parts of something counted per process and
/// phase (`(tgid, phase, part)`), the part under `label`.
struct Parts<'a> {
    family: &'a Family<Labels, Counter>,
    label: &'static str,
    opts: &'a LabelOpts,
}

impl Parts<'_> {
    /// Adds each count's change since `last` under its part's `name`, its
    /// phase's kind and its process's name; a phase or process not known
    /// yet waits.
    fn add<P: Copy + Ord + std::hash::Hash>(
        &self,
        counts: &std::collections::BTreeMap<(u32, PhaseId, P), u64>,
        last: &mut HashMap<(u32, PhaseId, P), u64>,
        name: impl Fn(P) -> &'static str,
        kind: &impl Fn(u32, PhaseId) -> Option<PhaseKind>,
        proc: &impl Fn(u32) -> Option<ProcLabels>,
    ) {
        for (&key, &v) in counts {
            let (tgid, phase, part) = key;
            let Some(p) = proc(tgid) else { continue };
            let Some(kind) = kind(tgid, phase) else { continue };
            let d = delta(last, key, v);
            if d == 0 {
                continue;
            }
            let mut labels: Labels = vec![
                (self.label, name(part).to_string()),
                ("phase_kind", kind_name(kind).to_string()),
                ("comm", esc(&p.comm)),
            ];
            self.opts.extend(&mut labels, tgid, &p);
            self.family.get_or_create(&labels).inc_by(d);
        }
    }
}

/// What a cumulative count `v` of `key` added since the last one seen
/// (kept in `last`); an entry the kernel recreated counts from 0 again.
fn delta<K: std::hash::Hash + Eq>(last: &mut HashMap<K, u64>, key: K, v: u64) -> u64 {
    let before = last.insert(key, v).unwrap_or(0);
    if v < before {
        v
    } else {
        v - before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn avail() -> Vec<(ReportClass, Availability)> {
        vec![
            (
                ReportClass::Faults,
                Availability::Measured { class: KernelClass::Faults, timed: true, source: "k" },
            ),
            (
                ReportClass::Copy,
                Availability::Measured { class: KernelClass::Copy, timed: true, source: "k" },
            ),
            (ReportClass::Reuse, Availability::NotMeasurable("needs wp_page: no kprobe PMU".into())),
        ]
    }

    fn metrics() -> Metrics {
        let info = BuildInfo {
            version: "0.1.0".into(),
            kernel: "6.12.0".into(),
            arch: "x86_64".into(),
            backend: "tracepoint".into(),
            latency: None,
        };
        Metrics::new(&info, &avail(), LabelOpts::default())
    }

    fn stat(vals: &[u64]) -> Stat {
        let mut s = Stat::ZERO;
        for v in vals {
            s.record(Some(*v));
        }
        s
    }

    fn snap(entries: &[(u32, PhaseId, KernelClass, Stat)]) -> Snapshot {
        let mut snap = Snapshot::default();
        for (pid, ph, c, s) in entries {
            snap.stats.insert(StatKey::new(*pid, *ph, *c as u16), *s);
        }
        snap
    }

    fn kind(_: u32, ph: PhaseId) -> Option<PhaseKind> {
        Some(if ph == 0 { PhaseKind::BeforeFork } else { PhaseKind::ChildAlive })
    }

    fn redis(_: u32) -> Option<ProcLabels> {
        Some(ProcLabels { comm: "redis-server".into(), cgroup: None, container: None })
    }

    /// The value of a sample line `name{labels} value`.
    fn sample(text: &str, prefix: &str) -> Option<f64> {
        text.lines().find(|l| l.starts_with(prefix)).map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
    }

    #[test]
    fn names_and_label_sets() {
        let mut m = metrics();
        m.update(&snap(&[(7, 0, KernelClass::Faults, stat(&[400, 500]))]), kind, redis);
        m.update_drops(&Drops(
            [(crate::kernel::drops::DropReason::Kernel(faultscope_common::maps::DropKind::StatsFull), 0)]
                .into(),
        ));
        m.fork("redis-server");
        let t = m.encode();
        assert!(t.ends_with("# EOF\n"), "{t}");
        for line in [
            "# TYPE faultscope_class_faults counter",
            "faultscope_class_faults_total{class=\"faults\",phase_kind=\"before-fork\",comm=\"redis-server\"} 2",
            "# TYPE faultscope_fault_duration_seconds histogram",
            "faultscope_fault_duration_seconds_count{class=\"faults\",comm=\"redis-server\"} 2",
            "# TYPE faultscope_class_measurable gauge",
            "faultscope_class_measurable{class=\"faults\",reason=\"\"} 1",
            "faultscope_class_measurable{class=\"reuse\",reason=\"needs:wp_page\"} 0",
            "faultscope_drops_total{reason=\"stats_map_full\"} 0",
            "faultscope_forks_total{comm=\"redis-server\"} 1",
            "faultscope_build_info{version=\"0.1.0\",kernel=\"6.12.0\",arch=\"x86_64\",backend=\"tracepoint\"} 1",
        ] {
            assert!(t.lines().any(|l| l == line), "{line} in\n{t}");
        }
        // A class that cannot be measured has no count at all, not a 0.
        assert!(!t.contains("faultscope_class_faults_total{class=\"reuse\""));
        // pid only when asked for.
        assert!(!t.contains("pid=\""));
        let info = BuildInfo {
            version: "v".into(),
            kernel: "k".into(),
            arch: "a".into(),
            backend: "b".into(),
            latency: Some(LatencyTier::Sample { every: 16 }),
        };
        let mut m = Metrics::new(&info, &avail(), LabelOpts { pid: true, cgroup: false, container: false });
        assert!(m.encode().lines().any(|l| l == "faultscope_latency_sample_every 16"), "{}", m.encode());
        assert!(!t.contains("faultscope_latency_sample_every"), "not stated without a fault path");
        m.update(&snap(&[(7, 0, KernelClass::Faults, stat(&[400]))]), kind, redis);
        assert!(m.encode().contains(
            "faultscope_class_faults_total{class=\"faults\",phase_kind=\"before-fork\",comm=\"redis-server\",pid=\"7\"} 1"
        ));
    }

    /// A torn read, higher or lower than the last, adds nothing; a clean
    /// one lower than the last is an entry made again, counted from 0.
    #[test]
    fn a_torn_read_adds_nothing() {
        let series = "faultscope_class_faults_total{class=\"faults\",phase_kind=\"before-fork\",comm=\"redis-server\"}";
        let read = |n: usize, torn: bool| Snapshot {
            torn,
            ..snap(&[(7, 0, KernelClass::Faults, stat(&vec![1; n]))])
        };
        let mut m = metrics();
        for (r, want) in [
            (read(3, false), 3.0),
            (read(5, true), 3.0),
            (read(2, true), 3.0),
            (read(4, false), 4.0),
            (read(1, false), 5.0),
        ] {
            m.update(&r, kind, redis);
            assert_eq!(sample(&m.encode(), series), Some(want));
        }
    }

    #[test]
    fn origins_are_series_of_their_own_that_add_up_to_the_class() {
        let mut m = metrics();
        let mut sn = snap(&[(7, 0, KernelClass::Copy, stat(&[100, 200, 300, 400]))]);
        sn.origins.insert(StatKey::new(7, 0, KernelClass::Copy as u16), [1, 2, 1]);
        m.update(&sn, kind, redis);
        let t = m.encode();
        let v = |o: &str| {
            sample(
                &t,
                &format!(
                    "faultscope_fault_origins_total{{class=\"copy\",origin=\"{o}\",phase_kind=\"before-fork\",comm=\"redis-server\"}}"
                ),
            )
        };
        assert_eq!((v("user"), v("kernel"), v("gup")), (Some(1.0), Some(2.0), Some(1.0)), "{t}");
        // Later counts add only what is new.
        sn.origins.insert(StatKey::new(7, 0, KernelClass::Copy as u16), [1, 5, 1]);
        m.update(&sn, kind, redis);
        let t = m.encode();
        assert_eq!(
            sample(
                &t,
                "faultscope_fault_origins_total{class=\"copy\",origin=\"kernel\",phase_kind=\"before-fork\",comm=\"redis-server\"}"
            ),
            Some(5.0)
        );
    }

    #[test]
    fn new_folios_and_copied_bytes_by_folio_size() {
        let mut m = metrics();
        let mut sn = snap(&[(7, 0, KernelClass::Copy, stat(&[100, 200, 300]))]);
        // 2 copies of 4K, 1 of 64K; 8 first touches of 2M.
        sn.folios.insert((7, 0, ReportClass::Copy, 0), 2);
        sn.folios.insert((7, 0, ReportClass::Copy, 4), 1);
        sn.folios.insert((7, 0, ReportClass::NotPresent, 9), 8);
        m.update(&sn, kind, redis);
        let t = m.encode();
        let at = |series: &str| sample(&t, series);
        let cow = |size: &str| {
            at(&format!(
                "faultscope_cow_copied_bytes_total{{folio_size=\"{size}\",phase_kind=\"before-fork\",comm=\"redis-server\"}}"
            ))
        };
        assert_eq!((cow("4K"), cow("64K"), cow("2M")), (Some(8192.0), Some(65536.0), None), "{t}");
        assert_eq!(
            at("faultscope_new_folios_total{class=\"not_present\",folio_size=\"2M\",phase_kind=\"before-fork\",comm=\"redis-server\"}"),
            Some(8.0),
            "{t}"
        );
        // Later counts add only what is new.
        sn.folios.insert((7, 0, ReportClass::Copy, 0), 5);
        m.update(&sn, kind, redis);
        let t = m.encode();
        assert_eq!(
            sample(&t, "faultscope_cow_copied_bytes_total{folio_size=\"4K\",phase_kind=\"before-fork\",comm=\"redis-server\"}"),
            Some(5.0 * 4096.0)
        );
    }

    /// Each outcome under its report name; later counts add what is new.
    #[test]
    fn huge_pmd_wp_outcomes_by_name() {
        use crate::kernel::classes::PmdOutcome;
        let mut m = metrics();
        let mut sn = snap(&[(7, 0, KernelClass::Copy, stat(&[100, 200, 300]))]);
        let all = [
            (PmdOutcome::Reused, 1),
            (PmdOutcome::Copied, 2),
            (PmdOutcome::Split, 3),
            (PmdOutcome::Other, 4),
        ];
        for (o, n) in all {
            sn.pmd_outcomes.insert((7, 0, o), n);
        }
        m.update(&sn, kind, redis);
        sn.pmd_outcomes.insert((7, 0, PmdOutcome::Split), 10);
        m.update(&sn, kind, redis);
        let t = m.encode();
        for (name, want) in [("reused", 1.0), ("copied", 2.0), ("split", 10.0), ("other", 4.0)] {
            let series = format!(
                "faultscope_huge_pmd_wp_outcomes_total{{outcome=\"{name}\",phase_kind=\"before-fork\",comm=\"redis-server\"}}"
            );
            assert_eq!(sample(&t, &series), Some(want), "{series} in\n{t}");
        }
    }

    #[test]
    fn the_kinds_partition_the_faults_and_series_come_sorted() {
        use faultscope_common::{class::ClassSet, maps::ClassSetKey};
        let mut m = metrics();
        let sets = [
            (ClassSet::default().with(KernelClass::Faults), 5u64),
            (ClassSet::default().with(KernelClass::Faults).with(KernelClass::WriteFaults), 3),
            (
                ClassSet::default()
                    .with(KernelClass::Faults)
                    .with(KernelClass::WriteFaults)
                    .with(KernelClass::WpFaults)
                    .with(KernelClass::Copy),
                2,
            ),
            (ClassSet::default().with(KernelClass::ContpteUnfold), 9),
        ];
        let mut raw = std::collections::BTreeMap::new();
        for (pid, comm_pid) in [(7u32, 0u32), (8, 1)] {
            for (set, n) in &sets {
                let mut st = Stat::ZERO;
                for _ in 0..*n + comm_pid as u64 {
                    st.record(Some(100));
                }
                raw.insert(ClassSetKey { tgid: pid, phase: 0, set: set.0 }, st);
            }
        }
        let sn = Snapshot {
            stats: crate::collect::collector::per_class(&raw),
            kinds: crate::collect::collector::per_kind(&raw),
            ..Snapshot::default()
        };
        let names = |pid: u32| Some(ProcLabels { comm: format!("p{pid}"), cgroup: None, container: None });
        m.update(&sn, kind, names);
        let t = m.encode();
        for comm in ["p7", "p8"] {
            let kinds: u64 = t
                .lines()
                .filter(|l| {
                    l.starts_with("faultscope_faults_total{") && l.contains(&format!("comm=\"{comm}\""))
                })
                .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
                .sum();
            let all = sample(&t, &format!("faultscope_class_faults_total{{class=\"faults\",phase_kind=\"before-fork\",comm=\"{comm}\"}}"));
            assert_eq!(Some(kinds as f64), all, "{t}");
        }
        assert_eq!(
            sample(&t, "faultscope_faults_total{kind=\"copy\",phase_kind=\"before-fork\",comm=\"p7\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(&t, "faultscope_faults_total{kind=\"read\",phase_kind=\"before-fork\",comm=\"p8\"}"),
            Some(6.0)
        );
        // Sorted by labels, the same every time; a histogram's lines stay
        // together, its buckets in order.
        assert_eq!(m.encode(), t);
        let series: Vec<&str> = t.lines().filter(|l| l.starts_with("faultscope_faults_total{")).collect();
        let mut sorted = series.clone();
        sorted.sort();
        assert_eq!(series, sorted);
        let hist: Vec<&str> =
            t.lines().filter(|l| l.starts_with("faultscope_fault_duration_seconds")).collect();
        let p7 = hist.iter().position(|l| l.contains("comm=\"p7\"")).unwrap();
        let p8 = hist.iter().position(|l| l.contains("comm=\"p8\"")).unwrap();
        let per = hist::NBUCKETS + 2;
        assert!(hist[p7..p7 + per].iter().all(|l| l.contains("comm=\"p7\"")), "{t}");
        assert!(hist[p8..p8 + per].iter().all(|l| l.contains("comm=\"p8\"")), "{t}");
    }

    #[test]
    fn a_hostile_process_name_forges_no_series() {
        let mut m = metrics();
        let sn = snap(&[(7, 0, KernelClass::Faults, stat(&[100]))]);
        m.update(&sn, kind, |_| {
            Some(ProcLabels { comm: "x\"} 9e9\nf{a=\"\\".into(), cgroup: None, container: None })
        });
        let t = m.encode();
        let series: Vec<&str> =
            t.lines().filter(|l| l.starts_with("faultscope_class_faults_total{")).collect();
        assert_eq!(
            series,
            ["faultscope_class_faults_total{class=\"faults\",phase_kind=\"before-fork\",comm=\"x\\\"} 9e9\\nf{a=\\\"\\\\\"} 1"],
            "{t}"
        );
        assert!(!t.lines().any(|l| l.starts_with("f{")), "{t}");
    }

    #[test]
    fn declared_series_start_at_zero() {
        let mut m = metrics();
        m.declare("redis-server");
        let t = m.encode();
        for line in [
            "faultscope_class_faults_total{class=\"copy\",phase_kind=\"child-alive\",comm=\"redis-server\"} 0",
            "faultscope_class_faults_total{class=\"faults\",phase_kind=\"after-child-exec\",comm=\"redis-server\"} 0",
            "faultscope_forks_total{comm=\"redis-server\"} 0",
        ] {
            assert!(t.lines().any(|l| l == line), "{line} in\n{t}");
        }
        let n = t.lines().filter(|l| l.starts_with("faultscope_class_faults_total{")).count();
        assert_eq!(n, 2 * SERVE_KINDS.len(), "measured classes x serve's phase kinds");
        // serve takes no marks: no mark series.
        assert!(!t.contains("phase_kind=\"mark\""), "{t}");
        // The partition's kinds that can occur here (faults and copy are
        // measured: copy and read).
        for k in ["copy", "read"] {
            let line = format!(
                "faultscope_faults_total{{kind=\"{k}\",phase_kind=\"child-alive\",comm=\"redis-server\"}} 0"
            );
            assert!(t.lines().any(|l| l == line), "{line} in\n{t}");
        }
        // Not measurable: no series, not even a 0.
        assert!(!t.contains("class=\"reuse\",phase_kind"));
        assert!(!t.contains("faultscope_fault_duration_seconds_count{"));
        // The first counts go into the declared series.
        m.update(&snap(&[(7, 1, KernelClass::Copy, stat(&[1, 2]))]), kind, redis);
        let key =
            "faultscope_class_faults_total{class=\"copy\",phase_kind=\"child-alive\",comm=\"redis-server\"}";
        assert_eq!(sample(&m.encode(), key), Some(2.0));
    }

    #[test]
    fn a_phase_not_known_yet_is_counted_later_under_its_kind() {
        let mut m = metrics();
        let key = |k: &str| {
            format!(
                "faultscope_class_faults_total{{class=\"faults\",phase_kind=\"{k}\",comm=\"redis-server\"}}"
            )
        };
        m.update(&snap(&[(7, 1, KernelClass::Faults, stat(&[1, 2]))]), kind, redis);
        // Phase 2's start (a child's exit) is not read yet: held back, and
        // phase 1's counts still go on.
        let sn = snap(&[
            (7, 1, KernelClass::Faults, stat(&[1, 2, 3])),
            (7, 2, KernelClass::Faults, stat(&[4, 5])),
        ]);
        m.update(&sn, |_, ph| (ph < 2).then_some(PhaseKind::ChildAlive), redis);
        let t = m.encode();
        assert_eq!(sample(&t, &key("child-alive")), Some(3.0), "{t}");
        assert_eq!(sample(&t, &key("after-child-exit")).unwrap_or(0.0), 0.0, "{t}");
        // Its event read: all of its counts go to its own kind, none lost.
        let sn = snap(&[
            (7, 1, KernelClass::Faults, stat(&[1, 2, 3])),
            (7, 2, KernelClass::Faults, stat(&[4, 5, 6])),
        ]);
        m.update(
            &sn,
            |_, ph| Some(if ph < 2 { PhaseKind::ChildAlive } else { PhaseKind::AfterChildExit }),
            redis,
        );
        let t = m.encode();
        assert_eq!(sample(&t, &key("child-alive")), Some(3.0), "{t}");
        assert_eq!(sample(&t, &key("after-child-exit")), Some(3.0), "{t}");
    }

    #[test]
    fn prometheus_text_format() {
        let mut m = metrics();
        m.update(&snap(&[(7, 0, KernelClass::Faults, stat(&[400]))]), kind, redis);
        let t = to_text_004(&m.encode());
        assert!(t.contains("# TYPE faultscope_class_faults_total counter\n"));
        assert!(t.contains("# HELP faultscope_class_faults_total "));
        assert!(t.contains("# TYPE faultscope_fault_duration_seconds histogram\n"));
        assert!(!t.contains("# EOF"));
    }

    #[test]
    fn buckets_are_the_kernels_cumulative_with_exact_count_and_sum() {
        let vals = [0u64, 3, 400, 420, 450, 5000, 123_456, 1 << 41];
        let mut m = metrics();
        m.update(&snap(&[(7, 0, KernelClass::Faults, stat(&vals))]), kind, redis);
        let t = m.encode();
        let pre = "faultscope_fault_duration_seconds";
        let lab = "class=\"faults\",comm=\"redis-server\"";
        assert_eq!(sample(&t, &format!("{pre}_count{{{lab}}}")), Some(vals.len() as f64));
        let sum: u64 = vals.iter().sum();
        assert_eq!(sample(&t, &format!("{pre}_sum{{{lab}}}")), Some(sum as f64 / 1e9));
        let buckets: Vec<(f64, f64)> = t
            .lines()
            .filter(|l| l.starts_with(&format!("{pre}_bucket{{le=")) && l.contains(lab))
            .map(|l| {
                let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
                (le, l.rsplit(' ').next().unwrap().parse().unwrap())
            })
            .collect();
        // Every kernel bucket up to the highest used one (the last, a
        // catch-all, is +Inf).
        assert_eq!(buckets.len(), hist::NBUCKETS, "{t}");
        assert_eq!(buckets.last().unwrap(), &(f64::INFINITY, vals.len() as f64));
        for w in buckets.windows(2) {
            assert!(w[0].0 < w[1].0 && w[0].1 <= w[1].1, "{w:?}");
        }
        // Each value is counted at and above its bucket's le, below not.
        for &v in &vals[..vals.len() - 1] {
            let b = hist::bucket_of(v);
            let le = le_seconds(b);
            let at = buckets.iter().find(|(l, _)| *l == le).unwrap().1;
            let below = vals.iter().filter(|&&x| (x as f64 / 1e9) <= le).count() as f64;
            assert_eq!(at, below, "le {le}");
        }
        assert_eq!(le_seconds(hist::bucket_of(400)), 447e-9);
        // A histogram of fast faults only has every bucket too, from its
        // first scrape: none appears later.
        let mut m = metrics();
        m.update(&snap(&[(7, 0, KernelClass::Faults, stat(&[400]))]), kind, redis);
        let t = m.encode();
        let n = t.lines().filter(|l| l.starts_with(&format!("{pre}_bucket{{le="))).count();
        assert_eq!(n, hist::NBUCKETS, "{t}");
    }

    #[test]
    fn counters_stay_monotonic_across_phases_and_a_restart() {
        let mut m = metrics();
        let key =
            "faultscope_class_faults_total{class=\"copy\",phase_kind=\"child-alive\",comm=\"redis-server\"}";
        m.update(&snap(&[(7, 1, KernelClass::Copy, stat(&[1, 2, 3]))]), kind, redis);
        assert_eq!(sample(&m.encode(), key), Some(3.0));
        // More in the same phase, then a second child-alive phase.
        m.update(
            &snap(&[(7, 1, KernelClass::Copy, stat(&[1, 2, 3, 4])), (7, 2, KernelClass::Copy, stat(&[5]))]),
            kind,
            redis,
        );
        assert_eq!(sample(&m.encode(), key), Some(5.0));
        // Pid 7 exits: its entries are deleted and forgotten. Redis restarts
        // as pid 9 and counts from 0: the series goes on from 5.
        m.forget(|tgid, _| tgid == 7);
        assert_eq!(m.held(), 0);
        m.update(&snap(&[(9, 1, KernelClass::Copy, stat(&[1, 1]))]), kind, redis);
        let t = m.encode();
        assert_eq!(sample(&t, key), Some(7.0));
        let h = "faultscope_fault_duration_seconds_count{class=\"copy\",comm=\"redis-server\"}";
        assert_eq!(sample(&t, h), Some(7.0));
        // The same snapshot again adds nothing.
        m.update(&snap(&[(9, 1, KernelClass::Copy, stat(&[1, 1]))]), kind, redis);
        assert_eq!(sample(&m.encode(), key), Some(7.0));
        // Drops: the kernel's cumulative counters, added as they grow.
        m.update_drops(&Drops([(crate::kernel::drops::DropReason::AcceptErrors, 2)].into()));
        m.update_drops(&Drops([(crate::kernel::drops::DropReason::AcceptErrors, 5)].into()));
        assert_eq!(sample(&m.encode(), "faultscope_drops_total{reason=\"accept_errors\"}"), Some(5.0));
    }
}
