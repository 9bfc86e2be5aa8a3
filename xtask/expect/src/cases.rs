//! The kernel matrix's cases: `faultscope bench` runs whose write step
//! shows a kernel's choice (reuse or copy, by page or by folio; a THP
//! split, reused or copied whole; spurious faults), each held to the page
//! arithmetic, the kernel's own counters, `verify` as CI runs it and, in a
//! guest, the oracle of each step. The host tests run them
//! (`tracer/tests/host/matrix.rs`); xtask picks which, per kernel.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use faultscope::{
    kernel::classes::ReportClass,
    report::schema::{
        Attribution, Bench, ClassValue, Classes, Folios, Hotpatch, Measured, PmdOutcomes, Report, Span,
        StackRow,
    },
    units::{PAGE, PMD_SIZE},
};

use crate::{
    kernel_at_least,
    oracle::{skipped_runs, Oracle, ORIGINS},
    Checklist, LRU_BATCH_COPIES,
};

/// Every case: its name and the bench it runs (the test adds `--size`,
/// `--backend`, `--json` and, for a hot patch, `--file-dir`).
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
    // A private executable file mapping of file THPs, patched one byte a
    // THP as a hot patcher (mprotect, stores) and as a debugger
    // (/proc/self/mem).
    ("hotpatch", "hotpatch --folio 2M"),
    ("hotpatch-mem", "hotpatch-mem --folio 2M"),
];

/// Cases run on every kernel by default (`cargo xtask test`).
pub const DEFAULT_CASES: &[&str] =
    &["4k-exit", "64k-exit", "2m-pte-exit", "2m-pmd-exit", "2m-pmd-alive", "4k-alive", "spurious-race"];

/// The cases whose write step `verify --expect contpte_unfold=0` judges.
pub const VERIFY_CASES: &[&str] = &["64k-exit", "4k-exit"];

/// The cases of the whole-folio reuse gate (`verify --expect
/// reuse/folio<=1.05`), run by the suite at [`GATE_SIZE`].
pub const GATE_CASES: &[&str] = &["64k-exit", "2m-pte-exit"];

/// The bound of the whole-folio reuse gate: one reuse fault per folio, and
/// the bench's own few faults (its stack and heap pages after the fork).
pub const GATE: &str = "reuse/folio<=1.05";

/// [`GATE`]'s bound as a number, read from it (declared once).
fn gate_ratio() -> f64 {
    GATE.rsplit("<=").next().and_then(|r| r.parse().ok()).unwrap_or(f64::NAN)
}

/// The bench's own faults in a write step after the child's exit (its
/// stack and heap pages): 0-4 measured. Where the gate allows fewer extra
/// reuses than this, a whole-folio kernel may fail it by them alone.
const OWN_FAULTS_AFTER_EXIT: u64 = 4;

/// The size the gate's figures are for: the bench's own faults weigh under
/// 5% there.
pub const GATE_SIZE: &str = "256M";

/// Faults of the bench's own pages (stack, heap) in its write step: 0-4,
/// 4-9 with the child alive. The oracle comparison stays exact.
pub const SLACK: u64 = 16;

/// The case whose threads store to the same pages: the only one with
/// races, so the only one whose stale-TLB readings may be races the host
/// stretched across a fault's open (see [`expect_spurious_race`]).
pub const RACING_CASE: &str = "spurious-race";

/// New anonymous THPs the kernel allocated that faultscope does not trace
/// in a case: faultscope's own heap, where it grows while the bench's folio
/// size is set to `always`. Measured: 0 in each case at 16M on 6.12 amd64.
pub const UNTRACED_THPS: u64 = 16;

/// The write step's phase: the last step of every bench run (a hotpatch
/// run has no fork step).
pub const WRITE: &str = "mark:write";

/// The host test of case `name`, as libtest names it.
pub fn test_name(name: &str) -> String {
    format!("matrix::case_{}", name.replace('-', "_"))
}

/// The bench arguments of case `name`.
pub fn args(name: &str) -> Option<&'static str> {
    CASES.iter().find(|(n, _)| *n == name).map(|(_, a)| *a)
}

/// What a kernel chooses on the paths the cases take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choices {
    pub reuse: FolioReuse,
    /// The reuse ends with a flush of the faulting CPU's TLB (the cover
    /// letter's experiment): that CPU keeps no read-only entry of the
    /// folio's other pages.
    pub local_flush: bool,
    /// A write fault on a private executable file THP copies it whole into
    /// an anonymous THP (the exec THP COW series).
    pub exec_thp_cow: bool,
}

impl Choices {
    /// A kernel as released: page by page, no patch.
    pub const STOCK: Choices =
        Choices { reuse: FolioReuse::PageByPage, local_flush: false, exec_thp_cow: false };

    /// The variable a guest passes them in (the kernel is built here with a
    /// series the running kernel cannot name).
    pub const ENV: &'static str = "FAULTSCOPE_KERNEL_CHOICES";

    /// As [`Choices::ENV`] holds them: `reuse=whole-folio,local-flush`.
    pub fn to_env(self) -> String {
        let mut v = vec![format!("reuse={}", self.reuse.name())];
        v.extend(self.local_flush.then(|| "local-flush".to_string()));
        v.extend(self.exec_thp_cow.then(|| "exec-thp-cow".to_string()));
        v.join(",")
    }

    /// From [`Choices::to_env`]'s form; a word not known is an error.
    pub fn parse(s: &str) -> Result<Choices, String> {
        let mut c = Choices::STOCK;
        for w in s.split(',').filter(|w| !w.is_empty()) {
            match w.split_once('=') {
                Some(("reuse", r)) => {
                    c.reuse =
                        FolioReuse::ALL.into_iter().find(|f| f.name() == r).ok_or(format!("reuse {r:?}"))?
                }
                None if w == "local-flush" => c.local_flush = true,
                None if w == "exec-thp-cow" => c.exec_thp_cow = true,
                _ => return Err(format!("{w:?} in {s:?}")),
            }
        }
        Ok(c)
    }

