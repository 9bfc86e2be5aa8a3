//! Host tests: faultscope on the build machine's own kernel (tracepoint mode
//! where kprobes are missing, kprobe mode where present), checked against the
//! workload's page arithmetic, getrusage and the kernel's own counts; in the
//! guests the same binary adds the tracefs oracle. Needs root. One file per
//! concern; this one is the harness they share.
//!
//! How to add a test:
//! 1. Put it in the file of its concern (or a new `mod` below).
//! 2. Start it with `let _t = host_test();`: the tests attach to the one
//!    kernel, so they run one at a time, and when the test ends the harness
//!    checks that no faultscope BPF program is left loaded.
//! 3. Check against a count made another way (the workload's pages,
//!    getrusage, `/proc`), within `TOLERANCE` where the kernel's own
//!    choices enter, never an exact number that depends on timing.
//! 4. Use `faultscope(args)` for a run to completion (`fs_command` to
//!    spawn one), `Served` for a serve.
//! 5. To run it in the guests too (static, against the tracefs oracle,
//!    once per backend), name it in `xtask/src/foundation.rs`'s
//!    `HOST_TESTS` (`ARM64_HOST_TESTS` for the arm64 guest). Record
//!    through `record_workload` or `record_traced` so the oracle checks
//!    the run there, and go through `faultscope`/`fs_command` so the
//!    guest's backend applies.

use std::{
    path::Path,
    process::{Command, Output, Stdio},
    sync::Mutex,
    thread::sleep,
    time::Duration,
};

use faultscope::{
    kernel::classes::ReportClass,
    report::{
        file,
        schema::{Mode, Phase, Process, Report},
    },
};
use faultscope_common::Program;
use faultscope_expect::{Checklist, Workload, TOLERANCE};
use serde_json::Value;

/// The faultscope under test: `FAULTSCOPE_BIN` where the tests run away
/// from their build (a guest's initramfs) or against another build (an
/// older one, to see them fail there), else this build's.
fn bin() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        std::env::var("FAULTSCOPE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_faultscope").into())
    })
}

/// Names of faultscope's BPF programs, from the one catalogue.
fn programs() -> impl Iterator<Item = &'static str> {
    Program::ALL.iter().map(|p| p.name())
}

/// Host tests attach to the one kernel: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// `faultscope ARGS`, run to its end.
fn faultscope(args: &[&str]) -> Output {
    fs_command(args).output().expect("running faultscope")
}

/// `faultscope ARGS`, to run. A `record` or `bench` also gets the backend
/// and latency tier a guest run asks for (`FAULTSCOPE_BACKEND`,
/// `FAULTSCOPE_LATENCY`: the same tests once per backend there) unless the
/// test chose its own; on the host, neither.
fn fs_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(bin());
    let Some((first @ ("record" | "bench"), rest)) = args.split_first().map(|(f, r)| (*f, r)) else {
        cmd.args(args);
        return cmd;
    };
    cmd.arg(first);
    for (var, flag) in [("FAULTSCOPE_BACKEND", "--backend"), ("FAULTSCOPE_LATENCY", "--latency")] {
        // An empty value: the command's own default.
        if let (Ok(v), false) = (std::env::var(var), rest.contains(&flag)) {
            if v.is_empty() {
                continue;
            }
            cmd.args([flag, &v]);
        }
    }
    cmd.args(rest);
    cmd
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

fn count(p: &Process, m: ReportClass) -> u64 {
    p.count(m).unwrap_or_else(|| panic!("class {m} has no count: {:?}", p.classes.get(&m)))
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

/// What every test holds: the lock of this process's tests, the
/// machine-wide lock of every host test run (another checkout's tests, run
/// at the same time, share the kernel, the THP knobs and /run/faultscope),
/// and the check that nothing is left loaded at its end (skipped when the
/// test already failed).
struct HostTest {
    /// Dropped after the check below: the lock covers it.
    _machine: std::fs::File,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Drop for HostTest {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            assert_nothing_left();
        }
    }
}

