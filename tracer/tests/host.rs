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

// ---- lifecycle hardening (issue 8) ----

/// The faultscope these tests run: `FAULTSCOPE_HOST_TEST_BIN` (an older
/// build, to see them fail there), else this build.
fn fs_bin() -> String {
    std::env::var("FAULTSCOPE_HOST_TEST_BIN").unwrap_or_else(|_| BIN.to_string())
}

/// Waits until `record` (pid `tracer`) listens for marks, which it does once
/// attached and its targets are added.
fn wait_attached(tracer: &std::process::Child) {
    let sock = faultscope::cmd::mark::socket_path(tracer.id());
    for _ in 0..300 {
        if sock.exists() {
            return;
        }
        sleep(Duration::from_millis(50));
    }
    panic!("faultscope record did not attach within 15 s ({} missing)", sock.display());
}

/// The child processes of `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect()
}

/// Item 1: `record -p` while a child forked before attach still shares the
/// memory. The first phase says so, the child's exit starts the next one,
/// and the writes after it land there.
#[test]
fn a_child_forked_before_attach_is_seen() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let mut work = Command::new(BIN)
        .args(["workload", "--size", "32M", "--thp", "never", "--child-lifetime", "60"])
        .args(["--out", wl.to_str().unwrap()])
        .spawn()
        .unwrap();
    let pid = work.id();
    let mut child = None;
    for _ in 0..200 {
        child = children_of(pid).first().copied();
        if child.is_some() {
            break;
        }
        sleep(Duration::from_millis(50));
    }
    let child = child.expect("the workload forked no child");
    let tracer = Command::new(fs_bin())
        .args(["record", "-p", &pid.to_string(), "--json", fs.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_attached(&tracer);
    sleep(Duration::from_millis(200));
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
    assert!(work.wait().unwrap().success());
    let out = tracer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report = read_report(&fs);
    let wl = read_json(&wl);
    let pages = wl["pages"].as_u64().unwrap();
    let p = process(&report, pid as u64);
    let names: Vec<&str> = p.phases.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        [
            format!("attached: child-alive (pid {child}, forked before attach)"),
            format!("after-child-exit (pid {child}, forked before attach)")
        ],
        "{stderr}"
    );
    assert_eq!(
        (p.phases[0].kind, p.phases[0].children_alive),
        (faultscope::collect::phases::PhaseKind::ChildAlive, 1)
    );
    let wp = phase_count(&p.phases[1], Metric::WpFaults);
    assert!((pages..=pages + TOLERANCE).contains(&wp), "wp after the child's exit {wp}, pages {pages}");
    assert!(phase_count(&p.phases[0], Metric::WpFaults) < TOLERANCE);
    assert!(stderr.contains(&format!("pid {child}, forked by {pid} before attach")), "{stderr}");
    assert_nothing_left();
}

