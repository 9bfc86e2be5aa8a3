//! The oracle comparison of the guest tests (foundation, matrix, Redis):
//! faultscope's classes of a span against the tracefs kprobe oracle's line
//! for the same process and phase (`xtask/guest/oracle.c`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use anyhow::{Context as _, Result};
use faultscope::{
    kernel::classes::Metric,
    report::{
        file,
        schema::{ClassValue, Classes, Process, Report},
    },
};

use crate::vm::GuestRun;

/// A class the oracle counts: its key in the oracle's line and the oracle
/// events (lib.sh `oracle_event`) it needs ("a|b": one of them).
pub struct Column {
    pub metric: Metric,
    pub key: &'static str,
    pub events: &'static [&'static str],
}

const fn col(metric: Metric, key: &'static str, events: &'static [&'static str]) -> Column {
    Column { metric, key, events }
}

/// The classes compared with the oracle, in table order.
pub const COLUMNS: [Column; 12] = [
    col(Metric::Faults, "faults", &["hmf", "hmfr"]),
    col(Metric::WpFaults, "wp", &["hmf", "hmfr", "wp"]),
    // Without "dsp" both sides count shared write-notify as reuse.
    col(Metric::Reuse, "reuse", &["hmf", "hmfr", "wp", "nar"]),
    col(Metric::Copy, "copy", &["hmf", "hmfr", "wp", "nar"]),
    col(Metric::WpShared, "shared", &["hmf", "hmfr", "wp", "dsp"]),
    col(Metric::HugePmdWp, "huge", &["hmf", "hmfr", "hwp"]),
    col(Metric::Spurious, "spurious", &["hmf", "hmfr", "wp", "hwp", "nar", "exc|acc"]),
    col(Metric::ContpteUnfold, "unfold", &["conv"]),
    col(Metric::ContpteFold, "folded", &["conv"]),
    col(Metric::ContpteConvert, "convert", &["conv"]),
    col(Metric::ContpteTryUnfold, "tryunfold", &["unfold"]),
    col(Metric::ContpteFoldAttempt, "fold", &["fold"]),
];

/// The counts of one `oracle tgid=N phase=P key=count...` line, by key.
pub type Line = BTreeMap<String, u64>;

/// The oracle's output of one case, and the events the guest kernel refused.
#[derive(Default)]
pub struct Oracle {
    /// Lines by (tgid, phase).
    pub lines: BTreeMap<(u32, String), Line>,
    /// Refused events and why (`@@FS-ORACLE-MISSING EVENT WHY`).
    pub refused: BTreeMap<String, String>,
}

impl Oracle {
    pub fn parse(text: &str, refused: BTreeMap<String, String>) -> Oracle {
        let mut lines = BTreeMap::new();
        for l in text.lines() {
            let Some(rest) = l.strip_prefix("oracle ") else { continue };
            let (mut tgid, mut phase, mut counts) = (None, None, Line::new());
            for kv in rest.split_whitespace() {
                let Some((k, v)) = kv.split_once('=') else { continue };
                match k {
                    "tgid" => tgid = v.parse().ok(),
                    "phase" => phase = Some(v.to_string()),
                    _ => {
                        if let Ok(n) = v.parse() {
                            counts.insert(k.to_string(), n);
                        }
                    }
                }
            }
            if let (Some(t), Some(p)) = (tgid, phase) {
                lines.insert((t, p), counts);
            }
        }
        Oracle { lines, refused }
    }

    /// The oracle section `section` of a guest run, with the run's refused
    /// events.
    pub fn from_run(run: &GuestRun, section: &str) -> Result<Oracle> {
        let events: BTreeSet<&str> =
            COLUMNS.iter().flat_map(|c| c.events).flat_map(|e| e.split('|')).collect();
        let refused = events
            .into_iter()
            .filter_map(|e| Some((e.to_string(), run.marker("ORACLE-MISSING", e)?)))
            .collect();
        Ok(Oracle::parse(run.section(section)?, refused))
    }

    pub fn line(&self, tgid: u32, phase: &str) -> Option<&Line> {
        self.lines.get(&(tgid, phase.to_string()))
    }

    /// Why the oracle cannot count `c`: its refused events. Empty when it can.
    pub fn unknown(&self, c: &Column) -> Vec<String> {
        c.events
            .iter()
            .filter_map(|e| {
                let why: Vec<&str> =
                    e.split('|').map(|a| self.refused.get(a).map(String::as_str)).collect::<Option<_>>()?;
                Some(why.join("; "))
            })
            .collect()
    }

    /// Compares `classes` (a span's or a whole process's) with the line of
    /// (`tgid`, `phase`); `None` when the oracle has no such line. Failures
    /// are prefixed with `what`.
    pub fn compare(&self, what: &str, classes: &Classes, tgid: u32, phase: &str) -> Option<Comparison> {
        let line = self.line(tgid, phase)?;
        let mut c = Comparison::default();
        for col in &COLUMNS {
            let missing = self.unknown(col);
            // Unknown to the oracle is not 0: faultscope must then say
            // "not measurable" too.
            let row = Row {
                metric: col.metric,
                faultscope: count(classes, col.metric),
                oracle: if missing.is_empty() { line.get(col.key).copied() } else { None },
            };
            if !row.agrees() {
                c.failures.push(format!(
                    "{what}: {}: faultscope {} != oracle {}",
                    row.metric,
                    row.faultscope_cell(),
                    row.oracle_cell()
                ));
            }
            c.rows.push(row);
            c.unknown.extend(missing);
        }
        Some(c)
    }
}

/// One class compared: `None` is "not measurable" on faultscope's side,
/// "cannot count" (a refused event) on the oracle's.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub metric: Metric,
    pub faultscope: Option<u64>,
    pub oracle: Option<u64>,
}

