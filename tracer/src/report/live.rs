//! What `record --interval` prints while it runs, each interval's counts
//! (deltas) in the measured classes' compact columns: on a terminal a
//! live table redrawn in place, 80 columns wide, with the current phase
//! and a footer that says how the run ends and where it goes next (`plot`
//! for a report with intervals, `serve` to keep the same counts for
//! Prometheus); elsewhere one line per interval and process, bcc-style
//! (`HH:MM:SS PID COMM PHASE counts...`).

use std::{fmt::Write as _, io::IsTerminal as _, path::Path};

use super::schema::{ClassValue, Report, SystemWide};
use crate::{
    kernel::classes::{Availability, ReportClass},
    term::safe,
};

/// The compact columns, most wanted first: (header, class).
const COMPACT: &[(&str, ReportClass)] = &[
    ("FAULTS", ReportClass::Faults),
    ("WRITE", ReportClass::WriteFaults),
    ("WP", ReportClass::WpFaults),
    ("REUSE", ReportClass::Reuse),
    ("COPY", ReportClass::Copy),
    ("SPUR", ReportClass::Spurious),
    ("UNFOLD", ReportClass::ContpteUnfold),
    ("SHARED", ReportClass::WpShared),
    ("NOTPRES", ReportClass::NotPresent),
    ("PMDWP", ReportClass::HugePmdWp),
];

/// A count column's width (a space and 7 characters: `123,456`, `12.3M`).
const CELL: usize = 8;
/// PID and COMM of the live table.
const LEAD: usize = 7 + 1 + 15;
const WIDTH: usize = 80;

pub type Column = (&'static str, ReportClass);

/// The compact columns of the classes measured here, as many as fit in
/// 80 columns beside PID and COMM.
pub fn columns(avail: &[(ReportClass, Availability)]) -> Vec<Column> {
    let measured =
        |m: ReportClass| avail.iter().any(|(c, a)| *c == m && matches!(a, Availability::Measured { .. }));
    COMPACT.iter().copied().filter(|(_, m)| measured(*m)).take((WIDTH - LEAD) / CELL).collect()
}

/// A count in at most 7 characters.
fn cell(n: u64) -> String {
    match n {
        0..=999_999 => crate::units::count(n),
        1_000_000..=999_999_999 => format!("{:.1}M", n as f64 / 1e6),
        _ => format!("{:.1}G", n as f64 / 1e9),
    }
}

/// Which processes an interval shows, in which order: by the count of
/// `sort` (most first; ties by pid), the first `top` of them, the others
/// summed on one `(N others)` row. Without `sort`, by pid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Order {
    pub sort: Option<ReportClass>,
    pub top: Option<usize>,
}

/// A row: a process (`pid`), or the sum of those past `top` (no pid).
struct Row {
    pid: Option<u32>,
    comm: String,
    /// Per column; None: not measurable.
    counts: Vec<Option<u64>>,
    /// The count of `Order::sort`'s class (0 without one).
    key: u64,
}

/// The rows of the processes that faulted in `delta`, in `order`.
fn rows(delta: &Report, cols: &[Column], order: Order) -> Vec<Row> {
    let mut rows: Vec<Row> = delta
        .processes
        .iter()
        .map(|p| Row {
            pid: Some(p.pid),
            comm: p.comm.clone(),
            counts: cols.iter().map(|(_, m)| p.count(*m)).collect(),
            key: order.sort.and_then(|m| p.count(m)).unwrap_or(0),
        })
        .filter(|r| r.counts.iter().any(|c| c.is_some_and(|n| n > 0)))
        .collect();
    if order.sort.is_some() {
        rows.sort_by(|a, b| b.key.cmp(&a.key).then(a.pid.cmp(&b.pid)));
    }
    if let Some(top) = order.top {
        if rows.len() > top {
            let rest = rows.split_off(top);
            let mut sum: Vec<Option<u64>> = vec![Some(0); cols.len()];
            for r in &rest {
                for (s, c) in sum.iter_mut().zip(&r.counts) {
                    *s = match (*s, c) {
                        (Some(a), Some(b)) => Some(a + b),
                        _ => None,
                    };
                }
            }
            rows.push(Row { pid: None, comm: format!("({} others)", rest.len()), counts: sum, key: 0 });
        }
    }
    rows
}

