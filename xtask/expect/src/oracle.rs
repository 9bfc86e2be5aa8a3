//! The tracefs kprobe oracle's counts (`xtask/guest/oracle.c`, which reads
//! the kernel's trace of its own kprobes and tracepoints, with none of
//! faultscope's code) and their comparison with a report's classes.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use faultscope::{
    kernel::{classes::ReportClass, drops::DropReason},
    report::schema::{ClassValue, Classes, Process, Report},
};
use serde_json::Value;

use crate::Checklist;

/// The counts of one `oracle tgid=N phase=P key=count...` line, by key
/// (oracle.c prints the classes under their report names); `None` for
/// "key=?": the guest lacks the events the oracle needs to count it.
pub type Line = BTreeMap<String, Option<u64>>;

/// The oracle's output of one case, and the events the guest kernel refused.
#[derive(Default)]
pub struct Oracle {
    /// Lines by (tgid, phase).
    pub lines: BTreeMap<(u32, String), Line>,
    /// `oracle-range` lines (the faults in an address range given to the
    /// oracle) by (tgid, phase, range).
    pub ranges: BTreeMap<(u32, String, String), Line>,
    /// `oracle-origin` lines (the faults of one origin: user, kernel,
    /// gup) by (tgid, phase, origin).
    pub origins: BTreeMap<(u32, String, String), Line>,
    /// `oracle-window` lines (the counts between a mark's two markers, which
    /// faultscope may count in the phase before or the one it starts) by
    /// (tgid, the phase it starts, origin or "" for every origin).
    pub windows: BTreeMap<(u32, String, String), Line>,
    /// The phases in the order their markers came.
    pub phases: Vec<String>,
    /// The events each count the oracle cannot count misses ("a|b": both),
    /// from its `oracle unknown KEY: EVENT...` lines.
    pub missing: BTreeMap<String, Vec<String>>,
    /// Refused events and why (`@@FS-ORACLE-MISSING EVENT WHY`).
    pub refused: BTreeMap<String, String>,
}

impl Oracle {
    pub fn parse(text: &str, refused: BTreeMap<String, String>) -> Oracle {
        let mut o = Oracle { refused, ..Oracle::default() };
        for l in text.lines() {
            if let Some((key, events)) = l.strip_prefix("oracle unknown ").and_then(|r| r.split_once(':')) {
                o.missing
                    .insert(key.trim().to_string(), events.split_whitespace().map(String::from).collect());
                continue;
            }
            if let Some((_, phases)) = l.strip_prefix("oracle: ").and_then(|r| r.rsplit_once("; phases:")) {
                o.phases = phases.split_whitespace().map(String::from).collect();
                continue;
            }
            let Some((kind, rest)) = l.split_once(' ') else { continue };
            let (mut tgid, mut phase, mut sub, mut counts) = (None, None, None, Line::new());
            for kv in rest.split_whitespace() {
                let Some((k, v)) = kv.split_once('=') else { continue };
                match (k, v) {
                    ("tgid", _) => tgid = v.parse().ok(),
                    ("phase", _) => phase = Some(v.to_string()),
                    ("range" | "origin", _) => sub = Some(v.to_string()),
                    (_, "?") => {
                        counts.insert(k.to_string(), None);
                    }
                    _ => {
                        if let Ok(n) = v.parse() {
                            counts.insert(k.to_string(), Some(n));
                        }
                    }
                }
            }
            let (Some(t), Some(p)) = (tgid, phase) else { continue };
            match (kind, sub) {
                ("oracle", None) => drop(o.lines.insert((t, p), counts)),
                ("oracle-range", Some(r)) => drop(o.ranges.insert((t, p, r), counts)),
                ("oracle-origin", Some(r)) => drop(o.origins.insert((t, p, r), counts)),
                ("oracle-window", None) => drop(o.windows.insert((t, p, String::new()), counts)),
                ("oracle-window-origin", Some(r)) => drop(o.windows.insert((t, p, r), counts)),
                _ => {}
            }
        }
        o
    }

