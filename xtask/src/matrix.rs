//! The kernel matrix: `faultscope bench` cases in guests of every kernel x
//! arch, each compared, per bench phase, with the tracefs oracle of the same
//! run and with the workload's page arithmetic.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use anyhow::{Context as _, Result};
use faultscope::{
    kernel::classes::ReportClass,
    report::schema::{Attribution, ClassValue, Folios, Measured, PmdOutcomes, StackRow},
    units::{parse_size, PAGE, PMD_SIZE},
};
use faultscope_common::Program;

use crate::{
    check::{self, CaseResult, Checklist, Oracle, LRU_BATCH_COPIES},
    kernels::{Choices, FolioReuse, GuestKernel},
    vm::{tlb, GuestRun, Tlb},
};

/// Faults of the bench's own pages (stack, heap) in its write step: 0-4,
/// 4-9 with the child alive. The oracle comparison stays exact.
pub const SLACK: u64 = 16;

/// Races a run may read as stale TLB under TCG where the fault opens at
/// its exception (see the spurious-race case).
const STRETCHED_RACES: u64 = 2;

/// The programs that open a fault at its exception: x86's tracepoint,
/// arm64's `do_mem_abort` (fentry only).
const EXCEPTION_PROGRAMS: [Program; 2] = [Program::PageFaultUser, Program::MemAbort];

/// The write step's phase: the last step of every bench run (a hotpatch
/// run has no fork step).
const WRITE: &str = "mark:write";

/// How the probes attach in a case's run (`bench --backend`).
pub const BACKENDS: [&str; 2] = ["kprobe", "fentry"];

/// The kernels whose cases also run with fentry/fexit (the others only
/// with kprobes): one per architecture is enough to check that the two
/// backends count the same, at a fraction of the matrix's time.
pub const FENTRY_KERNELS: [&str; 2] = ["6.12-cloud-amd64", "7.3-cloud-arm64"];

/// A case's name in the guest's output: `CASE@BACKEND`.
pub fn label(case: &str, backend: &str) -> String {
    format!("{case}@{backend}")
}

/// Checks one bench case of a guest run of a kernel that chooses as
/// `choices` says, `label` being its `CASE@BACKEND`. An error is
/// the harness's (the guest printed no results for the case); wrong counts
/// are `failures`.
pub fn check_case(run: &GuestRun, kernel: &str, choices: Choices, label: &str) -> Result<CaseResult> {
    let (case, backend) = label.split_once('@').unwrap_or((label, "kprobe"));
    let kernel = &format!("{kernel} {backend}");
    let mut fails = Vec::new();
    let attach_kinds = |r: &faultscope::report::schema::Report| -> Vec<String> {
        r.probes.iter().filter_map(|p| p.backend.clone()).collect()
    };
    let rc = run
        .marker("RC", label)
        .with_context(|| format!("{kernel} {case}: the guest printed no exit status for the bench"))?;
    if rc != "0" {
        // faultscope's own failure: a result, never rerun.
        let out = run.section(&format!("{label}.out")).unwrap_or("");
        let failures = vec![format!("{kernel} {case}: bench exited with {rc:?}:\n{out}")];
        return Ok(CaseResult { table: String::new(), failures });
    }
    let report = check::report(run, &format!("{label}.json"))?;
    // The backend asked for is the one the fault path used.
    let kinds = attach_kinds(&report);
    let want = if backend == "fentry" { "fexit" } else { "kretprobe" };
    if !kinds.iter().any(|k| k == want) {
        fails.push(format!("{kernel} {case}: --backend {backend}, but the probes attached as {kinds:?}"));
    }
    let sec = format!("{label}.oracle");
    let oracle = check::oracle_of(run, &sec)?;
    let b = report.bench.as_ref().context("no bench in the report")?;
    let p = check::process(&report, b.pid)?;
    let name = format!("{kernel} {case}");
    let mut table = String::new();
    let per_step = compare_steps(run, label, &name, &oracle, b, p, &mut table, &mut fails)?;
    let write = per_step.last().context("no bench step")?;
    let stacks = {
        let mut cl = Checklist::new(&name, &mut table, &mut fails);
        let opened_at_exception = report
            .probes
            .iter()
            .any(|p| p.attached && EXCEPTION_PROGRAMS.iter().any(|e| e.name() == p.program));
        let stale_tlb = run.tlb == Tlb::Stale;
        let kernel = KernelTraits { choices, opened_at_exception, stale_tlb };
        expect_kernel_choice(&mut cl, case, kernel, b, write);
        expect_folios(&mut cl, run, label, &report, &per_step);
        expect_hotpatch(&mut cl, case, choices, run, label, b, write);
        expect_unfolds(&mut cl, case, choices.reuse, &report.kernel, b, write, &oracle)
    };
    table.push_str(&stacks);
    if run.marker("OVERRUN", label).as_deref() != Some("0") {
        fails.push(format!("{name}: the oracle's trace buffer overran"));
    }
    Ok(CaseResult { table, failures: fails })
}

/// The case's table: faultscope against the oracle in each step, for the
/// classes the oracle counts; their differences go to `fails`. Returns the
/// steps' spans.
#[allow(clippy::too_many_arguments)]
fn compare_steps(
    run: &GuestRun,
    label: &str,
    name: &str,
    oracle: &Oracle,
    b: &faultscope::report::schema::Bench,
    p: &faultscope::report::schema::Process,
    table: &mut String,
    fails: &mut Vec<String>,
) -> Result<Vec<faultscope::report::schema::Span>> {
    let (pid, pages, folios) = (b.pid, b.pages, b.folios);
    let write_minflt = b.step("write").map_or(0, |s| s.minflt);
    let _ = writeln!(
        table,
        "{name}: {pages} pages, {folios} folios of {}, write-phase getrusage minflt {write_minflt}, guest wall {:.1}s",
        b.folio,
        run.wall.as_secs_f64()
    );
    let _ = write!(table, "  {:<20}", "faultscope/oracle");
    let steps: Vec<String> = b.steps.iter().map(|s| format!("mark:{}", s.name)).collect();
    for st in &steps {
        let _ = write!(table, " {st:>21}");
    }
    table.push('\n');
    let sec = format!("{label}.oracle");
    let mut per_step = Vec::new();
    for st in &steps {
        let span = p.span(st).with_context(|| format!("{name}: no phase {st}"))?;
        let cmp = oracle
            .compare(&format!("{name} {st}"), &span.classes, pid, st)
            .with_context(|| format!("{name}: {}", check::oracle_gap(run, label, &sec, pid, st)))?;
        per_step.push((span, cmp));
    }
    // The classes the oracle counts, in the catalogue's order.
    for m in ReportClass::ALL.into_iter().filter(|&m| per_step.iter().any(|(_, cmp)| cmp.row(m).is_some())) {
        let _ = write!(table, "  {:<20}", m.name());
        for (_, cmp) in &per_step {
            let cell = cmp
                .row(m)
                .map_or_else(String::new, |r| format!("{}/{}", r.faultscope_cell(), r.oracle_cell()));
            let _ = write!(table, " {cell:>21}");
        }
        table.push('\n');
    }
    for (_, cmp) in &mut per_step {
        fails.append(&mut cmp.failures);
    }
    for why in per_step.last().map(|s| &s.1.unknown).into_iter().flatten() {
        let _ = writeln!(table, "  oracle cannot count: {why}");
    }
    Ok(per_step.into_iter().map(|(span, _)| span).collect())
}

/// What a case may expect of a kernel and of how faultscope ran on it.
#[derive(Clone, Copy)]
struct KernelTraits {
    choices: Choices,
    /// Faults open at their exception, not at `handle_mm_fault`.
    opened_at_exception: bool,
    /// The guest ran under QEMU's stale-TLB model.
    stale_tlb: bool,
}

