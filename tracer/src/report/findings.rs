//! Diagnosis: rules that turn a report's counts into plain findings, each
//! with the numbers it rests on.

use crate::term::safe;
use std::collections::BTreeMap;

use super::schema::{
    present_write_faults, Attribution, Bench, CheckResult, ClassValue, Finding, Number, Process, Report, Span,
};
use crate::kernel::classes::ReportClass;

/// COW copies while a child lives that are worth saying.
const COPY_NOTABLE: u64 = 16;

fn numbers<const N: usize>(kv: [(&str, Number); N]) -> BTreeMap<String, Number> {
    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Where the events of `m` in a span happened: its top mapping (name and
/// address range, share of `total`) and top site, as a clause to append.
fn where_(a: &Attribution, m: ReportClass, total: u64) -> String {
    let mut s = String::new();
    if let Some((row, n)) = a.top_mapping(m).filter(|_| total > 0) {
        // An unnamed range is named by its addresses already.
        let range = if row.mapping.starts_with("anon 0x") {
            String::new()
        } else {
            format!(" [{:#x}-{:#x}]", row.start, row.end)
        };
        s.push_str(&format!(
            "; {:.0}% ({n}) in {}{range}",
            100.0 * n as f64 / total as f64,
            safe(&row.mapping)
        ));
    }
    if let Some(site) = a.top_site(m) {
        let via = site.syscall.as_deref().map(|c| format!(" by {c}")).unwrap_or_default();
        s.push_str(&format!("; top site {}{via} ({} of them)", safe(&site.site), site.count));
    }
    // Which kernel path did it (the contpte classes' kernel stacks).
    if let Some(st) = a.stacks.iter().filter(|x| x.class == m && !x.kernel.is_empty()).max_by_key(|x| x.count)
    {
        let callers: Vec<&str> = st.kernel.iter().rev().skip(1).take(2).map(String::as_str).collect();
        if !callers.is_empty() {
            s.push_str(&format!("; called from {}", safe(&callers.join(" <- "))));
        }
    }
    s
}

fn folio_bytes(r: &Report) -> Option<u64> {
    r.bench.as_ref().and_then(|b| crate::units::parse_size(&b.folio).ok())
}

/// A finding of a span, before it is placed (process, phase).
struct Draft {
    rule: &'static str,
    text: String,
    numbers: BTreeMap<String, Number>,
}

fn draft(rule: &'static str, text: String, numbers: BTreeMap<String, Number>) -> Option<Draft> {
    Some(Draft { rule, text, numbers })
}

/// What a span's rules look at.
struct SpanCtx<'a> {
    p: &'a Process,
    s: &'a Span,
    /// A bench's large folio size and its run (a folio above the base page).
    folio: Option<(u64, &'a Bench)>,
    child_exited: bool,
}

impl SpanCtx<'_> {
    fn c(&self, m: ReportClass) -> Option<u64> {
        self.s.count(m)
    }
    fn n(&self, m: ReportClass) -> u64 {
        self.c(m).unwrap_or(0)
    }
}

/// The rules over each span (phase or step), in the order their findings
/// are listed.
const SPAN_RULES: [fn(&SpanCtx) -> Option<Draft>; 9] = [
    large_folio_reuse_per_page,
    large_folio_reuse_whole,
    large_folio_copy_after_exit,
    spurious_write_faults,
    contpte_unfold,
    shared_write_notify,
    copy_by_the_kernel,
    copy_while_child_alive,
    wp_while_child_alive,
];

pub fn findings(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    let folio = folio_bytes(r).filter(|f| *f > crate::units::PAGE).zip(r.bench.as_ref());
    let child_exited = r.bench.as_ref().is_some_and(|b| b.child == "exit");
    for p in &r.processes {
        for s in p.spans() {
            let cx = SpanCtx { p, s: &s, folio, child_exited };
            for d in SPAN_RULES.iter().filter_map(|rule| rule(&cx)) {
                out.push(Finding {
                    rule: d.rule.into(),
                    pid: p.pid,
                    phase: s.name.clone(),
                    text: d.text,
                    numbers: d.numbers,
                });
            }
        }
        out.extend(kernel_check_differs(p));
        out.extend(not_measurable(p));
    }
    out
}

/// A bench's write step over large folios: its folios, their size, pages
/// per folio, and the size's label.
fn write_step<'a>(cx: &SpanCtx<'a>) -> Option<(u64, u64, String, &'a Bench)> {
    let (f, b) = cx.folio?;
    (cx.s.name == "mark:write").then(|| (b.folios.max(1), f / crate::units::PAGE, crate::units::size(f), b))
}