    /// This run's: [`Choices::ENV`], else a stock kernel's.
    pub fn from_env() -> Choices {
        match std::env::var(Choices::ENV) {
            Ok(s) => Choices::parse(&s).unwrap_or_else(|e| panic!("{}: {e}", Choices::ENV)),
            Err(_) => Choices::STOCK,
        }
    }
}

/// How a kernel reuses an exclusive anonymous large folio (PTE-mapped) that
/// a write faults on, once the forked child is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FolioReuse {
    /// One page per fault (7.3), or copied page by page (6.12).
    PageByPage,
    /// The whole folio in one fault: one reuse fault per folio, and arm64
    /// does not unfold its contpte blocks.
    WholeFolio,
    /// An aligned block of 16 PTEs (64K, a contpte block) per fault: 64K
    /// folios whole, 32 faults per PTE-mapped 2M folio.
    ContpteBlock,
}

impl FolioReuse {
    const ALL: [FolioReuse; 3] = [FolioReuse::PageByPage, FolioReuse::WholeFolio, FolioReuse::ContpteBlock];

    fn name(self) -> &'static str {
        match self {
            FolioReuse::PageByPage => "page-by-page",
            FolioReuse::WholeFolio => "whole-folio",
            FolioReuse::ContpteBlock => "contpte-block",
        }
    }
}

/// What a case may expect of a kernel and of how faultscope ran on it.
#[derive(Clone, Copy)]
pub struct KernelTraits {
    pub choices: Choices,
    /// The guest runs under QEMU's stale-TLB model.
    pub stale_tlb: bool,
}

impl KernelTraits {
    /// The traits of a run: the choices and the TLB model as the guest
    /// says ([`Choices::ENV`], `FAULTSCOPE_TLB=stale`).
    pub fn of_run() -> KernelTraits {
        let stale_tlb = std::env::var("FAULTSCOPE_TLB").is_ok_and(|t| t == "stale");
        KernelTraits { choices: Choices::from_env(), stale_tlb }
    }
}

/// The kernel's own counts over a case's run: the anonymous THPs its
/// faults allocated, by size in bytes (each multi-size THP's
/// `anon_fault_alloc`, 6.10 on, and `/proc/vmstat`'s `thp_fault_alloc` for
/// the PMD's size), and the PMDs it split (`thp_split_pmd`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelCounters {
    pub thp_allocs: BTreeMap<u64, u64>,
    pub split_pmd: Option<u64>,
}

impl KernelCounters {
    /// This kernel's counters now.
    pub fn read() -> KernelCounters {
        let mm = "/sys/kernel/mm/transparent_hugepage";
        let mut sizes = Vec::new();
        for d in std::fs::read_dir(mm).into_iter().flatten().flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            let Some(kb) = name.strip_prefix("hugepages-").and_then(|n| n.strip_suffix("kB")) else {
                continue;
            };
            let Ok(n) = std::fs::read_to_string(d.path().join("stats/anon_fault_alloc")) else { continue };
            sizes.push((kb.parse::<u64>().unwrap_or(0) << 10, n.trim().parse().unwrap_or(0)));
        }
        KernelCounters::parse(&sizes, &std::fs::read_to_string("/proc/vmstat").unwrap_or_default())
    }

    /// From the per-size counts (bytes, count) and `/proc/vmstat`'s text.
    pub fn parse(sizes: &[(u64, u64)], vmstat: &str) -> KernelCounters {
        let mut c = KernelCounters::default();
        // The PMD's own multi-size counter repeats thp_fault_alloc.
        c.thp_allocs.extend(sizes.iter().copied().filter(|(s, _)| *s != PMD_SIZE));
        for l in vmstat.lines() {
            match l.split_once(' ') {
                Some(("thp_fault_alloc", n)) => {
                    c.thp_allocs.insert(PMD_SIZE, n.trim().parse().unwrap_or(0));
                }
                Some(("thp_split_pmd", n)) => c.split_pmd = n.trim().parse().ok(),
                _ => {}
            }
        }
        c
    }

    /// The counts from `before` to `self`.
    pub fn since(&self, before: &KernelCounters) -> KernelCounters {
        let thp_allocs = self
            .thp_allocs
            .iter()
            .map(|(s, n)| (*s, n.saturating_sub(before.thp_allocs.get(s).copied().unwrap_or(0))))
            .collect();
        let split_pmd = self.split_pmd.zip(before.split_pmd).map(|(a, b)| a.saturating_sub(b));
        KernelCounters { thp_allocs, split_pmd }
    }
}

/// Why `bench` must refuse `case` on a kernel of `release`, the line it
/// must print: a folio size between 4K and 2M on a kernel without
/// multi-size THP (before 6.8: 6.1 has only the PMD's 2M THP).
pub fn expected_refusal(release: &str, case: &str) -> Option<String> {
    let mut words = args(case)?.split_whitespace();
    words.by_ref().find(|w| *w == "--folio")?;
    let folio = words.next()?;
    if kernel_at_least(release, 6, 8) || matches!(folio, "4K" | "2M") {
        return None;
    }
    let kb = folio.strip_suffix('K')?.parse::<u64>().ok()?;
    Some(format!(
        "--folio {folio} needs multi-size THP (Linux 6.8 or later): \
         /sys/kernel/mm/transparent_hugepage/hugepages-{kb}kB is missing"
    ))
}

/// A case the kernel cannot run: bench exited `rc` with `output` (stdout
/// and stderr), and must have refused with `why` as the one line it
/// printed (before it attaches: nothing else).
pub fn expect_refusal(cl: &mut Checklist, why: &str, rc: Option<i32>, output: &str) {
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    let want = format!("faultscope: {why}");
    cl.line("  refused, as this kernel must (no multi-size THP)");
    cl.expect(rc == Some(2), format!("bench exit {rc:?} = 2 (refused)"));
    cl.expect(lines == [want.as_str()], format!("its output is the one line {want:?}: {lines:?}"));
}

/// One case's run, what its checks read.
pub struct Run<'a> {
    pub case: &'a str,
    pub traits: KernelTraits,
    pub report: &'a Report,
    /// The oracle of the run, in a guest.
    pub oracle: Option<&'a Oracle>,
    /// The kernel's counters over the run ([`KernelCounters::since`]),
    /// where nothing else ran (a guest: they are machine-wide).
    pub kernel: Option<&'a KernelCounters>,
}

