//! `cargo xtask daemon`: `faultscope serve` under Debian's Prometheus, end
//! to end. In a guest of the generic 6.12 amd64 kernel running the host's
//! userspace over 9p (as `cargo xtask redis`), Prometheus scrapes `serve
//! --comm redis-server` every second while Redis BGSAVEs during SETs, in two
//! windows with a restart of Redis (a new pid) between them
//! (`xtask/guest/daemon.sh`). In each window, counted by four independent
//! means:
//!
//! - the difference of two PromQL instant queries through Prometheus's HTTP
//!   API, taken while Redis is stopped (SIGSTOP) before and after;
//! - `faultscope record -p` of the window (its JSON report);
//! - the tracefs oracle between the guest's "window" and "quiet" trace
//!   markers;
//!
//! the reuse and copy counts (and every other class measured) must be
//! equal: in total between all three, and per phase kind between PromQL
//! and the report, exactly up to the BGSAVE child's exit (Redis is stopped
//! while the child exits) and up to the order of the two tracers'
//! lifecycle programs at the fork (see [`ORDER_SLACK`]). Also: `promtool check metrics` passes on a scrape; the counters
//! keep going across the restart (no series goes down, PromQL `resets()` is
//! 0) and the new pid is counted; the window's record report (with
//! `--interval`) is drawn by `faultscope plot` and rendered to PNG, which
//! must be a picture with the phases named.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::{bail, Context as _, Result};
use faultscope::{
    cmd::plot,
    kernel::classes::ReportClass,
    report::{
        metrics::kind_name,
        schema::{Mode, Process, Report},
    },
};
use serde_json::Value;

use crate::{
    check::{self, Checklist},
    kernels, redis,
    util::root,
    vm,
};

/// serve's port in the guest, and how often it reads the kernel's counts.
const PORT: u16 = 9853;
const TICK_S: &str = "0.5";
/// record's interval, for the plot's time series.
const INTERVAL_S: &str = "0.25";
/// Seconds of SETs while the BGSAVE child is held (daemon.sh's
/// `hold_child`): its COW copies.
const HOLD_S: &str = "1";

/// serve and record start their own phase at the same fork or exit, each
/// from its program on the same tracepoint, serve's first (attached first:
/// a tracepoint runs its BPF programs in attach order). A fault that ends
/// between the two programs is already in serve's next phase and still in
/// record's previous one, so up to each boundary serve counts at most as
/// many faults as record, and fewer by those that ended meanwhile. The
/// CPU runs both programs within microseconds of the guest, unless the
/// host deschedules its vCPU thread between them. Measured on 2026-12-03
/// over 9 runs of this stage (6 on a machine building the project, 3
/// beside two busy loops): 0 in 5, 1 in 2, 3 in 2, always at the BGSAVE
/// child's exit and always serve fewer (docs/testing.md); this bounds it
/// with room for a descheduled vCPU, at the fork, and at the exit where
/// the child could not be held.
const ORDER_SLACK: u64 = 32;

/// The other way round: a fault whose serve fexit program read the old
/// phase and whose record fexit program, run just after it in the same
/// trampoline, read the new one. At most one fault per CPU at a time.
const IN_FLIGHT: u64 = 2;

/// How far serve's count up to a boundary may be from record's: `fewer`
/// for faults that ended between the two tracers' programs, `more` for
/// faults in flight across them.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Slack {
    fewer: u64,
    more: u64,
}

/// A boundary while redis-server runs.
const RUNNING: Slack = Slack { fewer: ORDER_SLACK, more: IN_FLIGHT };
/// redis-server stopped while the child exits (`hold_child`): no fault
/// of it is in flight, so both tracers split at the same fault.
const STOPPED: Slack = Slack { fewer: 0, more: 0 };

/// serve's counters of the report's (nested) classes, by `class`.
const CLASS_FAULTS: &str = "faultscope_class_faults_total";
/// serve's partition of the faults, by `kind`.
const PARTITION: &str = "faultscope_faults_total";

/// The phase kinds of a window with one fork, in order of time.
const WINDOW_KINDS: [&str; 3] = ["before-fork", "child-alive", "after-child-exit"];

