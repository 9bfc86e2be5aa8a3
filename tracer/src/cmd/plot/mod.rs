//! `faultscope plot REPORT.json -o FILE.svg|FILE.png`: the time series of a
//! report (`record --interval`) as a picture. The top panel stacks the
//! classes that partition the faults (reuse, copy, wp_shared, spurious,
//! huge_pmd_wp, not_present, and the rest as `other`; in tracepoint mode
//! wp_faults in place of the write-protect outcomes), each interval drawn
//! as a step over its own span, with all faults as one outline; phases are
//! shaded and named (by number with a key below where a name does not fit
//! its band), marks drawn as labelled lines. A second panel has each timed
//! class's p99 latency per interval on a log axis, left out in intervals
//! where the class did not occur. Drawn with plotters' SVG backend; PNG by
//! resvg.
//!
//! `plot --compare A B` and `plot --latency CLASS A B` draw two bench
//! series against each other instead (`compare`, `latency`).

pub mod compare;
pub mod latency;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, Context as _, Result};
use plotters::{coord::Shift, prelude::*};

use crate::{
    error::Refusal,
    kernel::classes::{ReportClass, FAULT_KINDS},
    report::{
        bench_series::{self, LoadedSeries},
        file,
        schema::{PhaseKind, Report},
    },
    term::safe,
};

/// A phase on the time axis (seconds from the start of the run).
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: String,
    pub kind: PhaseKind,
    pub start_s: f64,
    pub end_s: f64,
}

/// One interval's value over its own span: (start s, end s, value).
pub type Step = (f64, f64, f64);

/// What the plot shows, taken from a report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Per class, faults/s over each interval (all traced processes).
    pub rates: BTreeMap<ReportClass, Vec<Step>>,
    /// Per timed class, p99 in µs over each interval where it occurred:
    /// the worst process's.
    pub p99_us: BTreeMap<ReportClass, Vec<Step>>,
    pub phases: Vec<Span>,
    pub end_s: f64,
}

/// The classes that partition the faults, bottom of the stack first: the
/// fault kinds that are classes of their own, in `FAULT_KINDS`' order (a
/// fault is of the first kind it matches), then the pages not present.
/// Interval counts are per class, so a THP copied (`copy` and
/// `huge_pmd_wp`) is in two layers: `other` then takes what is left, not
/// less than 0.
fn partition() -> Vec<ReportClass> {
    let mut out: Vec<ReportClass> = Vec::new();
    for m in FAULT_KINDS.iter().filter_map(|(kind, _)| ReportClass::from_name(kind)) {
        if m != ReportClass::Faults && !out.contains(&m) {
            out.push(m);
        }
    }
    out.push(ReportClass::NotPresent);
    out
}