/// Checks one case's run: each step against the oracle where there is one,
/// then what the kernel chose against the page arithmetic and its own
/// counters. Where the fault path is not probed (no reuse or copy
/// measured), the write step's faults stand against getrusage alone.
pub fn check(cl: &mut Checklist, run: &Run) {
    let Some(b) = run.report.bench.as_ref() else { return cl.expect(false, "the report has a bench") };
    let Some(p) = run.report.bench_process() else {
        return cl.expect(false, "the report has the bench process");
    };
    let write_minflt = b.step("write").map_or(0, |s| s.minflt.max(0) as u64);
    cl.line(format!(
        "  {} pages, {} folios of {}, write-step getrusage minflt {write_minflt}",
        b.pages, b.folios, b.folio
    ));
    let steps: Vec<Span> = b.steps.iter().filter_map(|s| p.span(&format!("mark:{}", s.name))).collect();
    if steps.len() != b.steps.len() {
        return cl.expect(false, format!("a phase for each of the bench's {} steps", b.steps.len()));
    }
    if let Some(o) = run.oracle {
        compare_steps(cl, o, run.report, b, &steps);
    }
    let write = &steps[steps.len() - 1];
    expect_hotpatch_taken(cl, run.case, run.traits.choices, b);
    if write.count(ReportClass::Reuse).is_none() {
        let faults = write.count(ReportClass::Faults).unwrap_or(0);
        cl.line("  reuse and copy are not measurable here (the fault path is not probed)");
        // A write through /proc/PID/mem faults in get_user_pages, with no
        // exception: unseen where only exceptions are traced.
        if run.case == "hotpatch-mem" {
            cl.expect(
                faults <= write_minflt + SLACK,
                format!("write: faults {faults} <= getrusage {write_minflt} (+{SLACK}): its writes fault in get_user_pages, no exception"),
            );
        } else {
            cl.expect(
                faults.abs_diff(write_minflt) <= SLACK,
                format!("write: faults {faults} = getrusage {write_minflt} (+-{SLACK})"),
            );
        }
        return;
    }
    let choices = run.traits.choices;
    expect_kernel_choice(cl, run.case, run.traits, b, write);
    expect_folios(cl, run.report, run.kernel, &steps);
    expect_hotpatch(cl, run.case, choices, run.kernel, run.report, write);
    if let Some(o) = run.oracle {
        expect_unfolds(cl, run.case, choices.reuse, &run.report.kernel, b, write, o);
    }
}

/// Each step's classes against the oracle's, as a table of
/// `faultscope/oracle` cells, for the classes the oracle counts. A cell
/// short by no more than the program runs the kernel skipped (its BPF
/// recursion guard; the report's `program_runs_skipped`) is noted, not
/// failed.
fn compare_steps(cl: &mut Checklist, oracle: &Oracle, report: &Report, b: &Bench, steps: &[Span]) {
    let mut head = format!("  {:<20}", "faultscope/oracle");
    for s in &b.steps {
        let _ = write!(head, " {:>21}", format!("mark:{}", s.name));
    }
    cl.line(head);
    let mut cmps = Vec::new();
    for (s, span) in b.steps.iter().zip(steps) {
        let st = format!("mark:{}", s.name);
        match oracle.compare(&st, &span.classes, b.pid, &st) {
            Some(c) => cmps.push(c.allowing_skipped(&st, report)),
            None => return cl.expect(false, format!("the oracle has a {st} line for pid {}", b.pid)),
        }
    }
    for m in ReportClass::ALL.into_iter().filter(|&m| cmps.iter().any(|c| c.row(m).is_some())) {
        let mut row = format!("  {:<20}", m.name());
        for c in &cmps {
            let cell =
                c.row(m).map_or_else(String::new, |r| format!("{}/{}", r.faultscope_cell(), r.oracle_cell()));
            let _ = write!(row, " {cell:>21}");
        }
        cl.line(row);
    }
    let unknown: BTreeSet<&String> = cmps.iter().flat_map(|c| &c.unknown).collect();
    for why in unknown {
        cl.line(format!("  oracle cannot count: {why}"));
    }
    // Said whatever the cells, so that a failed case shows it too.
    let skipped = skipped_runs(report);
    if skipped > 0 {
        cl.line(format!("  program runs the kernel skipped (program_runs_skipped): {skipped}"));
    }
    let switched: Vec<String> = b.steps.iter().map(|s| format!("mark:{}", s.name)).collect();
    let unseen: Vec<&String> = switched
        .iter()
        .filter(|st| !oracle.windows.contains_key(&(b.pid, st.to_string(), String::new())))
        .collect();
    // Which faults a window held, by origin (what the table's range is).
    for st in &switched {
        let faults = |origin: &str| oracle.window(b.pid, st, origin, "faults");
        if let Some(n) = faults("").filter(|&n| n > 0) {
            let by: Vec<String> =
                ORIGINS.iter().filter_map(|o| Some(format!("{o} {}", faults(o)?))).collect();
            cl.line(format!("  between {st}'s two markers: faults {n} ({})", by.join(", ")));
        }
    }
    cl.expect(
        unseen.is_empty(),
        format!(
            "the oracle saw both markers of each step's mark (a cell's [a..b]: faults between them){}",
            if unseen.is_empty() { String::new() } else { format!(": not of {unseen:?}") }
        ),
    );
    for f in cmps.into_iter().flat_map(|c| c.failures) {
        cl.expect(false, f);
    }
}

