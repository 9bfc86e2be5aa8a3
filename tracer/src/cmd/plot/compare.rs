//! `plot --compare A B`: two bench series (or bench reports) as grouped
//! bars, A beside B per (mode, folio, mapping) cell the two have in
//! common, of the write step's wall time and its write faults: the median
//! of the runs, the whisker their min-max, so that a change beyond the
//! runs' spread shows as bars whose whiskers do not overlap. The write
//! faults' axis is logarithmic where the cells' values differ by more than
//! 10x (a 2M PMD cell takes hundreds of times fewer faults than a 4K one,
//! and would be a flat line on a linear axis). Cells on one side only are
//! named in a note, not drawn.

use std::path::Path;

use anyhow::Result;
use plotters::{
    coord::{types::RangedCoordf64, Shift},
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

use super::{compact, err, head, notes, Swatch, LEGEND_H, NOTE_LINE, SIDE_COLOR, TITLE_H};
use crate::{
    error::Refusal,
    kernel::classes::ReportClass,
    report::bench_series::{Cell, LoadedSeries, Series, Stats},
    term::safe,
};

/// The bench step compared.
const STEP: &str = "write";

/// A cell's name on the x axis: `seq 64K`, `seq 2M pmd`.
pub fn cell_label(c: &Cell) -> String {
    let pmd = if c.mapping == "pmd" { " pmd" } else { "" };
    let alive = if c.key().3 == "alive" { ", child alive" } else { "" };
    format!("{} {}{pmd}{alive}", safe(&c.mode), safe(&c.folio))
}

/// The cells of A and B paired by `Cell::key` (mode, folio, mapping,
/// child), in A's order,
/// and the labels of those on one side only.
pub struct Pairs<'a> {
    pub common: Vec<(String, &'a Cell, &'a Cell)>,
    pub only: [Vec<String>; 2],
}

pub fn pairs<'a>(a: &'a Series, b: &'a Series) -> Pairs<'a> {
    let find = |s: &'a Series, c: &Cell| s.cells.iter().find(|x| x.key() == c.key());
    let common = a.cells.iter().filter_map(|c| find(b, c).map(|d| (cell_label(c), c, d))).collect();
    let only = [
        a.cells.iter().filter(|c| find(b, c).is_none()).map(cell_label).collect(),
        b.cells.iter().filter(|c| find(a, c).is_none()).map(cell_label).collect(),
    ];
    Pairs { common, only }
}

/// The pairs, or a refusal when A and B have no cell in common.
pub fn common_pairs<'a>(a: &'a LoadedSeries, b: &'a LoadedSeries) -> Result<Pairs<'a>, Refusal> {
    let p = pairs(&a.series, &b.series);
    if p.common.is_empty() {
        return Err(Refusal::new(format!(
            "{} and {} have no (mode, folio, mapping) cell in common (A: {}; B: {})",
            safe(&a.path),
            safe(&b.path),
            p.only[0].join(", "),
            p.only[1].join(", ")
        )));
    }
    Ok(p)
}

/// The note lines of the cells on one side only.
pub fn only_notes(p: &Pairs<'_>) -> Vec<String> {
    ["A", "B"]
        .iter()
        .zip(&p.only)
        .filter(|(_, v)| !v.is_empty())
        .map(|(s, v)| format!("only in {s}, not drawn: {}", v.join(", ")))
        .collect()
}

/// One bar: the median of the runs, and their min and max.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bar {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Bar {
    fn of(s: &Stats) -> Bar {
        Bar { median: s.median, min: s.min as f64, max: s.max as f64 }
    }

    fn scaled(self, by: f64) -> Bar {
        Bar { median: self.median / by, min: self.min / by, max: self.max / by }
    }
}

/// One cell's group of bars: A's and B's, absent where a side has no
/// such number (no write step; write faults not measured).
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    pub label: String,
    pub wall_ns: [Option<Bar>; 2],
    pub write_faults: [Option<Bar>; 2],
}

