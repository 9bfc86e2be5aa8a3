//! The oracle comparison of the guest stages (matrix, Redis, daemon):
//! faultscope's classes of a span against the tracefs kprobe oracle's line
//! for the same process and phase (`xtask/guest/oracle.c`).

use anyhow::{Context as _, Result};
use faultscope::report::{
    file,
    schema::{CheckResult, KernelCheck, Process, Report},
};

use crate::vm::GuestRun;
pub use faultscope_expect::{
    kernel_at_least,
    oracle::{count, parse_refused, skipped_runs, Comparison, Oracle},
    Checklist,
};

/// What checking one guest case gave: the table it printed (faultscope
/// beside each count made another way) and its failures, one line each.
pub struct CaseResult {
    pub table: String,
    pub failures: Vec<String>,
}

/// The oracle section `section` of a guest run, with the run's refused
/// events.
pub fn oracle_of(run: &GuestRun, section: &str) -> Result<Oracle> {
    Ok(Oracle::parse(run.section(section)?, parse_refused(run.markers("ORACLE-MISSING"))))
}

/// Whether a kernel check agrees with the kernel's own count: equal,
/// within its bracket, or short by no more than the program runs the
/// kernel skipped (`skipped`).
pub fn kernel_check_agrees(k: &KernelCheck, skipped: u64) -> bool {
    match k.result {
        CheckResult::Equal | CheckResult::WithinBracket => true,
        CheckResult::Differs => k.difference < 0 && k.difference.unsigned_abs() <= skipped,
        _ => false,
    }
}

/// The faultscope report of section `section` of a guest run.
pub fn report(run: &GuestRun, section: &str) -> Result<Report> {
    parse_report(section, run.section(section)?)
}

pub fn parse_report(name: &str, text: &str) -> Result<Report> {
    Ok(file::parse(name.to_string(), text)?.report)
}

/// The process `pid` of a faultscope report.
pub fn process(report: &Report, pid: u32) -> Result<&Process> {
    report.process(pid).with_context(|| format!("no process {pid} in faultscope's report"))
}

