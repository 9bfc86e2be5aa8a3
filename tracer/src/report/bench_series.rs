//! A bench series, `faultscope-bench/1`: `bench --runs N` over one or more
//! cells (a write mode and a folio size), every run's full `faultscope/1`
//! report kept, and per cell and bench step the statistics over its runs
//! (median, min-max, mean and sample standard deviation) of the step's wall
//! and CPU time, getrusage minflt and every class the tracer measured.
//! Written by `bench --json` when there is more than one run or cell, read
//! back by `diff --format changelog`. Its JSON Schema is published beside
//! the report's (`tracer/bench-series.schema.json`, from `faultscope
//! schema --bench`), and a test keeps the two equal. It refers to the
//! report's schema (`report.schema.json`, beside it) for the runs, so it
//! does not change when the report's types do.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema::{self, BenchStep, ClassValue, Provenance, Report};
use crate::{error::Refusal, kernel::classes::ReportClass, term::safe, units};

pub use super::schema::BENCH_SERIES_SCHEMA as SCHEMA;

/// A series of bench runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Series {
    /// Always "faultscope-bench/1".
    pub schema: String,
    /// `uname -r` of the kernel the series ran on.
    pub kernel: String,
    pub arch: String,
    /// Runs of each cell. They were made round by round: one run of every
    /// cell (in the order of `cells`) per round, so that a drift of the
    /// machine spreads over all cells.
    pub runs: u64,
    pub cells: Vec<Cell>,
    /// What the series was of, where and when (each run has its own too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "provenance_schema")]
    pub provenance: Option<Provenance>,
}

/// The report's schema, published beside this one.
const REPORT_SCHEMA: &str = "report.schema.json";

/// `runs`: reports of `faultscope/1`, by reference to the report's schema.
fn runs_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {"$ref": REPORT_SCHEMA}})
}

fn provenance_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"$ref": format!("{REPORT_SCHEMA}#/$defs/Provenance")})
}

/// `classes`: keyed by the report's class names.
fn classes_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let value = g.subschema_for::<ClassStats>();
    schemars::json_schema!({
        "type": "object",
        "propertyNames": {"$ref": format!("{REPORT_SCHEMA}#/$defs/ReportClass")},
        "additionalProperties": value,
    })
}

/// One (mode, folio) cell of a series: its runs and their statistics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Cell {
    /// The write pattern (`bench.mode` of its runs).
    pub mode: String,
    /// The folio size (`bench.folio` of its runs).
    pub folio: String,
    /// "pte" or "pmd".
    pub mapping: String,
    /// Every run's full report (`faultscope/1`), in the order the runs were
    /// made.
    #[schemars(schema_with = "runs_schema")]
    pub runs: Vec<Report>,
    /// Per bench step (populate, fork, write): statistics over the runs.
    pub steps: Vec<StepStats>,
}

/// One bench step over a cell's runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepStats {
    pub name: String,
    pub wall_ns: Stats,
    /// The bench process's CPU time in the step (see `BenchStep::cpu_ns`).
    pub cpu_ns: Stats,
    /// getrusage minor faults in the step.
    pub minflt: Stats,
    /// Every class of the step (the span of `mark:STEP`): its statistics,
    /// or why it is not measurable on that kernel (never a 0). Empty when
    /// the runs were not traced (`bench --no-trace`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "classes_schema")]
    pub classes: BTreeMap<ReportClass, ClassStats>,
}

/// A class over the runs: statistics of its count, or why it cannot be
/// measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ClassStats {
    Measured(Stats),
    NotMeasurable(Unmeasured),
}

/// A class not measurable in the runs, and why (the reason the first such
/// run gives).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Unmeasured {
    /// Always false.
    pub measurable: bool,
    #[serde(default)]
    pub reason: String,
}

impl ClassStats {
    pub fn stats(&self) -> Option<&Stats> {
        match self {
            ClassStats::Measured(s) => Some(s),
            ClassStats::NotMeasurable(_) => None,
        }
    }
}

