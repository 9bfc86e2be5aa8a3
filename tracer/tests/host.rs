//! Host tests: faultscope on the build machine's own kernel (tracepoint mode
//! where kprobes are missing, kprobe mode where present), checked against the
//! workload's page arithmetic and getrusage. Needs root. Each test ends by
//! checking that no faultscope BPF program is left loaded.

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    sync::Mutex,
    thread::sleep,
    time::Duration,
};

use faultscope::{
    kernel::classes::Metric,
    report::{
        file,
        schema::{Mode, Phase, Process, Report},
    },
};
use faultscope_common::Program;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_faultscope");
/// The workload's faults outside the write phase that share its classes
/// (exec-time COW of data pages, stack/heap pages after fork): 20-50 here.
const TOLERANCE: u64 = 64;
/// Names of faultscope's BPF programs, from the one catalogue.
fn programs() -> impl Iterator<Item = &'static str> {
    Program::ALL.iter().map(|p| p.name())
}

/// Host tests attach to the one kernel: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn faultscope(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("running faultscope")
}

/// The workload's own report (not faultscope's).
fn read_json(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", p.display()))
}

/// A faultscope report, read back through the schema types.
fn read_report(p: &Path) -> Report {
    file::load(p).unwrap_or_else(|e| panic!("{e}")).report
}

fn process(report: &Report, pid: u64) -> &Process {
    report.process(pid as u32).unwrap_or_else(|| panic!("no process {pid} in {report:#?}"))
}

fn count(p: &Process, m: Metric) -> u64 {
    p.count(m).unwrap_or_else(|| panic!("class {m} has no count: {:?}", p.classes.get(&m)))
}

fn phase_count(p: &Phase, m: Metric) -> u64 {
    p.classes
        .get(&m)
        .and_then(|v| v.count())
        .unwrap_or_else(|| panic!("class {m} has no count in {}", p.name))
}

/// The live BPF programs of faultscope (every one of `Program::ALL`), by
/// name (independent of faultscope: asks the kernel through
/// BPF_PROG_GET_NEXT_ID). The kernel keeps 15 bytes of a name
/// (BPF_OBJ_NAME_LEN is 16), hence the prefix match.
fn leftover_programs() -> Vec<String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(str::to_string))
        .filter(|n| programs().any(|ours| ours.starts_with(n.as_str()) && !n.is_empty()))
        .collect()
}

fn assert_nothing_left() {
    // Program release after the last fd closes is synchronous for kprobes
    // and tracepoints; allow the exiting process a moment.
    for _ in 0..50 {
        if leftover_programs().is_empty() {
            return;
        }
        sleep(Duration::from_millis(100));
    }
    panic!("faultscope left BPF programs loaded: {:?}", leftover_programs());
}

/// Asserts the fork / child-exit / write scenario's arithmetic on a report
/// of the workload's process.
/// `attached_late`: faultscope attached with -p while the workload slept, so
/// the faults of its start-up are not in the report.
fn check_fork_write(report: &Report, wl: &Value, attached_late: bool) {
    let pid = wl["pid"].as_u64().unwrap();
    let pages = wl["pages"].as_u64().unwrap();
    let p = process(report, pid);
    let wp = count(p, Metric::WpFaults);
    assert!(
        (pages..=pages + TOLERANCE).contains(&wp),
        "wp_faults {wp} for {pages} pages written after fork ({:?} mode)",
        report.mode
    );
    // The workload's own count of write-phase faults: exactly one per page.
    let write_minflt = wl["phases"]["write"]["minflt"].as_u64().unwrap();
    assert!((pages..=pages + 2).contains(&write_minflt), "getrusage write phase {write_minflt}");
    // All faults since exec against getrusage (which also counts the few
    // faults of the forked child before its exec).
    let faults = count(p, Metric::Faults);
    let retries = p.count(Metric::Retry).unwrap_or(0);
    let minflt = if attached_late {
        wl["minflt_since_main"].as_u64().unwrap()
    } else {
        wl["minflt_total"].as_u64().unwrap() + wl["majflt_total"].as_u64().unwrap()
    };
    assert!(
        (faults - retries).abs_diff(minflt) <= TOLERANCE,
        "faults {faults} (retries {retries}) vs getrusage minflt+majflt {minflt}"
    );
    match report.mode {
        Mode::Tracepoint => {
            // The kprobe-only classes say so, never 0.
            for m in [Metric::Reuse, Metric::Copy, Metric::Spurious, Metric::HugePmdWp] {
                match &p.classes[&m] {
                    faultscope::report::schema::ClassValue::NotMeasurable(n) => {
                        assert!(!n.measurable && n.reason.len() > 10, "{m}: {n:?}")
                    }
                    v => panic!("{m} is measured in tracepoint mode: {v:?}"),
                }
            }
            let ft = count(p, Metric::FirstTouch);
            assert!(ft >= pages, "first_touch {ft}");
        }
        Mode::Kprobe => {
            let reuse = count(p, Metric::Reuse);
            assert!((pages..=pages + TOLERANCE).contains(&reuse), "reuse {reuse}");
        }
        m => panic!("unexpected mode {m:?}"),
    }
}

