//! Bench series in the layout of a fault-path patch's cover letter: one
//! column per kernel; per write pattern a block of the write step's write
//! faults (spurious faults and contpte unfolds where they apply) and wall
//! time by folio size, each value the median of one boot's runs, the boots
//! joined by ` / ` (`29.7 / 30.1`); then the latency of the faults a folio
//! reuse change is about: the reuse fault, the fault that allocated the
//! folio, a 4K COW copy. Plain text, to paste.

use std::fmt::Write as _;

use super::{
    bench_series::{Cell, LoadedSeries, Stats},
    schema::{ClassValue, Report},
};
use crate::{kernel::classes::ReportClass, term::safe, units};

/// A folio row's label, as the cover letter names them: `4K pages`, `64K
/// mTHP`, `2M THP, PTE-mapped`.
pub fn folio_label(folio: &str, mapping: &str) -> String {
    match units::parse_size(folio) {
        Ok(units::PAGE) => format!("{folio} pages"),
        Ok(units::PMD_SIZE) => format!("{folio} THP, {}-mapped", mapping.to_uppercase()),
        _ => format!("{folio} mTHP"),
    }
}

/// What a cell's write step did, as a block's heading.
fn heading(c: &Cell) -> String {
    let b = c.runs.first().and_then(|r| r.bench.as_ref());
    let threads = b.map_or(1, |b| b.threads);
    let timed = b.is_some_and(|b| b.store_latency.is_some());
    // Reports name the modes as clap does (`read-then-store`) or without
    // the dashes (`readthenstore`).
    let what = match c.mode.replace('-', "").as_str() {
        "seq" if timed => "one byte per page, a clock_gettime() between the stores".to_string(),
        "seq" => "one byte per page, ascending".into(),
        "random" => "one byte per page, random order".into(),
        "memset" => "memset() of all of it".into(),
        "threads" => format!("{threads} threads, one byte per page, random order"),
        "threadssame" => format!("{threads} threads, each storing to every page, random order"),
        "perfolio" => "one byte per folio".into(),
        "readthenstore" => "every page of a folio read, then stored to".into(),
        "readerwriter" => "every page read on one CPU, stored to on another, then on the first".into(),
        "hotpatch" => "one byte a file THP, after mprotect() to writable".into(),
        "hotpatchmem" => "one byte a file THP, through /proc/self/mem".into(),
        m => safe(m),
    };
    match b.map(|b| b.child.as_str()) {
        Some("alive") => format!("{what}, the child alive"),
        _ => what,
    }
}

/// The write step's count of `m` in one run.
fn count(r: &Report, m: ReportClass) -> Result<u64, &'static str> {
    if r.mode == super::schema::Mode::Off {
        return Err("off");
    }
    let span = r.bench_process().and_then(|p| p.span("mark:write")).ok_or("-")?;
    match span.classes.get(&m) {
        Some(ClassValue::Measured(x)) => Ok(x.count),
        _ => Err("n/m"),
    }
}

fn wall_ns(r: &Report) -> Result<u64, &'static str> {
    r.bench.as_ref().and_then(|b| b.step("write")).map(|s| s.wall_ns).ok_or("-")
}

/// The median of `f` over each boot's runs, or why there is none.
fn boot_medians(
    c: &Cell,
    f: impl Fn(&Report) -> Result<u64, &'static str>,
) -> Result<Vec<f64>, &'static str> {
    c.boots()
        .iter()
        .map(|runs| {
            let v: Vec<u64> = runs.iter().map(|r| f(r)).collect::<Result<_, _>>()?;
            Ok(Stats::of(&v).map_or(0.0, |s| s.median))
        })
        .collect()
}

/// One value row of a block: the label and, per column, the boots'
/// medians or why there are none, and whether a run of the cell lost
/// events (its counts are then lower bounds).
struct Line {
    label: String,
    cells: Vec<Result<Vec<f64>, &'static str>>,
    lost: Vec<bool>,
}

/// Whether a run of the cell lost events in the kernel or in user space
/// (`drops`): its counts may be short.
pub fn lost(c: &Cell) -> bool {
    c.runs.iter().any(|r| r.drops.total() > 0)
}

