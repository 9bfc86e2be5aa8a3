//! `faultscope diff A.json B.json`: two runs side by side, per phase and
//! class, with ratios, like the seed's "v7.3-rc3+ vs patched" columns.
//! Mismatched workloads are detected and said, not silently compared.

use std::{fmt::Write as _, path::Path};

use anyhow::Result;
use serde_json::Value;

use crate::{
    findings::{span_classes, span_names},
    reportfile::{class, ClassValue, Report},
};

const CLASSES: [&str; 12] = [
    "faults",
    "write_faults",
    "wp_faults",
    "reuse",
    "copy",
    "wp_shared",
    "spurious",
    "huge_pmd_wp",
    "contpte_unfold",
    "contpte_fold",
    "contpte_convert",
    "first_touch",
];

/// What makes two workloads comparable: bench parameters, else the
/// processes' names.
pub fn mismatches(a: &Report, b: &Report) -> Vec<String> {
    let mut out = Vec::new();
    match (a.bench(), b.bench()) {
        (Some(x), Some(y)) => {
            for k in ["mode", "size", "folio", "mapping", "child", "threads"] {
                if x[k] != y[k] {
                    out.push(format!("workloads differ: bench {k} {} vs {}", x[k], y[k]));
                }
            }
        }
        (Some(_), None) | (None, Some(_)) => {
            out.push("workloads differ: one report is a bench run, the other is not".into())
        }
        (None, None) => {
            let comms = |r: &Report| -> Vec<String> {
                let mut v: Vec<String> =
                    r.processes().iter().map(|p| p["comm"].as_str().unwrap_or("").to_string()).collect();
                v.sort();
                v
            };
            if comms(a) != comms(b) {
                out.push(format!("workloads differ: processes {:?} vs {:?}", comms(a), comms(b)));
            }
        }
    }
    out
}

/// The process to compare: the bench process, else the first process (or
/// the first with the same comm in B).
fn main_process<'a>(r: &'a Report, comm: Option<&str>) -> Option<&'a Value> {
    if let Some(pid) = r.bench().and_then(|b| b["pid"].as_u64()) {
        return r.processes().iter().find(|p| p["pid"].as_u64() == Some(pid));
    }
    match comm {
        Some(c) => r.processes().iter().find(|p| p["comm"] == c),
        None => r.processes().first(),
    }
}

fn cell(classes: Option<&Value>, name: &str) -> (String, Option<f64>) {
    match classes.map(|c| class(c, name)) {
        Some(ClassValue::Count(n)) => (n.to_string(), Some(n as f64)),
        Some(ClassValue::NotMeasurable(_)) => ("n/m".into(), None),
        _ => ("-".into(), None),
    }
}

fn describe(r: &Report) -> String {
    let k = r.json["kernel"].as_str().unwrap_or("?");
    match r.bench() {
        Some(b) => format!(
            "{} (kernel {k}, bench {} {} MiB {} {} child {})",
            r.path,
            b["mode"].as_str().unwrap_or(""),
            b["size"].as_u64().unwrap_or(0) >> 20,
            b["folio"].as_str().unwrap_or(""),
            b["mapping"].as_str().unwrap_or(""),
            b["child"].as_str().unwrap_or("")
        ),
        None => format!("{} (kernel {k})", r.path),
    }
}

pub fn diff(a: &Report, b: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A: {}", describe(a));
    let _ = writeln!(out, "B: {}", describe(b));
    for m in mismatches(a, b) {
        let _ = writeln!(out, "warning: {m}");
    }
    let Some(pa) = main_process(a, None) else {
        let _ = writeln!(out, "A has no process");
        return out;
    };
    let Some(pb) = main_process(b, pa["comm"].as_str()).or_else(|| main_process(b, None)) else {
        let _ = writeln!(out, "B has no process");
        return out;
    };
    let (na, nb) = (span_names(pa), span_names(pb));
    let only_a: Vec<&String> = na.iter().filter(|n| !nb.contains(n)).collect();
    let only_b: Vec<&String> = nb.iter().filter(|n| !na.contains(n)).collect();
    if !only_a.is_empty() || !only_b.is_empty() {
        let _ = writeln!(out, "warning: phases differ: only in A {only_a:?}, only in B {only_b:?}");
    }
    let _ = writeln!(out, "{:<34} {:<16} {:>12} {:>12} {:>9}", "PHASE", "CLASS", "A", "B", "B/A");
    let mut scopes: Vec<(String, Option<Value>, Option<Value>)> = na
        .iter()
        .filter(|n| nb.contains(n))
        .map(|n| (n.clone(), span_classes(pa, n), span_classes(pb, n)))
        .collect();
    scopes.push(("whole run".into(), Some(pa["classes"].clone()), Some(pb["classes"].clone())));
    for (name, ca, cb) in scopes {
        for c in CLASSES {
            let (ta, va) = cell(ca.as_ref(), c);
            let (tb, vb) = cell(cb.as_ref(), c);
            // Nothing to compare: both zero, or both not measurable.
            if (va == Some(0.0) && vb == Some(0.0)) || (va.is_none() && vb.is_none()) {
                continue;
            }
            let ratio = match (va, vb) {
                (Some(x), Some(y)) if x > 0.0 => format!("{:.3}", y / x),
                (Some(_), Some(y)) if y > 0.0 => "new".into(),
                _ => "".into(),
            };
            let _ = writeln!(out, "{name:<34} {c:<16} {ta:>12} {tb:>12} {ratio:>9}");
        }
    }
    out
}

pub fn run(a: &Path, b: &Path) -> Result<i32> {
    let (a, b) = (Report::load(a)?, Report::load(b)?);
    print!("{}", diff(&a, &b));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bench(kernel: &str, folio: &str, reuse: u64) -> Report {
        Report::from_json(
            kernel.into(),
            json!({"schema": "faultscope/1", "kernel": kernel,
                "bench": {"mode": "seq", "size": 268435456, "folio": folio, "mapping": "pte", "child": "exit", "threads": 1, "pid": 5},
                "processes": [{"pid": 5, "comm": "faultscope-bench", "classes": {"reuse": {"count": reuse}, "spurious": {"measurable": false, "reason": "x"}},
                  "phases": [{"name": "mark:write", "classes": {"reuse": {"count": reuse}}}]}]}),
        )
        .unwrap()
    }

    #[test]
    fn side_by_side_with_ratio() {
        let d = diff(&bench("7.3", "64K", 65601), &bench("7.3+patch", "64K", 4161));
        assert!(!d.contains("warning"), "{d}");
        let line = d.lines().find(|l| l.starts_with("mark:write") && l.contains("reuse")).unwrap();
        assert!(line.contains("65601") && line.contains("4161") && line.contains("0.063"), "{line}");
    }

    #[test]
    fn mismatched_workloads_are_said() {
        let d = diff(&bench("7.3", "64K", 1), &bench("7.3", "4K", 1));
        assert!(d.contains("warning: workloads differ: bench folio \"64K\" vs \"4K\""), "{d}");
        let plain = Report::from_json(
            "p".into(),
            json!({"schema": "faultscope/1", "processes": [{"pid": 1, "comm": "redis-server", "classes": {}}]}),
        )
        .unwrap();
        assert!(diff(&bench("7.3", "64K", 1), &plain).contains("one report is a bench run"));
    }
}