/// What the kernel chose in the write step, against the page arithmetic:
/// reuse or copy per page or per folio, bounded by the kernel's own
/// choices (`LRU_BATCH_COPIES`, `SLACK`).
fn expect_kernel_choice(
    cl: &mut Checklist,
    case: &str,
    KernelTraits { choices, opened_at_exception, stale_tlb }: KernelTraits,
    b: &faultscope::report::schema::Bench,
    write: &faultscope::report::schema::Span,
) {
    let Choices { reuse, local_flush, .. } = choices;
    let (pages, folios, folio) = (b.pages, b.folios, b.folio.as_str());
    let get = |m: ReportClass| write.count(m).unwrap_or(0);
    let within = |v: u64, want: u64| (want..=want + SLACK).contains(&v);
    match case {
        "4k-exit" => {
            let (r, c) = (get(ReportClass::Reuse), get(ReportClass::Copy));
            cl.expect(
                within(r + c, pages) && c <= LRU_BATCH_COPIES,
                format!(
                    "reuse {r} + copy {c} = pages {pages} (+{SLACK}), copy <= {LRU_BATCH_COPIES} (pages in an LRU-add batch)"
                ),
            )
        }
        "64k-exit" | "2m-pte-exit"
            if reuse == FolioReuse::WholeFolio
                || (reuse == FolioReuse::ContpteBlock && case == "64k-exit") =>
        {
            // Copies are the kernel's choice for folios in an LRU-add
            // batch (see LRU_BATCH_COPIES); the rest is reused whole.
            let (r, c) = (get(ReportClass::Reuse), get(ReportClass::Copy));
            cl.expect(
                within(r + c, folios) && c <= LRU_BATCH_COPIES,
                format!(
                    "reuse {r} + copy {c} = folios {folios} (+{SLACK}), copy <= {LRU_BATCH_COPIES}: this kernel reuses a {folio} folio whole"
                ),
            );
        }
        "64k-exit" | "2m-pte-exit" => {
            let (r, c) = (get(ReportClass::Reuse), get(ReportClass::Copy));
            cl.expect(
                within(r + c, pages),
                format!(
                    "reuse {r} + copy {c} = pages {pages}: this kernel {} {folio} folios page by page",
                    if c > r { "copies" } else { "reuses" }
                ),
            );
        }
        "2m-pmd-exit" | "2m-pmd-alive" => {
            let h = get(ReportClass::HugePmdWp);
            cl.expect(within(h, folios), format!("huge_pmd_wp {h} = THPs {folios}"));
            let Some(o) = pmd_outcomes_of(&write.classes) else {
                cl.expect(false, "huge_pmd_wp has no outcomes");
                return;
            };
            if case == "2m-pmd-exit" {
                // An exclusive THP: the PMD made writable in place.
                cl.expect(
                    o.reused == h && o.split == 0 && o.copied == 0,
                    format!(
                        "huge_pmd_wp: reused {} = {h}, split {} = 0, THP copied {} = 0",
                        o.reused, o.split, o.copied
                    ),
                );
            } else {
                // Shared with the child: the kernel splits the PMD and
                // copies page by page (the first page in the same fault).
                let c = get(ReportClass::Copy);
                cl.expect(
                    o.split == h && o.reused == 0 && o.copied == 0 && within(c, pages),
                    format!(
                        "huge_pmd_wp: split {} = {h}, reused {} = 0, THP copied {} = 0; copy {c} = pages {pages} (+{SLACK})",
                        o.split, o.reused, o.copied
                    ),
                );
            }
        }
        "4k-alive" | "16k-alive" | "64k-alive" => {
            let c = get(ReportClass::Copy);
            cl.expect(within(c, pages), format!("copy {c} = pages {pages} (child alive)"))
        }
        "spurious-race" => {
            // The threads only store: a page's spurious fault is a lost
            // race where every store re-walks (QEMU as shipped); the
            // stale-TLB model may add a few where a CPU cached an entry
            // some other way. A race reads as stale TLB when the winner
            // returned between the loser's page walk and its fault's open
            // (`WpPage`). Opened at the exception, that needs the host to
            // stop a vCPU's thread there: at most 1 a run on an idle host,
            // 3 of 5 on a host loaded with other guests and builds. So the
            // bound is the races read as races plus `STRETCHED_RACES`: a
            // split that read every race as stale TLB still fails. Opened
            // at `handle_mm_fault` (arm64), the loser may
            // also be preempted in its VMA lookup, as often as the
            // kernel's preemption model allows: not bounded.
            let (sp, stale, race) = spurious_split(cl, write);
            let bounded = !stale_tlb && opened_at_exception;
            cl.expect(
                (!bounded || stale <= race + STRETCHED_RACES) && sp <= 3 * pages,
                format!(
                    "spurious {sp} (race {race}, stale TLB {stale}{}), at most 3 of 4 threads a page ({})",
                    match (stale_tlb, opened_at_exception) {
                        (false, true) => format!(" <= race + {STRETCHED_RACES}"),
                        (false, false) => ", opened at handle_mm_fault: not bounded".into(),
                        (true, _) => String::new(),
                    },
                    3 * pages
                ),
            );
        }
        "reader-writer" => {
            // The writer's reuses, then the reader's stores: each a
            // spurious fault where its CPU kept the read-only entry (the
            // stale-TLB model), none where it re-walks (QEMU as shipped).
            // Starting the writer thread in the step writes more of the
            // bench's own pages shared at the fork (its heap, the thread's
            // bookkeeping): four times the slack.
            let (r, c) = (get(ReportClass::Reuse), get(ReportClass::Copy));
            let slack = 4 * SLACK;
            cl.expect(
                (pages..=pages + slack).contains(&(r + c)) && c <= LRU_BATCH_COPIES,
                format!(
                    "the writer: reuse {r} + copy {c} = pages {pages} (+{slack}), copy <= {LRU_BATCH_COPIES}"
                ),
            );
            // Under the model the reader's CPU keeps its entries only until
            // it switches to another process (a CR3 write, or arm64's
            // change of ASID, drops them all):
            // any count up to the pages, the boot's sum held to QEMU's own
            // count (`check_model_count`).
            let (sp, stale, race) = spurious_split(cl, write);
            let cached = stale_tlb;
            cl.expect(
                race == 0 && if cached { stale <= pages } else { stale == 0 },
                format!(
                    "the reader: spurious {sp} = stale TLB {stale} ({}), race {race} = 0",
                    if cached {
                        format!("at most pages {pages}: the model keeps read-only entries until a switch")
                    } else {
                        "0: every store re-walks".into()
                    }
                ),
            );
        }
        "read-then-store-64k" => {
            // Each store takes a write-protect fault, or a spurious one
            // where a fault before it made the PTE writable and the CPU
            // kept its read-only entry: a kernel that reuses the whole
            // folio (or its 16 PTEs) leaves the other 15 pages' entries
            // stale under the model, one that reuses or copies page by
            // page none. One thread: no race.
            let (wp, (sp, stale, race)) = (get(ReportClass::WpFaults), spurious_split(cl, write));
            let whole = reuse != FolioReuse::PageByPage;
            let want = if !stale_tlb {
                (0, 0, "0: every store re-walks".to_string())
            } else if local_flush {
                // Only a thread moved back to a CPU that read the folio
                // before its reuse finds an entry left.
                (0, SLACK, format!("0 to {SLACK}: the reuse flushes this CPU's entries"))
            } else if whole {
                let most = pages - folios;
                (most / 2, most, format!("{} to {most}: 15 of 16 pages a folio, less flushes", most / 2))
            } else {
                (0, SLACK, format!("0 to {SLACK}: this kernel makes each page writable by its own fault"))
            };
            cl.expect(
                (want.0..=want.1).contains(&stale) && race == 0 && wp + sp <= pages + SLACK,
                format!(
                    "spurious {sp}: stale TLB {stale} ({}), race {race} = 0; wp {wp} + spurious <= pages {pages} (+{SLACK})",
                    want.2
                ),
            );
            if whole && (local_flush || !stale_tlb) {
                cl.expect(
                    wp + sp <= folios + SLACK,
                    format!("write faults {} <= folios {folios} (+{SLACK}): one a folio", wp + sp),
                );
            }
        }
        _ => {}
    }
}

/// New anonymous THPs the kernel allocated that faultscope does not trace
/// in a case: faultscope's own heap, where it grows while the bench's folio
/// size is set to `always` (the guest turns every other THP off). Measured:
/// 0 in each case at 16M on 6.12 amd64.
const UNTRACED_THPS: u64 = 16;

/// The kernel's own count of the anonymous THPs its faults allocated while
/// a case ran, by folio size in bytes: each multi-size THP's
/// `anon_fault_alloc` (6.10 on) and, for the PMD's size, `/proc/vmstat`'s
/// `thp_fault_alloc` (on every kernel), from the guest's `alloc0` and
/// `alloc1` sections.
fn thp_allocs(run: &GuestRun, label: &str) -> Result<BTreeMap<u64, u64>> {
    let read = |sec: &str| -> Result<BTreeMap<u64, u64>> {
        let mut out = BTreeMap::new();
        for l in run.section(&format!("{label}.{sec}"))?.lines() {
            let Some((size, n)) = l.trim().split_once(' ') else { continue };
            let bytes = match size {
                "split-pmd" => continue,
                "pmd" => PMD_SIZE,
                s => parse_size(s).map_err(anyhow::Error::msg)?,
            };
            // The PMD's own multi-size counter repeats thp_fault_alloc.
            if size == "pmd" || bytes != PMD_SIZE {
                out.insert(bytes, n.trim().parse().with_context(|| format!("{label}.{sec}: {l:?}"))?);
            }
        }
        Ok(out)
    };
    let (before, after) = (read("alloc0")?, read("alloc1")?);
    Ok(after.iter().map(|(s, n)| (*s, n.saturating_sub(before.get(s).copied().unwrap_or(0)))).collect())
}

/// The new anon folios of a class in a span, as faultscope measured them.
pub(crate) fn folios_of(classes: &faultscope::report::schema::Classes, m: ReportClass) -> Option<Folios> {
    match classes.get(&m)? {
        ClassValue::Measured(x) => x.folios.as_deref().cloned(),
        ClassValue::NotMeasurable(_) => None,
    }
}

/// What came of a span's PMD write-protect faults, where measured.
fn pmd_outcomes_of(classes: &faultscope::report::schema::Classes) -> Option<PmdOutcomes> {
    match classes.get(&ReportClass::HugePmdWp)? {
        ClassValue::Measured(x) => x.outcomes.as_deref().cloned(),
        ClassValue::NotMeasurable(_) => None,
    }
}