/// What the picture shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub groups: Vec<Group>,
    pub notes: Vec<String>,
}

pub fn comparison(a: &LoadedSeries, b: &LoadedSeries) -> Result<Comparison, Refusal> {
    let p = common_pairs(a, b)?;
    let mut notes = only_notes(&p);
    let mut no_step = Vec::new();
    let mut no_faults = Vec::new();
    let groups = p
        .common
        .iter()
        .map(|(label, ca, cb)| {
            let steps = [ca.step(STEP), cb.step(STEP)];
            let mut g = Group { label: label.clone(), wall_ns: [None; 2], write_faults: [None; 2] };
            for (i, st) in steps.iter().enumerate() {
                let side = ["A", "B"][i];
                let Some(st) = st else {
                    no_step.push(format!("{side}'s {label}"));
                    continue;
                };
                g.wall_ns[i] = Some(Bar::of(&st.wall_ns));
                g.write_faults[i] = st.class(ReportClass::WriteFaults).map(Bar::of);
                if g.write_faults[i].is_none() {
                    no_faults.push(format!("{side}'s {label}"));
                }
            }
            g
        })
        .collect();
    if !no_step.is_empty() {
        notes.push(format!("no {STEP} step: {}", no_step.join(", ")));
    }
    if !no_faults.is_empty() {
        notes.push(format!(
            "write faults not measured in every run (untraced, or not measurable): {}",
            no_faults.join(", ")
        ));
    }
    Ok(Comparison { groups, notes })
}

/// The x span of a bar: group `g` is centred on `g`, A left of it, B right.
pub fn bar_span(g: usize, side: usize) -> (f64, f64) {
    let c = g as f64;
    if side == 0 {
        (c - 0.4, c - 0.02)
    } else {
        (c + 0.02, c + 0.4)
    }
}

/// The unit of wall times whose largest is `max_ns`: (name, ns per unit),
/// so that the ticks stay short.
pub fn time_unit(max_ns: f64) -> (&'static str, f64) {
    match max_ns {
        m if m < 1e4 => ("ns", 1.0),
        m if m < 1e7 => ("µs", 1e3),
        m if m < 1e10 => ("ms", 1e6),
        _ => ("s", 1e9),
    }
}

/// Whether the bars' values differ by more than 10x: a log axis, then.
pub fn wants_log(bars: &[Bar]) -> bool {
    let pos = bars.iter().flat_map(|b| [b.min, b.max]).filter(|v| *v > 0.0);
    let (lo, hi) = pos.fold((f64::INFINITY, 0.0f64), |(l, h), v| (l.min(v), h.max(v)));
    lo.is_finite() && hi / lo > 10.0
}