    /// The count `key` of (`tgid`)'s faults of `origin` ("" for every
    /// origin) in the window before `phase`; `None` where the oracle saw no
    /// window there (or cannot count `key`).
    pub fn window(&self, tgid: u32, phase: &str, origin: &str, key: &str) -> Option<u64> {
        self.windows.get(&(tgid, phase.to_string(), origin.to_string()))?.get(key).copied().flatten()
    }

    pub fn line(&self, tgid: u32, phase: &str) -> Option<&Line> {
        self.lines.get(&(tgid, phase.to_string()))
    }

    /// The faults of (`tgid`, `phase`) in the address range named `range`.
    pub fn range(&self, tgid: u32, phase: &str, range: &str) -> Option<&Line> {
        self.ranges.get(&(tgid, phase.to_string(), range.to_string()))
    }

    /// The faults of (`tgid`, `phase`) of one origin (`user`, `kernel`,
    /// `gup`).
    pub fn origin(&self, tgid: u32, phase: &str, origin: &str) -> Option<&Line> {
        self.origins.get(&(tgid, phase.to_string(), origin.to_string()))
    }

    /// Why the oracle cannot count `key`: the refusals of the events it
    /// misses, alternatives joined by "; ".
    pub fn unknown(&self, key: &str) -> Vec<String> {
        let Some(events) = self.missing.get(key) else {
            return vec![format!("{key}: the oracle named no missing event")];
        };
        let why = |e: &str| self.refused.get(e).cloned().unwrap_or_else(|| format!("no event {e}"));
        events.iter().map(|alts| alts.split('|').map(why).collect::<Vec<_>>().join("; ")).collect()
    }

    /// Compares `classes` (a span's or a whole process's) with the line of
    /// (`tgid`, `phase`): every class of the catalogue the line counts, in
    /// `ReportClass::ALL` order; `None` when the oracle has no such line.
    /// Failures are prefixed with `what`.
    pub fn compare(&self, what: &str, classes: &Classes, tgid: u32, phase: &str) -> Option<Comparison> {
        let line = self.line(tgid, phase)?;
        let next = self.phases.iter().position(|p| p == phase).and_then(|i| self.phases.get(i + 1));
        let window = |origin: &str, m: ReportClass| {
            let held = |into: &str| self.window(tgid, into, origin, m.name()).unwrap_or(0);
            (held(phase), next.map_or(0, |n| held(n)))
        };
        let mut c = Comparison::default();
        for metric in ReportClass::ALL {
            let Some(&oracle) = line.get(metric.name()) else { continue };
            let (over_by, short_by) = window("", metric);
            // Unknown to the oracle is not 0: faultscope must then say
            // "not measurable" too.
            let faultscope = count(classes, metric);
            c.push(what, Row { metric, origin: None, faultscope, oracle, over_by, short_by });
            if oracle.is_none() {
                c.unknown.extend(self.unknown(metric.name()));
            }
        }
        // Each origin too, where the oracle split the counts by origin: a
        // row for every class either side counted.
        for origin in ORIGINS {
            let Some(line) = self.origin(tgid, phase, origin) else { continue };
            for metric in ReportClass::ALL {
                let Some(&Some(oracle)) = line.get(metric.name()) else { continue };
                let faultscope = classes.get(&metric).and_then(|v| v.origin_count(origin));
                if oracle == 0 && faultscope.unwrap_or(0) == 0 {
                    continue;
                }
                let (over_by, short_by) = window(origin, metric);
                c.push(
                    what,
                    Row { metric, origin: Some(origin), faultscope, oracle: Some(oracle), over_by, short_by },
                );
            }
        }
        Some(c)
    }
}

/// The origins the oracle splits faults by (the report's names).
pub const ORIGINS: [&str; 3] = ["user", "kernel", "gup"];