/// The series of a report: refuses a report without intervals.
pub fn series(r: &Report) -> Result<Series, Refusal> {
    let Some(iv) = r.intervals.as_ref().filter(|v| !v.is_empty()) else {
        return Err(Refusal::new("the report has no intervals: record it with --interval SECS"));
    };
    let mut out = Series::default();
    let mut prev = 0.0f64;
    let mut bounds = Vec::with_capacity(iv.len());
    for i in iv {
        bounds.push((prev, i.t_s));
        let dt = i.t_s - prev;
        let mut sums: BTreeMap<ReportClass, u64> = BTreeMap::new();
        let mut p99: BTreeMap<ReportClass, u64> = BTreeMap::new();
        for p in &i.processes {
            for (m, c) in &p.counts {
                *sums.entry(*m).or_default() += c;
            }
            for (m, v) in &p.p99_ns {
                if p.counts.get(m).is_some_and(|c| *c > 0) {
                    let e = p99.entry(*m).or_default();
                    *e = (*e).max(*v);
                }
            }
        }
        // Under -a, the processes past the top are summed.
        for (m, c) in i.others.iter().flat_map(|o| &o.counts) {
            *sums.entry(*m).or_default() += c;
        }
        for (m, c) in sums {
            let rate = if dt > 0.0 { c as f64 / dt } else { 0.0 };
            out.rates.entry(m).or_default().push((prev, i.t_s, rate));
        }
        for (m, v) in p99.into_iter().filter(|(_, v)| *v > 0) {
            out.p99_us.entry(m).or_default().push((prev, i.t_s, v as f64 / 1e3));
        }
        prev = i.t_s;
    }
    // Classes that never counted anything are left out of the picture; the
    // others have a rate in every interval, 0 where they counted nothing,
    // so that no line is drawn across an interval without faults.
    out.rates.retain(|_, v| v.iter().any(|(_, _, r)| *r > 0.0));
    for v in out.rates.values_mut() {
        let mut have = v.drain(..).peekable();
        let full: Vec<Step> = bounds
            .iter()
            .map(|&(a, b)| match have.peek() {
                Some(&(x, y, r)) if (x, y) == (a, b) => {
                    have.next();
                    (a, b, r)
                }
                _ => (a, b, 0.0),
            })
            .collect();
        drop(have);
        *v = full;
    }
    out.end_s = prev.max(r.duration_ns as f64 / 1e9);
    // The phases of the run, once each (every process carries the ones it
    // lived through), on the run's time axis: the first phase starts at
    // attach, as the intervals do.
    let mut by_id: BTreeMap<u32, &crate::report::schema::Phase> = BTreeMap::new();
    for p in &r.processes {
        for ph in &p.phases {
            by_id.entry(ph.id).or_insert(ph);
        }
    }
    let t0 = by_id.values().map(|p| p.start_ns).min().unwrap_or(0);
    let mut phases: Vec<Span> = by_id
        .values()
        .map(|p| Span {
            name: p.name.clone(),
            kind: p.kind,
            start_s: (p.start_ns - t0) as f64 / 1e9,
            end_s: p.end_ns.map(|e| e.saturating_sub(t0) as f64 / 1e9).unwrap_or(out.end_s),
        })
        .collect();
    phases.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    out.phases = phases;
    Ok(out)
}

/// The stack's layers: the partition classes present, in tracepoint mode
/// (no write-protect outcome) wp_faults in their place, and `other`, what
/// of all faults none of them took. Each layer is a step per interval of
/// `faults`.
pub fn layers(s: &Series) -> Vec<(String, Vec<Step>)> {
    let Some(all) = s.rates.get(&ReportClass::Faults) else { return Vec::new() };
    let outcomes = [ReportClass::Reuse, ReportClass::Copy, ReportClass::WpShared];
    let mut classes: Vec<ReportClass> = partition().into_iter().filter(|m| s.rates.contains_key(m)).collect();
    if !outcomes.iter().any(|m| s.rates.contains_key(m)) && s.rates.contains_key(&ReportClass::WpFaults) {
        classes.insert(0, ReportClass::WpFaults);
        classes.retain(|m| *m != ReportClass::Spurious);
    }
    let at = |m: ReportClass, t1: f64| {
        s.rates.get(&m).and_then(|v| v.iter().find(|x| x.1 == t1)).map_or(0.0, |x| x.2)
    };
    let mut out: Vec<(String, Vec<Step>)> = classes
        .iter()
        .map(|m| (m.name().to_string(), all.iter().map(|&(a, b, _)| (a, b, at(*m, b))).collect()))
        .collect();
    let other: Vec<Step> = all
        .iter()
        .map(|&(a, b, total)| (a, b, (total - classes.iter().map(|m| at(*m, b)).sum::<f64>()).max(0.0)))
        .collect();
    if other.iter().any(|x| x.2 > 0.0) {
        out.push(("other".into(), other));
    }
    out
}

const PHASE_FILL: [RGBColor; 4] =
    [RGBColor(230, 240, 255), RGBColor(255, 236, 220), RGBColor(228, 248, 228), RGBColor(245, 232, 250)];

const WIDTH: u32 = 1100;
const PANEL: u32 = 360;
/// The height of the phase key under the panels, per line.
const KEY_LINE: u32 = 16;

