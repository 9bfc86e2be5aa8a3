//! The foundation and origins guest tests: the host tests run in the
//! guests (static, under each backend, against the tracefs kprobe oracle),
//! and the foundation's cases of its own, checked against the oracle of
//! the same run, the workload's page arithmetic and getrusage.

use std::{fmt::Write as _, path::PathBuf, time::Duration};

use anyhow::{bail, Context as _, Result};
use faultscope::{kernel::classes::ReportClass, report::schema::Mode};
use faultscope_expect::Workload;

use crate::{
    check::{self, case_outputs, run_is_clean, CaseResult, Checklist},
    kernels, mappings,
    util::root,
    vm,
};

/// Checks a case: faultscope against the oracle (whole process), the page
/// arithmetic of `folio` (4K, shared; "mappings": per mapping, see
/// `mappings.rs`, with the kernel's CONFIG_ANON_VMA_NAME as `anon_vma_name`),
/// getrusage.
pub fn check_case(
    run: &vm::GuestRun,
    case: &str,
    folio: &str,
    anon_vma_name: Option<bool>,
) -> Result<CaseResult> {
    let mut fails = Vec::new();
    let (fs, wl, pid) = case_outputs(run, case)?;
    let pages = wl["pages"].as_u64().context("workload pages")?;
    let p = check::process(&fs, pid).with_context(|| case.to_string())?;
    if fs.mode != Mode::Kprobe {
        fails.push(format!("{case}: mode is {}, not kprobe", check::mode_name(&fs)));
    }
    let oracle = check::oracle_of(run, &format!("{case}.oracle"))?;
    let cmp = oracle
        .compare(case, &p.classes, pid, "ALL")
        .with_context(|| format!("{case}: the oracle saw no faults of pid {pid}"))?;
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{case} (pid {pid}, {pages} pages of 4K, folio {folio}, guest wall {:.1}s)",
        run.wall.as_secs_f64()
    );
    table.push_str(&cmp.table("class"));
    fails.extend(cmp.failures);
    // Page arithmetic.
    let (class, what) = match folio {
        "mappings" => {
            mappings::check(run, case, p, &wl, anon_vma_name, &mut table, &mut fails)?;
            (ReportClass::Reuse, "")
        }
        "shared" => {
            (ReportClass::WpShared, "soft-dirty cleared on shared memory: one write-notify fault per page")
        }
        _ => (ReportClass::Reuse, "4K pages are reused one by one"),
    };
    let mut cl = Checklist::new(case, &mut table, &mut fails);
    if folio != "mappings" {
        cl.per_page(format!("{class} ({what})"), p.count(class).unwrap_or(0), pages);
    }
    // All of the workload's faults since exec.
    cl.getrusage(p, Workload(&wl).faults_since_exec());
    fails.extend(run_is_clean(run, case, &fs));
    let _ = writeln!(
        table,
        "  {}, kprobes left after faultscope: {}",
        run.section(&format!("{case}.oracle"))
            .ok()
            .and_then(|o| o.lines().find_map(|l| l.strip_prefix("oracle: ")?.split(',').next()))
            .unwrap_or("no oracle summary"),
        run.marker("KPROBES-LEFT", case).unwrap_or_default()
    );
    Ok(CaseResult { table, failures: fails })
}

/// Boots `kernel` and runs only the origins guest (`origins.sh`).
pub fn run_origins(kernel: &str) -> Result<()> {
    let g = prepare(kernel, "origins", &host_test_vars(&ARM64_HOST_TESTS))?;
    let run = g.boot()?;
    finish(g.k, &run, check_origins(&run)?, "origins guest test")
}