/// The machine-wide lock file (flock, released when the test's file is
/// closed, also by a killed test).
const MACHINE_LOCK: &str = "/run/faultscope-host-tests.lock";

fn host_test() -> HostTest {
    use std::os::fd::AsRawFd;
    let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(MACHINE_LOCK)
        .unwrap_or_else(|e| panic!("{MACHINE_LOCK}: {e}"));
    // SAFETY: flock on a descriptor this function owns.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0, "flock {MACHINE_LOCK}");
    HostTest { _machine: f, _serial: serial }
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

/// The test workload (`fs-workload`, a crate of its own: not part of the
/// product), beside the faultscope binary of this build (`cargo xtask test`
/// builds it first; cargo holds the build lock while tests run, so they
/// cannot build it themselves).
fn workload() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let p = Path::new(bin()).with_file_name("fs-workload");
        assert!(p.exists(), "{} is missing: run `cargo build -p faultscope-workload` first", p.display());
        p.display().to_string()
    })
}

/// Whether the fault path is probed here (kprobes or fentry: reuse and
/// copy measured), as `probes` says in its first line.
fn fault_path_probed() -> bool {
    let out = faultscope(&["probes"]);
    let mode = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_string();
    mode.starts_with("mode: fentry mode") || mode.starts_with("mode: kprobe mode")
}

/// `faultscope record --json -- fs-workload --size SIZE`: the output,
/// the report and the workload's own report.
fn record_workload(d: &Path, size: &str) -> (Output, Report, Value) {
    record_workload_with(d, size, &[])
}

/// [`record_workload`] with more workload arguments.
fn record_workload_with(d: &Path, size: &str, more: &[&str]) -> (Output, Report, Value) {
    let (fs, wl) = (d.join("fs.json"), d.join("wl.json"));
    let mut args = vec!["record", "--json", fs.to_str().unwrap(), "--", workload()];
    args.extend(["--size", size, "--thp", "never", "--child", "exit"]);
    args.extend(more);
    args.extend(["--out", wl.to_str().unwrap()]);
    let (out, traced) = run_traced(&args, None);
    let (report, wl) = (read_report(&fs), read_json(&wl));
    assert_backend(&report);
    if let Some(t) = traced {
        assert_oracle_agrees(&t, &report, Workload(&wl).pid());
    }
    (out, report, wl)
}

/// `faultscope record RECORD -- fs-workload WORKLOAD --regions-out R
/// --out W` under the oracle where there is one (given the workload's
/// ranges): the report, the workload's report and what the oracle saw.
/// A run in which the kernel skipped some of faultscope's program runs
/// (`program_runs_skipped`: on a preemptible 7.x kernel, a BPF map call
/// preempted on a CPU blocks kprobe programs there; design.md) cannot be
/// exact, and is run again, at most twice; the last run is returned.
fn record_traced(
    d: &Path,
    record: &[&str],
    workload_args: &[&str],
) -> (Report, Value, Option<faultscope_expect::tracefs::Traced>) {
    for attempt in 1.. {
        let run = record_traced_once(d, record, workload_args);
        let skipped = faultscope_expect::oracle::skipped_runs(&run.0);
        if skipped == 0 || attempt == 3 {
            return run;
        }
        println!("run {attempt}: the kernel skipped {skipped} of faultscope's program runs: run again");
    }
    unreachable!()
}

fn record_traced_once(
    d: &Path,
    record: &[&str],
    workload_args: &[&str],
) -> (Report, Value, Option<faultscope_expect::tracefs::Traced>) {
    let (fs, wl, ranges) = (d.join("fs.json"), d.join("wl.json"), d.join("ranges"));
    let mut args = vec!["record", "--json", fs.to_str().unwrap()];
    args.extend(record);
    args.extend(["--", workload()]);
    args.extend(workload_args);
    args.extend(["--regions-out", ranges.to_str().unwrap(), "--out", wl.to_str().unwrap()]);
    let (_, traced) = run_traced(&args, Some(&ranges));
    let report = read_report(&fs);
    assert_backend(&report);
    (report, read_json(&wl), traced)
}

