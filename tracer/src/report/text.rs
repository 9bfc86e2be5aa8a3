//! The plain text report, libbpf-tools style: per process, each phase in
//! which it faulted (classes with counts), then the whole run (every class).

use crate::term::safe;
use std::fmt::Write as _;

use super::schema::{CheckResult, ClassValue, Classes, KernelCheck, Report};

pub fn fmt_ns(ns: u64) -> String {
    match ns {
        0..=9_999 => format!("{ns}ns"),
        10_000..=9_999_999 => format!("{:.1}us", ns as f64 / 1e3),
        10_000_000..=9_999_999_999 => format!("{:.1}ms", ns as f64 / 1e6),
        _ => format!("{:.1}s", ns as f64 / 1e9),
    }
}

fn header(out: &mut String) {
    let _ = writeln!(
        out,
        "  {:<22} {:>10} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "CLASS", "COUNT", "USER", "KERNEL", "GUP", "P50", "P99", "MAX"
    );
}

/// The origin columns of a class: `-` where an origin is not measured.
fn origin_cells(v: &super::schema::Measured) -> [String; 3] {
    let cell = |n: Option<u64>| n.map_or_else(|| "-".to_string(), |n| n.to_string());
    match &v.origins {
        Some(o) => [cell(Some(o.user)), cell(o.kernel), cell(o.gup)],
        None => ["-".into(), "-".into(), "-".into()],
    }
}

/// The kernel check in one line.
pub fn check_line(k: &KernelCheck) -> String {
    let kernel = match (k.kernel_low, k.kernel_high) {
        (Some(lo), Some(hi)) if lo == hi => format!("{lo}"),
        (Some(lo), Some(hi)) => format!("{lo}..{hi}"),
        _ => "unknown".into(),
    };
    let how = k.bracket.as_deref().map(|b| format!(" ({b})")).unwrap_or_default();
    match k.result {
        CheckResult::Equal => format!(
            "kernel check: equal: {} faults = the kernel's min_flt+maj_flt {kernel}{how}",
            k.faultscope
        ),
        CheckResult::WithinBracket => format!(
            "kernel check: within the bracket: {} faults, the kernel's min_flt+maj_flt {kernel}{how}",
            k.faultscope
        ),
        CheckResult::Differs => format!(
            "kernel check: DIFFERS by {:+}: {} faults, the kernel's min_flt+maj_flt {kernel}{how}: {}",
            k.difference,
            k.faultscope,
            k.reason.as_deref().unwrap_or("")
        ),
        CheckResult::Derived => {
            let gup = match k.gup_derived {
                Some((lo, hi)) if lo == hi => format!("{lo}"),
                Some((lo, hi)) => format!("{lo}..{hi}"),
                None => "?".into(),
            };
            format!(
                "kernel check: derived: {} exceptions, the kernel's min_flt+maj_flt {kernel}: {gup} faults without an exception (get_user_pages){how}",
                k.faultscope
            )
        }
        CheckResult::NotChecked => {
            format!("kernel check: not made: {}", k.reason.as_deref().unwrap_or("no reason given"))
        }
    }
}

fn class_rows(out: &mut String, classes: &Classes, all: bool) {
    for (m, v) in classes {
        match v {
            ClassValue::NotMeasurable(_) => {
                if all {
                    let _ = writeln!(out, "  {:<22} {:>10}", m.name(), "n/m");
                }
            }
            ClassValue::Measured(x) => {
                if x.count == 0 && !all {
                    continue;
                }
                let (p50, p99, max) = match &x.latency {
                    Some(l) => (fmt_ns(l.p50_ns), fmt_ns(l.p99_ns), fmt_ns(l.max_ns)),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                let [u, k, g] = origin_cells(x);
                let _ = writeln!(
                    out,
                    "  {:<22} {:>10} {u:>8} {k:>8} {g:>8} {p50:>9} {p99:>9} {max:>9}",
                    m.name(),
                    x.count
                );
            }
        }
    }
}

fn any_count(c: &Classes) -> bool {
    c.values().any(|v| v.count().is_some_and(|n| n > 0))
}

pub fn to_text(r: &Report) -> String {
    let mut out = String::new();
    for p in &r.processes {
        let t0 = p.phases.first().map(|p| p.start_ns).unwrap_or(0);
        let comm = if p.comm.is_empty() { "?".to_string() } else { safe(&p.comm) };
        let active: Vec<_> = p.phases.iter().filter(|ph| any_count(&ph.classes)).collect();
        if active.len() > 1 {
            for ph in active {
                let end = ph.end_ns.map(|e| format!("{:.3}s", (e - t0) as f64 / 1e9)).unwrap_or("now".into());
                let _ = writeln!(
                    out,
                    "PID {} ({comm}) phase {} [{:.3}s .. {end}]",
                    p.pid,
                    safe(&ph.name),
                    (ph.start_ns - t0) as f64 / 1e9
                );
                header(&mut out);
                class_rows(&mut out, &ph.classes, false);
                super::attribution::to_text(&mut out, &ph.attribution);
            }
        }
        let _ = writeln!(out, "PID {} ({comm}) whole run", p.pid);
        header(&mut out);
        class_rows(&mut out, &p.classes, true);
        if let Some(k) = &p.kernel_check {
            let _ = writeln!(out, "  {}", safe(&check_line(k)));
        }
        super::attribution::to_text(&mut out, &p.attribution);
    }
    let dropped: Vec<String> = r.drops.nonzero().map(|(k, n)| format!("{}: {n}", k.describe())).collect();
    if !dropped.is_empty() {
        let _ = writeln!(
            out,
            "warning: the kernel side dropped records ({}); rerun with a larger --max-stats",
            dropped.join(", ")
        );
    }
    if let Some(progs) = &r.programs {
        let _ = writeln!(out, "PROGRAMS (the kernel's accounting, bpf_stats)");
        let _ = writeln!(
            out,
            "  {:<22} {:<10} {:<28} {:>12} {:>10}",
            "PROGRAM", "BACKEND", "TARGET", "RUNS", "NS/RUN"
        );
        for p in progs {
            let per = p.ns_per_run.map_or("-".to_string(), |n| format!("{n:.1}"));
            let _ = writeln!(
                out,
                "  {:<22} {:<10} {:<28} {:>12} {:>10}",
                safe(&p.name),
                safe(&p.backend),
                safe(&p.target),
                p.runs,
                per
            );
        }
    }
    let _ = writeln!(
        out,
        "n/m = not measurable on this kernel (see the line above the table); USER, KERNEL, GUP: who asked for the faults (user mode, the kernel in a system call, get_user_pages; - = not measurable)"
    );
    out
}
