//! The foundation and origins guest tests: the host tests run in the
//! guests (static, beside the shipped binary, under each backend, against
//! the tracefs kprobe oracle), libtest's output read back test by test.
//! The matrix's guests run the same way ([`host_test_vars`],
//! [`check_host_tests`]).

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
    let vars = host_test_vars(k, tests, None, &HOST_TEST_RUNS)?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm").join(name).join(k.name);
    std::fs::create_dir_all(&dir)?;
    let extra = [(crate::dist::static_host_tests(k.arch)?, "/host-tests".to_string())];
    let cpio = vm::initramfs_with(&dir, k.arch, &bin, "host-tests.sh", &vars, &extra)?;
    Ok(Guest { k, name, tests, vmlinuz, cpio, dir })
}

/// A guest's checks: its host tests, the table printed.
fn check(run: &vm::GuestRun, tests: &[&str]) -> Vec<String> {
    let r = check_host_tests(run, tests, None, &HOST_TEST_RUNS);
    print!("{}", r.table);
    r.failures
}

/// The host tests that run in the foundation guest too, where the oracle
/// adds its equality (`FAULTSCOPE_ORACLE`): those whose workload faultscope
/// records from start to end or attaches to, short lives named, shared
/// memory's write-notify (soft-dirty: the host kernel has none), and the
/// shipped binary itself (static, on a machine with no C library; its
/// `probes` names the fault path's mode).
const HOST_TESTS: [&str; 10] = [
    "command::version_names_the_commit_and_the_shipped_binary_needs_no_c_library",
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

/// The guest's variables for the host tests `tests` under each of `runs`
/// (backend, latency tier: an empty tier is the command's default), `once`
/// in the first run only (a test no backend changes), and the kernel's
/// CONFIG_ANON_VMA_NAME where its package says (whether the attribution
/// test's region may be named).
pub fn host_test_vars<S: AsRef<str>>(
    k: kernels::GuestKernel,
    tests: &[S],
    once: Option<&str>,
    runs: &[(&str, &str)],
) -> Result<Vec<(&'static str, String)>> {
    let tests: Vec<&str> = tests.iter().map(AsRef::as_ref).collect();
    let runs: Vec<String> = runs.iter().map(|(b, t)| format!("{b}:{t}")).collect();
    let mut vars = vec![("HOST_TESTS", tests.join(" ")), ("HOST_TEST_RUNS", runs.join(" "))];
    vars.extend(once.map(|t| ("HOST_TESTS_ONCE", t.to_string())));
    if let Some(y) = kernels::config_option(k, "CONFIG_ANON_VMA_NAME")? {
        vars.push(("ANON_VMA_NAME", if y { "y" } else { "n" }.to_string()));
    }
    Ok(vars)
}

/// The host tests' runs in the guest (`host_tests` in lib.sh), one per
/// backend of `runs`: libtest's line for each test, every one of `tests`
/// (and `once` in the first run) passed, the summary, and each test's own
/// output (its process against the oracle).
pub fn check_host_tests<S: AsRef<str>>(
    run: &vm::GuestRun,
    tests: &[S],
    once: Option<&str>,
    runs: &[(&str, &str)],
) -> CaseResult {
    let (mut table, mut fails) = (String::new(), Vec::new());
    for (i, &(backend, tier)) in runs.iter().enumerate() {
        let tier = if tier.is_empty() { "default" } else { tier };
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
        for name in tests.iter().map(AsRef::as_ref).chain(once.filter(|_| i == 0)) {
            if !results.iter().any(|(n, _)| *n == name) {
                fails.push(format!("{label}: {name}: did not run"));
            }
        }
        let summary = out.lines().find(|l| l.starts_with("test result:")).unwrap_or("no summary");
        table.push_str(&format!("  {summary}\n"));
        if let Some((_, shown)) = out.split_once("\nsuccesses:\n") {
            let shown = shown.rsplit_once("\nsuccesses:\n").map_or(shown, |(s, _)| s);
            table.push_str(shown.trim_end());
            table.push('\n');
        }
        // No summary: the binary died; a summary not ok: the failures'
        // output, which libtest prints last.
        if !summary.starts_with("test result: ok.") {
            fails.push(format!("{label}: {summary}:\n{}", crate::util::tail(out, 80)));
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

/// Boots `kernel` (a name of `kernels::KERNELS`) and runs the host tests
/// of `HOST_TESTS` under each backend.
pub fn run(kernel: &str) -> Result<()> {
    let g = prepare(kernel, "foundation", &HOST_TESTS)?;
    let run = g.boot()?;
    finish(g.k, &run, check(&run, g.tests), "guest test")
}