/// The foundation guest (`kernel`) and the origins guest (`arm64`),
/// prepared one after the other and booted at once (`vm::boot_each`);
/// each is checked even when the other failed.
pub fn run_both(kernel: &str, arm64: &str) -> Result<()> {
    let anon_vma_name = kernels::config_option(kernels::by_name(kernel)?, "CONFIG_ANON_VMA_NAME")?;
    let guests = [
        prepare(kernel, "foundation", &host_test_vars(&HOST_TESTS))?,
        prepare(arm64, "origins", &host_test_vars(&ARM64_HOST_TESTS))?,
    ];
    let mut runs = vm::boot_each(&guests, Guest::boot).into_iter();
    let mut failures = Vec::new();
    for (g, run) in guests.iter().zip(runs.by_ref()) {
        let checked = run.and_then(|run| {
            let fails = match g.name {
                "foundation" => check_foundation(&run, anon_vma_name)?,
                _ => check_origins(&run)?,
            };
            Ok(finish(g.k, &run, fails, g.name))
        });
        match checked {
            Ok(Ok(())) => {}
            Ok(Err(e)) | Err(e) => failures.push(format!("{}: {e:#}", g.k.name)),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// A guest ready to boot: its kernel and initramfs (`NAME.sh`, its
/// variables, and the host tests' static binary as `/host-tests`), made by
/// [`prepare`].
struct Guest {
    k: kernels::GuestKernel,
    name: &'static str,
    vmlinuz: PathBuf,
    cpio: PathBuf,
    dir: PathBuf,
}

impl Guest {
    fn boot(&self) -> Result<vm::GuestRun> {
        vm::boot(self.k, &self.vmlinuz, &self.cpio, &self.dir, Duration::from_secs(600))
    }
}

fn prepare(kernel: &str, name: &'static str, vars: &[(&str, String)]) -> Result<Guest> {
    let k = kernels::by_name(kernel)?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm").join(name).join(k.name);
    std::fs::create_dir_all(&dir)?;
    let extra = [(vm::build_host_tests(k.arch)?, "/host-tests".to_string())];
    let cpio = vm::initramfs_with(&dir, k.arch, &bin, &format!("{name}.sh"), vars, &extra)?;
    Ok(Guest { k, name, vmlinuz, cpio, dir })
}

/// The origins guest's checks: its host tests and the shipped binary.
fn check_origins(run: &vm::GuestRun) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    checked(&mut failures, Ok(check_host_tests(run, &ARM64_HOST_TESTS)))?;
    checked(&mut failures, Ok(check_shipped(run)))?;
    Ok(failures)
}

/// Prints a checked case's table and keeps its failures.
fn checked(failures: &mut Vec<String>, r: Result<CaseResult>) -> Result<()> {
    let r = r?;
    print!("{}", r.table);
    failures.extend(r.failures);
    Ok(())
}

/// The host tests that run in the foundation guest too, where the oracle
/// adds its equality (`FAULTSCOPE_ORACLE`): those whose workload faultscope
/// records from start to end or attaches to, and short lives named.
const HOST_TESTS: [&str; 10] = [
    "record::record_command_counts_write_protect_faults",
    "record::automatic_phases_split_the_fork_scenario",
    "record::a_threaded_storm_across_phases_loses_nothing",
    "record::faults_that_sleep_are_counted_once_and_timed_across_the_sleep",
    "record::mappings_of_a_process_gone_before_its_maps_are_read_are_named",
    "record::a_child_forked_before_attach_is_seen",
    "record::every_origin_of_a_fault_is_counted_in_its_phase",
    "bench::bench_counts_its_write_phase_exactly",
    "attribution::attribution_is_measured_or_says_why_not",
    "attribution::each_mapping_carries_its_own_pages_writes",
];

/// Those of the arm64 origins stage: every origin of a fault, and the
/// scenarios that move a fault's state between CPUs and the kernel's
/// per-CPU counts, under each backend.
const ARM64_HOST_TESTS: [&str; 3] = [
    "record::every_origin_of_a_fault_is_counted_in_its_phase",
    "record::a_threaded_storm_across_phases_loses_nothing",
    "record::faults_that_sleep_are_counted_once_and_timed_across_the_sleep",
];

/// Each backend the host tests run under in a guest, with the latency
/// tier of its records (`FAULTSCOPE_BACKEND`, `FAULTSCOPE_LATENCY`): the
/// kprobe run counts only, the fentry run times one fault in 4.
const HOST_TEST_RUNS: [(&str, &str); 2] = [("kprobe", "off"), ("fentry", "sample=4")];

/// The guest's variables for the host tests `tests` under every run of
/// `HOST_TEST_RUNS`.
fn host_test_vars(tests: &[&str]) -> [(&'static str, String); 2] {
    let runs: Vec<String> = HOST_TEST_RUNS.iter().map(|(b, t)| format!("{b}:{t}")).collect();
    [("HOST_TESTS", tests.join(" ")), ("HOST_TEST_RUNS", runs.join(" "))]
}

/// The host tests' runs in the guest (`host_tests` in lib.sh), one per
/// backend: libtest's line for each test, every one of `tests` passed, the
/// summary, and each test's own output (its process against the oracle).
fn check_host_tests(run: &vm::GuestRun, tests: &[&str]) -> CaseResult {
    let (mut table, mut fails) = (String::new(), Vec::new());
    for (backend, tier) in HOST_TEST_RUNS {
        let label = format!("host-tests@{backend}");
        let out = run.section(&format!("{label}.out")).unwrap_or("");
        let results: Vec<(&str, &str)> = out
            .lines()
            .filter_map(|l| l.strip_prefix("test ")?.rsplit_once(" ... "))
            .filter(|(name, _)| !name.starts_with("result"))
            .collect();
        table.push_str(&format!(
            "host tests in the guest, --backend {backend} --latency {tier}, against the oracle:\n"
        ));
        for (name, result) in &results {
            table.push_str(&format!("  {result:<7} {name}\n"));
            if *result != "ok" {
                fails.push(format!("{label}: {name}: {result}"));
            }
        }
        for name in tests {
            if !results.iter().any(|(n, _)| n == name) {
                fails.push(format!("{label}: {name}: did not run"));
            }
        }
        let rc = run.marker("RC", &label).unwrap_or_default();
        let summary = out.lines().find(|l| l.starts_with("test result:")).unwrap_or("no summary");
        table.push_str(&format!("  {summary}\n"));
        if let Some((_, shown)) = out.split_once("\nsuccesses:\n") {
            let shown = shown.rsplit_once("\nsuccesses:\n").map_or(shown, |(s, _)| s);
            table.push_str(shown.trim_end());
            table.push('\n');
        }
        if rc != "0" {
            fails.push(format!("{label} exited {rc:?}:\n{}", crate::util::tail(out, 80)));
        }
    }
    CaseResult { table, failures: fails }
}

/// The guest's time, then the stage's failures if any.
fn finish(k: kernels::GuestKernel, run: &vm::GuestRun, failures: Vec<String>, what: &str) -> Result<()> {
    println!("guest {} booted, ran and powered off in {:.1}s", k.name, run.wall.as_secs_f64());
    if !failures.is_empty() {
        bail!("{what} failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

/// The shipped binary in the guest (lib.sh's `shipped_binary`): static,
/// from an initramfs with no C library; `--version` names a commit and
/// `probes` names, first, the fault path's mode (fentry or kprobe: these
/// kernels have both).
fn check_shipped(run: &vm::GuestRun) -> CaseResult {
    let mut fails = Vec::new();
    let libc = run.marker("LIBC-FILES", "main").unwrap_or_default();
    if libc != "0" {
        fails.push(format!("shipped binary: the initramfs holds {libc:?} libc files, want 0"));
    }
    for what in ["version", "probes"] {
        let rc = run.marker("RC", what).unwrap_or_default();
        if rc != "0" {
            fails.push(format!("shipped binary: faultscope {what} exited {rc:?}"));
        }
    }
    let version = run.section("version.out").unwrap_or("").trim().to_string();
    if !version.contains("(commit ") {
        fails.push(format!("shipped binary: --version names no commit: {version:?}"));
    }
    let mode = run.section("probes.out").unwrap_or("").lines().next().unwrap_or("").to_string();
    if !(mode.starts_with("mode: fentry mode") || mode.starts_with("mode: kprobe mode")) {
        fails.push(format!("shipped binary: probes' first line is not the fault path's mode: {mode:?}"));
    }
    let table = format!("shipped binary (static, no libc in the initramfs): {version}\n  probes: {mode}\n");
    CaseResult { table, failures: fails }
}

/// Boots `kernel` (a name of `kernels::KERNELS`) and runs the host tests
/// of `HOST_TESTS` under each backend, the shared-memory soft-dirty case
/// and the attribution case.
pub fn run(kernel: &str) -> Result<()> {
    let anon_vma_name = kernels::config_option(kernels::by_name(kernel)?, "CONFIG_ANON_VMA_NAME")?;
    let g = prepare(kernel, "foundation", &host_test_vars(&HOST_TESTS))?;
    let run = g.boot()?;
    finish(g.k, &run, check_foundation(&run, anon_vma_name)?, "guest test")
}

/// The foundation guest's checks: its host tests, its own cases and the
/// shipped binary.
fn check_foundation(run: &vm::GuestRun, anon_vma_name: Option<bool>) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    checked(&mut failures, Ok(check_host_tests(run, &HOST_TESTS)))?;
    for (case, folio) in [("shared4k", "shared"), ("mappings4k", "mappings")] {
        checked(&mut failures, check_case(run, case, folio, anon_vma_name))?;
    }
    checked(&mut failures, Ok(check_shipped(run)))?;
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testing::*;

    #[test]
    fn a_case_against_the_oracle_arithmetic_and_getrusage() {
        let markers =
            format!("@@FS-RC fork4k 0\n@@FS-OVERRUN fork4k 0\n@@FS-KPROBES-LEFT fork4k 0\n{X86_REFUSED}");
        let wl = r#"{"pid": 7, "pages": 16, "minflt_total": 38, "majflt_total": 1}"#;
        let run = guest_run(
            &markers,
            &[
                ("fork4k.fs.json", &bench_json()),
                ("fork4k.wl.json", wl),
                ("fork4k.oracle", &format!("{X86_UNKNOWN}{}", oracle_line("ALL", 39, 20, 1))),
            ],
        );
        let r = check_case(&run, "fork4k", "4K", None).unwrap();
        assert!(r.failures.is_empty(), "{:?}\n{}", r.failures, r.table);
        assert!(
            r.table.contains("ok   arithmetic: reuse (4K pages are reused one by one) = 20, pages = 16"),
            "{}",
            r.table
        );
        assert!(r.table.contains("ok   getrusage: minflt+majflt = 39; faults 39 - retries 0"), "{}", r.table);
    }
}