/// The classes shown in the table (all measured classes are compared).
const SHOWN: [ReportClass; 4] =
    [ReportClass::Faults, ReportClass::WpFaults, ReportClass::Reuse, ReportClass::Copy];

pub fn run(keys: u64, value_size: u64, requests: u64) -> Result<()> {
    let env = [
        ("KEYS", keys.to_string()),
        ("VALUE_SIZE", value_size.to_string()),
        ("REQUESTS", requests.to_string()),
        ("PORT", PORT.to_string()),
        ("TICK", TICK_S.to_string()),
        ("RECORD_ARGS", format!("--interval {INTERVAL_S}")),
        ("HOLD", HOLD_S.to_string()),
    ];
    let extra = [(root().join("xtask/guest/redis.sh"), "/redis.sh".to_string())];
    let k = kernels::GENERIC_6_12_AMD64;
    let redis::HostRootRun { run, dir, .. } =
        redis::boot_host_root_on(k, "daemon", "daemon.sh", &env, &extra)?;
    println!(
        "{}, {} on {}, {keys} keys of {value_size} bytes, {requests} SETs per window",
        run.marker("PROMETHEUS-VERSION", "main").unwrap_or_else(|| "prometheus ?".into()),
        run.marker("REDIS-VERSION", "main").unwrap_or_else(|| "Redis ?".into()),
        k.name
    );
    let mut fails = Vec::new();
    let mut windows = Vec::new();
    for (name, what) in [("run1", "the first redis-server"), ("run2", "after a restart: a new redis-server")]
    {
        match check_window(&run, name, what, &dir) {
            Ok(w) => {
                print!("{}", w.table);
                fails.extend(w.failures.iter().cloned());
                windows.push(w);
            }
            Err(e) => fails.push(format!("{name}: {e:#}")),
        }
    }
    let mut t = String::new();
    let mut cl = Checklist::new("the whole run", &mut t, &mut fails);
    let _ = check_whole_run(&run, &windows, &mut cl).map_err(|e| cl.expect(false, format!("{e:#}")));
    print!("=== the whole run ===\n{t}");
    println!("guest {} booted, ran both windows and powered off in {:.1}s", k.name, run.wall.as_secs_f64());
    if !fails.is_empty() {
        bail!("daemon test failed:\n  {}", fails.join("\n  "));
    }
    Ok(())
}

/// A query's answer: each series' value, by its labels (`__name__` too).
type Vector = BTreeMap<BTreeMap<String, String>, f64>;

/// An instant query's JSON answer (the HTTP API's) as a vector.
fn parse_vector(section: &str, text: &str) -> Result<Vector> {
    let v: Value =
        serde_json::from_str(text.trim()).with_context(|| format!("{section}: not JSON: {text:?}"))?;
    if v["status"] != "success" {
        bail!("{section}: the query failed: {text}");
    }
    let mut out = Vector::new();
    for r in v["data"]["result"].as_array().with_context(|| format!("{section}: no result in {text}"))? {
        let labels: BTreeMap<String, String> = r["metric"]
            .as_object()
            .context("a series without labels")?
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        let value = r["value"][1].as_str().context("a sample without a value")?;
        let value: f64 = value.parse().with_context(|| format!("{section}: value {value:?}"))?;
        out.insert(labels, value);
    }
    Ok(out)
}

/// Counter values by (metric name, class, phase_kind) (empty strings where
/// a metric has no such label).
type Counters = BTreeMap<(String, String, String), u64>;

/// The counters of one query.
fn counters(v: &Vector) -> Result<Counters> {
    let mut out = BTreeMap::new();
    for (labels, value) in v {
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        if value.fract() != 0.0 || *value < 0.0 || *value > 2f64.powi(53) {
            bail!("counter {labels:?} = {value} is not a whole count");
        }
        // The nested classes' series by `class`, the partition's by `kind`.
        let class = if labels.contains_key("kind") { get("kind") } else { get("class") };
        out.insert((get("__name__"), class, get("phase_kind")), *value as u64);
    }
    Ok(out)
}

