//! The kernel matrix: the matrix's cases (`faultscope_expect::cases`, the
//! host tests `matrix::case_*`) in guests of every kernel x arch, under
//! each backend, against the tracefs oracle; with the verifier check, the
//! whole-folio reuse gates, COW memory and the stale-TLB model as choices
//! of kernels, cases and sizes. The cases judge themselves in the guest;
//! what spans boots (QEMU's own count of its model's faults, two QEMUs
//! against each other) is judged here, from the reports the cases keep.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use faultscope::kernel::classes::ReportClass;
use faultscope_expect::cases::{self, RACING_CASE, SLACK, WRITE};
pub use faultscope_expect::cases::{DEFAULT_CASES, GATE_CASES, GATE_SIZE};

use crate::{
    check, foundation,
    kernels::GuestKernel,
    vm::{tlb, GuestRun, Tlb},
};

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
    /// The verifier check too (`probes --load`, every program through the
    /// kernel's verifier): `cargo xtask matrix` and the suite's matrix
    /// stage, which boots every kernel.
    Matrix,
    /// The cases at the gates' size, with a trace buffer to hold them.
    Gates,
    /// The cases alone: the suite's later stages, on kernels whose verifier
    /// check the matrix stage made (the same programs, the same kernel: 12
    /// to 20 s a boot under TCG).
    Cases,
}

/// The gates' kernels: stock 7.3 (must fail) and 7.3 with the series (must
/// pass), each arch.
pub const GATE_KERNELS: &[&str] =
    &["7.3-cloud-amd64", "7.3-folio-reuse-amd64", "7.3-cloud-arm64", "7.3-folio-reuse-arm64"];
/// The gates' backend: what CI on a stock distribution kernel would get.
pub const GATE_BACKEND: &str = "kprobe";

/// The gates on `kernels`: [`GATE_CASES`] at [`GATE_SIZE`] against the
/// oracle, each with `verify` as CI runs it (`cases::expect_gate`): pass
/// on the patched kernels, fail with the count on stock 7.3.
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
/// faultscope's may exceed it only by races it read as stale, which only a
/// case of threads storing to the same pages has: by at most that case's
/// stale readings, however loaded the host (how many races the host
/// stretches is its scheduler's choice). QEMU's may exceed it by the faults
/// of the guest's other processes ([`SLACK`]).
fn check_model_count(run: &GuestRun, kernel: &str, labels: &[String]) -> Vec<String> {
    let Some(model) = run.stale_tlb_faults else {
        return vec![format!("{kernel}: QEMU printed no count of its stale-TLB model's faults")];
    };
    let counted = |l: &String| -> Option<u64> {
        bench_process(run, l)?.classes.get(&ReportClass::SpuriousStaleTlb)?.count()
    };
    let sum: u64 = labels.iter().filter_map(counted).sum();
    let racing = |l: &&String| l.starts_with(&format!("{RACING_CASE}@"));
    let stretched: u64 = labels.iter().filter(racing).filter_map(counted).sum();
    let most = model + stretched;
    let line = format!(
        "{kernel}: spurious_stale_tlb {sum} in the benches, QEMU's model raised {model} (every process): \
         {} <= {sum} <= {most} ({model} + {RACING_CASE}'s stale readings {stretched})",
        model.saturating_sub(SLACK)
    );
    println!("{line}");
    if sum <= most && model <= sum + SLACK {
        Vec::new()
    } else {
        vec![line]
    }
}

/// One kernel's guest, ready to boot: its kernel, initramfs and
/// directory, the host tests it runs and under which backends.
struct Guest {
    k: GuestKernel,
    vmlinuz: PathBuf,
    cpio: PathBuf,
    dir: PathBuf,
    cases: Vec<String>,
    tests: Vec<String>,
    /// A test of the first run only ([`VERIFIER_TEST`]).
    once: Option<&'static str>,
    backends: Vec<String>,
    tlb: Tlb,
}

impl Guest {
    fn boot(&self) -> Result<GuestRun> {
        let machine = crate::vm::Machine { tlb: self.tlb, ..crate::vm::Machine::host() };
        let timeout = std::time::Duration::from_secs(900);
        crate::vm::boot_with(self.k, &self.vmlinuz, &self.cpio, &self.dir, timeout, &[], machine)
    }
}

