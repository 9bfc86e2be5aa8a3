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
    // The writes come after the child's exit: that phase's count, not the
    // whole process's (its start-up's COW faults vary with the machine).
    let wp: u64 = p
        .phases
        .iter()
        .filter(|ph| ph.name.ends_with("after-child-exit"))
        .map(|ph| phase_count(ph, Metric::WpFaults))
        .sum();
    assert!(
        (pages..=pages + TOLERANCE).contains(&wp),
        "wp_faults {wp} after the child's exit for {pages} pages written after fork ({:?} mode; phases {:?})",
        report.mode,
        p.phases.iter().map(|ph| ph.name.as_str()).collect::<Vec<_>>()
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
        // Once attached (on a loaded machine the attach takes seconds).
        wait_attached(&tracer);
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
    assert_refused(
        &faultscope(&["record", "--flamegraph", "/nonexistent/dir/f.svg", "-p", "1"]),
        "cannot write /nonexistent/dir/f.svg",
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
    // The recorder takes marks once it has attached (seconds on a loaded
    // machine): until then mark says there is none, and is asked again.
    let mut tries = 0;
    let out = loop {
        let out = Command::new(BIN)
            .args(["mark", "--recorder", &tracer.id().to_string(), "BGSAVE done"])
            .output()
            .unwrap();
        tries += 1;
        if out.status.success()
            || tries == 300
            || !String::from_utf8_lossy(&out.stderr).contains("is running")
        {
            break out;
        }
        sleep(Duration::from_millis(100));
    };
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

// ---- files, signals and CLI hardening (issue 8) ----

use std::{
    collections::BTreeSet,
    io::{BufRead as _, BufReader, Read as _},
    os::unix::{
        fs::{MetadataExt as _, PermissionsExt as _},
        process::CommandExt as _,
    },
    path::PathBuf,
    time::Instant,
};

/// A user made for one test (useradd), removed with it (userdel).
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
}

impl TestUser {
    fn new() -> TestUser {
        let name = format!("fsh8b{}", std::process::id());
        let st = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", &name])
            .status()
            .expect("useradd");
        assert!(st.success(), "useradd {name}: {st}");
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").args([flag, &name]).output().unwrap();
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        let (uid, gid) = (id("-u"), id("-g"));
        TestUser { name, uid, gid }
    }

    /// Makes `p` (a file, directory or symlink itself) the user's.
    fn own(&self, p: &Path) {
        std::os::unix::fs::lchown(p, Some(self.uid), Some(self.gid)).unwrap();
    }

    /// A symlink at `at` to `to`, owned by the user.
    fn plant(&self, to: &Path, at: &Path) {
        std::os::unix::fs::symlink(to, at).unwrap();
        self.own(at);
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

/// The next `n` pids the kernel will hand out (in order, from the last one
/// given out), for names an attacker would plant ahead of time.
fn next_pids(n: u32) -> Vec<u32> {
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid").unwrap().trim().parse().unwrap();
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    // pids wrap to 300 (RESERVED_PIDS) after pid_max.
    (1..=n).map(|i| last + i).map(|p| if p >= max { 300 + (p - max) } else { p }).collect()
}

/// The names in a directory.
fn entries(d: &Path) -> BTreeSet<String> {
    std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

#[test]
fn verify_run_uses_a_private_directory_and_never_a_planted_one() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let user = TestUser::new();
    let d = tmp();
    // A /tmp of our own (world-writable, sticky) as TMPDIR.
    let tmpdir = d.path().join("tmp");
    std::fs::create_dir(&tmpdir).unwrap();
    std::fs::set_permissions(&tmpdir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = d.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    // The user pre-creates the directory of every pid verify may get, with
    // the report's name pointing at the victim.
    let pids = next_pids(1000);
    for &p in &pids {
        let dir = tmpdir.join(format!("faultscope-verify-{p}"));
        if std::fs::create_dir(&dir).is_ok() {
            user.own(&dir);
            user.plant(&victim, &dir.join("report.json"));
        }
    }
    let planted = entries(&tmpdir);
    let verify = |args: &[&str]| {
        let child = Command::new(BIN)
            .arg("verify")
            .args(args)
            .env("TMPDIR", &tmpdir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        (pid, child.wait_with_output().unwrap())
    };
    let (pid, out) = verify(&["--expect", "faults>0", "--", "bench", "seq", "--size", "4M"]);
    assert!(pids.contains(&pid), "verify got pid {pid}, not one planted for; run again");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("PASS faults>0"));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    // The planted directory was neither used nor removed; nothing else is left.
    let mine = tmpdir.join(format!("faultscope-verify-{pid}"));
    assert_eq!(std::fs::read_link(mine.join("report.json")).unwrap(), victim);
    assert_eq!(std::fs::metadata(&mine).unwrap().uid(), user.uid);
    assert_eq!(entries(&tmpdir), planted, "verify left its directory");
    // A run that fails leaves nothing either.
    let (_, out) =
        verify(&["--expect", "faults>0", "--", "bench", "seq", "--folio", "64K", "--size", "100K"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the run failed"));
    assert_eq!(entries(&tmpdir), planted, "a failed verify left its directory");
    assert_nothing_left();
}

#[test]
fn record_json_never_writes_through_planted_symlinks() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let user = TestUser::new();
    let d = tmp();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Root writes a report into a directory of the user's (the user asked
    // for it there), where the user has planted symlinks at the report's
    // name and at every temporary name the writer might use.
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    user.own(&home);
    let victims: Vec<PathBuf> = (0..3).map(|i| d.path().join(format!("victim{i}"))).collect();
    for v in &victims {
        std::fs::write(v, "keep").unwrap();
    }
    let report = home.join("r.json");
    user.plant(&victims[0], &report);
    user.plant(&victims[1], &home.join("r.json.tmp"));
    let pids = next_pids(300);
    for &p in &pids {
        user.plant(&victims[2], &home.join(format!(".r.json.{p}.0.tmp")));
    }
    let planted = entries(&home);
    let child = Command::new(BIN)
        .args(["record", "--json", report.to_str().unwrap(), "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(pids.contains(&pid), "record got pid {pid}, not one planted for; run again");
    for v in &victims {
        assert_eq!(std::fs::read_to_string(v).unwrap(), "keep", "{} was written through", v.display());
    }
    // The report replaced the link at its name; the other links are as planted.
    assert!(std::fs::symlink_metadata(&report).unwrap().is_file());
    assert_eq!(read_report(&report).end.as_deref(), Some("all targets exited"));
    assert_eq!(std::fs::read_link(home.join(format!(".r.json.{pid}.0.tmp"))).unwrap(), victims[2]);
    assert_eq!(entries(&home), planted, "a temporary file was left");
    assert_nothing_left();
}

const THP_KNOBS: [&str; 3] = [
    "/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled",
    "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/enabled",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs",
];

fn thp_knobs() -> Vec<String> {
    THP_KNOBS.iter().map(|k| std::fs::read_to_string(k).unwrap()).collect()
}

/// Puts the THP settings back as they were, whatever a test did.
struct RestoreThp(Vec<String>);

impl Drop for RestoreThp {
    fn drop(&mut self) {
        for (k, v) in THP_KNOBS.iter().zip(&self.0) {
            let sel = v
                .split_whitespace()
                .find(|w| w.starts_with('['))
                .map(|w| w.trim_matches(['[', ']']).to_string())
                .unwrap_or_else(|| v.trim().to_string());
            let _ = std::fs::write(k, sel);
        }
    }
}

/// A `bench --folio 64K` over 1G, SIGKILLed once it has set the knobs.
fn bench_killed_with_knobs_set() {
    let mut child = Command::new(BIN)
        .args(["bench", "seq", "--size", "1G", "--folio", "64K"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let set = || {
        let k = thp_knobs();
        k[0].contains("[always]") && k[2].trim() == "3600000"
    };
    while !set() {
        assert!(t.elapsed() < Duration::from_secs(20), "bench never set the knobs");
        assert!(child.try_wait().unwrap().is_none(), "bench ended before it was killed");
        sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn bench_thp_settings_come_back_after_sigkill() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = thp_knobs();
    let _restore = RestoreThp(before.clone());
    bench_killed_with_knobs_set();
    assert_ne!(thp_knobs(), before, "SIGKILL left the knobs as the bench set them");
    // The next bench restores the originals first, and never saves the
    // killed bench's values as the originals.
    let out = faultscope(&["bench", "seq", "--size", "4M", "--folio", "64K"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("restored the THP settings"));
    assert_eq!(thp_knobs(), before);
    // Any faultscope command as root restores them too.
    bench_killed_with_knobs_set();
    let out = faultscope(&["probes"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("restored the THP settings"));
    assert_eq!(thp_knobs(), before);
    assert!(!Path::new("/run/faultscope/bench-thp.state").exists());
    assert_nothing_left();
}

#[test]
fn bad_seconds_and_counts_are_refused_before_attaching() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for flag in ["--duration", "--interval"] {
        for v in ["-1", "0", "nan", "inf", "-inf", "1e19", "1e999"] {
            let out = faultscope(&["record", "-p", "1", flag, v]);
            assert_refused(&out, &format!("{flag} "));
            let out = faultscope(&["record", "-p", "1", &format!("{flag}={v}")]);
            assert_refused(&out, "give a number of seconds");
        }
    }
    assert_refused(&faultscope(&["record", "-p", "1", "--interval", "1", "--count", "0"]), "--count 0");
    assert_refused(&faultscope(&["record", "-p", "1", "--max-stats", "0"]), "--max-stats 0");
    assert_nothing_left();
}

#[test]
fn a_closed_stdout_ends_the_run_and_keeps_the_report() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let fs = d.path().join("fs.json");
    // record --interval ... | head -1
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let mut tracer = Command::new(BIN)
        .args(["record", "-p", &target.id().to_string(), "--interval", "0.2", "--json", fs.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let tpid = tracer.id();
    let mut first = String::new();
    BufReader::new(tracer.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("--- interval 1"), "{first:?}");
    let out = tracer.wait_with_output().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(read_report(&fs).end.as_deref(), Some("stdout closed"));
    assert!(!Path::new(&format!("/run/faultscope/record-{tpid}.sock")).exists(), "socket left");
    // bench | (nothing reads)
    let bj = d.path().join("bench.json");
    let mut bench = Command::new(BIN)
        .args(["bench", "seq", "--size", "4M", "--json", bj.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(bench.stdout.take());
    let out = bench.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(read_report(&bj).bench.is_some());
    assert_nothing_left();
}

/// A cgroup (v1 pids controller) allowing `max` tasks, removed with it.
struct PidsCgroup(PathBuf);

impl PidsCgroup {
    fn new(max: u32) -> Option<PidsCgroup> {
        let root = Path::new("/sys/fs/cgroup/pids");
        let root = if root.join("cgroup.procs").exists() { root } else { Path::new("/sys/fs/cgroup") };
        let d = root.join(format!("faultscope-test-{}", std::process::id()));
        std::fs::create_dir(&d).ok()?;
        std::fs::write(d.join("pids.max"), max.to_string()).ok()?;
        Some(PidsCgroup(d))
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn bench_that_cannot_start_a_thread_says_so() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // bench, its forked child (waited for) and one writer: the second
    // writer thread cannot be started.
    let Some(cg) = PidsCgroup::new(2) else {
        eprintln!("no pids cgroup to limit threads with: skipped");
        return;
    };
    let procs = std::ffi::CString::new(cg.0.join("cgroup.procs").to_str().unwrap()).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["bench", "threads", "--threads", "8", "--size", "16M"]);
    // SAFETY: open/write/close only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        })
    };
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{:?}: {stderr}", out.status);
    assert!(stderr.contains("could not start writer thread 2 of 8"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    drop(cg);
    assert_nothing_left();
}

#[test]
fn sigkill_keeps_the_old_report_and_sighup_ends_the_run() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let fs = d.path().join("fs.json");
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let start = || {
        Command::new(BIN)
            .args(["record", "-p", &target.id().to_string(), "--json", fs.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    std::fs::write(&fs, "the earlier report").unwrap();
    let mut tracer = start();
    wait_attached(&tracer);
    tracer.kill().unwrap();
    tracer.wait().unwrap();
    assert_eq!(std::fs::read_to_string(&fs).unwrap(), "the earlier report");
    assert_eq!(entries(d.path()), BTreeSet::from(["fs.json".to_string()]));
    let tracer = start();
    wait_attached(&tracer);
    unsafe { libc::kill(tracer.id() as i32, libc::SIGHUP) };
    let out = tracer.wait_with_output().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    assert!(out.status.success(), "{:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    assert_eq!(read_report(&fs).end.as_deref(), Some("hung up"));
    assert_nothing_left();
}

/// The children of a process (its main thread's: bench forks from it).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X'])),
    }
}

#[test]
fn bench_child_alive_dies_with_the_bench() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut bench = Command::new(BIN)
        .args(["bench", "seq", "--child", "alive", "--size", "1G"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let child = loop {
        if let Some(&c) = children(bench.id()).first() {
            break c;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "bench never forked");
        assert!(bench.try_wait().unwrap().is_none(), "bench ended before it was killed");
        sleep(Duration::from_millis(5));
    };
    bench.kill().unwrap();
    bench.wait().unwrap();
    let t = Instant::now();
    while !is_gone(child) && t.elapsed() < Duration::from_secs(3) {
        sleep(Duration::from_millis(20));
    }
    let gone = is_gone(child);
    if !gone {
        unsafe { libc::kill(child as i32, libc::SIGKILL) };
    }
    assert!(gone, "the bench's child {child} outlived it");
    assert_nothing_left();
}

#[test]
fn stale_sockets_are_removed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let sock = |pid: u32| PathBuf::from(format!("/run/faultscope/record-{pid}.sock"));
    // A recorder killed by SIGKILL leaves its socket; the next command
    // removes it.
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let mut tracer = Command::new(BIN)
        .args(["record", "-p", &target.id().to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let dead = tracer.id();
    wait_attached(&tracer);
    assert!(sock(dead).exists());
    tracer.kill().unwrap();
    tracer.wait().unwrap();
    assert!(sock(dead).exists(), "SIGKILL cannot remove the socket");
    assert_refused(
        &faultscope(&["mark", "--recorder", &dead.to_string(), "x"]),
        &format!("no faultscope record with pid {dead}"),
    );
    assert!(!sock(dead).exists(), "the stale socket is still there");
    // The pid is reused by a process that is no recorder: it is not taken
    // for one.
    let reused = target.id();
    drop(std::os::unix::net::UnixListener::bind(sock(reused)).unwrap());
    assert_refused(
        &faultscope(&["mark", "--recorder", &reused.to_string(), "x"]),
        &format!("no faultscope record with pid {reused}"),
    );
    assert!(!sock(reused).exists());
    // Any command as root clears them.
    drop(std::os::unix::net::UnixListener::bind(sock(reused)).unwrap());
    assert!(faultscope(&["schema"]).status.success());
    assert!(!sock(reused).exists());
    target.kill().unwrap();
    target.wait().unwrap();
    assert_nothing_left();
}

#[test]
fn the_recorded_command_starts_with_default_signals() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(BIN);
    cmd.args(["record", "--", "cat", "/proc/self/status"]);
    // faultscope itself starts with SIGUSR2 blocked.
    // SAFETY: signal-mask calls only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR2);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    };
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mask = |key: &str| -> u64 {
        let line =
            text.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("{key} in {text}"));
        u64::from_str_radix(line.trim(), 16).unwrap()
    };
    assert_eq!(mask("SigBlk:"), 0, "the command inherited a blocked signal");
    let sigpipe = 1u64 << (libc::SIGPIPE - 1);
    assert_eq!(mask("SigIgn:") & sigpipe, 0, "the command runs with SIGPIPE ignored");
    assert_nothing_left();
}

/// Bytes a terminal would act on: C0 controls other than newline and tab,
/// DEL, and C1 controls (UTF-8 encoded).
fn control_bytes(b: &[u8]) -> Vec<String> {
    let s = String::from_utf8_lossy(b);
    s.char_indices()
        .filter(|(_, c)| c.is_control() && *c != '\n' && *c != '\t')
        .map(|(i, c)| format!("{c:?} at {i}: {:?}", &s[i.saturating_sub(40)..(i + 10).min(s.len())]))
        .collect()
}

#[test]
fn control_characters_never_reach_the_terminal() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let fs = d.path().join("fs.json");
    // A process names itself with escape sequences (PR_SET_NAME), then
    // faults for 6 s.
    let name = c"fs\x1b]0;pwn\x07\x1b[2J";
    // SAFETY: the child makes system calls only, then _exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe {
            libc::prctl(libc::PR_SET_NAME, name.as_ptr());
            for _ in 0..120 {
                let len = 1 << 20;
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if p != libc::MAP_FAILED {
                    for off in (0..len).step_by(4096) {
                        std::ptr::write_volatile((p as *mut u8).add(off), 1);
                    }
                    libc::munmap(p, len);
                }
                libc::usleep(50_000);
            }
            libc::_exit(0);
        }
    }
    sleep(Duration::from_millis(100));
    // The live view, on a terminal (script gives it one): its own
    // cursor-home and clear sequences are the only escapes.
    if Path::new("/usr/bin/script").exists() {
        let cmd = format!("{BIN} record -p {pid} --interval 0.3 --duration 1.5");
        let out = Command::new("script").args(["-qec", &cmd, "/dev/null"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("phase: before-fork"), "{text:?}");
        assert!(!text.contains("\x1b]") && !text.contains('\x07') && !text.contains("\x1b[2J"), "{text:?}");
        assert_nothing_left();
    }
    let out = Command::new(BIN)
        .args(["record", "-p", &pid.to_string(), "--interval", "0.5", "--json"])
        .arg(&fs)
        .output()
        .unwrap();
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = read_report(&fs);
    assert!(process(&report, pid as u64).comm.contains('\x1b'), "the name was not recorded as set");
    let mut printed = vec![out];
    printed.push(faultscope(&["diff", fs.to_str().unwrap(), fs.to_str().unwrap()]));
    printed.push(faultscope(&[
        "verify",
        "--expect",
        "faults>0",
        "--pid",
        &pid.to_string(),
        fs.to_str().unwrap(),
    ]));
    for out in &printed {
        for b in [&out.stdout, &out.stderr] {
            let raw = control_bytes(b);
            assert!(raw.is_empty(), "raw control characters printed: {raw:?}");
        }
    }
    // A report with control characters in its kernel field and phase names.
    let text =
        std::fs::read_to_string(&fs).unwrap().replacen("\"kernel\": \"", "\"kernel\": \"\\u001b[2J", 1);
    let evil = d.path().join("evil.json");
    std::fs::write(&evil, text).unwrap();
    for args in [
        vec!["diff", evil.to_str().unwrap(), fs.to_str().unwrap()],
        vec!["verify", "--expect", "faults>0", "--phase", "\x1b[2J", evil.to_str().unwrap()],
        vec!["verify", "--expect", "\x1b[2J>0", evil.to_str().unwrap()],
    ] {
        let out = faultscope(&args);
        for b in [&out.stdout, &out.stderr] {
            let raw = control_bytes(b);
            assert!(raw.is_empty(), "{args:?}: raw control characters printed: {raw:?}");
        }
    }
    assert_nothing_left();
}

/// A small report with one process (pid 1) and one phase, with `count`
/// (raw JSON text) as its faults count.
fn report_with_count(count: &str) -> String {
    format!(
        r#"{{"schema": "faultscope/1", "kernel": "6.12", "arch": "x86_64", "mode": "tracepoint", "duration_ns": 1,
        "probes": [], "drops": {{}}, "processes": [{{"pid": 1, "comm": "x",
        "phases": [{{"id": 1, "name": "before-fork", "kind": "before-fork", "start_ns": 0, "children_alive": 0,
                     "classes": {{"faults": {{"count": {count}, "source": "t"}}}}}}],
        "classes": {{"faults": {{"count": {count}, "source": "t"}}}}}}]}}"#
    )
}

#[test]
fn verify_refuses_malformed_reports_typos_and_bad_numbers() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let write = |name: &str, text: &str| {
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let verify = |args: &[&str]| {
        let mut all = vec!["verify"];
        all.extend_from_slice(args);
        faultscope(&all)
    };
    let good = write("good.json", &report_with_count("5"));
    let out = verify(&["--expect", "faults>0", "--pid", "1", "--phase", "before-fork", &good]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // Counts that are not integers in 0..2^64.
    for (i, bad) in
        ["NaN", "Infinity", "-Infinity", "1e999", "1 0", "-1", "1.5", "18446744073709551616", "\"5\""]
            .iter()
            .enumerate()
    {
        let p = write(&format!("bad{i}.json"), &report_with_count(bad));
        let out = verify(&["--expect", "faults>0", &p]);
        assert_eq!(out.status.code(), Some(2), "count {bad}: {}", String::from_utf8_lossy(&out.stderr));
    }
    // Counts that overflow when summed (the phase and a second process).
    let two = report_with_count("18446744073709551615").replacen(
        r#""processes": ["#,
        r#""processes": [{"pid": 2, "comm": "y", "phases": [], "classes": {"faults": {"count": 1, "source": "t"}}}, "#,
        1,
    );
    let p = write("overflow.json", &two);
    assert_refused(&verify(&["--expect", "faults>0", &p]), "overflow");
    // Typos are refusals, not failed checks.
    assert_refused(&verify(&["--expect", "faults>0", "--pid", "2", &good]), "--pid 2");
    assert_refused(&verify(&["--expect", "faults>0", "--phase", "mark:wrtie", &good]), "--phase mark:wrtie");
    assert_refused(&verify(&["--expect", "fautls>0", &good]), "is not a class");
    // The number of an expectation: finite, no space inside.
    for bad in ["faults<nan", "faults<inf", "faults>-inf", "faults<1e999", "faults<1 0", "faults<1e"] {
        assert_refused(&verify(&["--expect", bad, &good]), "is not a number");
    }
    let out = verify(&["--expect", " faults >= 5 ", &good]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_command_that_cannot_be_executed_is_said() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let bad = d.path().join("not-a-binary");
    std::fs::write(&bad, [0u8, 1, 2, 3]).unwrap();
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = faultscope(&["record", "--", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert!(stderr.contains(&format!("cannot run {}: Exec format error", bad.display())), "{stderr}");
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_refused(&faultscope(&["record", "--", bad.to_str().unwrap()]), "not executable");
    assert_nothing_left();
}

#[test]
fn mark_serves_clients_without_stalling_and_needs_root() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let fs = d.path().join("fs.json");
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let tracer = Command::new(BIN)
        .args(["record", "-p", &target.id().to_string(), "--json", fs.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let recorder = tracer.id().to_string();
    wait_attached(&tracer);
    // A client that connects and says nothing holds nobody up.
    let mut silent =
        std::os::unix::net::UnixStream::connect(format!("/run/faultscope/record-{recorder}.sock")).unwrap();
    sleep(Duration::from_millis(100));
    let t = Instant::now();
    let out = faultscope(&["mark", "--recorder", &recorder, "during"]);
    let took = t.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(took < Duration::from_millis(1000), "the mark took {took:?} behind a silent client");
    // The silent client is answered once it times out, not hung up on early.
    silent.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut reply = String::new();
    silent.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("error timed out"), "{reply:?}");
    // Another user is told that mark needs root, not that no recorder runs.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN, "mark", "--recorder", &recorder, "x"])
        .output()
        .unwrap();
    assert_refused(&out, "needs root");
    unsafe { libc::kill(tracer.id() as i32, libc::SIGINT) };
    let out = tracer.wait_with_output().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    let names: Vec<&str> = r.processes[0].phases.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["before-fork", "mark:during"]);
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

/// One GET /metrics, the body.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

fn sample(text: &str, prefix: &str) -> u64 {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0)
}

#[test]
fn serve_pid_counts_match_getrusage_and_sigterm_ends_it() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = 9871;
    // Waits for a line on stdin, touches 2048 new pages, prints its minflt
    // for that, and waits for the next line to exit.
    let script = "import sys,resource\nsys.stdin.readline()\nr0=resource.getrusage(0).ru_minflt\n\
b=bytearray(2048*4096)\nfor j in range(0,len(b),4096): b[j]=1\n\
print(resource.getrusage(0).ru_minflt-r0,flush=True)\nsys.stdin.readline()\n";
    let mut wl = Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = wl.id().to_string();
    let serve = Command::new(BIN)
        .args(["serve", "-p", &pid, "--port", &port.to_string(), "--tick", "0.2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ends serve when an assertion fails before the SIGTERM below.
    struct Term(u32);
    impl Drop for Term {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0 as i32, libc::SIGTERM) };
        }
    }
    let _term = Term(serve.id());
    sleep(Duration::from_millis(2500));
    let before = sample(&scrape(port), "faultscope_class_faults_total{class=\"faults\"");
    use std::io::{BufRead, Write};
    let mut stdin = wl.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    let mut line = String::new();
    std::io::BufReader::new(wl.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let minflt: u64 = line.trim().parse().unwrap();
    sleep(Duration::from_millis(1000));
    let text = scrape(port);
    let faults: u64 = text
        .lines()
        .filter(|l| l.starts_with("faultscope_class_faults_total{class=\"faults\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(minflt >= 2048, "{minflt}");
    let delta = faults - before;
    assert!(
        delta >= minflt && delta <= minflt + TOLERANCE,
        "{delta} faults counted, getrusage {minflt}\n{text}"
    );
    assert!(text.contains("faultscope_build_info{"), "{text}");
    // The kinds partition the faults: their sum is the faults class.
    let kinds: u64 = text
        .lines()
        .filter(|l| l.starts_with("faultscope_faults_total{kind="))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(kinds, faults, "{text}");
    stdin.write_all(b"bye\n").unwrap();
    wl.wait().unwrap();
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    let out = serve.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_nothing_left();
}

/// Waits until `serve` answers on `port` (loading and attaching take a while).
fn wait_serving(port: u16) {
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        sleep(Duration::from_millis(100));
    }
    panic!("serve never listened on {port}");
}

/// The sum of the `faults` counters whose labels include `label`.
fn faults_with(text: &str, label: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("faultscope_class_faults_total{class=\"faults\"") && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `serve` with `args`, ended by SIGTERM when dropped.
struct Served(Option<std::process::Child>);
impl Served {
    fn start(args: &[&str]) -> Served {
        let c = Command::new(BIN).arg("serve").args(args).stderr(Stdio::piped()).spawn().unwrap();
        Served(Some(c))
    }
    /// SIGTERM, and its stderr; it must end cleanly.
    fn stop(mut self) -> String {
        let c = self.0.take().unwrap();
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        err
    }
}
impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

/// A Python that waits for a line, touches 2048 new pages, prints its
/// minflt for that, and exits at the next line; run as `exe` (its comm).
fn paced_python(
    exe: &Path,
) -> (std::process::Child, std::process::ChildStdin, std::io::BufReader<std::process::ChildStdout>) {
    let script = "import sys,resource\nsys.stdin.readline()\nr0=resource.getrusage(0).ru_minflt\n\
b=bytearray(2048*4096)\nfor j in range(0,len(b),4096): b[j]=1\n\
print(resource.getrusage(0).ru_minflt-r0,flush=True)\nsys.stdin.readline()\n";
    let mut c =
        Command::new(exe).args(["-c", script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let stdin = c.stdin.take().unwrap();
    let stdout = std::io::BufReader::new(c.stdout.take().unwrap());
    (c, stdin, stdout)
}

#[test]
fn serve_comm_picks_up_an_exec_and_follows_a_restart() {
    use std::io::{BufRead, Write};
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = 9872;
    let dir = tmp();
    // A comm of its own: exec through a link of that name.
    let exe = dir.path().join("fs-commtest");
    std::os::unix::fs::symlink(std::fs::canonicalize("/usr/bin/python3").unwrap(), &exe).unwrap();
    let served = Served::start(&["--comm", "fs-commtest", "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    let mut total = 0;
    let mut pids = Vec::new();
    // The first run, then the "restarted" one under a new pid: the counter
    // goes on from the first's count.
    for _ in 0..2 {
        let (mut c, mut stdin, mut stdout) = paced_python(&exe);
        pids.push(c.id());
        // Found by the /proc scan within a tick.
        sleep(Duration::from_millis(1000));
        let before = faults_with(&scrape(port), "comm=\"fs-commtest\"");
        stdin.write_all(b"go\n").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let minflt: u64 = line.trim().parse().unwrap();
        assert!(minflt >= 2048, "{minflt}");
        sleep(Duration::from_millis(800));
        let text = scrape(port);
        let now = faults_with(&text, "comm=\"fs-commtest\"");
        let delta = now - before;
        assert!(
            delta >= minflt && delta <= minflt + TOLERANCE,
            "pid {}: {delta} counted, getrusage {minflt}\n{text}",
            c.id()
        );
        assert!(now >= total + delta, "the counter went back: {total} then {now}");
        total = now;
        stdin.write_all(b"bye\n").unwrap();
        c.wait().unwrap();
        sleep(Duration::from_millis(400));
    }
    let err = served.stop();
    for pid in pids {
        assert!(err.contains(&format!("tracing pid {pid} (fs-commtest)")), "{pid}: {err}");
    }
    assert_nothing_left();
}

#[test]
fn serve_phase_kinds_are_each_processes_own() {
    use std::io::{BufRead, Write};
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = 9874;
    let dir = tmp();
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let link = |name: &str| {
        let exe = dir.path().join(name);
        std::os::unix::fs::symlink(&python, &exe).unwrap();
        exe
    };
    let (forker, writer) = (link("fs-kindfork"), link("fs-kindwrite"));
    let port_s = port.to_string();
    let served = Served::start(&[
        "--comm",
        "fs-kindfork",
        "--comm",
        "fs-kindwrite",
        "--port",
        &port_s,
        "--tick",
        "0.2",
    ]);
    wait_serving(port);
    // At a line, forks a child that lives until the next one.
    let script = "import os,sys\nsys.stdin.readline()\nr,w=os.pipe()\npid=os.fork()\n\
if pid==0:\n    os.close(w)\n    os.read(r,1)\n    os._exit(0)\n\
os.close(r)\nprint(pid,flush=True)\nsys.stdin.readline()\nos.close(w)\nos.waitpid(pid,0)\n";
    let mut f = Command::new(&forker)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut f_in = f.stdin.take().unwrap();
    let mut f_out = std::io::BufReader::new(f.stdout.take().unwrap());
    let (mut w, mut w_in, mut w_out) = paced_python(&writer);
    // Both found by the /proc scan.
    sleep(Duration::from_millis(1000));
    f_in.write_all(b"fork\n").unwrap();
    let mut line = String::new();
    f_out.read_line(&mut line).unwrap();
    sleep(Duration::from_millis(600));
    // The forker's child is alive; the writer has forked nothing: its
    // faults are its own before-fork ones, not the forker's child-alive.
    let mine = "phase_kind=\"before-fork\",comm=\"fs-kindwrite\"";
    let before = faults_with(&scrape(port), mine);
    w_in.write_all(b"go\n").unwrap();
    let mut line = String::new();
    w_out.read_line(&mut line).unwrap();
    let minflt: u64 = line.trim().parse().unwrap();
    sleep(Duration::from_millis(800));
    let text = scrape(port);
    let delta = faults_with(&text, mine) - before;
    assert!(
        delta >= minflt && delta <= minflt + TOLERANCE,
        "{delta} counted before-fork, getrusage {minflt}\n{text}"
    );
    assert_eq!(faults_with(&text, "phase_kind=\"child-alive\",comm=\"fs-kindwrite\""), 0, "{text}");
    assert!(faults_with(&text, "phase_kind=\"child-alive\",comm=\"fs-kindfork\"") > 0, "{text}");
    for stdin in [&mut f_in, &mut w_in] {
        stdin.write_all(b"bye\n").unwrap();
    }
    f.wait().unwrap();
    w.wait().unwrap();
    served.stop();
    assert_nothing_left();
}

/// The cgroup v2 mount (`/sys/fs/cgroup` itself, or `unified` in the hybrid
/// layout).
fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let m = mounts.lines().find(|l| l.split(' ').nth(2) == Some("cgroup2")).expect("no cgroup2 mount");
    PathBuf::from(m.split(' ').nth(1).unwrap())
}

#[test]
fn serve_cgroup_counts_a_short_process_inside_it_and_none_outside() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = 9873;
    let cg = cgroup2_root().join(format!("faultscope-test-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    struct Rmdir(PathBuf);
    impl Drop for Rmdir {
        fn drop(&mut self) {
            // Empty once its processes are reaped.
            for _ in 0..50 {
                if std::fs::remove_dir(&self.0).is_ok() {
                    return;
                }
                sleep(Duration::from_millis(100));
            }
        }
    }
    let _rm = Rmdir(cg.clone());
    let served =
        Served::start(&["--cgroup", cg.to_str().unwrap(), "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    sleep(Duration::from_millis(500));
    // Outside: 16384 pages, at the same time.
    let outside = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import time\nb=bytearray(16384*4096)\nfor j in range(0,len(b),4096): b[j]=1\ntime.sleep(1)\n",
        ])
        .spawn()
        .unwrap();
    // Inside: joins the cgroup, execs, touches 2048 pages and exits at once
    // (within a tick: only the kernel's filter can see it), printing its
    // whole minflt and that of the touching.
    let script = "import resource\nr0=resource.getrusage(0).ru_minflt\nb=bytearray(2048*4096)\n\
for j in range(0,len(b),4096): b[j]=1\nr1=resource.getrusage(0).ru_minflt\nprint(r1-r0, r1)\n";
    let inside = Command::new("sh")
        .args([
            "-c",
            &format!("echo $$ > {}/cgroup.procs && exec /usr/bin/python3 -c '{script}'", cg.display()),
        ])
        .output()
        .unwrap();
    assert!(inside.status.success(), "{}", String::from_utf8_lossy(&inside.stderr));
    let out = String::from_utf8_lossy(&inside.stdout).to_string();
    let v: Vec<u64> = out.split_whitespace().map(|w| w.parse().unwrap()).collect();
    let (touch, whole) = (v[0], v[1]);
    let mut outside = outside;
    assert!(outside.wait().unwrap().success());
    sleep(Duration::from_millis(800));
    let text = scrape(port);
    let counted = faults_with(&text, "");
    assert!(touch >= 2048, "{out}");
    // From its first event in the cgroup to its exit: at least the touching,
    // at most its whole life; the other's 16384 pages are not there.
    assert!(counted >= touch && counted <= whole + TOLERANCE, "{counted} counted; inside: {out}\n{text}");
    assert!(text.contains("comm=\"python3\""), "{text}");
    served.stop();
    assert_nothing_left();
}

/// The kernel check of `p`: the kernel's own count over the run, exact
/// (read by the kernel at the exec and at each thread's exit), and what
/// faultscope's count leaves to it.
fn kernel_check(p: &Process) -> (u64, i64) {
    use faultscope::report::schema::CheckResult;
    let k = p.kernel_check.as_ref().expect("the report has a kernel check");
    let (lo, hi) = (k.kernel_low.unwrap(), k.kernel_high.unwrap());
    assert_eq!(lo, hi, "exec to exit is read by the kernel: an exact bracket ({k:?})");
    match k.result {
        // Tracepoint mode: what no exception shows (get_user_pages).
        CheckResult::Derived => {
            let (g0, g1) = k.gup_derived.unwrap();
            assert_eq!(g0, g1, "{k:?}");
            (lo, g0)
        }
        CheckResult::Equal => (lo, 0),
        other => panic!("kernel check {other:?}: {k:?}"),
    }
}

/// A reader's faults are the kernel's, in read(2) (copy_to_user into its
/// buffer): counted with their origin, and the kernel's own count of the
/// process over the run is faultscope's (tracepoint mode: up to the
/// get_user_pages faults it derives, none here).
#[test]
fn a_readers_faults_are_the_kernels_and_match_its_own_count() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (file, fs) = (d.path().join("big.bin"), d.path().join("fs.json"));
    std::fs::write(&file, vec![0x5au8; 16 << 20]).unwrap();
    let out = faultscope(&[
        "record",
        "--json",
        fs.to_str().unwrap(),
        "--",
        "dd",
        &format!("if={}", file.display()),
        "of=/dev/null",
        "bs=16M",
        "count=1",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    let p = &r.processes[0];
    let faults = p.classes.get(&Metric::Faults).unwrap();
    let kernel = faults.origin_count("kernel").expect("kernel-mode faults are measured");
    // dd's 16M buffer is first written by read(2): 4096 pages.
    assert!(kernel >= 4096, "kernel-origin faults {kernel}: {faults:?}");
    assert!(faults.origin_count("user").unwrap() < 4096, "{faults:?}");
    let (total, gup) = kernel_check(p);
    assert_eq!(total, faults.count().unwrap() + gup.max(0) as u64 - (-gup).max(0) as u64);
    // dd makes no get_user_pages call after its exec.
    assert!(gup.abs() <= 4, "derived GUP faults {gup}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kernel check: "), "{text}");
    assert_nothing_left();
}

/// A process whose main thread exits early and whose other thread runs on
/// (`workload --leader-exit`): the kernel sums each thread's final count at
/// its exit, and the total equals faultscope's and, within the faults of
/// its last steps, the workload's own getrusage.
#[test]
fn threads_that_exit_during_the_run_are_in_the_kernel_check() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let out = faultscope(&[
        "record",
        "--json",
        fs.to_str().unwrap(),
        "--",
        BIN,
        "workload",
        "--size",
        "16M",
        "--thp",
        "never",
        "--leader-exit",
        "0.2",
        "--out",
        wl.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (r, wl) = (read_report(&fs), read_json(&wl));
    let p = process(&r, wl["pid"].as_u64().unwrap());
    let (total, gup) = kernel_check(p);
    assert!(gup.abs() <= 4, "derived GUP faults {gup}");
    assert_eq!(total as i64, count(p, Metric::Faults) as i64 + gup);
    // getrusage(RUSAGE_SELF) sums the live and exited threads. The run's
    // window starts at the exec: it holds the faults from the workload's
    // start on, and no more than its whole count (the forked child's
    // faults before the exec included) and those of its last steps.
    let all = wl["minflt_total"].as_u64().unwrap() + wl["majflt_total"].as_u64().unwrap();
    let since_main = wl["minflt_since_main"].as_u64().unwrap();
    let pages = wl["pages"].as_u64().unwrap();
    assert!(
        since_main >= 2 * pages && since_main <= total && total <= all + TOLERANCE,
        "getrusage {since_main} since main, {all} in all; kernel {total}"
    );
    assert_nothing_left();
}

/// Output paths (hardening): `-` is stdout, a character device or a FIFO
/// is written in place and stays what it was, a block device is refused
/// before the run.
#[test]
fn reports_go_to_stdout_devices_and_fifos_in_place() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = faultscope(&["record", "--json", "-", "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("stdout is the JSON report alone");
    assert_eq!(r["schema"], "faultscope/1");
    assert!(String::from_utf8_lossy(&out.stderr).contains("whole run"), "the tables go to stderr");
    let out = faultscope(&["record", "--json", "/dev/null", "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    use std::os::unix::fs::FileTypeExt as _;
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    let d = tmp();
    let fifo = d.path().join("report.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(&fifo).unwrap())
    };
    let out = faultscope(&["record", "--json", fifo.to_str().unwrap(), "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = reader.join().unwrap();
    assert!(text.contains("\"schema\": \"faultscope/1\""), "{text}");
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    // A block device: refused before anything is attached, nothing written.
    if let Some(dev) = ["/dev/loop0", "/dev/vda", "/dev/sda"].iter().find(|p| Path::new(p).exists()) {
        let out = faultscope(&["record", "--json", dev, "--", "true"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("block device"));
    }
    // The same file twice: refused.
    let p = d.path().join("r.json");
    let out =
        faultscope(&["record", "--json", p.to_str().unwrap(), "--folded", p.to_str().unwrap(), "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("same file"));
    assert_nothing_left();
}

/// The command's status is record's (as `time` and `perf stat` give it),
/// and a run that ends first (--duration) ends the command too.
#[test]
fn record_exits_with_the_commands_status_and_ends_it_with_the_run() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert_eq!(faultscope(&["record", "--", "false"]).status.code(), Some(1));
    assert_eq!(faultscope(&["record", "--", "sh", "-c", "exit 7"]).status.code(), Some(7));
    let d = tmp();
    let (fs, pidfile) = (d.path().join("fs.json"), d.path().join("pid"));
    let script = format!("echo $$ > {}; exec sleep 60", pidfile.display());
    let t = std::time::Instant::now();
    let out =
        faultscope(&["record", "--duration", "1", "--json", fs.to_str().unwrap(), "--", "sh", "-c", &script]);
    // SIGTERM: 128 + 15, as a shell gives.
    assert_eq!(out.status.code(), Some(143), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(t.elapsed() < Duration::from_secs(20));
    let pid: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the command was left running");
    let r = read_report(&fs);
    assert_eq!(r.command_exit_status, Some(143));
    // Its exit came before the last read: its kernel check is exact.
    let k = r.processes[0].kernel_check.as_ref().unwrap();
    assert_eq!(k.kernel_low, k.kernel_high, "{k:?}");
    assert_nothing_left();
}

/// Bounded kernel memory: an absurd stats map is refused with its size,
/// before anything is loaded; the report says what the maps take.
#[test]
fn an_absurd_stats_map_is_refused_and_the_footprint_reported() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for cmd in
        [&["record", "--max-stats", "100000000", "--", "true"][..], &["bench", "--max-stats", "100000000"]]
    {
        let out = faultscope(cmd);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("--max-stats 100000000") && e.contains("GiB") && e.lines().count() == 1, "{e}");
    }
    let d = tmp();
    let fs = d.path().join("fs.json");
    assert!(faultscope(&["record", "--json", fs.to_str().unwrap(), "--", "true"]).status.success());
    let m = read_report(&fs).kernel_memory.expect("kernel_memory");
    assert_eq!(m.maps["STATS"].entries, 2048);
    assert_eq!(m.bytes, m.maps.values().map(|x| x.bytes).sum::<u64>());
    assert!(m.cpus >= 1);
    assert_nothing_left();
}

/// Attribution that cannot be done here (tracepoint mode) is said, and no
/// empty folded file stands for it.
#[test]
fn stacks_that_cannot_be_counted_are_said_not_written_empty() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let d = tmp();
    let (fs, folded) = (d.path().join("fs.json"), d.path().join("s.folded"));
    let out = faultscope(&["record", "--json", fs.to_str().unwrap(), "--stacks", "faults", "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    if r.mode == Mode::Tracepoint {
        let a = r.attribution.unwrap();
        assert!(a.stack_classes.is_empty(), "{a:?}");
        assert!(a.stacks_reason.unwrap().contains("faults"));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--stacks: not attributed: faults"));
        let out =
            faultscope(&["record", "--stacks", "faults", "--folded", folded.to_str().unwrap(), "--", "true"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(!folded.exists());
    }
    assert_nothing_left();
}

/// One HTTP request to serve, the whole reply.
fn http(port: u16, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    // A reset (a connection past the cap) reads as an empty reply.
    let _ = s.read_to_string(&mut out);
    out
}

/// serve under a hostile host: the port it got is said (`--port 0`), HEAD
/// and `/` are answered, idle connections past the cap cannot keep a
/// scrape out, a hostile tick is refused, and SIGHUP ends it cleanly.
#[test]
fn serve_says_its_port_answers_head_caps_idle_clients_and_ends_on_sighup() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = faultscope(&["serve", "-p", "1", "--tick", "1e-10"]);
    assert_eq!(out.status.code(), Some(2));
    let mut target = Command::new("sleep").arg("60").spawn().unwrap();
    let mut serve = Command::new(BIN)
        .args(["serve", "-p", &target.id().to_string(), "--port", "0", "--tick", "0.2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ends serve when an assertion fails first.
    struct Term(u32);
    impl Drop for Term {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0 as i32, libc::SIGTERM) };
        }
    }
    let _term = Term(serve.id());
    use std::io::BufRead as _;
    let mut lines = std::io::BufReader::new(serve.stderr.take().unwrap()).lines();
    let port: u16 = loop {
        let l = lines.next().expect("serve said where it serves").unwrap();
        if let Some(rest) = l.strip_prefix("faultscope: serving OpenMetrics on http://127.0.0.1:") {
            break rest.trim_end_matches("/metrics").parse().unwrap();
        }
    };
    assert_ne!(port, 0);
    // Idle clients, more than the cap: past it they are closed at once, so
    // serve's descriptors stay bounded, and once the idle ones time out
    // (5 s) a scrape gets in.
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", serve.id())).unwrap().count();
    let before = fds();
    let idle: Vec<_> =
        (0..200).filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    sleep(Duration::from_millis(500));
    let held = fds() - before;
    assert!(held <= 64 + 4, "serve holds {held} more descriptors with 200 idle clients (cap 64)");
    let answered = (0..40).any(|_| {
        let ok = http(port, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 200");
        if !ok {
            sleep(Duration::from_millis(500));
        }
        ok
    });
    assert!(answered, "no scrape answered within 20 s of 200 idle clients");
    let head = http(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"), "{head}");
    assert!(http(port, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n").contains("href=\"/metrics\""));
    let scrape = http(port, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(scrape.contains("faultscope_build_info"), "{scrape}");
    // Keep-alive: a bare-LF request, then a gzip'd scrape on the same
    // connection; a POST is refused.
    {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(b"GET / HTTP/1.1\nHost: x\n\n").unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = |b: &[u8]| b.windows(4).position(|w| w == b"\r\n\r\n");
        while head_end(&buf).is_none() {
            let n = c.read(&mut chunk).unwrap();
            assert!(n > 0, "closed after the first reply: {}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
        }
        let h = head_end(&buf).unwrap();
        let head = String::from_utf8_lossy(&buf[..h]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap();
        while buf.len() < h + 4 + len {
            let n = c.read(&mut chunk).unwrap();
            buf.extend_from_slice(&chunk[..n]);
        }
        c.write_all(b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n").unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        let h = head_end(&rest).expect("a second reply on the same connection");
        let head = String::from_utf8_lossy(&rest[..h]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200") && head.contains("content-encoding: gzip"), "{head}");
        let mut text = String::new();
        flate2::read::GzDecoder::new(&rest[h + 4..]).read_to_string(&mut text).unwrap();
        assert!(text.contains("faultscope_build_info"), "{text}");
        let post = http(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    }
    drop(idle);
    unsafe { libc::kill(serve.id() as i32, libc::SIGHUP) };
    let st = serve.wait().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    assert!(st.success(), "{st:?}");
    assert_nothing_left();
}

/// A Python run as `exe` (its comm) that touches 2048 new pages and exits at
/// once; its output: the minflt of the touching, then of its whole life.
fn short_python(exe: &Path) -> (u64, u64) {
    let script = "import resource\nr0=resource.getrusage(0).ru_minflt\nb=bytearray(2048*4096)\n\
for j in range(0,len(b),4096): b[j]=1\nr1=resource.getrusage(0).ru_minflt\nprint(r1-r0, r1)\n";
    let out = Command::new(exe).args(["-c", script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Vec<u64> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(|w| w.parse().unwrap()).collect();
    assert!(v[0] >= 2048, "{v:?}");
    (v[0], v[1])
}

/// `serve --comm`: a program that lives far less than a tick is counted
/// from its exec (the kernel adopts it there), bounded by the page
/// arithmetic and its own getrusage; a comm the kernel could never hold is
/// refused.
#[test]
fn serve_comm_counts_a_process_shorter_than_a_tick_from_its_exec() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = faultscope(&["serve", "--comm", "0123456789abcdef"]);
    assert_refused(&out, "--comm");
    let port = 9876;
    let dir = tmp();
    let exe = dir.path().join("fs-shortlived");
    std::os::unix::fs::symlink(std::fs::canonicalize("/usr/bin/python3").unwrap(), &exe).unwrap();
    // A tick of 5 s: the /proc scan could not see it.
    let served = Served::start(&["--comm", "fs-shortlived", "--port", &port.to_string(), "--tick", "5"]);
    wait_serving(port);
    let mut runs = Vec::new();
    for _ in 0..2 {
        runs.push(short_python(&exe));
    }
    // Counted at the next tick.
    sleep(Duration::from_millis(6000));
    let text = scrape(port);
    let counted = faults_with(&text, "comm=\"fs-shortlived\"");
    let touched: u64 = runs.iter().map(|r| r.0).sum();
    let whole: u64 = runs.iter().map(|r| r.1).sum();
    assert!(
        counted >= touched && counted <= whole + TOLERANCE,
        "{counted} counted; runs (touch, whole) {runs:?}\n{text}"
    );
    let err = served.stop();
    assert!(err.matches("(fs-shortlived)").count() >= 2, "{err}");
    assert_nothing_left();
}

/// `serve --cgroup`: a cgroup removed and created again (a service
/// restart) is a new id; serve says so and counts the processes of the new
/// one.
#[test]
fn serve_follows_a_cgroup_created_again() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = 9877;
    let cg = cgroup2_root().join(format!("faultscope-recreate-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    struct Rmdir(PathBuf);
    impl Drop for Rmdir {
        fn drop(&mut self) {
            for _ in 0..50 {
                if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                    return;
                }
                sleep(Duration::from_millis(100));
            }
        }
    }
    let _rm = Rmdir(cg.clone());
    let served =
        Served::start(&["--cgroup", cg.to_str().unwrap(), "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    std::fs::remove_dir(&cg).unwrap();
    sleep(Duration::from_millis(600));
    std::fs::create_dir(&cg).unwrap();
    sleep(Duration::from_millis(600));
    let script = "import resource\nr0=resource.getrusage(0).ru_minflt\nb=bytearray(2048*4096)\n\
for j in range(0,len(b),4096): b[j]=1\nr1=resource.getrusage(0).ru_minflt\nprint(r1-r0, r1)\n";
    let inside = Command::new("sh")
        .args([
            "-c",
            &format!("echo $$ > {}/cgroup.procs && exec /usr/bin/python3 -c '{script}'", cg.display()),
        ])
        .output()
        .unwrap();
    assert!(inside.status.success(), "{}", String::from_utf8_lossy(&inside.stderr));
    let out = String::from_utf8_lossy(&inside.stdout).to_string();
    let v: Vec<u64> = out.split_whitespace().map(|w| w.parse().unwrap()).collect();
    sleep(Duration::from_millis(800));
    let text = scrape(port);
    let counted = faults_with(&text, "");
    assert!(counted >= v[0] && counted <= v[1] + TOLERANCE, "{counted} counted; inside: {out}\n{text}");
    let err = served.stop();
    assert!(err.contains("is gone") && err.contains("is back (id "), "{err}");
    assert_nothing_left();
}

/// serve out of descriptors: its RLIMIT_NOFILE lowered (on the running
/// serve) to what it holds plus a few, idle clients take the rest. It keeps
/// counting its target (the target's own getrusage minflt, touched while no
/// descriptor is left), never takes it for exited, counts the refused
/// connections, and answers again once the clients are gone.
#[test]
fn serve_out_of_descriptors_keeps_counting() {
    use std::io::{BufRead, Write};
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = 9878;
    let (mut wl, mut stdin, mut stdout) = paced_python(Path::new("/usr/bin/python3"));
    let served = Served::start(&["-p", &wl.id().to_string(), "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    sleep(Duration::from_millis(500));
    let before = faults_with(&scrape(port), "");
    let spid = served.0.as_ref().unwrap().id();
    let fds = || std::fs::read_dir(format!("/proc/{spid}/fd")).unwrap().count() as u64;
    let limit = fds() + 4;
    let lim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
    assert_eq!(unsafe { libc::prlimit(spid as i32, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) }, 0);
    let idle: Vec<_> =
        (0..40).filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    sleep(Duration::from_millis(500));
    assert!(fds() >= limit - 1, "serve holds {} of {limit} descriptors", fds());
    stdin.write_all(b"go\n").unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let minflt: u64 = line.trim().parse().unwrap();
    // Ticks with no descriptor left.
    sleep(Duration::from_millis(1000));
    drop(idle);
    let text = (0..20)
        .find_map(|_| {
            sleep(Duration::from_millis(500));
            let r = http(port, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
            r.starts_with("HTTP/1.1 200").then(|| r.split_once("\r\n\r\n").unwrap().1.to_string())
        })
        .expect("serve answers once the idle clients are gone");
    let delta = faults_with(&text, "") - before;
    assert!(
        minflt >= 2048 && delta >= minflt && delta <= minflt + TOLERANCE,
        "{delta} counted, getrusage {minflt}\n{text}"
    );
    assert!(sample(&text, "faultscope_drops_total{reason=\"accept_errors\"}") > 0, "{text}");
    stdin.write_all(b"bye\n").unwrap();
    wl.wait().unwrap();
    let err = served.stop();
    assert_eq!(err.matches("cannot accept a connection").count(), 1, "{err}");
    assert_nothing_left();
}