/// A bar's value over it: three significant digits, k and M past 1,000.
fn value_label(v: f64) -> String {
    match v.abs() {
        a if a >= 1e3 => compact(v),
        _ if v == v.round() => format!("{v:.0}"),
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

const WIDTH_PER_CELL: u32 = 130;
const PANEL_H: u32 = 330;

/// The SVG of the comparison of A and B.
pub fn svg(a: &LoadedSeries, b: &LoadedSeries) -> Result<String> {
    let c = comparison(a, b)?;
    let n = c.groups.len();
    let width = (150 + WIDTH_PER_CELL * n as u32).clamp(800, 2400);
    let notes_h = if c.notes.is_empty() { 0 } else { c.notes.len() as u32 * NOTE_LINE + 10 };
    let height = TITLE_H + LEGEND_H + 2 * PANEL_H + notes_h;
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (top, rest) = root.split_vertically(TITLE_H + LEGEND_H);
        let (body, below) = rest.split_vertically(2 * PANEL_H);
        head(
            &top,
            &format!("faultscope: the {STEP} step, A beside B (median of the runs, whiskers min-max)"),
            [a, b],
            [Swatch::Box; 2],
        )?;
        let panels = body.split_evenly((2, 1));
        let all = |f: fn(&Group) -> [Option<Bar>; 2]| -> Vec<Bar> {
            c.groups.iter().flat_map(|g| f(g).into_iter().flatten()).collect()
        };
        let walls = all(|g| g.wall_ns);
        let (unit, per) = time_unit(walls.iter().map(|b| b.max).fold(0.0, f64::max));
        let wall: Vec<[Option<Bar>; 2]> =
            c.groups.iter().map(|g| g.wall_ns.map(|b| b.map(|b| b.scaled(per)))).collect();
        let faults: Vec<[Option<Bar>; 2]> = c.groups.iter().map(|g| g.write_faults).collect();
        let labels: Vec<&str> = c.groups.iter().map(|g| g.label.as_str()).collect();
        panel(
            &root,
            &panels[0],
            &format!("{STEP} step wall time"),
            &format!("wall ({unit})"),
            &labels,
            &wall,
            false,
        )?;
        let log = wants_log(&all(|g| g.write_faults));
        let caption = format!("{STEP} step write faults{}", if log { " (log scale)" } else { "" });
        panel(&root, &panels[1], &caption, "write faults", &labels, &faults, log)?;
        notes(&below, &c.notes)?;
        root.present().map_err(err)?;
    }
    Ok(buf)
}

/// Draws the comparison of A and B into `out`, an SVG or a PNG by its
/// name.
pub fn write(a: &LoadedSeries, b: &LoadedSeries, out: &Path) -> Result<()> {
    super::save(out, &svg(a, b)?)
}

/// One panel of grouped bars, on a linear axis from 0 or a log axis of
/// whole decades.
fn panel<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    area: &DrawingArea<DB, Shift>,
    caption: &str,
    y_desc: &str,
    labels: &[&str],
    bars: &[[Option<Bar>; 2]],
    log: bool,
) -> Result<()> {
    let x = -0.5..(labels.len() as f64 - 0.5);
    let top = bars.iter().flatten().flatten().map(|b| b.max).fold(0.0f64, f64::max);
    let mut builder = ChartBuilder::on(area);
    builder.caption(caption, ("sans-serif", 16)).margin(10).x_label_area_size(30).y_label_area_size(70);
    if log {
        let lo =
            bars.iter().flatten().flatten().map(|b| b.min).filter(|v| *v > 0.0).fold(f64::INFINITY, f64::min);
        let lo = 10f64.powf(lo.max(1e-3).log10().floor());
        let hi = 10f64.powf((top * 2.0).max(lo * 10.0).log10().ceil());
        let mut chart = builder.build_cartesian_2d(x, (lo..hi).log_scale()).map_err(err)?;
        chart
            .configure_mesh()
            .y_desc(y_desc)
            .y_label_formatter(&|v| compact(*v))
            .x_labels(0)
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        draw_bars(root, &mut chart, labels, bars, lo)
    } else {
        let mut chart = builder.build_cartesian_2d(x, 0.0..(top * 1.15).max(1.0)).map_err(err)?;
        chart
            .configure_mesh()
            .y_desc(y_desc)
            .y_label_formatter(&|v| compact(*v))
            .x_labels(0)
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        draw_bars(root, &mut chart, labels, bars, 0.0)
    }
}

