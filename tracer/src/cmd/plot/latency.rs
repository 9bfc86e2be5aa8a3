//! `plot --latency CLASS A B`: the distribution of a class's fault latency
//! in one bench step (`--step`, the write step by default) of two series,
//! as cumulative fractions over a log time axis: one small panel per
//! (mode, folio, mapping) cell the two have in common, A solid, B dashed.
//! It is drawn from the kernel's own log-linear buckets that the report
//! keeps (`Latency::buckets`), every run of a cell summed, so that it shows
//! the whole distribution where p50 and p99 are two points of it. Inside a
//! bucket the faults are taken as spread evenly (the bucket is the
//! resolution: a quarter of an octave). Where a side has no buckets (the
//! class not measured or not timed there, a report from before buckets)
//! the panel says so instead of drawing a line.

use std::path::Path;

use anyhow::Result;
use plotters::prelude::*;

use super::{
    compare::{common_pairs, only_notes},
    err, head, notes, Swatch, LEGEND_H, NOTE_LINE, SIDE_COLOR, TITLE_H,
};
use crate::{
    error::Refusal,
    kernel::classes::ReportClass,
    report::{
        bench_series::LoadedSeries,
        schema::{ClassValue, Latency, Mode, PhaseKind, Report},
    },
    term::safe,
};

/// One side of a panel: the summed buckets, or why there are none.
#[derive(Clone, Debug, PartialEq)]
pub enum Side {
    Buckets(Vec<[u64; 3]>),
    Missing(String),
}

/// One cell's panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    pub label: String,
    pub sides: [Side; 2],
}

/// What the picture shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Cdfs {
    pub panels: Vec<Panel>,
    pub notes: Vec<String>,
}

/// The buckets of `class` in the bench step `step` of one run: those of
/// the step's mark phase and of the automatic phases up to the next mark
/// (the step as `Process::spans` defines it), added; or why there are
/// none.
pub fn step_buckets(r: &Report, class: ReportClass, step: &str) -> Result<Vec<[u64; 3]>, String> {
    if r.mode == Mode::Off {
        return Err("not traced (bench --no-trace)".into());
    }
    let Some(p) = r.bench_process() else { return Err("no bench process in the report".into()) };
    let mark = format!("mark:{step}");
    let Some(i) = p.phases.iter().position(|ph| ph.name == mark) else {
        return Err(format!("no {} phase", safe(&mark)));
    };
    let end = p.phases[i + 1..]
        .iter()
        .position(|ph| ph.kind == PhaseKind::Mark)
        .map_or(p.phases.len(), |j| i + 1 + j);
    let name = class.name();
    let mut out = Vec::new();
    for ph in &p.phases[i..end] {
        match ph.classes.get(&class) {
            None => return Err(format!("{name} is not in the report")),
            Some(ClassValue::NotMeasurable(n)) => {
                return Err(format!("{name} not measurable: {}", safe(&n.reason)));
            }
            Some(ClassValue::Measured(m)) => match &m.latency {
                _ if m.count == 0 => {}
                None => return Err(format!("{name} not timed here (no latency in the report)")),
                Some(l) if l.buckets.is_empty() => {
                    return Err("no latency buckets (a report from before they were kept)".into())
                }
                Some(l) => Latency::add_buckets(&mut out, &l.buckets),
            },
        }
    }
    Ok(out)
}

/// A cell's side: every run's buckets summed, or the first run's reason.
fn side(runs: &[Report], class: ReportClass, step: &str) -> Side {
    let mut sum = Vec::new();
    for r in runs {
        match step_buckets(r, class, step) {
            Ok(b) => Latency::add_buckets(&mut sum, &b),
            Err(why) => return Side::Missing(why),
        }
    }
    if sum.is_empty() {
        return Side::Missing(format!("no {} faults in the {} step", class.name(), safe(step)));
    }
    Side::Buckets(sum)
}

pub fn cdfs(class: ReportClass, step: &str, a: &LoadedSeries, b: &LoadedSeries) -> Result<Cdfs, Refusal> {
    let runs = || a.series.cells.iter().chain(&b.series.cells).flat_map(|c| &c.runs);
    let steps = |r: &Report| -> Vec<String> {
        r.bench.as_ref().map(|b| b.steps.iter().map(|s| s.name.clone()).collect()).unwrap_or_default()
    };
    if !runs().any(|r| steps(r).iter().any(|s| s == step)) {
        let mut known: Vec<String> = Vec::new();
        for s in runs().flat_map(steps) {
            if !known.contains(&s) {
                known.push(s);
            }
        }
        return Err(Refusal::new(format!(
            "--step {}: A and B have no bench step of that name (theirs: {})",
            safe(step),
            safe(&known.join(", "))
        )));
    }
    let p = common_pairs(a, b)?;
    let panels = p
        .common
        .iter()
        .map(|(label, ca, cb)| Panel {
            label: label.clone(),
            sides: [side(&ca.runs, class, step), side(&cb.runs, class, step)],
        })
        .collect();
    Ok(Cdfs { panels, notes: only_notes(&p) })
}