impl Row {
    /// PID and COMM.
    fn lead(&self) -> String {
        let pid = self.pid.map_or(String::new(), |p| p.to_string());
        let comm = if self.pid.is_some() { comm15(&self.comm) } else { self.comm.clone() };
        format!("{pid:>7} {comm:<15}")
    }

    /// The counts, a space before each.
    fn cells(&self) -> String {
        let mut out = String::new();
        for c in &self.counts {
            let c = c.map(cell).unwrap_or_else(|| "n/m".into());
            let _ = write!(out, " {c:>7}");
        }
        out
    }
}

pub fn enabled() -> bool {
    std::io::stdout().is_terminal()
}

/// The frame's footer for a run that writes `json` (if any), with or
/// without `--interval` (the time series `plot` draws).
pub fn footer(json: Option<&Path>, interval: bool) -> String {
    let end = match json {
        Some(p) if interval => {
            let p = safe(&p.display().to_string());
            format!("Ctrl-C ends the run and writes {p}; `faultscope plot {p} -o run.svg` draws it")
        }
        Some(p) => format!(
            "Ctrl-C ends the run and writes {} (with --interval SECS, `faultscope plot` draws it)",
            safe(&p.display().to_string())
        ),
        None => "Ctrl-C ends the run and prints the report (--json FILE keeps it)".to_string(),
    };
    format!("{end}\nTo keep these counts for days, for Prometheus: `faultscope serve -p PID | --comm NAME`\n")
}

/// One frame: clear the screen, then the interval's counts per process
/// (`delta`, those that faulted), then `footer`.
pub fn frame(
    delta: &Report,
    cols: &[Column],
    order: Order,
    phase: &str,
    elapsed_s: f64,
    interval_s: f64,
    footer: &str,
) -> String {
    let mut out = String::from("\x1b[H\x1b[J");
    let _ = writeln!(
        out,
        "faultscope  {elapsed_s:.0}s  phase: {}  (faults in the last {interval_s}s)",
        safe(phase)
    );
    let _ = write!(out, "{:>7} {:<15}", "PID", "COMM");
    for (h, _) in cols {
        let _ = write!(out, " {h:>7}");
    }
    out.push('\n');
    for r in rows(delta, cols, order) {
        let _ = writeln!(out, "{}{}", r.lead(), r.cells());
    }
    out.push_str(footer);
    out
}

/// The compact columns of a report: those of the classes measured in it.
pub fn report_columns(r: &Report) -> Vec<Column> {
    COMPACT
        .iter()
        .copied()
        .filter(|(_, m)| !r.availability.contains_key(m))
        .take((WIDTH - LEAD) / CELL)
        .collect()
}

/// The processes of a report over every process (`-a`), a row each in
/// its order, then the others summed on one row.
pub fn system_wide_table(r: &Report, sw: &SystemWide) -> String {
    let cols = report_columns(r);
    let mut out = format!("{:>7} {:<15}", "PID", "COMM");
    for (h, _) in &cols {
        let _ = write!(out, " {h:>7}");
    }
    out.push('\n');
    let mut rows = rows(r, &cols, Order { sort: Some(sw.sort), top: None });
    if sw.other.processes > 0 {
        let counts = cols.iter().map(|(_, m)| sw.other.classes.get(m).and_then(ClassValue::count)).collect();
        rows.push(Row { pid: None, comm: format!("({} others)", sw.other.processes), counts, key: 0 });
    }
    for r in rows {
        let _ = writeln!(out, "{}{}", r.lead(), r.cells());
    }
    out
}

/// The header of the interval lines.
pub fn line_header(cols: &[Column]) -> String {
    let mut out = format!("{:<8} {:>7} {:<15} {:<26}", "TIME", "PID", "COMM", "PHASE");
    for (h, _) in cols {
        let _ = write!(out, " {h:>7}");
    }
    out.push('\n');
    out
}

/// One interval: a line per process that faulted in it, at `time`
/// (`HH:MM:SS`).
pub fn lines(delta: &Report, cols: &[Column], order: Order, time: &str, phase: &str) -> String {
    let mut out = String::new();
    let phase: String = safe(phase).chars().take(26).collect();
    for r in rows(delta, cols, order) {
        let _ = writeln!(out, "{time:<8} {} {phase:<26}{}", r.lead(), r.cells());
    }
    out
}

fn comm15(c: &str) -> String {
    if c.is_empty() {
        return "?".into();
    }
    safe(c).chars().take(15).collect()
}