/// The folio sizes faultscope read, against counts made another way: with
/// the child alive, the copies' sizes against the folios the region maps
/// after the write (pagemap and kpageflags; stock kernels copy a base page);
/// where first touches are measured (x86: the exception's error code), the
/// kernel's per-size allocation counters over the whole run (each size
/// faultscope saw first-touched or copied whole, at most what the kernel
/// counted and at least that less [`UNTRACED_THPS`]) and the page
/// arithmetic of the populate step (one new folio of the bench's size a
/// folio).
fn expect_folios(
    cl: &mut Checklist,
    run: &GuestRun,
    label: &str,
    report: &faultscope::report::schema::Report,
    per_step: &[faultscope::report::schema::Span],
) {
    let Some(b) = report.bench.as_ref() else { return };
    let get = |span: &faultscope::report::schema::Span, m| folios_of(&span.classes, m).unwrap_or_default();
    if let Some(after) = &b.after_write {
        // Every page of the region was copied: the folios it maps after
        // the write (pagemap, kpageflags) are the copies' new folios, size
        // by size, the bench's own pages' copies aside (+SLACK).
        let w = &per_step[per_step.len() - 1];
        let (copy, f) = (w.count(ReportClass::Copy).unwrap_or(0), get(w, ReportClass::Copy));
        let m = &after.mapped;
        let sizes: BTreeSet<&String> = m.sizes.keys().chain(f.sizes.keys()).collect();
        let each = sizes.iter().all(|s| (m.of_size(s)..=m.of_size(s) + SLACK).contains(&f.of_size(s)));
        cl.expect(
            each && f.sizes.values().sum::<u64>() == copy && m.bytes == b.size,
            format!(
                "write: copies {copy} by size {:?} ({} bytes) = the folios mapped after it {:?} ({} bytes of {}) (+{SLACK})",
                f.sizes, f.bytes, m.sizes, m.bytes, b.size
            ),
        );
        // A stock kernel copies a base page (the mTHP copy series is not
        // available to build).
        cl.expect(
            f.of_size("4K") == copy,
            format!("write: each copy a new 4K folio on this kernel: {:?}", f.sizes),
        );
    }
    // First touches are told from other new folios by the exception's
    // error code: x86 only.
    if matches!(per_step[0].classes.get(&ReportClass::NotPresent), Some(ClassValue::NotMeasurable(_))) {
        cl.line("  not_present is not measurable here: first-touch folio sizes not checked");
        return;
    }
    let mut seen = Folios::default();
    for p in &report.processes {
        if let Some(f) = folios_of(&p.classes, ReportClass::NotPresent) {
            seen.add(&f);
            // A THP copied whole is a fault's THP allocation too.
            if let Some(c) = folios_of(&p.classes, ReportClass::Copy) {
                seen.add(&c);
            }
        } else {
            cl.expect(false, format!("pid {}: not_present has no folio sizes", p.pid));
            return;
        }
    }
    match thp_allocs(run, label) {
        Ok(kernel) => {
            for (size, n) in kernel {
                let f = seen.of_size(&faultscope::units::size(size));
                cl.expect(
                    f <= n && n <= f + UNTRACED_THPS,
                    format!(
                        "new {} folios: faultscope {f}, the kernel counted {n} (<= {UNTRACED_THPS} untraced)",
                        faultscope::units::size(size)
                    ),
                );
            }
        }
        Err(e) => cl.expect(false, format!("the kernel's THP counters: {e:#}")),
    }
    if b.mode == "seq" {
        let f = get(&per_step[0], ReportClass::NotPresent).of_size(&b.folio);
        cl.expect(
            (b.folios..=b.folios + SLACK).contains(&f),
            format!("populate: new {} folios {f} = folios {} (+{SLACK})", b.folio, b.folios),
        );
    }
}

/// The kernel's own count of the PMDs it split while a case ran
/// (`/proc/vmstat` `thp_split_pmd`, the guest's `split-pmd` lines).
fn pmd_splits(run: &GuestRun, label: &str) -> Result<u64> {
    let read = |sec: &str| -> Result<u64> {
        let text = run.section(&format!("{label}.{sec}"))?;
        let n = text.lines().find_map(|l| l.trim().strip_prefix("split-pmd "));
        n.context("no split-pmd line")?.trim().parse().with_context(|| format!("{label}.{sec}"))
    };
    Ok(read("alloc1")?.saturating_sub(read("alloc0")?))
}

/// A hot patch of a private executable file mapping of THPs, one byte a
/// THP: each write is a PMD write-protect fault. A stock kernel splits the
/// PMD and copies the one 4K page written; a kernel with the exec THP COW
/// series copies the THP whole into an anonymous one, but only when the
/// mapping is not writable (`hotpatch-mem`: `is_exec_mapping`) and the file
/// is not shmem. Checked against the page arithmetic, the mapping's own
/// `smaps` (anonymous bytes after the write: what the copies made), and the
/// kernel's counts of PMD splits and new PMD THPs.
fn expect_hotpatch(
    cl: &mut Checklist,
    case: &str,
    choices: Choices,
    run: &GuestRun,
    label: &str,
    b: &faultscope::report::schema::Bench,
    write: &faultscope::report::schema::Span,
) {
    if !matches!(case, "hotpatch" | "hotpatch-mem") {
        return;
    }
    let Some(h) = &b.hotpatch else {
        cl.expect(false, "the bench report has no hotpatch");
        return;
    };
    let (folios, size) = (b.folios, b.size);
    let get = |m: ReportClass| write.count(m).unwrap_or(0);
    let (copy, hwp) = (get(ReportClass::Copy), get(ReportClass::HugePmdWp));
    let f = folios_of(&write.classes, ReportClass::Copy).unwrap_or_default();
    let whole = choices.exec_thp_cow && case == "hotpatch-mem" && h.file_system != "tmpfs";
    expect_hotpatch_taken(cl, h, size);
    let outcomes = pmd_outcomes_of(&write.classes);
    let (o_split, o_copied) = outcomes.as_ref().map_or((0, 0), |o| (o.split, o.copied));
    cl.expect(outcomes.is_some(), "huge_pmd_wp has outcomes");
    let thp = PMD_SIZE;
    if whole {
        cl.expect(
            hwp == folios && o_copied == folios && o_split == 0,
            format!("huge_pmd_wp {hwp} = THPs {folios}: copied {o_copied} = {folios}, split {o_split} = 0"),
        );
        cl.expect(
            copy == folios && f.of_size("2M") == folios && f.bytes == folios * thp,
            format!("copy {copy} = THPs {folios}, each a new 2M folio: {:?}, {} bytes", f.sizes, f.bytes),
        );
        cl.expect(
            h.after.anon_huge == folios * thp && h.after.anonymous == folios * thp,
            format!(
                "smaps after: anonymous {} = AnonHugePages {} = copy.bytes {}",
                h.after.anonymous,
                h.after.anon_huge,
                folios * thp
            ),
        );
        match thp_allocs(run, label).map(|k| k.get(&PMD_SIZE).copied().unwrap_or(0)) {
            Ok(n) => cl.expect(
                (folios..=folios + UNTRACED_THPS).contains(&n),
                format!("the kernel's new PMD THPs {n} = THPs copied {folios} (+{UNTRACED_THPS})"),
            ),
            Err(e) => cl.expect(false, format!("the kernel's THP counters: {e:#}")),
        }
    } else {
        cl.expect(
            hwp == folios && o_split == folios && o_copied == 0,
            format!("huge_pmd_wp {hwp} = THPs {folios}: split {o_split} = {folios}, copied {o_copied} = 0"),
        );
        cl.expect(
            (folios..=folios + SLACK).contains(&copy) && f.of_size("4K") == copy && f.bytes == copy * PAGE,
            format!(
                "copy {copy} = writes {folios} (+{SLACK}), each a new 4K folio: {:?}, {} bytes",
                f.sizes, f.bytes
            ),
        );
        cl.expect(
            h.after.anonymous == folios * PAGE && h.after.anon_huge == 0,
            format!(
                "smaps after: anonymous {} = {folios} pages copied, AnonHugePages {} = 0",
                h.after.anonymous, h.after.anon_huge
            ),
        );
        match pmd_splits(run, label) {
            Ok(n) => cl.expect(n >= folios, format!("the kernel's PMD splits {n} >= THPs written {folios}")),
            Err(e) => cl.expect(false, format!("the kernel's thp_split_pmd: {e:#}")),
        }
    }
    if let Some(ClassValue::Measured(Measured { sources: Some(src), .. })) =
        write.classes.get(&ReportClass::Copy)
    {
        cl.expect(
            src.file_exec >= folios && src.file >= src.file_exec,
            format!("copies in an executable file mapping {} >= writes {folios}", src.file_exec),
        );
    }
}

/// The hot patch's smaps before and after, every write taken, and the file
/// PMD-mapped whole before the writes.
fn expect_hotpatch_taken(cl: &mut Checklist, h: &faultscope::report::schema::Hotpatch, size: u64) {
    cl.line(format!(
        "  {} file, {} writes by {}: smaps Rss {} -> {} kB, anonymous {} kB ({} kB THP)",
        h.file_system,
        h.writes,
        h.poke,
        h.before.rss >> 10,
        h.after.rss >> 10,
        h.after.anonymous >> 10,
        h.after.anon_huge >> 10
    ));
    cl.expect(
        h.refused == 0,
        format!(
            "the kernel took every write: refused {}{}",
            h.refused,
            h.refused_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
        ),
    );
    cl.expect(
        h.before.file_pmd_mapped == size,
        format!("before the write: file PMD-mapped {} = size {size}", h.before.file_pmd_mapped),
    );
}

/// The write step's spurious faults, stale TLB and race, checked to add
/// up (each spurious fault is one or the other).
fn spurious_split(cl: &mut Checklist, write: &faultscope::report::schema::Span) -> (u64, u64, u64) {
    let get = |m: ReportClass| write.count(m).unwrap_or(0);
    let (sp, stale, race) =
        (get(ReportClass::Spurious), get(ReportClass::SpuriousStaleTlb), get(ReportClass::SpuriousRace));
    cl.expect(stale + race == sp, format!("spurious {sp} = stale TLB {stale} + race {race}"));
    (sp, stale, race)
}

/// The 64K case's contpte unfolds in the write step, and the kernel path
/// that made them (`unfold_stacks`); returns the stacks' table.
fn expect_unfolds(
    cl: &mut Checklist,
    case: &str,
    reuse: FolioReuse,
    kernel: &str,
    b: &faultscope::report::schema::Bench,
    write: &faultscope::report::schema::Span,
    oracle: &Oracle,
) -> String {
    let folios = b.folios;
    if !(b.mapping == "pte"
        && b.folio == "64K"
        && write.count(ReportClass::ContpteUnfold).is_some()
        && case == "64k-exit")
    {
        return String::new();
    }
    let u = write.count(ReportClass::ContpteUnfold).unwrap_or(0);
    // With 64K mTHP on, the bench's own stack and heap are 64K blocks too:
    // a write to one in the write step unfolds it as well, so the unfolds
    // may exceed the folios by the bench's own few blocks. The comparison
    // with the oracle is exact.
    match reuse {
        FolioReuse::PageByPage => cl.expect(
            (folios..=folios + SLACK / 4).contains(&u),
            format!("contpte_unfold {u} = 64K blocks written {folios} (+{})", SLACK / 4),
        ),
        FolioReuse::WholeFolio | FolioReuse::ContpteBlock => {
            cl.expect(u == 0, format!("contpte_unfold {u} = 0: whole 64K blocks reused, none unfolded"))
        }
    }
    let try_unfold = oracle
        .line(b.pid, "mark:write")
        .and_then(|l| l.get(ReportClass::ContpteTryUnfold.name()).copied().flatten());
    let (stacks, checks) = unfold_stacks(kernel, &write.attribution, u, try_unfold);
    for (ok, what) in checks {
        cl.expect(ok, what);
    }
    stacks
}