/// 45000 -> `45k`, 1.5e6 -> `1.5M`: the y ticks.
fn compact(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6).replace(".0M", "M"),
        a if a >= 1e3 => format!("{:.1}k", v / 1e3).replace(".0k", "k"),
        a if a >= 1.0 || a == 0.0 => format!("{v:.0}"),
        _ => format!("{v:.2}"),
    }
}

/// The SVG of a series.
pub fn svg(s: &Series, title: &str) -> Result<String> {
    let mut buf = String::new();
    let panels = if s.p99_us.is_empty() { 1 } else { 2 };
    let x_end = s.end_s.max(1e-3);
    // Which phases are named in their band, and which by number (with the
    // key below): an estimate of the name's width on the time axis.
    let s_per_px = x_end / (WIDTH - 100) as f64;
    let labels = phase_labels(&s.phases, s_per_px);
    let key_lines = labels.key.len().div_ceil(3) as u32;
    {
        let height = PANEL * panels + key_lines * KEY_LINE + if key_lines > 0 { 10 } else { 0 };
        let root = SVGBackend::with_string(&mut buf, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (charts, key_area) = root.split_vertically(PANEL * panels);
        let areas = charts.split_evenly((panels as usize, 1));
        let stack = layers(s);
        let y_max = s.rates.values().flatten().map(|x| x.2).fold(0.0f64, f64::max).max(1.0) * 1.1;
        let mut top = ChartBuilder::on(&areas[0])
            .caption(title, ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_end, 0.0..y_max)
            .map_err(err)?;
        top.configure_mesh()
            .x_desc("time (s)")
            .y_desc("faults/s")
            .y_label_formatter(&|v| compact(*v))
            .disable_x_mesh()
            .draw()
            .map_err(err)?;
        shade(&mut top, s, &labels, 0.0, y_max)?;
        stacked(&mut top, &stack)?;
        if let Some(all) = s.rates.get(&ReportClass::Faults) {
            top.draw_series(std::iter::once(PathElement::new(steps(all), BLACK.stroke_width(2))))
                .map_err(err)?
                .label("faults (all)")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK.stroke_width(2)));
        }
        legend(&mut top)?;
        if panels == 2 {
            let values = s.p99_us.values().flatten().map(|x| x.2);
            // Whole decades, so that the log axis has its ticks.
            let l_min = 10f64.powf(values.clone().fold(f64::INFINITY, f64::min).max(0.01).log10().floor());
            let l_max = 10f64.powf(values.fold(0.0f64, f64::max).max(l_min * 1.01).log10().ceil());
            let mut low = ChartBuilder::on(&areas[1])
                .caption(
                    "p99 latency per interval (log scale; none where the class did not occur)",
                    ("sans-serif", 16),
                )
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..x_end, (l_min..l_max).log_scale())
                .map_err(err)?;
            low.configure_mesh()
                .x_desc("time (s)")
                .y_desc("p99 (µs)")
                .y_label_formatter(&|v| compact(*v))
                .disable_x_mesh()
                .draw()
                .map_err(err)?;
            shade(&mut low, s, &labels, l_min, l_max)?;
            for (m, pts) in &s.p99_us {
                let color = Palette99::pick(*m as usize).to_rgba();
                for run in contiguous(pts) {
                    low.draw_series(std::iter::once(PathElement::new(steps(&run), color.stroke_width(2))))
                        .map_err(err)?;
                }
                low.draw_series(std::iter::empty::<PathElement<(f64, f64)>>())
                    .map_err(err)?
                    .label(m.name())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
            }
            legend(&mut low)?;
        }
        for (i, chunk) in labels.key.chunks(3).enumerate() {
            key_area
                .draw(&Text::new(
                    chunk.join("  ·  "),
                    (80, 4 + i as i32 * KEY_LINE as i32),
                    ("sans-serif", 12).into_font().color(&BLACK),
                ))
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(buf)
}

type Chart<'a, DB, Y> = ChartContext<'a, DB, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