/// The local time of day, `HH:MM:SS`.
pub fn time_of_day() -> String {
    // SAFETY: time(NULL) and localtime_r into a zeroed tm.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    unsafe {
        let t = libc::time(std::ptr::null_mut());
        libc::localtime_r(&t, &mut tm);
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_footer_points_to_plot_and_serve() {
        let f = footer(Some(Path::new("bgsave.json")), true);
        assert!(f.contains("writes bgsave.json; `faultscope plot bgsave.json -o run.svg`"), "{f}");
        assert!(f.contains("faultscope serve"));
        assert!(footer(Some(Path::new("r.json")), false).contains("with --interval SECS, `faultscope plot`"));
        assert!(footer(None, true).contains("--json FILE"));
        // A path is text from elsewhere: no raw control characters.
        assert!(!footer(Some(Path::new("a\x1b[2Jb.json")), true).contains('\x1b'));
        let frame = frame(&Report::default(), &[], Order::default(), "before-fork", 1.0, 1.0, &f);
        assert!(frame.ends_with(&f));
    }

    #[test]
    fn compact_columns_are_the_measured_ones_and_fit_80() {
        let m = |c| {
            (
                c,
                Availability::Measured {
                    class: faultscope_common::KernelClass::Faults,
                    timed: false,
                    source: "",
                },
            )
        };
        let nm = |c| (c, Availability::NotMeasurable("x".into()));
        let tp = [
            m(ReportClass::Faults),
            m(ReportClass::WriteFaults),
            m(ReportClass::WpFaults),
            nm(ReportClass::Reuse),
            m(ReportClass::NotPresent),
        ];
        let cols: Vec<&str> = columns(&tp).iter().map(|(h, _)| *h).collect();
        assert_eq!(cols, ["FAULTS", "WRITE", "WP", "NOTPRES"]);
        let all: Vec<_> = ReportClass::ALL.into_iter().map(m).collect();
        let cols = columns(&all);
        let mut p = super::super::schema::testing::process(42, Vec::new());
        p.comm = "a-very-long-command-name".into();
        p.classes = super::super::schema::testing::classes(&[
            (ReportClass::Faults, 12_345_678),
            (ReportClass::Copy, 3),
        ]);
        let r = Report { processes: vec![p], ..Report::default() };
        let f = frame(&r, &cols, Order::default(), "before-fork", 3.0, 1.0, "");
        for l in f.lines().skip(1) {
            assert!(l.chars().count() <= 80, "{} columns: {l}", l.chars().count());
        }
        assert!(f.contains("   12.3M"), "{f}");
        let l = lines(&r, &cols, Order::default(), "12:00:01", "before-fork");
        assert!(l.starts_with("12:00:01      42 a-very-long-com before-fork  "), "{l}");
    }

    /// Sorted by a class, most first, the first N shown and the rest one
    /// summed row; without a sort, pid order.
    #[test]
    fn rows_sort_by_a_class_and_sum_past_the_top() {
        use super::super::schema::testing::{classes, process};
        let proc = |pid, faults, copy| {
            let mut p = process(pid, Vec::new());
            p.comm = format!("p{pid}");
            p.classes = classes(&[(ReportClass::Faults, faults), (ReportClass::Copy, copy)]);
            p
        };
        let r = Report {
            processes: vec![proc(1, 10, 5), proc(2, 30, 0), proc(3, 20, 9), proc(4, 0, 0)],
            ..Report::default()
        };
        let cols = [("FAULTS", ReportClass::Faults), ("COPY", ReportClass::Copy)];
        let pids = |o| rows(&r, &cols, o).iter().map(|r| r.pid).collect::<Vec<_>>();
        // A process without faults is no row.
        assert_eq!(pids(Order::default()), [Some(1), Some(2), Some(3)]);
        assert_eq!(pids(Order { sort: Some(ReportClass::Copy), top: None }), [Some(3), Some(1), Some(2)]);
        let top = rows(&r, &cols, Order { sort: Some(ReportClass::Faults), top: Some(1) });
        assert_eq!(top.iter().map(|r| r.pid).collect::<Vec<_>>(), [Some(2), None]);
        assert_eq!((top[1].comm.as_str(), top[1].counts.clone()), ("(2 others)", vec![Some(30), Some(14)]));
        let l = lines(&r, &cols, Order { sort: Some(ReportClass::Faults), top: Some(1) }, "12:00:01", "x");
        assert_eq!(l.lines().count(), 2, "{l}");
        assert!(l.lines().nth(1).unwrap().contains("(2 others)"), "{l}");
    }
}
