//! Bad input and hostile paths: one line and exit 2, nothing written
//! through a planted link, devices and FIFOs written in place, absurd sizes
//! refused, control characters escaped.

use super::*;

#[test]
fn bad_input_is_refused_with_one_line() {
    let _t = host_test();
    assert_refused(&faultscope(&["record", "-p", "4194303"]), "no process with pid 4194303");
    assert_refused(&faultscope(&["record"]), "nothing to trace");
    for (args, what) in [
        (&["record", "-a", "-p", "1"][..], "-p"),
        (&["record", "-a", "--comm", "x"], "--comm or --cgroup"),
        (&["record", "-a", "--", "true"], "command"),
        (&["record", "-a", "--stacks", "copy"], "--stacks"),
        (&["serve", "-a", "-p", "1"], "-p"),
    ] {
        assert_refused(&faultscope(args), &format!("-a traces every process; it takes no {what}"));
    }
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
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", bin(), "record", "-p", "1"])
        .output()
        .expect("setpriv (util-linux)");
    assert_refused(&out, "needs root");
    // Root without the BPF capabilities (a container's dropped set): said,
    // rather than a map-creation error.
    let out = Command::new("setpriv")
        .args(["--inh-caps=-all", "--bounding-set=-bpf,-perfmon,-sys_admin", bin(), "record", "-p", "1"])
        .output()
        .expect("setpriv (util-linux)");
    assert_refused(&out, "without CAP_BPF and CAP_PERFMON");
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

/// Another user's link at an output's name, or as its directory, is
/// refused before the run: nothing is written through it, nothing is
/// replaced, and the command never starts.
#[test]
fn another_users_link_is_refused_before_the_run() {
    let _t = host_test();
    let user = TestUser::new();
    let d = tmp();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = d.path().join("home");
    std::fs::create_dir(&home).unwrap();
    user.own(&home);
    let victim = d.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    let report = home.join("r.json");
    user.plant(&victim, &report);
    let via = d.path().join("via");
    user.plant(&home, &via);
    let marker = d.path().join("ran");
    let planted = entries(&home);
    for (p, needle) in [(report.clone(), "owned by uid"), (via.join("new.json"), "its directory")] {
        let out =
            faultscope(&["record", "--json", p.to_str().unwrap(), "--", "touch", marker.to_str().unwrap()]);
        assert_refused(&out, needle);
        assert!(!marker.exists(), "the command ran");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert!(std::fs::symlink_metadata(&report).unwrap().file_type().is_symlink());
        assert_eq!(entries(&home), planted, "a file was left or replaced");
    }
}

/// A link of root's (`/dev/stdout` in a private `/dev`) or of this user's
/// (`latest.json -> runs/run1.json`) stays a link: a descriptor it names
/// is written in place, a file it names is replaced whole.
#[test]
fn outputs_through_our_links_keep_the_links() {
    let _t = host_test();
    let d = tmp();
    // /dev/stdout, /dev/stderr and /proc/self/fd/1 into a file a shell
    // opened, in a private mount namespace whose /dev is a tmpfs (the
    // host's links are never at stake).
    let script = format!(
        r#"set -e
mount -t tmpfs fs-dev /dev
mknod -m 666 /dev/null c 1 3
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
cd {dir}
{bin} record --json /dev/stdout -- true > out1 2> err1
{bin} record --json /proc/self/fd/1 -- true > out2 2> err2
{bin} record --json /dev/stderr -- true 2> out3 > tables3
test -L /dev/stdout && test -L /dev/stderr
"#,
        dir = d.path().display(),
        bin = bin()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // Standard error also has faultscope's own lines: the report is whole in it.
    let err = std::fs::read_to_string(d.path().join("out3")).unwrap();
    assert!(err.contains("\"schema\": \"faultscope/1\"") && err.contains("\"findings\""), "{err}");
    for f in ["out1", "out2"] {
        let text = std::fs::read_to_string(d.path().join(f)).unwrap();
        let r: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{f} is the JSON alone: {e}: {text}"));
        assert_eq!(r["schema"], "faultscope/1");
    }
    assert!(
        std::fs::read_to_string(d.path().join("err1")).unwrap().contains("whole run"),
        "tables on stderr"
    );
    // The user's own link to a report of an earlier run.
    std::fs::create_dir(d.path().join("runs")).unwrap();
    let run1 = d.path().join("runs/run1.json");
    std::fs::write(&run1, "old").unwrap();
    let latest = d.path().join("latest.json");
    std::os::unix::fs::symlink("runs/run1.json", &latest).unwrap();
    let out = faultscope(&["record", "--json", latest.to_str().unwrap(), "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::symlink_metadata(&latest).unwrap().file_type().is_symlink());
    assert_eq!(read_report(&run1).schema, "faultscope/1");
    assert_eq!(entries(&d.path().join("runs")), BTreeSet::from(["run1.json".to_string()]));
}

/// Every output that cannot be written is refused before the command
/// starts: a read-only mount, a name too long, and one file spelled two
/// ways.
#[test]
fn unwritable_outputs_are_refused_before_the_command_starts() {
    let _t = host_test();
    let d = tmp();
    let marker = d.path().join("ran");
    let m = marker.to_str().unwrap();
    let ro = d.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let script = format!(
        "mount -t tmpfs -o ro fs-ro {ro} && exec {bin} record --json {ro}/r.json -- touch {m}",
        ro = ro.display(),
        bin = bin()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_refused(&out, "Read-only file system");
    let long = d.path().join("x".repeat(256));
    assert_refused(&faultscope(&["record", "--json", long.to_str().unwrap(), "--", "touch", m]), "too long");
    std::fs::create_dir(d.path().join("of")).unwrap();
    let out = Command::new(bin())
        .current_dir(d.path())
        .args(["record", "--json", "./of/x.json", "--folded", "of/x.json", "--", "touch", m])
        .output()
        .unwrap();
    assert_refused(&out, "same file");
    assert!(!marker.exists(), "the command ran");
    // 255 bytes is a name the file system takes: written.
    let longest = d.path().join("y".repeat(255));
    let out = faultscope(&["record", "--json", longest.to_str().unwrap(), "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(read_report(&longest).schema, "faultscope/1");
}

/// In a sticky world-writable directory another user swaps a FIFO of theirs
/// and a link to a root-only file at the output's name
/// (`renameat2(RENAME_EXCHANGE)`, as fast as it can) while root writes
/// there: every run refuses, none hangs, and the root-only file is never
/// written.
#[test]
fn a_fifo_swapped_for_a_link_never_reaches_roots_file() {
    let _t = host_test();
    let user = TestUser::new();
    let d = tmp();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A report with intervals to draw, made once.
    let report = d.path().join("r.json");
    let out = faultscope(&[
        "record",
        "--interval",
        "0.1",
        "--json",
        report.to_str().unwrap(),
        "--",
        "sleep",
        "0.3",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let victim = d.path().join("victim");
    std::fs::write(&victim, "keep").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let shared = d.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let cstr = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let (name, spare, target) = (cstr(&shared.join("x.svg")), cstr(&shared.join("spare")), cstr(&victim));
    let (uid, gid) = (user.uid, user.gid);
    // SAFETY: the child makes only raw system calls, then exits.
    let swapper = unsafe { libc::fork() };
    assert!(swapper >= 0);
    if swapper == 0 {
        unsafe {
            if libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                libc::_exit(1);
            }
            libc::mkfifo(name.as_ptr(), 0o666);
            libc::symlink(target.as_ptr(), spare.as_ptr());
            loop {
                libc::syscall(
                    libc::SYS_renameat2,
                    libc::AT_FDCWD,
                    name.as_ptr(),
                    libc::AT_FDCWD,
                    spare.as_ptr(),
                    libc::RENAME_EXCHANGE,
                );
            }
        }
    }
    let svg = shared.join("x.svg");
    let mut refused = 0;
    for _ in 0..300 {
        let out = faultscope(&["plot", report.to_str().unwrap(), "-o", svg.to_str().unwrap()]);
        if out.status.code() == Some(2) {
            refused += 1;
        }
        assert_ne!(out.status.code(), Some(0), "written: {}", String::from_utf8_lossy(&out.stderr));
    }
    unsafe {
        libc::kill(swapper, libc::SIGKILL);
        libc::waitpid(swapper, std::ptr::null_mut(), 0);
    }
    assert_eq!(refused, 300, "every run refused with one line");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep", "root's file was written");
}

#[test]
fn bad_seconds_and_counts_are_refused_before_attaching() {
    let _t = host_test();
    for flag in ["--duration", "--interval"] {
        for v in ["-1", "0", "nan", "inf", "-inf", "1e19", "1e999", "1e-300", "1e-9"] {
            let out = faultscope(&["record", "-p", "1", flag, v]);
            assert_refused(&out, &format!("{flag} "));
            let out = faultscope(&["record", "-p", "1", &format!("{flag}={v}")]);
            assert_refused(&out, "give a number of seconds");
        }
    }
    assert_refused(&faultscope(&["record", "-p", "1", "--interval", "1", "--count", "0"]), "--count 0");
    assert_refused(&faultscope(&["record", "-p", "1", "--max-stats", "0"]), "--max-stats 0");
    for cmd in [&["record", "-p", "1"][..], &["bench"]] {
        let out = faultscope(&[cmd, &["--stacks", "copy", "--max-stacks", "0"]].concat());
        assert_refused(&out, "--max-stacks 0");
        let out = faultscope(&[cmd, &["--stacks", "copy", "--max-stacks", "4000000000"]].concat());
        assert_refused(&out, "at most 1052688 entries fit in 1.00 GiB");
    }
    // Writer threads: bounded by a stated maximum and by the pages.
    for n in ["0", "100000", "1025"] {
        assert_refused(&faultscope(&["bench", "threads", "--threads", n, "--size", "16M"]), "--threads");
    }
    assert_refused(
        &faultscope(&["bench", "threads", "--threads", "32", "--size", "64K"]),
        "no more than --size",
    );
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
        let cmd = format!("{} record -p {pid} --interval 0.3 --duration 1.5", bin());
        let out = Command::new("script").args(["-qec", &cmd, "/dev/null"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("phase: before-fork"), "{text:?}");
        assert!(!text.contains("\x1b]") && !text.contains('\x07') && !text.contains("\x1b[2J"), "{text:?}");
        assert_nothing_left();
    }
    let out = Command::new(bin())
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
