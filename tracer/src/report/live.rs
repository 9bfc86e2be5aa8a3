//! What `record --interval` prints while it runs, each interval's counts
//! (deltas) in the measured classes' compact columns: on a terminal a
//! live table redrawn in place, 80 columns wide, with the current phase
//! and a footer that says how the run ends and where it goes next (`plot`
//! for a report with intervals, `serve` to keep the same counts for
//! Prometheus); elsewhere one line per interval and process, bcc-style
//! (`HH:MM:SS PID COMM PHASE counts...`).

use std::{fmt::Write as _, io::IsTerminal as _, path::Path};

use super::schema::Report;
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
    ("FIRST", ReportClass::FirstTouch),
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

fn cells(out: &mut String, p: &super::schema::Process, cols: &[Column]) {
    for (_, m) in cols {
        let c = p.count(*m).map(cell).unwrap_or_else(|| "n/m".into());
        let _ = write!(out, " {c:>7}");
    }
}

fn any_count(p: &super::schema::Process, cols: &[Column]) -> bool {
    cols.iter().any(|(_, m)| p.count(*m).is_some_and(|n| n > 0))
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
    for p in delta.processes.iter().filter(|p| any_count(p, cols)) {
        let _ = write!(out, "{:>7} {:<15}", p.pid, comm15(&p.comm));
        cells(&mut out, p, cols);
        out.push('\n');
    }
    out.push_str(footer);
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
pub fn lines(delta: &Report, cols: &[Column], time: &str, phase: &str) -> String {
    let mut out = String::new();
    let phase: String = safe(phase).chars().take(26).collect();
    for p in delta.processes.iter().filter(|p| any_count(p, cols)) {
        let _ = write!(out, "{time:<8} {:>7} {:<15} {phase:<26}", p.pid, comm15(&p.comm));
        cells(&mut out, p, cols);
        out.push('\n');
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
        let frame = frame(&Report::default(), &[], "before-fork", 1.0, 1.0, &f);
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
            m(ReportClass::FirstTouch),
        ];
        let cols: Vec<&str> = columns(&tp).iter().map(|(h, _)| *h).collect();
        assert_eq!(cols, ["FAULTS", "WRITE", "WP", "FIRST"]);
        let all: Vec<_> = ReportClass::ALL.into_iter().map(m).collect();
        let cols = columns(&all);
        let mut p = super::super::schema::testing::process(42, Vec::new());
        p.comm = "a-very-long-command-name".into();
        p.classes = super::super::schema::testing::classes(&[
            (ReportClass::Faults, 12_345_678),
            (ReportClass::Copy, 3),
        ]);
        let r = Report { processes: vec![p], ..Report::default() };
        let f = frame(&r, &cols, "before-fork", 3.0, 1.0, "");
        for l in f.lines().skip(1) {
            assert!(l.chars().count() <= 80, "{} columns: {l}", l.chars().count());
        }
        assert!(f.contains("   12.3M"), "{f}");
        let l = lines(&r, &cols, "12:00:01", "before-fork");
        assert!(l.starts_with("12:00:01      42 a-very-long-com before-fork  "), "{l}");
    }
}
