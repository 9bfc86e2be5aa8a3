//! `faultscope diff --format changelog A B` (and `cargo xtask ab`): bench
//! series (or plain bench reports) as the text of a kernel patch's cover
//! letter. First the cover letter's own layout (`cover_letter`): a column
//! per kernel, the medians per boot, and the latency table. Then the
//! statistics behind it: per (mode, folio) cell the write step's write
//! faults and wall time of A and each other column, the change, and
//! whether the runs lie beyond each other's spread by one stated simple
//! test (non-overlapping min-max ranges).

use std::fmt::Write as _;

use super::{
    bench_series::{Cell, LoadedSeries, Stats},
    cover_letter,
    diff::mismatches,
};
use crate::{kernel::classes::ReportClass, term::safe, units};

/// What the statistics table's footer says of its columns.
pub const FOOTER: &str = "\
A, B: mean ± sample standard deviation (n-1) over all runs; one run: its value.
change: (B - A) / A, of the means.
beyond spread: \"yes\" when the min-max ranges of A's and B's runs do not overlap
(a simple test, not a test of significance); \"-\" with fewer than 2 runs on a side.";

fn describe(l: &LoadedSeries) -> String {
    let s = &l.series;
    let runs: Vec<usize> = s.cells.iter().map(|c| c.runs.len()).collect();
    let (lo, hi) = (runs.iter().min().copied().unwrap_or(0), runs.iter().max().copied().unwrap_or(0));
    let runs = match (lo, hi) {
        (1, 1) => "1 run per cell".to_string(),
        (a, b) if a == b => format!("{a} runs per cell"),
        (a, b) => format!("{a}-{b} runs per cell"),
    };
    let bench = s.cells.first().and_then(|c| c.runs.first()).and_then(|r| r.bench.as_ref());
    let what =
        bench.map_or(String::new(), |b| format!(", bench {} MiB, child {}", b.size >> 20, safe(&b.child)));
    format!("{} (kernel {}{what}, {runs})", safe(&l.path), safe(&s.kernel))
}

/// `1,234.5`: a count with one decimal.
fn fixed1(v: f64) -> String {
    let r = (v.max(0.0) * 10.0).round();
    format!("{}.{}", units::count((r / 10.0).trunc() as u64), (r as u64) % 10)
}

/// A side's value: the mean (± the sample stddev with several runs).
fn value(s: &Stats, one: impl Fn(f64) -> String) -> String {
    match s.stddev {
        Some(sd) => format!("{} ± {}", one(s.mean), one(sd)),
        None => one(s.mean),
    }
}

fn change(a: f64, b: f64) -> String {
    if a == b {
        "0.00%".into()
    } else if a == 0.0 {
        "new".into()
    } else {
        format!("{:+.2}%", (b - a) / a * 100.0)
    }
}

fn spread(a: &Stats, b: &Stats) -> String {
    match Stats::beyond_spread(a, b) {
        Some(true) => "yes".into(),
        Some(false) => "no".into(),
        None => "-".into(),
    }
}

/// The write step's write faults of a cell: its statistics, or why there
/// are none (`n/m` not measurable, `off` untraced, `-` no write step).
fn write_faults(c: &Cell) -> Result<&Stats, &'static str> {
    let w = c.step("write").ok_or("-")?;
    if w.classes.is_empty() {
        return Err("off");
    }
    w.class(ReportClass::WriteFaults).ok_or("n/m")
}

/// The unit a time row is written in, from its magnitude.
fn time_unit(ns: f64) -> (&'static str, f64) {
    match ns {
        x if x >= 1e9 => ("s", 1e9),
        x if x >= 1e6 => ("ms", 1e6),
        x if x >= 1e3 => ("us", 1e3),
        _ => ("ns", 1.0),
    }
}

/// mode, folio, metric, A, B, change, beyond spread.
type Row = [String; 7];

fn row(c: &Cell, metric: &str, a: String, b: String, change: String, spread: String) -> Row {
    let (_, _, mapping, child) = c.key();
    let mut folio = safe(&c.folio);
    if mapping == "pmd" {
        folio.push_str(" pmd");
    }
    if child == "alive" {
        folio.push_str(", child alive");
    }
    [safe(&c.mode), folio, metric.into(), a, b, change, spread]
}

/// A count's format: whole with one run, one decimal with several.
fn count_format(s: &Stats) -> fn(f64) -> String {
    if s.n > 1 {
        fixed1
    } else {
        |v| units::count(v.round().max(0.0) as u64)
    }
}