fn large_folio_reuse_per_page(cx: &SpanCtx) -> Option<Draft> {
    let (folios, per, label, _) = write_step(cx)?;
    let reuse = cx.n(ReportClass::Reuse);
    let ratio = reuse as f64 / folios as f64;
    (ratio >= 2.0).then_some(())?;
    draft(
        "large-folio-reuse-per-page",
        format!(
            "{label} folios are reused page by page: {ratio:.1} reuse faults per folio ({reuse} for {folios} folios of {per} pages); reusing the whole exclusive folio would take 1 per folio"
        ),
        numbers([("reuse", reuse.into()), ("folios", folios.into()), ("pages_per_folio", per.into())]),
    )
}

/// The shape a kernel that reuses the whole exclusive folio gives: one
/// reuse fault per folio (plus the bench's own few).
fn large_folio_reuse_whole(cx: &SpanCtx) -> Option<Draft> {
    let (folios, per, label, _) = write_step(cx)?;
    let (reuse, copy) = (cx.n(ReportClass::Reuse), cx.n(ReportClass::Copy));
    let ratio = reuse as f64 / folios as f64;
    (reuse >= folios && ratio < 2.0 && copy < folios).then_some(())?;
    let contpte = match cx.c(ReportClass::ContpteUnfold) {
        Some(0) => "; no contpte block was unfolded",
        _ => "",
    };
    draft(
        "large-folio-reuse-whole",
        format!(
            "whole-folio reuse: {ratio:.1} reuse fault per {label} folio ({reuse} for {folios} folios of {per} pages): one fault made the whole exclusive folio writable{contpte}"
        ),
        numbers([("reuse", reuse.into()), ("folios", folios.into()), ("pages_per_folio", per.into())]),
    )
}

fn large_folio_copy_after_exit(cx: &SpanCtx) -> Option<Draft> {
    let (folios, _, label, _) = write_step(cx)?;
    let copy = cx.n(ReportClass::Copy);
    (cx.child_exited && copy as f64 / folios as f64 >= 2.0).then_some(())?;
    draft(
        "large-folio-copy-after-exit",
        format!(
            "{label} folios are copied page by page after fork although the child has exited: {copy} copies, {:.1} per folio; this kernel does not reuse large anonymous folios",
            copy as f64 / folios as f64
        ),
        numbers([("copy", copy.into()), ("folios", folios.into())]),
    )
}

fn spurious_write_faults(cx: &SpanCtx) -> Option<Draft> {
    let sp = cx.c(ReportClass::Spurious).filter(|n| *n > 0)?;
    let present = present_write_faults(|m| cx.c(m));
    let pct = 100.0 * sp as f64 / present as f64;
    draft(
        "spurious-write-faults",
        format!(
            "spurious write faults were {pct:.1}% of write faults on present pages ({sp} of {present}): the PTE was already writable; likely stale read-only TLB entries (pages read since fork, or stores run ahead speculatively while an earlier store faulted), or threads racing on the same pages{}",
            where_(&cx.s.attribution, ReportClass::Spurious, sp)
        ),
        numbers([("spurious", sp.into()), ("present_write_faults", present.into()), ("percent", pct.into())]),
    )
}

fn contpte_unfold(cx: &SpanCtx) -> Option<Draft> {
    let unfold = cx.c(ReportClass::ContpteUnfold).filter(|n| *n > 0)?;
    // Folds anywhere later in the run count as "folded again".
    let folded = cx.p.count(ReportClass::ContpteFold);
    let tail = match folded {
        Some(0) => ", and none was folded again in the run".to_string(),
        Some(n) => format!(", and {n} blocks were folded in the run"),
        None => String::new(),
    };
    let via = cx
        .c(ReportClass::ContpteTryUnfold)
        .map(|t| format!(", {t} through __contpte_try_unfold"))
        .unwrap_or_default();
    let mut n = numbers([("contpte_unfold", unfold.into())]);
    if let Some(f) = folded {
        n.insert("contpte_fold".into(), f.into());
    }
    draft(
        "contpte-unfold",
        format!(
            "{unfold} contpte blocks were unfolded{via}{tail}{}",
            where_(&cx.s.attribution, ReportClass::ContpteUnfold, unfold)
        ),
        n,
    )
}