/// The host tests' runs of a guest: one per backend, at bench's own latency
/// tier.
fn runs(backends: &[String]) -> Vec<(&str, &str)> {
    backends.iter().map(|b| (b.as_str(), "")).collect()
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
    let guests = prepare(plan, size, backends, what, &mut failures)?;
    // The boots, several at once; then their checks, in order.
    let runs = crate::vm::boot_each(&guests, Guest::boot);
    let mut boots = Vec::new();
    for (g, run) in guests.iter().zip(runs) {
        // A guest that could not run fails the stage; the others are
        // still checked.
        match run {
            Ok(run) => {
                check_guest(g, &run, &mut failures);
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

/// The host tests of `cases` (an unknown case is an error).
fn host_tests(cases: &[String]) -> Result<Vec<String>> {
    let mut tests = Vec::new();
    for c in cases {
        if cases::args(c).is_none() {
            let known: Vec<&str> = cases::CASES.iter().map(|(n, _)| *n).collect();
            anyhow::bail!("no matrix case {c:?} (the cases: {})", known.join(", "));
        }
        tests.push(cases::test_name(c));
    }
    Ok(tests)
}

/// The host test that puts every program through the kernel's verifier,
/// once a [`Boot::Matrix`] (`probes --load` takes no backend).
const VERIFIER_TEST: &str = "record::every_program_passes_the_verifier_within_its_budget";

/// The guest's variables besides the tests': the cases' size, what the
/// kernel chooses (a series it was built with), the TLB model, where the
/// cases keep their reports, a file system for the hot-patch cases, and a
/// trace buffer for the gates' size.
fn case_vars(
    k: GuestKernel,
    cases: &[String],
    size: &str,
    tlb: Tlb,
    what: Boot,
) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        ("FAULTSCOPE_CASE_SIZE", size.to_string()),
        (faultscope_expect::cases::Choices::ENV, k.choices().to_env()),
        ("FAULTSCOPE_REPORTS", "/tmp/reports".to_string()),
    ];
    if tlb == Tlb::Stale {
        vars.push(("FAULTSCOPE_TLB", "stale".to_string()));
    }
    if cases.iter().any(|c| c.starts_with("hotpatch")) {
        vars.push(("HOTPATCH_SIZE", size.to_string()));
    }
    if what == Boot::Gates {
        // 256M of 64K folios reused page by page on arm64 is ~6 events per
        // fault in one CPU's buffer.
        vars.push(("TRACE_KB", "98304".to_string()));
    }
    vars
}

/// Each kernel of `plan` with what its boot needs, downloaded and built one
/// at a time. A kernel that cannot be had (a build that failed) fails the
/// run; the other kernels still run.
fn prepare(
    plan: &[Planned],
    size: &str,
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
        let backends = backends_for(k.name, backends);
        let tests = host_tests(cases)?;
        let once = (what == Boot::Matrix).then_some(VERIFIER_TEST);
        let mut vars = foundation::host_test_vars(k, &tests, once, &runs(&backends))?;
        vars.extend(case_vars(k, cases, size, tlb, what));
        let extra = [(crate::dist::static_host_tests(k.arch)?, "/host-tests".to_string())];
        let cpio = vm::initramfs_with(&dir, k.arch, &bin, "host-tests.sh", &vars, &extra)?;
        guests.push(Guest { k, vmlinuz, cpio, dir, cases: cases.clone(), tests, once, backends, tlb });
    }
    Ok(guests)
}

/// One guest's host tests (each case judged itself there), and under the
/// stale-TLB model the boot's count against QEMU's.
fn check_guest(g: &Guest, run: &GuestRun, failures: &mut Vec<String>) {
    let k = g.k;
    let r = foundation::check_host_tests(run, &g.tests, g.once, &runs(&g.backends));
    print!("{}", r.table);
    failures.extend(r.failures.into_iter().map(|f| format!("{}: {f}", k.name)));
    let labels: Vec<String> =
        g.backends.iter().flat_map(|b| g.cases.iter().map(move |c| label(c, b))).collect();
    if run.tlb == Tlb::Stale {
        failures.extend(check_model_count(run, k.name, &labels));
    }
    println!(
        "guest {} ran {} cases ({}) in {:.1}s{}",
        k.name,
        labels.len(),
        g.backends.join(", "),
        run.wall.as_secs_f64(),
        if g.tlb == Tlb::Exact { String::new() } else { format!(", QEMU --tlb {:?}", g.tlb) }
    );
    let c = run.kernel_complaints();
    if !c.is_empty() {
        println!("  the guest kernel warned:\n    {}", c.join("\n    "));
    }
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
    fn fentry_runs_on_one_kernel_per_arch() {
        assert_eq!(backends_for("6.12-cloud-amd64", &[]), ["kprobe", "fentry"]);
        assert_eq!(backends_for("7.3-cloud-arm64", &[]), ["kprobe", "fentry"]);
        assert_eq!(backends_for("6.12-cloud-arm64", &[]), ["kprobe"]);
        assert_eq!(backends_for("6.12-cloud-arm64", &["fentry".into()]), ["fentry"]);
        for k in FENTRY_KERNELS {
            assert!(crate::kernels::KERNELS.iter().any(|g| g.name == k), "{k}");
        }
    }
}