/// The rows of a cell in both: its write faults and its wall time.
fn rows_of(out: &mut Vec<Row>, a: &Cell, b: &Cell) {
    let side = |v: Result<&Stats, &str>| match v {
        Ok(s) => value(s, count_format(s)),
        Err(why) => why.to_string(),
    };
    let (wa, wb) = (write_faults(a), write_faults(b));
    let (ch, sp) = match (wa, wb) {
        (Ok(x), Ok(y)) => (change(x.mean, y.mean), spread(x, y)),
        _ => (String::new(), String::new()),
    };
    out.push(row(a, "write faults", side(wa), side(wb), ch, sp));
    // Where a run lost events its counts are short: the kernel's own count
    // of the step's faults beside them.
    if cover_letter::lost(a) || cover_letter::lost(b) {
        if let (Some(x), Some(y)) = (a.step("write").map(|s| &s.minflt), b.step("write").map(|s| &s.minflt)) {
            let (fa, fb) = (count_format(x), count_format(y));
            out.push(row(
                a,
                "minflt (getrusage)",
                value(x, fa),
                value(y, fb),
                change(x.mean, y.mean),
                spread(x, y),
            ));
        }
    }
    match (a.step("write").map(|s| &s.wall_ns), b.step("write").map(|s| &s.wall_ns)) {
        (Some(x), Some(y)) => {
            let (unit, div) = time_unit(x.mean);
            let one = |v: f64| format!("{:.2}", v / div);
            let metric = format!("time ({unit})");
            out.push(row(a, &metric, value(x, one), value(y, one), change(x.mean, y.mean), spread(x, y)));
        }
        _ => out.push(row(a, "time", "-".into(), "-".into(), String::new(), String::new())),
    }
}

/// The columns' letters: A, B, C ...
fn letter(i: usize) -> char {
    (b'A' + (i % 26) as u8) as char
}

/// The changelog text of two or more series, the first the baseline.
pub fn changelog(cols: &[&LoadedSeries]) -> String {
    let mut out = String::new();
    for (i, l) in cols.iter().enumerate() {
        let _ = writeln!(out, "{}: {}", letter(i), describe(l));
    }
    let mut warned: Vec<String> = Vec::new();
    let mut stats = String::new();
    if let Some((base, rest)) = cols.split_first() {
        for (i, other) in rest.iter().enumerate() {
            let rows = pair_rows(&base.series, &other.series, &mut warned);
            let _ = writeln!(stats, "\nfaultscope bench, write step, A against {}:\n", letter(i + 1));
            stats.push_str(&table(&rows, letter(i + 1)));
        }
    }
    for w in &warned {
        let _ = writeln!(out, "warning: {w}");
    }
    let _ = writeln!(out, "\n{}", cover_letter::preamble(cols));
    out.push_str(&cover_letter::table(cols));
    let latency = cover_letter::latency(cols);
    if !latency.is_empty() {
        let _ = writeln!(out, "\n{}", latency.trim_end());
    }
    out.push_str(&stats);
    let _ = writeln!(out, "\n{FOOTER}");
    out
}

/// The statistics rows of A's and B's cells, matched by `Cell::key`; the
/// workloads' differences go to `warned`.
fn pair_rows(
    a: &super::bench_series::Series,
    b: &super::bench_series::Series,
    warned: &mut Vec<String>,
) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    for ca in &a.cells {
        match b.cells.iter().find(|cb| cb.key() == ca.key()) {
            Some(cb) => {
                if let (Some(x), Some(y)) = (ca.runs.first(), cb.runs.first()) {
                    for m in mismatches(x, y) {
                        if !warned.contains(&m) {
                            warned.push(m);
                        }
                    }
                }
                rows_of(&mut rows, ca, cb);
            }
            None => {
                rows.push(row(ca, "only in A", String::new(), String::new(), String::new(), String::new()))
            }
        }
    }
    for cb in b.cells.iter().filter(|cb| !a.cells.iter().any(|ca| ca.key() == cb.key())) {
        rows.push(row(cb, "only in B", String::new(), String::new(), String::new(), String::new()));
    }
    rows
}