/// Statistics of one quantity over `n` runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stats {
    pub n: u64,
    /// The middle value; of an even number of runs, the mean of the two
    /// middle ones.
    pub median: f64,
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    /// The sample standard deviation (divided by n - 1); absent with one
    /// run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stddev: Option<f64>,
}

impl Stats {
    /// The statistics of `values`; `None` when there are none.
    pub fn of(values: &[u64]) -> Option<Stats> {
        let mut v = values.to_vec();
        v.sort_unstable();
        let n = v.len();
        let (&min, &max) = (v.first()?, v.last()?);
        let median = if n % 2 == 1 { v[n / 2] as f64 } else { (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0 };
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n as f64;
        let stddev = (n > 1).then(|| {
            let ss: f64 = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum();
            (ss / (n - 1) as f64).sqrt()
        });
        Some(Stats { n: n as u64, median, min, max, mean, stddev })
    }

    /// Whether the min-max ranges of two sets of runs overlap.
    pub fn overlaps(&self, other: &Stats) -> bool {
        self.min <= other.max && other.min <= self.max
    }

    /// The simple test of `diff --format changelog`: whether B's runs lie
    /// beyond A's spread, i.e. the two min-max ranges do not overlap.
    /// `None` when a side has fewer than two runs (a range of one value
    /// says nothing of the spread).
    pub fn beyond_spread(a: &Stats, b: &Stats) -> Option<bool> {
        (a.n >= 2 && b.n >= 2).then(|| !a.overlaps(b))
    }
}

/// Statistics over the bench steps of `runs` (the steps of the first run
/// that every run has).
pub fn step_stats(runs: &[Report]) -> Vec<StepStats> {
    let Some(first) = runs.first().and_then(|r| r.bench.as_ref()) else { return Vec::new() };
    let mut out = Vec::new();
    for name in first.steps.iter().map(|s| s.name.as_str()) {
        let steps: Option<Vec<&BenchStep>> =
            runs.iter().map(|r| r.bench.as_ref().and_then(|b| b.step(name))).collect();
        let Some(steps) = steps else { continue };
        let of = |f: &dyn Fn(&BenchStep) -> u64| {
            Stats::of(&steps.iter().map(|s| f(s)).collect::<Vec<_>>()).expect("one run at least")
        };
        out.push(StepStats {
            name: name.to_string(),
            wall_ns: of(&|s| s.wall_ns),
            cpu_ns: of(&|s| s.cpu_ns),
            minflt: of(&|s| s.minflt.max(0) as u64),
            classes: class_stats(runs, name),
        });
    }
    out
}

/// Every class of the step `name` over the runs: statistics where every
/// run measured it, else the first run's reason. Empty unless every run
/// has the step's span (an untraced run has none).
fn class_stats(runs: &[Report], name: &str) -> BTreeMap<ReportClass, ClassStats> {
    let mark = format!("mark:{name}");
    let spans: Option<Vec<schema::Span>> =
        runs.iter().map(|r| r.bench_process().and_then(|p| p.span(&mark))).collect();
    let Some(spans) = spans else { return BTreeMap::new() };
    let mut out = BTreeMap::new();
    for m in ReportClass::ALL {
        let values: Option<Vec<&ClassValue>> = spans.iter().map(|s| s.classes.get(&m)).collect();
        let Some(values) = values else { continue };
        let counts: Option<Vec<u64>> = values.iter().map(|v| v.count()).collect();
        let v = match counts.and_then(|c| Stats::of(&c)) {
            Some(s) => ClassStats::Measured(s),
            None => match values.iter().find_map(|v| match v {
                ClassValue::NotMeasurable(n) => {
                    Some(Unmeasured { measurable: false, reason: n.reason.clone() })
                }
                ClassValue::Measured(_) => None,
            }) {
                Some(n) => ClassStats::NotMeasurable(n),
                None => continue,
            },
        };
        out.insert(m, v);
    }
    out
}

impl Cell {
    /// A cell of `runs` (bench reports of one mode and folio size), with
    /// their statistics.
    pub fn of_runs(runs: Vec<Report>) -> Cell {
        let b = runs.first().and_then(|r| r.bench.clone()).unwrap_or_default();
        let steps = step_stats(&runs);
        Cell { mode: b.mode, folio: b.folio, mapping: b.mapping, runs, steps }
    }

