//! Target selection: which processes `-p`, `--comm` and the /proc scan
//! take. Only a process that can still fault is taken (no zombie, no
//! kernel thread), a comm is matched byte for byte, and a comm that is no
//! UTF-8 is no obstacle.

use super::*;

/// A copy of /bin/sleep named `name` (its comm once exec'd) in `dir`.
fn sleep_named(dir: &Path, name: &std::ffi::OsStr) -> PathBuf {
    let p = dir.join(name);
    std::fs::copy("/bin/sleep", &p).unwrap();
    p
}

/// Children killed and reaped when the test ends, failed or not.
struct Kids(Vec<std::process::Child>);

impl Drop for Kids {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The state letter of `pid` (field 3 of /proc/PID/stat; read as bytes).
fn state(pid: u32) -> Option<u8> {
    let s = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = s.iter().rposition(|&b| b == b')')?;
    s.get(close + 2).copied()
}

/// Waits (up to 30 s) until `pid` is a zombie.
fn wait_zombie(pid: u32) {
    for _ in 0..600 {
        if state(pid) == Some(b'Z') {
            return;
        }
        sleep(Duration::from_millis(50));
    }
    panic!("pid {pid} did not become a zombie within 30 s (state {:?})", state(pid).map(char::from));
}

/// A kernel thread's pid (PF_KTHREAD in its flags): kthreadd (2) where
/// /proc shows it.
fn kernel_thread() -> Option<u32> {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let flags = |p: u32| -> Option<u64> {
        let s = std::fs::read(format!("/proc/{p}/stat")).ok()?;
        let close = s.iter().rposition(|&b| b == b')')?;
        std::str::from_utf8(&s[close + 1..]).ok()?.split_whitespace().nth(6)?.parse().ok()
    };
    std::iter::once(2)
        .chain(std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()))
        .find(|&p| flags(p).is_some_and(|f| f & PF_KTHREAD != 0))
}

/// `record ARGS --json JSON`, its stderr piped.
fn record_with(args: &[&str], json: &Path) -> std::process::Child {
    Command::new(bin())
        .arg("record")
        .args(args)
        .arg("--json")
        .arg(json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Defect 4: a `--comm` process that lingers as a zombie (its parent reaps
/// it late) is not adopted again by the /proc scan, and the process that
/// is given its pid after the reaping is not counted as it; `-p` refuses
/// the zombie.
#[test]
fn a_lingering_zombie_is_not_adopted_again_nor_its_pid_counted() {
    let _t = host_test();
    let d = tmp();
    let name = format!("fsz{}", std::process::id());
    let exe = sleep_named(d.path(), name.as_ref());
    let json = d.path().join("r.json");
    // Ended by SIGINT once done: the duration only bounds a run left behind.
    let rec = record_with(&["--comm", &name, "--duration", "300"], &json);
    wait_attached(&rec);
    // Adopted at its exec by the kernel's filter; not reaped until later.
    let mut zombie = Command::new(&exe).arg("0.5").spawn().unwrap();
    let pid = zombie.id();
    wait_zombie(pid);
    let out = faultscope(&["record", "-p", &pid.to_string(), "--duration", "1"]);
    assert_refused(&out, &format!("pid {pid} has exited (a zombie)"));
    // At least two scans (one a second) see the zombie.
    sleep(Duration::from_millis(3000));
    zombie.wait().unwrap();
    // Another program (not of the comm) takes the pid and faults 8192 pages.
    let script = "b=bytearray(8192*4096)\nfor j in range(0,len(b),4096): b[j]=1\n";
    let again = spawn_with_pid(pid, &["/usr/bin/python3", "-c", script]);
    let mut st = 0;
    unsafe { libc::waitpid(again as i32, &mut st, 0) };
    assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "python status {st:#x}");
    // The reused pid's faults reach the kernel's maps at its exit; a tick
    // (50 ms) and a scan to pass.
    sleep(Duration::from_millis(1500));
    unsafe { libc::kill(rec.id() as i32, libc::SIGINT) };
    let out = rec.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches(&format!("tracing pid {pid} (")).count(), 1, "adopted once:\n{stderr}");
    let report = read_report(&json);
    let p = process(&report, pid as u64);
    // sleep's own faults from its exec (its loader's): some dozens.
    assert!(
        count(p, ReportClass::Faults) < 2048,
        "the next process of pid {pid} was counted as the zombie: {p:#?}\n{stderr}"
    );
    assert_eq!(p.comm, name, "{p:#?}");
}

/// Defect 7: `--comm` is compared byte for byte (only /proc's newline
/// dropped): " x  " and "x\t" are not "x", and a comm with spaces at its
/// ends is matched as given.
#[test]
fn comm_is_matched_byte_for_byte() {
    let _t = host_test();
    let d = tmp();
    let n = std::process::id();
    let (x, y) = (format!("fsx{n}"), format!(" fsy{n} "));
    let names = [x.clone(), format!(" {x}  "), format!("{x}\t"), y.clone(), y.trim().to_string()];
    let mut kids = Kids(Vec::new());
    for name in &names {
        assert!(name.len() <= 15, "{name:?}");
        kids.0.push(Command::new(sleep_named(d.path(), name.as_ref())).arg("300").spawn().unwrap());
    }
    let pids: Vec<u32> = kids.0.iter().map(|c| c.id()).collect();
    // Each has exec'd (its comm is its name) before the run's first scan.
    for (pid, name) in pids.iter().zip(&names) {
        let want = format!("{name}\n");
        for _ in 0..600 {
            if std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| c == want.as_bytes()) {
                break;
            }
            sleep(Duration::from_millis(50));
        }
    }
    let json = d.path().join("r.json");
    let out =
        record_with(&["--comm", &x, "--comm", &y, "--duration", "2"], &json).wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report = read_report(&json);
    let traced: BTreeSet<u32> = report.processes.iter().map(|p| p.pid).collect();
    assert_eq!(traced, BTreeSet::from([pids[0], pids[3]]), "names {names:?}, pids {pids:?}\n{stderr}");
    // Said with the comm's spaces kept, and no tab raw.
    assert!(stderr.contains(&format!("tracing pid {} ({y})", pids[3])), "{stderr}");
    assert!(!stderr.contains('\t'), "{stderr}");
}