/// How much counter (`metric`, `class`, `kind`) grew from `c0` to `c1`;
/// `None` if it went down.
fn delta(c0: &Counters, c1: &Counters, metric: &str, class: &str, kind: &str) -> Option<u64> {
    let key = (metric.to_string(), class.to_string(), kind.to_string());
    c1.get(&key).copied().unwrap_or(0).checked_sub(c0.get(&key).copied().unwrap_or(0))
}

fn query(run: &vm::GuestRun, section: &str) -> Result<Vector> {
    parse_vector(section, run.section(section)?)
}

pub struct Window {
    name: String,
    pid: u32,
    table: String,
    failures: Vec<String>,
    /// The counters queried before and after the window.
    before: Counters,
    after: Counters,
}

/// What the record report counted, per (class, phase kind), the way serve
/// labels it.
fn report_by_kind(p: &Process) -> BTreeMap<(ReportClass, &'static str), u64> {
    let mut out = BTreeMap::new();
    for ph in &p.phases {
        for m in ReportClass::ALL {
            if let Some(n) = check::count(&ph.classes, m) {
                *out.entry((m, kind_name(ph.kind))).or_default() += n;
            }
        }
    }
    out
}

fn check_window(run: &vm::GuestRun, name: &str, what: &str, dir: &Path) -> Result<Window> {
    let mut fails = Vec::new();
    let mut t = String::new();
    let (pid, report) = redis::recorded(run, name)?;
    let p = check::process(&report, pid)?;
    let (c0, c1) = (
        counters(&query(run, &format!("{name}.before.prom"))?)?,
        counters(&query(run, &format!("{name}.after.prom"))?)?,
    );
    let delta = |metric: &str, class: &str, kind: &str| delta(&c0, &c1, metric, class, kind);
    let sec = format!("{name}.oracle");
    let oracle = check::oracle_of(run, &sec)?;
    let cmp = oracle
        .compare(name, &p.classes, pid, "window")
        .with_context(|| format!("redis-server: {}", check::oracle_gap(run, name, &sec, pid, "window")))?
        .allowing_skipped(name, &report);

    let _ = writeln!(t, "=== {name}: {what} (pid {pid}), BGSAVE during SETs ===");
    let _ = writeln!(
        t,
        "  {}; redis-benchmark: {}",
        run.marker("POPULATE", name).unwrap_or_default(),
        run.marker("BENCH", name).unwrap_or_default()
    );
    let by_kind = report_by_kind(p);
    let kinds: Vec<&str> = {
        let mut k: Vec<&str> = by_kind.keys().map(|(_, k)| *k).collect();
        k.extend(c1.keys().filter(|(n, _, _)| n == CLASS_FAULTS).map(|(_, _, k)| k.as_str()));
        k.sort();
        k.dedup();
        k
    };
    let held = run.marker("HELD", name).unwrap_or_else(|| "no marker".into());
    // The fork's boundary, then the child's exit's.
    let slack = [RUNNING, if held == "yes" { STOPPED } else { RUNNING }];
    let mut cl = Checklist::new(name, &mut t, &mut fails);
    cl.line(format!("  the BGSAVE child held, redis-server stopped while it exited: {held}"));
    compare_by_kind(&mut cl, p, &cmp, &kinds, &by_kind, &c1, &delta, slack);
    check_partition(&mut cl, p, &kinds, &c1, &delta);
    fails.extend(cmp.failures.iter().cloned());
    for why in &cmp.unknown {
        let _ = writeln!(t, "  oracle cannot count: {why}");
    }
    let mut cl = Checklist::new(name, &mut t, &mut fails);
    let get = |m: ReportClass| p.count(m).unwrap_or(0);
    let (reuse, copy) = (get(ReportClass::Reuse), get(ReportClass::Copy));
    cl.expect(report.mode == Mode::Kprobe, format!("mode {}", check::mode_name(&report)));
    cl.expect(reuse > 0 && copy > 0, format!("the window has reuse ({reuse}) and copies ({copy})"));
    // A stopped Redis faults not: the oracle's phases around the window
    // (record's attach .. "window", "quiet" .. record's detach) are empty.
    for ph in ["attach", "quiet"] {
        let n = oracle.line(pid, ph).and_then(|l| l.get("faults").copied().flatten());
        cl.expect(n == Some(0), format!("oracle: faults of the stopped redis-server in {ph:?}: {n:?}"));
    }
    let forks = delta("faultscope_forks_total", "", "");
    let info = |when: &str| -> Option<i64> {
        let i = redis::parse_info(run.section(&format!("{name}.info.{when}")).ok()?);
        i.get("total_forks")?.parse().ok()
    };
    let redis_forks = info("end").zip(info("before")).map(|(a, b)| a - b);
    cl.expect(
        forks == Some(1) && redis_forks == Some(1),
        format!("forks: PromQL increase {forks:?}, Redis INFO total_forks +{redis_forks:?}: one, the BGSAVE"),
    );
    let fork_phases: Vec<&str> =
        p.phases.iter().map(|ph| ph.name.as_str()).filter(|n| n.starts_with("fork#")).collect();
    cl.expect(
        fork_phases == ["fork#1 child-alive", "fork#1 after-child-exit"],
        format!("record's fork phases {fork_phases:?}"),
    );
    for (ok, what) in redis::health(run, name, &report) {
        cl.expect(ok, what);
    }
    check_plot(&report, name, dir, &mut cl);
    Ok(Window { name: name.into(), pid, table: t, failures: fails, before: c0, after: c1 })
}