    pub fn step(&self, name: &str) -> Option<&StepStats> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// What tells cells apart: mode, folio, mapping and what the child did
    /// (`bench --child`, the same in every run of a cell).
    pub fn key(&self) -> (&str, &str, &str, &str) {
        let child = self.runs.first().and_then(|r| r.bench.as_ref()).map_or("", |b| b.child.as_str());
        (&self.mode, &self.folio, &self.mapping, child)
    }

    /// The cell's runs by the boot they ran in (`provenance.boot_id`), in
    /// the order of each boot's first run; runs that name no boot are one
    /// group.
    pub fn boots(&self) -> Vec<Vec<&Report>> {
        let mut out: Vec<(Option<&str>, Vec<&Report>)> = Vec::new();
        for r in &self.runs {
            let id = r.provenance.as_ref().and_then(|p| p.boot_id.as_deref());
            match out.iter_mut().find(|(b, _)| *b == id) {
                Some((_, v)) => v.push(r),
                None => out.push((id, vec![r])),
            }
        }
        out.into_iter().map(|(_, v)| v).collect()
    }
}

impl Series {
    /// Several series of one kernel as one (e.g. one per boot, or per
    /// `bench` invocation with other flags): the runs of equal cells (by
    /// [`Cell::key`]) are joined in the order given, other cells kept, the
    /// statistics computed again over all runs.
    pub fn merge(parts: Vec<Series>) -> Result<Series, Refusal> {
        let mut it = parts.into_iter();
        let Some(mut out) = it.next() else { return Err(Refusal::new("no series to merge")) };
        for s in it {
            if s.kernel != out.kernel || s.arch != out.arch {
                return Err(Refusal::new(format!(
                    "cannot merge series of kernel {} {} into {} {}",
                    safe(&s.kernel),
                    safe(&s.arch),
                    safe(&out.kernel),
                    safe(&out.arch)
                )));
            }
            for c in s.cells {
                match out.cells.iter_mut().find(|o| o.key() == c.key()) {
                    Some(o) => o.runs.extend(c.runs),
                    None => out.cells.push(c),
                }
            }
        }
        for c in &mut out.cells {
            c.steps = step_stats(&c.runs);
        }
        out.runs = out.cells.iter().map(|c| c.runs.len() as u64).max().unwrap_or(0);
        Ok(out)
    }
}

impl StepStats {
    /// A class's statistics, when measured in every run.
    pub fn class(&self, m: ReportClass) -> Option<&Stats> {
        self.classes.get(&m).and_then(ClassStats::stats)
    }
}

/// The schema of a series, generated from these types.
pub fn json_schema() -> schemars::Schema {
    schemars::schema_for!(Series)
}

/// A series read back, with the file it came from.
pub struct LoadedSeries {
    pub path: String,
    pub series: Series,
}

/// Loads a series, or a plain `faultscope/1` bench report as a series of
/// one run of one cell. Each run is read back as `file::parse` reads a
/// report, and the statistics are computed again from the runs, so that
/// they are always those of the reports kept.
pub fn load(path: &Path) -> Result<LoadedSeries, Refusal> {
    let name = path.display().to_string();
    let text = super::file::read_input(path)?;
    parse(name, &text)
}

pub fn parse(name: String, text: &str) -> Result<LoadedSeries, Refusal> {
    if text.trim().is_empty() {
        return Err(Refusal::new(format!("{name}: empty file (was the run interrupted before the report?)")));
    }
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Refusal::new(format!("{name}: not a faultscope report: {e}")))?;
    match v.get("schema").and_then(|s| s.as_str()) {
        Some(SCHEMA) => {}
        Some(schema::SCHEMA) => {
            let l = super::file::parse(name.clone(), text)?;
            let r = l.report;
            if r.bench.is_none() {
                return Err(Refusal::new(format!("{name}: not a bench report (it has no `bench`)")));
            }
            let series = Series {
                schema: SCHEMA.into(),
                kernel: r.kernel.clone(),
                arch: r.arch.clone(),
                runs: 1,
                provenance: r.provenance.clone(),
                cells: vec![Cell::of_runs(vec![r])],
            };
            return Ok(LoadedSeries { path: name, series });
        }
        _ => {
            return Err(Refusal::new(format!(
                "{name}: schema is {}, expected {SCHEMA:?} (bench --runs) or {:?}",
                v.get("schema").map(|s| s.to_string()).unwrap_or_else(|| "missing".into()),
                schema::SCHEMA
            )))
        }
    }
    let mut v = v;
    super::file::migrate(&mut v);
    let mut series: Series = serde_path_to_error::deserialize(v)
        .map_err(|e| Refusal::new(format!("{name}: malformed series: at {}: {}", e.path(), e.inner())))?;
    for (i, c) in series.cells.iter_mut().enumerate() {
        if c.runs.is_empty() {
            return Err(Refusal::new(format!("{name}: cells[{i}] has no run")));
        }
        for (j, r) in c.runs.iter_mut().enumerate() {
            let at = format!("{name}: cells[{i}].runs[{j}]");
            let text = serde_json::to_string(r).map_err(|e| Refusal::new(format!("{at}: {e}")))?;
            *r = super::file::parse(at.clone(), &text)?.report;
            match &r.bench {
                Some(b) if b.mode == c.mode && b.folio == c.folio => {}
                _ => {
                    return Err(Refusal::new(format!(
                        "{at}: not a bench run of {} {}",
                        safe(&c.mode),
                        safe(&c.folio)
                    )))
                }
            }
        }
        c.steps = step_stats(&c.runs);
    }
    Ok(LoadedSeries { path: name, series })
}