/// The footnote of values marked `*`, naming what was lost.
pub const LOST: &str = "* a run of this cell lost events (the report's `drops`, e.g. kretprobe \
returns the kernel missed): the counts are lower bounds; the statistics \
below give the step's getrusage minflt beside them.";

/// What a block shows of each cell.
#[derive(Clone, Copy)]
enum Quantity {
    Class(ReportClass, &'static str),
    Time,
}

impl Quantity {
    fn title(self) -> &'static str {
        match self {
            Quantity::Class(_, t) => t,
            Quantity::Time => "time",
        }
    }

    fn of(self, c: &Cell) -> Result<Vec<f64>, &'static str> {
        match self {
            Quantity::Class(m, _) => boot_medians(c, |r| count(r, m)),
            Quantity::Time => boot_medians(c, wall_ns),
        }
    }
}

/// Whether a block of `q` is worth a place: write faults and time always;
/// spurious faults in read-then-store or where a boot's median is not 0;
/// contpte unfolds on arm64 where measured.
fn shown(q: Quantity, mode: &str, cells: &[Option<&Cell>], arm64: bool) -> bool {
    let some = || cells.iter().flatten().any(|c| q.of(c).is_ok_and(|v| v.iter().any(|x| *x > 0.0)));
    match q {
        Quantity::Class(ReportClass::Spurious, _) => {
            matches!(mode.replace('-', "").as_str(), "readthenstore" | "readerwriter") || some()
        }
        Quantity::Class(ReportClass::ContpteUnfold, _) => {
            arm64
                && cells
                    .iter()
                    .flatten()
                    .any(|c| c.runs.iter().any(|r| count(r, ReportClass::ContpteUnfold).is_ok()))
        }
        _ => true,
    }
}

const QUANTITIES: [Quantity; 4] = [
    Quantity::Class(ReportClass::WriteFaults, "write faults"),
    Quantity::Class(ReportClass::Spurious, "spurious faults"),
    Quantity::Class(ReportClass::ContpteUnfold, "contpte unfolds"),
    Quantity::Time,
];

/// A block's values as text: counts whole (`4,161`, or `4,161 / 4,165`
/// where the boots differ), times in one unit for the block with the
/// numbers of a cell padded alike (` 5.5 /  5.6`).
fn render(q: Quantity, lines: &[Line]) -> (String, Vec<Vec<String>>) {
    let all = lines.iter().flat_map(|l| l.cells.iter().flatten().flatten().copied());
    let (unit, div, decimals) = match q {
        Quantity::Time => {
            let max = all.fold(0.0_f64, f64::max);
            let (unit, div) = if max >= 1e9 {
                ("s", 1e9)
            } else if max >= 1e6 {
                ("ms", 1e6)
            } else {
                ("us", 1e3)
            };
            let small = lines.iter().flat_map(|l| l.cells.iter().flatten().flatten()).any(|v| v / div < 1.0);
            (format!(" ({unit})"), div, if small { 2 } else { 1 })
        }
        Quantity::Class(..) => (String::new(), 1.0, 0),
    };
    let one = |v: f64| match q {
        Quantity::Time => format!("{:.*}", decimals, v / div),
        Quantity::Class(..) => super::bench_series::count_f(v),
    };
    let width = lines
        .iter()
        .flat_map(|l| l.cells.iter().flatten().flatten())
        .map(|v| one(*v).chars().count())
        .max()
        .unwrap_or(0);
    let cells = lines
        .iter()
        .map(|l| {
            l.cells
                .iter()
                .map(|c| match c {
                    Err(why) => why.to_string(),
                    Ok(v) if matches!(q, Quantity::Class(..)) && v.windows(2).all(|w| w[0] == w[1]) => {
                        v.first().map_or("-".into(), |x| one(*x))
                    }
                    Ok(v) => v.iter().map(|x| format!("{:>width$}", one(*x))).collect::<Vec<_>>().join(" / "),
                })
                .zip(&l.lost)
                .map(|(v, lost)| if *lost && matches!(q, Quantity::Class(..)) { v + "*" } else { v })
                .collect()
        })
        .collect();
    (format!("{}{unit}", q.title()), cells)
}

