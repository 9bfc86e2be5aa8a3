//! The traced command and the end of a run: exit statuses, signals, a
//! closed stdout, marks, stale sockets.

use super::*;

#[test]
fn sigterm_and_sigint_end_the_run_cleanly() {
    let _t = host_test();
    for (sig, end) in [(libc::SIGTERM, "terminated"), (libc::SIGINT, "interrupted")] {
        let d = tmp();
        let fs = d.path().join("fs.json");
        let mut target = Command::new("sleep").arg("30").spawn().unwrap();
        let tracer = record_pid(&target.id().to_string(), &fs, &[]);
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
fn a_closed_stdout_ends_the_run_and_keeps_the_report() {
    let _t = host_test();
    let d = tmp();
    let fs = d.path().join("fs.json");
    // record --interval ... | head -1
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let mut tracer = record_pid(&target.id().to_string(), &fs, &["--interval", "0.2"]);
    let tpid = tracer.id();
    let mut first = String::new();
    BufReader::new(tracer.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("TIME "), "{first:?}");
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
    let mut bench = Command::new(bin())
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
}

#[test]
fn sigkill_keeps_the_old_report_and_sighup_ends_the_run() {
    let _t = host_test();
    let d = tmp();
    let fs = d.path().join("fs.json");
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let start = || record_pid(&target.id().to_string(), &fs, &[]);
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
}

#[test]
fn stale_sockets_are_removed() {
    let _t = host_test();
    let sock = |pid: u32| PathBuf::from(format!("/run/faultscope/record-{pid}.sock"));
    // A recorder killed by SIGKILL leaves its socket; the next command
    // removes it.
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let mut tracer = Command::new(bin())
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
}

#[test]
fn the_recorded_command_starts_with_default_signals() {
    let _t = host_test();
    let mut cmd = Command::new(bin());
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
}

#[test]
fn a_command_that_cannot_be_executed_is_said() {
    let _t = host_test();
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
}

#[test]
fn mark_serves_clients_without_stalling_and_needs_root() {
    let _t = host_test();
    let d = tmp();
    let fs = d.path().join("fs.json");
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let tracer = record_pid(&target.id().to_string(), &fs, &[]);
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
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            bin(),
            "mark",
            "--recorder",
            &recorder,
            "x",
        ])
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
}

/// The command's status is record's (as `time` and `perf stat` give it),
/// and a run that ends first (--duration) ends the command too.
#[test]
fn record_exits_with_the_commands_status_and_ends_it_with_the_run() {
    let _t = host_test();
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
}