/// Writes a series whole or not at all (see `crate::output`).
pub fn write(p: &Path, s: &Series) -> anyhow::Result<()> {
    crate::output::write(p, serde_json::to_string_pretty(s)?.as_bytes())
}

/// A count that may have a fraction (a median of two, a mean): `4,096`,
/// `4,096.5`.
pub fn count_f(v: f64) -> String {
    let r = (v * 10.0).round() / 10.0;
    let (int, tenth) = (r.trunc() as u64, ((r - r.trunc()) * 10.0).round() as u64);
    if tenth == 0 {
        units::count(int)
    } else {
        format!("{}.{tenth}", units::count(int))
    }
}

/// How a quantity of the text table is written.
#[derive(Clone, Copy)]
enum Unit {
    Ns,
    Count,
}

impl Unit {
    fn one(self, v: f64) -> String {
        match self {
            Unit::Ns => units::ns(v.round().max(0.0) as u64),
            Unit::Count => count_f(v),
        }
    }
}

/// The row cells of one quantity: median, min - max, mean +- stddev.
fn stat_cells(s: &Stats, u: Unit) -> [String; 3] {
    let mean = match s.stddev {
        Some(sd) => format!("{} ± {}", u.one(s.mean), u.one(sd)),
        None => u.one(s.mean),
    };
    [u.one(s.median), format!("{} - {}", u.one(s.min as f64), u.one(s.max as f64)), mean]
}

/// The classes of the text tables: the compact tables' columns, and the
/// write faults (the changelog's), in the catalogue's order.
fn text_classes() -> impl Iterator<Item = ReportClass> {
    ReportClass::ALL.into_iter().filter(|m| m.spec().columns.summary || *m == ReportClass::WriteFaults)
}

/// The text of a series: one compact table per cell, each step's wall
/// and CPU time, minflt and measured classes over the runs.
pub fn text(s: &Series) -> String {
    let mut out = String::new();
    for c in &s.cells {
        cell_text(&mut out, s, c);
    }
    out
}