/// Defect 8: a process whose comm is no UTF-8 is traced by pid; its comm
/// is reported with the invalid byte replaced, never raw; its exit ends
/// the run.
#[test]
fn a_process_whose_comm_is_not_utf8_is_traced_by_pid() {
    use std::os::unix::ffi::OsStrExt as _;
    let _t = host_test();
    let d = tmp();
    let name = std::ffi::OsStr::from_bytes(b"fs\xffu\x1b[2J");
    let mut kids = Kids(vec![Command::new(sleep_named(d.path(), name)).arg("300").spawn().unwrap()]);
    let pid = kids.0[0].id();
    for _ in 0..600 {
        if std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| c == b"fs\xffu\x1b[2J\n") {
            break;
        }
        sleep(Duration::from_millis(50));
    }
    let json = d.path().join("r.json");
    let rec = record_with(&["-p", &pid.to_string(), "--duration", "300"], &json);
    wait_attached(&rec);
    kids.0[0].kill().unwrap();
    kids.0[0].wait().unwrap();
    let out = rec.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        !out.stderr.contains(&0xff) && !out.stderr.contains(&0x1b),
        "raw comm bytes on stderr: {stderr:?}"
    );
    let report = read_report(&json);
    assert_eq!(report.end.as_deref(), Some("all targets exited"), "{stderr}");
    assert_eq!(process(&report, pid as u64).comm, "fs\u{fffd}u\x1b[2J");
}

/// A kernel thread and a zombie are refused by `-p` (record and serve):
/// one line, exit 2, before anything is attached.
#[test]
fn a_kernel_thread_or_a_zombie_is_refused_by_pid() {
    let _t = host_test();
    match kernel_thread() {
        Some(k) => {
            let want = format!("pid {k} is a kernel thread: it has no user memory to fault");
            assert_refused(&faultscope(&["record", "-p", &k.to_string(), "--duration", "1"]), &want);
            assert_refused(&faultscope(&["serve", "-p", &k.to_string(), "--port", "0"]), &want);
        }
        None => eprintln!("no kernel thread in this /proc: that half not checked"),
    }
    let mut z = Command::new("/bin/true").spawn().unwrap();
    let pid = z.id();
    wait_zombie(pid);
    let want = format!("pid {pid} has exited (a zombie)");
    assert_refused(&faultscope(&["record", "-p", &pid.to_string(), "--duration", "1"]), &want);
    assert_refused(&faultscope(&["serve", "-p", &pid.to_string(), "--port", "0"]), &want);
    z.wait().unwrap();
}

