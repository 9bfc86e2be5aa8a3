//! Building the report from a snapshot of the kernel maps, the phase
//! timeline and what this kernel can measure.

use crate::kernel::drops::Drops;
use std::collections::BTreeMap;

use faultscope_common::{hist, KernelClass, Origin, PhaseId, Program, Stat};

use super::{
    attribution::{attribution, copy_sources, Namer},
    schema::{
        sum_classes, Attribution, AttributionInfo, CheckResult, ClassValue, Classes, Folios, Interval,
        IntervalOthers, IntervalProcess, KernelCheck, Latency, Measured, Mode, NotMeasurable, Origins,
        OtherProcesses, Phase, PmdOutcomes, ProbeStatus, Process, RawLatency, Report, SystemWide, SCHEMA,
    },
};
use crate::{
    collect::{
        accounting::KernelCount,
        attribution::attributable_here,
        collector::{latency, raw_latency, stack_frames, Snapshot},
        container::Container,
        engine::Recorder,
        phases::{Lifetime, Timeline},
        select::Bound,
    },
    kernel::{
        classes::{Availability, PmdOutcome, ReportClass},
        footprint::{self, Sizes},
        latency::LatencyTier,
        session,
    },
};

/// Everything a report is made of besides the counts.
pub struct Context<'a> {
    pub kernel: String,
    pub arch: &'static str,
    pub availability: &'a [(ReportClass, Availability)],
    pub probes: &'a [session::ProbeStatus],
    pub comms: &'a BTreeMap<u32, String>,
    /// When each traced process existed (see `Lifetime`).
    pub lifetimes: &'a BTreeMap<u32, Lifetime>,
    /// The kernel's own count of each process, bracketed (the check).
    pub accounting: &'a BTreeMap<u32, KernelCount>,
    /// Kernel-mode exceptions are traced (x86 `page_fault_kernel`): the
    /// tracepoint's classes have a kernel origin too.
    pub kernel_exceptions: bool,
    /// The order of each new anon folio is read (`copy` and `not_present`
    /// then have their folios by size).
    pub folio_sizes: bool,
    /// What came of a PMD write-protect fault can be told: a THP copy by
    /// its new folio's order, a split by the PTE fault after it.
    pub pmd_outcomes: bool,
    pub drops: Drops,
    pub duration_ns: u64,
    pub timeline: &'a Timeline,
    /// Names mappings, sites and stacks; without it (interval tables, the
    /// live view) the report has counts only.
    pub namer: Option<&'a Namer<'a>>,
    /// The time names are resolved at for the whole run (monotonic ns).
    pub now_ns: u64,
    /// Which faults are timed (none known in tracepoint mode).
    pub latency: Option<LatencyTier>,
    /// `-a`: the processes listed, the first `top` by `sort`.
    pub bound: Option<Bound>,
    /// Each process's container, pod or service.
    pub containers: &'a BTreeMap<u32, Container>,
}

/// The mode in one word: kprobes when the fault path is probed, else the
/// tracepoint-only fallback.
pub fn mode(avail: &[(ReportClass, Availability)]) -> Mode {
    match avail.iter().find(|(m, _)| *m == ReportClass::Faults) {
        Some((_, Availability::Measured { class: KernelClass::Faults, .. })) => Mode::Kprobe,
        Some((_, Availability::Measured { .. })) => Mode::Tracepoint,
        _ => Mode::None,
    }
}

/// One class of one process, over the run (`phase == None`) or in one phase.
fn class_value(
    snap: &Snapshot,
    (tgid, phase): (u32, Option<u32>),
    (m, a): (ReportClass, &Availability),
    ctx: &Context<'_>,
) -> ClassValue {
    match a {
        Availability::NotMeasurable(reason) => {
            ClassValue::NotMeasurable(NotMeasurable { measurable: false, reason: reason.clone() })
        }
        Availability::Measured { class, timed, source } => {
            let s = snap.get_in(tgid, phase, *class);
            let latency = if *timed {
                s.as_ref().and_then(|s| latency(s).map(|l| (l, buckets(s), raw_latency(s))))
            } else {
                None
            };
            let by = snap.origins_in(tgid, phase, *class);
            // The exception tracepoints see no get_user_pages fault, and
            // kernel-mode faults only where page_fault_kernel is traced.
            let exception = KernelClass::ERROR_CODE.contains(class);
            let origins = Origins {
                user: by[Origin::User as usize],
                kernel: (!exception || ctx.kernel_exceptions).then_some(by[Origin::Kernel as usize]),
                gup: (!exception).then_some(by[Origin::Gup as usize]),
            };
            let folios = (ctx.folio_sizes && matches!(m, ReportClass::Copy | ReportClass::NotPresent))
                .then(|| Folios::from_orders(&snap.folios_in(tgid, phase, m)));
            let outcomes = (ctx.pmd_outcomes && m == ReportClass::HugePmdWp)
                .then(|| pmd_outcomes(&snap.pmd_outcomes_in(tgid, phase)));
            ClassValue::Measured(Measured {
                count: s.map(|s| s.count).unwrap_or(0),
                origins: Some(origins),
                folios: folios.map(Box::new),
                sources: None,
                outcomes: outcomes.map(Box::new),
                latency: latency.map(|(l, buckets, raw)| Latency {
                    p50_ns: l.p50_ns,
                    p99_ns: l.p99_ns,
                    max_ns: l.max_ns,
                    mean_ns: l.mean_ns,
                    sum_ns: l.sum_ns,
                    buckets,
                    raw: raw.map(|(r, own_mean_ns)| RawLatency {
                        p50_ns: r.p50_ns,
                        p99_ns: r.p99_ns,
                        max_ns: r.max_ns,
                        mean_ns: r.mean_ns,
                        own_mean_ns,
                    }),
                }),
                source: source.to_string(),
            })
        }
    }
}