/// The table: a header of the columns' kernels, then per heading (write
/// pattern) its blocks.
pub fn table<'a>(cols: &[&'a LoadedSeries]) -> String {
    let arm64 = cols.iter().any(|l| l.series.arch == "aarch64" || l.series.arch == "arm64");
    let modelled = modelled(cols);
    // The blocks' headings and rows in the order they first appear.
    let mut headings: Vec<String> = Vec::new();
    for l in cols {
        for c in &l.series.cells {
            let h = heading(c);
            if !headings.contains(&h) {
                headings.push(h);
            }
        }
    }
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let blank = vec![String::new(); cols.len()];
    for h in &headings {
        rows.push((format!("  {h}"), blank.clone()));
        // (folio, mapping) rows, ascending in size, PTE before PMD.
        let mut folios: Vec<(u64, String, String)> = Vec::new();
        for l in cols {
            for c in l.series.cells.iter().filter(|c| heading(c) == *h) {
                let size = units::parse_size(&c.folio).unwrap_or(u64::MAX);
                if !folios.iter().any(|(_, f, m)| *f == c.folio && *m == c.mapping) {
                    folios.push((size, c.folio.clone(), c.mapping.clone()));
                }
            }
        }
        folios.sort_by_key(|f| (f.0, f.2 != "pte"));
        let cell_of = |l: &'a LoadedSeries, f: &str, m: &str| -> Option<&'a Cell> {
            l.series.cells.iter().find(|c| heading(c) == *h && c.folio == f && c.mapping == m)
        };
        let mode = cols
            .iter()
            .find_map(|l| l.series.cells.iter().find(|c| heading(c) == *h))
            .map_or(String::new(), |c| c.mode.clone());
        for q in QUANTITIES {
            let all: Vec<Option<&Cell>> =
                folios.iter().flat_map(|(_, f, m)| cols.iter().map(move |l| cell_of(l, f, m))).collect();
            if !shown(q, &mode, &all, arm64) {
                continue;
            }
            let lines: Vec<Line> = folios
                .iter()
                .map(|(_, f, m)| Line {
                    label: folio_label(f, m),
                    cells: cols.iter().map(|l| cell_of(l, f, m).map_or(Err("-"), |c| q.of(c))).collect(),
                    lost: cols.iter().map(|l| cell_of(l, f, m).is_some_and(lost)).collect(),
                })
                .collect();
            let (mut title, cells) = render(q, &lines);
            if matches!(q, Quantity::Class(ReportClass::Spurious, _)) && modelled {
                title.push_str(" (modelled)");
            }
            rows.push((format!("    {title}"), blank.clone()));
            for (l, c) in lines.iter().zip(cells) {
                rows.push((format!("      {}", l.label), c));
            }
        }
    }
    let heads: Vec<String> = cols.iter().map(|l| safe(&l.series.kernel)).collect();
    let mut out = layout(&heads, &rows);
    if rows.iter().any(|(_, c)| c.iter().any(|v| v.ends_with('*'))) {
        out.push_str(&format!("\n{}\n", wrap(LOST)));
    }
    if modelled && rows.iter().any(|(l, _)| l.ends_with("(modelled)")) {
        out.push_str(&format!("\n{}\n", wrap(MODELLED)));
    }
    out
}

/// What a guest's kernel command line carries when QEMU ran it with its
/// stale-TLB model (`cargo xtask ... --tlb stale`): the runs' reports keep
/// the command line, so the table can say its spurious faults are
/// modelled.
pub const STALE_TLB_MODEL: &str = "qemu.stale_tlb=on";

const MODELLED: &str = "(modelled): the guests ran under QEMU's stale-TLB model, which keeps a \
    read-only TLB entry after the PTE becomes writable until the guest flushes it, as Intel \
    CPUs and arm64 may, and then faults on a store through it; QEMU as shipped re-walks the \
    page table and takes no such fault. Speculative TLB fills are not modelled.";

/// Whether any run of `cols` ran under the stale-TLB model.
fn modelled(cols: &[&LoadedSeries]) -> bool {
    cols.iter().flat_map(|l| &l.series.cells).flat_map(|c| &c.runs).any(|r| {
        r.provenance
            .as_ref()
            .is_some_and(|p| p.kernel_cmdline.split_whitespace().any(|w| w == STALE_TLB_MODEL))
    })
}