/// The direct caller of `contpte_convert` when a write after the fork
/// unfolds a 64K block, as the kernels do it (seen in their stacks, and in
/// the oracle's count of `__contpte_try_unfold` calls):
/// - 6.12 copies the folio page by page; the copy clears the PTE
///   (`ptep_clear_flush`), which unfolds through `__contpte_try_unfold`:
///   `contpte_convert <- __contpte_try_unfold <- ptep_clear_flush <- do_wp_page`.
/// - 7.3 reuses the folio; `wp_page_reuse` makes the PTE writable through
///   `contpte_ptep_set_access_flags`, which converts the block itself:
///   `contpte_convert <- contpte_ptep_set_access_flags <- wp_page_reuse <- do_wp_page`.
const UNFOLD_CALLERS: &[((u64, u64), &str, &str)] = &[
    ((6, 12), "__contpte_try_unfold", "ptep_clear_flush"),
    ((7, 3), "contpte_ptep_set_access_flags", "wp_page_reuse"),
];

/// A kernel frame's function: `name+0x1c` -> `name`.
fn function(frame: &str) -> &str {
    frame.split('+').next().unwrap_or(frame)
}

/// The kernel stacks of the write step's contpte unfolds (`bench
/// --stacks contpte_unfold`), printed leaf first, and what they must show:
/// every unfold has a stack starting at `contpte_convert`, its direct caller
/// is the kernel's own ([`UNFOLD_CALLERS`]), and the stacks through
/// `__contpte_try_unfold` are as many as the oracle counted calls of it
/// (`try_unfold`).
fn unfold_stacks(
    kernel: &str,
    a: &Attribution,
    unfolds: u64,
    try_unfold: Option<u64>,
) -> (String, Vec<(bool, String)>) {
    let stacks: Vec<&StackRow> = a.stacks.iter().filter(|s| s.class == ReportClass::ContpteUnfold).collect();
    let mut table = String::new();
    for s in &stacks {
        let frames: Vec<&str> = s.kernel.iter().rev().map(String::as_str).collect();
        let _ = writeln!(table, "  contpte_unfold kernel stack x{}: {}", s.count, frames.join(" <- "));
    }
    // Leaf first: frame i of a stack.
    fn frame(s: &StackRow, i: usize) -> &str {
        s.kernel.iter().rev().nth(i).map_or("", |f| function(f))
    }
    let n: u64 = stacks.iter().filter(|s| frame(s, 0) == "contpte_convert").map(|s| s.count).sum();
    let mut out = vec![(
        n == unfolds,
        format!("contpte_unfold kernel stacks from contpte_convert {n} = unfolds {unfolds}"),
    )];
    let through = |f: &str| -> u64 {
        stacks.iter().filter(|s| s.kernel.iter().any(|k| function(k) == f)).map(|s| s.count).sum()
    };
    let t = through("__contpte_try_unfold");
    out.push((
        Some(t) == try_unfold,
        format!(
            "stacks through __contpte_try_unfold {t} = the oracle's calls of it {}",
            try_unfold.map_or("?".into(), |v| v.to_string())
        ),
    ));
    let version = UNFOLD_CALLERS.iter().find(|((a, b), _, _)| {
        crate::check::kernel_at_least(kernel, *a, *b) && !crate::check::kernel_at_least(kernel, *a, *b + 1)
    });
    match version {
        Some((_, caller, next)) => {
            let m: u64 = stacks
                .iter()
                .filter(|s| frame(s, 1) == *caller && frame(s, 2) == *next)
                .map(|s| s.count)
                .sum();
            out.push((
                m == unfolds,
                format!(
                    "{m} of {unfolds} unfolds: contpte_convert <- {caller} <- {next} (this kernel's path)"
                ),
            ));
        }
        None => {
            let callers: BTreeSet<&str> = stacks.iter().map(|s| frame(s, 1)).collect();
            let _ = writeln!(table, "  (no expected path for {kernel}: direct callers {callers:?})");
        }
    }
    (table, out)
}

/// `faultscope verify --expect contpte_unfold=0` over the write step of the
/// 64K and 4K runs: on arm64 exit 1 (count printed) where the kernel
/// unfolded, 0 where not; on x86 the class is not measurable (exit 3).
/// With `gates`, also [`check_gates`].
fn check_verify(run: &GuestRun, k: GuestKernel, gates: bool) -> Vec<String> {
    let mut fails = Vec::new();
    for case in ["64k-exit", "4k-exit"].iter().flat_map(|c| BACKENDS.map(|b| label(c, b))) {
        let Some(rc) = run.marker("VERIFY", &case) else { continue };
        let out = run.section(&format!("verify-{case}")).unwrap_or("").trim().to_string();
        let unfolds = check::report(run, &format!("{case}.json"))
            .ok()
            .and_then(|r| r.bench_process()?.span("mark:write")?.count(ReportClass::ContpteUnfold));
        let want = match (k.arch, unfolds) {
            ("arm64", Some(0)) => "0",
            ("arm64", Some(_)) => "1",
            _ => "3",
        };
        println!("{} verify contpte_unfold=0 on {case}: exit {rc} (want {want}): {out}", k.name);
        if rc != want {
            fails.push(format!("{} verify on {case}: exit {rc}, want {want}: {out}", k.name));
        }
        if want == "1" && !out.contains(&format!("contpte_unfold is {}", unfolds.unwrap_or(0))) {
            fails.push(format!("{} verify on {case} does not print the count: {out}", k.name));
        }
        // The gate CI would run on a kernel that must not unfold.
        if gates && case.starts_with("64k-exit@") && k.arch == "arm64" {
            let must = if k.reuse() == FolioReuse::PageByPage { "1" } else { "0" };
            println!("{} GATE contpte_unfold=0 on {case}: exit {rc}, must be {must}", k.name);
            if rc != must {
                fails.push(format!(
                    "{} gate contpte_unfold=0 on {case}: exit {rc}, must be {must}: {out}",
                    k.name
                ));
            }
        }
    }
    if gates {
        fails.extend(check_gates(run, k));
    }
    fails
}

/// The bound of the whole-folio reuse gate: one reuse fault per folio, and
/// the bench's own few faults (its stack and heap pages after the fork).
pub const GATE: &str = "reuse/folio<=1.05";

/// `faultscope verify --phase mark:write --expect 'reuse/folio<=1.05'` over
/// the 64K and PTE-mapped 2M runs, as CI would gate a patch on it: its exit
/// must follow the oracle's reuse count (0 within the bound, 1 above it,
/// printing that count over the folios), and it must pass on a kernel that
/// reuses whole folios and fail on one that reuses them page by page.
fn check_gates(run: &GuestRun, k: GuestKernel) -> Vec<String> {
    let mut fails = Vec::new();
    for case in GATE_CASES.iter().map(|c| label(c, GATE_BACKEND)) {
        let Some(rc) = run.marker("GATE", &case) else {
            fails.push(format!("{} gate on {case}: the guest printed no exit status", k.name));
            continue;
        };
        let out = run.section(&format!("gate-{case}")).unwrap_or("").trim().to_string();
        let counts = (|| -> Option<(u64, u64, u64)> {
            let report = check::report(run, &format!("{case}.json")).ok()?;
            let b = report.bench.as_ref()?;
            let oracle = check::oracle_of(run, &format!("{case}.oracle")).ok()?;
            let reuse =
                oracle.line(b.pid, "mark:write")?.get(ReportClass::Reuse.name()).copied().flatten()?;
            let copy = oracle.line(b.pid, "mark:write")?.get(ReportClass::Copy.name()).copied().flatten()?;
            Some((reuse, copy, b.folios))
        })();
        let Some((reuse, copy, folios)) = counts else {
            fails.push(format!("{} gate on {case}: no oracle reuse count for the write step", k.name));
            continue;
        };
        let within = reuse as f64 / folios.max(1) as f64 <= 1.05;
        let want = if within { "0" } else { "1" };
        // What the kernel must do: the series' whole folio, or 7.3's page
        // by page (16 per 64K folio); a kernel that copies reuses nothing.
        let must = match k.reuse() {
            FolioReuse::WholeFolio => Some("0"),
            FolioReuse::PageByPage if copy == 0 => Some("1"),
            FolioReuse::PageByPage | FolioReuse::ContpteBlock => None,
        };
        println!(
            "{} GATE {GATE} on {case}: exit {rc}; the oracle's reuse {reuse} / {folios} folios wants {want}{}: {out}",
            k.name,
            must.map_or(String::new(), |m| format!(", the kernel must give {m}"))
        );
        if rc != want {
            fails.push(format!(
                "{} gate on {case}: exit {rc}, the oracle's count wants {want}: {out}",
                k.name
            ));
        }
        if let Some(m) = must.filter(|m| *m != want) {
            fails.push(format!(
                "{} gate on {case}: reuse {reuse} for {folios} folios; this kernel must {}",
                k.name,
                if m == "0" { "pass the gate" } else { "fail the gate" }
            ));
        }
        if !out.contains(&format!("({reuse} / {folios})")) {
            fails.push(format!(
                "{} gate on {case} does not print reuse {reuse} / {folios} folios: {out}",
                k.name
            ));
        }
    }
    fails
}