/// `record -a` during a parallel "build" (four workloads at once, each
/// forking a child, beside a hundred short processes): each workload's
/// count is its own getrusage (minflt + majflt, read by itself at its end),
/// the table lists at most `--top` processes and sums the others, and the
/// sum of the listed and the others is every fault counted.
#[test]
fn every_process_is_counted_and_the_table_bounded() {
    let _t = host_test();
    let d = tmp();
    let json = d.path().join("r.json");
    // A top of 40: on a loaded machine other processes fault too, and the
    // workloads (8,192 faults each at least) must stay listed.
    let rec = record_with(&["-a", "--top", "40", "--duration", "300"], &json);
    wait_attached(&rec);
    let mut jobs: Vec<(std::process::Child, PathBuf)> = (0..4)
        .map(|i| {
            let out = d.path().join(format!("wl{i}.json"));
            let child = Command::new(workload())
                .args(["--size", "16M", "--thp", "never", "--child", "exit", "--out"])
                .arg(&out)
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            (child, out)
        })
        .collect();
    for _ in 0..100 {
        assert!(Command::new("/bin/true").status().unwrap().success());
    }
    let wl: Vec<(u32, Value)> = jobs
        .iter_mut()
        .map(|(c, out)| {
            assert!(c.wait().unwrap().success());
            (c.id(), read_json(out))
        })
        .collect();
    // The last exits reach the kernel's maps within a tick.
    sleep(Duration::from_millis(500));
    unsafe { libc::kill(rec.id() as i32, libc::SIGINT) };
    let out = rec.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report = read_report(&json);
    assert_eq!(report.drops.nonzero().count(), 0, "{:?}", report.drops);
    let sw = report.system_wide.as_ref().expect("a report over every process");
    assert!(report.processes.len() <= 40, "{} listed", report.processes.len());
    // The workloads, their children and the short processes faulted: more
    // than the top.
    assert!(sw.faulted >= 4 + 4 + 100, "{sw:?}");
    assert!(sw.other.processes >= 100 - 40, "{sw:?}");
    assert_eq!(sw.other.processes, sw.faulted - report.processes.len() as u64, "{sw:?}");
    for (pid, w) in &wl {
        let rusage = w["minflt_total"].as_u64().unwrap() + w["majflt_total"].as_u64().unwrap();
        // 16 MiB written twice: each workload is among the most faulting.
        let p = report.processes.iter().find(|p| p.pid == *pid).unwrap_or_else(|| {
            panic!("workload {pid} ({rusage} faults) not listed: {:#?}", report.processes)
        });
        let n = count(p, ReportClass::Faults);
        // After its getrusage it writes its report and exits.
        assert!(n >= rusage && n <= rusage + TOLERANCE, "pid {pid}: faultscope {n}, getrusage {rusage}");
        assert_eq!(p.comm, "fs-workload", "{p:#?}");
        // Born in the run: checked against the kernel's own count too.
        let k = p.kernel_check.as_ref().unwrap_or_else(|| panic!("pid {pid} not checked: {p:#?}"));
        assert_ne!(k.result, faultscope::report::schema::CheckResult::Differs, "{k:#?}");
    }
    // The short processes are past the top: summed in the others, each
    // with the faults of its exec at least.
    let others = sw.other.classes[&ReportClass::Faults].count().unwrap();
    assert!(others >= 60 * 10, "the short processes' faults are in the others: {others}");
}

/// `record` names the container, pod and QoS class of a process in a
/// cgroup laid out as the kubelet's cgroupfs driver makes them (the JSON's
/// `container`), and not to a process outside it (which may itself run in
/// the container this machine is).
#[test]
fn record_names_the_container_a_process_runs_in() {
    let _t = host_test();
    let d = tmp();
    let (root, _rm) = test_cgroup("-rec");
    let (uid, id) = ("0b6f8a2e-3c1d-4e5f-9a8b-7c6d5e4f3a77", format!("{:064x}", 0xc0ffee_u64));
    let mut guards = Vec::new();
    let mut cg = root.clone();
    for part in ["kubepods", "burstable", &format!("pod{uid}"), &id] {
        cg = cg.join(part);
        std::fs::create_dir(&cg).unwrap();
        guards.push(Rmdir(cg.clone()));
    }
    guards.reverse();
    let join = format!("echo $$ > '{}/cgroup.procs' && exec sleep 30", cg.display());
    let mut inside = Command::new("sh").args(["-c", &join]).spawn().unwrap();
    let mut outside = Command::new("sleep").arg("30").spawn().unwrap();
    // In its cgroup once the shell has exec'd sleep.
    for _ in 0..100 {
        if std::fs::read_to_string(format!("/proc/{}/comm", inside.id())).is_ok_and(|c| c.trim() == "sleep") {
            break;
        }
        sleep(Duration::from_millis(20));
    }
    let json = d.path().join("r.json");
    let (a, b) = (inside.id().to_string(), outside.id().to_string());
    let out = faultscope(&["record", "-p", &a, "-p", &b, "-d", "1", "--json", json.to_str().unwrap()]);
    inside.kill().unwrap();
    outside.kill().unwrap();
    let _ = (inside.wait(), outside.wait());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&json);
    let c = r.processes.iter().find(|p| p.pid == inside.id()).and_then(|p| p.container.clone());
    let c = c.expect("the process in the pod's cgroup has a container");
    assert_eq!(
        (c.container_id.as_str(), c.pod_uid.as_str(), c.qos.as_str()),
        (id.as_str(), uid, "burstable")
    );
    let o = r.processes.iter().find(|p| p.pid == outside.id()).expect("the other process");
    assert!(o.container.as_ref().is_none_or(|c| c.pod_uid.is_empty() && c.container_id != id), "{o:#?}");
}
