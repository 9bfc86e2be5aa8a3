//! `faultscope plot REPORT.json -o FILE.svg`: the time series of a report
//! (`record --interval`) as a picture. The top panel has the fault rate of
//! each class over time (faults/s, all traced processes together), with the
//! phases shaded and named and the marks drawn as labelled lines; a second
//! panel has each timed class's p99 latency per interval, where the report
//! has it. Drawn with plotters' SVG backend.

use std::{collections::BTreeMap, path::Path};

use anyhow::{anyhow, Context as _, Result};
use plotters::prelude::*;

use crate::{
    error::Refusal,
    kernel::classes::ReportClass,
    report::{
        file,
        schema::{PhaseKind, Report},
    },
};

/// A phase on the time axis (seconds from the start of the run).
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: String,
    pub kind: PhaseKind,
    pub start_s: f64,
    pub end_s: f64,
}

/// What the plot shows, taken from a report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// Per class, (interval end, faults/s over the interval).
    pub rates: BTreeMap<ReportClass, Vec<(f64, f64)>>,
    /// Per timed class, (interval end, p99 in µs): the worst process's.
    pub p99_us: BTreeMap<ReportClass, Vec<(f64, f64)>>,
    pub phases: Vec<Span>,
    pub end_s: f64,
}

/// The series of a report: refuses a report without intervals.
pub fn series(r: &Report) -> Result<Series, Refusal> {
    let Some(iv) = r.intervals.as_ref().filter(|v| !v.is_empty()) else {
        return Err(Refusal::new("the report has no intervals: record it with --interval SECS"));
    };
    let mut out = Series::default();
    let mut prev = 0.0f64;
    for i in iv {
        let dt = i.t_s - prev;
        let mut sums: BTreeMap<ReportClass, u64> = BTreeMap::new();
        let mut p99: BTreeMap<ReportClass, u64> = BTreeMap::new();
        for p in &i.processes {
            for (m, c) in &p.counts {
                *sums.entry(*m).or_default() += c;
            }
            for (m, v) in &p.p99_ns {
                let e = p99.entry(*m).or_default();
                *e = (*e).max(*v);
            }
        }
        for (m, c) in sums {
            let rate = if dt > 0.0 { c as f64 / dt } else { 0.0 };
            out.rates.entry(m).or_default().push((i.t_s, rate));
        }
        for (m, v) in p99 {
            out.p99_us.entry(m).or_default().push((i.t_s, v as f64 / 1e3));
        }
        prev = i.t_s;
    }
    // Classes that never counted anything are left out of the picture.
    out.rates.retain(|_, v| v.iter().any(|(_, r)| *r > 0.0));
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

const PHASE_FILL: [RGBColor; 4] =
    [RGBColor(230, 240, 255), RGBColor(255, 236, 220), RGBColor(228, 248, 228), RGBColor(245, 232, 250)];

/// The SVG of a series.
pub fn svg(s: &Series, title: &str) -> Result<String> {
    let mut buf = String::new();
    let panels = if s.p99_us.is_empty() { 1 } else { 2 };
    {
        let root = SVGBackend::with_string(&mut buf, (1100, 360 * panels)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let areas = root.split_evenly((panels as usize, 1));
        let x_end = s.end_s.max(1e-3);
        let y_max = s.rates.values().flatten().map(|(_, r)| *r).fold(0.0f64, f64::max).max(1.0) * 1.1;
        let mut top = ChartBuilder::on(&areas[0])
            .caption(title, ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_end, 0.0..y_max)
            .map_err(err)?;
        top.configure_mesh().x_desc("time (s)").y_desc("faults/s").disable_x_mesh().draw().map_err(err)?;
        shade(&mut top, s, y_max)?;
        lines(&mut top, &s.rates)?;
        if panels == 2 {
            let l_max = s.p99_us.values().flatten().map(|(_, v)| *v).fold(0.0f64, f64::max).max(1.0) * 1.1;
            let mut low = ChartBuilder::on(&areas[1])
                .caption("p99 latency per interval", ("sans-serif", 16))
                .margin(10)
                .x_label_area_size(35)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..x_end, 0.0..l_max)
                .map_err(err)?;
            low.configure_mesh()
                .x_desc("time (s)")
                .y_desc("p99 (µs)")
                .disable_x_mesh()
                .draw()
                .map_err(err)?;
            shade(&mut low, s, l_max)?;
            lines(&mut low, &s.p99_us)?;
        }
        root.present().map_err(err)?;
    }
    Ok(buf)
}

type Chart<'a, DB> = ChartContext<
    'a,
    DB,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The automatic phases as shaded bands named at the top; marks as dashed
/// lines with their label. The names go on after every band, so that no
/// band covers the end of the name before it.
fn shade<'a, DB: DrawingBackend + 'a>(c: &mut Chart<'a, DB>, s: &Series, y_max: f64) -> Result<()> {
    let mut labels = Vec::new();
    let mut n = 0;
    for p in &s.phases {
        if p.kind == PhaseKind::Mark {
            c.draw_series(std::iter::once(PathElement::new(
                vec![(p.start_s, 0.0), (p.start_s, y_max)],
                ShapeStyle::from(&BLACK).stroke_width(1),
            )))
            .map_err(err)?;
            labels.push((p, y_max * 0.86));
        } else {
            let fill = PHASE_FILL[n % PHASE_FILL.len()];
            c.draw_series(std::iter::once(Rectangle::new(
                [(p.start_s, 0.0), (p.end_s.max(p.start_s), y_max)],
                fill.filled(),
            )))
            .map_err(err)?;
            // Two alternating rows: a short phase's name does not run into
            // the next one's.
            labels.push((p, y_max * if n % 2 == 0 { 0.97 } else { 0.92 }));
            n += 1;
        }
    }
    for (p, y) in labels {
        c.draw_series(std::iter::once(Text::new(
            p.name.clone(),
            (p.start_s, y),
            ("sans-serif", 12).into_font().color(&BLACK),
        )))
        .map_err(err)?;
    }
    Ok(())
}

fn lines<'a, DB: DrawingBackend + 'a>(
    c: &mut Chart<'a, DB>,
    series: &BTreeMap<ReportClass, Vec<(f64, f64)>>,
) -> Result<()> {
    for (m, pts) in series {
        // A class has the same colour in both panels.
        let color = Palette99::pick(*m as usize).to_rgba();
        c.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(m.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
    }
    if !series.is_empty() {
        c.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

pub fn run(report: &Path, out: &Path) -> Result<i32> {
    let png = match out.extension().and_then(|e| e.to_str()) {
        Some("svg") => false,
        Some("png") => true,
        _ => {
            return Err(Refusal::new(format!(
                "{}: the plot is an SVG or a PNG file: give -o FILE.svg or -o FILE.png",
                crate::term::safe(&out.display().to_string())
            ))
            .into())
        }
    };
    crate::output::check(out)?;
    let r = file::load(report)?.report;
    let s = series(&r)?;
    let title = format!("faultscope: {} ({} kernel {})", report.display(), r.arch, r.kernel);
    let svg = svg(&s, &title)?;
    if png {
        let pix = rasterize(&svg)?;
        crate::output::write(out, &pix.encode_png().context("encoding the PNG")?)?;
    } else {
        crate::output::write(out, svg.as_bytes())?;
    }
    Ok(0)
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
            }],
            intervals: Some(intervals),
            ..Report::default()
        }
    }

    #[test]
    fn series_rates_and_phases() {
        let s = series(&synthetic()).unwrap();
        // 410 copies... in 0.5 s: a rate per second.
        assert_eq!(s.rates[&ReportClass::Copy][2], (1.5, 800.0));
        assert_eq!(s.phases.len(), 4);
        assert_eq!(s.phases[1].start_s, 1.0);
        assert_eq!(s.phases[3].end_s, 5.0);
        assert_eq!(s.p99_us[&ReportClass::Copy][0], (0.5, 40.0));
        let none = Report { intervals: None, ..synthetic() };
        assert!(series(&none).is_err());
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
}