/// What the kernel chose in the write step, against the page arithmetic:
/// reuse or copy per page or per folio, bounded by the kernel's own
/// choices (`LRU_BATCH_COPIES`, `SLACK`); the PMD's outcomes; the spurious
/// faults and their split.
fn expect_kernel_choice(cl: &mut Checklist, case: &str, traits: KernelTraits, b: &Bench, write: &Span) {
    match case {
        "4k-exit" | "64k-exit" | "2m-pte-exit" => {
            expect_reuse_after_exit(cl, case, traits.choices.reuse, b, write)
        }
        "2m-pmd-exit" | "2m-pmd-alive" => expect_pmd(cl, case, b, write),
        "4k-alive" | "16k-alive" | "64k-alive" => {
            let c = count(write, ReportClass::Copy);
            cl.expect(within(c, b.pages), format!("copy {c} = pages {} (child alive)", b.pages))
        }
        "spurious-race" => expect_spurious_race(cl, traits, b, write),
        "reader-writer" => expect_reader_writer(cl, traits, b, write),
        "read-then-store-64k" => expect_read_then_store(cl, traits, b, write),
        _ => {}
    }
}

/// A class's count in a span, 0 where not measured.
fn count(span: &Span, m: ReportClass) -> u64 {
    span.count(m).unwrap_or(0)
}

/// `v` is `want`, and at most [`SLACK`] of the bench's own faults more.
fn within(v: u64, want: u64) -> bool {
    (want..=want + SLACK).contains(&v)
}

/// After the child's exit every page is the bench's alone: reused, by page
/// or by folio as the kernel does it, or copied where the kernel chose to
/// (a folio in an LRU-add batch, see `LRU_BATCH_COPIES`).
fn expect_reuse_after_exit(cl: &mut Checklist, case: &str, reuse: FolioReuse, b: &Bench, write: &Span) {
    let (pages, folios, folio) = (b.pages, b.folios, b.folio.as_str());
    let (r, c) = (count(write, ReportClass::Reuse), count(write, ReportClass::Copy));
    let whole = reuse == FolioReuse::WholeFolio || (reuse == FolioReuse::ContpteBlock && case == "64k-exit");
    if case == "4k-exit" {
        cl.expect(
            within(r + c, pages) && c <= LRU_BATCH_COPIES,
            format!(
                "reuse {r} + copy {c} = pages {pages} (+{SLACK}), copy <= {LRU_BATCH_COPIES} (pages in an LRU-add batch)"
            ),
        )
    } else if whole {
        cl.expect(
            within(r + c, folios) && c <= LRU_BATCH_COPIES,
            format!(
                "reuse {r} + copy {c} = folios {folios} (+{SLACK}), copy <= {LRU_BATCH_COPIES}: this kernel reuses a {folio} folio whole"
            ),
        );
    } else {
        cl.expect(
            within(r + c, pages),
            format!(
                "reuse {r} + copy {c} = pages {pages}: this kernel {} {folio} folios page by page",
                if c > r { "copies" } else { "reuses" }
            ),
        );
    }
}

/// PMD-mapped THPs: one PMD write-protect fault each; an exclusive THP is
/// made writable in place, one shared with the child is split and copied
/// page by page (the first page in the same fault).
fn expect_pmd(cl: &mut Checklist, case: &str, b: &Bench, write: &Span) {
    let (pages, folios) = (b.pages, b.folios);
    let h = count(write, ReportClass::HugePmdWp);
    cl.expect(within(h, folios), format!("huge_pmd_wp {h} = THPs {folios}"));
    let Some(o) = pmd_outcomes_of(&write.classes) else {
        return cl.expect(false, "huge_pmd_wp has no outcomes");
    };
    if case == "2m-pmd-exit" {
        cl.expect(
            o.reused == h && o.split == 0 && o.copied == 0,
            format!(
                "huge_pmd_wp: reused {} = {h}, split {} = 0, THP copied {} = 0",
                o.reused, o.split, o.copied
            ),
        );
    } else {
        let c = count(write, ReportClass::Copy);
        cl.expect(
            o.split == h && o.reused == 0 && o.copied == 0 && within(c, pages),
            format!(
                "huge_pmd_wp: split {} = {h}, reused {} = 0, THP copied {} = 0; copy {c} = pages {pages} (+{SLACK})",
                o.split, o.reused, o.copied
            ),
        );
    }
}

/// Four threads that only store: a page's spurious fault is a lost race
/// where every store re-walks (QEMU as shipped); the stale-TLB model may
/// add a few where a CPU cached an entry some other way. The split is made
/// at the fault's open: a race whose winner returned before the loser's
/// fault opened left the loser's CPU with a translation older than the
/// PTE, a stale one, and reads as stale TLB. How many races the host
/// stretches so (stopping a vCPU's thread between its page walk and the
/// fault's open) is its scheduler's choice: 1 a run on an idle host, 4 of
/// 5 seen on a loaded one. So the case bounds the sum (the oracle's count,
/// at most 3 of 4 threads a page) and not the split; the split's rule is
/// held by faultscope-common's unit tests (`fault.rs`, `raced`).
fn expect_spurious_race(cl: &mut Checklist, traits: KernelTraits, b: &Bench, write: &Span) {
    let pages = b.pages;
    let (sp, stale, race) = spurious_split(cl, write);
    cl.expect(
        sp <= 3 * pages,
        format!(
            "spurious {sp} (race {race}, stale TLB {stale}{}), at most 3 of 4 threads a page ({})",
            if traits.stale_tlb { "" } else { ": stale readings here are races stretched across the open" },
            3 * pages
        ),
    );
}

/// The writer's reuses, then the reader's stores: each a spurious fault
/// where its CPU kept the read-only entry (the stale-TLB model), none where
/// it re-walks (QEMU as shipped). Starting the writer thread in the step
/// writes more of the bench's own pages shared at the fork (its heap, the
/// thread's bookkeeping): four times the slack. Under the model the
/// reader's CPU keeps its entries only until it switches to another
/// process (a CR3 write, or arm64's change of ASID, drops them all): any
/// count up to the pages, the boot's sum held to QEMU's own count (xtask's
/// stale-TLB stage).
fn expect_reader_writer(cl: &mut Checklist, traits: KernelTraits, b: &Bench, write: &Span) {
    let pages = b.pages;
    let (r, c) = (count(write, ReportClass::Reuse), count(write, ReportClass::Copy));
    let slack = 4 * SLACK;
    cl.expect(
        (pages..=pages + slack).contains(&(r + c)) && c <= LRU_BATCH_COPIES,
        format!("the writer: reuse {r} + copy {c} = pages {pages} (+{slack}), copy <= {LRU_BATCH_COPIES}"),
    );
    let (sp, stale, race) = spurious_split(cl, write);
    cl.expect(
        race == 0 && if traits.stale_tlb { stale <= pages } else { stale == 0 },
        format!(
            "the reader: spurious {sp} = stale TLB {stale} ({}), race {race} = 0",
            if traits.stale_tlb {
                format!("at most pages {pages}: the model keeps read-only entries until a switch")
            } else {
                "0: every store re-walks".into()
            }
        ),
    );
}