/// Checks `cases` of a guest run: prints their tables, adds wrong counts to
/// `failures`, and returns the harness errors (case, error) of cases that
/// left no results.
fn check_cases(
    run: &GuestRun,
    k: GuestKernel,
    cases: &[String],
    failures: &mut Vec<String>,
) -> Vec<(String, String)> {
    let mut harness_errors = Vec::new();
    for case in cases {
        let (name, _) = case.split_once('@').unwrap_or((case, ""));
        let result = match expected_refusal(&k, name) {
            Some(why) => check_refusal(run, k.name, case, &why),
            None => check_case(run, k.name, k.choices(), case),
        };
        match result {
            Ok(r) => {
                print!("{}", r.table);
                failures.extend(r.failures);
            }
            Err(e) => harness_errors.push((case.clone(), format!("{e:#}"))),
        }
    }
    harness_errors
}

/// Prints the guest kernel's warnings of a run, if it had any.
fn print_complaints(run: &GuestRun) {
    let c = run.kernel_complaints();
    if !c.is_empty() {
        println!("  the guest kernel warned:\n    {}", c.join("\n    "));
    }
}

/// The folio size a case's bench asks for (its `--folio`).
fn case_folio(case: &str) -> Option<&'static str> {
    let (_, args) = CASES.iter().find(|(n, _)| *n == case)?;
    let mut words = args.split_whitespace();
    words.by_ref().find(|w| *w == "--folio")?;
    words.next()
}

/// Why `bench` must refuse `case` on `k`, the line it must print: a folio
/// size between 4K and 2M on a kernel without multi-size THP (before 6.8:
/// 6.1 has only the PMD's 2M THP).
pub fn expected_refusal(k: &GuestKernel, case: &str) -> Option<String> {
    let folio = case_folio(case)?;
    if k.mthp() || matches!(folio, "4K" | "2M") {
        return None;
    }
    let kb = match folio.split_at(folio.len() - 1) {
        (n, "K") => n.parse::<u64>().ok()?,
        (n, "M") => n.parse::<u64>().ok()? << 10,
        _ => return None,
    };
    Some(format!(
        "--folio {folio} needs multi-size THP (Linux 6.8 or later): \
         /sys/kernel/mm/transparent_hugepage/hugepages-{kb}kB is missing"
    ))
}

/// A case the kernel cannot run ([`expected_refusal`]): bench must refuse
/// it, exit 2 with `why` as the one line it prints (before it attaches:
/// nothing else, not even the measured classes' line). No output at all is
/// the harness's error.
fn check_refusal(run: &GuestRun, kernel: &str, label: &str, why: &str) -> Result<CaseResult> {
    let (case, backend) = label.split_once('@').unwrap_or((label, "kprobe"));
    let name = format!("{kernel} {backend} {case}");
    let rc = run
        .marker("RC", label)
        .with_context(|| format!("{name}: the guest printed no exit status for the bench"))?;
    let out = run.section(&format!("{label}.out")).unwrap_or("");
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    let want = format!("faultscope: {why}");
    let (mut table, mut fails) = (String::new(), Vec::new());
    let _ = writeln!(table, "{name}: refused, as this kernel must (no multi-size THP)");
    let mut cl = Checklist::new(&name, &mut table, &mut fails);
    cl.expect(rc == "2", format!("bench exit {rc} = 2 (refused)"));
    cl.expect(lines == [want.as_str()], format!("its output is the one line {want:?}: {lines:?}"));
    Ok(CaseResult { table, failures: fails })
}

/// Every matrix case: its name and the bench it runs (the guest adds
/// `--size` and `--backend`). The one declaration of the cases: the guest
/// script runs the lines it is given (`case_lines`).
pub const CASES: &[(&str, &str)] = &[
    ("4k-exit", "seq --folio 4K --child exit"),
    // With the kernel stacks of unfolds: which kernel path unfolded.
    ("64k-exit", "seq --folio 64K --child exit --stacks contpte_unfold"),
    ("2m-pte-exit", "seq --folio 2M --child exit"),
    ("2m-pmd-exit", "seq --folio 2M --pmd --child exit"),
    ("2m-pmd-alive", "seq --folio 2M --pmd --child alive"),
    ("4k-alive", "seq --folio 4K --child alive"),
    ("16k-alive", "seq --folio 16K --child alive"),
    ("64k-alive", "seq --folio 64K --child alive"),
    ("spurious-race", "threads-same --threads 4 --folio 4K --child exit"),
    ("reader-writer", "reader-writer --folio 4K --child exit"),
    ("read-then-store-64k", "read-then-store --folio 64K --child exit"),
    // A private executable file mapping of file THPs ($HOTPATCH_DIR: the
    // guest's), patched one byte a THP as a hot patcher (mprotect, stores)
    // and as a debugger (/proc/self/mem).
    ("hotpatch", "hotpatch --folio 2M --file-dir /mnt/hotpatch"),
    ("hotpatch-mem", "hotpatch-mem --folio 2M --file-dir /mnt/hotpatch"),
];

/// Cases run on every kernel by default (`cargo xtask test`).
pub const DEFAULT_CASES: &[&str] =
    &["4k-exit", "64k-exit", "2m-pte-exit", "2m-pmd-exit", "2m-pmd-alive", "4k-alive", "spurious-race"];

/// `cases` as the guest runs them: `NAME:BENCH ARGS` joined by `;`.
pub fn case_lines(cases: &[String]) -> Result<String> {
    let mut lines = Vec::new();
    for c in cases {
        let Some((name, args)) = CASES.iter().find(|(n, _)| *n == c.as_str()) else {
            let known: Vec<&str> = CASES.iter().map(|(n, _)| *n).collect();
            anyhow::bail!("no matrix case {c:?} (the cases: {})", known.join(", "));
        };
        lines.push(format!("{name}:{args}"));
    }
    Ok(lines.join(";"))
}

/// The backends a kernel's cases run with: `asked` (`--backend`), else
/// kprobe everywhere and fentry too on [`FENTRY_KERNELS`].
pub fn backends_for(kernel: &str, asked: &[String]) -> Vec<String> {
    if !asked.is_empty() {
        return asked.to_vec();
    }
    let n = if FENTRY_KERNELS.contains(&kernel) { 2 } else { 1 };
    BACKENDS[..n].iter().map(|b| b.to_string()).collect()
}

/// Boots each kernel once and runs `cases` in it, under each of its
/// backends (`backends_for`), after the verifier check.
pub fn run(kernels: &[GuestKernel], size: &str, cases: &[String], backends: &[String]) -> Result<()> {
    run_with(kernels, size, cases, backends, Boot::Matrix).map(drop)
}

/// What a boot runs besides its cases.
#[derive(Clone, Copy, PartialEq)]
enum Boot {
    /// The verifier check first (`probes --load`, every program through the
    /// kernel's verifier): `cargo xtask matrix` and the suite's matrix
    /// stage, which boots every kernel.
    Matrix,
    /// The gates' `verify` runs instead.
    Gates,
    /// The cases alone: the suite's later stages, on kernels whose verifier
    /// check the matrix stage made (the same programs, the same kernel: 12
    /// to 20 s a boot under TCG).
    Cases,
}

/// The cases of the whole-folio reuse gates, at the size the issue's
/// figures are for (256M: the bench's own faults weigh under 5% there).
pub const GATE_CASES: &[&str] = &["64k-exit", "2m-pte-exit"];
pub const GATE_SIZE: &str = "256M";
/// The gates' kernels: stock 7.3 (must fail) and 7.3 with the series (must
/// pass), each arch.
pub const GATE_KERNELS: &[&str] =
    &["7.3-cloud-amd64", "7.3-folio-reuse-amd64", "7.3-cloud-arm64", "7.3-folio-reuse-arm64"];
/// The gates' backend: what CI on a stock distribution kernel would get.
pub const GATE_BACKEND: &str = "kprobe";

/// The gates on `kernels`: [`GATE_CASES`] at [`GATE_SIZE`] against the
/// oracle, then `verify` as CI runs it ([`check_gates`]): pass on the
/// patched kernels, fail with the count on stock 7.3.
pub fn gates(kernels: &[GuestKernel]) -> Result<()> {
    let cases: Vec<String> = GATE_CASES.iter().map(|c| c.to_string()).collect();
    run_with(kernels, GATE_SIZE, &cases, &[GATE_BACKEND.to_string()], Boot::Gates).map(drop)
}

/// What a COW fault costs in memory, a stage of `test`, by kernel: the
/// hot-patch cases (private executable file THPs: split and 4K copies on
/// stock kernels, THPs copied whole with the exec THP COW series) and
/// copies with the child alive from two mTHP sizes (the default cases have
/// 4K and the PMD's on every kernel), one on arm64 (contpte).
pub const COW_MEMORY: &[(&str, &[&str])] = &[
    ("6.12-cloud-amd64", &["hotpatch", "hotpatch-mem", "16k-alive", "64k-alive"]),
    ("7.3-cloud-amd64", &["hotpatch", "hotpatch-mem", "16k-alive", "64k-alive"]),
    ("7.3-exec-thp-cow-amd64", &["hotpatch", "hotpatch-mem"]),
    ("7.3-cloud-arm64", &["hotpatch", "hotpatch-mem", "64k-alive"]),
];

/// The COW memory stage: [`COW_MEMORY`], one boot a kernel.
pub fn cow_memory() -> Result<()> {
    let plan = COW_MEMORY
        .iter()
        .map(|(name, cases)| {
            Ok((crate::kernels::by_name(name)?, cases.iter().map(|c| c.to_string()).collect(), tlb()))
        })
        .collect::<Result<Vec<_>>>()?;
    run_each(&plan, "16M", &[], Boot::Cases).map(drop).context("COW memory")
}

/// The stale-TLB model's cases: spurious faults it makes (a reader's stale
/// entries after another thread's reuses; read-then-store on a kernel that
/// makes a whole folio writable) and races it must not turn into stale
/// TLB faults.
pub const STALE_TLB_CASES: &[&str] = &["reader-writer", "read-then-store-64k", "spurious-race"];
/// Its x86 kernels: stock 6.12 and 7.3, 7.3 with the whole-folio reuse
/// series, and that with the cover letter's `flush_tlb_local()`
/// experiment.
pub const STALE_TLB_KERNELS: &[&str] =
    &["6.12-cloud-amd64", "7.3-cloud-amd64", "7.3-folio-reuse-amd64", "7.3-folio-reuse-flush-amd64"];