/// Item 6: the main thread exits first (exit(2), as pthread_exit does) and
/// another thread then runs the whole workload; the process is gone only
/// when its last thread exits. Both ways of telling the last thread: the
/// tracepoint's `group_dead` where the kernel has it, and
/// `signal->live` (what 6.12 needs).
#[test]
fn a_process_lives_until_its_last_thread_exits() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for via in ["", "signal-live"] {
        let d = tmp();
        let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
        let out = Command::new(fs_bin())
            .env("FAULTSCOPE_EXIT_VIA", via)
            .args(["record", "--json", fs.to_str().unwrap(), "--", BIN, "workload", "--leader-exit", "0.5"])
            .args(["--size", "32M", "--thp", "never", "--child", "exit", "--out", wl.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{via}: {}", String::from_utf8_lossy(&out.stderr));
        let report = read_report(&fs);
        assert_eq!(report.end.as_deref(), Some("all targets exited"), "{via}");
        assert_eq!(report.command_exit_status, Some(0), "{via}");
        let wl = read_json(&wl);
        let p = process(&report, wl["pid"].as_u64().unwrap());
        eprintln!(
            "exit via {:?}: faults {} wp_faults {} for {} pages, getrusage minflt {}",
            if via.is_empty() { "best" } else { via },
            count(p, Metric::Faults),
            count(p, Metric::WpFaults),
            wl["pages"],
            wl["minflt_total"]
        );
        check_fork_write(&report, &wl, false);
    }
    assert_nothing_left();
}

/// clone3(2) with `set_tid`: a new process with pid `pid` (free, reaped)
/// that execs `argv`. Root only.
fn spawn_with_pid(pid: u32, argv: &[&str]) -> u32 {
    use std::ffi::CString;
    let cargs: Vec<CString> = argv.iter().map(|a| CString::new(*a).unwrap()).collect();
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let set_tid: [libc::pid_t; 1] = [pid as libc::pid_t];
    // struct clone_args (CLONE_ARGS_SIZE_VER1): flags, pidfd, child_tid,
    // parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size.
    let mut args = [0u64; 10];
    args[4] = libc::SIGCHLD as u64;
    args[8] = set_tid.as_ptr() as u64;
    args[9] = 1;
    // SAFETY: a fork-like clone3; the child only execs or _exits.
    let r = unsafe { libc::syscall(libc::SYS_clone3, args.as_ptr(), std::mem::size_of_val(&args)) };
    if r == 0 {
        unsafe {
            libc::execv(ptrs[0], ptrs.as_ptr());
            libc::_exit(127);
        }
    }
    assert!(r > 0, "clone3 with set_tid {pid}: {}", std::io::Error::last_os_error());
    assert_eq!(r as u32, pid);
    r as u32
}

/// Item 5: a new process that takes an exited target's pid at once is not
/// counted as the target (nor renames it): the target leaves the kernel's
/// traced set at its exit, not when user space next drains events.
#[test]
fn a_reused_pid_is_not_the_exited_target() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = target.id();
    let tracer = Command::new(fs_bin())
        .args(["record", "-p", &pid.to_string(), "--json", fs.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_attached(&tracer);
    target.kill().unwrap();
    target.wait().unwrap();
    // The pid is free: a workload takes it at once, well inside the 50 ms
    // in which faultscope drains events.
    let again = spawn_with_pid(
        pid,
        &[BIN, "workload", "--size", "16M", "--thp", "never", "--out", wl.to_str().unwrap()],
    );
    let mut st = 0;
    unsafe { libc::waitpid(again as i32, &mut st, 0) };
    assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "workload status {st:#x}");
    assert_eq!(read_json(&wl)["pid"].as_u64(), Some(pid as u64), "the workload took the pid");
    let out = tracer.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = read_report(&fs);
    assert_eq!(report.end.as_deref(), Some("all targets exited"));
    let p = process(&report, pid as u64);
    // sleep faults nothing while it sleeps; the workload's faults are not its.
    assert_eq!((p.comm.as_str(), count(p, Metric::Faults)), ("sleep", 0), "{p:#?}");
    assert_nothing_left();
}

/// `record --follow-children -- sh -c 'N × /bin/true'`: the JSON size, the
/// recorder's peak RSS and the phases each process carries.
fn follow_children_run(n: u32) -> (u64, u64, Report) {
    let d = tmp();
    let fs = d.path().join("fs.json");
    let script = format!("i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done");
    // Reaped below by wait4, for its rusage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(fs_bin())
        .args(["record", "--follow-children", "--max-stats", "65536", "--json", fs.to_str().unwrap()])
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut st = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // wait4: the recorder's own peak RSS (KiB).
    let r = unsafe { libc::wait4(child.id() as i32, &mut st, 0, &mut ru) };
    assert_eq!(r, child.id() as i32);
    assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "status {st:#x}");
    let bytes = std::fs::metadata(&fs).unwrap().len();
    (bytes, ru.ru_maxrss as u64, read_report(&fs))
}

/// Item 4: a process carries only the phases it lived in (or faulted in),
/// so the report grows linearly with processes + phases, not with their
/// product.
#[test]
fn follow_children_reports_grow_linearly() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (j100, rss100, r100) = follow_children_run(100);
    let (j400, rss400, r400) = follow_children_run(400);
    eprintln!(
        "follow-children: 100 children: JSON {j100} bytes, RSS {rss100} KiB; 400 children: JSON {j400} bytes, RSS {rss400} KiB"
    );
    for (n, r) in [(100, &r100), (400, &r400)] {
        assert_eq!(r.processes.len(), n + 1, "the shell and its {n} children");
        let phases: usize = r.processes.iter().map(|p| p.phases.len()).max().unwrap();
        assert!(phases >= 2 * n, "the shell carries every phase: {phases}");
        // Each child lived through its fork and its exec, nothing else.
        let most = r.processes.iter().map(|p| p.phases.len()).filter(|&l| l < phases).max().unwrap();
        assert!(most <= 4, "a child carries {most} phases");
        assert_eq!(r.drops.values().sum::<u64>(), 0, "{:?}", r.drops);
    }
    assert!(
        j400 <= j100 * 9 / 2 + (64 << 10),
        "JSON {j400} bytes at 400 children vs {j100} at 100: not linear"
    );
    assert!(rss400 <= rss100 * 9 / 2, "RSS {rss400} KiB at 400 children vs {rss100} at 100: not linear");
    assert_nothing_left();
}