/// Each store takes a write-protect fault, or a spurious one where a fault
/// before it made the PTE writable and the CPU kept its read-only entry: a
/// kernel that reuses the whole folio (or its 16 PTEs) leaves the other 15
/// pages' entries stale under the model, one that reuses or copies page by
/// page none. One thread: no race.
fn expect_read_then_store(cl: &mut Checklist, traits: KernelTraits, b: &Bench, write: &Span) {
    let (pages, folios) = (b.pages, b.folios);
    let KernelTraits { choices: Choices { reuse, local_flush, .. }, stale_tlb, .. } = traits;
    let (wp, (sp, stale, race)) = (count(write, ReportClass::WpFaults), spurious_split(cl, write));
    let whole = reuse != FolioReuse::PageByPage;
    let want = if !stale_tlb {
        (0, 0, "0: every store re-walks".to_string())
    } else if local_flush {
        // Only a thread moved back to a CPU that read the folio before its
        // reuse finds an entry left.
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

/// The new anon folios of a class in a span, as faultscope measured them.
pub fn folios_of(classes: &Classes, m: ReportClass) -> Option<Folios> {
    match classes.get(&m)? {
        ClassValue::Measured(x) => x.folios.as_deref().cloned(),
        ClassValue::NotMeasurable(_) => None,
    }
}

/// What came of a span's PMD write-protect faults, where measured.
fn pmd_outcomes_of(classes: &Classes) -> Option<PmdOutcomes> {
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
fn expect_folios(cl: &mut Checklist, report: &Report, kernel: Option<&KernelCounters>, steps: &[Span]) {
    let Some(b) = report.bench.as_ref() else { return };
    let get = |span: &Span, m| folios_of(&span.classes, m).unwrap_or_default();
    if let Some(after) = &b.after_write {
        // Every page of the region was copied: the folios it maps after
        // the write (pagemap, kpageflags) are the copies' new folios, size
        // by size, the bench's own pages' copies aside (+SLACK).
        let w = &steps[steps.len() - 1];
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
    if matches!(steps[0].classes.get(&ReportClass::NotPresent), Some(ClassValue::NotMeasurable(_))) {
        cl.line("  not_present is not measurable here: first-touch folio sizes not checked");
        return;
    }
    let mut seen = Folios::default();
    for p in &report.processes {
        let Some(f) = folios_of(&p.classes, ReportClass::NotPresent) else {
            return cl.expect(false, format!("pid {}: not_present has no folio sizes", p.pid));
        };
        seen.add(&f);
        // A THP copied whole is a fault's THP allocation too.
        if let Some(c) = folios_of(&p.classes, ReportClass::Copy) {
            seen.add(&c);
        }
    }
    for (&size, &n) in kernel.iter().flat_map(|k| &k.thp_allocs) {
        let name = faultscope::units::size(size);
        let f = seen.of_size(&name);
        cl.expect(
            f <= n && n <= f + UNTRACED_THPS,
            format!(
                "new {name} folios: faultscope {f}, the kernel counted {n} (<= {UNTRACED_THPS} untraced)"
            ),
        );
    }
    if b.mode == "seq" {
        let f = get(&steps[0], ReportClass::NotPresent).of_size(&b.folio);
        cl.expect(
            (b.folios..=b.folios + SLACK).contains(&f),
            format!("populate: new {} folios {f} = folios {} (+{SLACK})", b.folio, b.folios),
        );
    }
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
    kernel: Option<&KernelCounters>,
    report: &Report,
    write: &Span,
) {
    let Some(b) = report.bench.as_ref() else { return };
    let Some(h) = b.hotpatch.as_ref().filter(|_| matches!(case, "hotpatch" | "hotpatch-mem")) else { return };
    let folios = b.folios;
    let (copy, hwp) = (count(write, ReportClass::Copy), count(write, ReportClass::HugePmdWp));
    let f = folios_of(&write.classes, ReportClass::Copy).unwrap_or_default();
    let whole = copies_thp_whole(choices, case, h);
    let outcomes = pmd_outcomes_of(&write.classes);
    let (o_split, o_copied, o_other) = outcomes.as_ref().map_or((0, 0, 0), |o| (o.split, o.copied, o.other));
    let retries = write.classes.get(&ReportClass::Retry).and_then(ClassValue::count).unwrap_or(0);
    cl.expect(outcomes.is_some(), "huge_pmd_wp has outcomes");
    cl.line(format!("  write step's huge_pmd_wp outcomes: {outcomes:?}"));
    // Where each phase's copies and PMD faults went.
    if let Some(p) = report.bench_process() {
        let by_phase: Vec<String> = p
            .phases
            .iter()
            .map(|ph| {
                let n = |m: ReportClass| ph.classes.get(&m).and_then(ClassValue::count).unwrap_or(0);
                let counts =
                    [ReportClass::Faults, ReportClass::Copy, ReportClass::HugePmdWp, ReportClass::NotPresent]
                        .map(|m| n(m).to_string());
                format!("{} {}", ph.name, counts.join("/"))
            })
            .collect();
        cl.line(format!("  faults/copy/huge_pmd_wp/not_present by phase: {}", by_phase.join(", ")));
    }
    if whole {
        cl.expect(
            hwp == folios && o_copied == folios && o_split == 0,
            format!("huge_pmd_wp {hwp} = THPs {folios}: copied {o_copied} = {folios}, split {o_split} = 0"),
        );
        cl.expect(
            copy == folios && f.of_size("2M") == folios && f.bytes == folios * PMD_SIZE,
            format!("copy {copy} = THPs {folios}, each a new 2M folio: {:?}, {} bytes", f.sizes, f.bytes),
        );
        if let Some(k) = kernel {
            let n = k.thp_allocs.get(&PMD_SIZE).copied().unwrap_or(0);
            cl.expect(
                (folios..=folios + UNTRACED_THPS).contains(&n),
                format!("the kernel's new PMD THPs {n} = THPs copied {folios} (+{UNTRACED_THPS})"),
            );
        }
    } else {
        // A split whose PTE path asked for the mmap lock returns
        // VM_FAULT_RETRY (outcome other); the retried call copies the page.
        cl.expect(
            hwp == folios && o_split + o_other == folios && o_other <= retries && o_copied == 0,
            format!(
                "huge_pmd_wp {hwp} = THPs {folios}: split {o_split} + retried {o_other} (of {retries} retries) = {folios}, copied {o_copied} = 0"
            ),
        );
        cl.expect(
            (folios..=folios + SLACK).contains(&copy) && f.of_size("4K") == copy && f.bytes == copy * PAGE,
            format!(
                "copy {copy} = writes {folios} (+{SLACK}), each a new 4K folio: {:?}, {} bytes",
                f.sizes, f.bytes
            ),
        );
        if let Some(k) = kernel {
            let n = k.split_pmd.unwrap_or(0);
            cl.expect(n >= folios, format!("the kernel's PMD splits {n} >= THPs written {folios}"));
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

/// Whether the kernel copies a hot-patched THP whole: the exec THP COW
/// series does, but only where the mapping is not writable (`hotpatch-mem`:
/// `is_exec_mapping`) and the file is not shmem.
fn copies_thp_whole(choices: Choices, case: &str, h: &Hotpatch) -> bool {
    choices.exec_thp_cow && case == "hotpatch-mem" && h.file_system != "tmpfs"
}

/// The hot patch's smaps before and after, measured or not: every write
/// taken, the file PMD-mapped whole before the writes, and the anonymous
/// bytes after them what the kernel copies (a THP each with the exec THP
/// COW series, where it applies; else the 4K page written).
fn expect_hotpatch_taken(cl: &mut Checklist, case: &str, choices: Choices, b: &Bench) {
    let Some(h) = b.hotpatch.as_ref().filter(|_| matches!(case, "hotpatch" | "hotpatch-mem")) else { return };
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
    let refused = h.refused_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
    cl.expect(h.refused == 0, format!("the kernel took every write: refused {}{refused}", h.refused));
    cl.expect(
        h.before.file_pmd_mapped == b.size,
        format!("before the write: file PMD-mapped {} = size {}", h.before.file_pmd_mapped, b.size),
    );
    let whole = copies_thp_whole(choices, case, h);
    let (each, what) = if whole { (PMD_SIZE, "a THP") } else { (PAGE, "a 4K page") };
    cl.expect(
        h.after.anonymous == b.folios * each
            && h.after.anon_huge == if whole { b.folios * PMD_SIZE } else { 0 },
        format!(
            "smaps after: anonymous {} = {} writes x {what}, AnonHugePages {}",
            h.after.anonymous, b.folios, h.after.anon_huge
        ),
    );
}

/// The write step's spurious faults, stale TLB and race, checked to add
/// up (each spurious fault is one or the other).
fn spurious_split(cl: &mut Checklist, write: &Span) -> (u64, u64, u64) {
    let [sp, stale, race] = [ReportClass::Spurious, ReportClass::SpuriousStaleTlb, ReportClass::SpuriousRace]
        .map(|m| count(write, m));
    cl.expect(stale + race == sp, format!("spurious {sp} = stale TLB {stale} + race {race}"));
    (sp, stale, race)
}

/// The 64K case's contpte unfolds in the write step, and the kernel path
/// that made them ([`unfold_stacks`]).
fn expect_unfolds(
    cl: &mut Checklist,
    case: &str,
    reuse: FolioReuse,
    kernel: &str,
    b: &Bench,
    write: &Span,
    oracle: &Oracle,
) {
    let Some(u) =
        write.count(ReportClass::ContpteUnfold).filter(|_| case == "64k-exit" && b.mapping == "pte")
    else {
        return;
    };
    let folios = b.folios;
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
        .line(b.pid, WRITE)
        .and_then(|l| l.get(ReportClass::ContpteTryUnfold.name()).copied().flatten());
    let (stacks, checks) = unfold_stacks(kernel, &write.attribution, u, try_unfold);
    cl.line(stacks.trim_end());
    for (ok, what) in checks {
        cl.expect(ok, what);
    }
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
pub fn unfold_stacks(
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
    let version = UNFOLD_CALLERS
        .iter()
        .find(|((a, b), _, _)| kernel_at_least(kernel, *a, *b) && !kernel_at_least(kernel, *a, *b + 1));
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

/// `faultscope verify --phase mark:write --expect contpte_unfold=0` over a
/// case's report, as CI would run it: exit 1 printing the count where the
/// write step unfolded, 0 where not, 3 where the class is not measurable
/// (x86).
pub fn expect_verify_unfolds(cl: &mut Checklist, report: &Report, rc: Option<i32>, out: &str) {
    let out = one_line(out);
    let unfolds = report.bench_process().and_then(|p| p.span(WRITE)?.count(ReportClass::ContpteUnfold));
    let want = match unfolds {
        Some(0) => 0,
        Some(_) => 1,
        None => 3,
    };
    cl.expect(rc == Some(want), format!("verify contpte_unfold=0: exit {rc:?} = {want}: {out}"));
    if let Some(u) = unfolds.filter(|u| *u > 0) {
        cl.expect(out.contains(&format!("contpte_unfold is {u}")), format!("verify prints the count {u}"));
    }
}

/// `faultscope verify --phase mark:write --expect 'reuse/folio<=1.05'` over
/// a gate case's report, as CI would gate a patch on it: its exit must
/// follow the oracle's reuse count (0 within the bound, 1 above it,
/// printing that count over the folios), and it must pass on a kernel that
/// reuses whole folios and fail on one that reuses them page by page.
/// Without an oracle, where reuse is not measurable it must exit 3.
pub fn expect_gate(
    cl: &mut Checklist,
    choices: Choices,
    report: &Report,
    oracle: Option<&Oracle>,
    rc: Option<i32>,
    out: &str,
) {
    let out = one_line(out);
    let Some(b) = report.bench.as_ref() else { return cl.expect(false, "the report has a bench") };
    let measured = report.bench_process().and_then(|p| p.span(WRITE)?.count(ReportClass::Reuse));
    let Some(oracle) = oracle else {
        let want = if measured.is_some() { [0, 1] } else { [3, 3] };
        return cl.expect(
            rc.is_some_and(|r| want.contains(&r)),
            format!("gate {GATE}: exit {rc:?} in {want:?}: {out}"),
        );
    };
    let line = oracle.line(b.pid, WRITE);
    let get = |m: ReportClass| line.and_then(|l| l.get(m.name()).copied().flatten());
    let (Some(reuse), Some(copy)) = (get(ReportClass::Reuse), get(ReportClass::Copy)) else {
        return cl.expect(false, format!("gate {GATE}: the oracle counts the write step's reuse"));
    };
    let folios = b.folios;
    let ratio = gate_ratio();
    let want = if reuse as f64 / folios.max(1) as f64 <= ratio { 0 } else { 1 };
    cl.expect(
        rc == Some(want),
        format!("gate {GATE}: exit {rc:?}; the oracle's reuse {reuse} / {folios} folios wants {want}: {out}"),
    );
    // What the kernel must do: the series' whole folio, or 7.3's page by
    // page (16 per 64K folio); a kernel that copies reuses nothing.
    let allowance = folios as f64 * (ratio - 1.0);
    let must = match choices.reuse {
        FolioReuse::WholeFolio if allowance >= OWN_FAULTS_AFTER_EXIT as f64 => Some(0),
        FolioReuse::WholeFolio => {
            cl.line(format!(
                "  not required to pass at {folios} folios: the gate allows {allowance:.1} extra reuses, \
                 the bench's own pages up to {OWN_FAULTS_AFTER_EXIT} (the page arithmetic above decides)"
            ));
            None
        }
        FolioReuse::PageByPage if copy == 0 => Some(1),
        FolioReuse::PageByPage | FolioReuse::ContpteBlock => None,
    };
    if let Some(m) = must {
        cl.expect(
            m == want,
            format!(
                "reuse {reuse} for {folios} folios: this kernel must {} the gate",
                if m == 0 { "pass" } else { "fail" }
            ),
        );
    }
    cl.expect(
        out.contains(&format!("({reuse} / {folios})")),
        format!("verify prints reuse {reuse} / {folios} folios"),
    );
}

/// A command's output as one line of a check: its lines joined by " | ".
fn one_line(out: &str) -> String {
    out.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use faultscope::report::file;

    use super::*;
    use crate::testing::*;

    fn report(json: &str) -> Report {
        file::parse("t".into(), json).unwrap().report
    }

    fn checked(case: &str, choices: Choices, json: &str, oracle: &str) -> (String, Vec<String>) {
        let (mut table, mut fails) = (String::new(), Vec::new());
        let (r, o) = (report(json), Oracle::parse(oracle, x86_refused()));
        let traits = KernelTraits { choices, stale_tlb: false };
        let kernel = KernelCounters::parse(&[(64 << 10, 0)], "thp_fault_alloc 0\nthp_split_pmd 0\n");
        let run = Run { case, traits, report: &r, oracle: Some(&o), kernel: Some(&kernel) };
        check(&mut Checklist::new(case, &mut table, &mut fails), &run);
        (table, fails)
    }

    #[test]
    fn choices_travel_as_one_word_list() {
        for c in [
            Choices::STOCK,
            Choices { reuse: FolioReuse::WholeFolio, local_flush: true, exec_thp_cow: false },
            Choices { reuse: FolioReuse::ContpteBlock, local_flush: false, exec_thp_cow: true },
        ] {
            assert_eq!(Choices::parse(&c.to_env()), Ok(c));
        }
        assert!(Choices::parse("reuse=sometimes").is_err());
        assert_eq!(Choices::parse(""), Ok(Choices::STOCK));
    }

    #[test]
    fn kernel_counters_count_the_run() {
        let before =
            KernelCounters::parse(&[(64 << 10, 5), (2 << 20, 9)], "thp_fault_alloc 2\nthp_split_pmd 1\n");
        let after =
            KernelCounters::parse(&[(64 << 10, 7), (2 << 20, 9)], "thp_fault_alloc 3\nthp_split_pmd 5\n");
        let d = after.since(&before);
        assert_eq!(d.thp_allocs, BTreeMap::from([(64 << 10, 2), (2 << 20, 1)]));
        assert_eq!(d.split_pmd, Some(4));
    }

    /// On a kernel without multi-size THP the 64K cases are refused, the
    /// others run; the refusal is checked, not skipped.
    #[test]
    fn a_kernel_without_mthp_refuses_64k() {
        let why = "--folio 64K needs multi-size THP (Linux 6.8 or later): \
                   /sys/kernel/mm/transparent_hugepage/hugepages-64kB is missing";
        for c in ["64k-exit", "64k-alive"] {
            assert_eq!(expected_refusal("6.1.0-28-cloud-arm64", c).as_deref(), Some(why), "{c}");
            assert_eq!(expected_refusal("6.12.57+deb12-cloud-arm64", c), None, "{c}");
        }
        for c in ["4k-exit", "2m-pte-exit", "2m-pmd-exit", "4k-alive", "spurious-race"] {
            assert_eq!(expected_refusal("6.1.0", c), None, "{c}");
        }
        let refusal = |rc: i32, out: &str| {
            let (mut table, mut fails) = (String::new(), Vec::new());
            expect_refusal(&mut Checklist::new("c", &mut table, &mut fails), why, Some(rc), out);
            fails
        };
        assert_eq!(refusal(2, &format!("faultscope: {why}\n")), Vec::<String>::new());
        assert_eq!(refusal(0, &format!("faultscope: {why}\n")).len(), 1);
        let fails = refusal(2, &format!("faultscope: measuring faults\nfaultscope: {why}\n"));
        assert_eq!(fails.len(), 1, "{fails:?}");
        assert!(fails[0].contains("its output is the one line"), "{fails:?}");
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

    /// The gate's exit must follow the oracle's reuse count and the kernel:
    /// stock 7.3 fails it with the count, the patched kernel passes where
    /// the gate's allowance covers the bench's own faults.
    #[test]
    fn gates_follow_the_oracle_and_the_kernel() {
        assert_eq!(gate_ratio(), 1.05, "the bound read from {GATE}");
        let whole = Choices { reuse: FolioReuse::WholeFolio, ..Choices::STOCK };
        // The oracle's write step reuse decides.
        let gate = |choices: Choices, folios: u64, reuse: u64, rc: i32, out: Option<&str>| {
            let r = report(&bench_json().replace("\"folios\":16", &format!("\"folios\":{folios}")));
            let o = Oracle::parse(
                &(X86_UNKNOWN.to_string() + &oracle_line(WRITE, reuse, reuse, 0)),
                Default::default(),
            );
            let ratio = reuse as f64 / folios as f64;
            let printed = format!("reuse/folio<=1.05: reuse is {ratio} ({reuse} / {folios})");
            let (mut table, mut fails) = (String::new(), Vec::new());
            let mut cl = Checklist::new("g", &mut table, &mut fails);
            expect_gate(&mut cl, choices, &r, Some(&o), Some(rc), out.unwrap_or(&printed));
            (fails, table)
        };
        // 7.3 reuses page by page: 256 for 16 folios, the gate fails (1).
        assert_eq!(gate(Choices::STOCK, 16, 256, 1, None).0, Vec::<String>::new());
        let (f, _) = gate(Choices::STOCK, 16, 256, 0, None);
        assert!(f[0].contains("exit Some(0); the oracle's reuse 256 / 16 folios wants 1"), "{f:?}");
        // The patched kernel: 16 for 16, the gate passes (0).
        assert_eq!(gate(whole, 16, 16, 0, None).0, Vec::<String>::new());
        // At 128 folios the allowance (6.4) covers the bench's own pages.
        assert_eq!(gate(whole, 128, 131, 0, None).0, Vec::<String>::new());
        // A patched kernel that still reuses page by page must pass, and fails.
        let (f, _) = gate(whole, 128, 2048, 1, None);
        assert!(
            f.iter().any(|x| x.contains("reuse 2048 for 128 folios: this kernel must pass the gate")),
            "{f:?}"
        );
        // 8 folios: three of the bench's own reuses fail the gate, rightly
        // (the exit follows the oracle), and the kernel is not at fault.
        let (f, t) = gate(whole, 8, 11, 1, None);
        assert_eq!(f, Vec::<String>::new());
        assert!(t.contains("not required to pass at 8 folios"), "{t}");
        // verify must print the count it judged.
        let (f, _) = gate(whole, 16, 16, 0, Some("reuse/folio<=1.05: reuse is 1"));
        assert!(f[0].contains("verify prints reuse 16 / 16 folios"), "{f:?}");
    }

    /// On a whole-folio kernel the 64K case wants one reuse per folio.
    #[test]
    fn a_whole_folio_kernel_reuses_once_per_folio() {
        let json = bench_json()
            .replace("\"folio\":\"4K\"", "\"folio\":\"64K\"")
            .replace("\"folios\":16", "\"folios\":1");
        let json = json.replace(r#""sizes":{"4K":16}"#, r#""sizes":{"64K":1}"#);
        let oracle = X86_UNKNOWN.to_string()
            + &oracle_line("mark:populate", 16, 0, 0)
            + &oracle_line("mark:fork", 3, 0, 1)
            + &oracle_line(WRITE, 20, 20, 0)
            + &["mark:populate", "mark:fork", WRITE].map(window_line).concat();
        // 20 reuse faults for 1 folio (+16 slack is 17): not whole-folio.
        let (_, fails) =
            checked("64k-exit", Choices { reuse: FolioReuse::WholeFolio, ..Choices::STOCK }, &json, &oracle);
        assert_eq!(
            fails,
            ["64k-exit: reuse 20 + copy 0 = folios 1 (+16), copy <= 62: this kernel reuses a 64K folio whole"]
        );
        let (_, fails) = checked("64k-exit", Choices::STOCK, &json, &oracle);
        assert!(fails.is_empty(), "{fails:?}");
    }

    #[test]
    fn a_case_against_its_oracle_steps_and_arithmetic() {
        let oracle = X86_UNKNOWN.to_string()
            + &oracle_line("mark:populate", 16, 0, 0)
            + &oracle_line("mark:fork", 3, 0, 1)
            + &oracle_line(WRITE, 20, 21, 0).replace(" wp_faults=21 ", " wp_faults=20 ")
            + &["mark:populate", "mark:fork", WRITE].map(window_line).concat();
        let (table, fails) = checked("4k-exit", Choices::STOCK, &bench_json(), &oracle);
        assert_eq!(fails, ["4k-exit: mark:write: reuse: faultscope 20 != oracle 21"]);
        assert!(table.contains("  ok   populate: new 4K folios 16 = folios 16 (+16)"), "{table}");
        assert!(table.contains("  ok   new 64K folios: faultscope 0, the kernel counted 0"), "{table}");
        assert!(table.contains("write-step getrusage minflt 20"), "{table}");
        assert!(
            table.contains("\n  copy                                   0/0                   1/1                   0/0\n"),
            "{table}"
        );
        assert!(
            table.contains("\n  contpte_unfold                       n/m/-                 n/m/-                 n/m/-\n"),
            "{table}"
        );
        assert!(table.contains("  ok   reuse 20 + copy 0 = pages 16 (+16), copy <= 62"), "{table}");
        assert!(table.contains("oracle cannot count: contpte is arm64 only"), "{table}");
        // A step the oracle did not see fails the case.
        let (_, fails) = checked("4k-exit", Choices::STOCK, &bench_json(), "");
        assert!(fails[0].contains("the oracle has a mark:populate line for pid 7"), "{fails:?}");
    }
}