/// Rows under a header (a head may have several lines, split on `\n`),
/// the label column as wide as the widest label and each column as its
/// widest value, right-aligned.
fn layout(heads: &[String], rows: &[(String, Vec<String>)]) -> String {
    let lw =
        rows.iter().filter(|(_, c)| c.iter().any(|x| !x.is_empty())).map(|(l, _)| l.chars().count()).max();
    let lw = lw.unwrap_or(0).max(20);
    let head_lines: Vec<Vec<&str>> = heads.iter().map(|h| h.split('\n').collect()).collect();
    let depth = head_lines.iter().map(Vec::len).max().unwrap_or(0);
    let w: Vec<usize> = (0..heads.len())
        .map(|i| {
            let head = head_lines[i].iter().map(|l| l.chars().count());
            rows.iter().map(|(_, c)| c[i].chars().count()).chain(head).max().unwrap_or(0)
        })
        .collect();
    let line = |label: &str, cells: &[&str]| {
        let mut s = format!("{label:<lw$}");
        for (i, c) in cells.iter().enumerate() {
            let _ = write!(s, "   {c:>w$}", w = w[i]);
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = String::new();
    for d in 0..depth {
        // Heads of fewer lines sit on the bottom ones.
        let cells: Vec<&str> = head_lines
            .iter()
            .map(|h| if d + h.len() >= depth { h[d + h.len() - depth] } else { "" })
            .collect();
        out.push_str(&line("", &cells));
    }
    for (label, cells) in rows {
        if cells.iter().all(String::is_empty) {
            out.push_str(label);
            out.push('\n');
        } else {
            out.push_str(&line(label, &cells.iter().map(String::as_str).collect::<Vec<_>>()));
        }
    }
    out
}

/// `text` wrapped at 72 columns.
fn wrap(text: &str) -> String {
    let mut out = String::new();
    let mut col = 0;
    for w in text.split_whitespace() {
        if col > 0 && col + 1 + w.chars().count() > 72 {
            out.push('\n');
            col = 0;
        } else if col > 0 {
            out.push(' ');
            col += 1;
        }
        out.push_str(w);
        col += w.chars().count();
    }
    out
}

/// The p50 latency of `m` in a run's step `step` (its `mark:STEP` phase).
fn p50(r: &Report, step: &str, m: ReportClass) -> Option<u64> {
    let name = format!("mark:{step}");
    let ph = r.bench_process()?.phases.iter().find(|p| p.name == name)?;
    match ph.classes.get(&m)? {
        ClassValue::Measured(x) if x.count > 0 => x.latency.as_ref().map(|l| l.p50_ns),
        _ => None,
    }
}

/// The median over a cell's runs of their p50 of `m` in `step`.
fn median_p50(c: &Cell, step: &str, m: ReportClass) -> Option<f64> {
    let v: Vec<u64> = c.runs.iter().filter_map(|r| p50(r, step, m)).collect();
    Stats::of(&v).map(|s| s.median)
}

/// The p50 of the faults that allocated the cell's folios: not_present's
/// where timed, else that of all faults of the populate step when every
/// one of them was a first touch (the step only touches new memory).
fn allocating_p50(c: &Cell) -> Option<f64> {
    median_p50(c, "populate", ReportClass::NotPresent).or_else(|| {
        let all_first = c.runs.iter().all(|r| {
            let span = r.bench_process().and_then(|p| p.span("mark:populate"));
            span.is_some_and(|s| {
                let (all, first) = (s.count(ReportClass::Faults), s.count(ReportClass::NotPresent));
                all.is_some() && all == first
            })
        });
        all_first.then(|| median_p50(c, "populate", ReportClass::Faults))?
    })
}

/// The latency table: per large folio of the cover letter's pass (one
/// byte per page after the child's exit), the reuse fault's p50 on each
/// kernel, and on the last kernel the fault that allocated the folio and
/// a COW fault that copies 4K (the 4K cell with the most copies). The
/// values are faultscope's, the fault's time in the kernel; medians over
/// the runs of each run's p50. Empty when no column has such a cell.
pub fn latency<'a>(cols: &[&'a LoadedSeries]) -> String {
    let pass = |c: &Cell| {
        c.mode == "seq" && c.key().3 == "exit" && units::parse_size(&c.folio).is_ok_and(|s| s > units::PAGE)
    };
    let mut folios: Vec<(u64, String, String)> = Vec::new();
    for l in cols {
        for c in l.series.cells.iter().filter(|c| pass(c)) {
            if !folios.iter().any(|(_, f, m)| *f == c.folio && *m == c.mapping) {
                folios.push((units::parse_size(&c.folio).unwrap_or(0), c.folio.clone(), c.mapping.clone()));
            }
        }
    }
    let Some(last) = cols.last() else { return String::new() };
    if folios.is_empty() {
        return String::new();
    }
    folios.sort_by_key(|f| (f.0, f.2 != "pte"));
    let copies =
        |c: &Cell| c.step("write").and_then(|s| s.class(ReportClass::Copy)).map_or(0.0, |s| s.median);
    let copy_cell = last
        .series
        .cells
        .iter()
        .filter(|c| c.folio == "4K" && copies(c) > 0.0)
        .max_by(|a, b| copies(a).total_cmp(&copies(b)));
    let copy = copy_cell.and_then(|c| median_p50(c, "write", ReportClass::Copy));
    let ns = |v: Option<f64>| v.map_or("n/m".to_string(), |x| units::count(x.round() as u64));
    let mut heads: Vec<String> =
        cols.iter().map(|l| format!("reuse fault\n{}", safe(&l.series.kernel))).collect();
    heads.push("fault that\nallocated it".into());
    heads.push("COW fault that\ncopies 4K".into());
    let mut rows = Vec::new();
    for (_, f, m) in &folios {
        let cell = |l: &'a LoadedSeries| -> Option<&'a Cell> {
            l.series.cells.iter().find(|c| pass(c) && c.folio == *f && c.mapping == *m)
        };
        let mut cells: Vec<String> = cols
            .iter()
            .map(|l| cell(l).map_or("-".into(), |c| ns(median_p50(c, "write", ReportClass::Reuse))))
            .collect();
        cells.push(cell(last).map_or("-".into(), |c| ns(allocating_p50(c))));
        cells.push(if copy_cell.is_some() { ns(copy) } else { "-".into() });
        rows.push((format!("      {}", folio_label(f, m)), cells));
    }
    if rows.iter().all(|(_, c)| c.iter().all(|v| v == "n/m" || v == "-")) {
        return "Latency: not measurable here (these runs timed no fault).\n".into();
    }
    let mut out = String::from(
        "The latency of the fault that reuses a folio, beside the fault that\n\
         allocated it and a COW fault that copies 4K (faultscope's p50 of the\n\
         fault's time in the kernel, the median over the runs; ns; the\n\
         allocating fault is the populate step's, where every fault of it\n\
         was a first touch):\n\n",
    );
    out.push_str(&layout(&heads, &rows));
    out
}