/// The phase labels: each drawn text at its time, at the marks' height or
/// the phases', and the key of the phases named by number. A name that
/// does not fit its band (or the gap to the next label) is its number;
/// numbers that would overprint are joined (`1-4`).
pub struct Labels {
    pub drawn: Vec<(f64, bool, String)>,
    pub key: Vec<String>,
}

fn phase_labels(phases: &[Span], s_per_px: f64) -> Labels {
    const CHAR_PX: f64 = 6.5;
    let width = |t: &str| (t.chars().count() as f64 * CHAR_PX + 8.0) * s_per_px;
    let mut out = Labels { drawn: Vec::new(), key: Vec::new() };
    // Per row (marks, phases): where the last label's text ends, and the
    // numbers it holds.
    let mut ends: [f64; 2] = [f64::NEG_INFINITY; 2];
    let mut groups: [Option<(usize, usize)>; 2] = [None, None];
    for (i, p) in phases.iter().enumerate() {
        let mark = p.kind == PhaseKind::Mark;
        let row = mark as usize;
        let next = phases
            .iter()
            .skip(i + 1)
            .find(|n| (n.kind == PhaseKind::Mark) == mark)
            .map_or(f64::INFINITY, |n| n.start_s);
        let room = next.min(if mark { f64::INFINITY } else { p.end_s.max(p.start_s) }) - p.start_s;
        // Past the previous label, if the band has room for that.
        let x = p.start_s.max(ends[row]);
        if x + width(&p.name) <= p.start_s + room {
            out.drawn.push((x, mark, p.name.clone()));
            ends[row] = x + width(&p.name);
            groups[row] = None;
            continue;
        }
        out.key.push(format!("{}: {}", i + 1, p.name));
        match (&mut groups[row], out.drawn.last_mut()) {
            // Overprinting the previous number: joined to it.
            (Some((first, last)), Some(d)) if p.start_s < ends[row] => {
                *last = i + 1;
                d.2 = format!("{first}-{last}");
                ends[row] = d.0 + width(&d.2);
            }
            _ => {
                let t = format!("{}", i + 1);
                ends[row] = p.start_s + width(&t);
                out.drawn.push((p.start_s, mark, t));
                groups[row] = Some((i + 1, i + 1));
            }
        }
    }
    out
}

/// The automatic phases as shaded bands labelled at the top; marks as
/// lines with their label.
fn shade<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    c: &mut Chart<'a, DB, Y>,
    s: &Series,
    labels: &Labels,
    y_min: f64,
    y_max: f64,
) -> Result<()> {
    let mut n = 0;
    for p in &s.phases {
        if p.kind == PhaseKind::Mark {
            c.draw_series(std::iter::once(PathElement::new(
                vec![(p.start_s, y_min), (p.start_s, y_max)],
                ShapeStyle::from(&BLACK).stroke_width(1),
            )))
            .map_err(err)?;
        } else {
            let fill = PHASE_FILL[n % PHASE_FILL.len()];
            c.draw_series(std::iter::once(Rectangle::new(
                [(p.start_s, y_min), (p.end_s.max(p.start_s), y_max)],
                fill.filled(),
            )))
            .map_err(err)?;
            n += 1;
        }
    }
    // The labels after every band, so that no band covers one; a mark's
    // a little lower than the phases'.
    let at = |f: f64| if y_min > 0.0 { y_min * (y_max / y_min).powf(f) } else { y_min + (y_max - y_min) * f };
    for (x, mark, text) in &labels.drawn {
        let y = at(if *mark { 0.88 } else { 0.97 });
        c.draw_series(std::iter::once(Text::new(
            text.clone(),
            (*x, y),
            ("sans-serif", 12).into_font().color(&BLACK),
        )))
        .map_err(err)?;
    }
    Ok(())
}

/// The steps of a series: each interval level over its own span.
fn steps(pts: &[Step]) -> Vec<(f64, f64)> {
    pts.iter().flat_map(|&(a, b, v)| [(a, v), (b, v)]).collect()
}

