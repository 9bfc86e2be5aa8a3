//! What `faultscope diff A.json B.json` (`cmd::diff`) prints: two runs side by side, per phase and
//! class, with ratios, like the "v7.3-rc3+ vs patched" columns of a kernel
//! patch's cover letter.
//! Mismatched workloads are detected and said, not silently compared.

use crate::term::safe;
use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    file::Loaded,
    schema::{Attribution, ClassValue, Classes, CopySources, MappingRow, PmdOutcomes, Process, Report},
};
use crate::kernel::classes::ReportClass;

/// What makes two workloads comparable: bench parameters, else the
/// processes' names.
pub fn mismatches(a: &Report, b: &Report) -> Vec<String> {
    let mut out = Vec::new();
    match (&a.bench, &b.bench) {
        (Some(x), Some(y)) => {
            let fields = [
                ("mode", x.mode.clone(), y.mode.clone()),
                ("size", x.size.to_string(), y.size.to_string()),
                ("folio", x.folio.clone(), y.folio.clone()),
                ("mapping", x.mapping.clone(), y.mapping.clone()),
                ("child", x.child.clone(), y.child.clone()),
                ("threads", x.threads.to_string(), y.threads.to_string()),
            ];
            for (k, va, vb) in fields {
                if va != vb {
                    out.push(format!("workloads differ: bench {k} {:?} vs {:?}", safe(&va), safe(&vb)));
                }
            }
        }
        (Some(_), None) | (None, Some(_)) => {
            out.push("workloads differ: one report is a bench run, the other is not".into())
        }
        (None, None) => {
            let comms = |r: &Report| -> Vec<String> {
                let mut v: Vec<String> = r.processes.iter().map(|p| safe(&p.comm)).collect();
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
fn main_process<'a>(r: &'a Report, comm: Option<&str>) -> Option<&'a Process> {
    if r.bench.is_some() {
        return r.bench_process();
    }
    match comm {
        Some(c) => r.processes.iter().find(|p| p.comm == c),
        None => r.processes.first(),
    }
}

fn cell(classes: Option<&Classes>, m: ReportClass) -> (String, Option<f64>) {
    match classes.and_then(|c| c.get(&m)) {
        Some(v) => match v.count() {
            Some(n) => (n.to_string(), Some(n as f64)),
            None => ("n/m".into(), None),
        },
        None => ("-".into(), None),
    }
}

fn describe(l: &Loaded) -> String {
    let r = &l.report;
    let k = safe(&r.kernel);
    let path = safe(&l.path);
    match &r.bench {
        Some(b) => format!(
            "{path} (kernel {k}, bench {} {} MiB {} {} child {})",
            safe(&b.mode),
            b.size >> 20,
            safe(&b.folio),
            safe(&b.mapping),
            safe(&b.child)
        ),
        None => format!("{path} (kernel {k})"),
    }
}

pub fn diff(la: &Loaded, lb: &Loaded) -> String {
    let (a, b) = (&la.report, &lb.report);
    let mut out = String::new();
    let _ = writeln!(out, "A: {}", describe(la));
    let _ = writeln!(out, "B: {}", describe(lb));
    for m in mismatches(a, b) {
        let _ = writeln!(out, "warning: {m}");
    }
    let Some(pa) = main_process(a, None) else {
        let _ = writeln!(out, "A has no process");
        return out;
    };
    let Some(pb) = main_process(b, Some(&pa.comm)).or_else(|| main_process(b, None)) else {
        let _ = writeln!(out, "B has no process");
        return out;
    };
    let (sa, sb) = (pa.spans(), pb.spans());
    let names = |s: &[super::schema::Span]| s.iter().map(|x| x.name.clone()).collect::<Vec<_>>();
    let (na, nb) = (names(&sa), names(&sb));
    let only_a: Vec<String> = na.iter().filter(|n| !nb.contains(n)).map(|n| safe(n)).collect();
    let only_b: Vec<String> = nb.iter().filter(|n| !na.contains(n)).map(|n| safe(n)).collect();
    if !only_a.is_empty() || !only_b.is_empty() {
        let _ = writeln!(out, "warning: phases differ: only in A {only_a:?}, only in B {only_b:?}");
    }
    let _ = writeln!(out, "{:<34} {:<16} {:>12} {:>12} {:>9}", "PHASE", "CLASS", "A", "B", "B/A");
    type Scope<'a> = (String, Option<&'a Classes>, Option<&'a Classes>, &'a Attribution, &'a Attribution);
    let mut scopes: Vec<Scope<'_>> = sa
        .iter()
        .filter_map(|x| {
            let y = sb.iter().find(|y| y.name == x.name)?;
            Some((safe(&x.name), Some(&x.classes), Some(&y.classes), &x.attribution, &y.attribution))
        })
        .collect();
    scopes.push(("whole run".into(), Some(&pa.classes), Some(&pb.classes), &pa.attribution, &pb.attribution));
    // Every process, matched by (comm, nth of that comm), and all together.
    let (matched, totals, said) = all_processes(a, b);
    if a.processes.len() > 1 || b.processes.len() > 1 {
        let _ = writeln!(out, "{said}");
    }
    let empty = Attribution::default();
    let mut extra: Vec<(String, Classes, Classes)> = Vec::new();
    if a.processes.len() > 1 || b.processes.len() > 1 {
        extra.push(("all processes".into(), totals.0, totals.1));
        for (name, x, y) in matched {
            extra.push((name, x.classes.clone(), y.classes.clone()));
        }
    }
    for (name, x, y) in &extra {
        scopes.push((name.clone(), Some(x), Some(y), &empty, &empty));
    }
    let mut by_mapping = String::new();
    for (name, ca, cb, aa, ab) in scopes {
        mapping_rows(&mut by_mapping, &name, aa, ab);
        for m in ReportClass::compared() {
            let (ta, va) = cell(ca, m);
            let (tb, vb) = cell(cb, m);
            // Nothing to compare: both zero, or both not measurable.
            if (va == Some(0.0) && vb == Some(0.0)) || (va.is_none() && vb.is_none()) {
                continue;
            }
            let ratio = match (va, vb) {
                (Some(x), Some(y)) if x > 0.0 => format!("{:.3}", y / x),
                (Some(_), Some(y)) if y > 0.0 => "new".into(),
                _ => "".into(),
            };
            let _ = writeln!(out, "{name:<34} {:<16} {ta:>12} {tb:>12} {ratio:>9}", m.name());
            origin_rows(&mut out, &name, m, ca, cb);
            part_rows(&mut out, &name, m, ca, cb);
        }
    }
    if !by_mapping.is_empty() {
        let _ = writeln!(out, "\nBy mapping (unnamed anonymous mappings matched by size):");
        let _ = writeln!(
            out,
            "{:<34} {:<32} {:<16} {:>12} {:>12} {:>9}",
            "PHASE", "MAPPING", "CLASS", "A", "B", "B/A"
        );
        out.push_str(&by_mapping);
    }
    out
}

/// The processes of two reports matched by (comm, nth process of that comm
/// in pid order), the totals over all processes of each, and what was
/// matched, said in one line.
#[allow(clippy::type_complexity)]
fn all_processes<'a>(
    a: &'a Report,
    b: &'a Report,
) -> (Vec<(String, &'a Process, &'a Process)>, (Classes, Classes), String) {
    let keyed = |r: &'a Report| -> BTreeMap<(String, usize), &'a Process> {
        let mut ps: Vec<&Process> = r.processes.iter().collect();
        ps.sort_by_key(|p| p.pid);
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        ps.into_iter()
            .map(|p| {
                let n = seen.entry(p.comm.clone()).or_insert(0);
                *n += 1;
                ((p.comm.clone(), *n), p)
            })
            .collect()
    };
    let (ka, kb) = (keyed(a), keyed(b));
    let name = |(c, n): &(String, usize)| format!("{}#{n}", safe(c));
    let mut matched = Vec::new();
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    for (k, pa) in &ka {
        match kb.get(k) {
            Some(pb) => matched.push((name(k), *pa, *pb)),
            None => only_a.push(name(k)),
        }
    }
    only_b.extend(kb.keys().filter(|k| !ka.contains_key(*k)).map(name));
    let total = |r: &Report| super::schema::sum_classes(r.processes.iter().map(|p| &p.classes));
    let said = format!(
        "processes: {} matched by name and order ({}); only in A: {}; only in B: {}; 'all processes' sums {} in A and {} in B",
        matched.len(),
        matched.iter().map(|(n, x, y)| format!("{n} = A pid {} / B pid {}", x.pid, y.pid)).collect::<Vec<_>>().join(", "),
        if only_a.is_empty() { "none".into() } else { only_a.join(", ") },
        if only_b.is_empty() { "none".into() } else { only_b.join(", ") },
        a.processes.len(),
        b.processes.len()
    );
    (matched, (total(a), total(b)), said)
}

/// A class's origins, A beside B, where either run has faults the kernel
/// took for the process (a user-only class needs no split).
fn origin_rows(out: &mut String, scope: &str, m: ReportClass, a: Option<&Classes>, b: Option<&Classes>) {
    let get = |c: Option<&Classes>, o: &str| c.and_then(|c| c.get(&m)).and_then(|v| v.origin_count(o));
    let kernel_side = ["kernel", "gup"].iter().any(|o| get(a, o).unwrap_or(0) + get(b, o).unwrap_or(0) > 0);
    if !kernel_side {
        return;
    }
    for o in ["user", "kernel", "gup"] {
        let (va, vb) = (get(a, o), get(b, o));
        let cell = |v: Option<u64>| v.map_or_else(|| "n/m".to_string(), |n| n.to_string());
        let r = match (va, vb) {
            (Some(x), Some(y)) => ratio(x, y),
            _ => String::new(),
        };
        let _ =
            writeln!(out, "{scope:<34} {:<16} {:>12} {:>12} {r:>9}", format!("{m}.{o}"), cell(va), cell(vb));
    }
}

/// The parts of a class's count (`copy.bytes`, `copy.size.64K`,
/// `copy.source.file`, `huge_pmd_wp.outcome.split`: as `verify` names
/// them), A beside B, where either run has some.
fn part_rows(out: &mut String, scope: &str, m: ReportClass, a: Option<&Classes>, b: Option<&Classes>) {
    let parts = |c: Option<&Classes>| -> BTreeMap<(u8, u64, String), u64> {
        let Some(ClassValue::Measured(x)) = c.and_then(|c| c.get(&m)) else { return BTreeMap::new() };
        let mut out = BTreeMap::new();
        if let Some(f) = &x.folios {
            out.insert((0, 0, "bytes".into()), f.bytes);
            for (size, n) in f.by_size() {
                out.insert((1, size, format!("size.{}", crate::units::size(size))), n);
            }
        }
        if let Some(s) = &x.sources {
            for (i, k) in CopySources::NAMES.iter().enumerate() {
                out.insert((2, i as u64, format!("source.{k}")), s.get(k).unwrap_or(0));
            }
        }
        if let Some(o) = &x.outcomes {
            for (i, k) in PmdOutcomes::NAMES.iter().enumerate() {
                out.insert((3, i as u64, format!("outcome.{k}")), o.get(k).unwrap_or(0));
            }
        }
        out
    };
    let (pa, pb) = (parts(a), parts(b));
    let keys: std::collections::BTreeSet<&(u8, u64, String)> = pa.keys().chain(pb.keys()).collect();
    for k in keys {
        // A size none was mapped of is 0 where sizes were read.
        let get = |p: &BTreeMap<(u8, u64, String), u64>| {
            p.get(k).copied().or_else(|| (k.0 == 1 && p.contains_key(&(0, 0, "bytes".into()))).then_some(0))
        };
        let (va, vb) = (get(&pa), get(&pb));
        if va.unwrap_or(0) + vb.unwrap_or(0) == 0 {
            continue;
        }
        let cell = |v: Option<u64>| v.map_or_else(|| "n/m".to_string(), |n| n.to_string());
        let r = match (va, vb) {
            (Some(x), Some(y)) => ratio(x, y),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{scope:<34} {:<16} {:>12} {:>12} {r:>9}",
            format!("{m}.{}", k.2),
            cell(va),
            cell(vb)
        );
    }
}

fn ratio(a: u64, b: u64) -> String {
    match (a, b) {
        (0, 0) => String::new(),
        (0, _) => "new".into(),
        (a, b) => format!("{:.3}", b as f64 / a as f64),
    }
}

/// The name two runs' mappings are matched by: the name, except for
/// unnamed anonymous ranges, whose addresses differ between runs.
fn mapping_key(r: &MappingRow) -> String {
    if r.mapping.starts_with("anon 0x") {
        format!("anon ({} bytes)", r.size)
    } else {
        safe(&r.mapping)
    }
}

/// The per-mapping rows of one scope, A beside B.
fn mapping_rows(out: &mut String, scope: &str, a: &Attribution, b: &Attribution) {
    let sum = |x: &Attribution| {
        let mut m: BTreeMap<String, BTreeMap<ReportClass, u64>> = BTreeMap::new();
        for r in &x.mappings {
            let e = m.entry(mapping_key(r)).or_default();
            for (c, n) in &r.counts {
                *e.entry(*c).or_insert(0) += n;
            }
        }
        m
    };
    let (ma, mb) = (sum(a), sum(b));
    let keys: std::collections::BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
    for k in keys {
        for m in ReportClass::compared() {
            let va = ma.get(k).and_then(|c| c.get(&m)).copied().unwrap_or(0);
            let vb = mb.get(k).and_then(|c| c.get(&m)).copied().unwrap_or(0);
            if va == 0 && vb == 0 {
                continue;
            }
            let _ =
                writeln!(out, "{scope:<34} {k:<32} {:<16} {va:>12} {vb:>12} {:>9}", m.name(), ratio(va, vb));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{
        testing::{classes, not_measurable, phase, process},
        Bench, PhaseKind,
    };

    fn bench(kernel: &str, folio: &str, reuse: u64) -> Loaded {
        let mut p =
            process(5, vec![phase("mark:write", PhaseKind::Mark, classes(&[(ReportClass::Reuse, reuse)]))]);
        p.classes = classes(&[(ReportClass::Reuse, reuse)]);
        p.classes.insert(ReportClass::Spurious, not_measurable("x"));
        p.comm = "faultscope-bench".into();
        let report = Report {
            kernel: kernel.into(),
            bench: Some(Bench {
                mode: "seq".into(),
                size: 268435456,
                folio: folio.into(),
                mapping: "pte".into(),
                child: "exit".into(),
                threads: 1,
                pid: 5,
                ..Bench::default()
            }),
            processes: vec![p],
            ..Report::default()
        };
        Loaded { path: kernel.into(), report }
    }

    #[test]
    fn side_by_side_with_ratio() {
        let d = diff(&bench("7.3", "64K", 65601), &bench("7.3+patch", "64K", 4161));
        assert!(!d.contains("warning"), "{d}");
        let line = d.lines().find(|l| l.starts_with("mark:write") && l.contains("reuse")).unwrap();
        assert!(line.contains("65601") && line.contains("4161") && line.contains("0.063"), "{line}");
    }

    #[test]
    fn origins_side_by_side_where_the_kernel_took_faults() {
        use crate::report::schema::{ClassValue, Measured, Origins};
        let with = |kernel: u64| {
            let mut l = bench("7.3", "4K", 100);
            let v = ClassValue::Measured(Measured {
                count: 100,
                origins: Some(Origins { user: 100 - kernel, kernel: Some(kernel), gup: Some(0) }),
                source: "k".into(),
                ..Measured::default()
            });
            l.report.processes[0].classes.insert(ReportClass::Copy, v);
            l
        };
        let d = diff(&with(0), &with(40));
        let line = d.lines().find(|l| l.starts_with("whole run") && l.contains("copy.kernel")).unwrap();
        assert!(line.contains(" 0 ") && line.contains(" 40 ") && line.contains("new"), "{line}");
        assert!(d.contains("copy.user"), "{d}");
        // A user-only class has no origin rows.
        let d = diff(&with(0), &with(0));
        assert!(!d.contains("copy.user"), "{d}");
    }

    #[test]
    fn what_copies_allocated_side_by_side() {
        use crate::report::schema::{ClassValue, Folios, Measured};
        // A stock kernel copies 4K pages; one with mTHP for wp copies 64K.
        let with = |order: u32, n: u64| {
            let mut l = bench("7.3", "64K", 100);
            let v = ClassValue::Measured(Measured {
                count: n,
                folios: Some(Box::new(Folios::from_orders(&[(order, n)].into()))),
                source: "k".into(),
                ..Measured::default()
            });
            l.report.processes[0].classes.insert(ReportClass::Copy, v);
            l
        };
        let d = diff(&with(0, 4096), &with(4, 256));
        let row = |part: &str| d.lines().find(|l| l.starts_with("whole run") && l.contains(part)).unwrap();
        assert!(row("copy.bytes ").contains(" 16777216 ") && row("copy.bytes ").contains("1.000"), "{d}");
        assert!(row("copy.size.4K ").contains(" 4096 ") && row("copy.size.4K ").contains(" 0 "), "{d}");
        assert!(row("copy.size.64K ").contains(" 256 ") && row("copy.size.64K ").contains("new"), "{d}");
    }

    #[test]
    fn every_process_is_matched_by_name_and_order_and_summed() {
        let report = |procs: &[(u32, &str, u64)]| {
            let processes = procs
                .iter()
                .map(|(pid, comm, n)| {
                    let mut p = process(*pid, vec![]);
                    p.comm = comm.to_string();
                    p.classes = classes(&[(ReportClass::Faults, *n)]);
                    p
                })
                .collect();
            Loaded { path: "r".into(), report: Report { processes, ..Report::default() } }
        };
        // gcc -O2 against -O0: the driver, then cc1 and as.
        let a = report(&[(10, "gcc", 102), (11, "cc1", 5000), (12, "as", 300)]);
        let b = report(&[(20, "gcc", 102), (21, "cc1", 9000), (23, "ld", 800)]);
        let d = diff(&a, &b);
        assert!(d.contains("processes: 2 matched by name and order"), "{d}");
        assert!(d.contains("only in A: as#1; only in B: ld#1"), "{d}");
        let line = |scope: &str| {
            d.lines().find(|l| l.starts_with(scope) && l.contains(" faults ")).unwrap().to_string()
        };
        assert!(line("cc1#1").contains(" 5000 ") && line("cc1#1").contains(" 9000 "), "{d}");
        let all = line("all processes");
        assert!(all.contains(" 5402 ") && all.contains(" 9902 "), "{all}");
    }

    #[test]
    fn per_mapping_beside_each_other() {
        let row = |name: &str, start, n| MappingRow {
            mapping: name.into(),
            start,
            end: start + 4096,
            size: 4096,
            exact: true,
            counts: [(ReportClass::Reuse, n)].into(),
        };
        let mut a = bench("7.3", "64K", 10);
        let mut b = bench("7.3+patch", "64K", 2);
        a.report.processes[0].phases[0].attribution.mappings =
            vec![row("[heap]", 0x1000, 8), row("anon 0x5000-0x6000", 0x5000, 2)];
        b.report.processes[0].phases[0].attribution.mappings =
            vec![row("[heap]", 0x9000, 1), row("anon 0x7000-0x8000", 0x7000, 1)];
        let d = diff(&a, &b);
        let heap = d.lines().find(|l| l.starts_with("mark:write") && l.contains("[heap]")).unwrap();
        assert!(heap.contains(" 8 ") && heap.ends_with("0.125"), "{heap}");
        assert!(d.lines().any(|l| l.contains("anon (4096 bytes)") && l.ends_with("0.500")), "{d}");
    }

    #[test]
    fn mismatched_workloads_are_said() {
        let d = diff(&bench("7.3", "64K", 1), &bench("7.3", "4K", 1));
        assert!(d.contains("warning: workloads differ: bench folio \"64K\" vs \"4K\""), "{d}");
        let mut p = process(1, vec![]);
        p.comm = "redis-server".into();
        let plain = Loaded { path: "p".into(), report: Report { processes: vec![p], ..Report::default() } };
        assert!(diff(&bench("7.3", "64K", 1), &plain).contains("one report is a bench run"));
    }

    #[test]
    fn control_characters_in_a_report_are_escaped() {
        let mut a = bench("7.3\x1b[2J", "64K", 1);
        a.report.processes[0].comm = "x\x1b]0;pwn\x07".into();
        let d = diff(&a, &bench("7.3", "64K", 1));
        assert!(!d.contains('\x1b') && !d.contains('\x07'), "{d:?}");
    }
}