/// Its arm64 kernels, the two-thread case only: stock 6.12, whose reuse
/// invalidates every CPU's entry, beside stock 7.3.
pub const STALE_TLB_ARM64_KERNELS: &[&str] = &["6.12-cloud-arm64", "7.3-cloud-arm64"];

/// The stale-TLB stage of `test`, its boots in one pool: the cases that
/// need a stale entry to fault on QEMU as shipped (6.12: no spurious fault
/// at all) and on the patched QEMU with its model off (the same counts:
/// [`compare_model_off`]), and [`STALE_TLB_CASES`] on [`STALE_TLB_KERNELS`]
/// and the two-thread case on [`STALE_TLB_ARM64_KERNELS`] under the model,
/// each boot's count against QEMU's own ([`check_model_count`]).
pub fn stale_tlb() -> Result<()> {
    let names = |v: &[&str]| -> Vec<String> { v.iter().map(|c| c.to_string()).collect() };
    let k612 = crate::kernels::by_name(STALE_TLB_KERNELS[0])?;
    let unmodelled = names(&STALE_TLB_CASES[..2]);
    // The stage's boots in one pool (a guest per CPU), each under its own
    // model.
    let mut plan: Vec<Planned> =
        vec![(k612, unmodelled.clone(), Tlb::Exact), (k612, unmodelled.clone(), Tlb::ModelOff)];
    for (ks, cs) in [(STALE_TLB_KERNELS, STALE_TLB_CASES), (STALE_TLB_ARM64_KERNELS, &STALE_TLB_CASES[..1])] {
        for k in ks {
            plan.push((crate::kernels::by_name(k)?, names(cs), Tlb::Stale));
        }
    }
    let boots = run_each(&plan, "16M", &[], Boot::Cases).context("stale-TLB stage")?;
    let by = |t: Tlb| -> Vec<&(GuestKernel, GuestRun)> {
        boots.iter().filter(|(k, r)| k.name == k612.name && r.tlb == t).collect()
    };
    compare_model_off(&by(Tlb::Exact), &by(Tlb::ModelOff), &unmodelled)
        .context("stale-TLB stage: QEMU as shipped, and patched with the model off")
}

/// The patched QEMU with its model off against Debian's, the same cases in
/// a boot each: QEMU printed no count of the model's faults, and each
/// case's write step has the same counts, within [`SLACK`] (the bench's
/// own faults move a little from boot to boot).
fn compare_model_off(
    debian: &[&(GuestKernel, GuestRun)],
    off: &[&(GuestKernel, GuestRun)],
    cases: &[String],
) -> Result<()> {
    let write_counts = |run: &GuestRun, label: &str| -> Option<Vec<(ReportClass, u64)>> {
        let w = bench_process(run, label)?.span(WRITE)?;
        Some(ReportClass::ALL.into_iter().filter_map(|m| Some((m, w.count(m)?))).collect())
    };
    let mut fails = Vec::new();
    for (&(k, a), &(_, b)) in debian.iter().zip(off) {
        if let Some(n) = b.stale_tlb_faults {
            fails.push(format!("{}: the model is off, and QEMU counted {n} faults of it", k.name));
        }
        let labels: Vec<String> =
            backends_for(k.name, &[]).iter().flat_map(|be| cases.iter().map(move |c| label(c, be))).collect();
        for l in &labels {
            let (Some(x), Some(y)) = (write_counts(a, l), write_counts(b, l)) else {
                fails.push(format!("{} {l}: no write step in both boots", k.name));
                continue;
            };
            let apart: Vec<String> = x
                .iter()
                .filter_map(|&(m, n)| {
                    let o = y.iter().find(|(c, _)| *c == m).map(|&(_, o)| o)?;
                    (n.abs_diff(o) > SLACK).then(|| format!("{} {n} against {o}", m.name()))
                })
                .collect();
            println!(
                "{} {l}: model off against Debian's QEMU, write step: {} classes{}",
                k.name,
                x.len(),
                if apart.is_empty() {
                    format!(" within {SLACK}")
                } else {
                    format!(", apart: {}", apart.join(", "))
                }
            );
            if !apart.is_empty() {
                fails.push(format!("{} {l}: {}", k.name, apart.join(", ")));
            }
        }
    }
    anyhow::ensure!(fails.is_empty(), "the model off is not Debian's QEMU: {}", fails.join("; "));
    Ok(())
}

/// The bench's process in a case's report (`LABEL.json`), if the case
/// left one.
fn bench_process(run: &GuestRun, label: &str) -> Option<faultscope::report::schema::Process> {
    let r = check::report(run, &format!("{label}.json")).ok()?;
    check::process(&r, r.bench.as_ref()?.pid).ok().cloned()
}

/// Under the stale-TLB model: the spurious faults faultscope split as
/// stale TLB in a boot's benches (whole runs) against QEMU's own count of
/// the faults its model raised in the boot, every process of the guest.
/// faultscope's may exceed it only by races it read as stale
/// ([`STRETCHED_RACES`] a case); QEMU's may exceed it by the faults of the
/// guest's other processes ([`SLACK`]).
fn check_model_count(run: &GuestRun, kernel: &str, labels: &[String]) -> Vec<String> {
    let Some(model) = run.stale_tlb_faults else {
        return vec![format!("{kernel}: QEMU printed no count of its stale-TLB model's faults")];
    };
    let counted = |l: &String| -> Option<u64> {
        bench_process(run, l)?.classes.get(&ReportClass::SpuriousStaleTlb)?.count()
    };
    let sum: u64 = labels.iter().filter_map(counted).sum();
    let most = model + STRETCHED_RACES * labels.len() as u64;
    let line = format!(
        "{kernel}: spurious_stale_tlb {sum} in the benches, QEMU's model raised {model} (every process): \
         {} <= {sum} <= {most}",
        model.saturating_sub(SLACK)
    );
    println!("{line}");
    if sum <= most && model <= sum + SLACK {
        Vec::new()
    } else {
        vec![line]
    }
}

/// `probes --load` on this kernel (matrix.sh runs it first): every
/// program accepted, none over faultscope's verifier budget (each kernel's
/// verifier walks the same programs differently). Returns the line to
/// print (the largest program and the sum) and the failures.
fn check_verifier(kernel: &str, rc: &str, out: &str) -> (String, Vec<String>) {
    let mut fails = Vec::new();
    if rc != "0" {
        fails.push(format!("{kernel}: probes --load exited {rc:?}"));
    }
    let (mut n, mut largest, mut sum) = (0, ("", 0u64), 0u64);
    for l in out.lines().filter(|l| l.starts_with("verifier: ")) {
        if l.contains("REJECTED") || l.contains("over the budget") {
            fails.push(format!("{kernel}: {l}"));
        }
        let Some((name, insns)) = faultscope::cmd::probes::read_loaded_line(l) else { continue };
        let insns = u64::from(insns);
        n += 1;
        sum += insns;
        if insns > largest.1 {
            largest = (name, insns);
        }
    }
    if n == 0 {
        fails.push(format!("{kernel}: probes --load printed no verified program:\n{out}"));
    }
    let line = format!(
        "{kernel} verifier: {n} programs, the largest {} ({} instructions), {sum} in all",
        largest.0, largest.1
    );
    (line, fails)
}

/// One kernel's guest, ready to boot: its kernel, the faultscope build for
/// its architecture, its directory, cases and backends.
struct Guest {
    k: GuestKernel,
    vmlinuz: std::path::PathBuf,
    bin: std::path::PathBuf,
    dir: std::path::PathBuf,
    cases: Vec<String>,
    backends: Vec<String>,
    tlb: Tlb,
}

impl Guest {
    /// Boots it with `cases` under `backends`, the check's options `what`.
    /// A rerun names its cases as labels (CASE@BACKEND): each boot runs the
    /// cases it is given under the backends it is given.
    fn boot(&self, size: &str, what: Boot, cases: &[String], backends: &[String]) -> Result<GuestRun> {
        let mut env =
            vec![("SIZE", size.to_string()), ("CASES", case_lines(cases)?), ("BACKENDS", backends.join(" "))];
        if what != Boot::Matrix {
            env.push(("VERIFIER", "0".to_string()));
        }
        if what == Boot::Gates {
            // 256M of 64K folios reused page by page on arm64 is ~6
            // events per fault in one CPU's buffer.
            env.extend([("GATES", "1".to_string()), ("TRACE_KB", "98304".to_string())]);
        }
        let cpio = crate::vm::initramfs(&self.dir, self.k.arch, &self.bin, "matrix.sh", &env)?;
        let machine = crate::vm::Machine { tlb: self.tlb, ..crate::vm::Machine::host() };
        let timeout = std::time::Duration::from_secs(900);
        crate::vm::boot_with(self.k, &self.vmlinuz, &cpio, &self.dir, timeout, &[], machine)
    }
}

/// [`run_each`] with the same `cases` on every kernel.
fn run_with(
    kernels: &[GuestKernel],
    size: &str,
    cases: &[String],
    backends: &[String],
    what: Boot,
) -> Result<Vec<(GuestKernel, GuestRun)>> {
    let plan: Vec<Planned> = kernels.iter().map(|&k| (k, cases.to_vec(), tlb())).collect();
    run_each(&plan, size, backends, what)
}

/// A kernel to boot, its cases, and the TLB model of its QEMU.
type Planned = (GuestKernel, Vec<String>, Tlb);