/// The runs of intervals that follow each other without a gap.
fn contiguous(pts: &[Step]) -> Vec<Vec<Step>> {
    let mut out: Vec<Vec<Step>> = Vec::new();
    for &p in pts {
        match out.last_mut() {
            Some(run) if run.last().is_some_and(|l| l.1 == p.0) => run.push(p),
            _ => out.push(vec![p]),
        }
    }
    out
}

/// The layers stacked: each a filled band between the sum of the ones
/// below and that sum plus itself.
fn stacked<'a, DB: DrawingBackend + 'a>(
    c: &mut Chart<'a, DB, plotters::coord::types::RangedCoordf64>,
    layers: &[(String, Vec<Step>)],
) -> Result<()> {
    let Some(n) = layers.first().map(|l| l.1.len()) else { return Ok(()) };
    let mut base = vec![0.0f64; n];
    for (i, (name, pts)) in layers.iter().enumerate() {
        let color = layer_color(name, i);
        let top: Vec<f64> = pts.iter().zip(&base).map(|(p, b)| b + p.2).collect();
        let mut poly: Vec<(f64, f64)> =
            pts.iter().zip(&top).flat_map(|(p, t)| [(p.0, *t), (p.1, *t)]).collect();
        poly.extend(pts.iter().zip(&base).rev().flat_map(|(p, b)| [(p.1, *b), (p.0, *b)]));
        c.draw_series(std::iter::once(Polygon::new(poly, color.mix(0.75).filled())))
            .map_err(err)?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], color.mix(0.75).filled()));
        base = top;
    }
    Ok(())
}

/// Each layer's colour, the same in every plot.
fn layer_color(name: &str, i: usize) -> RGBAColor {
    let rgb = match name {
        "reuse" => RGBColor(31, 119, 180),
        "copy" => RGBColor(255, 127, 14),
        "wp_shared" => RGBColor(44, 160, 44),
        "spurious" => RGBColor(214, 39, 40),
        "huge_pmd_wp" => RGBColor(148, 103, 189),
        "not_present" => RGBColor(188, 189, 34),
        "wp_faults" => RGBColor(23, 190, 207),
        "other" => RGBColor(170, 170, 170),
        _ => return Palette99::pick(i).to_rgba(),
    };
    rgb.to_rgba()
}

fn legend<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(c: &mut Chart<'a, DB, Y>) -> Result<()> {
    c.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// What `faultscope plot` was asked to draw.
pub enum What {
    /// One report's time series.
    Timeline,
    /// Two bench series' write steps side by side (`--compare`).
    Compare,
    /// A class's latency CDF in a bench step of two series (`--latency`).
    Latency { class: ReportClass, step: String },
}

/// `faultscope plot`: the files are one report (the time series) or the
/// two series A and B.
pub fn run(files: &[PathBuf], out: &Path, what: What) -> Result<i32> {
    let png = is_png(out)?;
    let two = |flag: &str| match files {
        [a, b] => Ok((a, b)),
        _ => Err(Refusal::new(format!(
            "plot {flag} takes two files, A and B (bench series or bench reports); got {}",
            files.len()
        ))),
    };
    let svg = match what {
        What::Timeline => {
            let [report] = files else {
                return Err(Refusal::new(format!(
                    "plot draws one report's time series: give one REPORT (got {}), or --compare A B, or --latency CLASS A B",
                    files.len()
                ))
                .into());
            };
            crate::output::check(out)?;
            let r = file::load(report)?.report;
            let s = series(&r)?;
            let title = format!(
                "faultscope: {} ({} kernel {})",
                safe(&report.display().to_string()),
                safe(&r.arch),
                safe(&r.kernel)
            );
            svg(&s, &title)?
        }
        What::Compare => {
            let (a, b) = two("--compare")?;
            crate::output::check(out)?;
            let (a, b) = (bench_series::load(a)?, bench_series::load(b)?);
            compare::svg(&a, &b)?
        }
        What::Latency { class, step } => {
            let (a, b) = two("--latency CLASS")?;
            crate::output::check(out)?;
            let (a, b) = (bench_series::load(a)?, bench_series::load(b)?);
            latency::svg(class, &step, &a, &b)?
        }
    };
    write_picture(out, &svg, png)?;
    Ok(0)
}

/// Whether `out` is a PNG (else an SVG); refuses any other name.
fn is_png(out: &Path) -> Result<bool, Refusal> {
    match out.extension().and_then(|e| e.to_str()) {
        Some("svg") => Ok(false),
        Some("png") => Ok(true),
        _ => Err(Refusal::new(format!(
            "{}: the plot is an SVG or a PNG file: give -o FILE.svg or -o FILE.png",
            safe(&out.display().to_string())
        ))),
    }
}

/// Writes the picture as its name says: the SVG, or its PNG.
pub fn write_picture(out: &Path, svg: &str, png: bool) -> Result<()> {
    if png {
        let pix = rasterize(svg)?;
        crate::output::write(out, &pix.encode_png().context("encoding the PNG")?)
    } else {
        crate::output::write(out, svg.as_bytes())
    }
}

/// Writes `svg` to `out`, an SVG or a PNG by its name.
pub fn save(out: &Path, svg: &str) -> Result<()> {
    write_picture(out, svg, is_png(out)?)
}

/// A's and B's colour in every comparing picture.
const SIDE_COLOR: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(255, 127, 14)];