fn cell_text(out: &mut String, s: &Series, c: &Cell) {
    let first = c.runs.first();
    let b = first.and_then(|r| r.bench.as_ref());
    let traced = first.is_some_and(|r| r.mode != schema::Mode::Off);
    let _ = writeln!(
        out,
        "faultscope bench {} {} ({}-mapped): {} MiB, child {}, {} run{}, kernel {}{}",
        safe(&c.mode),
        safe(&c.folio),
        safe(&c.mapping),
        b.map_or(0, |b| b.size >> 20),
        b.map_or(String::new(), |b| safe(&b.child)),
        c.runs.len(),
        if c.runs.len() == 1 { "" } else { "s" },
        safe(&s.kernel),
        if traced { "" } else { " (tracer off)" }
    );
    let mut rows: Vec<[String; 5]> =
        vec![["step", "", "median", "min - max", "mean ± stddev"].map(String::from)];
    let mut not_measured: Vec<&str> = Vec::new();
    for st in &c.steps {
        let mut name = st.name.clone();
        let mut row = |what: &str, stats: &Stats, u: Unit| {
            let [a, b, m] = stat_cells(stats, u);
            rows.push([std::mem::take(&mut name), what.to_string(), a, b, m]);
        };
        row("wall", &st.wall_ns, Unit::Ns);
        row("cpu", &st.cpu_ns, Unit::Ns);
        row("minflt", &st.minflt, Unit::Count);
        for m in text_classes() {
            match st.classes.get(&m) {
                Some(ClassStats::Measured(x)) => row(m.name(), x, Unit::Count),
                Some(ClassStats::NotMeasurable(_))
                    if m.exists_on(&s.arch) && !not_measured.contains(&m.name()) =>
                {
                    not_measured.push(m.name())
                }
                _ => {}
            }
        }
    }
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let w: Vec<usize> = (0..5).map(width).collect();
    for r in &rows {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:>w4$}",
            safe(&r[0]),
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
            w4 = w[4]
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    if !traced {
        let _ = writeln!(out, "classes: off (the tracer was off)");
    } else if !not_measured.is_empty() {
        let _ = writeln!(out, "not measurable here: {}", not_measured.join(", "));
    }
    findings_text(out, c);
    out.push('\n');
}

/// The findings of a cell's runs, each rule and step once, with how many
/// runs had it (the first run's text).
fn findings_text(out: &mut String, c: &Cell) {
    let mut seen: Vec<(&str, &str, &str, usize)> = Vec::new();
    for r in &c.runs {
        let mut here: Vec<(&str, &str)> = Vec::new();
        for f in r.findings.iter().filter(|f| f.rule != "not-measurable") {
            if here.contains(&(f.rule.as_str(), f.phase.as_str())) {
                continue;
            }
            here.push((&f.rule, &f.phase));
            match seen.iter_mut().find(|(r, p, _, _)| *r == f.rule && *p == f.phase) {
                Some(x) => x.3 += 1,
                None => seen.push((&f.rule, &f.phase, &f.text, 1)),
            }
        }
    }
    if seen.is_empty() {
        let _ = writeln!(out, "Findings: none");
        return;
    }
    let _ = writeln!(out, "Findings:");
    for (rule, phase, text, n) in seen {
        let _ = writeln!(
            out,
            "  [{}] {}: {} (in {n} of {} runs)",
            safe(rule),
            safe(phase),
            safe(text),
            c.runs.len()
        );
    }
}

#[cfg(test)]
pub mod testing {
    use super::*;
    use crate::report::schema::{
        testing::{classes, not_measurable, phase, process},
        Bench, PhaseKind,
    };

    /// A bench run of `mode` and `folio` whose write step took `wall_ns`
    /// with `write_faults` write faults (reuse not measurable).
    pub fn run(mode: &str, folio: &str, wall_ns: u64, write_faults: u64) -> Report {
        let mut cl =
            classes(&[(ReportClass::Faults, write_faults + 2), (ReportClass::WriteFaults, write_faults)]);
        cl.insert(ReportClass::Reuse, not_measurable("no kprobes"));
        let mut p = process(9, vec![phase("mark:write", PhaseKind::Mark, cl)]);
        p.comm = "faultscope-bench".into();
        Report {
            schema: schema::SCHEMA.into(),
            kernel: "7.3".into(),
            arch: "x86_64".into(),
            mode: schema::Mode::Tracepoint,
            processes: vec![p],
            bench: Some(Bench {
                mode: mode.into(),
                size: 16 << 20,
                folio: folio.into(),
                mapping: "pte".into(),
                child: "exit".into(),
                threads: 1,
                pages: 4096,
                pid: 9,
                steps: vec![BenchStep {
                    name: "write".into(),
                    minflt: write_faults as i64,
                    majflt: 0,
                    wall_ns,
                    cpu_ns: wall_ns / 2,
                }],
                ..Bench::default()
            }),
            ..Report::default()
        }
    }