fn table(rows: &[Row], b: char) -> String {
    let header: Row =
        ["mode", "folio", "metric", "A", &b.to_string(), "change", "beyond spread"].map(String::from);
    let all: Vec<&Row> = std::iter::once(&header).chain(rows).collect();
    let w: Vec<usize> = (0..7).map(|i| all.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in &all {
        let line = format!(
            "  {:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {:>w4$}  {:>w5$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            r[5],
            r[6],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
            w4 = w[4],
            w5 = w[5]
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::bench_series::testing::{run, series};

    fn loaded(path: &str, s: crate::report::bench_series::Series) -> LoadedSeries {
        LoadedSeries { path: path.into(), series: s }
    }

    /// The table's row of a cell and metric, split on runs of two spaces.
    fn row<'a>(t: &'a str, mode: &str, folio: &str, metric: &str) -> Vec<&'a str> {
        t.lines()
            .map(|l| l.trim().split("  ").map(str::trim).filter(|c| !c.is_empty()).collect::<Vec<_>>())
            .find(|c| c.len() > 2 && c[0] == mode && c[1] == folio && c[2].starts_with(metric))
            .unwrap_or_else(|| panic!("no row {mode} {folio} {metric} in\n{t}"))
    }

    #[test]
    fn cover_letter_layout_with_change_and_spread() {
        // A: 4096 write faults per run; B: a sixteenth of them, faster.
        let a = series(
            "7.3",
            vec![
                vec![
                    run("seq", "64K", 8_000_000, 4096),
                    run("seq", "64K", 8_200_000, 4096),
                    run("seq", "64K", 7_800_000, 4096),
                ],
                vec![
                    run("seq", "4K", 5_000_000, 4096),
                    run("seq", "4K", 5_100_000, 4097),
                    run("seq", "4K", 4_900_000, 4098),
                ],
            ],
        );
        let b = series(
            "7.3+patch",
            vec![
                vec![
                    run("seq", "64K", 2_000_000, 256),
                    run("seq", "64K", 2_100_000, 256),
                    run("seq", "64K", 1_900_000, 256),
                ],
                vec![
                    run("seq", "4K", 5_050_000, 4096),
                    run("seq", "4K", 5_150_000, 4097),
                    run("seq", "4K", 4_950_000, 4098),
                ],
                vec![
                    run("random", "64K", 3_000_000, 300),
                    run("random", "64K", 3_000_000, 300),
                    run("random", "64K", 3_000_000, 300),
                ],
            ],
        );
        let t = changelog(&[&loaded("stock.json", a), &loaded("patched.json", b)]);
        assert!(
            t.starts_with("A: stock.json (kernel 7.3, bench 16 MiB, child exit, 3 runs per cell)\n"),
            "{t}"
        );
        assert!(t.contains("B: patched.json (kernel 7.3+patch"), "{t}");
        let header = t.lines().find(|l| l.trim_start().starts_with("mode")).unwrap();
        for col in ["folio", "metric", "A", "B", "change", "beyond spread"] {
            assert!(header.contains(col), "{header}");
        }
        assert_eq!(
            row(&t, "seq", "64K", "write faults"),
            ["seq", "64K", "write faults", "4,096.0 ± 0.0", "256.0 ± 0.0", "-93.75%", "yes"]
        );
        assert_eq!(
            row(&t, "seq", "64K", "time"),
            ["seq", "64K", "time (ms)", "8.00 ± 0.20", "2.00 ± 0.10", "-75.00%", "yes"]
        );
        // Overlapping ranges: not beyond the spread.
        let r = row(&t, "seq", "4K", "time");
        assert_eq!(&r[5..], ["+1.00%", "no"], "{r:?}");
        assert_eq!(row(&t, "seq", "4K", "write faults")[5..], ["0.00%", "no"]);
        assert_eq!(row(&t, "random", "64K", "only in B").len(), 3);
        assert!(t.contains("non-overlap") || t.contains("do not overlap"), "{t}");
        assert!(t.contains("sample standard deviation (n-1)"), "{t}");
        // The columns line up (in characters: `±` is two bytes): every A
        // value ends where the header's A does.
        let end_of = |l: &str, s: &str| l.find(s).map(|i| l[..i].chars().count() + s.chars().count());
        let a_end = end_of(header, " A");
        let line = t.lines().find(|l| l.contains("time (ms)") && l.contains("8.00")).unwrap();
        assert_eq!(end_of(line, "8.00 ± 0.20"), a_end, "{t}");
        let line = t.lines().find(|l| l.contains("write faults") && l.contains("256.0")).unwrap();
        assert_eq!(end_of(line, "4,096.0 ± 0.0"), a_end, "{t}");
    }

    #[test]
    fn single_runs_and_unmeasurable_write_faults() {
        let mut b = run("seq", "4K", 1_000, 10);
        b.processes[0].phases[0].classes.insert(
            ReportClass::WriteFaults,
            crate::report::schema::testing::not_measurable("no tracepoint"),
        );
        let a = series("6.1", vec![vec![run("seq", "4K", 1_000, 10)]]);
        let b = series("6.1", vec![vec![b]]);
        let t = changelog(&[&loaded("a", a), &loaded("b", b)]);
        assert!(t.contains("1 run per cell"), "{t}");
        assert_eq!(row(&t, "seq", "4K", "write faults"), ["seq", "4K", "write faults", "10", "n/m"]);
        assert_eq!(row(&t, "seq", "4K", "time"), ["seq", "4K", "time (us)", "1.00", "1.00", "0.00%", "-"]);
    }

    #[test]
    fn mismatched_workloads_are_said() {
        let a = series("7.3", vec![vec![run("seq", "4K", 1, 1)]]);
        let mut r = run("seq", "4K", 1, 1);
        r.bench.as_mut().unwrap().size = 32 << 20;
        let b = series("7.3", vec![vec![r]]);
        let t = changelog(&[&loaded("a", a), &loaded("b", b)]);
        assert!(t.contains("warning: workloads differ: bench size \"16777216\" vs \"33554432\""), "{t}");
    }
}