/// `faultscope record --json -- faultscope workload --size SIZE`: the output,
/// the report and the workload's own report.
fn record_workload(d: &Path, size: &str) -> (Output, Report, Value) {
    let (fs, wl) = (d.join("fs.json"), d.join("wl.json"));
    let out = faultscope(&[
        "record",
        "--json",
        fs.to_str().unwrap(),
        "--",
        BIN,
        "workload",
        "--size",
        size,
        "--thp",
        "never",
        "--child",
        "exit",
        "--out",
        wl.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (report, wl) = (read_report(&fs), read_json(&wl));
    (out, report, wl)
}

#[test]
fn record_command_counts_write_protect_faults() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (out, report, wl) = record_workload(d.path(), "64M");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("faultscope: measuring"), "{stderr}");
    assert_eq!(report.schema, "faultscope/1");
    assert_eq!(report.end.as_deref(), Some("all targets exited"));
    assert_eq!(report.command_exit_status, Some(0));
    check_fork_write(&report, &wl, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("wp_faults"), "{text}");
    assert_nothing_left();
}

#[test]
fn record_pid_follows_a_running_process_to_its_exit() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let mut child = Command::new(BIN)
        .args([
            "workload",
            "--size",
            "32M",
            "--thp",
            "never",
            "--start-delay",
            "2",
            "--out",
            wl.to_str().unwrap(),
        ])
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let tracer = Command::new(BIN)
        .args(["record", "-p", &pid, "--interval", "0.3", "--json", fs.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(child.wait().unwrap().success());
    // The child was reaped by us; faultscope sees its exit and stops.
    let out = tracer.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = read_report(&fs);
    assert_eq!(report.end.as_deref(), Some("all targets exited"));
    check_fork_write(&report, &read_json(&wl), true);
    // The interval time series adds up to the whole run.
    let p = process(&report, pid.parse().unwrap());
    let series: u64 = report
        .intervals
        .as_ref()
        .expect("intervals")
        .iter()
        .flat_map(|i| i.processes.iter())
        .filter(|x| x.pid == p.pid)
        .map(|x| x.counts[&Metric::WpFaults])
        .sum();
    assert_eq!(series, count(p, Metric::WpFaults));
    assert_nothing_left();
}

#[test]
fn sigterm_and_sigint_end_the_run_cleanly() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (sig, end) in [(libc::SIGTERM, "terminated"), (libc::SIGINT, "interrupted")] {
        let d = tmp();
        let fs = d.path().join("fs.json");
        let mut target = Command::new("sleep").arg("30").spawn().unwrap();
        let tracer = Command::new(BIN)
            .args(["record", "-p", &target.id().to_string(), "--json", fs.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        sleep(Duration::from_millis(1500));
        unsafe { libc::kill(tracer.id() as i32, sig) };
        let out = tracer.wait_with_output().unwrap();
        target.kill().unwrap();
        target.wait().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(read_report(&fs).end.as_deref(), Some(end));
        assert_nothing_left();
    }
}

#[test]
fn every_program_passes_the_verifier() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = faultscope(&["probes", "--load"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for p in programs() {
        assert!(text.contains(&format!("verifier: {p}: ok")), "{p} not accepted:\n{text}");
    }
    assert_nothing_left();
}

fn assert_refused(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr:?}");
}

#[test]
fn bad_input_is_refused_with_one_line() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert_refused(&faultscope(&["record", "-p", "4194303"]), "no process with pid 4194303");
    assert_refused(&faultscope(&["record"]), "nothing to trace");
    assert_refused(&faultscope(&["record", "--", "/nonexistent/cmd"]), "command not found");
    assert_refused(
        &faultscope(&["record", "--json", "/nonexistent/dir/r.json", "-p", "1"]),
        "cannot write /nonexistent/dir/r.json",
    );
    // Not root: drop to nobody.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN, "record", "-p", "1"])
        .output()
        .expect("setpriv (util-linux)");
    assert_refused(&out, "needs root");
    assert_nothing_left();
}

#[test]
fn a_thread_id_is_not_a_process() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A thread of this test process.
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        tx.send(unsafe { libc::gettid() }).unwrap();
        let _ = done_rx.recv();
    });
    let tid = rx.recv().unwrap();
    let out = faultscope(&["record", "-p", &tid.to_string()]);
    done_tx.send(()).unwrap();
    h.join().unwrap();
    assert_refused(&out, "is a thread of process");
}