/// The CDF of buckets: from (first lo, 0) to (last hi, 1.0), straight
/// inside each bucket, flat over the gaps between them.
pub fn cdf(buckets: &[[u64; 3]]) -> Vec<(f64, f64)> {
    let total: u64 = buckets.iter().map(|b| b[2]).sum();
    let mut out = Vec::with_capacity(2 * buckets.len());
    let mut cum = 0u64;
    for b in buckets {
        out.push((b[0] as f64, cum as f64 / total as f64));
        cum += b[2];
        out.push((b[1] as f64, cum as f64 / total as f64));
    }
    out
}

/// The bucket holding the q-quantile (the one where the CDF reaches q).
pub fn quantile_bucket(buckets: &[[u64; 3]], q: f64) -> Option<[u64; 3]> {
    let total: u64 = buckets.iter().map(|b| b[2]).sum();
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut cum = 0;
    buckets
        .iter()
        .find(|b| {
            cum += b[2];
            cum >= rank
        })
        .copied()
}

/// A time tick: `500ns`, `2µs`, `1.5ms`.
pub fn ns_tick(v: f64) -> String {
    let (per, unit) = match v {
        v if v >= 1e9 => (1e9, "s"),
        v if v >= 1e6 => (1e6, "ms"),
        v if v >= 1e3 => (1e3, "µs"),
        _ => (1.0, "ns"),
    };
    let x = v / per;
    if (x - x.round()).abs() < 1e-6 {
        format!("{x:.0}{unit}")
    } else {
        format!("{x:.1}{unit}")
    }
}

/// Words of `s` in lines of at most `n` characters (a longer word alone).
fn wrap(s: &str, n: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in s.split(' ') {
        match out.last_mut() {
            Some(l) if l.chars().count() + 1 + w.chars().count() <= n => {
                l.push(' ');
                l.push_str(w);
            }
            _ => out.push(w.to_string()),
        }
    }
    out
}

const WIDTH: u32 = 1100;
const PANEL_H: u32 = 280;

/// The time axis of every panel: whole decades around all the buckets.
fn x_range(c: &Cdfs) -> (f64, f64) {
    let all = c.panels.iter().flat_map(|p| &p.sides).flat_map(|s| match s {
        Side::Buckets(b) => b.as_slice(),
        Side::Missing(_) => &[],
    });
    let (lo, hi) =
        all.fold((f64::INFINITY, 0.0f64), |(l, h), b| (l.min(b[0].max(1) as f64), h.max(b[1] as f64)));
    if !lo.is_finite() {
        return (100.0, 1e6);
    }
    let lo = 10f64.powf(lo.log10().floor());
    (lo, 10f64.powf(hi.log10().ceil()).max(lo * 10.0))
}