/// A report's mode as the JSON writes it.
pub fn mode_name(report: &Report) -> String {
    serde_json::to_value(report.mode).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// Why the oracle of `section` has no line for (`pid`, `phase`): its summary
/// line, the trace buffer's overrun and faultscope's output.
pub fn oracle_gap(run: &GuestRun, case: &str, section: &str, pid: u32, phase: &str) -> String {
    let text = run.section(section).unwrap_or("");
    let summary = text.lines().find(|l| l.starts_with("oracle:")).unwrap_or("no oracle summary line");
    let overrun = run.marker("OVERRUN", case).unwrap_or_else(|| "not reported".into());
    let out = run.section(&format!("{case}.out")).map(|o| crate::util::tail(o, 15)).unwrap_or_default();
    format!(
        "the oracle has no {phase} phase for pid {pid} ({summary}; trace buffer overrun {overrun}); \
         oracle section:\n{text}faultscope's output:\n{out}"
    )
}

/// A small bench run, report and guest console, for the tests of the
/// guest checks.
#[cfg(test)]
pub mod testing {
    pub use faultscope_expect::testing::*;

    use super::*;

    /// The x86 guest's refusals (lib.sh) as its console's marker lines.
    pub fn x86_refused_markers() -> String {
        x86_refused().iter().map(|(e, why)| format!("@@FS-ORACLE-MISSING {e} {why}\n")).collect()
    }

    /// A guest run whose console holds `markers` and the sections.
    pub fn guest_run(markers: &str, sections: &[(&str, &str)]) -> GuestRun {
        let mut console = markers.to_string();
        for (name, body) in sections {
            console += &format!("@@FS-BEGIN {name}\n{body}\n@@FS-END {name}\n");
        }
        GuestRun::from_console(console, std::time::Duration::ZERO)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, path::Path, process::Command};

    use faultscope::{kernel::classes::ReportClass, report::schema::Classes};
    use faultscope_expect::oracle::Row;

    use super::{testing::*, *};

    #[test]
    fn oracle_lines() {
        let o = Oracle::parse(
            "oracle unknown spurious: exc|acc\noracle tgid=5 phase=ALL faults=3 spurious=?\n\
             oracle tgid=5 phase=mark:write faults=2 wp_faults=1\njunk\n\
             oracle: 9 trace lines, 0 with an unknown tgid, 1 processes exec'd: 5; phases: mark:write\n",
            BTreeMap::new(),
        );
        assert_eq!(o.line(5, "mark:write").unwrap()["faults"], Some(2));
        assert_eq!(o.line(5, "ALL").unwrap()["spurious"], None);
        assert_eq!(o.lines.len(), 2);
        assert_eq!(o.missing["spurious"], ["exc|acc"]);
        // Alternatives: every one refused, their reasons together.
        let refused = [("exc".into(), "exc refused".into()), ("acc".into(), "acc refused".into())];
        let o = Oracle { refused: refused.into(), ..o };
        assert_eq!(o.unknown("spurious"), ["exc refused; acc refused"]);
    }

    /// An x86 guest's events: every one but the contpte ones.
    const X86: [&str; 9] = ["hmf", "hmfr", "wp", "hwp", "nar", "dsp", "acc", "hacc", "exc"];

    /// oracle.c built for this host into a new temporary directory, gone
    /// when the directory's guard drops.
    fn build_oracle() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("oracle");
        let src = crate::util::root().join("xtask/guest/oracle.c");
        let cc = Command::new("cc").args(["-O2", "-Wall", "-o"]).arg(&bin).arg(src).status().unwrap();
        assert!(cc.success());
        (dir, bin)
    }

    /// The oracle `bin` over `trace`, with the given events in a fake
    /// tracefs under `dir` (`exc` as x86's page_fault_user tracepoint,
    /// enabled).
    fn run_oracle(bin: &Path, dir: &Path, events: &[&str], trace: &str) -> String {
        run_oracle_with(bin, dir, events, trace, &[])
    }

    /// [`run_oracle`] with address ranges (`NAME=0xSTART-0xEND`).
    fn run_oracle_with(bin: &Path, dir: &Path, events: &[&str], trace: &str, ranges: &[&str]) -> String {
        let tracefs = dir.join("tracing");
        let _ = std::fs::remove_dir_all(&tracefs);
        std::fs::create_dir_all(&tracefs).unwrap();
        for e in events {
            if *e == "exc" {
                let tp = tracefs.join("events/exceptions/page_fault_user");
                std::fs::create_dir_all(&tp).unwrap();
                std::fs::write(tp.join("enable"), "1\n").unwrap();
            } else {
                std::fs::create_dir_all(tracefs.join("events/fso").join(e)).unwrap();
            }
        }
        std::fs::write(dir.join("trace"), trace).unwrap();
        let out = Command::new(bin)
            .arg(&tracefs)
            .args(ranges)
            .stdin(std::fs::File::open(dir.join("trace")).unwrap())
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn the_oracle_prints_class_names_and_unknowns() {
        let (tmp, bin) = build_oracle();
        let dir = tmp.path();
        let trace = "# tracer: nop\n\
            bench-7 (      7) [000] ..... 1.0: sched_process_exec: filename=/b pid=7 old_pid=7\n\
            bench-7 (      7) [000] ..... 1.1: hmf: (handle_mm_fault+0x0/0x8) addr=0x1000 flags=0x41 regs=0x1\n\
            bench-7 (      7) [000] ..... 1.2: wp: (do_wp_page+0x0/0x8)\n\
            bench-7 (      7) [000] ..... 1.3: hmfr: (x <- handle_mm_fault) ret=0x0\n";
        let out = run_oracle(&bin, dir, &X86, trace);
        assert!(out.starts_with(X86_UNKNOWN), "{out}");
        assert!(out.contains(&oracle_line("ALL", 1, 1, 0)), "{out}");
        // Every key but nowp and completed is a class faultscope reports.
        let o = Oracle::parse(&out, BTreeMap::new());
        let keys: Vec<&String> = o.line(7, "ALL").unwrap().keys().collect();
        assert_eq!(keys.len(), 14);
        assert!(
            keys.iter().all(|k| *k == "nowp" || *k == "completed" || ReportClass::from_name(k).is_some()),
            "{keys:?}"
        );
        // The fault was a user-mode one: all of it in the user line.
        assert_eq!(o.origin(7, "ALL", "user").unwrap()["reuse"], Some(1));
        assert_eq!(o.origin(7, "ALL", "kernel").unwrap()["faults"], Some(0));
        // Without dsp: wp_shared unknown, reuse and copy still counted.
        let out = run_oracle(&bin, dir, &X86[..5], trace);
        assert!(out.contains("oracle unknown wp_shared: dsp\n"), "{out}");
        assert!(out.contains(" reuse=1 copy=0 wp_shared=? spurious=? "), "{out}");
        assert!(out.contains("oracle unknown spurious: exc|acc\n"), "{out}");
        // arm64: no exception event (do_mem_abort blacklisted), acc enough.
        let arm = ["hmf", "hmfr", "wp", "hwp", "nar", "dsp", "acc", "conv", "unfold", "fold"];
        let out = run_oracle(&bin, dir, &arm, trace);
        assert!(!out.contains("oracle unknown"), "{out}");
        assert!(out.contains(" spurious=0 huge_pmd_wp=0 contpte_unfold=0 "), "{out}");
        // Nothing at all: every count unknown, the faults too.
        let out = run_oracle(&bin, dir, &[], trace);
        assert!(out.contains("oracle unknown faults: hmf hmfr\n"), "{out}");
        assert!(out.contains(" faults=? "), "{out}");
    }

    #[test]
    fn the_oracle_splits_faults_by_origin() {
        let (tmp, bin) = build_oracle();
        let dir = tmp.path();
        let l = |ev: &str| format!("w-7 (      7) [000] ..... 1.0: {ev}\n");
        // (flags, regs, copy?, ret): a user copy, a kernel-mode copy (read
        // into a COW page), two GUP copies (/proc/self/mem), a kernel fault
        // that failed and one that was retried.
        let faults = [
            ("0x41", "0x1", true, "0x0"),
            ("0x1", "0x1", true, "0x0"),
            ("0x1", "0x0", true, "0x0"),
            ("0x21", "0x0", true, "0x0"),
            ("0x1", "0x1", false, "0x40"),
            ("0x1", "0x1", false, "0x400"),
        ];
        let mut trace = "# tracer: nop\n".to_string() + &l("sched_process_exec: filename=/w pid=7 old_pid=7");
        for (flags, regs, copy, ret) in faults {
            trace += &l(&format!("hmf: (handle_mm_fault+0x0/0x8) addr=0x1000 flags={flags} regs={regs}"));
            if copy {
                trace += &l("wp: (do_wp_page+0x0/0x8)");
                trace += &l("nar: (folio_add_new_anon_rmap+0x0/0x8)");
            }
            trace += &l(&format!("hmfr: (x <- handle_mm_fault) ret={ret}"));
        }
        let out = run_oracle(&bin, dir, &X86, &trace);
        let o = Oracle::parse(&out, BTreeMap::new());
        let get = |origin: &str, k: &str| o.origin(7, "ALL", origin).unwrap()[k].unwrap();
        assert_eq!(o.line(7, "ALL").unwrap()["faults"], Some(6), "{out}");
        assert_eq!(o.line(7, "ALL").unwrap()["completed"], Some(4), "{out}");
        assert_eq!((get("user", "copy"), get("kernel", "copy"), get("gup", "copy")), (1, 1, 2), "{out}");
        assert_eq!((get("kernel", "faults"), get("kernel", "completed")), (3, 1), "{out}");
        // faultscope's classes against it, origin by origin.
        let v: serde_json::Value = serde_json::from_str(
            r#"{"count": 4, "origins": {"user": 1, "kernel": 1, "gup": 2}, "source": "k"}"#,
        )
        .unwrap();
        let mut classes = Classes::new();
        classes.insert(ReportClass::Copy, serde_json::from_value(v.clone()).unwrap());
        let cmp = o.compare("t", &classes, 7, "ALL").unwrap();
        assert_eq!(cmp.origin_row(ReportClass::Copy, "gup").unwrap().faultscope, Some(2));
        assert!(!cmp.failures.iter().any(|f| f.contains("copy.")), "{:?}", cmp.failures);
        let mut v = v;
        v["origins"]["kernel"] = 0.into();
        v["origins"]["user"] = 2.into();
        classes.insert(ReportClass::Copy, serde_json::from_value(v).unwrap());
        let cmp = o.compare("t", &classes, 7, "ALL").unwrap();
        assert!(
            cmp.failures.iter().any(|f| f == "t: copy.kernel: faultscope 0 != oracle 1"),
            "{:?}",
            cmp.failures
        );
    }

    #[test]
    fn the_oracle_splits_faults_by_address_range() {
        let (tmp, bin) = build_oracle();
        let dir = tmp.path();
        let l = |t: &str, ev: &str| format!("w-7 (      7) [000] ..... {t}: {ev}\n");
        let fault = |t: &str, addr: &str, flags: &str, nar: bool| {
            let mut s = l(t, &format!("hmf: (handle_mm_fault+0x0/0x8) addr={addr} flags={flags} regs=0x1"));
            if flags == "0x41" {
                s += &l(t, "wp: (do_wp_page+0x0/0x8)");
            }
            if nar {
                s += &l(t, "nar: (folio_add_new_anon_rmap+0x0/0x8)");
            }
            s + &l(t, "hmfr: (x <- handle_mm_fault) ret=0x0")
        };
        let trace = "# tracer: nop\n".to_string()
            + &l("1.0", "sched_process_exec: filename=/w pid=7 old_pid=7")
            // A reuse in a (and in all), before any phase marker.
            + &fault("1.1", "0x1000", "0x41", false)
            + &l("1.2", "tracing_mark_write: faultscope phase mark:write")
            // A copy at the last byte of b, a read fault in all only, a
            // reuse past all, a copy at b's (exclusive) end.
            + &fault("1.3", "0x2fff", "0x41", true)
            + &fault("1.4", "0x5000", "0x40", false)
            + &fault("1.5", "0x20000", "0x41", false)
            + &fault("1.6", "0x3000", "0x41", true);
        let ranges = ["a=0x1000-0x2000", "b=0x2000-0x3000", "all=0x0-0x10000", "none=0x40000-0x50000"];
        let plain = run_oracle(&bin, dir, &X86, &trace);
        let out = run_oracle_with(&bin, dir, &X86, &trace, &ranges);
        // The oracle's own lines are unchanged by ranges.
        let own: Vec<&str> = out.lines().filter(|l| !l.starts_with("oracle-range ")).collect();
        assert!(!out.contains("oracle-origin tgid=7 phase=ALL range="), "{out}");
        assert_eq!(own, plain.lines().collect::<Vec<_>>());
        let line = |phase: &str, range: &str, f: u64, wp: u64, r: u64, c: u64| {
            format!(
                "oracle-range tgid=7 phase={phase} range={range} faults={f} wp_faults={wp} reuse={r} copy={c} \
                 wp_shared=0 spurious=0 huge_pmd_wp=0 nowp=0 completed={f}\n"
            )
        };
        for want in [
            line("ALL", "a", 1, 1, 1, 0),
            line("mark:write", "a", 0, 0, 0, 0),
            line("ALL", "b", 1, 1, 0, 1),
            line("mark:write", "b", 1, 1, 0, 1),
            line("ALL", "all", 4, 3, 1, 2),
            line("mark:write", "all", 3, 2, 0, 2),
            line("ALL", "none", 0, 0, 0, 0),
        ] {
            assert!(out.contains(&want), "no {want:?} in\n{out}");
        }
        let o = Oracle::parse(&out, BTreeMap::new());
        assert_eq!(o.range(7, "ALL", "all").unwrap()["copy"], Some(2));
        assert_eq!(o.range(7, "mark:write", "b").unwrap()["faults"], Some(1));
        assert_eq!(o.line(7, "ALL").unwrap()["faults"], Some(5));
        assert_eq!(o.ranges.len(), 8);
        // Unknown counts stay unknown in ranges: no nar, no reuse or copy.
        let out = run_oracle_with(&bin, dir, &X86[..4], &trace, &ranges[..1]);
        assert!(
            out.contains("oracle-range tgid=7 phase=ALL range=a faults=1 wp_faults=1 reuse=? copy=? "),
            "{out}"
        );
        // A malformed range is refused.
        for bad in ["a=0x2000-0x1000", "=0x1-0x2", "a=0x1", "a=x-0x2"] {
            let st = Command::new(&bin)
                .arg(dir.join("tracing"))
                .arg(bad)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            assert_eq!(st.status.code(), Some(2), "{bad}");
        }
    }

    #[test]
    fn a_fault_between_a_marks_two_markers_may_be_on_either_side() {
        let (tmp, bin) = build_oracle();
        let dir = tmp.path();
        let l = |ev: &str| format!("w-7 (      7) [000] ..... 1.0: {ev}\n");
        let fault = |regs: &str| {
            l(&format!("hmf: (handle_mm_fault+0x0/0x8) addr=0x1000 flags=0x41 regs={regs}"))
                + &l("wp: (do_wp_page+0x0/0x8)")
                + &l("hmfr: (x <- handle_mm_fault) ret=0x0")
        };
        // A reuse in mark:a, one between mark:b's two
        // markers, two in mark:b, one in the window before mark:c.
        let trace = "# tracer: nop\n".to_string()
            + &l("sched_process_exec: filename=/w pid=7 old_pid=7")
            + &l("tracing_mark_write: faultscope phase mark:a")
            + &fault("0x1")
            + &l("tracing_mark_write: faultscope phase-switch mark:b")
            + &fault("0x1")
            + &l("tracing_mark_write: faultscope phase mark:b")
            + &fault("0x1")
            + &fault("0x1")
            + &l("tracing_mark_write: faultscope phase-switch mark:c")
            + &fault("0x1")
            + &l("tracing_mark_write: faultscope phase mark:c");
        let out = run_oracle(&bin, dir, &X86, &trace);
        let o = Oracle::parse(&out, BTreeMap::new());
        assert_eq!(o.phases, ["mark:a", "mark:b", "mark:c"], "{out}");
        // Each window in the phase before, for the oracle; none before a
        // phase whose marker came alone.
        let faults = |p: &str| o.line(7, p).unwrap()["faults"].unwrap();
        assert_eq!((faults("mark:a"), faults("mark:b"), faults("mark:c")), (2, 3, 0), "{out}");
        assert!(out.contains("oracle-window tgid=7 phase=mark:b faults=1 wp_faults=1 reuse=1 "), "{out}");
        assert!(!out.contains("oracle-window tgid=7 phase=mark:a "), "{out}");
        assert_eq!(o.windows[&(7, "mark:c".into(), "kernel".into())]["faults"], Some(0), "{out}");
        // faultscope's count of mark:b may take its window's fault or leave
        // it to mark:a, and may give mark:c's window fault to mark:c: 2 to
        // 4; nothing outside that.
        let reuses = |n: u64| {
            let mut c = Classes::new();
            for m in [ReportClass::Faults, ReportClass::WpFaults, ReportClass::Reuse] {
                let v = serde_json::json!({"count": n, "origins": {"user": n}, "source": "k"});
                c.insert(m, serde_json::from_value(v).unwrap());
            }
            for m in [ReportClass::Copy, ReportClass::WpShared, ReportClass::Spurious, ReportClass::HugePmdWp]
            {
                c.insert(m, serde_json::from_value(serde_json::json!({"count": 0, "source": "k"})).unwrap());
            }
            c
        };
        for (n, agrees) in [(1, false), (2, true), (3, true), (4, true), (5, false)] {
            let c = o.compare("t", &reuses(n), 7, "mark:b").unwrap();
            assert_eq!(c.failures.is_empty(), agrees, "{n}: {:?}", c.failures);
        }
        let c = o.compare("t", &reuses(1), 7, "mark:b").unwrap();
        assert_eq!(c.row(ReportClass::Faults).unwrap().oracle_cell(), "3[2..4]");
        // mark:a: 1 (its window fault in mark:b) or 2; never 3.
        for (n, agrees) in [(1, true), (2, true), (3, false)] {
            assert_eq!(o.compare("t", &reuses(n), 7, "mark:a").unwrap().failures.is_empty(), agrees, "{n}");
        }
    }

    #[test]
    fn the_refused_events_come_from_the_run() {
        let text = format!("{X86_UNKNOWN}{}", oracle_line("ALL", 39, 20, 1));
        let run = guest_run(&x86_refused_markers(), &[("c.oracle", &text)]);
        let o = oracle_of(&run, "c.oracle").unwrap();
        assert_eq!(o.refused.keys().collect::<Vec<_>>(), ["accc", "conv", "fold", "unfold"]);
        assert_eq!(o.line(7, "ALL").unwrap()["reuse"], Some(20));
        assert_eq!(o.unknown("contpte_fold"), ["contpte is arm64 only"]);
    }

    #[test]
    fn a_bench_step_against_its_oracle_line() {
        let r = parse_report("bench.json", &bench_json()).unwrap();
        let p = process(&r, 7).unwrap();
        // The fork step: its mark and the fork's automatic phases.
        let step = p.span("mark:fork").unwrap();
        let line =
            X86_UNKNOWN.to_string() + &oracle_line("mark:fork", 3, 0, 1).replace(" copy=1 ", " copy=2 ");
        let run = guest_run(&x86_refused_markers(), &[("c.oracle", &line)]);
        let oracle = oracle_of(&run, "c.oracle").unwrap();
        let c = oracle.compare("k c mark:fork", &step.classes, 7, "mark:fork").unwrap();
        // The line's classes, in the catalogue's order.
        let order: Vec<ReportClass> = ReportClass::ALL.into_iter().filter(|m| c.row(*m).is_some()).collect();
        assert_eq!(c.rows.iter().map(|r| r.metric).collect::<Vec<_>>(), order);
        assert_eq!(c.rows.len(), 12);
        assert!(c.row(ReportClass::WriteFaults).is_none());
        // Equal (the mark's 2 and the child-alive phase's 1).
        assert_eq!(
            c.row(ReportClass::Faults),
            Some(&Row {
                metric: ReportClass::Faults,
                origin: None,
                faultscope: Some(3),
                oracle: Some(3),
                over_by: 0,
                short_by: 0
            })
        );
        // Unequal.
        assert_eq!(
            c.row(ReportClass::Copy),
            Some(&Row {
                metric: ReportClass::Copy,
                origin: None,
                faultscope: Some(1),
                oracle: Some(2),
                over_by: 0,
                short_by: 0
            })
        );
        // Unknown to the oracle and not measurable: they agree.
        assert_eq!(
            c.row(ReportClass::ContpteUnfold),
            Some(&Row {
                metric: ReportClass::ContpteUnfold,
                origin: None,
                faultscope: None,
                oracle: None,
                over_by: 0,
                short_by: 0
            })
        );
        assert_eq!(c.failures, ["k c mark:fork: copy: faultscope 1 != oracle 2"]);
        assert_eq!(c.unknown.iter().collect::<Vec<_>>(), ["contpte is arm64 only"]);
        let table = c.table("class");
        assert!(table.contains("\n  copy                          1          2\n"), "{table}");
        assert!(table.contains("\n  contpte_unfold              n/m          -\n"), "{table}");
        assert!(!table.contains("nowp"), "{table}");
        assert!(oracle.compare("x", &step.classes, 8, "mark:fork").is_none());
        // Short by one where the kernel skipped a program run: noted, not
        // failed; never more than it skipped, never long.
        let mut skipped = r.clone();
        skipped.drops.set(faultscope::kernel::drops::DropReason::SkippedRuns, 1);
        let c = oracle.compare("k c mark:fork", &step.classes, 7, "mark:fork").unwrap();
        let c = c.allowing_skipped("k c mark:fork", &skipped);
        assert!(c.failures.is_empty(), "{:?}", c.failures);
        assert!(c
            .unknown
            .iter()
            .any(|u| u.starts_with("k c mark:fork: copy: short by no more than the 1 program runs")));
        let long =
            X86_UNKNOWN.to_string() + &oracle_line("mark:fork", 3, 0, 1).replace(" copy=1 ", " copy=0 ");
        let run = guest_run(&x86_refused_markers(), &[("c.oracle", &long)]);
        let c = oracle_of(&run, "c.oracle").unwrap().compare("l", &step.classes, 7, "mark:fork").unwrap();
        assert_eq!(c.allowing_skipped("l", &skipped).failures, ["l: copy: faultscope 1 != oracle 0"]);
        let mut k: KernelCheck = serde_json::from_value(serde_json::json!({
            "result": "differs", "faultscope": 9, "counted": "t", "difference": -1
        }))
        .unwrap();
        assert!(kernel_check_agrees(&k, 1) && !kernel_check_agrees(&k, 0));
        k.difference = 1;
        assert!(!kernel_check_agrees(&k, 5), "a skipped run never adds a count");

        // The oracle counts contpte (arm64), faultscope cannot.
        let all = Oracle::parse(&oracle_line("ALL", 39, 20, 1).replace("=?", "=0"), BTreeMap::new());
        let c = all.compare("fork4k", &p.classes, 7, "ALL").unwrap();
        assert_eq!(c.failures.len(), 5, "{:?}", c.failures);
        assert!(c.failures.contains(&"fork4k: contpte_unfold: faultscope n/m != oracle 0".to_string()));
        // The oracle cannot count a class faultscope measured.
        let refused = [("dsp".to_string(), "no symbol".to_string())].into();
        let text = "oracle unknown wp_shared: dsp\n".to_string()
            + &oracle_line("ALL", 39, 20, 1).replace("wp_shared=0", "wp_shared=?");
        let c = Oracle::parse(&text, refused).compare("x", &p.classes, 7, "ALL").unwrap();
        assert!(c.failures.contains(&"x: wp_shared: faultscope 0 != oracle -".to_string()));
        assert!(c.unknown.contains("no symbol"), "{:?}", c.unknown);
        // A class the line lacks is not compared.
        let c = Oracle::parse("oracle tgid=7 phase=ALL faults=39\n", BTreeMap::new())
            .compare("x", &p.classes, 7, "ALL")
            .unwrap();
        assert_eq!(c.rows.len(), 1);
        assert!(c.failures.is_empty());
    }

    #[test]
    fn the_bench_steps_own_numbers_read_back() {
        let r = parse_report("b.json", &bench_json()).unwrap();
        assert_eq!(r.bench.as_ref().unwrap().step("write").unwrap().wall_ns, 5000);
        assert_eq!(
            r.bench_process().unwrap().span("mark:write").unwrap().count(ReportClass::Reuse),
            Some(20)
        );
        assert_eq!(mode_name(&r), "kprobe");
        let e = parse_report("b.json", &bench_json().replace("\"steps\"", "\"phases\"")).unwrap_err();
        assert!(e.to_string().contains("malformed report"), "{e}");
    }
}
