//! The kernel matrix's cases (`faultscope_expect::cases`): each a bench
//! run whose write step shows what the kernel chose, held to the page
//! arithmetic, `verify` as CI runs it and, in a guest, the oracle of each
//! step and the kernel's own counters. xtask runs them in every guest
//! kernel (`matrix::case_*`), under each backend.

use faultscope_expect::cases::{self, KernelCounters, KernelTraits, Run};

use super::*;

/// One test per case, named `case_` and the case's name (`cases::test_name`).
macro_rules! case_tests {
    ($($test:ident => $case:literal,)*) => {
        $(
            #[test]
            fn $test() {
                run_case($case)
            }
        )*

        #[test]
        fn every_case_has_its_test() {
            let tests = [$((stringify!($test), $case)),*];
            for (case, _) in cases::CASES {
                assert!(tests.iter().any(|(_, c)| c == case), "no test of case {case}");
            }
            for (test, case) in tests {
                assert_eq!(format!("matrix::{test}"), cases::test_name(case));
            }
        }
    };
}

case_tests! {
    case_4k_exit => "4k-exit",
    case_64k_exit => "64k-exit",
    case_2m_pte_exit => "2m-pte-exit",
    case_2m_pmd_exit => "2m-pmd-exit",
    case_2m_pmd_alive => "2m-pmd-alive",
    case_4k_alive => "4k-alive",
    case_16k_alive => "16k-alive",
    case_64k_alive => "64k-alive",
    case_spurious_race => "spurious-race",
    case_reader_writer => "reader-writer",
    case_read_then_store_64k => "read-then-store-64k",
    case_hotpatch => "hotpatch",
    case_hotpatch_mem => "hotpatch-mem",
}

/// Runs `case` at `FAULTSCOPE_CASE_SIZE` (16M), under the oracle where
/// there is one, and checks it; where this kernel cannot run it, checks
/// the refusal. The report is kept in `FAULTSCOPE_REPORTS` (a guest's, for
/// the checks across boots) as `CASE@BACKEND.json`.
fn run_case(case: &str) {
    let _t = host_test();
    let d = tmp();
    let size = std::env::var("FAULTSCOPE_CASE_SIZE").unwrap_or_else(|_| "16M".into());
    let json = d.path().join("report.json");
    let mut args = vec!["bench"];
    args.extend(cases::args(case).expect("a case").split_whitespace());
    args.extend(["--size", &size, "--json", json.to_str().unwrap()]);
    let dir = case.starts_with("hotpatch").then(|| HotpatchDir::new(d.path(), &size));
    if let Some(dir) = &dir {
        args.extend(["--file-dir", dir.path.to_str().unwrap()]);
    }
    let (mut table, mut fails) = (String::new(), Vec::new());
    let mut cl = Checklist::new(case, &mut table, &mut fails);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if let Some(why) = cases::expected_refusal(release.trim(), case) {
        let out = faultscope(&args);
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        cases::expect_refusal(&mut cl, &why, out.status.code(), &text);
    } else {
        measured_case(&mut cl, case, &args, &json);
    }
    println!("{case} at {size}:\n{table}");
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}