/// Write-protect faults that are not COW at all: a reader who sums reuse +
/// copy would miss them.
fn shared_write_notify(cx: &SpanCtx) -> Option<Draft> {
    let shared = cx.c(ReportClass::WpShared).filter(|n| *n > 0)?;
    let mut n = numbers([("wp_shared", shared.into())]);
    if let Some(wp) = cx.c(ReportClass::WpFaults) {
        n.insert("wp_faults".into(), wp.into());
    }
    draft(
        "shared-write-notify",
        format!(
            "{shared} write-protect faults were on shared mappings (write-notify for dirty tracking: writeback, soft-dirty or page_mkwrite), not COW reuse or copy"
        ),
        n,
    )
}

/// COW copies only the kernel took: a read(2) or recv(2) into memory
/// shared with a child, get_user_pages (O_DIRECT, io_uring,
/// /proc/PID/mem). A user-mode view misses them.
fn copy_by_the_kernel(cx: &SpanCtx) -> Option<Draft> {
    let by = |o| cx.s.classes.get(&ReportClass::Copy).and_then(|v| v.origin_count(o)).unwrap_or(0);
    let (kernel, gup) = (by("kernel"), by("gup"));
    (kernel + gup >= COPY_NOTABLE).then_some(())?;
    let site =
        cx.s.attribution
            .sites
            .iter()
            .filter(|x| x.class == ReportClass::Copy && x.syscall.is_some())
            .max_by_key(|x| (x.count, std::cmp::Reverse(x.ip)))
            .map(|x| {
                format!(
                    "; top: {} by {} from {} ({} of them)",
                    x.mapping.as_deref().map(safe).unwrap_or_else(|| "?".into()),
                    x.syscall.as_deref().unwrap_or("?"),
                    safe(&x.site),
                    x.count
                )
            })
            .unwrap_or_default();
    draft(
        "copy-by-the-kernel",
        format!(
            "{} COW copies were taken by the kernel for the process, not in user mode: {kernel} inside system calls (copy_to_user), {gup} by get_user_pages{site}",
            kernel + gup
        ),
        numbers([("copy_kernel", kernel.into()), ("copy_gup", gup.into())]),
    )
}

/// A handful of copies is the process's own bookkeeping after fork (stack,
/// heap), not a finding.
fn copy_while_child_alive(cx: &SpanCtx) -> Option<Draft> {
    let copy = cx.n(ReportClass::Copy);
    (copy >= COPY_NOTABLE && cx.s.child_alive).then_some(())?;
    draft(
        "copy-while-child-alive",
        format!(
            "{copy} COW copies while a forked child shared the memory{}",
            where_(&cx.s.attribution, ReportClass::Copy, copy)
        ),
        numbers([("copy", copy.into())]),
    )
}

/// Where copies cannot be told from reuses (tracepoint mode: the error
/// code says a write hit a present page, not what the kernel did), the
/// write-protect faults while a forked child shared the memory, hedged.
fn wp_while_child_alive(cx: &SpanCtx) -> Option<Draft> {
    let wp = cx.n(ReportClass::WpFaults);
    (cx.c(ReportClass::Copy).is_none() && wp >= COPY_NOTABLE && cx.s.child_alive).then_some(())?;
    let child = match cx.s.name.split_whitespace().next() {
        Some(f) if f.starts_with("fork#") => format!("the child of {f}"),
        _ => "a forked child".to_string(),
    };
    draft(
        "wp-while-child-alive",
        format!(
            "{wp} write-protect faults while {child} was alive{}: COW copies or reuses (and any spurious write faults); telling them apart needs kprobes or fentry",
            where_(&cx.s.attribution, ReportClass::WpFaults, wp)
        ),
        numbers([("wp_faults", wp.into())]),
    )
}