/// The bars from `floor`, their whiskers and values, and the cells'
/// labels under the axis (drawn on the whole picture at the chart's pixel
/// positions: plotters' own ticks would not fall on the groups).
fn draw_bars<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    root: &DrawingArea<DB, Shift>,
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    labels: &[&str],
    bars: &[[Option<Bar>; 2]],
    floor: f64,
) -> Result<()> {
    let value_font = ("sans-serif", 11).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
    for (g, pair) in bars.iter().enumerate() {
        for (side, bar) in pair.iter().enumerate() {
            let Some(bar) = bar else { continue };
            let (x0, x1) = bar_span(g, side);
            let c = SIDE_COLOR[side];
            let up = |v: f64| v.max(floor);
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, floor), (x1, up(bar.median))],
                    c.mix(0.85).filled(),
                )))
                .map_err(err)?;
            let xm = (x0 + x1) / 2.0;
            let cap = (x1 - x0) / 4.0;
            let whisker = BLACK.stroke_width(1);
            for seg in [
                vec![(xm, up(bar.min)), (xm, up(bar.max))],
                vec![(xm - cap, up(bar.min)), (xm + cap, up(bar.min))],
                vec![(xm - cap, up(bar.max)), (xm + cap, up(bar.max))],
            ] {
                chart.draw_series(std::iter::once(PathElement::new(seg, whisker))).map_err(err)?;
            }
            let (px, py) = chart.backend_coord(&(xm, up(bar.max)));
            root.draw(&Text::new(value_label(bar.median), (px, py - 3), value_font.clone())).map_err(err)?;
        }
        let (px, py) = chart.backend_coord(&(g as f64, floor));
        let font = ("sans-serif", 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
        root.draw(&Text::new(labels[g].to_string(), (px, py + 6), font)).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::report::bench_series::testing::{run, series};

    /// A run of a PMD-mapped cell.
    fn pmd(mut r: crate::report::schema::Report) -> crate::report::schema::Report {
        r.bench.as_mut().unwrap().mapping = "pmd".into();
        r
    }

    /// A: seq 64K, seq 2M pmd, random 4K; B: seq 64K (faster, fewer
    /// faults), seq 2M pmd, seq 4K.
    pub fn two() -> (LoadedSeries, LoadedSeries) {
        let a = series(
            "7.3",
            vec![
                vec![
                    run("seq", "64K", 100_000_000, 4096),
                    run("seq", "64K", 120_000_000, 4100),
                    run("seq", "64K", 110_000_000, 4098),
                ],
                vec![pmd(run("seq", "2M", 20_000_000, 8)), pmd(run("seq", "2M", 30_000_000, 10))],
                vec![run("random", "4K", 300_000_000, 4096)],
            ],
        );
        let b = series(
            "7.3-folio-reuse",
            vec![
                vec![
                    run("seq", "64K", 50_000_000, 256),
                    run("seq", "64K", 60_000_000, 260),
                    run("seq", "64K", 55_000_000, 258),
                ],
                vec![pmd(run("seq", "2M", 21_000_000, 8)), pmd(run("seq", "2M", 25_000_000, 8))],
                vec![run("seq", "4K", 200_000_000, 4096)],
            ],
        );
        (
            LoadedSeries { path: "stock.json".into(), series: a },
            LoadedSeries { path: "patched.json".into(), series: b },
        )
    }

    #[test]
    fn bars_are_the_write_steps_statistics() {
        let (a, b) = two();
        let c = comparison(&a, &b).unwrap();
        let labels: Vec<&str> = c.groups.iter().map(|g| g.label.as_str()).collect();
        assert_eq!(labels, ["seq 64K", "seq 2M pmd"]);
        let g = &c.groups[0];
        assert_eq!(g.wall_ns[0], Some(Bar { median: 110e6, min: 100e6, max: 120e6 }));
        assert_eq!(g.wall_ns[1], Some(Bar { median: 55e6, min: 50e6, max: 60e6 }));
        assert_eq!(g.write_faults[0], Some(Bar { median: 4098.0, min: 4096.0, max: 4100.0 }));
        assert_eq!(g.write_faults[1], Some(Bar { median: 258.0, min: 256.0, max: 260.0 }));
        // Two runs: the median is their mean.
        assert_eq!(c.groups[1].wall_ns[0], Some(Bar { median: 25e6, min: 20e6, max: 30e6 }));
        assert_eq!(c.groups[1].write_faults[1], Some(Bar { median: 8.0, min: 8.0, max: 8.0 }));
        assert_eq!(c.notes, ["only in A, not drawn: random 4K", "only in B, not drawn: seq 4K"]);
        // A left of the group's centre, B right, neither crossing into the
        // next group.
        assert_eq!(bar_span(1, 0), (0.6, 0.98));
        assert_eq!(bar_span(1, 1), (1.02, 1.4));
        assert!(bar_span(0, 1).1 < bar_span(1, 0).0);
        // 4,098 faults against 8: a log axis; wall times within 10x: not.
        let faults: Vec<Bar> = c.groups.iter().flat_map(|g| g.write_faults.into_iter().flatten()).collect();
        assert!(wants_log(&faults));
        let walls: Vec<Bar> = c.groups.iter().flat_map(|g| g.wall_ns.into_iter().flatten()).collect();
        assert!(!wants_log(&walls));
        assert_eq!(time_unit(120e6), ("ms", 1e6));
        assert_eq!(time_unit(9e6), ("µs", 1e3));
        // Nothing in common: refused.
        let lone = LoadedSeries {
            path: "x.json".into(),
            series: series("6.12", vec![vec![run("random", "2M", 1, 1)]]),
        };
        let e = comparison(&a, &lone).err().unwrap();
        assert!(e.0.contains("no (mode, folio, mapping) cell in common"), "{e}");
    }

    /// A picture rasterized: its size, how many colours and non-white
    /// pixels it has, and its PNG.
    pub struct Drawn {
        pub size: (u32, u32),
        pub colors: usize,
        pub non_white: usize,
        pub png: Vec<u8>,
    }

    pub fn drawn(svg: &str) -> Drawn {
        let pix = super::super::rasterize(svg).unwrap();
        let colors: std::collections::BTreeSet<[u8; 4]> =
            pix.pixels().iter().map(|p| [p.red(), p.green(), p.blue(), p.alpha()]).collect();
        let non_white =
            pix.pixels().iter().filter(|p| (p.red(), p.green(), p.blue()) != (255, 255, 255)).count();
        Drawn {
            size: (pix.width(), pix.height()),
            colors: colors.len(),
            non_white,
            png: pix.encode_png().unwrap(),
        }
    }

    /// To look at a test's picture: FAULTSCOPE_PLOT_DIR=/tmp cargo test ... plot
    pub fn keep(name: &str, png: &[u8]) {
        if let Some(d) = std::env::var_os("FAULTSCOPE_PLOT_DIR") {
            std::fs::write(std::path::Path::new(&d).join(name), png).unwrap();
        }
    }

    #[test]
    fn comparison_renders_to_svg_and_png() {
        let (a, b) = two();
        let d = tempfile::tempdir().unwrap();
        let (svg_path, png_path) = (d.path().join("ab.svg"), d.path().join("ab.png"));
        let picture = svg(&a, &b).unwrap();
        super::super::save(&svg_path, &picture).unwrap();
        super::super::save(&png_path, &picture).unwrap();
        let text = std::fs::read_to_string(&svg_path).unwrap();
        for label in [
            "seq 64K",
            "seq 2M pmd",
            "A: stock.json (kernel 7.3)",
            "B: patched.json (kernel 7.3-folio-reuse)",
            "write faults (log scale)",
            "wall (ms)",
            "only in A, not drawn: random 4K",
        ] {
            assert!(text.contains(label), "{label} in the SVG");
        }
        let png = std::fs::read(&png_path).unwrap();
        let d = drawn(&picture);
        assert_eq!(png, d.png);
        // Two cells (the narrowest picture), two note lines.
        assert_eq!(d.size, (800, TITLE_H + LEGEND_H + 2 * PANEL_H + 2 * NOTE_LINE + 10));
        assert!(d.colors > 8, "{} colours", d.colors);
        assert!(d.non_white > 20_000, "{} non-white pixels", d.non_white);
        keep("compare.png", &png);
    }
}
