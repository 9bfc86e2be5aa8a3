//! The foundation and origins guest tests: the host tests run in the
//! guests (static, under each backend, against the tracefs kprobe oracle),
//! libtest's output read back test by test, and the shipped binary.

use std::{path::PathBuf, time::Duration};

use anyhow::{bail, Result};

use crate::{check::CaseResult, kernels, util::root, vm};

/// Boots `kernel` and runs only the origins guest.
pub fn run_origins(kernel: &str) -> Result<()> {
    let g = prepare(kernel, "origins", &ARM64_HOST_TESTS)?;
    let run = g.boot()?;
    finish(g.k, &run, check(&run, g.tests), "origins guest test")
}

/// The foundation guest (`kernel`) and the origins guest (`arm64`),
/// prepared one after the other and booted at once (`vm::boot_each`);
/// each is checked even when the other failed.
pub fn run_both(kernel: &str, arm64: &str) -> Result<()> {
    let guests = [prepare(kernel, "foundation", &HOST_TESTS)?, prepare(arm64, "origins", &ARM64_HOST_TESTS)?];
    let runs = vm::boot_each(&guests, Guest::boot);
    let mut failures = Vec::new();
    for (g, run) in guests.iter().zip(runs) {
        if let Err(e) = run.and_then(|run| finish(g.k, &run, check(&run, g.tests), g.name)) {
            failures.push(format!("{}: {e:#}", g.k.name));
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// A guest ready to boot: its kernel and initramfs (`host-tests.sh`, its
/// variables, and the host tests' static binary as `/host-tests`), made by
/// [`prepare`], and the host tests it runs.
struct Guest {
    k: kernels::GuestKernel,
    name: &'static str,
    tests: &'static [&'static str],
    vmlinuz: PathBuf,
    cpio: PathBuf,
    dir: PathBuf,
}

impl Guest {
    fn boot(&self) -> Result<vm::GuestRun> {
        vm::boot(self.k, &self.vmlinuz, &self.cpio, &self.dir, Duration::from_secs(600))
    }
}

fn prepare(kernel: &str, name: &'static str, tests: &'static [&'static str]) -> Result<Guest> {
    let k = kernels::by_name(kernel)?;
    let vars = host_test_vars(k, tests)?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm").join(name).join(k.name);
    std::fs::create_dir_all(&dir)?;
    let extra = [(vm::build_host_tests(k.arch)?, "/host-tests".to_string())];
    let cpio = vm::initramfs_with(&dir, k.arch, &bin, "host-tests.sh", &vars, &extra)?;
    Ok(Guest { k, name, tests, vmlinuz, cpio, dir })
}

/// A guest's checks: its host tests and the shipped binary, each table
/// printed.
fn check(run: &vm::GuestRun, tests: &[&str]) -> Vec<String> {
    let mut failures = Vec::new();
    for r in [check_host_tests(run, tests), check_shipped(run)] {
        print!("{}", r.table);
        failures.extend(r.failures);
    }
    failures
}

/// The host tests that run in the foundation guest too, where the oracle
/// adds its equality (`FAULTSCOPE_ORACLE`): those whose workload faultscope
/// records from start to end or attaches to, short lives named, and shared
/// memory's write-notify (soft-dirty: the host kernel has none).
const HOST_TESTS: [&str; 9] = [
    "record::record_command_counts_write_protect_faults",
    "record::a_threaded_storm_across_phases_loses_nothing",
    "record::faults_that_sleep_are_counted_once_and_timed_across_the_sleep",
    "record::mappings_of_a_process_gone_before_its_maps_are_read_are_named",
    "record::a_child_forked_before_attach_is_seen",
    "record::every_origin_of_a_fault_is_counted_in_its_phase",
    "bench::bench_counts_its_write_phase_exactly",
    "attribution::each_mapping_carries_its_own_pages_writes",
    "record::writes_to_shared_memory_after_soft_dirty_is_cleared_are_write_notify",
];

/// Those of the arm64 origins guest: every origin of a fault, the
/// scenarios that move a fault's state between CPUs and the kernel's
/// per-CPU counts, and two that the foundation guest, booted beside it
/// and longer, leaves to it (automatic phases, attribution said), under
/// each backend.
const ARM64_HOST_TESTS: [&str; 5] = [
    "record::every_origin_of_a_fault_is_counted_in_its_phase",
    "record::a_threaded_storm_across_phases_loses_nothing",
    "record::faults_that_sleep_are_counted_once_and_timed_across_the_sleep",
    "record::automatic_phases_split_the_fork_scenario",
    "attribution::attribution_is_measured_or_says_why_not",
];

/// Each backend the host tests run under in a guest, with the latency
/// tier of its records (`FAULTSCOPE_BACKEND`, `FAULTSCOPE_LATENCY`): the
/// kprobe run counts only, the fentry run times one fault in 4.
const HOST_TEST_RUNS: [(&str, &str); 2] = [("kprobe", "off"), ("fentry", "sample=4")];

/// The guest's variables for the host tests `tests` under every run of
/// `HOST_TEST_RUNS`, and the kernel's CONFIG_ANON_VMA_NAME where its
/// package says (whether the attribution test's region may be named).
fn host_test_vars(k: kernels::GuestKernel, tests: &[&str]) -> Result<Vec<(&'static str, String)>> {
    let runs: Vec<String> = HOST_TEST_RUNS.iter().map(|(b, t)| format!("{b}:{t}")).collect();
    let mut vars = vec![("HOST_TESTS", tests.join(" ")), ("HOST_TEST_RUNS", runs.join(" "))];
    if let Some(y) = kernels::config_option(k, "CONFIG_ANON_VMA_NAME")? {
        vars.push(("ANON_VMA_NAME", if y { "y" } else { "n" }.to_string()));
    }
    Ok(vars)
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
        for (name, line) in &results {
            // `ok <1.234s>`: libtest's --report-time.
            let (result, time) = line.split_once(' ').unwrap_or((line, ""));
            table.push_str(&format!("  {result:<7} {time:>10} {name}\n"));
            if result != "ok" {
                fails.push(format!("{label}: {name}: {line}"));
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
/// of `HOST_TESTS` under each backend.
pub fn run(kernel: &str) -> Result<()> {
    let g = prepare(kernel, "foundation", &HOST_TESTS)?;
    let run = g.boot()?;
    finish(g.k, &run, check(&run, g.tests), "guest test")
}