/// The paragraph above the table: the machine, the workload, how many
/// runs and boots, and whether the boots alternated between the kernels.
pub fn preamble(cols: &[&LoadedSeries]) -> String {
    let first = cols.first().map(|l| &l.series);
    let prov = first
        .and_then(|s| s.provenance.as_ref().or_else(|| s.cells.first()?.runs.first()?.provenance.as_ref()));
    let arch = first.map_or(String::new(), |s| safe(&s.arch));
    let mut machine = arch;
    if let Some(p) = prov {
        if !p.cpu_model.is_empty() {
            let _ = write!(machine, ", {}", safe(&p.cpu_model));
        }
        match &p.hypervisor {
            Some(hv) if !p.cpu_model.contains(hv.as_str()) => {
                let _ = write!(machine, " under {}", safe(hv));
            }
            _ => {}
        }
    }
    let cells = cols.iter().flat_map(|l| l.series.cells.iter());
    let mut sizes: Vec<u64> =
        cells.clone().filter_map(|c| c.runs.first()?.bench.as_ref().map(|b| b.size)).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let sizes: Vec<String> = sizes.iter().map(|s| format!("{} MiB", s >> 20)).collect();
    let runs: Vec<usize> = cells.clone().map(|c| c.runs.len()).collect();
    let boots: Vec<usize> = cells.map(|c| c.boots().len()).collect();
    let range = |v: &[usize]| {
        let (lo, hi) = (v.iter().min().copied().unwrap_or(0), v.iter().max().copied().unwrap_or(0));
        if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        }
    };
    let per_boot: Vec<usize> = cols
        .iter()
        .flat_map(|l| l.series.cells.iter().flat_map(|c| c.boots().into_iter().map(|b| b.len())))
        .collect();
    let mut children: Vec<&str> =
        cols.iter().flat_map(|l| l.series.cells.iter().map(|c| c.key().3)).collect();
    children.sort_unstable();
    children.dedup();
    let child = match children.as_slice() {
        ["exit"] => "the child exits, ",
        ["alive"] => "the child stays alive, ",
        _ => "",
    };
    // The hot patches fork no child (`bench` says "none").
    let mut s = if children.as_slice() == ["none"] {
        format!(
            "{machine}, {} of a private executable file mapping of file THPs, no fork, one byte written into each THP. ",
            sizes.join(", ")
        )
    } else {
        format!(
            "{machine}, {} of anonymous memory, fork(), {child}then the parent stores to the memory. ",
            sizes.join(", ")
        )
    };
    match boots.iter().max().copied().unwrap_or(1) {
        0 | 1 => {
            let _ = write!(s, "Medians of {} runs, one boot of each kernel", range(&runs));
        }
        _ => {
            let _ = write!(
                s,
                "Medians of {} runs per boot, {} boots of each kernel{} (a value per boot)",
                range(&per_boot),
                range(&boots),
                if alternated(cols) { ", taken alternately" } else { "" }
            );
        }
    }
    s.push(':');
    wrap(&s) + "\n"
}