/// The heights of the comparing pictures' title, legend and note lines.
const TITLE_H: u32 = 34;
const LEGEND_H: u32 = 46;
const NOTE_LINE: u32 = 16;

/// How a side is marked in the legend.
#[derive(Clone, Copy)]
enum Swatch {
    Box,
    Solid,
    Dashed,
}

/// "A: FILE (kernel K)": the side as the legend names it, foreign text
/// made safe and a long path cut to its end.
fn side_name(side: usize, l: &LoadedSeries) -> String {
    let path = safe(&l.path);
    let n = path.chars().count();
    let path = if n > 60 { format!("…{}", path.chars().skip(n - 59).collect::<String>()) } else { path };
    format!("{}: {} (kernel {})", ["A", "B"][side], path, safe(&l.series.kernel))
}

/// The title and, under it, the legend of A and B: above the panels, so
/// that it never covers the data.
fn head<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    sides: [&LoadedSeries; 2],
    swatch: [Swatch; 2],
) -> Result<()> {
    area.draw(&Text::new(title.to_string(), (12, 8), ("sans-serif", 18).into_font().color(&BLACK)))
        .map_err(err)?;
    // One line per side: a side's file and kernel can be as wide as the
    // picture.
    for (i, l) in sides.iter().enumerate() {
        let (x, y) = (12, TITLE_H as i32 + 4 + i as i32 * 20);
        let c = SIDE_COLOR[i];
        match swatch[i] {
            Swatch::Box => area.draw(&Rectangle::new([(x, y), (x + 18, y + 12)], c.filled())).map_err(err)?,
            Swatch::Solid => area
                .draw(&PathElement::new(vec![(x, y + 6), (x + 24, y + 6)], c.stroke_width(2)))
                .map_err(err)?,
            Swatch::Dashed => {
                for k in 0..3 {
                    let x0 = x + k * 9;
                    area.draw(&PathElement::new(vec![(x0, y + 6), (x0 + 5, y + 6)], c.stroke_width(2)))
                        .map_err(err)?;
                }
            }
        }
        area.draw(&Text::new(side_name(i, l), (x + 30, y), ("sans-serif", 13).into_font().color(&BLACK)))
            .map_err(err)?;
    }
    Ok(())
}

/// The notes under the picture, one a line.
fn notes<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, lines: &[String]) -> Result<()> {
    for (i, l) in lines.iter().enumerate() {
        area.draw(&Text::new(
            l.clone(),
            (12, 4 + i as i32 * NOTE_LINE as i32),
            ("sans-serif", 12).into_font().color(&BLACK),
        ))
        .map_err(err)?;
    }
    Ok(())
}