impl Row {
    pub fn agrees(&self) -> bool {
        self.faultscope == self.oracle
    }

    pub fn faultscope_cell(&self) -> String {
        self.faultscope.map_or_else(|| "n/m".into(), |v| v.to_string())
    }

    pub fn oracle_cell(&self) -> String {
        self.oracle.map_or_else(|| "-".into(), |v| v.to_string())
    }
}

#[derive(Debug, Default)]
pub struct Comparison {
    /// One per `COLUMNS` entry, in its order.
    pub rows: Vec<Row>,
    pub failures: Vec<String>,
    /// Why the oracle cannot count some columns.
    pub unknown: BTreeSet<String>,
}

impl Comparison {
    /// The comparison as a table of three columns, `title` over the classes.
    pub fn table(&self, title: &str) -> String {
        let mut t = String::new();
        let _ = writeln!(t, "  {title:<20} {:>10} {:>10}", "faultscope", "oracle");
        for r in &self.rows {
            let _ =
                writeln!(t, "  {:<20} {:>10} {:>10}", r.metric.name(), r.faultscope_cell(), r.oracle_cell());
        }
        for why in &self.unknown {
            let _ = writeln!(t, "  oracle cannot count: {why}");
        }
        t
    }
}

/// A class's count in `classes`; `None` when not measurable.
pub fn count(classes: &Classes, m: Metric) -> Option<u64> {
    classes.get(&m).and_then(ClassValue::count)
}

/// The faultscope report of section `section` of a guest run.
pub fn report(run: &GuestRun, section: &str) -> Result<Report> {
    parse_report(section, run.section(section)?)
}

pub fn parse_report(name: &str, text: &str) -> Result<Report> {
    Ok(file::parse(name.to_string(), text)?.report)
}

/// The process `pid` of a faultscope report.
pub fn process(report: &Report, pid: u32) -> Result<&Process> {
    report.process(pid).with_context(|| format!("no process {pid} in faultscope's report"))
}