fn pmd_outcomes(by: &BTreeMap<PmdOutcome, u64>) -> PmdOutcomes {
    let n = |o| by.get(&o).copied().unwrap_or(0);
    PmdOutcomes {
        reused: n(PmdOutcome::Reused),
        copied: n(PmdOutcome::Copied),
        split: n(PmdOutcome::Split),
        other: n(PmdOutcome::Other),
    }
}

/// The histogram's buckets that counted something, as the report keeps
/// them (`Latency::buckets`). Values past the last bucket's range are
/// counted in it: its upper end is then past the exact maximum.
fn buckets(s: &Stat) -> Vec<[u64; 3]> {
    s.hist
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(i, c)| {
            let (lo, hi) = hist::bucket_range(i);
            let hi = if i == hist::NBUCKETS - 1 { hi.max(s.max_ns.saturating_add(1)) } else { hi };
            [lo, hi, *c]
        })
        .collect()
}

fn classes(snap: &Snapshot, tgid: u32, phase: Option<u32>, ctx: &Context<'_>) -> Classes {
    let mut c: Classes =
        ctx.availability.iter().map(|(m, a)| (*m, class_value(snap, (tgid, phase), (*m, a), ctx))).collect();
    if phase.is_none() {
        if let Some(major) = major_from_the_kernel(tgid, ctx) {
            c.insert(ReportClass::Major, major);
        }
    }
    c
}

/// `major` over a process's run where no probe can classify a fault
/// (tracepoint mode): the kernel's own `maj_flt` between the run's
/// bracketed reads, when that is exact. Its phases stay not measurable.
fn major_from_the_kernel(tgid: u32, ctx: &Context<'_>) -> Option<ClassValue> {
    let measured = ctx
        .availability
        .iter()
        .any(|(m, a)| *m == ReportClass::Major && matches!(a, Availability::Measured { .. }));
    if measured {
        return None;
    }
    let w = ctx.accounting.get(&tgid)?.window().ok()?;
    (w.maj.0 == w.maj.1).then(|| {
        ClassValue::Measured(Measured {
            count: w.maj.0,
            source: "the kernel's maj_flt over the run (/proc/PID/stat), whole run only".into(),
            ..Measured::default()
        })
    })
}

/// What faultscope counted that the kernel's `min_flt` + `maj_flt` also
/// counts, per mode.
const COMPLETED: &str = "completed handle_mm_fault calls of every origin (no VM_FAULT_RETRY, no error)";

/// The kernel check of process `tgid` (see `collect::accounting`).
fn kernel_check(snap: &Snapshot, tgid: u32, ctx: &Context<'_>) -> Option<KernelCheck> {
    let k = ctx.accounting.get(&tgid)?;
    let a = snap.accounted_of(tgid);
    let mode = mode(ctx.availability);
    let (faultscope, counted) = match mode {
        Mode::Kprobe => (a.completed, COMPLETED.to_string()),
        Mode::Tracepoint => (
            a.exceptions.iter().sum(),
            if ctx.kernel_exceptions {
                "page-fault exceptions in user and kernel mode (tracepoint mode)"
            } else {
                "page-fault exceptions in user mode (tracepoint mode)"
            }
            .to_string(),
        ),
        _ => return None,
    };
    let mut c = KernelCheck {
        result: CheckResult::NotChecked,
        minflt: None,
        majflt: None,
        kernel_low: None,
        kernel_high: None,
        faultscope,
        counted,
        difference: 0,
        bracket: None,
        gup_derived: None,
        reason: None,
    };
    let w = match k.window() {
        Ok(w) => w,
        Err(why) => {
            c.reason = Some(why);
            return Some(c);
        }
    };
    let (lo, hi) = w.total();
    c.minflt = Some(w.min.0);
    c.majflt = Some(w.maj.0);
    c.kernel_low = Some(lo);
    c.kernel_high = Some(hi);
    c.bracket = Some(w.how);
    let dropped = ctx.drops.of_counts();
    if mode == Mode::Tracepoint {
        derive_gup(&mut c, (lo, hi), dropped);
        return Some(c);
    }
    if (lo..=hi).contains(&faultscope) {
        c.result = if lo == hi { CheckResult::Equal } else { CheckResult::WithinBracket };
        return Some(c);
    }
    c.result = CheckResult::Differs;
    c.difference =
        if faultscope < lo { faultscope as i64 - lo as i64 } else { faultscope as i64 - hi as i64 };
    c.reason = Some(match dropped {
        Some(d) => format!("the kernel side dropped records that hold counts ({d}; see drops)"),
        None => "faultscope did not see every fault the kernel accounted (or saw more): a fault path outside handle_mm_fault's probes".into(),
    });
    Some(c)
}

