//! What a report of the test workload (`fs-workload`) must show against
//! counts made another way: the pages it wrote, its own getrusage. One
//! definition for the host tests (`tracer/tests/host`) and the guest
//! stages (`xtask`), so that a scenario is held to one rule in both.

pub mod cases;
pub mod mappings;
pub mod oracle;
pub mod testing;
pub mod tracefs;

use std::fmt::Write;

use faultscope::{
    kernel::{classes::ReportClass, latency::LatencyTier},
    report::schema::{ClassValue, Process, Report},
};
use serde_json::Value;

/// The workload's faults outside its measured writes that fall in the same
/// classes: exec-time COW of its data pages, stack and heap pages touched
/// after fork (20 to 50 seen on the host and in the guests). The writes
/// themselves are one fault a page.
pub const TOLERANCE: u64 = 64;

/// The most pages the kernel may copy where it could reuse them: a folio
/// still in a CPU's LRU-add batch (`folio_batch`, 31 folios) holds an extra
/// reference, so `wp_can_reuse_anon_folio` copies it. A guest has 2
/// CPUs; how many are in a batch at the fork depends on timing (a loaded
/// host saw 8), so the kernel's choice is bounded, and faultscope's count
/// of it stays exact against the oracle.
pub const LRU_BATCH_COPIES: u64 = 2 * 31;

/// Faults the kernel takes for the origins workload besides its measured
/// writes (its getrusage and kill calls): the kernel's and
/// get_user_pages' own writes are exact (0 or 1 more seen).
pub const ORIGIN_SLACK: u64 = 16;

/// What a check found: each expectation an `ok` or `FAIL` line of the
/// case's table, and the failures, named after the case.
pub struct Checklist<'a> {
    case: &'a str,
    table: &'a mut String,
    fails: &'a mut Vec<String>,
}

impl<'a> Checklist<'a> {
    pub fn new(case: &'a str, table: &'a mut String, fails: &'a mut Vec<String>) -> Checklist<'a> {
        Checklist { case, table, fails }
    }

    /// One expectation: its line in the table, and a failure when not `ok`.
    pub fn expect(&mut self, ok: bool, what: impl AsRef<str>) {
        let what = what.as_ref();
        let _ = writeln!(self.table, "  {} {what}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            self.fails.push(format!("{}: {what}", self.case));
        }
    }

    /// A line of the table that checks nothing (a heading, a row).
    pub fn line(&mut self, text: impl AsRef<str>) {
        let _ = writeln!(self.table, "{}", text.as_ref());
    }

    /// `got` faults of `what` for `pages` pages written once each: one a
    /// page, and at most [`TOLERANCE`] of the workload's other faults.
    pub fn per_page(&mut self, what: impl AsRef<str>, got: u64, pages: u64) {
        let ok = (pages..=pages + TOLERANCE).contains(&got);
        self.expect(ok, format!("arithmetic: {} = {got}, pages = {pages} (+{TOLERANCE})", what.as_ref()));
    }

    /// The process's faults, less the retried calls (the kernel counts a
    /// fault once however often it retries), against the workload's own
    /// getrusage count `minflt` (minor + major) over the same span.
    pub fn getrusage(&mut self, p: &Process, minflt: u64) {
        let faults = p.count(ReportClass::Faults).unwrap_or(0);
        let retries = p.count(ReportClass::Retry).unwrap_or(0).min(faults);
        self.expect(
            (faults - retries).abs_diff(minflt) <= TOLERANCE,
            format!(
                "getrusage: minflt+majflt = {minflt}; faults {faults} - retries {retries} (+-{TOLERANCE})"
            ),
        );
    }
}

/// The workload's own report (`--out`), read by name.
pub struct Workload<'a>(pub &'a Value);

impl Workload<'_> {
    /// A number the workload always writes: a report without it is not
    /// the workload's, and no rule may pass on a stand-in 0.
    fn get(&self, key: &str) -> u64 {
        self.0[key].as_u64().unwrap_or_else(|| panic!("the workload's report has no number {key}"))
    }

    /// The pages of its buffer, each written once in its write step.
    pub fn pages(&self) -> u64 {
        self.get("pages")
    }

    /// The workload's process.
    pub fn pid(&self) -> u32 {
        self.get("pid") as u32
    }

    /// Its faults from exec to the end (getrusage: minor + major).
    pub fn faults_since_exec(&self) -> u64 {
        self.get("minflt_total") + self.0["majflt_total"].as_u64().unwrap_or(0)
    }

    /// Its faults from `main` on (a tracer attached by pid in its start
    /// delay sees no earlier one).
    pub fn faults_since_main(&self) -> u64 {
        self.get("minflt_since_main")
    }

    /// Its faults in the write step alone.
    pub fn write_faults(&self) -> u64 {
        Workload(&self.0["phases"]["write"]).get("minflt")
    }
}

/// The phases the threaded storm's segments of writes land in, in order.
pub const STORM_PHASES: [&str; 3] =
    ["fork#1 child-alive", "fork#1 after-child-exit", "fork#2 after-child-exit"];