/// A case bench `args` runs, writing its report to `json`: the run, its
/// checks, and `verify` over it where the case has one.
fn measured_case(cl: &mut Checklist, case: &str, args: &[&str], json: &Path) {
    let t0 = Instant::now();
    let tracing = faultscope_expect::tracefs::start();
    // Machine-wide counts: read only where nothing else runs (a guest,
    // where the oracle traces).
    let before = tracing.as_ref().map(|_| KernelCounters::read());
    let t1 = Instant::now();
    let out = faultscope(args);
    let bench = t1.elapsed();
    let kernel = before.map(|b| KernelCounters::read().since(&b));
    let t2 = Instant::now();
    let traced = tracing.map(|t| t.finish(&[]));
    let oracle_time = t2.elapsed();
    assert!(out.status.success(), "bench {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let report = read_report(json);
    assert_backend(&report);
    keep_report(case, json);
    let oracle = traced.as_ref().map(|t| &t.oracle);
    // What faultscope said about its own run (a read that stayed torn, a
    // mode it fell back to): the case's output keeps it.
    for l in String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.starts_with("faultscope: ")) {
        cl.line(format!("  said: {l}"));
    }
    if let Some(t) = &traced {
        cl.line(format!("  the oracle: {}", t.summary));
        cl.expect(t.overrun == 0, format!("trace events lost (overrun): {}", t.overrun));
        cl.expect(t.kprobes_left == 0, format!("kprobes left after faultscope: {}", t.kprobes_left));
    } else {
        // Machine-wide counts: other processes' THPs enter them on a host.
        cl.line("  no oracle: the kernel's THP counters (machine-wide) are checked in a guest only");
    }
    let traits = KernelTraits::of_run();
    cases::check(cl, &Run { case, traits, report: &report, oracle, kernel: kernel.as_ref() });
    let verify = |expect: &str| {
        let out =
            faultscope(&["verify", "--phase", cases::WRITE, "--expect", expect, json.to_str().unwrap()]);
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), text)
    };
    if cases::VERIFY_CASES.contains(&case) {
        let (rc, text) = verify("contpte_unfold=0");
        cases::expect_verify_unfolds(cl, &report, rc, &text);
    }
    if cases::GATE_CASES.contains(&case) {
        let (rc, text) = verify(cases::GATE);
        cases::expect_gate(cl, traits.choices, &report, oracle, rc, &text);
    }
    cl.line(time_line(&report, t0.elapsed(), bench, oracle_time));
}

/// Where a case's time went: faultscope's command (its run from attach to
/// the end, the bench's own steps within it, the rest its start and end),
/// the oracle's count of the trace, and the checks.
fn time_line(report: &Report, total: Duration, bench: Duration, oracle: Duration) -> String {
    let run = Duration::from_nanos(report.duration_ns);
    let steps: u64 = report.bench.iter().flat_map(|b| &b.steps).map(|s| s.wall_ns).sum();
    format!(
        "  time: {:.2}s: faultscope bench {:.2}s (its run {:.2}s, of which the bench's steps {:.2}s; \
         its start and end {:.2}s), the oracle {:.2}s, the rest (verify, checks) {:.2}s",
        total.as_secs_f64(),
        bench.as_secs_f64(),
        run.as_secs_f64(),
        steps as f64 / 1e9,
        bench.saturating_sub(run).as_secs_f64(),
        oracle.as_secs_f64(),
        total.saturating_sub(bench + oracle).as_secs_f64()
    )
}

/// Keeps a case's report where the guest asks (`FAULTSCOPE_REPORTS`), as
/// `CASE@BACKEND.json`: the stale-TLB stage compares them across boots.
fn keep_report(case: &str, json: &Path) {
    let Some(dir) = std::env::var_os("FAULTSCOPE_REPORTS") else { return };
    let backend = std::env::var("FAULTSCOPE_BACKEND").unwrap_or_else(|_| "host".into());
    let dir = Path::new(&dir);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(json, dir.join(format!("{case}@{backend}.json"))).unwrap();
}

/// The hot-patch cases' directory: `FAULTSCOPE_HOTPATCH_DIR` (a guest's:
/// ext4 on a loop device where the kernel has both built in), else a tmpfs
/// mounted `huge=always` (file THPs) in the test's directory, unmounted
/// when dropped.
struct HotpatchDir {
    path: PathBuf,
    mounted: bool,
}

impl HotpatchDir {
    fn new(d: &Path, size: &str) -> HotpatchDir {
        if let Some(p) = std::env::var_os("FAULTSCOPE_HOTPATCH_DIR") {
            return HotpatchDir { path: p.into(), mounted: false };
        }
        let path = d.join("hotpatch");
        std::fs::create_dir(&path).unwrap();
        // The bench's file with room: its size and a half, and 32M.
        let mb = faultscope::units::parse_size(size).unwrap() >> 20;
        let opts = format!("huge=always,size={}M", mb + mb / 2 + 32);
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &opts, "fs-hotpatch"])
            .arg(&path)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t tmpfs -o {opts} {}: {st}", path.display());
        HotpatchDir { path, mounted: true }
    }
}

impl Drop for HotpatchDir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(&self.path).status();
        }
    }
}