/// The SVG of the CDFs of `class` in `step` of A and B.
pub fn svg(class: ReportClass, step: &str, a: &LoadedSeries, b: &LoadedSeries) -> Result<String> {
    let c = cdfs(class, step, a, b)?;
    let n = c.panels.len();
    let cols = if n == 4 { 2 } else { n.min(3) };
    let rows = n.div_ceil(cols);
    let notes_h = if c.notes.is_empty() { 0 } else { c.notes.len() as u32 * NOTE_LINE + 10 };
    let height = TITLE_H + LEGEND_H + rows as u32 * PANEL_H + notes_h;
    let (lo, hi) = x_range(&c);
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (top, rest) = root.split_vertically(TITLE_H + LEGEND_H);
        let (body, below) = rest.split_vertically(rows as u32 * PANEL_H);
        let title = format!(
            "faultscope: {} latency in the {} step, CDF from the kernel's buckets (a cell's runs summed)",
            class.name(),
            safe(step)
        );
        head(&top, &title, [a, b], [Swatch::Solid, Swatch::Dashed])?;
        let areas = body.split_evenly((rows, cols));
        for (p, area) in c.panels.iter().zip(&areas) {
            let mut chart = ChartBuilder::on(area)
                .caption(&p.label, ("sans-serif", 15))
                .margin(8)
                .margin_right(24)
                .x_label_area_size(30)
                .y_label_area_size(45)
                .build_cartesian_2d((lo..hi).log_scale(), 0.0..1.0)
                .map_err(err)?;
            chart
                .configure_mesh()
                .x_desc(format!("{} latency", class.name()))
                .y_desc("fraction")
                .x_label_formatter(&|v| ns_tick(*v))
                .y_label_formatter(&|v| format!("{v:.1}"))
                .draw()
                .map_err(err)?;
            let mut text_y = 0.95;
            for (i, s) in p.sides.iter().enumerate() {
                match s {
                    Side::Buckets(b) => {
                        let pts: Vec<(f64, f64)> = cdf(b).into_iter().map(|(x, y)| (x.max(lo), y)).collect();
                        let style = SIDE_COLOR[i].stroke_width(2);
                        if i == 0 {
                            chart.draw_series(LineSeries::new(pts, style)).map_err(err)?;
                        } else {
                            chart.draw_series(DashedLineSeries::new(pts, 7, 4, style)).map_err(err)?;
                        }
                    }
                    Side::Missing(why) => {
                        let x = lo * (hi / lo).powf(0.03);
                        for line in wrap(&format!("{}: {why}", ["A", "B"][i]), 52) {
                            let font = ("sans-serif", 12).into_font().color(&SIDE_COLOR[i]);
                            chart
                                .draw_series(std::iter::once(Text::new(line, (x, text_y), font)))
                                .map_err(err)?;
                            text_y -= 0.07;
                        }
                    }
                }
            }
        }
        notes(&below, &c.notes)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

/// Draws the CDFs of `class` in `step` of A and B into `out`, an SVG or a
/// PNG by its name.
pub fn write(class: ReportClass, step: &str, a: &LoadedSeries, b: &LoadedSeries, out: &Path) -> Result<()> {
    super::save(out, &svg(class, step, a, b)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{
        bench_series::{
            testing::{run, series},
            LoadedSeries,
        },
        schema::{testing::phase, BenchStep, Measured},
    };

    /// `r` with `class` timed in the step's mark phase (added before the
    /// others when the run has none), its faults in `buckets`.
    fn timed(mut r: Report, step: &str, class: ReportClass, buckets: &[[u64; 3]]) -> Report {
        let mark = format!("mark:{step}");
        let p = &mut r.processes[0];
        if !p.phases.iter().any(|ph| ph.name == mark) {
            p.phases.insert(0, phase(&mark, PhaseKind::Mark, Default::default()));
            let b = r.bench.as_mut().unwrap();
            b.steps.insert(0, BenchStep { name: step.into(), minflt: 0, majflt: 0, wall_ns: 1, cpu_ns: 1 });
        }
        let ph = p.phases.iter_mut().find(|ph| ph.name == mark).unwrap();
        let count = buckets.iter().map(|b| b[2]).sum();
        let latency = Some(Latency {
            p50_ns: 1,
            p99_ns: 1,
            max_ns: 1,
            mean_ns: 1,
            sum_ns: count,
            buckets: buckets.to_vec(),
            raw: None,
        });
        ph.classes.insert(
            class,
            ClassValue::Measured(Measured { count, latency, source: "t".into(), ..Measured::default() }),
        );
        r
    }

    const A1: [[u64; 3]; 3] = [[100, 112, 1], [384, 448, 2], [4096, 5120, 1]];
    const A2: [[u64; 3]; 2] = [[384, 448, 1], [448, 512, 1]];

    fn two() -> (LoadedSeries, LoadedSeries) {
        let copy = ReportClass::Copy;
        let a = series(
            "7.3",
            vec![
                vec![
                    timed(run("seq", "64K", 1, 1), "write", copy, &A1),
                    timed(run("seq", "64K", 1, 1), "write", copy, &A2),
                ],
                vec![timed(run("seq", "4K", 1, 1), "populate", ReportClass::NotPresent, &[[900, 1024, 3]])],
            ],
        );
        let b = series(
            "7.3-folio-reuse",
            vec![
                vec![timed(run("seq", "64K", 1, 1), "write", copy, &[[1536, 1792, 4]])],
                // Copy not in B's 4K runs: that panel says so.
                vec![run("seq", "4K", 1, 1)],
            ],
        );
        (
            LoadedSeries { path: "stock.json".into(), series: a },
            LoadedSeries { path: "patched.json".into(), series: b },
        )
    }

    #[test]
    fn cdf_of_buckets_is_monotone_and_ends_at_one() {
        let mut sum = A1.to_vec();
        Latency::add_buckets(&mut sum, &A2);
        assert_eq!(sum, [[100, 112, 1], [384, 448, 3], [448, 512, 1], [4096, 5120, 1]]);
        let c = cdf(&sum);
        assert_eq!(c.first(), Some(&(100.0, 0.0)));
        assert_eq!(c.last(), Some(&(5120.0, 1.0)));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1), "{c:?}");
        // Flat over the gap between buckets: 1/6 from 112 to 384 ns.
        assert_eq!(c[1], (112.0, 1.0 / 6.0));
        assert_eq!(c[2], (384.0, 1.0 / 6.0));
        // 6 faults: the 3rd is the median, in [384, 448); the CDF crosses
        // 0.5 there.
        assert_eq!(quantile_bucket(&sum, 0.5), Some([384, 448, 3]));
        assert!(c[2].1 < 0.5 && c[3] == (448.0, 4.0 / 6.0));
        assert_eq!(quantile_bucket(&sum, 0.99), Some([4096, 5120, 1]));
        assert_eq!(quantile_bucket(&[], 0.5), None);
        assert_eq!(
            [ns_tick(500.0), ns_tick(2000.0), ns_tick(1.5e6), ns_tick(1e9)],
            ["500ns", "2µs", "1.5ms", "1s"]
        );
    }

    #[test]
    fn panels_sum_a_cells_runs_or_say_why_not() {
        let (a, b) = two();
        let c = cdfs(ReportClass::Copy, "write", &a, &b).unwrap();
        assert_eq!(c.panels.len(), 2);
        assert_eq!(c.panels[0].label, "seq 64K");
        let Side::Buckets(sum) = &c.panels[0].sides[0] else { panic!("{:?}", c.panels[0]) };
        assert_eq!(sum.iter().map(|b| b[2]).sum::<u64>(), 6);
        assert_eq!(c.panels[0].sides[1], Side::Buckets(vec![[1536, 1792, 4]]));
        assert_eq!(c.panels[1].sides[0], Side::Missing("copy is not in the report".into()));
        // Reuse: not measurable in the helper's runs; not_present of the
        // populate step where a run has it.
        let c = cdfs(ReportClass::Reuse, "write", &a, &b).unwrap();
        assert_eq!(c.panels[0].sides[0], Side::Missing("reuse not measurable: no kprobes".into()));
        let c = cdfs(ReportClass::NotPresent, "populate", &a, &b).unwrap();
        assert_eq!(c.panels[1].sides[0], Side::Buckets(vec![[900, 1024, 3]]));
        assert_eq!(c.panels[1].sides[1], Side::Missing("no mark:populate phase".into()));
        // Measured, no faults: said so, not an empty line.
        let c = cdfs(ReportClass::Faults, "write", &a, &b).unwrap();
        assert!(matches!(&c.panels[0].sides[0], Side::Missing(w) if w.contains("not timed")), "{c:?}");
        let e = cdfs(ReportClass::Copy, "fork", &a, &b).err().unwrap();
        assert!(
            e.0.contains("--step fork: A and B have no bench step of that name (theirs: write, populate"),
            "{e}"
        );
    }

    #[test]
    fn latency_cdf_renders_to_svg_and_png() {
        let (a, b) = two();
        let d = tempfile::tempdir().unwrap();
        let (svg_path, png_path) = (d.path().join("lat.svg"), d.path().join("lat.png"));
        write(ReportClass::Copy, "write", &a, &b, &svg_path).unwrap();
        write(ReportClass::Copy, "write", &a, &b, &png_path).unwrap();
        let text = std::fs::read_to_string(&svg_path).unwrap();
        for label in [
            "seq 64K",
            "seq 4K",
            "A: stock.json (kernel 7.3)",
            "B: patched.json (kernel 7.3-folio-reuse)",
            "copy latency in the write step",
            "B: copy is not in the report",
            "µs",
        ] {
            assert!(text.contains(label), "{label} in the SVG");
        }
        let png = std::fs::read(&png_path).unwrap();
        let d = super::super::compare::tests::drawn(&text);
        assert_eq!(png, d.png);
        assert_eq!(d.size, (WIDTH, TITLE_H + LEGEND_H + PANEL_H));
        assert!(d.colors > 8, "{} colours", d.colors);
        assert!(d.non_white > 15_000, "{} non-white pixels", d.non_white);
        super::super::compare::tests::keep("latency.png", &png);
    }
}