/// Per class and phase kind: PromQL's increase over the window against
/// record's report, exact for the kinds after the window's fork phases and
/// up to each boundary of them within its `slack` (the fork's, the
/// exit's); in total against record and the oracle; and each timed
/// class's histogram.
#[allow(clippy::too_many_arguments)]
fn compare_by_kind(
    cl: &mut Checklist,
    p: &Process,
    cmp: &check::Comparison,
    kinds: &[&str],
    by_kind: &BTreeMap<(ReportClass, &'static str), u64>,
    c1: &Counters,
    delta: &impl Fn(&str, &str, &str) -> Option<u64>,
    slack: [Slack; 2],
) {
    cl.line(format!(
        "  {:<10} {:<18} {:>10} {:>10} {:>10}",
        "class", "phase_kind", "PromQL", "record", "oracle"
    ));
    for m in ReportClass::ALL {
        let Some(total) = check::count(&p.classes, m) else { continue };
        let mut prom_total = Some(0u64);
        for kind in kinds {
            let prom = delta(CLASS_FAULTS, m.name(), kind);
            let rec = by_kind.get(&(m, *kind)).copied().unwrap_or(0);
            prom_total = prom_total.zip(prom).map(|(a, b)| a + b);
            if SHOWN.contains(&m) && (rec > 0 || prom != Some(0)) {
                let cell = prom.map_or("went down".into(), |v| v.to_string());
                cl.line(format!("  {:<10} {kind:<18} {cell:>10} {rec:>10}", m.name()));
            }
            if !WINDOW_KINDS.contains(kind) && prom != Some(rec) {
                cl.expect(false, format!("{m} {kind}: PromQL increase {prom:?} != record {rec}"));
            }
        }
        // Up to each boundary of the fork's phases, in time order.
        let (mut prom_upto, mut rec_upto) = (Some(0u64), 0u64);
        for (kind, s) in WINDOW_KINDS[..WINDOW_KINDS.len() - 1].iter().zip(slack) {
            prom_upto = prom_upto.zip(delta(CLASS_FAULTS, m.name(), kind)).map(|(a, b)| a + b);
            rec_upto += by_kind.get(&(m, *kind)).copied().unwrap_or(0);
            // record minus serve: within -more ..= fewer.
            let ok = prom_upto.is_some_and(|p| p <= rec_upto + s.more && rec_upto <= p + s.fewer);
            match prom_upto {
                Some(p) if p == rec_upto => {}
                Some(p) if ok => {
                    if SHOWN.contains(&m) {
                        let (n, who) = if p < rec_upto {
                            (rec_upto - p, "serve's and record's")
                        } else {
                            (p - rec_upto, "record's and serve's fexit programs, across")
                        };
                        cl.line(format!(
                            "  {:<10} {n} faults ended between {who} phase changes at the end of {kind}",
                            m.name()
                        ));
                    }
                }
                _ => cl.expect(
                    false,
                    format!(
                        "{m} up to the end of {kind}: PromQL increase {prom_upto:?}, record {rec_upto} \
                     (serve, whose programs run first, may count at most {} fewer, or {} more, here)",
                        s.fewer, s.more
                    ),
                ),
            }
        }
        let o = cmp.row(m).and_then(|r| r.oracle);
        if SHOWN.contains(&m) {
            let cell = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
            cl.line(format!(
                "  {:<10} {:<18} {:>10} {total:>10} {:>10}",
                m.name(),
                "(all)",
                cell(prom_total),
                cell(o)
            ));
        }
        if prom_total != Some(total) {
            cl.expect(false, format!("{m}: PromQL increase {prom_total:?} != record {total}"));
        }
        // A timed class's histogram grows by the same faults.
        let hist =
            ("faultscope_fault_duration_seconds_count".to_string(), m.name().to_string(), String::new());
        if c1.contains_key(&hist) {
            let h = delta(&hist.0, &hist.1, "");
            if h != Some(total) {
                cl.expect(false, format!("{m}: histogram _count increase {h:?} != record {total}"));
            }
        } else if [ReportClass::Faults, ReportClass::Reuse, ReportClass::Copy].contains(&m) {
            cl.expect(false, format!("{m}: no latency histogram"));
        }
    }
}

/// The partition: per phase kind, the kinds' increases add up to the
/// faults class's, and over the window to record's faults.
fn check_partition(
    cl: &mut Checklist,
    p: &Process,
    kinds: &[&str],
    c1: &Counters,
    delta: &impl Fn(&str, &str, &str) -> Option<u64>,
) {
    // The partition: per phase kind, the kinds' increases add up to the
    // faults class's, and over the window to record's faults.
    let mut parts_total = 0u64;
    let mut line = Vec::new();
    for kind in kinds {
        let faults = delta(CLASS_FAULTS, ReportClass::Faults.name(), kind);
        let mut sum = Some(0u64);
        for (n, k, pk) in c1.keys() {
            if n == PARTITION && pk == kind {
                sum = sum.zip(delta(PARTITION, k, kind)).map(|(a, b)| a + b);
                if let Some(d) = delta(PARTITION, k, kind).filter(|d| *d > 0) {
                    line.push(format!("{k}@{kind} {d}"));
                }
            }
        }
        parts_total += sum.unwrap_or(0);
        if sum != faults {
            cl.expect(false, format!("{kind}: the kinds' increases add up to {sum:?}, faults {faults:?}"));
        }
    }
    let faults = check::count(&p.classes, ReportClass::Faults);
    cl.line(format!("  partition: {} = {parts_total} faults (record {faults:?})", line.join(", ")));
    if Some(parts_total) != faults {
        cl.expect(false, format!("the kinds add up to {parts_total}, record's faults {faults:?}"));
    }
}

/// The window's record report as `faultscope plot` draws it, rendered to
/// PNG (`dir/NAME.png`, beside `NAME.svg`): the phases named in the SVG, and
/// a picture, not a blank page.
fn check_plot(report: &Report, name: &str, dir: &Path, cl: &mut Checklist) {
    let drawn = (|| -> Result<(String, Vec<u8>, usize)> {
        let s = plot::series(report)?;
        let title =
            format!("Redis: BGSAVE during SETs (record -p --interval {INTERVAL_S}, {} guest)", report.kernel);
        let svg = plot::svg(&s, &title)?;
        let (png, non_white) = render_png(&svg)?;
        std::fs::write(dir.join(format!("{name}.svg")), &svg)?;
        std::fs::write(dir.join(format!("{name}.png")), &png)?;
        Ok((svg, png, non_white))
    })();
    match drawn {
        Ok((svg, png, non_white)) => {
            let missing: Vec<&str> = [
                "before-fork",
                "fork#1 child-alive",
                "fork#1 after-child-exit",
                "reuse",
                "copy",
                "p99 latency",
            ]
            .into_iter()
            .filter(|l| !svg.contains(l))
            .collect();
            cl.expect(
                missing.is_empty(),
                format!("plot: phase and class labels in the SVG (missing: {missing:?})"),
            );
            cl.expect(
                png.len() > 20_000 && non_white > 20_000,
                format!(
                    "plot: {} PNG of {} bytes, {non_white} non-white pixels",
                    dir.join(format!("{name}.png")).display(),
                    png.len()
                ),
            );
        }
        Err(e) => cl.expect(false, format!("plot: {e:#}")),
    }
}

/// An SVG rendered with resvg: the PNG and its number of non-white pixels.
/// plotters writes `font-family="sans-serif"`, which resvg maps to Arial
/// unless told: DejaVu Sans (fonts-dejavu-core, from `cargo xtask setup`).
pub fn render_png(svg: &str) -> Result<(Vec<u8>, usize)> {
    let pix = plot::rasterize(svg)?;
    let non_white = pix.pixels().iter().filter(|p| (p.red(), p.green(), p.blue()) != (255, 255, 255)).count();
    Ok((pix.encode_png().context("encoding the PNG")?, non_white))
}

/// Across both windows and the restart: the counters only grew, serve
/// found both pids, promtool passed, serve ended cleanly.
fn check_whole_run(run: &vm::GuestRun, w: &[Window], cl: &mut Checklist) -> Result<()> {
    let serve_out = run.section("serve.out")?;
    for x in w {
        cl.expect(
            serve_out.contains(&format!("tracing pid {} (redis-server)", x.pid)),
            format!("serve picked up {}'s redis-server, pid {}", x.name, x.pid),
        );
    }
    if let [a, b] = w {
        cl.expect(a.pid != b.pid, format!("the restart has a new pid: {} -> {}", a.pid, b.pid));
        // Every series of the first window's end is still there at the
        // second's start, not lower: counters keep going across the exit
        // of one process and the start of the next.
        let (end1, start2) = (&a.after, &b.before);
        let lower: Vec<String> = end1
            .iter()
            .filter(|(k, v)| start2.get(*k).is_none_or(|n| n < *v))
            .map(|(k, v)| format!("{k:?}: {v} -> {:?}", start2.get(k)))
            .collect();
        cl.expect(
            lower.is_empty(),
            format!("{} series kept going across the restart (lower: {lower:?})", end1.len()),
        );
        let grew = |v: &Counters| -> u64 {
            v.iter().filter(|(k, _)| k.0 == CLASS_FAULTS && k.1 == "copy").map(|(_, v)| v).sum()
        };
        cl.expect(
            grew(&b.after) > grew(start2),
            format!("the new pid's copies counted on: copy {} -> {}", grew(start2), grew(&b.after)),
        );
    }
    let resets = query(run, "end.resets")?;
    let n: f64 = resets.values().sum();
    cl.expect(
        !resets.is_empty() && n == 0.0,
        format!("PromQL resets() over the run: {n} in {} series", resets.len()),
    );
    let up = query(run, "end.up")?;
    cl.expect(
        up.values().all(|v| *v == 1.0) && !up.is_empty(),
        format!("Prometheus sees the target up: {up:?}"),
    );
    let per_bgsave = query(run, "end.copies-per-bgsave")?;
    let p99 = query(run, "end.p99")?;
    let shown: Vec<String> = p99
        .iter()
        .map(|(l, v)| format!("{} {:.1}us", l.get("class").map(String::as_str).unwrap_or("?"), v * 1e6))
        .collect();
    // increase() extrapolates to the range's ends, alike for both
    // counters; the windows' exact increases give the true ratio.
    let mut exact = (0u64, 0u64);
    for x in w {
        let d = |metric: &str, class: &str, kind: &str| delta(&x.before, &x.after, metric, class, kind);
        exact.0 += d(PARTITION, "copy", "child-alive").unwrap_or(0);
        exact.1 += d("faultscope_forks_total", "", "").unwrap_or(0);
    }
    let exact = exact.0 as f64 / exact.1.max(1) as f64;
    let got = per_bgsave.values().next().copied().unwrap_or(f64::NAN);
    cl.expect(
        per_bgsave.len() == 1 && (got / exact - 1.0).abs() < 0.1,
        format!("guide.md query, copies per BGSAVE: {got:.1} (the windows' exact increases: {exact:.1})"),
    );
    // A class whose histogram did not grow in the range has no quantile
    // (NaN); the window's classes have one, a fault's time.
    let p99_of = |c: &str| p99.iter().find(|(l, _)| l.get("class").is_some_and(|x| x == c)).map(|(_, v)| *v);
    let bad: Vec<&str> = ["faults", "reuse", "copy"]
        .into_iter()
        .filter(|c| !p99_of(c).is_some_and(|v| v.is_finite() && v > 0.0 && v < 1.0))
        .collect();
    cl.expect(
        bad.is_empty(),
        format!("guide.md query, p99 fault latency: {} (not a time: {bad:?})", shown.join(", ")),
    );
    let promtool = run.marker("PROMTOOL", "main").unwrap_or_default();
    cl.expect(
        promtool == "0",
        format!(
            "promtool check metrics: exit {promtool} {}",
            run.section("promtool.out").unwrap_or("").trim()
        ),
    );
    let (text, om) = (run.section("scrape.prom")?, run.section("scrape.om")?);
    cl.expect(
        om.trim_end().ends_with("# EOF") && !text.contains("# EOF"),
        format!(
            "scrape: {} bytes as text 0.0.4, {} bytes as OpenMetrics (ends in # EOF), {} series",
            text.len(),
            om.len(),
            text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count()
        ),
    );
    let rc = run.marker("SERVE-RC", "main").unwrap_or_default();
    cl.expect(rc == "0", format!("serve exit status on SIGTERM: {rc}"));
    let left = run.marker("KPROBES-LEFT", "serve").unwrap_or_default();
    cl.expect(left == "0", format!("kprobes left after serve: {left}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_parse() {
        let text = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"faultscope_class_faults_total","class":"copy","comm":"redis-server","phase_kind":"child-alive"},"value":[1764500000.5,"77"]},
            {"metric":{"__name__":"faultscope_faults_total","kind":"copy","comm":"redis-server","phase_kind":"child-alive"},"value":[1764500000.5,"70"]},
            {"metric":{"__name__":"faultscope_forks_total","comm":"redis-server"},"value":[1764500000.5,"2"]}]}}"#;
        let v = parse_vector("t", text).unwrap();
        let c = counters(&v).unwrap();
        assert_eq!(c[&("faultscope_class_faults_total".into(), "copy".into(), "child-alive".into())], 77);
        assert_eq!(c[&("faultscope_faults_total".into(), "copy".into(), "child-alive".into())], 70);
        assert_eq!(c[&("faultscope_forks_total".into(), "".into(), "".into())], 2);
        assert!(parse_vector("t", r#"{"status":"error","error":"bad"}"#).is_err());
        assert!(parse_vector("t", "not json").is_err());
        let half =
            r#"{"status":"success","data":{"result":[{"metric":{"__name__":"x"},"value":[1,"1.5"]}]}}"#;
        assert!(counters(&parse_vector("t", half).unwrap()).is_err(), "a counter is a whole number");
    }

    /// The plot's labels are drawn (with the fonts setup installs), not
    /// left out of the PNG.
    #[test]
    fn text_is_rendered() {
        let svg = |text: &str| {
            format!(
                r#"<svg xmlns="http://www.w3.org/2000/svg" width="200" height="40"><rect width="200" height="40" fill="white"/><text x="5" y="30" font-family="sans-serif" font-size="24">{text}</text></svg>"#
            )
        };
        let (_, blank) = render_png(&svg("")).unwrap();
        let (_, drawn) = render_png(&svg("child-alive")).unwrap();
        assert_eq!(blank, 0);
        assert!(drawn > 200, "{drawn} pixels of text");
    }
}
