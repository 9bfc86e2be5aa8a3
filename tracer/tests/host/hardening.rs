//! Bad input and hostile paths: one line and exit 2, nothing written
//! through a planted link, devices and FIFOs written in place, absurd sizes
//! refused, control characters escaped.

use super::*;

#[test]
fn bad_input_is_refused_with_one_line() {
    let _t = host_test();
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
}

#[test]
fn a_thread_id_is_not_a_process() {
    let _t = host_test();
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

#[test]
fn record_json_never_writes_through_planted_symlinks() {
    let _t = host_test();
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
}

#[test]
fn bad_seconds_and_counts_are_refused_before_attaching() {
    let _t = host_test();
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
    let _t = host_test();
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
}

/// Output paths (hardening): `-` is stdout, a character device or a FIFO
/// is written in place and stays what it was, a block device is refused
/// before the run.
#[test]
fn reports_go_to_stdout_devices_and_fifos_in_place() {
    let _t = host_test();
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
}

/// Bounded kernel memory: an absurd stats map is refused with its size,
/// before anything is loaded; the report says what the maps take.
#[test]
fn an_absurd_stats_map_is_refused_and_the_footprint_reported() {
    let _t = host_test();
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
}
