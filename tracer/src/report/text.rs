//! The plain text report, libbpf-tools style: per process, each phase in
//! which it faulted (classes with counts), then the whole run (every class).

use std::{collections::BTreeMap, fmt::Write as _};

use super::schema::{sum_classes, CheckResult, ClassValue, Classes, KernelCheck, Mode, Report, SystemWide};
use crate::{
    kernel::latency::{LatencyTier, LatencyWindow},
    term::safe,
    units::{count, ns as fmt_ns},
};

/// The columns that can have a value in a report: GUP where the fault path
/// is probed (the exception tracepoints see no get_user_pages fault), the
/// latencies where faults were timed.
#[derive(Clone, Copy)]
struct Columns {
    gup: bool,
    latency: bool,
}

impl Columns {
    fn of(r: &Report) -> Columns {
        let probed = r.mode != Mode::Tracepoint;
        Columns { gup: probed, latency: probed && r.latency != Some(LatencyTier::Off) }
    }
}

/// One row: the class, its count and origins, and the columns `c` keeps.
fn row(c: Columns, cells: [&str; 8]) -> String {
    let [class, n, u, k, g, p50, p99, max] = cells;
    let mut l = format!("  {class:<22} {n:>10} {u:>8} {k:>8}");
    if c.gup {
        let _ = write!(l, " {g:>8}");
    }
    if c.latency {
        let _ = write!(l, " {p50:>9} {p99:>9} {max:>9}");
    }
    l
}

fn header(out: &mut String, c: Columns) {
    let _ = writeln!(out, "{}", row(c, ["CLASS", "COUNT", "USER", "KERNEL", "GUP", "P50", "P99", "MAX"]));
}

/// The origin columns of a class: `-` where an origin is not measured.
fn origin_cells(v: &super::schema::Measured) -> [String; 3] {
    let cell = |n: Option<u64>| n.map_or_else(|| "-".to_string(), count);
    match &v.origins {
        Some(o) => [cell(Some(o.user)), cell(o.kernel), cell(o.gup)],
        None => ["-".into(), "-".into(), "-".into()],
    }
}

/// The kernel check in one line.
pub fn check_line(k: &KernelCheck) -> String {
    let signed = |v: i64| if v < 0 { format!("-{}", count(v.unsigned_abs())) } else { count(v as u64) };
    let range =
        |lo: i64, hi: i64| if lo == hi { signed(lo) } else { format!("{}..{}", signed(lo), signed(hi)) };
    let kernel = match (k.kernel_low, k.kernel_high) {
        (Some(lo), Some(hi)) => range(lo as i64, hi as i64),
        _ => "unknown".into(),
    };
    let how = k.bracket.as_deref().map(|b| format!(" ({b})")).unwrap_or_default();
    let faultscope = count(k.faultscope);
    match k.result {
        CheckResult::Equal => {
            format!("kernel check: equal: {faultscope} faults = the kernel's min_flt+maj_flt {kernel}{how}")
        }
        CheckResult::WithinBracket => format!(
            "kernel check: within the bracket: {faultscope} faults, the kernel's min_flt+maj_flt {kernel}{how}"
        ),
        CheckResult::Differs => format!(
            "kernel check: DIFFERS by {}{}: {faultscope} faults, the kernel's min_flt+maj_flt {kernel}{how}: {}",
            if k.difference < 0 { "" } else { "+" },
            signed(k.difference),
            k.reason.as_deref().unwrap_or("")
        ),
        CheckResult::Derived => {
            let gup = match k.gup_derived {
                Some((lo, hi)) => range(lo, hi),
                None => "?".into(),
            };
            format!(
                "kernel check: derived: {faultscope} exceptions, the kernel's min_flt+maj_flt {kernel}: {gup} faults without an exception (get_user_pages){how}"
            )
        }
        CheckResult::NotChecked => {
            format!("kernel check: not made: {}", k.reason.as_deref().unwrap_or("no reason given"))
        }
    }
}

