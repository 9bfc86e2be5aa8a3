//! The report: a plain table per process, and JSON (schema `faultscope/1`).

use std::{collections::BTreeMap, fmt::Write as _};

use faultscope_common::{maps::Drop, Class, PhaseId};
use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::{
    classes::Availability,
    collector::{latency, Snapshot},
    phases::Timeline,
    session::ProbeStatus,
};

pub const SCHEMA: &str = "faultscope/1";

/// Everything a report is made of besides the counts.
pub struct Context<'a> {
    pub kernel: String,
    pub arch: &'static str,
    pub availability: &'a [(&'static str, Availability)],
    pub probes: &'a [ProbeStatus],
    pub comms: &'a BTreeMap<u32, String>,
    pub drops: [u64; Drop::COUNT],
    pub duration_ns: u64,
    pub timeline: &'a Timeline,
}

#[derive(Serialize)]
struct ProbeJson<'a> {
    program: &'a str,
    target: &'a str,
    attached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

/// The mode in one word: kprobes when the fault path is probed, else the
/// tracepoint-only fallback.
pub fn mode(avail: &[(&'static str, Availability)]) -> &'static str {
    match avail.iter().find(|(n, _)| *n == "faults") {
        Some((_, Availability::Measured { class: Class::Faults, .. })) => "kprobe",
        Some((_, Availability::Measured { .. })) => "tracepoint",
        _ => "none",
    }
}

/// One class's JSON object for one process, over the run or in one phase.
pub fn class_json(snap: &Snapshot, tgid: u32, phase: Option<PhaseId>, a: &Availability) -> Value {
    match a {
        Availability::NotMeasurable(reason) => json!({"measurable": false, "reason": reason}),
        Availability::Measured { class, timed, source } => {
            let s = snap.get_in(tgid, phase, *class);
            let mut m = Map::new();
            m.insert("count".into(), json!(s.map(|s| s.count).unwrap_or(0)));
            if *timed {
                if let Some(l) = s.as_ref().and_then(latency) {
                    m.insert("p50_ns".into(), json!(l.p50_ns));
                    m.insert("p99_ns".into(), json!(l.p99_ns));
                    m.insert("max_ns".into(), json!(l.max_ns));
                    m.insert("mean_ns".into(), json!(l.mean_ns));
                }
            }
            m.insert("source".into(), json!(source));
            Value::Object(m)
        }
    }
}

pub fn to_json(snap: &Snapshot, ctx: &Context<'_>) -> Value {
    let mut procs = Vec::new();
    for tgid in pids(snap, ctx) {
        let classes_in = |phase: Option<PhaseId>| {
            let mut classes = Map::new();
            for (name, a) in ctx.availability {
                classes.insert((*name).into(), class_json(snap, tgid, phase, a));
            }
            Value::Object(classes)
        };
        let phases: Vec<Value> = ctx
            .timeline
            .phases()
            .iter()
            .map(|ph| {
                json!({
                    "id": ph.id,
                    "name": ph.name,
                    "start_ns": ph.start_ns,
                    "end_ns": ph.end_ns,
                    "children_alive": ph.children_alive,
                    "classes": classes_in(Some(ph.id)),
                })
            })
            .collect();
        let p = json!({
            "pid": tgid,
            "comm": ctx.comms.get(&tgid).cloned().unwrap_or_default(),
            "classes": classes_in(None),
            "phases": phases,
        });
        procs.push(p);
    }
    let probes: Vec<ProbeJson<'_>> = ctx
        .probes
        .iter()
        .map(|p| ProbeJson {
            program: p.program.name(),
            target: &p.target,
            attached: p.attached,
            reason: p.reason.as_deref(),
        })
        .collect();
    json!({
        "schema": SCHEMA,
        "kernel": ctx.kernel,
        "arch": ctx.arch,
        "mode": mode(ctx.availability),
        "duration_ns": ctx.duration_ns,
        "probes": probes,
        "drops": Drop::ALL.iter().map(|d| (d.key().to_string(), json!(ctx.drops[d.index() as usize]))).collect::<Map<_, _>>(),
        "processes": procs,
    })
}

/// Processes to show: those with counts, plus traced ones without any.
fn pids(snap: &Snapshot, ctx: &Context<'_>) -> Vec<u32> {
    let mut v = snap.pids();
    v.extend(ctx.comms.keys().copied());
    v.sort_unstable();
    v.dedup();
    v
}

/// One line saying what is measured here and what is not, and why.
pub fn measured_line(avail: &[(&'static str, Availability)]) -> String {
    let measured: Vec<&str> =
        avail.iter().filter(|(_, a)| matches!(a, Availability::Measured { .. })).map(|(n, _)| *n).collect();
    let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (n, a) in avail {
        if let Availability::NotMeasurable(r) = a {
            reasons.entry(r.as_str()).or_default().push(n);
        }
    }
    let mut s = format!("faultscope: measuring {}", measured.join(", "));
    if !reasons.is_empty() {
        s.push_str("; not measurable here: ");
        let parts: Vec<String> = reasons.iter().map(|(r, ns)| format!("{} ({r})", ns.join(", "))).collect();
        s.push_str(&parts.join("; "));
    }
    s
}

fn fmt_ns(ns: u64) -> String {
    match ns {
        0..=9_999 => format!("{ns}ns"),
        10_000..=9_999_999 => format!("{:.1}us", ns as f64 / 1e3),
        10_000_000..=9_999_999_999 => format!("{:.1}ms", ns as f64 / 1e6),
        _ => format!("{:.1}s", ns as f64 / 1e9),
    }
}

fn class_rows(
    out: &mut String,
    snap: &Snapshot,
    tgid: u32,
    phase: Option<PhaseId>,
    ctx: &Context<'_>,
    all: bool,
) {
    for (name, a) in ctx.availability {
        match a {
            Availability::NotMeasurable(_) => {
                if all {
                    let _ = writeln!(out, "  {name:<22} {:>10}", "n/m");
                }
            }
            Availability::Measured { class, timed, .. } => {
                let s = snap.get_in(tgid, phase, *class);
                let count = s.map(|s| s.count).unwrap_or(0);
                if count == 0 && !all {
                    continue;
                }
                let lat = if *timed { s.as_ref().and_then(latency) } else { None };
                let (p50, p99, max) = match lat {
                    Some(l) => (fmt_ns(l.p50_ns), fmt_ns(l.p99_ns), fmt_ns(l.max_ns)),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                let _ = writeln!(out, "  {name:<22} {count:>10} {p50:>9} {p99:>9} {max:>9}");
            }
        }
    }
}

fn header(out: &mut String) {
    let _ = writeln!(out, "  {:<22} {:>10} {:>9} {:>9} {:>9}", "CLASS", "COUNT", "P50", "P99", "MAX");
}

/// The plain table, libbpf-tools style: per process, each phase in which it
/// faulted (classes with counts), then the whole run (every class).
pub fn to_text(snap: &Snapshot, ctx: &Context<'_>) -> String {
    let mut out = String::new();
    let t0 = ctx.timeline.phases().first().map(|p| p.start_ns).unwrap_or(0);
    for tgid in pids(snap, ctx) {
        let comm = ctx.comms.get(&tgid).map(String::as_str).unwrap_or("?");
        let keys = snap.phases_of(tgid);
        if keys.len() > 1 {
            for ph in ctx.timeline.phases().iter().filter(|p| keys.contains(&p.id)) {
                let end = ph.end_ns.map(|e| format!("{:.3}s", (e - t0) as f64 / 1e9)).unwrap_or("now".into());
                let _ = writeln!(
                    out,
                    "PID {tgid} ({comm}) phase {} [{:.3}s .. {end}]",
                    ph.name,
                    (ph.start_ns - t0) as f64 / 1e9
                );
                header(&mut out);
                class_rows(&mut out, snap, tgid, Some(ph.id), ctx, false);
            }
        }
        let _ = writeln!(out, "PID {tgid} ({comm}) whole run");
        header(&mut out);
        class_rows(&mut out, snap, tgid, None, ctx, true);
    }
    let dropped: u64 = ctx.drops.iter().sum();
    if dropped > 0 {
        let counts: Vec<String> = Drop::ALL
            .iter()
            .map(|d| format!("{}: {}", d.describe(), ctx.drops[d.index() as usize]))
            .collect();
        let _ = writeln!(
            out,
            "warning: the kernel side dropped records ({}); rerun with a larger --max-stats",
            counts.join(", ")
        );
    }
    let _ = writeln!(out, "n/m = not measurable on this kernel (see the line above the table)");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use faultscope_common::{Stat, StatKey};

    fn snap() -> Snapshot {
        let mut stats = BTreeMap::new();
        let mut s = Stat::ZERO;
        for v in [400u64, 420, 450, 5000] {
            s.record(Some(v));
        }
        stats.insert(StatKey::new(42, 0, Class::Faults as u16), s);
        Snapshot { stats }
    }

    #[test]
    fn json_shape() {
        let avail = vec![
            ("faults", Availability::Measured { class: Class::Faults, timed: true, source: "k" }),
            ("reuse", Availability::NotMeasurable("no kprobe PMU".into())),
            ("copy", Availability::Measured { class: Class::Copy, timed: true, source: "k" }),
        ];
        let comms: BTreeMap<u32, String> = [(42, "w".to_string())].into();
        let timeline = Timeline::new(0, 0);
        let ctx = Context {
            kernel: "6.12".into(),
            arch: "x86_64",
            availability: &avail,
            probes: &[],
            comms: &comms,
            drops: [0, 0, 0, 0, 1, 2],
            duration_ns: 1,
            timeline: &timeline,
        };
        let j = to_json(&snap(), &ctx);
        assert_eq!(j["schema"], SCHEMA);
        assert_eq!(j["mode"], "kprobe");
        let p = &j["processes"][0];
        assert_eq!(p["pid"], 42);
        assert_eq!(p["classes"]["faults"]["count"], 4);
        assert_eq!(p["classes"]["faults"]["max_ns"], 5000);
        assert!(p["classes"]["faults"]["p50_ns"].as_u64().unwrap() >= 384);
        assert_eq!(p["classes"]["reuse"]["measurable"], false);
        // Measured but nothing happened: a real 0, without latency.
        assert_eq!(p["classes"]["copy"]["count"], 0);
        assert!(p["classes"]["copy"].get("p50_ns").is_none());
        assert_eq!(j["drops"]["lost_kretprobe_returns"], 1);
        assert_eq!(j["drops"]["context_read_failed"], 2);
        assert_eq!(j["drops"].as_object().unwrap().len(), Drop::COUNT);
        assert_eq!(p["phases"][0]["name"], "before-fork");
        assert_eq!(p["phases"][0]["classes"]["faults"]["count"], 4);
        let t = to_text(&snap(), &ctx);
        assert!(t.contains("n/m"));
        assert!(t.contains("faults whose kretprobe was missed: 1"), "{t}");
    }

    #[test]
    fn measured_line_groups_reasons() {
        let avail = vec![
            ("faults", Availability::Measured { class: Class::TpFaults, timed: false, source: "t" }),
            ("reuse", Availability::NotMeasurable("no PMU".into())),
            ("copy", Availability::NotMeasurable("no PMU".into())),
        ];
        assert_eq!(
            measured_line(&avail),
            "faultscope: measuring faults; not measurable here: reuse, copy (no PMU)"
        );
        assert_eq!(mode(&avail), "tracepoint");
    }
}