/// `record --interval` into a pipe: one header, then bcc-style lines (time,
/// pid, comm, phase, counts), one per interval and process that faulted;
/// their FAULTS column adds up to the report's intervals, all but the last
/// (partial) one, which is in the JSON only.
#[test]
fn interval_lines_add_up_to_the_reports_intervals() {
    let _t = host_test();
    let d = tmp();
    let fs = d.path().join("fs.json");
    let out = faultscope(&[
        "record",
        "-i",
        "0.2",
        "-j",
        fs.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4; do head -c 8M /dev/zero > /dev/null; sleep 0.3; done",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header[..5], ["TIME", "PID", "COMM", "PHASE", "FAULTS"], "{text}");
    let r = read_report(&fs);
    let pid = r.processes[0].pid;
    let mut printed = 0u64;
    for l in lines.take_while(|l| !l.starts_with("PID ")) {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert!(w[0].len() == 8 && w[0].as_bytes()[2] == b':', "{l}");
        assert_eq!(w[1], pid.to_string(), "{l}");
        // The phase may hold spaces: FAULTS is the first count after it,
        // as many columns from the end as the header has after FAULTS.
        let faults = w[w.len() - (header.len() - 4)];
        printed += faults.replace(',', "").parse::<u64>().unwrap();
    }
    let iv = r.intervals.unwrap();
    let of = |i: &faultscope::report::schema::Interval| {
        i.processes.iter().filter(|p| p.pid == pid).map(|p| p.counts[&ReportClass::Faults]).sum::<u64>()
    };
    let want: u64 = iv[..iv.len() - 1].iter().map(of).sum();
    assert!(want > 0, "no faults in the intervals");
    assert_eq!(printed, want, "{text}");
}

/// The mark socket is made before anything is attached: with /run
/// read-only the run is refused, naming the path, and the command never
/// starts untraced.
#[test]
fn no_mark_socket_no_run() {
    let _t = host_test();
    let d = tmp();
    let marker = d.path().join("ran");
    let script =
        format!("mount -t tmpfs -o ro fs-run /run && exec {} record -- touch {}", bin(), marker.display());
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_refused(&out, "/run/faultscope");
    assert!(!marker.exists(), "the command ran untraced");
}

/// SIGUSR1 or SIGUSR2 without --mark-on-signal is ignored, and said once:
/// the run goes on and ends with its report.
#[test]
fn a_mark_signal_without_mark_on_signal_is_ignored() {
    let _t = host_test();
    let d = tmp();
    let json = d.path().join("r.json");
    let tracer = Command::new(bin())
        .args(["record", "--json", json.to_str().unwrap(), "--", "sleep", "2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_attached(&tracer);
    for s in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGUSR1] {
        unsafe { libc::kill(tracer.id() as i32, s) };
    }
    let out = tracer.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(err.matches("ignored: give --mark-on-signal").count(), 1, "said once: {err}");
    assert_eq!(read_report(&json).end.as_deref(), Some("all targets exited"));
}

/// `verify -- record ...` starts its run with no signal blocked, and passes
/// Ctrl-C on to it: the run ends with a report, which verify checks.
#[test]
fn verify_passes_an_interrupt_to_its_run() {
    let _t = host_test();
    let verify = Command::new(bin())
        .args(["verify", "--expect", "faults>0", "--", "record", "--", "sleep", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut run = None;
    for _ in 0..300 {
        if let Some(&c) = children(verify.id()).first() {
            if faultscope::cmd::mark::socket_path(c).exists() {
                run = Some(c);
                break;
            }
        }
        sleep(Duration::from_millis(50));
    }
    let run = run.expect("verify's record attached within 15 s");
    let status = std::fs::read_to_string(format!("/proc/{run}/status")).unwrap();
    let blocked = status.lines().find_map(|l| l.strip_prefix("SigBlk:")).unwrap().trim().to_string();
    assert_eq!(u64::from_str_radix(&blocked, 16).unwrap(), 0, "verify's run started with signals blocked");
    unsafe { libc::kill(verify.id() as i32, libc::SIGINT) };
    let out = verify.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("PASS faults>0"));
}

/// `--version` names the commit the binary was built from. Where the tests
/// run the static binary dist ships (`FAULTSCOPE_SHIPPED`: a guest's
/// initramfs), the machine has no C library at all, and the binary runs:
/// `probes` names first the fault path's mode (those kernels have kprobes
/// and fentry).
#[test]
fn version_names_the_commit_and_the_shipped_binary_needs_no_c_library() {
    let _t = host_test();
    let out = faultscope(&["--version"]);
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(version.contains("(commit "), "--version names no commit: {version:?}");
    if std::env::var_os("FAULTSCOPE_SHIPPED").is_none() {
        return;
    }
    let mut libc = Vec::new();
    c_libraries(Path::new("/"), root_device(), &mut libc);
    assert!(libc.is_empty(), "the shipped binary's machine holds C libraries: {libc:?}");
    let out = faultscope(&["probes"]);
    let mode = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_string();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let probed = ["mode: fentry mode", "mode: kprobe mode"].iter().any(|m| mode.starts_with(m));
    assert!(probed, "probes' first line is not the fault path's mode: {mode:?}");
    println!("shipped binary (static, no C library on this machine): {version}\n  probes: {mode}");
}

fn root_device() -> u64 {
    std::fs::metadata("/").unwrap().dev()
}

/// The files named `libc.so*` under `dir`, on the file system of `dev`
/// (`find -xdev`).
fn c_libraries(dir: &Path, dev: u64, found: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else { continue };
        if e.file_name().to_string_lossy().starts_with("libc.so") {
            found.push(e.path());
        }
        if m.is_dir() && m.dev() == dev {
            c_libraries(&e.path(), dev, found);
        }
    }
}