/// Once per process: the kernel's own count disagrees.
fn kernel_check_differs(p: &Process) -> Option<Finding> {
    let k = p.kernel_check.as_ref().filter(|k| k.result == CheckResult::Differs)?;
    Some(Finding {
        rule: "kernel-check-differs".into(),
        pid: p.pid,
        phase: "whole run".into(),
        text: super::text::check_line(k),
        numbers: numbers([
            ("faultscope", k.faultscope.into()),
            ("kernel_low", k.kernel_low.unwrap_or(0).into()),
            ("kernel_high", k.kernel_high.unwrap_or(0).into()),
        ]),
    })
}

/// Once per process: what could not be measured.
fn not_measurable(p: &Process) -> Vec<Finding> {
    [ReportClass::Reuse, ReportClass::Copy, ReportClass::Spurious]
        .into_iter()
        .filter_map(|m| match p.classes.get(&m) {
            Some(ClassValue::NotMeasurable(n)) => Some(Finding {
                rule: "not-measurable".into(),
                pid: p.pid,
                phase: "whole run".into(),
                text: format!("{m} is not measurable on this kernel: {}", n.reason),
                numbers: BTreeMap::new(),
            }),
            _ => None,
        })
        .collect()
}

/// Adds `findings[]` to a report being written; returns them as text.
pub fn attach(report: &mut Report) -> String {
    report.findings = findings(report);
    to_text(&report.findings)
}