/// One class compared (or one origin of it): `None` is "not measurable" on
/// faultscope's side, "cannot count" (a refused event) on the oracle's.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub metric: ReportClass,
    /// `user`, `kernel`, `gup`: the class's faults of that origin.
    pub origin: Option<&'static str>,
    pub faultscope: Option<u64>,
    pub oracle: Option<u64>,
    /// The oracle's counts in the window before this phase (in the phase
    /// before, for the oracle): faultscope may count them here.
    pub over_by: u64,
    /// The oracle's counts in the window before the next phase: faultscope
    /// may count them there.
    pub short_by: u64,
}

impl Row {
    /// `class`, or `class.origin`.
    pub fn name(&self) -> String {
        match self.origin {
            Some(o) => format!("{}.{o}", self.metric.name()),
            None => self.metric.name().to_string(),
        }
    }

    /// Equal, but for the counts in the phase's two windows.
    pub fn agrees(&self) -> bool {
        match (self.faultscope, self.oracle) {
            (Some(f), Some(o)) => f + self.short_by >= o && f <= o + self.over_by,
            (f, o) => f == o,
        }
    }

    /// The failure line of a row that does not agree, prefixed with `what`.
    fn failure(&self, what: &str) -> String {
        format!(
            "{what}: {}: faultscope {} != oracle {}",
            self.name(),
            self.faultscope_cell(),
            self.oracle_cell()
        )
    }

    pub fn faultscope_cell(&self) -> String {
        self.faultscope.map_or_else(|| "n/m".into(), |v| v.to_string())
    }

    /// The oracle's count, and the range its windows allow where they hold
    /// any.
    pub fn oracle_cell(&self) -> String {
        match self.oracle {
            None => "-".into(),
            Some(o) if self.over_by + self.short_by == 0 => o.to_string(),
            Some(o) => format!("{o}[{}..{}]", o.saturating_sub(self.short_by), o + self.over_by),
        }
    }
}

#[derive(Debug, Default)]
pub struct Comparison {
    /// One per class the oracle's line names, in `ReportClass::ALL` order.
    pub rows: Vec<Row>,
    pub failures: Vec<String>,
    /// Why the oracle cannot count some of the classes (`?` rows).
    pub unknown: BTreeSet<String>,
}

impl Comparison {
    /// Rows short of the oracle's count by no more than the runs of
    /// faultscope's programs the kernel skipped (`report`'s
    /// `program_runs_skipped`) are the kernel's doing: noted, not failed.
    /// Only short: a skipped run never adds a count.
    pub fn allowing_skipped(mut self, what: &str, report: &Report) -> Self {
        let skipped = skipped_runs(report);
        if skipped == 0 {
            return self;
        }
        let short =
            |r: &Row| matches!((r.faultscope, r.oracle), (Some(f), Some(o)) if f < o && o - f <= skipped);
        self.failures =
            self.rows.iter().filter(|r| !r.agrees() && !short(r)).map(|r| r.failure(what)).collect();
        self.unknown.extend(self.rows.iter().filter(|r| short(r)).map(|r| {
            format!(
                "{what}: {}: short by no more than the {skipped} program runs the kernel skipped (program_runs_skipped)",
                r.name()
            )
        }));
        self
    }

    fn push(&mut self, what: &str, row: Row) {
        if !row.agrees() {
            self.failures.push(row.failure(what));
        }
        self.rows.push(row);
    }

    pub fn row(&self, m: ReportClass) -> Option<&Row> {
        self.rows.iter().find(|r| r.metric == m && r.origin.is_none())
    }