    pub fn series(kernel: &str, cells: Vec<Vec<Report>>) -> Series {
        Series {
            schema: SCHEMA.into(),
            kernel: kernel.into(),
            arch: "x86_64".into(),
            runs: cells.first().map_or(0, |c| c.len() as u64),
            cells: cells.into_iter().map(Cell::of_runs).collect(),
            provenance: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{testing::*, *};

    /// The published schema file, beside Cargo.toml.
    const PUBLISHED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/bench-series.schema.json");

    fn generated() -> String {
        serde_json::to_string_pretty(&json_schema()).unwrap() + "\n"
    }

    #[test]
    fn published_schema_is_current() {
        let published = std::fs::read_to_string(PUBLISHED).unwrap_or_default();
        assert!(
            published == generated(),
            "tracer/bench-series.schema.json is out of date: run `cargo run -p faultscope -- schema --bench > tracer/bench-series.schema.json`"
        );
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Stats::of(&[5, 1, 3]).unwrap();
        assert_eq!((s.n, s.median, s.min, s.max), (3, 3.0, 1, 5));
        let s = Stats::of(&[4, 1, 3, 2]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1, 4));
        let s = Stats::of(&[7]).unwrap();
        assert_eq!((s.median, s.mean, s.stddev), (7.0, 7.0, None));
        assert!(Stats::of(&[]).is_none());
        // No overflow for large counts.
        let s = Stats::of(&[u64::MAX, u64::MAX]).unwrap();
        assert_eq!(s.median, u64::MAX as f64);
    }

    #[test]
    fn sample_standard_deviation_divides_by_n_minus_one() {
        // 2 4 4 4 5 5 7 9: mean 5, squares 32; population sd 2, sample sqrt(32/7).
        let s = Stats::of(&[2, 4, 4, 4, 5, 5, 7, 9]).unwrap();
        assert!(close(s.mean, 5.0), "{s:?}");
        assert!(close(s.stddev.unwrap(), (32.0f64 / 7.0).sqrt()), "{s:?}");
        let s = Stats::of(&[10, 10, 10]).unwrap();
        assert_eq!(s.stddev, Some(0.0));
        let s = Stats::of(&[1, 3]).unwrap();
        assert!(close(s.stddev.unwrap(), 2f64.sqrt()), "{s:?}");
    }

    #[test]
    fn beyond_spread_is_non_overlapping_ranges() {
        let a = Stats::of(&[10, 12, 11]).unwrap();
        assert_eq!(Stats::beyond_spread(&a, &Stats::of(&[13, 15, 14]).unwrap()), Some(true));
        assert_eq!(Stats::beyond_spread(&a, &Stats::of(&[7, 9, 8]).unwrap()), Some(true));
        // Touching ends overlap.
        assert_eq!(Stats::beyond_spread(&a, &Stats::of(&[12, 14]).unwrap()), Some(false));
        assert_eq!(Stats::beyond_spread(&a, &a), Some(false));
        // One run on a side says nothing of the spread.
        assert_eq!(Stats::beyond_spread(&a, &Stats::of(&[100]).unwrap()), None);
    }

    #[test]
    fn steps_have_statistics_and_unmeasurable_classes_stay_so() {
        let s = series(
            "7.3",
            vec![vec![run("seq", "4K", 100, 4096), run("seq", "4K", 300, 4100), run("seq", "4K", 200, 4098)]],
        );
        let w = s.cells[0].step("write").unwrap();
        assert_eq!((w.wall_ns.median, w.wall_ns.min, w.wall_ns.max), (200.0, 100, 300));
        assert_eq!((w.cpu_ns.min, w.cpu_ns.max), (50, 150));
        let wf = w.class(ReportClass::WriteFaults).unwrap();
        assert_eq!((wf.median, wf.min, wf.max), (4098.0, 4096, 4100));
        assert!(
            matches!(&w.classes[&ReportClass::Reuse], ClassStats::NotMeasurable(n) if n.reason == "no kprobes")
        );
        assert!(w.class(ReportClass::Reuse).is_none());
        let t = text(&s);
        assert!(t.contains("3 runs"), "{t}");
        let row = t.lines().find(|l| l.contains("write_faults")).unwrap();
        assert!(row.contains("4,098") && row.contains("4,096 - 4,100") && row.contains("± 2"), "{row}");
        assert!(t.contains("not measurable here: reuse"), "{t}");
        assert!(!t.lines().any(|l| l.split_whitespace().next() == Some("reuse")), "{t}");
    }

    #[test]
    fn a_series_round_trips_and_the_schema_validates_it() {
        // Measured classes only: what a report keeps of a reason is the
        // report's own business (its `file::parse`).
        let measured = |mut r: Report| {
            r.processes[0].phases[0].classes.remove(&ReportClass::Reuse);
            r
        };
        let s = series(
            "7.3",
            vec![vec![measured(run("seq", "4K", 100, 4096)), measured(run("seq", "4K", 300, 4100))]],
        );
        let text = serde_json::to_string_pretty(&s).unwrap();
        let back = parse("s.json".into(), &text).unwrap().series;
        // As written (the reports' own fields decide what a report keeps of
        // itself), and with the same statistics.
        assert_eq!(serde_json::to_string_pretty(&back).unwrap(), text);
        assert_eq!(back.cells[0].steps[0].wall_ns, s.cells[0].steps[0].wall_ns);
        let schema = serde_json::to_value(json_schema()).unwrap();
        // The report's schema where the series' refers to it.
        let report = serde_json::to_value(schema::json_schema()).unwrap();
        let registry = jsonschema::Registry::new()
            .add(format!("json-schema:///{REPORT_SCHEMA}"), report)
            .unwrap()
            .prepare()
            .unwrap();
        let v = jsonschema::options().with_registry(&registry).build(&schema).unwrap();
        let good = serde_json::to_value(&s).unwrap();
        assert!(v.is_valid(&good), "{:?}", v.iter_errors(&good).map(|e| e.to_string()).collect::<Vec<_>>());
        let mut bad = good.clone();
        bad["cells"][0]["steps"][0]["wall_ns"]["min"] = serde_json::json!(-1);
        assert!(!v.is_valid(&bad));
        // The runs are checked against the report's schema, the classes'
        // names against its catalogue.
        let mut bad = good.clone();
        bad["cells"][0]["runs"][0]["mode"] = serde_json::json!("sometimes");
        assert!(!v.is_valid(&bad));
        let mut bad = good.clone();
        bad["cells"][0]["steps"][0]["classes"]["no_such_class"] = serde_json::json!({"measurable": false});
        assert!(!v.is_valid(&bad));
        // A plain bench report reads as a series of one run.
        let one = serde_json::to_string(&run("random", "64K", 5, 7)).unwrap();
        let l = parse("r.json".into(), &one).unwrap().series;
        assert_eq!((l.runs, l.cells.len(), l.cells[0].mode.as_str()), (1, 1, "random"));
        // What is not a series or a bench report is refused.
        let e = parse("x.json".into(), r#"{"schema": "other"}"#).err().unwrap();
        assert!(e.0.contains("schema is \"other\""), "{e}");
        let mut mixed = s.clone();
        mixed.cells[0].runs[1].bench.as_mut().unwrap().folio = "2M".into();
        let e = parse("m.json".into(), &serde_json::to_string(&mixed).unwrap()).err().unwrap();
        assert!(e.0.contains("cells[0].runs[1]: not a bench run of seq 4K"), "{e}");
    }

    #[test]
    fn counts_with_fractions() {
        assert_eq!(count_f(4096.0), "4,096");
        assert_eq!(count_f(4096.5), "4,096.5");
        assert_eq!(count_f(0.04), "0");
        assert_eq!(count_f(1.25), "1.3");
    }
}