/// Boots each kernel of `plan` with its cases (several guests at once),
/// under each of its backends ([`backends_for`]), and checks them in order.
fn run_each(
    plan: &[Planned],
    size: &str,
    backends: &[String],
    what: Boot,
) -> Result<Vec<(GuestKernel, GuestRun)>> {
    let mut failures = Vec::new();
    let guests = prepare(plan, backends, what, &mut failures)?;
    // The boots, several at once; then their checks, in order.
    let runs = crate::vm::boot_each(&guests, |g| g.boot(size, what, &g.cases, &g.backends));
    let mut boots = Vec::new();
    for (g, run) in guests.iter().zip(runs) {
        // A guest that could not run fails the stage; the others are
        // still checked.
        match run {
            Ok(run) => {
                check_guest(g, &run, size, what, &mut failures)?;
                boots.push((g.k, run));
            }
            Err(e) => failures.push(format!("{}: {e:#}", g.k.name)),
        }
    }
    if !failures.is_empty() {
        anyhow::bail!("matrix failed:\n  {}", failures.join("\n  "));
    }
    Ok(boots)
}

/// Each kernel of `plan` with what its boot needs, downloaded and built one
/// at a time. A kernel that cannot be had (a build that failed) fails the
/// run; the other kernels still run.
fn prepare(
    plan: &[Planned],
    backends: &[String],
    what: Boot,
    failures: &mut Vec<String>,
) -> Result<Vec<Guest>> {
    use crate::{kernels, util::root, vm};
    let mut guests = Vec::new();
    for (k, cases, tlb) in plan {
        let (k, tlb) = (*k, *tlb);
        if k.skipped(&format!("matrix {}", cases.join(" "))) {
            continue;
        }
        let vmlinuz = match kernels::fetch(k) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!("{}: no kernel: {e:#}", k.name));
                continue;
            }
        };
        let bin = vm::build_faultscope(k.arch)?;
        if tlb != Tlb::Exact {
            // Built here, once, not by two boots at once.
            crate::qemu::build()?;
        }
        let sub = if what == Boot::Gates { "gates" } else { "matrix" };
        // A folder per TLB model: one kernel may boot under two at once.
        let model = if tlb == Tlb::Exact { String::new() } else { format!("-tlb-{tlb:?}").to_lowercase() };
        let dir = root().join("target/vm").join(sub).join(format!("{}{model}", k.name));
        std::fs::create_dir_all(&dir)?;
        guests.push(Guest {
            k,
            vmlinuz,
            bin,
            dir,
            cases: cases.clone(),
            backends: backends_for(k.name, backends),
            tlb,
        });
    }
    Ok(guests)
}