    /// The row of one origin of a class.
    pub fn origin_row(&self, m: ReportClass, origin: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.metric == m && r.origin == Some(origin))
    }

    /// The comparison as a table of three columns, `title` over the classes.
    pub fn table(&self, title: &str) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "  {title:<20} {:>10} {:>10}", "faultscope", "oracle");
        for r in &self.rows {
            let _ = writeln!(t, "  {:<20} {:>10} {:>10}", r.name(), r.faultscope_cell(), r.oracle_cell());
        }
        for why in &self.unknown {
            let _ = writeln!(t, "  oracle cannot count: {why}");
        }
        t
    }
}

/// The events the guest's kernel refused and why, from `oracle_setup`'s
/// lines (`EVENT WHY` each).
pub fn parse_refused<'a>(lines: impl Iterator<Item = &'a str>) -> BTreeMap<String, String> {
    lines.filter_map(|l| l.split_once(' ')).map(|(e, why)| (e.to_string(), why.trim().to_string())).collect()
}

/// Runs of faultscope's programs the kernel skipped in `report`'s run.
pub fn skipped_runs(report: &Report) -> u64 {
    report.drops.get(DropReason::SkippedRuns)
}

/// A class's count in `classes`; `None` when not measurable.
pub fn count(classes: &Classes, m: ReportClass) -> Option<u64> {
    classes.get(&m).and_then(ClassValue::count)
}

/// A region of a workload's `--out` (`role`, `start`, `pages`) with the
/// counts of faultscope's mapping row that starts at it.
pub struct RegionRow<'a> {
    pub role: &'a str,
    pub region: &'a Value,
    pub pages: u64,
    counts: &'a std::collections::BTreeMap<ReportClass, u64>,
}

impl RegionRow<'_> {
    /// The row's count of `m` (0 when it counted none).
    pub fn get(&self, m: ReportClass) -> u64 {
        self.counts.get(&m).copied().unwrap_or(0)
    }
}

/// The regions of `wl` with their mapping rows, each of `classes` checked
/// against the oracle in the region's range where there is an oracle; a
/// region without a row fails and is left out.
pub fn region_rows<'a>(
    cl: &mut Checklist<'_>,
    p: &'a Process,
    oracle: Option<&Oracle>,
    wl: &'a Value,
    classes: &[ReportClass],
) -> Vec<RegionRow<'a>> {
    let mut rows = Vec::new();
    let regions = wl["regions"].as_array().map(Vec::as_slice).unwrap_or_default();
    cl.expect(!regions.is_empty(), "the workload lists its regions");
    for r in regions {
        let role = r["role"].as_str().unwrap_or("?");
        let (start, pages) = (r["start"].as_u64().unwrap_or(0), r["pages"].as_u64().unwrap_or(0));
        // The row of the region's VMA: keyed by its start (a row no maps
        // snapshot named has no end), else the row that holds it where the
        // kernel merged it with a neighbour (seen on 6.12: a row starting
        // below the region), whose other faults then fail the oracle's
        // range check below.
        let all = &p.attribution.mappings;
        let holding = || all.iter().filter(|m| m.start <= start && start < m.end).max_by_key(|m| m.start);
        let Some(row) = all.iter().find(|m| m.start == start).or_else(holding) else {
            let rows: Vec<String> = p
                .attribution
                .mappings
                .iter()
                .map(|m| format!("{:#x}-{:#x} {} {:?}", m.start, m.end, m.mapping, m.counts))
                .collect();
            cl.expect(
                false,
                format!("{role}: no mapping row holds {start:#x}; the rows:\n    {}", rows.join("\n    ")),
            );
            continue;
        };
        let row = RegionRow { role, region: r, pages, counts: &row.counts };
        let Some(oracle) = oracle else {
            rows.push(row);
            continue;
        };
        let own = oracle.range(p.pid, "ALL", role);
        for &m in classes {
            let o = own.and_then(|l| l.get(m.name()).copied().flatten());
            cl.expect(
                o == Some(row.get(m)),
                format!("{role}: {m} {} = oracle in its range {o:?}", row.get(m)),
            );
        }
        rows.push(row);
    }
    rows
}