/// A phase of a process by name prefix.
fn phase<'a>(p: &'a Process, prefix: &str) -> &'a Phase {
    p.phases
        .iter()
        .find(|ph| ph.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no phase {prefix}: {:#?}", p.phases))
}

#[test]
fn automatic_phases_split_the_fork_scenario() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (_, report, wl) = record_workload(d.path(), "32M");
    let pages = wl["pages"].as_u64().unwrap();
    let p = process(&report, wl["pid"].as_u64().unwrap());
    let names: Vec<&str> = p.phases.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["before-fork", "fork#1 child-alive", "fork#1 after-child-exit"], "{names:?}");
    // Populate happens before the fork; the writes after the child exited.
    let before = phase(p, "before-fork");
    assert!(phase_count(before, Metric::Faults) >= pages);
    let after = phase(p, "fork#1 after-child-exit");
    let wp = phase_count(after, Metric::WpFaults);
    assert!((pages..=pages + TOLERANCE).contains(&wp), "wp after child exit {wp}");
    assert!(phase(p, "fork#1 child-alive").end_ns.unwrap() <= after.start_ns);
    assert_nothing_left();
}

fn bench(args: &[&str], json: &Path) -> Report {
    let mut a = vec!["bench"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let out = faultscope(&a);
    assert!(out.status.success(), "bench {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    read_report(json)
}

/// The bench's write step (its mark and the phases up to the next mark).
fn bench_write(report: &Report) -> (u64, u64) {
    let p = report.bench_process().expect("the bench process");
    let wp = p.span("mark:write").expect("mark:write").count(Metric::WpFaults).expect("wp_faults");
    (wp, report.bench.as_ref().unwrap().pages)
}

#[test]
fn bench_counts_its_write_phase_exactly() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    for folio in ["4K", "64K", "2M"] {
        let r = bench(
            &["seq", "--size", "32M", "--folio", folio, "--time-stores"],
            &d.path().join(format!("{folio}.json")),
        );
        let b = r.bench.as_ref().unwrap();
        assert_eq!(b.folio_check.whole_folios, b.folio_check.blocks, "{folio}: {b:?}");
        assert_eq!(b.mapping, "pte");
        let (wp, pages) = bench_write(&r);
        // Kprobe or tracepoint mode alike, one write-protect fault per page;
        // the few others are the bench's own stack pages.
        assert!((pages..=pages + 8).contains(&wp), "{folio}: wp {wp} for {pages} pages");
        // The workload's own count of the same phase.
        let minflt = b.step("write").unwrap().minflt as u64;
        assert!((pages..=pages + 8).contains(&minflt), "{folio}: getrusage {minflt}");
        assert_eq!(b.store_latency.unwrap().n, pages);
    }
    // PMD-mapped THPs: one write-protect fault per 2M, not per page.
    let r = bench(&["seq", "--size", "32M", "--folio", "2M", "--pmd"], &d.path().join("pmd.json"));
    assert_eq!(r.bench.as_ref().unwrap().folio_check.pmd_mapped_bytes, 32 << 20);
    let (wp, _) = bench_write(&r);
    assert!(wp <= 16 + 8, "PMD-mapped: {wp} write-protect faults for 16 THPs");
    assert_nothing_left();
}

#[test]
fn verify_and_diff_over_recorded_reports() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let a = d.path().join("a.json");
    let b = d.path().join("b.json");
    bench(&["seq", "--size", "16M", "--folio", "4K"], &a);
    bench(&["seq", "--size", "16M", "--folio", "64K"], &b);
    let v = |args: &[&str]| {
        let mut all = vec!["verify"];
        all.extend_from_slice(args);
        faultscope(&all)
    };
    let out = v(&[
        "--phase",
        "mark:write",
        "--expect",
        "wp_faults>=4096",
        "--expect",
        "wp_faults<=4104",
        a.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let out = v(&["--phase", "mark:write", "--expect", "wp_faults<100", a.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL wp_faults<100: wp_faults is 4"));
    if read_report(&a).mode == Mode::Tracepoint {
        let out = v(&["--expect", "contpte_unfold=0", a.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(3), "not measurable is its own exit code");
        assert!(String::from_utf8_lossy(&out.stdout).contains("NOT MEASURABLE"));
    }
    let bad = d.path().join("bad.json");
    std::fs::write(&bad, "{\"schema\": \"faultscope/1\", \"proc").unwrap();
    assert_refused(&v(&["--expect", "faults>0", bad.to_str().unwrap()]), "not a faultscope report");
    let out = faultscope(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("warning: workloads differ: bench folio \"4K\" vs \"64K\""), "{text}");
    assert!(text.lines().any(|l| l.starts_with("mark:write") && l.contains("wp_faults")), "{text}");
    assert_nothing_left();
}

#[test]
fn marks_from_the_command_line_and_signals() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let fs = d.path().join("fs.json");
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let tracer = Command::new(BIN)
        .args([
            "record",
            "-p",
            &target.id().to_string(),
            "--mark-on-signal",
            "USR1",
            "--json",
            fs.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    sleep(Duration::from_millis(1500));
    let out = Command::new(BIN)
        .args(["mark", "--recorder", &tracer.id().to_string(), "BGSAVE done"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "phase mark:BGSAVE done");
    unsafe { libc::kill(tracer.id() as i32, libc::SIGUSR1) };
    sleep(Duration::from_millis(300));
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let out = tracer.wait_with_output().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    let names: Vec<&str> = r.processes[0].phases.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["before-fork", "mark:BGSAVE done", "mark:signal#1"]);
    // No recorder left: mark is refused.
    assert_refused(&faultscope(&["mark", "x"]), "no faultscope record is running");
    assert_nothing_left();
}

#[test]
fn bench_restores_sysfs_knobs_when_terminated() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let knobs = [
        "/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled",
        "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs",
    ];
    let before: Vec<String> = knobs.iter().map(|k| std::fs::read_to_string(k).unwrap()).collect();
    let child = Command::new(BIN)
        .args(["bench", "seq", "--size", "1G", "--folio", "64K"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    sleep(Duration::from_millis(400));
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    // SIGTERM is deferred until the knobs are back and the probes gone.
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{:?}", out.status);
    let after: Vec<String> = knobs.iter().map(|k| std::fs::read_to_string(k).unwrap()).collect();
    assert_eq!(before, after);
    assert_nothing_left();
}

// ---- attribution (issue 9) ----

/// In tracepoint mode (no kprobes on this host) per-mapping counts need the
/// handle_mm_fault kprobe: the report says so instead of showing none, and
/// the run still counts. Where kprobes work, the workload's region carries
/// its writes.
#[test]
fn attribution_is_measured_or_says_why_not() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (out, report, wl) = record_workload(d.path(), "16M");
    let info = report.attribution.as_ref().expect("the report says what it attributed");
    let p = process(&report, wl["pid"].as_u64().unwrap());
    match report.mode {
        Mode::Tracepoint => {
            assert!(!info.mappings);
            let why = info.mappings_reason.as_deref().unwrap_or("");
            assert!(why.contains("handle_mm_fault kprobe"), "{why}");
            assert!(String::from_utf8_lossy(&out.stderr).contains("per-mapping counts not measurable here"));
            assert!(p.attribution.mappings.is_empty());
            // copy and spurious cannot be measured here, so no sites either.
            assert!(info.site_classes.is_empty(), "{:?}", info.site_classes);
        }
        _ => {
            assert!(info.mappings);
            let pages = wl["pages"].as_u64().unwrap();
            let region = p.attribution.top_mapping(Metric::Reuse).expect("a mapping with reuse").1;
            assert!(region >= pages, "{region} < {pages}");
        }
    }
    assert_nothing_left();
}