/// Whether the columns' boots alternated: ordered by their first run's
/// start, no two neighbours are boots of one column.
fn alternated(cols: &[&LoadedSeries]) -> bool {
    // (boot id, column) -> the boot's first start.
    let mut first: Vec<(&str, usize, u64)> = Vec::new();
    for (i, l) in cols.iter().enumerate() {
        for r in l.series.cells.iter().flat_map(|c| &c.runs) {
            let Some(p) = &r.provenance else { return false };
            let Some(id) = p.boot_id.as_deref() else { return false };
            match first.iter_mut().find(|(b, c, _)| *b == id && *c == i) {
                Some(f) => f.2 = f.2.min(p.start_unix_ns),
                None => first.push((id, i, p.start_unix_ns)),
            }
        }
    }
    let mut boots: Vec<(u64, usize)> = first.into_iter().map(|(_, i, t)| (t, i)).collect();
    boots.sort_unstable();
    cols.len() > 1 && boots.windows(2).all(|w| w[0].1 != w[1].1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{
        bench_series::testing::{run, series},
        schema::Provenance,
    };

    fn in_boot(mut r: Report, boot: &str, start: u64) -> Report {
        r.provenance =
            Some(Provenance { boot_id: Some(boot.into()), start_unix_ns: start, ..Provenance::default() });
        r
    }

    fn loaded(path: &str, s: crate::report::bench_series::Series) -> LoadedSeries {
        LoadedSeries { path: path.into(), series: s }
    }

    #[test]
    fn folio_labels_of_the_cover_letter() {
        assert_eq!(folio_label("4K", "pte"), "4K pages");
        assert_eq!(folio_label("64K", "pte"), "64K mTHP");
        assert_eq!(folio_label("1M", "pte"), "1M mTHP");
        assert_eq!(folio_label("2M", "pte"), "2M THP, PTE-mapped");
        assert_eq!(folio_label("2M", "pmd"), "2M THP, PMD-mapped");
    }

    #[test]
    fn a_value_per_boot_and_blocks_per_pattern() {
        // Kernel A booted at t=0 and t=20, B at t=10 and t=30: alternately.
        let runs = |k: &str, folio: &str, faults: u64, ms: [u64; 2], t: [u64; 2]| {
            (0..4)
                .map(|i| {
                    let b = i / 2;
                    let r = run("seq", folio, ms[b] * 1_000_000 + i as u64 * 1000, faults);
                    in_boot(r, &format!("{k}{b}"), t[b] + i as u64)
                })
                .collect::<Vec<_>>()
        };
        let a = series(
            "7.3",
            vec![runs("a", "4K", 4096, [30, 31], [0, 20]), runs("a", "64K", 4096, [29, 30], [0, 20])],
        );
        let mut mem = run("memset", "64K", 9_000_000, 256);
        mem = in_boot(mem, "b0", 10);
        let b = series(
            "7.3+series",
            vec![
                runs("b", "4K", 4096, [30, 32], [10, 30]),
                runs("b", "64K", 256, [5, 6], [10, 30]),
                vec![mem],
            ],
        );
        let (la, lb) = (loaded("a", a), loaded("b", b));
        let t = table(&[&la, &lb]);
        let line = |label: &str, after: &str| {
            let from = t.find(after).unwrap_or_else(|| panic!("no {after} in\n{t}"));
            t[from..]
                .lines()
                .find(|l| l.trim_start().starts_with(label))
                .unwrap_or_else(|| panic!("{label}\n{t}"))
        };
        assert!(t.lines().next().unwrap().trim_end().ends_with("7.3+series"), "{t}");
        assert!(t.contains("\n  one byte per page, ascending\n    write faults\n"), "{t}");
        let wf = line("64K mTHP", "write faults");
        assert!(
            wf.trim_end().ends_with("4,096     256")
                || wf.split_whitespace().collect::<Vec<_>>()[2..] == ["4,096", "256"],
            "{t}"
        );
        // A value per boot: the median of each boot's two runs.
        let time = line("64K mTHP", "time (ms)");
        assert!(time.contains("29.0 / 30.0") && time.contains(" 5.0 /  6.0"), "{t}");
        // memset only in B: its block has A's cell missing.
        let m = line("64K mTHP", "memset() of all of it");
        assert!(m.split_whitespace().any(|w| w == "-"), "{t}");
        assert!(!t.contains("spurious"), "no spurious block without spurious faults:\n{t}");
        let p = preamble(&[&la, &lb]).replace('\n', " ");
        assert!(
            p.contains("Medians of 1-2 runs per boot, 1-2 boots of each kernel, taken alternately"),
            "{p}"
        );
    }

    #[test]
    fn counts_of_runs_that_lost_events_are_marked() {
        let mut r = run("threads", "64K", 1_000_000, 300);
        r.bench.as_mut().unwrap().threads = 8;
        let reason = crate::kernel::drops::DropReason::all().next().unwrap();
        r.drops.set(reason, 7);
        let a = loaded("a", series("7.3", vec![vec![r]]));
        let b = loaded("b", series("7.3", vec![vec![run("seq", "64K", 1_000_000, 256)]]));
        let t = table(&[&a, &b]);
        assert!(t.contains("8 threads, one byte per page, random order"), "{t}");
        let line = t.lines().find(|l| l.trim_start().starts_with("64K mTHP") && l.contains("300")).unwrap();
        assert!(line.contains("300*"), "{t}");
        assert!(t.contains("lower bounds"), "{t}");
        let plain = table(&[&b, &b]);
        assert!(!plain.contains('*') && !plain.contains("lower bounds"), "{plain}");
    }

    #[test]
    fn spurious_faults_of_the_stale_tlb_model_are_labelled_modelled() {
        let mut r = run("read-then-store", "64K", 1_000_000, 300);
        let plain = loaded("a", series("7.3", vec![vec![r.clone()]]));
        let t = table(&[&plain, &plain]);
        assert!(t.contains("spurious faults") && !t.contains("modelled"), "{t}");
        r.provenance = Some(Provenance {
            kernel_cmdline: format!("console=ttyS0 {STALE_TLB_MODEL} quiet"),
            ..Provenance::default()
        });
        let m = loaded("b", series("7.3", vec![vec![r]]));
        let t = table(&[&plain, &m]);
        assert!(t.contains("spurious faults (modelled)"), "{t}");
        assert!(t.contains("QEMU's stale-TLB model"), "{t}");
    }

    #[test]
    fn one_boot_is_said_so_and_not_alternated() {
        let a = series("6.1", vec![vec![run("seq", "4K", 1_000_000, 10), run("seq", "4K", 1_000_000, 10)]]);
        let la = loaded("a", a);
        let p = preamble(&[&la, &la]).replace('\n', " ");
        assert!(p.contains("Medians of 2 runs, one boot of each kernel:"), "{p}");
        assert!(latency(&[&la]).is_empty(), "no large folio, no latency table");
    }
}