/// Tracepoint mode's check of `c` against the kernel's count `lo..=hi`:
/// get_user_pages takes no exception, so the kernel's count minus
/// faultscope's exceptions is what no exception showed (`gup_derived`).
/// Derived only from a run that dropped nothing that holds counts
/// (`dropped`: [`Drops::of_counts`]), and never below 0: more exceptions
/// than the kernel's count differs (a bad access that raised a signal, a
/// fault that failed: the kernel accounts neither); with drops the count
/// of exceptions is short by an unknown number, and nothing is derived.
fn derive_gup(c: &mut KernelCheck, (lo, hi): (u64, u64), dropped: Option<String>) {
    let faultscope = c.faultscope;
    let also = dropped
        .as_deref()
        .map(|d| format!("; the kernel side also dropped records that hold counts ({d}; see drops)"));
    if faultscope > hi {
        c.result = CheckResult::Differs;
        c.difference = faultscope as i64 - hi as i64;
        c.reason = Some(format!(
            "faultscope counted more page-fault exceptions than the kernel accounted faults: exceptions that completed no fault (a bad access that raised a signal, a fault that failed){}",
            also.unwrap_or_default()
        ));
        return;
    }
    if let Some(d) = dropped {
        c.result = CheckResult::NotChecked;
        c.reason = Some(format!(
            "the kernel side dropped records that hold counts ({d}; see drops): faultscope's count of exceptions is short by an unknown number, so the faults without an exception (get_user_pages) are not derived"
        ));
        return;
    }
    c.result = CheckResult::Derived;
    c.gup_derived = Some((lo.saturating_sub(faultscope) as i64, (hi - faultscope) as i64));
    c.reason = Some(
        "get_user_pages faults take no exception, and some kernel-mode exceptions reach no fault (a copy with page faults disabled): the rest of the kernel's count is derived, not checked".into(),
    );
}

/// `c` with its copies split by the kind of mapping they were in, the
/// mappings named as of `at`.
fn with_sources(
    mut c: Classes,
    snap: &Snapshot,
    ctx: &Context<'_>,
    span: (u32, Option<u32>),
    at: u64,
) -> Classes {
    if let (Some(n), Some(ClassValue::Measured(x))) = (ctx.namer, c.get_mut(&ReportClass::Copy)) {
        x.sources = copy_sources(snap, n, span, at, x.count).map(Box::new);
    }
    c
}

fn attrib(snap: &Snapshot, ctx: &Context<'_>, tgid: u32, phase: Option<u32>, at: u64) -> Attribution {
    match ctx.namer {
        Some(n) => attribution(snap, n, tgid, phase, at),
        None => Attribution::default(),
    }
}

/// The timeline's phases, indexed to find a process's phases without
/// walking all of them: the report grows with processes + phases + counts,
/// not with their product.
struct PhaseIndex {
    /// (start, position in the timeline), by start.
    by_start: Vec<(u64, usize)>,
    by_id: BTreeMap<PhaseId, Vec<usize>>,
}

impl PhaseIndex {
    fn new(t: &Timeline) -> PhaseIndex {
        let mut by_start: Vec<(u64, usize)> =
            t.phases().iter().enumerate().map(|(i, p)| (p.start_ns, i)).collect();
        by_start.sort_unstable();
        let mut by_id: BTreeMap<PhaseId, Vec<usize>> = BTreeMap::new();
        for (i, p) in t.phases().iter().enumerate() {
            by_id.entry(p.id).or_default().push(i);
        }
        PhaseIndex { by_start, by_id }
    }