/// The rows of `classes`: with `all`, every class that exists on `arch`
/// (`n/m` where not measurable), else those that counted something.
fn class_rows(out: &mut String, classes: &Classes, all: bool, arch: &str, c: Columns) {
    for (m, v) in classes {
        if !m.exists_on(arch) {
            continue;
        }
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
                let _ =
                    writeln!(out, "{}", row(c, [m.name(), &count(x.count), &u, &k, &g, &p50, &p99, &max]));
                if let Some(f) = x.folios.as_ref().filter(|f| f.bytes > 0) {
                    let _ = writeln!(out, "{}", folios_line(f));
                }
                if let Some(s) = x.sources.as_ref().filter(|_| x.count > 0) {
                    let _ = writeln!(out, "{}", sources_line(s));
                }
                if let Some(o) = x.outcomes.as_ref().filter(|_| x.count > 0) {
                    let _ = writeln!(
                        out,
                        "    {:<20} reused {}, THP copied {}, split to PTEs {}{}",
                        "outcome",
                        count(o.reused),
                        count(o.copied),
                        count(o.split),
                        if o.other > 0 {
                            format!(", retried or failed {}", count(o.other))
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
    }
}

/// Under a class's row: the new anon folios its faults mapped, by size.
fn folios_line(f: &super::schema::Folios) -> String {
    let sizes: Vec<String> =
        f.by_size().iter().map(|(b, n)| format!("{} {}", crate::units::size(*b), count(*n))).collect();
    format!("    {:<20} {} ({})", "new folios", sizes.join(", "), crate::units::bytes(f.bytes))
}

/// Under `copy`: the kinds of mapping the copies were made in.
fn sources_line(s: &super::schema::CopySources) -> String {
    let mut parts = vec![format!("anon {}", count(s.anon)), format!("private file {}", count(s.file))];
    if s.file_exec > 0 {
        parts[1] += &format!(" (exec {})", count(s.file_exec));
    }
    if s.unattributed > 0 {
        parts.push(format!("no mapping {}", count(s.unattributed)));
    }
    format!("    {:<20} {}", "copied in", parts.join(", "))
}

fn any_count(c: &Classes) -> bool {
    c.values().any(|v| v.count().is_some_and(|n| n > 0))
}

/// What of a text report does not depend on timing: each table's heading
/// (digits as `#`), the column header, the first word (the class) of every
/// class row, in order, and whether the kernel check is there. What the
/// README and the walk-throughs show is checked against a fresh run by it.
pub fn shape(report: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in report.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if line.starts_with("PID ") {
            out.push(digits_as_hash(line));
        } else if first == "CLASS" {
            out.push(line.split_whitespace().collect::<Vec<_>>().join(" "));
        } else if line.starts_with("  ") && crate::kernel::classes::ReportClass::from_name(first).is_some() {
            out.push(format!("row {first}"));
        } else if line.trim_start().starts_with("kernel check:") {
            out.push("kernel check".into());
        }
    }
    out
}

/// `line` with each run of digits as one `#`.
fn digits_as_hash(line: &str) -> String {
    let mut s = String::new();
    for c in line.chars() {
        if !c.is_ascii_digit() {
            s.push(c);
        } else if !s.ends_with('#') {
            s.push('#');
        }
    }
    s
}

pub fn to_text(r: &Report) -> String {
    let mut out = String::new();
    let cols = Columns::of(r);
    if let Some(sw) = &r.system_wide {
        system_wide(&mut out, r, sw);
    }
    for p in r.processes.iter().filter(|_| r.system_wide.is_none()) {
        let t0 = p.phases.first().map(|p| p.start_ns).unwrap_or(0);
        let comm = if p.comm.is_empty() { "?".to_string() } else { safe(&p.comm) };
        // Every phase, once the process has more than one: a phase with
        // faults gets its table, one without a line saying so.
        if p.phases.len() > 1 {
            for ph in &p.phases {
                let end = ph.end_ns.map(|e| format!("{:.3}s", (e - t0) as f64 / 1e9)).unwrap_or("now".into());
                let title = format!(
                    "PID {} ({comm}) phase {} [{:.3}s .. {end}]",
                    p.pid,
                    safe(&ph.name),
                    (ph.start_ns - t0) as f64 / 1e9
                );
                if !any_count(&ph.classes) {
                    let _ = writeln!(out, "{title}: no faults");
                    continue;
                }
                let _ = writeln!(out, "{title}");
                header(&mut out, cols);
                class_rows(&mut out, &ph.classes, false, &r.arch, cols);
                time_line(&mut out, &ph.classes, r.latency);
                super::attribution::to_text(&mut out, &ph.attribution);
            }
        }
        let _ = writeln!(out, "PID {} ({comm}) whole run", p.pid);
        header(&mut out, cols);
        class_rows(&mut out, &p.classes, true, &r.arch, cols);
        time_line(&mut out, &p.classes, r.latency);
        if let Some(k) = &p.kernel_check {
            let _ = writeln!(out, "  {}", safe(&check_line(k)));
        }
        super::attribution::to_text(&mut out, &p.attribution);
    }
    totals(&mut out, r);
    not_measurable(&mut out, r);
    spurious_note(&mut out, r);
    let dropped: Vec<String> = r.drops.nonzero().map(|(k, n)| format!("{}: {n}", k.describe())).collect();
    if !dropped.is_empty() {
        let _ = writeln!(out, "warning: records were dropped ({}){}", dropped.join(", "), drop_hints(r));
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
        "{}",
        if cols.gup {
            "USER, KERNEL, GUP: who asked for the faults (user mode, the kernel in a system call, get_user_pages); - = not measurable"
        } else {
            "USER, KERNEL: who asked for the faults (user mode, the kernel in a system call); - = not measurable"
        }
    );
    if let Some(l) = latency_line(r.latency, r.latency_window) {
        let _ = writeln!(out, "{l}");
    }
    out
}

/// What P50, P99 and MAX are of, unless every fault was timed.
/// The time the span's faults spent in the kernel (the latency owner's
/// question: how long did the process stall in faults), where they were
/// timed.
fn time_line(out: &mut String, classes: &Classes, tier: Option<LatencyTier>) {
    let Some(ClassValue::Measured(m)) = classes.get(&crate::kernel::classes::ReportClass::Faults) else {
        return;
    };
    let Some(l) = m.latency.as_ref().filter(|l| l.sum_ns > 0) else { return };
    let timed: u64 = l.buckets.iter().map(|b| b[2]).sum();
    let all = match tier {
        Some(LatencyTier::Sample { every }) => format!(
            " of {} timed faults (one in {every}); about {} for all {}",
            count(timed),
            fmt_ns(l.sum_ns.saturating_mul(every as u64)),
            count(m.count)
        ),
        _ if timed < m.count => {
            format!(" of {} timed faults of {}", count(timed), count(m.count))
        }
        _ => String::new(),
    };
    let _ = writeln!(out, "  time in faults: {}{all}", fmt_ns(l.sum_ns));
}

fn latency_line(tier: Option<LatencyTier>, window: Option<LatencyWindow>) -> Option<String> {
    let from = match window {
        Some(LatencyWindow::Exception) => {
            "; timed from the page-fault exception to handle_mm_fault's return, get_user_pages faults (no exception) not timed"
        }
        _ => "",
    };
    match tier? {
        LatencyTier::All if from.is_empty() => None,
        LatencyTier::All => Some(format!("P50, P99, MAX: of every fault{from}")),
        LatencyTier::Sample { every } => Some(format!(
            "P50, P99, MAX: of one fault in {every} on each CPU (--latency sample={every}){from}; the counts are of every fault"
        )),
        LatencyTier::Off => Some("P50, P99, MAX: no fault was timed (--latency off); the counts are of every fault".into()),
    }
}

/// What to do about the drops that an option can avoid.
fn drop_hints(r: &Report) -> String {
    use crate::kernel::drops::{DropKind, DropReason};
    let mut hints = Vec::new();
    if r.drops.get(DropReason::Kernel(DropKind::StatsFull)) > 0 {
        hints.push("rerun with a larger --max-stats");
    }
    if r.drops.get(DropReason::Kernel(DropKind::StackLost)) > 0 {
        hints.push("rerun with a larger --max-stacks");
    }
    if r.drops.get(DropReason::Kernel(DropKind::MappingsFull)) > 0 {
        hints.push("the per-mapping counts are incomplete (--no-mappings leaves them out)");
    }
    if r.drops.get(DropReason::Kernel(DropKind::SitesFull))
        + r.drops.get(DropReason::Kernel(DropKind::StacksFull))
        > 0
    {
        hints.push("the sites or stacks are incomplete (ask for fewer classes)");
    }
    if hints.is_empty() {
        String::new()
    } else {
        format!("; {}", hints.join("; "))
    }
}

/// Where the machine cannot take a stale-TLB spurious fault, `spurious`
/// counts only lost races: said beside the counts.
fn spurious_note(out: &mut String, r: &Report) {
    let measured =
        r.processes.iter().any(|p| p.count(crate::kernel::classes::ReportClass::Spurious).is_some());
    let Some(pv) = r.provenance.as_ref().filter(|_| measured) else { return };
    let why = match pv.hypervisor.as_deref() {
        Some(h) if h.contains("TCG") => {
            "QEMU's TCG keeps no stale TLB entry (its software TLB is flushed when a PTE is changed)"
        }
        _ if pv.cpu_vendor == "AuthenticAMD" => {
            "AMD CPUs walk the page table again on a permission fault before raising it"
        }
        _ => return,
    };
    let _ = writeln!(out, "spurious: on this machine only lost races, no stale-TLB faults: {why}");
}

/// A run over every process: one row per listed process, the others
/// summed, and what the kernel check of those born in the run found.
fn system_wide(out: &mut String, r: &Report, sw: &SystemWide) {
    let _ = writeln!(
        out,
        "EVERY PROCESS: {} faulted; the {} with the most {} listed",
        count(sw.faulted),
        count(r.processes.len() as u64),
        sw.sort
    );
    out.push_str(&super::live::system_wide_table(r, sw));
    let checks: Vec<(u32, &KernelCheck)> =
        r.processes.iter().filter_map(|p| Some((p.pid, p.kernel_check.as_ref()?))).collect();
    let differ: Vec<String> = checks
        .iter()
        .filter(|(_, k)| k.result == CheckResult::Differs)
        .map(|(pid, k)| format!("pid {pid}: {}", check_line(k)))
        .collect();
    let _ = writeln!(
        out,
        "  kernel check (listed processes born in the run): {} checked, {} differ",
        checks.len(),
        differ.len()
    );
    for d in differ {
        let _ = writeln!(out, "    {}", safe(&d));
    }
}

/// With several processes: their sum, and each comm's that has several
/// (under `-a`: the sum of every process, listed or not).
fn totals(out: &mut String, r: &Report) {
    if let Some(sw) = &r.system_wide {
        let all: Vec<&Classes> =
            r.processes.iter().map(|p| &p.classes).chain(std::iter::once(&sw.other.classes)).collect();
        let _ = writeln!(out, "ALL ({} processes) whole run", count(sw.faulted));
        header(out, Columns::of(r));
        class_rows(out, &sum_classes(all), false, &r.arch, Columns::of(r));
        return;
    }
    if r.processes.len() < 2 {
        return;
    }
    let mut by_comm: BTreeMap<&str, Vec<&Classes>> = BTreeMap::new();
    for p in &r.processes {
        by_comm.entry(p.comm.as_str()).or_default().push(&p.classes);
    }
    let mut table = |title: String, classes: Vec<&Classes>| {
        let _ = writeln!(out, "{title} whole run (latency per process above)");
        header(out, Columns::of(r));
        class_rows(out, &sum_classes(classes), false, &r.arch, Columns::of(r));
    };
    if by_comm.len() > 1 {
        for (comm, cs) in by_comm.iter().filter(|(_, cs)| cs.len() > 1) {
            table(format!("COMM {} ({} processes)", safe(comm), cs.len()), cs.clone());
        }
    }
    table(format!("ALL ({} processes)", r.processes.len()), r.processes.iter().map(|p| &p.classes).collect());
}

/// One block for what this kernel cannot measure: each reason once, with
/// the classes it costs (classes of another architecture are not shown).
fn not_measurable(out: &mut String, r: &Report) {
    let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in &r.processes {
        for (m, v) in &p.classes {
            if let ClassValue::NotMeasurable(n) = v {
                if m.exists_on(&r.arch) {
                    let names = reasons.entry(n.reason.as_str()).or_default();
                    if !names.contains(&m.name()) {
                        names.push(m.name());
                    }
                }
            }
        }
    }
    let no_latency = r.mode == Mode::Tracepoint;
    if reasons.is_empty() && !no_latency {
        return;
    }
    let _ = writeln!(out, "Not measurable here (n/m):");
    for (reason, names) in &reasons {
        let _ = writeln!(out, "  {}: {}", names.join(", "), safe(reason));
    }
    if no_latency {
        let _ = writeln!(
            out,
            "  latency: tracepoint mode has no fault return to time (the tracepoint fires at the fault's entry only)"
        );
        let _ = writeln!(
            out,
            "  fix: a kernel with kprobes (CONFIG_KPROBES) or one that loads fentry programs measures every class and its latency"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        kernel::classes::ReportClass,
        report::schema::testing::{classes, not_measurable, process},
    };

    fn report(arch: &str) -> Report {
        let mut ps = Vec::new();
        for (pid, comm, n) in [(1, "redis-server", 1500), (2, "redis-server", 2500), (3, "sh", 7)] {
            let mut p = process(pid, Vec::new());
            p.comm = comm.into();
            p.classes = classes(&[(ReportClass::Faults, n)]);
            p.classes.insert(ReportClass::Reuse, not_measurable("needs fault_entry: no kprobe PMU"));
            p.classes.insert(ReportClass::ContpteUnfold, not_measurable("arm64 only"));
            ps.push(p);
        }
        Report { arch: arch.into(), mode: Mode::Tracepoint, processes: ps, ..Report::default() }
    }

    #[test]
    fn totals_per_comm_and_all_with_separators() {
        let t = to_text(&report("x86_64"));
        assert!(t.contains("COMM redis-server (2 processes) whole run"), "{t}");
        assert!(!t.contains("COMM sh"), "{t}");
        let all = t.split("ALL (3 processes) whole run").nth(1).unwrap();
        assert!(all.lines().any(|l| l.split_whitespace().take(2).eq(["faults", "4,007"])), "{t}");
    }

    /// Every phase of a process with more than one is listed: the one with
    /// faults with its table (even when it is the only one with faults),
    /// the others as a line.
    #[test]
    fn every_phase_listed_once_there_is_more_than_one() {
        use crate::collect::phases::PhaseKind;
        use crate::report::schema::testing::phase;
        let cow = classes(&[(ReportClass::Faults, 128_033), (ReportClass::WpFaults, 128_000)]);
        let mut p = process(
            9,
            vec![
                phase("before-fork", PhaseKind::BeforeFork, Classes::new()),
                phase("fork#1 child-alive", PhaseKind::ChildAlive, cow.clone()),
                phase("mark:after", PhaseKind::Mark, classes(&[(ReportClass::Faults, 0)])),
            ],
        );
        p.classes = cow;
        let r = Report { mode: Mode::Tracepoint, processes: vec![p], ..Report::default() };
        let t = to_text(&r);
        assert!(t.contains("PID 9 (test) phase before-fork [0.000s .. now]: no faults"), "{t}");
        assert!(t.contains("PID 9 (test) phase mark:after [0.000s .. now]: no faults"), "{t}");
        let alive = t.split("phase fork#1 child-alive").nth(1).unwrap();
        assert!(alive.lines().any(|l| l.split_whitespace().take(2).eq(["wp_faults", "128,000"])), "{t}");
        // One phase: the whole run says it all.
        let mut one = r.clone();
        one.processes[0].phases.truncate(1);
        assert!(!to_text(&one).contains(" phase "), "{}", to_text(&one));
    }

    /// Columns that can never have a value here are not printed: in
    /// tracepoint mode neither GUP nor the latencies, under --latency off
    /// not the latencies.
    #[test]
    fn columns_that_cannot_have_a_value_are_left_out() {
        let mut r = report("x86_64");
        let t = to_text(&r);
        let header = t.lines().find(|l| l.trim_start().starts_with("CLASS")).unwrap();
        assert_eq!(
            header.split_whitespace().collect::<Vec<_>>(),
            ["CLASS", "COUNT", "USER", "KERNEL"],
            "{t}"
        );
        let table = |l: &&str| l.trim_start().starts_with("CLASS") || l.trim_start().starts_with("faults ");
        assert!(t.lines().filter(table).all(|l| l.chars().count() <= 80), "{t}");
        r.mode = Mode::Kprobe;
        r.latency = Some(LatencyTier::All);
        let t = to_text(&r);
        assert!(t.contains(" GUP ") && t.contains(" P99 "), "{t}");
        r.latency = Some(LatencyTier::Off);
        let t = to_text(&r);
        assert!(t.contains("KERNEL      GUP\n") && !t.contains(" P99 "), "{t}");
    }

    /// Where faults are timed, each table says how long they took in all.
    #[test]
    fn time_in_faults_under_each_table() {
        let mut r = report("x86_64");
        r.mode = Mode::Kprobe;
        r.latency = Some(LatencyTier::All);
        let lat = |sum_ns: u64, timed: u64| super::super::schema::Latency {
            sum_ns,
            mean_ns: sum_ns / timed,
            buckets: vec![[1_024, 2_048, timed]],
            ..Default::default()
        };
        if let Some(ClassValue::Measured(m)) = r.processes[0].classes.get_mut(&ReportClass::Faults) {
            m.latency = Some(lat(5_000_000, 1_500));
        }
        if let Some(ClassValue::Measured(m)) = r.processes[1].classes.get_mut(&ReportClass::Faults) {
            m.latency = Some(lat(2_000_000, 100));
        }
        let t = to_text(&r);
        assert!(t.contains("  time in faults: 5.00ms\n"), "{t}");
        assert!(t.contains("  time in faults: 2.00ms of 100 timed faults of 2,500\n"), "{t}");
        r.latency = Some(LatencyTier::Sample { every: 16 });
        let t = to_text(&r);
        assert!(
            t.contains(
                "time in faults: 5.00ms of 1,500 timed faults (one in 16); about 80.0ms for all 1,500"
            ),
            "{t}"
        );
        assert!(
            !t.contains("PID 3 (sh) whole run\n  CLASS")
                || !t.split("PID 3").nth(1).unwrap().contains("time in faults"),
            "{t}"
        );
    }

    /// The kernel check's numbers have separators, a negative derived
    /// count its sign.
    #[test]
    fn kernel_check_numbers_have_separators() {
        let mut k = KernelCheck {
            result: CheckResult::Derived,
            faultscope: 4_173,
            kernel_low: Some(2_062),
            kernel_high: Some(2_062),
            gup_derived: Some((-2_111, -2_111)),
            minflt: None,
            majflt: None,
            counted: "exceptions".into(),
            difference: 0,
            bracket: None,
            reason: None,
        };
        let l = check_line(&k);
        assert!(
            l.contains("derived: 4,173 exceptions, the kernel's min_flt+maj_flt 2,062: -2,111 faults"),
            "{l}"
        );
        k.result = CheckResult::Differs;
        k.difference = -1_234;
        assert!(check_line(&k).contains("DIFFERS by -1,234: 4,173 faults"), "{}", check_line(&k));
        k.difference = 12;
        assert!(check_line(&k).contains("DIFFERS by +12:"), "{}", check_line(&k));
    }

    #[test]
    fn a_sampled_or_untimed_run_says_what_the_latency_is_of() {
        let mut r = report("x86_64");
        r.mode = Mode::Kprobe;
        r.latency = Some(LatencyTier::Sample { every: 16 });
        assert!(to_text(&r).contains("P50, P99, MAX: of one fault in 16 on each CPU"), "{}", to_text(&r));
        r.latency = Some(LatencyTier::Off);
        assert!(to_text(&r).contains("no fault was timed (--latency off)"));
        r.latency = Some(LatencyTier::All);
        assert!(!to_text(&r).contains("P50, P99, MAX:"));
    }

    #[test]
    fn each_reason_once_and_no_foreign_classes() {
        let t = to_text(&report("x86_64"));
        assert_eq!(t.matches("no kprobe PMU").count(), 1, "{t}");
        assert!(!t.contains("contpte_unfold"), "{t}");
        assert!(t.contains("latency: tracepoint mode has no fault return to time"), "{t}");
        assert!(to_text(&report("aarch64")).contains("contpte_unfold"));
    }

    #[test]
    fn spurious_says_when_the_machine_cannot_keep_a_stale_entry() {
        use crate::report::schema::Provenance;
        let mut r = report("x86_64");
        r.processes[0].classes = classes(&[(ReportClass::Spurious, 3)]);
        let with = |vendor: &str, hv: Option<&str>| {
            let mut r = r.clone();
            r.provenance = Some(Provenance {
                cpu_vendor: vendor.into(),
                hypervisor: hv.map(String::from),
                ..Provenance::default()
            });
            to_text(&r)
        };
        assert!(with("AuthenticAMD", Some("KVM")).contains("spurious: on this machine only lost races"));
        assert!(with("GenuineIntel", Some("QEMU TCG")).contains("TCG keeps no stale TLB entry"));
        assert!(!with("GenuineIntel", None).contains("spurious: on this machine"));
    }
}