/// The threaded storm (`fs-workload --threads`: threads writing while the
/// phase changes under them, recorded with `--interval`): each segment of
/// writes in the phase the workload's marks put it in, one write-protect
/// fault a page; and, class by class, the intervals and the phases adding
/// up to the run. A class the kernel counts over the whole run only
/// (`major` in tracepoint mode, its `maj_flt`) has neither.
pub fn threaded_storm(cl: &mut Checklist, report: &Report, p: &Process, wl: &Workload) {
    let segments: Vec<u64> =
        wl.0["segments"].as_array().into_iter().flatten().filter_map(|v| v.as_u64()).collect();
    cl.expect(segments.len() == STORM_PHASES.len(), format!("the workload's segments {segments:?}"));
    for (name, pages) in STORM_PHASES.iter().zip(&segments) {
        let got = p
            .phases
            .iter()
            .find(|ph| ph.name.starts_with(name))
            .and_then(|ph| ph.classes.get(&ReportClass::WpFaults)?.count());
        cl.expect(
            got.is_some_and(|g| (*pages..=pages + TOLERANCE).contains(&g)),
            format!("phase {name}: wp_faults {got:?} for the {pages} pages written in it (+{TOLERANCE})"),
        );
    }
    let intervals = report.intervals.as_deref().unwrap_or_default();
    cl.expect(intervals.len() >= 2, format!("{} intervals", intervals.len()));
    for m in ReportClass::ALL {
        let Some(whole) = p.count(m) else { continue };
        let in_phases: Vec<u64> = p.phases.iter().filter_map(|ph| ph.classes.get(&m)?.count()).collect();
        if in_phases.is_empty() {
            cl.expect(m == ReportClass::Major, format!("{m}: {whole}, counted over the whole run only"));
            continue;
        }
        let series: u64 = intervals
            .iter()
            .flat_map(|i| i.processes.iter())
            .filter(|x| x.pid == p.pid)
            .map(|x| x.counts.get(&m).copied().unwrap_or(0))
            .sum();
        let phases: u64 = in_phases.iter().sum();
        cl.expect(
            series == whole && phases == whole,
            format!("{m}: run {whole} = intervals {series} = phases {phases}"),
        );
    }
}

/// The latency tier `report` states, held to what it promises for process
/// `p`: `off`, no class timed; `sample=N`, each CPU times the first of
/// every N faults it opens, so the timed faults are between faults/N and
/// that plus one per CPU. `all`, or no tier (no fault path here), is not
/// a sample: nothing to bound.
pub fn latency_tier(cl: &mut Checklist<'_>, report: &Report, p: &Process) {
    let timed = |m: ReportClass| match p.classes.get(&m) {
        Some(ClassValue::Measured(x)) => {
            x.latency.as_ref().map(|l| l.buckets.iter().map(|b| b[2]).sum::<u64>())
        }
        _ => None,
    };
    match report.latency {
        Some(LatencyTier::Off) => {
            let any = ReportClass::ALL.into_iter().filter(|m| timed(*m).is_some()).collect::<Vec<_>>();
            cl.expect(any.is_empty(), format!("--latency off: no class timed ({any:?})"));
        }
        Some(LatencyTier::Sample { every }) => {
            let faults = p.count(ReportClass::Faults).unwrap_or(0);
            let cpus = report.kernel_memory.as_ref().map_or(1, |k| k.cpus);
            let (lo, hi) = (faults / every as u64, faults.div_ceil(every as u64) + cpus);
            let got = timed(ReportClass::Faults);
            cl.expect(
                got.is_some_and(|n| (lo..=hi).contains(&n)),
                format!("--latency sample={every}: {got:?} of {faults} faults timed, {lo} to {hi}"),
            );
        }
        Some(LatencyTier::All) | None => {}
    }
}

/// Whether a release string ("7.3.4+deb13-cloud-amd64") is at least major.minor.
pub fn kernel_at_least(release: &str, major: u64, minor: u64) -> bool {
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u64>().ok());
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_strings_compare() {
        assert!(kernel_at_least("7.3.4+deb13-cloud-amd64", 6, 16));
        assert!(!kernel_at_least("6.12.0", 6, 16));
    }

    #[test]
    fn per_page_holds_the_writes_to_the_pages_and_the_tolerance() {
        let (mut table, mut fails) = (String::new(), Vec::new());
        let mut cl = Checklist::new("case", &mut table, &mut fails);
        cl.per_page("reuse", 1024, 1024);
        cl.per_page("reuse", 1024 + TOLERANCE, 1024);
        cl.per_page("reuse", 1023, 1024);
        cl.per_page("reuse", 1025 + TOLERANCE, 1024);
        assert_eq!(fails.len(), 2, "{table}");
        assert!(fails[0].starts_with("case: arithmetic: reuse = 1023"), "{fails:?}");
        assert_eq!(table.lines().filter(|l| l.starts_with("  ok")).count(), 2, "{table}");
    }

    #[test]
    fn the_workloads_numbers_are_read_by_their_names() {
        let v = serde_json::json!({"pages": 8, "minflt_total": 100, "majflt_total": 2,
            "minflt_since_main": 50, "phases": {"write": {"minflt": 8}}});
        let w = Workload(&v);
        assert_eq!(
            (w.pages(), w.faults_since_exec(), w.faults_since_main(), w.write_faults()),
            (8, 102, 50, 8)
        );
    }
}