    /// Positions of the phases a process carries, in timeline order: those
    /// that overlap its lifetime, and those in which it has counts (all
    /// phases it has counts in, for a process without a known lifetime).
    fn carried(&self, t: &Timeline, snap: &Snapshot, tgid: u32, life: Option<&Lifetime>) -> Vec<usize> {
        let phases = t.phases();
        let mut out: Vec<usize> =
            snap.phases_of(tgid).iter().filter_map(|id| self.by_id.get(id)).flatten().copied().collect();
        if let Some(l) = life {
            // Phases run one after another: those overlapping [start, end)
            // begin with the one current at its start.
            let lo = self.by_start.partition_point(|(s, _)| *s <= l.start_ns).saturating_sub(1);
            let hi = self.by_start.partition_point(|(s, _)| *s < l.end_ns.unwrap_or(u64::MAX));
            out.extend(
                self.by_start[lo..hi.max(lo)].iter().map(|(_, i)| *i).filter(|i| l.overlaps(&phases[*i])),
            );
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

pub fn build(snap: &Snapshot, ctx: &Context<'_>) -> Report {
    let index = PhaseIndex::new(ctx.timeline);
    let all = ctx.timeline.phases();
    let (listed, system_wide) = match ctx.bound {
        Some(b) => bounded(snap, ctx, b),
        None => (pids(snap, ctx), None),
    };
    let processes = listed
        .into_iter()
        .map(|tgid| Process {
            pid: tgid,
            comm: ctx.comms.get(&tgid).cloned().unwrap_or_default(),
            classes: with_sources(classes(snap, tgid, None, ctx), snap, ctx, (tgid, None), ctx.now_ns),
            attribution: attrib(snap, ctx, tgid, None, ctx.now_ns),
            kernel_check: kernel_check(snap, tgid, ctx),
            container: ctx.containers.get(&tgid).filter(|c| c.is_known()).cloned(),
            phases: index
                .carried(ctx.timeline, snap, tgid, ctx.lifetimes.get(&tgid))
                .into_iter()
                .map(|i| {
                    let ph = &all[i];
                    Phase {
                        id: ph.id,
                        name: ph.name.clone(),
                        kind: ph.kind,
                        start_ns: ph.start_ns,
                        end_ns: ph.end_ns,
                        children_alive: ph.children_alive as u64,
                        // Named as of the phase's end: the maps snapshot
                        // of a phase is taken once its event is read, after
                        // its start, and a mapping may grow (brk) before it.
                        classes: with_sources(
                            classes(snap, tgid, Some(ph.id), ctx),
                            snap,
                            ctx,
                            (tgid, Some(ph.id)),
                            ph.end_ns.unwrap_or(ctx.now_ns),
                        ),
                        attribution: attrib(snap, ctx, tgid, Some(ph.id), ph.end_ns.unwrap_or(ctx.now_ns)),
                    }
                })
                .collect(),
        })
        .collect();
    Report {
        schema: SCHEMA.into(),
        kernel: ctx.kernel.clone(),
        arch: ctx.arch.into(),
        mode: mode(ctx.availability),
        latency: ctx.latency,
        latency_window: ctx
            .latency
            .filter(|t| *t != LatencyTier::Off)
            .map(|_| crate::kernel::session::latency_window(ctx.probes)),
        duration_ns: ctx.duration_ns,
        probes: ctx
            .probes
            .iter()
            .map(|p| ProbeStatus {
                program: p.program.to_string(),
                target: p.target.clone(),
                attached: p.attached,
                reason: p.reason.clone(),
                backend: p.kind.map(String::from),
                backend_reason: p.backend_reason.clone(),
            })
            .collect(),
        drops: ctx.drops.clone(),
        processes,
        system_wide,
        availability: ctx
            .availability
            .iter()
            .filter_map(|(m, a)| match a {
                Availability::NotMeasurable(r) => Some((*m, r.clone())),
                _ => None,
            })
            .collect(),
        attribution: ctx.namer.map(|n| info(n)),
        ..Report::default()
    }
}

fn info(n: &Namer<'_>) -> AttributionInfo {
    let (site_classes, sites_reason) = attributable_here(&n.attrib.opts.sites, n.avail);
    let (stack_classes, stacks_reason) = attributable_here(&n.attrib.opts.stacks, n.avail);
    AttributionInfo {
        mappings: n.attrib.mappings.is_ok(),
        mappings_reason: n.attrib.mappings.as_ref().err().cloned(),
        site_classes,
        sites_reason,
        stack_classes,
        stacks_reason,
        max_mappings: n.attrib.opts.max_mappings as u64,
        max_sites: n.attrib.opts.max_sites as u64,
    }
}

/// `f` of each timed class of `pid` that timed faults in `delta`.
fn timed_in(
    delta: &Snapshot,
    ctx: &Context<'_>,
    pid: u32,
    f: impl Fn(&faultscope_common::maps::Stat) -> u64,
) -> BTreeMap<ReportClass, u64> {
    ctx.availability
        .iter()
        .filter_map(|(m, a)| match a {
            Availability::Measured { class, timed: true, .. } => {
                let s = delta.get(pid, *class)?;
                (s.timed() > 0).then(|| (*m, f(&s)))
            }
            _ => None,
        })
        .collect()
}

/// One interval of the time series: what each process did in it (the
/// measured classes), in the phase that was current at its end.
pub fn interval(delta: &Snapshot, ctx: &Context<'_>, elapsed_s: f64) -> Interval {
    let mut processes: Vec<IntervalProcess> = delta
        .pids()
        .into_iter()
        .map(|pid| IntervalProcess {
            pid,
            p99_ns: timed_in(delta, ctx, pid, |s| crate::collect::collector::percentile(&s.hist, 0.99, 0)),
            sum_ns: timed_in(delta, ctx, pid, |s| s.sum_ns),
            counts: ctx
                .availability
                .iter()
                .filter_map(|(m, a)| match a {
                    Availability::Measured { class, .. } => {
                        Some((*m, delta.get(pid, *class).map(|s| s.count).unwrap_or(0)))
                    }
                    Availability::NotMeasurable(_) => None,
                })
                .collect(),
        })
        .collect();
    let others = ctx.bound.map(|b| {
        let key = |p: &IntervalProcess| p.counts.get(&b.sort).copied().unwrap_or(0);
        processes.sort_by(|x, y| key(y).cmp(&key(x)).then(x.pid.cmp(&y.pid)));
        let rest = processes.split_off(b.top.min(processes.len()));
        let mut o = IntervalOthers { processes: rest.len() as u64, ..Default::default() };
        for p in &rest {
            for (m, n) in &p.counts {
                *o.counts.entry(*m).or_insert(0) += n;
            }
        }
        o
    });
    let ids: std::collections::BTreeSet<PhaseId> =
        delta.pids().into_iter().flat_map(|pid| delta.phases_of(pid)).collect();
    let phases =
        ctx.timeline.phases().iter().filter(|p| ids.contains(&p.id)).map(|p| p.name.clone()).collect();
    Interval { t_s: elapsed_s, phase: ctx.timeline.current().name.clone(), phases, processes, others }
}

/// Under `-a`: the processes that faulted, the first `b.top` by `b.sort`
/// (ties by pid) to list, and the others summed.
fn bounded(snap: &Snapshot, ctx: &Context<'_>, b: Bound) -> (Vec<u32>, Option<SystemWide>) {
    let key = |pid: u32| classes(snap, pid, None, ctx).get(&b.sort).and_then(ClassValue::count).unwrap_or(0);
    let mut ranked: Vec<(u64, u32)> = snap.pids().into_iter().map(|p| (key(p), p)).collect();
    ranked.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
    let faulted = ranked.len() as u64;
    let rest = ranked.split_off(b.top.min(ranked.len()));
    // No process past the top: every class still present, at 0 (no tgid
    // is `u32::MAX`).
    let others: Vec<Classes> = match rest.is_empty() {
        true => vec![classes(snap, u32::MAX, None, ctx)],
        false => rest.iter().map(|(_, p)| classes(snap, *p, None, ctx)).collect(),
    };
    let other = OtherProcesses { processes: rest.len() as u64, classes: sum_classes(&others) };
    let sw = SystemWide { sort: b.sort, top: b.top as u64, faulted, other };
    (ranked.into_iter().map(|(_, p)| p).collect(), Some(sw))
}

/// Processes to show: those with counts, plus traced ones without any.
fn pids(snap: &Snapshot, ctx: &Context<'_>) -> Vec<u32> {
    let mut v = snap.pids();
    v.extend(ctx.comms.keys().copied());
    v.sort_unstable();
    v.dedup();
    v
}

/// The reports of a traced session: built here, from what the session
/// holds, so that every command (record, bench, serve) builds them alike.
impl Recorder {
    pub fn context(&self) -> anyhow::Result<Context<'_>> {
        Ok(Context {
            kernel: crate::kernel::release(),
            arch: std::env::consts::ARCH,
            availability: &self.avail,
            probes: &self.session.status,
            comms: &self.comms,
            lifetimes: &self.lifetimes,
            accounting: &self.accounting,
            kernel_exceptions: self.session.attached(Program::PageFaultKernel),
            folio_sizes: self.session.attached(Program::NewAnonRmap) && self.session.folio_order.is_ok(),
            pmd_outcomes: self.session.attached(Program::NewAnonRmap)
                && self.session.folio_order.is_ok()
                && self.session.attached(Program::WpPage),
            drops: self.drops()?,
            duration_ns: self.started.elapsed().as_nanos() as u64,
            timeline: &self.timeline,
            namer: None,
            now_ns: crate::kernel::monotonic_ns(),
            latency: self.latency,
            bound: self.bound,
            containers: &self.containers,
        })
    }

    /// The counts in `snap` (an interval, the live view), without names,
    /// every process listed (the live view bounds its own rows).
    pub fn counts(&self, snap: &Snapshot) -> anyhow::Result<Report> {
        Ok(build(snap, &Context { bound: None, ..self.context()? }))
    }

    /// The report of `snap` with its attribution named.
    pub fn report(&self, snap: &Snapshot) -> anyhow::Result<Report> {
        let frames = |id: i32| stack_frames(&self.session.bpf, id);
        let namer = Namer::new(&self.attrib, &self.avail, &frames);
        let mut ctx = self.context()?;
        ctx.namer = Some(&namer);
        Ok(build(snap, &ctx))
    }

    /// Ends the last phase and builds the final report.
    pub fn finish(&mut self, snap: &Snapshot) -> anyhow::Result<Report> {
        self.drain_events()?;
        self.snapshot_maps("end");
        self.timeline.end(crate::kernel::monotonic_ns());
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

#[cfg(test)]
mod tests {
    use super::*;
    use faultscope_common::StatKey;

    #[test]
    fn no_fault_path_is_tracepoint_mode() {
        let avail = vec![
            (
                ReportClass::Faults,
                Availability::Measured {
                    class: faultscope_common::KernelClass::TpFaults,
                    timed: false,
                    source: "t",
                },
            ),
            (ReportClass::Reuse, Availability::NotMeasurable("no PMU".into())),
        ];
        assert_eq!(mode(&avail), Mode::Tracepoint);
    }

    /// A context of these tables on a 6.18 x86-64 kernel, nothing dropped,
    /// nothing timed, every process listed.
    fn context<'a>(
        avail: &'a [(ReportClass, Availability)],
        comms: &'a BTreeMap<u32, String>,
        timeline: &'a Timeline,
        lifetimes: &'a BTreeMap<u32, Lifetime>,
        accounting: &'a BTreeMap<u32, KernelCount>,
    ) -> Context<'a> {
        Context {
            kernel: "6.18".into(),
            arch: "x86_64",
            availability: avail,
            probes: &[],
            comms,
            lifetimes,
            accounting,
            kernel_exceptions: false,
            folio_sizes: false,
            pmd_outcomes: false,
            drops: Drops::default(),
            duration_ns: 1,
            timeline,
            namer: None,
            bound: None,
            now_ns: 0,
            latency: None,
            containers: &NO_CONTAINERS,
        }
    }

    static NO_CONTAINERS: BTreeMap<u32, Container> = BTreeMap::new();

    pub fn snap() -> Snapshot {
        let mut stats = BTreeMap::new();
        let mut s = Stat::ZERO;
        for v in [400u64, 420, 450, 5000] {
            s.record(Some(v));
        }
        stats.insert(
            StatKey { tgid: 42, phase: 0, class: KernelClass::Faults as u16, ..Default::default() },
            s,
        );
        Snapshot { stats, ..Snapshot::default() }
    }

    #[test]
    fn report_shape() {
        let avail = vec![
            (
                ReportClass::Faults,
                Availability::Measured { class: KernelClass::Faults, timed: true, source: "k" },
            ),
            (ReportClass::Reuse, Availability::NotMeasurable("no kprobe PMU".into())),
            (
                ReportClass::Copy,
                Availability::Measured { class: KernelClass::Copy, timed: true, source: "k" },
            ),
        ];
        let comms: BTreeMap<u32, String> = [(42, "w".to_string())].into();
        let timeline = Timeline::new(0, 0);
        let lifetimes = BTreeMap::new();
        let accounting = BTreeMap::new();
        let ctx = Context {
            kernel: "6.12".into(),
            drops: Drops(
                [(
                    crate::kernel::drops::DropReason::Kernel(faultscope_common::maps::DropKind::LostReturn),
                    1,
                )]
                .into(),
            ),
            latency: Some(LatencyTier::All),
            ..context(&avail, &comms, &timeline, &lifetimes, &accounting)
        };
        let r = build(&snap(), &ctx);
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["schema"], SCHEMA);
        assert_eq!(j["mode"], "kprobe");
        let p = &j["processes"][0];
        assert_eq!(p["pid"], 42);
        assert_eq!(p["classes"]["faults"]["count"], 4);
        assert_eq!(p["classes"]["faults"]["max_ns"], 5000);
        assert!(p["classes"]["faults"]["p50_ns"].as_u64().unwrap() >= 384);
        // The kernel's buckets that counted, ascending: [lo, hi) and count.
        assert_eq!(
            p["classes"]["faults"]["buckets"],
            serde_json::json!([[384, 448, 2], [448, 512, 1], [4096, 5120, 1]])
        );
        assert_eq!(p["classes"]["reuse"]["measurable"], false);
        // Measured but nothing happened: a real 0, without latency.
        assert_eq!(p["classes"]["copy"]["count"], 0);
        assert!(p["classes"]["copy"].get("p50_ns").is_none());
        assert_eq!(j["drops"]["lost_kretprobe_returns"], 1);
        assert_eq!(p["phases"][0]["name"], "before-fork");
        assert_eq!(p["phases"][0]["kind"], "before-fork");
        assert_eq!(p["phases"][0]["classes"]["faults"]["count"], 4);
        // Written and read back through the schema types: equal, the
        // reasons stored once.
        assert!(p["classes"]["reuse"].get("reason").is_none());
        assert!(j["availability"]["reuse"].as_str().is_some_and(|r| !r.is_empty()));
        let mut back: Report = serde_json::from_value(j).unwrap();
        back.restore_reasons();
        assert_eq!(back, r);
    }

    /// `-a`: the first `top` by the sort class are listed (ties by pid),
    /// the others summed, in the report and in each interval; a process
    /// known by name but without faults is not a row.
    #[test]
    fn every_process_is_bounded_to_the_top_and_the_others_summed() {
        let avail = vec![(
            ReportClass::Faults,
            Availability::Measured { class: KernelClass::TpFaults, timed: false, source: "t" },
        )];
        let mut stats = BTreeMap::new();
        for (tgid, n) in [(7u32, 5u64), (8, 50), (9, 5), (10, 1)] {
            let mut s = Stat::ZERO;
            for _ in 0..n {
                s.record(None);
            }
            stats.insert(
                StatKey { tgid, phase: 0, class: KernelClass::TpFaults as u16, ..Default::default() },
                s,
            );
        }
        let snap = Snapshot { stats, ..Snapshot::default() };
        let comms: BTreeMap<u32, String> = [(11, "idle".to_string())].into();
        let (timeline, lifetimes, accounting) = (Timeline::new(0, 0), BTreeMap::new(), BTreeMap::new());
        let ctx = Context {
            bound: Some(Bound { sort: ReportClass::Faults, top: 2 }),
            ..context(&avail, &comms, &timeline, &lifetimes, &accounting)
        };
        let r = build(&snap, &ctx);
        let listed: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
        assert_eq!(listed, [8, 7]);
        let sw = r.system_wide.as_ref().unwrap();
        assert_eq!((sw.faulted, sw.other.processes), (4, 2));
        assert_eq!(sw.other.classes[&ReportClass::Faults].count(), Some(6));
        let iv = interval(&snap, &ctx, 1.0);
        assert_eq!(iv.processes.iter().map(|p| p.pid).collect::<Vec<_>>(), [8, 7]);
        let o = iv.others.unwrap();
        assert_eq!((o.processes, o.counts[&ReportClass::Faults]), (2, 6));
        // Nobody past the top: the others are zeros, every class present.
        let all = build(&snap, &Context { bound: Some(Bound { sort: ReportClass::Faults, top: 9 }), ..ctx });
        let sw = all.system_wide.unwrap();
        assert_eq!((sw.other.processes, sw.other.classes[&ReportClass::Faults].count()), (0, Some(0)));
        let text = crate::report::text::to_text(&r);
        assert!(text.contains("EVERY PROCESS: 4 faulted; the 2 with the most faults listed"), "{text}");
        assert!(text.contains("(2 others)"), "{text}");
        assert!(text.contains("ALL (4 processes) whole run"), "{text}");
    }

    /// A tracepoint-mode context whose process 42 ran from its exec to its
    /// exit with the kernel's count `kernel`, and `drops`.
    fn tracepoint_check(exceptions: u64, kernel: u64, drops: Drops) -> KernelCheck {
        use crate::collect::{
            accounting::{End, Start},
            collector::Accounted,
        };
        use faultscope_common::FltCount;
        let avail = vec![(
            ReportClass::Faults,
            Availability::Measured { class: KernelClass::TpFaults, timed: false, source: "t" },
        )];
        let comms: BTreeMap<u32, String> = [(42, "w".to_string())].into();
        let timeline = Timeline::new(0, 0);
        let lifetimes = BTreeMap::new();
        let mut k = KernelCount::new(Start::Exact(FltCount { min: 100, maj: 0 }, "its exec"));
        k.end = Some(End::Exited(FltCount { min: 100 + kernel, maj: 0 }));
        let accounting: BTreeMap<u32, KernelCount> = [(42, k)].into();
        let ctx = Context {
            kernel_exceptions: true,
            drops,
            latency: Some(LatencyTier::All),
            ..context(&avail, &comms, &timeline, &lifetimes, &accounting)
        };
        let mut snap = Snapshot::default();
        let mut a = Accounted::default();
        a.exceptions[Origin::User as usize] = exceptions;
        snap.accounted.insert((42, 0), a);
        kernel_check(&snap, 42, &ctx).expect("a check")
    }

    fn drops_of(pairs: &[(faultscope_common::maps::DropKind, u64)]) -> Drops {
        use crate::kernel::drops::DropReason;
        let mut d = Drops::default();
        for (r, n) in pairs {
            d.set(DropReason::Kernel(*r), *n);
        }
        d
    }

    #[test]
    fn tracepoint_mode_derives_what_no_exception_shows() {
        let c = tracepoint_check(2070, 2075, Drops::default());
        assert_eq!(c.result, CheckResult::Derived, "{c:?}");
        assert_eq!(c.gup_derived, Some((5, 5)));
        // Drops that cost no count (names, /proc) derive as well.
        let c = tracepoint_check(2070, 2075, drops_of(&[(faultscope_common::maps::DropKind::SitesFull, 9)]));
        assert_eq!(c.result, CheckResult::Derived, "{c:?}");
    }

    /// `stats_map_full` 436: the exceptions faultscope lost are not
    /// get_user_pages faults (the report said "65 faults without an
    /// exception (get_user_pages)").
    #[test]
    fn drops_are_never_derived() {
        use faultscope_common::maps::DropKind;
        for d in [
            DropKind::StatsFull,
            DropKind::ThreadStateFailed,
            DropKind::ReadFailed,
            DropKind::ExitedFull,
            DropKind::LostReturn,
        ] {
            let c = tracepoint_check(2005, 2070, drops_of(&[(d, 436)]));
            assert_eq!(c.result, CheckResult::NotChecked, "{d:?}: {c:?}");
            assert_eq!(c.gup_derived, None, "{c:?}");
            let why = c.reason.as_deref().unwrap();
            assert!(why.contains(&format!("{} 436", d.key())) && why.contains("not derived"), "{why}");
            let line = crate::report::text::check_line(&c);
            assert!(line.contains(d.key()) && !line.contains("derived:"), "the line says why: {line}");
        }
        // 299,809 faults dropped while faultscope was stopped: never
        // presented as get_user_pages faults.
        let c = tracepoint_check(1000, 300_809, drops_of(&[(DropKind::StatsFull, 299_809)]));
        assert_ne!(c.result, CheckResult::Derived, "{c:?}");
        assert_eq!(c.gup_derived, None);
    }

    /// More exceptions than the kernel's count: a difference, never a
    /// negative number of get_user_pages faults.
    #[test]
    fn a_negative_difference_is_never_derived() {
        let c = tracepoint_check(2070, 2060, Drops::default());
        assert_eq!(c.result, CheckResult::Differs, "{c:?}");
        assert_eq!((c.difference, c.gup_derived), (10, None));
        assert!(c.reason.as_deref().unwrap().contains("more page-fault exceptions"), "{c:?}");
        // With drops too: still a difference (drops only lose exceptions).
        let c = tracepoint_check(2070, 2060, drops_of(&[(faultscope_common::maps::DropKind::StatsFull, 3)]));
        assert_eq!((c.result, c.difference), (CheckResult::Differs, 10), "{c:?}");
        assert!(c.reason.as_deref().unwrap().contains("stats_map_full 3"), "{c:?}");
    }

    /// A bracket (a process attached with `-p`) whose low end is below the
    /// exceptions: the derived range starts at 0, not below.
    #[test]
    fn a_derived_range_starts_at_zero() {
        use crate::collect::accounting::{Bracket, End, Start};
        use faultscope_common::FltCount;
        let flt = |min| FltCount { min, maj: 0 };
        let mut k = KernelCount::new(Start::Proc {
            whole: Bracket { lo: flt(100), hi: flt(110) },
            threads: Bracket { lo: flt(100), hi: flt(110) },
        });
        k.end = Some(End::Proc(Bracket { lo: flt(200), hi: flt(205) }));
        let mut c = KernelCheck {
            result: CheckResult::NotChecked,
            minflt: None,
            majflt: None,
            kernel_low: None,
            kernel_high: None,
            faultscope: 95,
            counted: String::new(),
            difference: 0,
            bracket: None,
            gup_derived: None,
            reason: None,
        };
        let (lo, hi) = k.window().unwrap().total();
        assert_eq!((lo, hi), (90, 105));
        derive_gup(&mut c, (lo, hi), None);
        assert_eq!((c.result, c.gup_derived), (CheckResult::Derived, Some((0, 10))), "{c:?}");
    }
}