/// `faultscope ARGS` to a successful end, under the oracle where there is
/// one, given the address ranges the workload wrote to `ranges`.
fn run_traced(args: &[&str], ranges: Option<&Path>) -> (Output, Option<faultscope_expect::tracefs::Traced>) {
    let tracing = faultscope_expect::tracefs::start();
    let out = faultscope(args);
    let ranges: Vec<String> = ranges
        .and_then(|r| std::fs::read_to_string(r).ok())
        .map_or_else(Vec::new, |t| t.lines().map(String::from).collect());
    let traced = tracing.map(|t| t.finish(&ranges));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (out, traced)
}

/// Where a guest run asks for a backend (`FAULTSCOPE_BACKEND`), the fault
/// path's return was attached by it: the runs per backend differ.
fn assert_backend(report: &Report) {
    let Ok(backend) = std::env::var("FAULTSCOPE_BACKEND") else { return };
    let want = if backend == "fentry" { "fexit" } else { "kretprobe" };
    let ret = report.probes.iter().find(|s| s.program == "fault_return").and_then(|s| s.backend.as_deref());
    assert_eq!(ret, Some(want), "--backend {backend}: fault_return attached by {ret:?}");
}

/// Where the kernel has kprobes and the tests run with the oracle (a
/// guest): the process's every class and origin equal to the oracle's.
fn assert_oracle_agrees(t: &faultscope_expect::tracefs::Traced, report: &Report, pid: u32) {
    let (mut table, mut fails) = (String::new(), Vec::new());
    t.check(&mut Checklist::new("oracle", &mut table, &mut fails), report, pid);
    // Printed for the guest's log (libtest shows it with --show-output).
    println!("pid {pid} against the oracle:\n{table}");
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}

fn assert_refused(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr:?}");
}

/// A phase of a process by name prefix.
fn phase<'a>(p: &'a Process, prefix: &str) -> &'a Phase {
    p.phases
        .iter()
        .find(|ph| ph.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no phase {prefix}: {:#?}", p.phases))
}

fn bench(args: &[&str], json: &Path) -> Report {
    let mut a = vec!["bench"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let out = faultscope(&a);
    assert!(out.status.success(), "bench {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let report = read_report(json);
    assert_backend(&report);
    report
}

// ---- files, signals and CLI hardening ----

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

const THP_KNOBS: [&str; 3] = [
    "/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled",
    "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/enabled",
    "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs",
];

/// The children of a process (its main thread's: bench forks from it).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// `faultscope record -p PID ARGS --json JSON`, its output piped.
fn record_pid(pid: &str, json: &Path, args: &[&str]) -> std::process::Child {
    Command::new(bin())
        .args(["record", "-p", pid])
        .args(args)
        .arg("--json")
        .arg(json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
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
        // Tracepoint mode: a few exceptions more than the kernel's count
        // (an access that raised a signal completes no fault), as a
        // negative derived count; the tests bound it.
        CheckResult::Differs if (1..=4).contains(&k.difference) && lo == hi => (lo, -k.difference),
        other => panic!("kernel check {other:?}: {k:?}"),
    }
}

mod attribution;
mod bench;
mod command;
mod hardening;
mod kernel_check;
mod matrix;
mod readme;
mod record;
mod serve;
mod targets;
mod verify_diff;

/// The cgroup v2 mount (`/sys/fs/cgroup` itself, or `unified` in the hybrid
/// layout).
fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let m = mounts.lines().find(|l| l.split(' ').nth(2) == Some("cgroup2")).expect("no cgroup2 mount");
    PathBuf::from(m.split(' ').nth(1).unwrap())
}

/// A cgroup of this test run under the cgroup2 root, removed when the guard
/// drops.
fn test_cgroup(suffix: &str) -> (PathBuf, Rmdir) {
    let cg = cgroup2_root().join(format!("faultscope-test-{}{suffix}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    (cg.clone(), Rmdir(cg))
}

/// A directory removed when dropped (a cgroup: empty once its processes
/// are reaped, so tried for 5 s; one the test removed itself is done).
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
