//! The threaded-storm guest case (`storm4k@BACKEND` of the foundation
//! test): `fs-workload --threads`, two mappings written alternately by
//! several threads while the phase changes under them (a child killed at
//! half the writes, a second forked and gone at three quarters), recorded
//! with `--interval`. The kernel side keeps recent counts in per-CPU
//! pending slots and flushes them when a phase or mapping takes the slot
//! over; this case checks that nothing is lost or counted twice on the
//! way: against the oracle for the process and in each mapping's range,
//! the page arithmetic of each phase, and the intervals and phases adding
//! up to the run.

use anyhow::{Context as _, Result};
use faultscope::{
    kernel::{classes::ReportClass, latency::LatencyTier},
    report::schema::ClassValue,
};

use crate::{
    check::{self, Checklist},
    foundation::{against_oracle, case_outputs, region_rows, CaseResult, TOLERANCE},
    vm,
};

/// The cases `foundation.sh` runs, one per backend.
pub const STORM_CASES: [&str; 2] = ["storm4k@kprobe", "storm4k@fentry"];

/// The phases the workload's segments of writes land in, in order.
const SEGMENT_PHASES: [&str; 3] =
    ["fork#1 child-alive", "fork#1 after-child-exit", "fork#2 after-child-exit"];

pub fn check_storm_case(run: &vm::GuestRun, case: &str) -> Result<CaseResult> {
    let (fs, wl, pid) = case_outputs(run, case)?;
    let p = check::process(&fs, pid).with_context(|| case.to_string())?;
    let threads = wl["threads"].as_u64().unwrap_or(0);
    let heading = format!("{case} (pid {pid}, {threads} threads, {} pages)", wl["pages"]);
    let (oracle, mut table, mut fails) = against_oracle(run, case, &fs, pid, &heading)?;
    let mut cl = Checklist::new(case, &mut table, &mut fails);
    // Each mapping: faultscope's row against the oracle in its range, and
    // one write-protect fault per page.
    let classes = [ReportClass::Faults, ReportClass::WpFaults, ReportClass::Reuse, ReportClass::Copy];
    for r in region_rows(&mut cl, p, &oracle, &wl, &classes)? {
        let (wp, pages) = (r.get(ReportClass::WpFaults), r.pages);
        cl.expect(wp == pages, format!("{}: wp_faults {wp} = its pages {pages}", r.role));
    }
    // Each segment of writes in the phase the workload's marks put it in.
    let segments: Vec<u64> =
        wl["segments"].as_array().context("workload segments")?.iter().filter_map(|v| v.as_u64()).collect();
    for (name, pages) in SEGMENT_PHASES.iter().zip(&segments) {
        let got = p
            .phases
            .iter()
            .find(|ph| ph.name.starts_with(name))
            .and_then(|ph| ph.classes.get(&ReportClass::WpFaults).and_then(|v| v.count()));
        cl.expect(
            got.is_some_and(|g| (*pages..=pages + TOLERANCE).contains(&g)),
            format!("phase {name}: wp_faults {got:?} for the {pages} pages written in it (+{TOLERANCE})"),
        );
    }
    // The latency tier: counts of every fault (the oracle above), and
    // either no latency at all or one timed fault in N on each CPU: each
    // CPU times the first of every N faults it opens, so the timed ones
    // are between faults/N and that plus one per CPU.
    let timed = |m: ReportClass| match p.classes.get(&m) {
        Some(ClassValue::Measured(x)) => {
            x.latency.as_ref().map(|l| l.buckets.iter().map(|b| b[2]).sum::<u64>())
        }
        _ => None,
    };
    match fs.latency {
        Some(LatencyTier::Off) => {
            let any = ReportClass::ALL.into_iter().filter(|m| timed(*m).is_some()).collect::<Vec<_>>();
            cl.expect(any.is_empty(), format!("--latency off: no class timed ({any:?})"));
        }
        Some(LatencyTier::Sample { every }) => {
            let faults = p.count(ReportClass::Faults).unwrap_or(0);
            let cpus = fs.kernel_memory.as_ref().map_or(1, |k| k.cpus);
            let (lo, hi) = (faults / every as u64, faults.div_ceil(every as u64) + cpus);
            let got = timed(ReportClass::Faults);
            cl.expect(
                got.is_some_and(|n| (lo..=hi).contains(&n)),
                format!("--latency sample={every}: {got:?} of {faults} faults timed, {lo} to {hi}"),
            );
        }
        t => cl.expect(false, format!("latency tier {t:?}: the case asks for off or sample=N")),
    }
    // The intervals and the phases add up to the run, class by class.
    let intervals = fs.intervals.as_deref().unwrap_or_default();
    cl.expect(intervals.len() >= 2, format!("{} intervals", intervals.len()));
    for m in ReportClass::ALL {
        let Some(whole) = p.count(m) else { continue };
        let series: u64 = intervals
            .iter()
            .flat_map(|i| i.processes.iter())
            .filter(|x| x.pid == pid)
            .map(|x| x.counts.get(&m).copied().unwrap_or(0))
            .sum();
        let phases: u64 = p.phases.iter().filter_map(|ph| ph.classes.get(&m).and_then(|v| v.count())).sum();
        cl.expect(
            series == whole && phases == whole,
            format!("{m}: run {whole} = intervals {series} = phases {phases}"),
        );
    }
    Ok(CaseResult { table, failures: fails })
}