/// A report's mode as the JSON writes it.
pub fn mode_name(report: &Report) -> String {
    serde_json::to_value(report.mode).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// Why the oracle of `section` has no line for (`pid`, `phase`): its summary
/// line, the trace buffer's overrun and faultscope's output.
pub fn oracle_gap(run: &GuestRun, case: &str, section: &str, pid: u32, phase: &str) -> String {
    let text = run.section(section).unwrap_or("");
    let summary = text.lines().find(|l| l.starts_with("oracle:")).unwrap_or("no oracle summary line");
    let overrun = run.marker("OVERRUN", case).unwrap_or_else(|| "not reported".into());
    let out = run.section(&format!("{case}.out")).map(|o| crate::vm::tail(o, 15)).unwrap_or_default();
    format!(
        "the oracle has no {phase} phase for pid {pid} ({summary}; trace buffer overrun {overrun}); \
         oracle section:\n{text}faultscope's output:\n{out}"
    )
}

/// A small bench run, report and guest console, for the tests of the
/// guest checks.
#[cfg(test)]
pub mod testing {
    use serde_json::{json, Value};

    use super::*;

    /// Classes of the catalogue: the given counts (wp_faults = reuse + copy),
    /// others 0, contpte not measurable (x86).
    fn classes(faults: u64, reuse: u64, copy: u64) -> Value {
        let mut c = serde_json::Map::new();
        for m in Metric::ALL {
            let n = match m {
                Metric::Faults => faults,
                Metric::Reuse => reuse,
                Metric::Copy => copy,
                Metric::WpFaults => reuse + copy,
                _ => 0,
            };
            let v = if m.name().starts_with("contpte") {
                json!({"measurable": false, "reason": "arm64 only"})
            } else {
                json!({"count": n, "source": "test"})
            };
            c.insert(m.name().into(), v);
        }
        Value::Object(c)
    }

    fn phase(id: u64, name: &str, kind: &str, classes: Value) -> Value {
        json!({"id": id, "name": name, "kind": kind, "start_ns": id, "end_ns": id + 1,
               "children_alive": 0, "classes": classes})
    }

    /// `faultscope bench` of 16 4K pages by pid 7: populate, fork (its mark
    /// and the fork's automatic phases), write.
    pub fn bench_json() -> String {
        json!({
            "schema": "faultscope/1", "kernel": "6.12.0", "arch": "x86_64", "mode": "kprobe",
            "duration_ns": 9, "probes": [], "drops": {"lost_kretprobe_returns": 0},
            "processes": [{"pid": 7, "comm": "faultscope", "classes": classes(39, 20, 1), "phases": [
                phase(1, "mark:populate", "mark", classes(16, 0, 0)),
                phase(2, "mark:fork", "mark", classes(2, 0, 0)),
                phase(3, "fork#1 child-alive", "child-alive", classes(1, 0, 1)),
                phase(4, "fork#1 after-child-exit", "after-child-exit", classes(0, 0, 0)),
                phase(5, "mark:write", "mark", classes(20, 20, 0)),
            ]}],
            "bench": {
                "mode": "seq", "size": 65536, "folio": "4K", "mapping": "pte", "child": "exit",
                "threads": 1, "pages": 16, "folios": 16,
                "folio_check": {"blocks": 16, "whole_folios": 16, "pmd_mapped_bytes": 0},
                "pid": 7, "child_pid": 8,
                "steps": [{"name": "populate", "minflt": 16, "majflt": 0, "wall_ns": 1000},
                          {"name": "fork", "minflt": 3, "majflt": 0, "wall_ns": 2000},
                          {"name": "write", "minflt": 20, "majflt": 0, "wall_ns": 5000}],
            },
        })
        .to_string()
    }

    /// An oracle line of pid 7 (contpte counted 0, as oracle.c prints it).
    pub fn oracle_line(phase: &str, faults: u64, reuse: u64, copy: u64) -> String {
        format!(
            "oracle tgid=7 phase={phase} faults={faults} wp={} reuse={reuse} copy={copy} shared=0 huge=0 \
             spurious=0 unfold=0 folded=0 convert=0 tryunfold=0 fold=0\n",
            reuse + copy
        )
    }

    /// The x86 guest's refusals (lib.sh): no contpte events.
    pub const X86_REFUSED: &str = "@@FS-ORACLE-MISSING unfold contpte is arm64 only\n\
                                   @@FS-ORACLE-MISSING conv contpte is arm64 only\n\
                                   @@FS-ORACLE-MISSING fold contpte is arm64 only\n";

    /// A guest run whose console holds `markers` and the sections.
    pub fn guest_run(markers: &str, sections: &[(&str, &str)]) -> GuestRun {
        let mut console = markers.to_string();
        for (name, body) in sections {
            console += &format!("@@FS-BEGIN {name}\n{body}\n@@FS-END {name}\n");
        }
        GuestRun { sections: crate::vm::sections(&console), console, wall: std::time::Duration::ZERO }
    }
}

#[cfg(test)]
mod tests {
    use super::{testing::*, *};

    #[test]
    fn oracle_lines() {
        let o = Oracle::parse(
            "oracle tgid=5 phase=ALL faults=3 wp=1\noracle tgid=5 phase=mark:write faults=2 wp=1\njunk\n",
            BTreeMap::new(),
        );
        assert_eq!(o.line(5, "mark:write").unwrap()["faults"], 2);
        assert_eq!(o.line(5, "ALL").unwrap()["wp"], 1);
        assert_eq!(o.lines.len(), 2);
    }

    #[test]
    fn unknown_needs_every_alternative_refused() {
        let spurious = COLUMNS.iter().find(|c| c.metric == Metric::Spurious).unwrap();
        let refused = |evs: &[&str]| evs.iter().map(|e| (e.to_string(), format!("{e} refused"))).collect();
        assert!(Oracle::parse("", refused(&["exc"])).unknown(spurious).is_empty());
        assert_eq!(
            Oracle::parse("", refused(&["exc", "acc"])).unknown(spurious),
            ["exc refused; acc refused"]
        );
    }

    #[test]
    fn the_refused_events_come_from_the_run() {
        let text = oracle_line("ALL", 39, 20, 1);
        let run = guest_run(X86_REFUSED, &[("c.oracle", &text)]);
        let o = Oracle::from_run(&run, "c.oracle").unwrap();
        assert_eq!(o.refused.keys().collect::<Vec<_>>(), ["conv", "fold", "unfold"]);
        assert_eq!(o.line(7, "ALL").unwrap()["reuse"], 20);
    }

    #[test]
    fn a_bench_step_against_its_oracle_line() {
        let r = parse_report("bench.json", &bench_json()).unwrap();
        let p = process(&r, 7).unwrap();
        // The fork step: its mark and the fork's automatic phases.
        let step = p.span("mark:fork").unwrap();
        let line = oracle_line("mark:fork", 3, 0, 1).replace(" copy=1 ", " copy=2 ");
        let run = guest_run(X86_REFUSED, &[("c.oracle", &line)]);
        let oracle = Oracle::from_run(&run, "c.oracle").unwrap();
        let c = oracle.compare("k c mark:fork", &step.classes, 7, "mark:fork").unwrap();
        assert_eq!(c.rows.len(), COLUMNS.len());
        let row = |m| c.rows.iter().find(|r| r.metric == m).unwrap().clone();
        // Equal (the mark's 2 and the child-alive phase's 1).
        assert_eq!(row(Metric::Faults), Row { metric: Metric::Faults, faultscope: Some(3), oracle: Some(3) });
        // Unequal.
        assert_eq!(row(Metric::Copy), Row { metric: Metric::Copy, faultscope: Some(1), oracle: Some(2) });
        // Unknown to the oracle and not measurable: they agree.
        assert_eq!(
            row(Metric::ContpteUnfold),
            Row { metric: Metric::ContpteUnfold, faultscope: None, oracle: None }
        );
        assert_eq!(c.failures, ["k c mark:fork: copy: faultscope 1 != oracle 2"]);
        assert_eq!(c.unknown.iter().collect::<Vec<_>>(), ["contpte is arm64 only"]);
        let table = c.table("class");
        assert!(table.contains("\n  copy                          1          2\n"), "{table}");
        assert!(table.contains("\n  contpte_unfold              n/m          -\n"), "{table}");
        assert!(oracle.compare("x", &step.classes, 8, "mark:fork").is_none());

        // The oracle counts contpte (nothing refused), faultscope cannot.
        let all = Oracle::parse(&oracle_line("ALL", 39, 20, 1), BTreeMap::new());
        let c = all.compare("fork4k", &p.classes, 7, "ALL").unwrap();
        assert_eq!(c.failures.len(), 5, "{:?}", c.failures);
        assert!(c.failures.contains(&"fork4k: contpte_unfold: faultscope n/m != oracle 0".to_string()));
        // The oracle cannot count a class faultscope measured.
        let refused = [("dsp".to_string(), "no symbol".to_string())].into();
        let c = Oracle::parse(&oracle_line("ALL", 39, 20, 1), refused).compare("x", &p.classes, 7, "ALL");
        assert!(c.unwrap().failures.contains(&"x: wp_shared: faultscope 0 != oracle -".to_string()));
    }

    #[test]
    fn the_bench_steps_own_numbers_read_back() {
        let r = parse_report("b.json", &bench_json()).unwrap();
        assert_eq!(r.bench.as_ref().unwrap().step("write").unwrap().wall_ns, 5000);
        assert_eq!(r.bench_process().unwrap().span("mark:write").unwrap().count(Metric::Reuse), Some(20));
        assert_eq!(mode_name(&r), "kprobe");
        let e = parse_report("b.json", &bench_json().replace("\"steps\"", "\"phases\"")).unwrap_err();
        assert!(e.to_string().contains("malformed report"), "{e}");
    }
}