/// The findings, each once: the same finding of several processes is one
/// line with their number and pids. `not-measurable` findings stay in the
/// JSON; the text's "Not measurable here" block already says them.
pub fn to_text(f: &[Finding]) -> String {
    let mut groups: Vec<(&Finding, Vec<u32>)> = Vec::new();
    for x in f.iter().filter(|x| x.rule != "not-measurable") {
        match groups.iter_mut().find(|(g, _)| g.rule == x.rule && g.phase == x.phase && g.text == x.text) {
            Some((_, pids)) => pids.push(x.pid),
            None => groups.push((x, vec![x.pid])),
        }
    }
    let mut s = String::from("Findings:\n");
    if groups.is_empty() {
        s.push_str("  none\n");
    }
    for (x, pids) in groups {
        let who = match pids.as_slice() {
            [pid] => format!("pid {pid}"),
            many => {
                let shown: Vec<String> = many.iter().take(8).map(u32::to_string).collect();
                let more = if many.len() > 8 { ", ..." } else { "" };
                format!("{} processes (pids {}{more})", many.len(), shown.join(", "))
            }
        };
        s.push_str(&format!(
            "  [{}] {who} {}: {}\n",
            x.rule,
            crate::term::safe(&x.phase),
            crate::term::safe(&x.text)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{
        testing::{classes, not_measurable, phase, process},
        Bench, PhaseKind,
    };

    fn report(folio: &str, child: &str, write: &[(ReportClass, u64)]) -> Report {
        let mut p = process(
            9,
            vec![
                phase("mark:fork", PhaseKind::Mark, classes(&[(ReportClass::Copy, 0)])),
                phase("fork#1 child-alive", PhaseKind::ChildAlive, classes(&[(ReportClass::Copy, 30)])),
                phase("mark:write", PhaseKind::Mark, classes(write)),
            ],
        );
        p.classes = classes(write);
        Report {
            bench: Some(Bench { folio: folio.into(), folios: 1024, child: child.into(), ..Bench::default() }),
            processes: vec![p],
            ..Report::default()
        }
    }

    fn rules(r: &Report) -> Vec<String> {
        findings(r).into_iter().map(|f| f.rule).collect()
    }

    #[test]
    fn reuse_page_by_page() {
        let r = report(
            "64K",
            "exit",
            &[(ReportClass::Reuse, 16384), (ReportClass::Copy, 2), (ReportClass::Spurious, 0)],
        );
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "large-folio-reuse-per-page").unwrap();
        assert_eq!(x.phase, "mark:write");
        assert!(x.text.contains("16.0 reuse faults per folio"), "{}", x.text);
        // 4K pages: nothing to say about reuse.
        let r = report("4K", "exit", &[(ReportClass::Reuse, 16384)]);
        assert!(!rules(&r).contains(&"large-folio-reuse-per-page".into()));
    }

    #[test]
    fn whole_folio_reuse() {
        // 64K: 1,030 reuse faults for 1,024 folios (the bench's own few on top).
        let r = report(
            "64K",
            "exit",
            &[(ReportClass::Reuse, 1030), (ReportClass::Copy, 2), (ReportClass::ContpteUnfold, 0)],
        );
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "large-folio-reuse-whole").unwrap();
        assert_eq!(x.phase, "mark:write");
        assert_eq!(
            x.text,
            "whole-folio reuse: 1.0 reuse fault per 64K folio (1030 for 1024 folios of 16 pages): one fault made the whole exclusive folio writable; no contpte block was unfolded"
        );
        assert_eq!(x.numbers["reuse"], Number::Int(1030));
        assert!(!rules(&r).contains(&"large-folio-reuse-per-page".into()));
        // x86: contpte not measurable, nothing said of it.
        let r = report("2M", "exit", &[(ReportClass::Reuse, 1036)]);
        let x = findings(&r).into_iter().find(|f| f.rule == "large-folio-reuse-whole").unwrap();
        assert!(
            x.text.ends_with("folios of 512 pages): one fault made the whole exclusive folio writable"),
            "{}",
            x.text
        );
        // Page by page, copied, or 4K pages: not this shape.
        for (folio, w) in [
            ("64K", [(ReportClass::Reuse, 16384), (ReportClass::Copy, 0)]),
            ("64K", [(ReportClass::Reuse, 10), (ReportClass::Copy, 16390)]),
            ("64K", [(ReportClass::Reuse, 1030), (ReportClass::Copy, 15360)]),
            ("4K", [(ReportClass::Reuse, 1030), (ReportClass::Copy, 0)]),
        ] {
            let r = report(folio, "exit", &w);
            assert!(!rules(&r).contains(&"large-folio-reuse-whole".into()), "{folio} {w:?}");
        }
    }

    #[test]
    fn copy_after_exit() {
        let r = report("64K", "exit", &[(ReportClass::Reuse, 10), (ReportClass::Copy, 16390)]);
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "large-folio-copy-after-exit").unwrap();
        assert!(x.text.contains("16.0 per folio"), "{}", x.text);
        // With the child alive, copies are expected: no such finding.
        let r = report("64K", "alive", &[(ReportClass::Copy, 16390)]);
        assert!(!rules(&r).contains(&"large-folio-copy-after-exit".into()));
    }

    #[test]
    fn shared_write_notify_is_said_apart_from_cow() {
        let r = report("4K", "exit", &[(ReportClass::WpFaults, 4100), (ReportClass::WpShared, 4096)]);
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "shared-write-notify").unwrap();
        assert_eq!(x.phase, "mark:write");
        assert!(x.text.starts_with("4096 write-protect faults were on shared mappings"), "{}", x.text);
        assert_eq!(x.numbers["wp_faults"], Number::Int(4100));
        let r = report("4K", "exit", &[(ReportClass::WpShared, 0)]);
        assert!(!rules(&r).contains(&"shared-write-notify".into()));
    }

    #[test]
    fn spurious_share() {
        let r = report(
            "4K",
            "exit",
            &[(ReportClass::WpFaults, 900), (ReportClass::Spurious, 100), (ReportClass::HugePmdWp, 0)],
        );
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "spurious-write-faults").unwrap();
        assert!(
            x.text.starts_with(
                "spurious write faults were 10.0% of write faults on present pages (100 of 1000)"
            ),
            "{}",
            x.text
        );
    }

    #[test]
    fn contpte_never_folded() {
        let r = report(
            "64K",
            "exit",
            &[
                (ReportClass::ContpteUnfold, 512),
                (ReportClass::ContpteFold, 0),
                (ReportClass::ContpteTryUnfold, 0),
            ],
        );
        let x = findings(&r).into_iter().find(|f| f.rule == "contpte-unfold").unwrap();
        assert!(
            x.text.starts_with("512 contpte blocks were unfolded, 0 through __contpte_try_unfold, and none was folded again in the run"),
            "{}",
            x.text
        );
        let r = report("64K", "exit", &[(ReportClass::ContpteUnfold, 512), (ReportClass::ContpteFold, 88)]);
        let x = findings(&r).into_iter().find(|f| f.rule == "contpte-unfold").unwrap();
        assert!(x.text.contains("and 88 blocks were folded in the run"), "{}", x.text);
    }

    #[test]
    fn findings_say_where() {
        use crate::report::schema::{MappingRow, SiteRow};
        let mut r = report("4K", "exit", &[]);
        let alive = &mut r.processes[0].phases[1];
        alive.attribution.mappings = vec![
            MappingRow {
                mapping: "[heap]".into(),
                start: 0x1000,
                end: 0x9000,
                size: 0x8000,
                exact: true,
                counts: [(ReportClass::Copy, 27)].into(),
            },
            MappingRow {
                mapping: "[stack]".into(),
                start: 0x7f00,
                end: 0x8000,
                size: 0x100,
                exact: true,
                counts: [(ReportClass::Copy, 3)].into(),
            },
        ];
        alive.attribution.sites = vec![SiteRow {
            class: ReportClass::Copy,
            ip: 0x42,
            site: "zmalloc+0x3c (redis-server)".into(),
            mapping: Some("[heap]".into()),
            syscall: None,
            count: 20,
        }];
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "copy-while-child-alive").unwrap();
        assert!(
            x.text.ends_with(
                "; 90% (27) in [heap] [0x1000-0x9000]; top site zmalloc+0x3c (redis-server) (20 of them)"
            ),
            "{}",
            x.text
        );
    }

    #[test]
    fn copies_while_child_alive_and_not_measurable() {
        let mut r = report("64K", "exit", &[]);
        r.processes[0].classes.insert(ReportClass::Spurious, not_measurable("no kprobe PMU"));
        let f = findings(&r);
        assert!(f.iter().any(|f| f.rule == "copy-while-child-alive"
            && f.phase == "mark:fork"
            && f.text.starts_with("30 COW")));
        assert!(f.iter().any(|f| f.rule == "not-measurable" && f.text.contains("no kprobe PMU")));
        r.processes[0].classes.clear();
        assert!(!rules(&r).contains(&"not-measurable".into()));
        // A few copies (the process's own stack and heap) are not a finding.
        r.processes[0].phases[1].classes = classes(&[(ReportClass::Copy, 3)]);
        assert!(!rules(&r).contains(&"copy-while-child-alive".into()));
    }

    /// Tracepoint mode: the write-protect faults while the child lived,
    /// hedged, where copies are not measurable; never beside a measured
    /// copy count, nor for a handful.
    #[test]
    fn write_protect_faults_while_child_alive_hedged_in_tracepoint_mode() {
        let mut r = report("4K", "exit", &[]);
        let tp = |wp: u64| {
            let mut c = classes(&[(ReportClass::WpFaults, wp)]);
            c.insert(ReportClass::Copy, not_measurable("needs fault_entry"));
            c
        };
        r.processes[0].phases[0].classes = tp(0);
        r.processes[0].phases[1].classes = tp(128_033);
        let f = findings(&r);
        let hedged: Vec<_> = f.iter().filter(|f| f.rule == "wp-while-child-alive").collect();
        assert_eq!(hedged.len(), 1, "{f:?}");
        assert!(
            hedged[0].text.starts_with("128033 write-protect faults while a forked child was alive")
                && hedged[0].text.contains("telling them apart needs kprobes or fentry"),
            "{}",
            hedged[0].text
        );
        // The phase of the fork itself names it.
        r.processes[0].phases.remove(0);
        let f = findings(&r);
        assert!(f.iter().any(|f| f.text.contains("while the child of fork#1 was alive")), "{f:?}");
        r.processes[0].phases[0].classes = tp(3);
        assert!(!rules(&r).contains(&"wp-while-child-alive".into()));
        r.processes[0].phases[0].classes =
            classes(&[(ReportClass::WpFaults, 128_033), (ReportClass::Copy, 128_000)]);
        assert!(!rules(&r).contains(&"wp-while-child-alive".into()));
    }

    #[test]
    fn the_same_finding_of_many_processes_is_one_line() {
        let f = |pid: u32, rule: &str| Finding {
            rule: rule.into(),
            pid,
            phase: "whole run".into(),
            text: "same".into(),
            numbers: Default::default(),
        };
        let mut all: Vec<Finding> = (1..=27).map(|p| f(p, "copy-while-child-alive")).collect();
        all.push(f(1, "not-measurable"));
        let t = to_text(&all);
        assert_eq!(t.lines().count(), 2, "{t}");
        assert!(t.contains("27 processes (pids 1, 2, 3, 4, 5, 6, 7, 8, ...) whole run: same"), "{t}");
    }
}