/// One guest's cases, its verifier and `verify` checks, and a rerun of the
/// cases that measured nothing.
fn check_guest(g: &Guest, run: &GuestRun, size: &str, what: Boot, failures: &mut Vec<String>) -> Result<()> {
    let (k, bs) = (g.k, &g.backends);
    let labels: Vec<String> = bs.iter().flat_map(|b| g.cases.iter().map(move |c| label(c, b))).collect();
    let harness_errors = check_cases(run, k, &labels, failures);
    if run.tlb == Tlb::Stale {
        failures.extend(check_model_count(run, k.name, &labels));
    }
    failures.extend(check_verify(run, k, what == Boot::Gates));
    if what == Boot::Matrix {
        let rc = run.marker("RC", "verifier").unwrap_or_default();
        let (line, fails) = check_verifier(k.name, &rc, run.section("verifier.out").unwrap_or(""));
        println!("{line}");
        failures.extend(fails);
    }
    println!(
        "guest {} ran {} cases ({}) in {:.1}s{}",
        k.name,
        labels.len(),
        bs.join(", "),
        run.wall.as_secs_f64(),
        if g.tlb == Tlb::Exact { String::new() } else { format!(", QEMU --tlb {:?}", g.tlb) }
    );
    print_complaints(run);
    // A case without results (no bench output, no oracle counts for it)
    // measured nothing, right or wrong: it runs once more in a fresh
    // guest, and the first error stays in the log. Count mismatches are
    // never rerun.
    if harness_errors.is_empty() {
        return Ok(());
    }
    let again: Vec<String> = harness_errors.iter().map(|(c, _)| c.clone()).collect();
    for (_, e) in &harness_errors {
        println!("HARNESS ERROR (the case runs again in a new guest): {e}");
    }
    // The failed labels' cases under the failed labels' backends (a few
    // more cases than failed, at most, never fewer).
    let split = |i: usize| -> Vec<String> {
        let mut v: Vec<String> = again.iter().filter_map(|l| l.split('@').nth(i).map(String::from)).collect();
        v.sort();
        v.dedup();
        v
    };
    let rerun = g.boot(size, what, &split(0), &split(1))?;
    for (_, e) in check_cases(&rerun, k, &again, failures) {
        failures.push(format!("{e} (twice)"));
    }
    println!("guest {} reran {} cases in {:.1}s", k.name, again.len(), rerun.wall.as_secs_f64());
    print_complaints(&rerun);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_each_keeps_the_order_of_its_items() {
        let items: Vec<u64> = (0..7).collect();
        let out = crate::vm::boot_each(&items, |&i| {
            // The later items finish first.
            std::thread::sleep(std::time::Duration::from_millis(20 * (7 - i)));
            i * 2
        });
        assert_eq!(out, vec![0, 2, 4, 6, 8, 10, 12]);
    }

    #[test]
    fn the_verifier_check_reads_probes_load() {
        let out =
            "mode: kprobe mode\nverifier: fault_entry: ok (18483 instructions verified, loaded in 17.6 ms)\n\
                   verifier: fault_return: ok (21118 instructions verified, loaded in 27.1 ms)\n\
                   verifier: wp_page_fe: not loadable here (auto uses the kprobe): refused\n\
                   verifier: all loaded programs: 39601 instructions verified, loaded in 45 ms\n";
        let (line, fails) = check_verifier("k", "0", out);
        assert!(fails.is_empty(), "{fails:?}");
        assert_eq!(
            line,
            "k verifier: 2 programs, the largest fault_return (21118 instructions), 39601 in all"
        );
        let over = out.replace("27.1 ms)", "27.1 ms, over the budget of 100000)");
        assert_eq!(check_verifier("k", "0", &over).1.len(), 1);
        assert_eq!(check_verifier("k", "1", "verifier: x: REJECTED: no").1.len(), 3);
    }

    #[test]
    fn unfold_stacks_name_the_kernels_own_caller() {
        let stack = |frames: &[&str], count| StackRow {
            class: ReportClass::ContpteUnfold,
            user: vec![],
            // Outermost first, as the report has them.
            kernel: frames.iter().rev().map(|f| f.to_string()).collect(),
            count,
        };
        let a612 = Attribution {
            stacks: vec![stack(
                &[
                    "contpte_convert+0x0",
                    "__contpte_try_unfold+0x3c",
                    "ptep_clear_flush+0x118",
                    "do_wp_page+0x4fc",
                ],
                256,
            )],
            ..Attribution::default()
        };
        let (t, checks) = unfold_stacks("6.12.117+deb12-cloud-arm64", &a612, 256, Some(256));
        assert!(checks.iter().all(|(ok, _)| *ok), "{checks:?}");
        assert!(
            t.contains("x256: contpte_convert+0x0 <- __contpte_try_unfold+0x3c <- ptep_clear_flush+0x118"),
            "{t}"
        );
        // On 7.3 the same stack is not the kernel's path, and the oracle saw
        // no call of __contpte_try_unfold.
        let (_, checks) = unfold_stacks("7.3.4+deb13-cloud-arm64", &a612, 256, Some(0));
        let failed: Vec<&String> = checks.iter().filter(|(ok, _)| !ok).map(|(_, w)| w).collect();
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(
            failed[1].contains("0 of 256 unfolds: contpte_convert <- contpte_ptep_set_access_flags"),
            "{failed:?}"
        );
        let a73 = Attribution {
            stacks: vec![stack(
                &["contpte_convert+0x0", "contpte_ptep_set_access_flags+0x140", "wp_page_reuse+0x120"],
                256,
            )],
            ..Attribution::default()
        };
        let (_, checks) = unfold_stacks("7.3.4+deb13-cloud-arm64", &a73, 256, Some(0));
        assert!(checks.iter().all(|(ok, _)| *ok), "{checks:?}");
        // Without the direct caller (the kernel's own unwinder at a kprobe).
        let bare = Attribution {
            stacks: vec![stack(&["contpte_convert+0x0", "wp_page_reuse+0x120"], 256)],
            ..Attribution::default()
        };
        let (_, checks) = unfold_stacks("7.3.4+deb13-cloud-arm64", &bare, 256, Some(0));
        assert!(!checks[2].0, "{checks:?}");
        // A kernel of no known path: printed, not checked.
        let (t, checks) = unfold_stacks("6.18.1", &a73, 256, Some(0));
        assert_eq!(checks.len(), 2);
        assert!(t.contains("direct callers {\"contpte_ptep_set_access_flags\"}"), "{t}");
    }

    /// On a kernel without multi-size THP the 64K cases are refused, the
    /// others run; the refusal is checked, not skipped.
    #[test]
    fn a_kernel_without_mthp_refuses_64k() {
        use check::testing::*;
        let k61 = crate::kernels::by_name("6.1-cloud-arm64").unwrap();
        let k612 = crate::kernels::by_name("6.12-cloud-arm64").unwrap();
        let why = "--folio 64K needs multi-size THP (Linux 6.8 or later): \
                   /sys/kernel/mm/transparent_hugepage/hugepages-64kB is missing";
        for c in ["64k-exit", "64k-alive"] {
            assert_eq!(expected_refusal(&k61, c).as_deref(), Some(why), "{c}");
            assert_eq!(expected_refusal(&k612, c), None, "{c}");
        }
        for c in ["4k-exit", "2m-pte-exit", "2m-pmd-exit", "4k-alive", "spurious-race"] {
            assert_eq!(expected_refusal(&k61, c), None, "{c}");
        }
        let out = format!("faultscope: {why}\n");
        let run = |rc: &str, out: &str| {
            guest_run(&format!("@@FS-RC 64k-exit@kprobe {rc}\n"), &[("64k-exit@kprobe.out", out)])
        };
        let mut failures = Vec::new();
        let errs = check_cases(&run("2", &out), k61, &["64k-exit@kprobe".into()], &mut failures);
        assert!(errs.is_empty() && failures.is_empty(), "{errs:?} {failures:?}");
        // Ran instead, or refused after printing more.
        check_cases(&run("0", &out), k61, &["64k-exit@kprobe".into()], &mut failures);
        assert_eq!(failures, ["6.1-cloud-arm64 kprobe 64k-exit: bench exit 0 = 2 (refused)"]);
        failures.clear();
        let two = format!("faultscope: measuring faults\n{out}");
        check_cases(&run("2", &two), k61, &["64k-exit@kprobe".into()], &mut failures);
        assert_eq!(failures.len(), 1);
        assert!(failures[0].contains("its output is the one line"), "{failures:?}");
        // No exit status: the harness's error (rerun).
        let none = guest_run("", &[]);
        assert_eq!(check_cases(&none, k61, &["64k-exit@kprobe".into()], &mut failures).len(), 1);
    }

    #[test]
    fn fentry_runs_on_one_kernel_per_arch() {
        assert_eq!(backends_for("6.12-cloud-amd64", &[]), ["kprobe", "fentry"]);
        assert_eq!(backends_for("7.3-cloud-arm64", &[]), ["kprobe", "fentry"]);
        assert_eq!(backends_for("6.12-cloud-arm64", &[]), ["kprobe"]);
        assert_eq!(backends_for("6.12-cloud-arm64", &["fentry".into()]), ["fentry"]);
        for k in FENTRY_KERNELS {
            assert!(crate::kernels::KERNELS.iter().any(|g| g.name == k), "{k}");
        }
    }

    #[test]
    fn a_missing_oracle_phase_says_what_the_trace_held() {
        let console = "@@FS-RC c 0\n@@FS-OVERRUN c 0\n@@FS-BEGIN c.oracle\n\
                       oracle tgid=7 phase=ALL faults=1\n\
                       oracle: 9 trace lines, 0 with an unknown tgid, 1 processes exec'd: 7; phases: x\n\
                       @@FS-END c.oracle\n";
        let run = GuestRun {
            console: console.into(),
            sections: crate::vm::sections(console),
            wall: std::time::Duration::ZERO,
            stale_tlb_faults: None,
            tlb: crate::vm::Tlb::Exact,
        };
        let e =
            check_case(&run, "k", Choices::STOCK, "c").err().expect("no JSON: a harness error").to_string();
        assert!(e.contains("no section c.json"), "{e}");
        let gap = check::oracle_gap(&run, "c", "c.oracle", 8, "mark:write");
        assert!(gap.contains("no mark:write phase for pid 8"), "{gap}");
        assert!(gap.contains("1 processes exec'd: 7; phases: x; trace buffer overrun 0"), "{gap}");
    }

    /// The gate's exit must follow the oracle's reuse count and the kernel:
    /// stock 7.3 fails it with the count, the patched kernel passes.
    #[test]
    fn gates_follow_the_oracle_and_the_kernel() {
        use check::testing::*;
        let stock = crate::kernels::by_name("7.3-cloud-amd64").unwrap();
        let patched = crate::kernels::by_name("7.3-folio-reuse-amd64").unwrap();
        // bench_json: 16 folios; the oracle's write step reuse decides.
        let run = |reuse: u64, rc: &str| {
            let oracle = X86_UNKNOWN.to_string() + &oracle_line("mark:write", reuse, reuse, 0);
            let out = format!("reuse/folio<=1.05: reuse is {} ({reuse} / 16)", reuse as f64 / 16.0);
            let mut markers = String::new();
            let mut sections = Vec::new();
            for c in GATE_CASES.iter().map(|c| label(c, GATE_BACKEND)) {
                markers += &format!("@@FS-GATE {c} {rc}\n");
                sections.push((format!("{c}.json"), bench_json()));
                sections.push((format!("{c}.oracle"), oracle.clone()));
                sections.push((format!("gate-{c}"), out.clone()));
            }
            let s: Vec<(&str, &str)> = sections.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            guest_run(&markers, &s)
        };
        // 7.3 reuses page by page: 256 for 16 folios, the gate fails (1).
        assert_eq!(check_gates(&run(256, "1"), stock), Vec::<String>::new());
        let f = check_gates(&run(256, "0"), stock);
        assert!(f[0].contains("exit 0, the oracle's count wants 1"), "{f:?}");
        // The patched kernel: 16 for 16, the gate passes (0).
        assert_eq!(check_gates(&run(16, "0"), patched), Vec::<String>::new());
        // A patched kernel that still reuses page by page must pass, and fails.
        let f = check_gates(&run(256, "1"), patched);
        assert!(
            f.iter().any(|x| x.contains("reuse 256 for 16 folios; this kernel must pass the gate")),
            "{f:?}"
        );
        // verify must print the count it judged.
        let mut r = run(16, "0");
        for c in GATE_CASES.iter().map(|c| label(c, GATE_BACKEND)) {
            r.sections.insert(format!("gate-{c}"), "reuse/folio<=1.05: reuse is 1".into());
        }
        let f = check_gates(&r, patched);
        assert!(f[0].contains("does not print reuse 16 / 16 folios"), "{f:?}");
    }

    /// On a whole-folio kernel the 64K case wants one reuse per folio.
    #[test]
    fn a_whole_folio_kernel_reuses_once_per_folio() {
        use check::testing::*;
        let json = bench_json()
            .replace("\"folio\":\"4K\"", "\"folio\":\"64K\"")
            .replace("\"folios\":16", "\"folios\":1");
        assert!(json.contains("\"folios\":1,"), "{json}");
        let oracle = X86_UNKNOWN.to_string()
            + &oracle_line("mark:populate", 16, 0, 0)
            + &oracle_line("mark:fork", 3, 0, 1)
            + &oracle_line("mark:write", 20, 20, 0);
        let markers = format!("@@FS-RC 64k-exit 0\n@@FS-OVERRUN 64k-exit 0\n{X86_REFUSED}");
        let json = json.replace(r#""sizes":{"4K":16}"#, r#""sizes":{"64K":1}"#);
        let (a0, a1) = ("64K 5\npmd 2", "64K 6\npmd 2");
        let run = guest_run(
            &markers,
            &[
                ("64k-exit.json", &json),
                ("64k-exit.oracle", &oracle),
                ("64k-exit.alloc0", a0),
                ("64k-exit.alloc1", a1),
            ],
        );
        // 20 reuse faults for 1 folio (+16 slack is 17): not whole-folio.
        let r =
            check_case(&run, "k", Choices { reuse: FolioReuse::WholeFolio, ..Choices::STOCK }, "64k-exit")
                .unwrap();
        assert_eq!(
            r.failures,
            ["k kprobe 64k-exit: reuse 20 + copy 0 = folios 1 (+16), copy <= 62: this kernel reuses a 64K folio whole"]
        );
        let r = check_case(&run, "k", Choices::STOCK, "64k-exit").unwrap();
        assert!(r.failures.is_empty(), "{:?}", r.failures);
    }

    #[test]
    fn a_case_against_its_oracle_steps_and_arithmetic() {
        use check::testing::*;
        let oracle = X86_UNKNOWN.to_string()
            + &oracle_line("mark:populate", 16, 0, 0)
            + &oracle_line("mark:fork", 3, 0, 1)
            + &oracle_line("mark:write", 20, 21, 0).replace(" wp_faults=21 ", " wp_faults=20 ");
        // A case's run: its markers, report, oracle and the kernel's THP
        // counts (none allocated: 4K folios).
        let case_run = |l: &str, oracle: &str| {
            let markers = format!("@@FS-RC {l} 0\n@@FS-OVERRUN {l} 0\n{X86_REFUSED}");
            let (json, alloc) = (bench_json(), "64K 5\npmd 2");
            let sections =
                [("json", json.as_str()), ("oracle", oracle), ("alloc0", alloc), ("alloc1", alloc)]
                    .map(|(s, body)| (format!("{l}.{s}"), body));
            guest_run(&markers, &sections.iter().map(|(n, b)| (n.as_str(), *b)).collect::<Vec<_>>())
        };
        let run = case_run("4k-exit@kprobe", &oracle);
        let r = check_case(&run, "k", Choices::STOCK, "4k-exit@kprobe").unwrap();
        assert_eq!(r.failures, ["k kprobe 4k-exit mark:write: reuse: faultscope 20 != oracle 21"]);
        assert!(r.table.contains("  ok   populate: new 4K folios 16 = folios 16 (+16)"), "{}", r.table);
        assert!(r.table.contains("  ok   new 64K folios: faultscope 0, the kernel counted 0"), "{}", r.table);
        // The same run checked as a fentry case: its probes were kprobes.
        let run = case_run("4k-exit@fentry", &oracle);
        let r = check_case(&run, "k", Choices::STOCK, "4k-exit@fentry").unwrap();
        assert!(
            r.failures[0].contains("--backend fentry, but the probes attached as [\"kretprobe\"]"),
            "{:?}",
            r.failures
        );
        assert!(r.table.contains("write-phase getrusage minflt 20"), "{}", r.table);
        assert!(r.table.contains("\n  copy                                   0/0                   1/1                   0/0\n"), "{}", r.table);
        assert!(r.table.contains("\n  contpte_unfold                       n/m/-                 n/m/-                 n/m/-\n"), "{}", r.table);
        assert!(r.table.contains("  ok   reuse 20 + copy 0 = pages 16 (+16), copy <= 62"), "{}", r.table);
        assert!(r.table.contains("oracle cannot count: contpte is arm64 only"), "{}", r.table);
        // A step the oracle did not see is the harness's error.
        let run = case_run("4k-exit@kprobe", "");
        let e = format!("{:#}", check_case(&run, "k", Choices::STOCK, "4k-exit@kprobe").err().unwrap());
        assert!(e.contains("no mark:populate phase for pid 7"), "{e}");
    }
}