/// The SVG as pixels (resvg), its text in the system's sans-serif font
/// (DejaVu Sans where installed; without fonts the labels are left out).
pub fn rasterize(svg: &str) -> Result<resvg::tiny_skia::Pixmap> {
    let mut opt = resvg::usvg::Options::default();
    opt.fontdb_mut().load_system_fonts();
    opt.fontdb_mut().set_sans_serif_family("DejaVu Sans");
    if opt.fontdb.is_empty() {
        crate::term::say("faultscope: warning: no system fonts found: the PNG's labels are left out");
    }
    let tree = resvg::usvg::Tree::from_str(svg, &opt).context("parsing the plot's SVG")?;
    let size = tree.size().to_int_size();
    let mut pix = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).context("an empty SVG")?;
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pix.as_mut());
    Ok(pix)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{Interval, IntervalProcess, Phase, Process};

    fn phase(id: u32, name: &str, kind: PhaseKind, start_s: f64, end_s: Option<f64>) -> Phase {
        Phase {
            id,
            name: name.into(),
            kind,
            start_ns: 1_000_000_000 + (start_s * 1e9) as u64,
            end_ns: end_s.map(|e| 1_000_000_000 + (e * 1e9) as u64),
            children_alive: 0,
            classes: Default::default(),
            attribution: Default::default(),
        }
    }

    /// A synthetic run: 10 intervals of 0.5 s, a fork at 1 s, the child
    /// gone at 2 s, a mark at 3.5 s; copies while the child lives, reuse after.
    pub fn synthetic() -> Report {
        let intervals = (1..=10)
            .map(|i| {
                let t = i as f64 * 0.5;
                let (reuse, copy) = if (1.0..2.0).contains(&(t - 0.25)) { (10, 400) } else { (900, 3) };
                Interval {
                    t_s: t,
                    phase: "x".into(),
                    phases: Vec::new(),
                    others: None,
                    processes: vec![IntervalProcess {
                        pid: 7,
                        counts: [
                            (ReportClass::Faults, reuse + copy + 5),
                            (ReportClass::Reuse, reuse),
                            (ReportClass::Copy, copy),
                        ]
                        .into(),
                        p99_ns: [(ReportClass::Faults, 20_000 + i * 1000), (ReportClass::Copy, 40_000)]
                            .into(),
                        sum_ns: Default::default(),
                    }],
                }
            })
            .collect();
        Report {
            schema: crate::report::schema::SCHEMA.into(),
            duration_ns: 5_000_000_000,
            processes: vec![Process {
                pid: 7,
                comm: "redis-server".into(),
                classes: Default::default(),
                attribution: Default::default(),
                phases: vec![
                    phase(0, "before-fork", PhaseKind::BeforeFork, 0.0, Some(1.0)),
                    phase(1, "fork#1 child-alive", PhaseKind::ChildAlive, 1.0, Some(2.0)),
                    phase(2, "fork#1 after-child-exit", PhaseKind::AfterChildExit, 2.0, Some(3.5)),
                    phase(3, "mark:sets", PhaseKind::Mark, 3.5, None),
                ],
                kernel_check: None,
                container: None,
            }],
            intervals: Some(intervals),
            ..Report::default()
        }
    }

    #[test]
    fn series_rates_and_phases() {
        let s = series(&synthetic()).unwrap();
        // 410 copies... in 0.5 s: a rate per second.
        // Over its own span: 1.0 s to 1.5 s.
        assert_eq!(s.rates[&ReportClass::Copy][2], (1.0, 1.5, 800.0));
        assert_eq!(s.phases.len(), 4);
        assert_eq!(s.phases[1].start_s, 1.0);
        assert_eq!(s.phases[3].end_s, 5.0);
        assert_eq!(s.p99_us[&ReportClass::Copy][0], (0.0, 0.5, 40.0));
        // The partition stacked: copy, reuse, and the rest of the faults.
        let l = layers(&s);
        let names: Vec<&str> = l.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["copy", "reuse", "other"]);
        assert_eq!(l[2].1[2], (1.0, 1.5, 10.0));
        assert_eq!(
            partition(),
            [
                ReportClass::Copy,
                ReportClass::Reuse,
                ReportClass::WpShared,
                ReportClass::HugePmdWp,
                ReportClass::Spurious,
                ReportClass::NotPresent
            ]
        );
        assert_eq!(compact(45000.0), "45k");
        assert_eq!(compact(1_500_000.0), "1.5M");
        let none = Report { intervals: None, ..synthetic() };
        assert!(series(&none).is_err());
    }

    /// An interval in which nothing faulted is a rate of 0, drawn as such,
    /// not a line from the interval before to the one after.
    #[test]
    fn intervals_without_faults_are_zero() {
        let mut r = synthetic();
        let iv = r.intervals.as_mut().unwrap();
        iv[3].processes.clear();
        if let Some(p) = iv[5].processes.first_mut() {
            p.counts.remove(&ReportClass::Copy);
        }
        let n = iv.len();
        let s = series(&r).unwrap();
        let faults = &s.rates[&ReportClass::Faults];
        assert_eq!(faults.len(), n, "a rate in every interval");
        assert_eq!(faults[3].2, 0.0);
        assert!(faults.windows(2).all(|w| w[0].1 == w[1].0), "no gap between steps: {faults:?}");
        let copy = &s.rates[&ReportClass::Copy];
        assert_eq!((copy.len(), copy[3].2, copy[5].2), (n, 0.0, 0.0));
        assert_eq!(copy[2], (1.0, 1.5, 800.0), "the others kept");
    }

    #[test]
    fn plot_of_a_synthetic_series_renders() {
        let svg = svg(&series(&synthetic()).unwrap(), "synthetic").unwrap();
        for label in
            ["before-fork", "fork#1 child-alive", "fork#1 after-child-exit", "mark:sets", "reuse", "copy"]
        {
            assert!(svg.contains(label), "{label} in the SVG");
        }
        assert!(svg.contains("p99 latency"));
        // Rendered to PNG (`plot -o FILE.png`): a picture, not a blank page.
        let pix = rasterize(&svg).unwrap();
        assert_eq!((pix.width(), pix.height()), (1100, 720));
        let colors: std::collections::BTreeSet<[u8; 4]> =
            pix.pixels().iter().map(|p| [p.red(), p.green(), p.blue(), p.alpha()]).collect();
        let non_white =
            pix.pixels().iter().filter(|p| (p.red(), p.green(), p.blue()) != (255, 255, 255)).count();
        assert!(colors.len() > 8, "{} colours", colors.len());
        assert!(non_white > 20_000, "{non_white} non-white pixels");
        let png = pix.encode_png().unwrap();
        assert!(png.len() > 10_000, "png of {} bytes", png.len());
        // To look at it: FAULTSCOPE_PLOT_PNG=/tmp/plot.png cargo test ... plot
        if let Some(p) = std::env::var_os("FAULTSCOPE_PLOT_PNG") {
            std::fs::write(p, &png).unwrap();
        }
    }

    #[test]
    fn phase_labels_never_overprint() {
        let span = |name: &str, a: f64, b: f64| Span {
            name: name.into(),
            kind: PhaseKind::ChildAlive,
            start_s: a,
            end_s: b,
        };
        // Three short phases at once, then a wide one: the three are one
        // joined number with their names in the key; the wide one is named.
        let phases = [
            span("before-fork", 0.0, 0.001),
            span("fork#1 child-alive", 0.001, 0.002),
            span("fork#1 after", 0.002, 0.003),
            span("fork#2 child-alive", 0.003, 10.0),
        ];
        let l = phase_labels(&phases, 10.0 / 1000.0);
        let drawn: Vec<&str> = l.drawn.iter().map(|d| d.2.as_str()).collect();
        assert_eq!(drawn, ["1-3", "fork#2 child-alive"]);
        assert_eq!(l.key, ["1: before-fork", "2: fork#1 child-alive", "3: fork#1 after"]);
    }
}
