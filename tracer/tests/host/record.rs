//! Counting and phases: record against page arithmetic, getrusage and the
//! kernel's own count; targets, their children, threads and exits.

use faultscope::report::schema::ClassValue;
use faultscope_expect::oracle::region_rows;

use super::*;

fn phase_count(p: &Phase, m: ReportClass) -> u64 {
    p.classes
        .get(&m)
        .and_then(|v| v.count())
        .unwrap_or_else(|| panic!("class {m} has no count in {}", p.name))
}

/// Asserts the fork / child-exit / write scenario's arithmetic on a report
/// of the workload's process.
/// `attached_late`: faultscope attached with -p while the workload slept, so
/// the faults of its start-up are not in the report.
fn check_fork_write(report: &Report, wl: &Value, attached_late: bool) {
    let w = Workload(wl);
    let pages = w.pages();
    let p = process(report, wl["pid"].as_u64().unwrap());
    let (mut table, mut fails) = (String::new(), Vec::new());
    let mut cl = Checklist::new("fork-write", &mut table, &mut fails);
    cl.line(format!(
        "{:?} mode; phases {:?}",
        report.mode,
        p.phases.iter().map(|ph| &ph.name).collect::<Vec<_>>()
    ));
    // The writes come after the child's exit: that phase's count, not the
    // whole process's (its start-up's COW faults vary with the machine).
    let wp: u64 = p
        .phases
        .iter()
        .filter(|ph| ph.name.ends_with("after-child-exit"))
        .map(|ph| phase_count(ph, ReportClass::WpFaults))
        .sum();
    cl.per_page("wp_faults after the child's exit", wp, pages);
    // The workload's own count of write-phase faults: exactly one per page.
    let write = w.write_faults();
    cl.expect(
        (pages..=pages + 2).contains(&write),
        format!("getrusage write phase {write}, pages {pages} (+2)"),
    );
    // All faults since exec (or since main) against getrusage, which also
    // counts the few faults of the forked child before its exec.
    cl.getrusage(p, if attached_late { w.faults_since_main() } else { w.faults_since_exec() });
    match report.mode {
        Mode::Tracepoint => {
            // The kprobe-only classes say so, never 0.
            for m in [ReportClass::Reuse, ReportClass::Copy, ReportClass::Spurious, ReportClass::HugePmdWp] {
                let said = match &p.classes[&m] {
                    faultscope::report::schema::ClassValue::NotMeasurable(n) => {
                        !n.measurable && n.reason.len() > 10
                    }
                    _ => false,
                };
                cl.expect(
                    said,
                    format!("{m}: not measurable in tracepoint mode, with a reason: {:?}", p.classes[&m]),
                );
            }
            let np = count(p, ReportClass::NotPresent);
            cl.expect(np >= pages, format!("not_present {np} >= pages {pages}"));
        }
        Mode::Kprobe => cl.per_page("reuse", count(p, ReportClass::Reuse), pages),
        m => cl.expect(false, format!("mode {m:?}: tracepoint or kprobe expected")),
    }
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}

#[test]
fn record_command_counts_write_protect_faults() {
    let _t = host_test();
    let d = tmp();
    let (out, report, wl) = record_workload(d.path(), "64M");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("faultscope: measuring"), "{stderr}");
    assert_eq!(report.schema, "faultscope/1");
    assert_eq!(report.end.as_deref(), Some("all targets exited"));
    assert_eq!(report.command_exit_status, Some(0));
    check_fork_write(&report, &wl, false);
    // The command has standard output: the tables go to standard error.
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("wp_faults"), "{text}");
}

#[test]
fn record_pid_follows_a_running_process_to_its_exit() {
    let _t = host_test();
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let mut child = Command::new(workload())
        .args(["--size", "32M", "--thp", "never", "--start-delay", "2", "--out", wl.to_str().unwrap()])
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    // Held in its start delay (past its start-up, which its own count
    // leaves out) until faultscope has attached, so that a slow attach on a
    // loaded machine cannot miss the fork.
    let sleeping = || {
        let sc = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        let nr: i64 = sc.split(' ').next().and_then(|n| n.parse().ok()).unwrap_or(-1);
        nr == libc::SYS_clock_nanosleep || nr == libc::SYS_nanosleep
    };
    for _ in 0..200 {
        if sleeping() {
            break;
        }
        sleep(Duration::from_millis(10));
    }
    assert!(sleeping(), "the workload never reached its start delay");
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let tracer = record_pid(&pid, &fs, &["--interval", "0.3"]);
    wait_attached(&tracer);
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
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
        .map(|x| x.counts[&ReportClass::WpFaults])
        .sum();
    assert_eq!(series, count(p, ReportClass::WpFaults));
}

/// Every program passes this kernel's verifier, each within the budget:
/// every attach pays it again, and the kernel's own limit is not far above
/// a program whose branches multiply. Prints the largest and the sum (each
/// kernel's verifier walks the same programs differently).
#[test]
fn every_program_passes_the_verifier_within_its_budget() {
    let _t = host_test();
    let out = faultscope(&["probes", "--load"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for p in programs() {
        assert!(text.contains(&format!("verifier: {p}: ok")), "{p} not accepted:\n{text}");
    }
    let budget = faultscope::kernel::session::VERIFIED_INSNS_BUDGET;
    let counted: Vec<(&str, u32)> =
        text.lines().filter_map(faultscope::cmd::probes::read_loaded_line).collect();
    for (name, n) in &counted {
        assert!(*n <= budget, "{name}: {n} instructions, over the verifier budget of {budget}");
    }
    // The kernel reports the count from 5.16 on.
    assert!(
        counted.len() >= programs().count() / 2,
        "too few programs with the kernel's verified count (Linux 5.16+ reports it):\n{text}"
    );
    let largest = counted.iter().max_by_key(|(_, n)| *n).copied().unwrap_or_default();
    let sum: u64 = counted.iter().map(|(_, n)| u64::from(*n)).sum();
    println!(
        "verifier: {} programs, the largest {} ({} instructions), {sum} in all",
        counted.len(),
        largest.0,
        largest.1
    );
}

/// `probes` names, in its first line, the mode a run is then in.
#[test]
fn probes_first_line_names_the_mode_a_run_gets() {
    let _t = host_test();
    let d = tmp();
    let json = d.path().join("r.json");
    let out = faultscope(&["record", "-j", json.to_str().unwrap(), "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mode = read_report(&json).mode;
    let out = faultscope(&["probes"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let first = text.lines().next().unwrap_or("");
    let want: &[&str] = match mode {
        Mode::Tracepoint => &["mode: tracepoint mode"],
        Mode::Kprobe => &["mode: fentry mode", "mode: kprobe mode"],
        _ => &["mode: none"],
    };
    assert!(want.iter().any(|w| first.starts_with(w)), "the run's mode is {mode:?}, probes says: {first}");
}

/// Shared memory whose soft-dirty bits the workload clears before its
/// write phase: every write is write-notify through `wp_page_shared`
/// (`wp_shared`), not COW, one fault a page. It needs a kernel that tracks
/// soft-dirty pages (CONFIG_MEM_SOFT_DIRTY; the guests') and the fault path
/// probed (`wp_shared` is the return's classification); elsewhere it is not
/// measurable, and the test says so.
#[test]
fn writes_to_shared_memory_after_soft_dirty_is_cleared_are_write_notify() {
    let _t = host_test();
    let d = tmp();
    if !soft_dirty_tracked(d.path()) || !fault_path_probed() {
        println!("wp_shared after clear_refs: not measurable here (no soft-dirty tracking, or no probed fault path)");
        return;
    }
    let (report, wl, traced) =
        record_traced(d.path(), &[], &["--size", "16M", "--thp", "never", "--shared", "--clear-soft-dirty"]);
    let p = process(&report, wl["pid"].as_u64().unwrap());
    let (mut table, mut fails) = (String::new(), Vec::new());
    let mut cl = Checklist::new("shared", &mut table, &mut fails);
    if let Some(t) = &traced {
        t.check(&mut cl, &report, p.pid);
    }
    let what = "wp_shared (soft-dirty cleared on shared memory: one write-notify fault a page)";
    cl.per_page(what, p.count(ReportClass::WpShared).unwrap_or(0), Workload(&wl).pages());
    cl.getrusage(p, Workload(&wl).faults_since_exec());
    println!("{table}");
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}

/// Whether the kernel tracks soft-dirty pages: the workload's
/// `--clear-soft-dirty` refuses where it does not (a page just written
/// is soft-dirty where it does).
fn soft_dirty_tracked(d: &Path) -> bool {
    let wl = d.join("soft-dirty.json");
    let out = Command::new(workload())
        .args(["--size", "64K", "--thp", "never", "--shared", "--clear-soft-dirty", "--out"])
        .arg(&wl)
        .output()
        .expect("running the workload");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() || err.contains("CONFIG_MEM_SOFT_DIRTY"), "the workload failed: {err}");
    out.status.success()
}

#[test]
fn automatic_phases_split_the_fork_scenario() {
    let _t = host_test();
    let d = tmp();
    let (_, report, wl) = record_workload(d.path(), "32M");
    let pages = wl["pages"].as_u64().unwrap();
    let p = process(&report, wl["pid"].as_u64().unwrap());
    let names: Vec<&str> = p.phases.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["before-fork", "fork#1 child-alive", "fork#1 after-child-exit"], "{names:?}");
    // Populate happens before the fork; the writes after the child exited.
    let before = phase(p, "before-fork");
    assert!(phase_count(before, ReportClass::Faults) >= pages);
    let after = phase(p, "fork#1 after-child-exit");
    let wp = phase_count(after, ReportClass::WpFaults);
    assert!((pages..=pages + TOLERANCE).contains(&wp), "wp after child exit {wp}");
    assert!(phase(p, "fork#1 child-alive").end_ns.unwrap() <= after.start_ns);
}

#[test]
fn marks_from_the_command_line_and_signals() {
    let _t = host_test();
    let d = tmp();
    let fs = d.path().join("fs.json");
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let tracer = Command::new(bin())
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
        let out = Command::new(bin())
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
}

/// Marks taken while the traced process forks as fast as it can (a phase
/// each fork and each child's exit): every mark is a phase of the report,
/// the phases are in the order of their ids, and every fault is in one of
/// them (the phases add up to the whole run).
#[test]
fn marks_are_never_lost_among_forks() {
    let _t = host_test();
    let d = tmp();
    let fs = d.path().join("fs.json");
    let script = "import os,time\nt=time.time()+2\nwhile time.time()<t:\n  b=bytearray(8*4096)\n  \
for j in range(0,len(b),4096): b[j]=1\n  p=os.fork()\n  if p==0: os._exit(0)\n  os.waitpid(p,0)\n";
    let tracer = Command::new(bin())
        .args(["record", "--mark-on-signal", "USR1", "--json", fs.to_str().unwrap(), "--"])
        .args(["/usr/bin/python3", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_attached(&tracer);
    for _ in 0..40 {
        unsafe { libc::kill(tracer.id() as i32, libc::SIGUSR1) };
        sleep(Duration::from_millis(25));
    }
    let out = tracer.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let marked: Vec<&str> = stderr.lines().filter_map(|l| l.strip_prefix("faultscope: phase ")).collect();
    assert!(marked.len() >= 10, "{stderr}");
    let r = read_report(&fs);
    let p = &r.processes[0];
    let names: Vec<&str> = p.phases.iter().map(|x| x.name.as_str()).collect();
    for m in &marked {
        assert!(names.contains(m), "{m} lost: {names:?}");
    }
    assert!(
        p.phases.windows(2).all(|w| w[0].id < w[1].id),
        "{:?}",
        p.phases.iter().map(|x| x.id).collect::<Vec<_>>()
    );
    let in_phases: u64 = p.phases.iter().map(|ph| phase_count(ph, ReportClass::Faults)).sum();
    assert_eq!(in_phases, count(p, ReportClass::Faults), "faults outside every phase");
}

// ---- lifecycle hardening ----

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
    let _t = host_test();
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let tracing = faultscope_expect::tracefs::start();
    let mut work = Command::new(workload())
        .args(["--size", "32M", "--thp", "never", "--child-lifetime", "60"])
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
    let tracer = fs_command(&["record", "-p", &pid.to_string(), "--json", fs.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_attached(&tracer);
    sleep(Duration::from_millis(200));
    unsafe { libc::kill(child as i32, libc::SIGKILL) };
    assert!(work.wait().unwrap().success());
    let out = tracer.wait_with_output().unwrap();
    let traced = tracing.map(|t| t.finish(&[]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report = read_report(&fs);
    assert_backend(&report);
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
    assert!(stderr.contains(&format!("pid {child}, forked by {pid} before attach")), "{stderr}");
    let (mut table, mut fails) = (String::new(), Vec::new());
    let mut cl = Checklist::new("attach", &mut table, &mut fails);
    // Where there is an oracle: every count equals its count between
    // faultscope's attach and its detach.
    if let Some(t) = &traced {
        t.check_phase(&mut cl, &report, pid, "attach");
    }
    let (alive, after) = (&p.phases[0], &p.phases[1]);
    let wp_alive = phase_count(alive, ReportClass::WpFaults);
    cl.per_page("wp_faults after the child's exit", phase_count(after, ReportClass::WpFaults), pages);
    if let Some(reuse) = after.classes.get(&ReportClass::Reuse).and_then(|v| v.count()) {
        cl.per_page("reuse after the child's exit", reuse, pages);
    }
    cl.expect(
        wp_alive < TOLERANCE,
        format!("wp_faults while the child lived = {wp_alive} (the writes come after its exit)"),
    );
    // getrusage of the write phase: every page, all after the exit.
    let minflt = Workload(&wl).write_faults();
    cl.per_page("getrusage: write phase minflt", minflt, pages);
    cl.per_page("faults after the exit", phase_count(after, ReportClass::Faults), minflt);
    println!("{table}");
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}

/// Item 6: the main thread exits first (exit(2), as pthread_exit does) and
/// another thread then runs the whole workload; the process is gone only
/// when its last thread exits. Both ways of telling the last thread: the
/// tracepoint's `group_dead` where the kernel has it, and
/// `signal->live` (what 6.12 needs).
#[test]
fn a_process_lives_until_its_last_thread_exits() {
    let _t = host_test();
    for via in ["", "signal-live"] {
        let d = tmp();
        let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
        let out = Command::new(bin())
            .env("FAULTSCOPE_EXIT_VIA", via)
            .args(["record", "--json", fs.to_str().unwrap(), "--", workload(), "--leader-exit", "0.5"])
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
            count(p, ReportClass::Faults),
            count(p, ReportClass::WpFaults),
            wl["pages"],
            wl["minflt_total"]
        );
        check_fork_write(&report, &wl, false);
    }
}

/// Item 5: a new process that takes an exited target's pid at once is not
/// counted as the target (nor renames it): the target leaves the kernel's
/// traced set at its exit, not when user space next drains events.
#[test]
fn a_reused_pid_is_not_the_exited_target() {
    let _t = host_test();
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let mut target = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = target.id();
    let tracer = Command::new(bin())
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
    let again =
        spawn_with_pid(pid, &[workload(), "--size", "16M", "--thp", "never", "--out", wl.to_str().unwrap()]);
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
    assert_eq!((p.comm.as_str(), count(p, ReportClass::Faults)), ("sleep", 0), "{p:#?}");
}

/// `record --follow-children -- sh -c 'N × /bin/true'`: the JSON size, the
/// recorder's peak RSS and the phases each process carries.
fn follow_children_run(n: u32) -> (u64, u64, Report) {
    let d = tmp();
    let fs = d.path().join("fs.json");
    let script = format!("i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done");
    // Reaped below by wait4, for its rusage.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(bin())
        // Per-mapping counts of 400 processes outgrow MAPPINGS' bound (the
        // excess is dropped and said): this test is about processes and
        // phases.
        .args(["record", "--follow-children", "--max-stats", "65536", "--no-mappings"])
        .args(["--json", fs.to_str().unwrap()])
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
    let _t = host_test();
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
        assert_eq!(r.drops.total(), 0, "{:?}", r.drops);
        // The kernel's own count of skipped program runs was read (5.12+).
        let skipped = r.drops.0.get(&faultscope::report::schema::DropReason::SkippedRuns);
        assert_eq!(skipped, Some(&0), "{:?}", r.drops);
    }
    assert!(
        j400 <= j100 * 9 / 2 + (64 << 10),
        "JSON {j400} bytes at 400 children vs {j100} at 100: not linear"
    );
    assert!(rss400 <= rss100 * 9 / 2, "RSS {rss400} KiB at 400 children vs {rss100} at 100: not linear");
}

/// A reader's faults are the kernel's, in read(2) (copy_to_user into its
/// buffer): counted with their origin, and the kernel's own count of the
/// process over the run is faultscope's (tracepoint mode: up to the
/// get_user_pages faults it derives, none here).
#[test]
fn a_readers_faults_are_the_kernels_and_match_its_own_count() {
    let _t = host_test();
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
    let faults = p.classes.get(&ReportClass::Faults).unwrap();
    let kernel = faults.origin_count("kernel").expect("kernel-mode faults are measured");
    // dd's 16M buffer is first written by read(2): 4096 pages.
    assert!(kernel >= 4096, "kernel-origin faults {kernel}: {faults:?}");
    assert!(faults.origin_count("user").unwrap() < 4096, "{faults:?}");
    let (total, gup) = kernel_check(p);
    assert_eq!(total, faults.count().unwrap() + gup.max(0) as u64 - (-gup).max(0) as u64);
    // dd makes no get_user_pages call after its exec.
    assert!(gup.abs() <= 4, "derived GUP faults {gup}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("kernel check: "), "{text}");
}

/// A process whose main thread exits early and whose other thread runs on
/// (`workload --leader-exit`): the kernel sums each thread's final count at
/// its exit, and the total equals faultscope's and, within the faults of
/// its last steps, the workload's own getrusage.
#[test]
fn threads_that_exit_during_the_run_are_in_the_kernel_check() {
    let _t = host_test();
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let out = faultscope(&[
        "record",
        "--json",
        fs.to_str().unwrap(),
        "--",
        workload(),
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
    assert_eq!(total as i64, count(p, ReportClass::Faults) as i64 + gup);
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
}

/// `record --comm` and `--cgroup` with serve's semantics: a program exec'd
/// under the comm, or a process of the cgroup, joins from its first event
/// (both here live far less than a second), bounded by the page arithmetic
/// and their own getrusage; a process outside is not traced; the run lasts
/// until --duration although no target is left.
#[test]
fn record_comm_and_cgroup_trace_what_starts_later() {
    use super::serve::{short_python, short_python_in};
    let _t = host_test();
    let d = tmp();
    let exe = d.path().join("fs-reccomm");
    std::os::unix::fs::symlink(std::fs::canonicalize("/usr/bin/python3").unwrap(), &exe).unwrap();
    let (cg, rm) = test_cgroup("-rec");
    let json = d.path().join("r.json");
    let rec = Command::new(bin())
        .args(["record", "--comm", "fs-reccomm", "--cgroup", cg.to_str().unwrap(), "-d", "6", "-j"])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = format!("/run/faultscope/record-{}.sock", rec.id());
    for _ in 0..300 {
        if Path::new(&sock).exists() {
            break;
        }
        sleep(Duration::from_millis(50));
    }
    assert!(Path::new(&sock).exists(), "record did not attach");
    let by_comm = short_python(&exe);
    let in_cgroup = short_python_in(&cg);
    let outside = touch_outside();
    let out = rec.wait_with_output().unwrap();
    drop(rm);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("duration reached"), "{stderr}");
    let report = read_report(&json);
    let counted: Vec<u64> = report.processes.iter().map(|p| count(p, ReportClass::Faults)).collect();
    for (what, (touch, whole)) in [("comm", by_comm), ("cgroup", in_cgroup)] {
        assert!(
            counted.iter().any(|&n| n >= touch && n <= whole + TOLERANCE),
            "{what}: touched {touch}, whole life {whole}; counted {counted:?}\n{stderr}"
        );
    }
    assert!(
        !report.processes.iter().any(|p| p.pid == outside),
        "the process outside was traced: {counted:?}"
    );
    assert_eq!(report.processes.len(), 2, "{counted:?}");
}

/// A process that is neither of the comm nor of the cgroup: its pid.
fn touch_outside() -> u32 {
    let mut c = Command::new("/usr/bin/python3")
        .args(["-c", "b=bytearray(2048*4096)\nfor j in range(0,len(b),4096): b[j]=1\n"])
        .spawn()
        .unwrap();
    c.wait().unwrap();
    c.id()
}

/// `major` where no probe classifies a fault (tracepoint mode) is the
/// kernel's maj_flt over the run: a process that reads 2,048 evicted file
/// pages by mmap (no readahead) reports what its own getrusage says; with
/// the fault path probed, the probes count it, within the same bound.
#[test]
fn major_faults_are_counted_in_every_mode() {
    let _t = host_test();
    let d = tmp();
    let json = d.path().join("r.json");
    // On the checkout's file system (a disk, not tmpfs): evicted pages are
    // read back from it.
    let data = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("major-{}.bin", std::process::id()));
    let script = "import os,mmap,resource,sys\np=sys.argv[1]\nf=open(p,'wb')\nf.write(os.urandom(8<<20))\n\
f.flush()\nos.fsync(f.fileno())\nfd=os.open(p,os.O_RDONLY)\nos.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED)\n\
m=mmap.mmap(fd,8<<20,prot=mmap.PROT_READ)\nm.madvise(mmap.MADV_RANDOM)\ns=0\n\
for i in range(0,8<<20,4096): s+=m[i]\nprint(resource.getrusage(resource.RUSAGE_SELF).ru_majflt,flush=True)\n";
    let out = Command::new(bin())
        .args(["record", "-j", json.to_str().unwrap(), "--", "/usr/bin/python3", "-c", script])
        .arg(&data)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&data);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let own: u64 = String::from_utf8_lossy(&out.stdout).lines().next().unwrap().trim().parse().unwrap();
    let p = &read_report(&json).processes[0];
    let major = count(p, ReportClass::Major);
    if own < 1024 {
        // A file system without a backing store (tmpfs) keeps its pages:
        // no major fault to count, and the check below is of zeros.
        eprintln!("the file's pages were not evicted ({own} major faults): {}", data.display());
    }
    // getrusage counts from the fork, the report from the exec: the
    // exec's own reads of the program can fall between the two.
    assert!(
        (own.saturating_sub(TOLERANCE)..=own + TOLERANCE).contains(&major),
        "major {major}, getrusage {own}"
    );
}

/// Threads faulting across phase changes (`fs-workload --threads`: two
/// mappings written alternately by 4 threads; a child killed at half the
/// writes, a second forked and gone at three quarters, each while the
/// threads wait at their mark): the kernel's per-CPU pending counts are
/// flushed and read without loss. The intervals add up to the run exactly,
/// the phases too, each phase's write-protect faults are its segment's
/// pages, and the run's faults are getrusage's.
#[test]
fn a_threaded_storm_across_phases_loses_nothing() {
    let _t = host_test();
    let d = tmp();
    // 0.02 s here; a guest under emulation runs 5 to 10 times slower and
    // sets FAULTSCOPE_TEST_INTERVAL=0.1: about as many intervals a run, and
    // fewer of faultscope's map reads, each of which can make a
    // preemptible 7.x kernel skip kprobe runs (at 0.02 s one 7.3 arm64 run
    // was 201 faults short, with 825 program runs reported skipped).
    let interval = std::env::var("FAULTSCOPE_TEST_INTERVAL").unwrap_or_else(|_| "0.02".into());
    let (report, wl, traced) = record_traced(
        d.path(),
        &["--interval", &interval],
        &["--threads", "4", "--size", "32M", "--thp", "never"],
    );
    let p = process(&report, wl["pid"].as_u64().unwrap());
    let (mut table, mut fails) = (String::new(), Vec::new());
    let mut cl = Checklist::new("threaded storm", &mut table, &mut fails);
    let w = Workload(&wl);
    // Where there is an oracle: the process and each mapping's range
    // equal to it, and one write-protect fault per page of each.
    if let Some(t) = &traced {
        t.check(&mut cl, &report, w.pid());
        let classes = [ReportClass::Faults, ReportClass::WpFaults, ReportClass::Reuse, ReportClass::Copy];
        for r in region_rows(&mut cl, p, Some(&t.oracle), &wl, &classes) {
            let (wp, pages) = (r.get(ReportClass::WpFaults), r.pages);
            cl.expect(wp == pages, format!("{}: wp_faults {wp} = its pages {pages}", r.role));
        }
    }
    faultscope_expect::latency_tier(&mut cl, &report, p);
    faultscope_expect::threaded_storm(&mut cl, &report, p, &w);
    cl.getrusage(p, w.faults_since_exec());
    println!("{table}");
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}

/// Faults that sleep (`fs-workload --userfault 2`): a userfaultfd region
/// written by two threads, each fault held 2 ms by a handler thread, while
/// a third thread takes first-touch faults of a region of its own. Where
/// the fault path is probed, a fault's state leaves its CPU with the
/// sleeping thread: each held page still completes once in its mapping
/// (the call that waited returns VM_FAULT_RETRY, its retry completes; the
/// kernel may retry once more under mmap_lock), and its latency holds the
/// hold. In tracepoint mode a held page is one exception (the kernel
/// retries inside it). Each busy page faults once a pass either way.
#[test]
fn faults_that_sleep_are_counted_once_and_timed_across_the_sleep() {
    let _t = host_test();
    let d = tmp();
    let (report, wl, traced) = record_traced(
        d.path(),
        &["--latency", "all"],
        &["--userfault", "2", "--size", "256K", "--thp", "never"],
    );
    let p = process(&report, wl["pid"].as_u64().unwrap());
    let (mut table, mut fails) = (String::new(), Vec::new());
    let mut cl = Checklist::new("userfault", &mut table, &mut fails);
    if let Some(t) = &traced {
        t.check(&mut cl, &report, p.pid);
    }
    let retries = p.count(ReportClass::Retry);
    let mut held_pages = 0;
    for r in region_rows(&mut cl, p, traced.as_ref().map(|t| &t.oracle), &wl, &[ReportClass::Faults]) {
        let (role, pages) = (r.role, r.pages);
        let (faults, retry) = (r.get(ReportClass::Faults), r.get(ReportClass::Retry));
        if role == "held" {
            held_pages = pages;
            cl.expect(
                faults.checked_sub(retry) == Some(pages),
                format!(
                    "{role}: faults {faults} less retry {retry} = its {pages} pages, each completed once"
                ),
            );
            if retries.is_some() {
                cl.expect(
                    (pages..=2 * pages).contains(&retry),
                    format!("{role}: retry {retry}, each page once or twice ({pages} to {})", 2 * pages),
                );
            }
        } else {
            // The kernel may retry a fault under mmap_lock that the
            // per-VMA lock could not finish, at most once a pass here.
            let passes = r.region["passes"].as_u64().unwrap_or(0);
            let want = pages * passes;
            cl.expect(
                faults.checked_sub(retry) == Some(want) && retry <= passes,
                format!("{role}: faults {faults} less retry {retry} = {want}, retry at most one a pass ({passes})"),
            );
        }
    }
    // Each held fault's latency holds the handler's hold: its bucket ends
    // above it (where faults are timed: not in tracepoint mode).
    let hold = wl["hold_ns"].as_u64().unwrap_or(0);
    if let Some(ClassValue::Measured(m)) = p.classes.get(&ReportClass::Retry) {
        let above =
            m.latency.as_ref().map(|l| l.buckets.iter().filter(|b| b[1] > hold).map(|b| b[2]).sum::<u64>());
        cl.expect(
            above.is_some_and(|n| n >= held_pages),
            format!("retry: {above:?} faults timed at or above the {hold} ns hold, of {held_pages} held"),
        );
    }
    println!("{table}");
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}

/// Output like perf's: with a command, the tables go to standard error
/// (the command has standard output); `-o FILE` takes them instead;
/// `--quiet` prints nothing but errors; -o and --json may not be the same
/// file.
#[test]
fn the_tables_leave_the_commands_standard_output_alone() {
    let _t = host_test();
    let d = tmp();
    let (txt, fs) = (d.path().join("report.txt"), d.path().join("fs.json"));
    let out = faultscope(&["record", "--", "sh", "-c", "echo from-the-command"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from-the-command\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains(") whole run"));
    let out = faultscope(&[
        "record",
        "-q",
        "-o",
        txt.to_str().unwrap(),
        "--json",
        fs.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "head -c 4M /dev/zero > /dev/null",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    let text = std::fs::read_to_string(&txt).unwrap();
    let r = read_report(&fs);
    assert!(text.contains(") whole run") && !r.processes.is_empty(), "{text}");
    let same =
        faultscope(&["record", "-o", fs.to_str().unwrap(), "--json", fs.to_str().unwrap(), "--", "true"]);
    assert_refused(&same, "--output");
}

/// Intervals on time under a fault storm: a 256 MiB fork storm with
/// per-mapping counts on (tracepoint mode's granules flush a pending slot
/// every 16 faults, so no read of the maps is ever clean) keeps every
/// interval within 2 ticks of its planned time, and the copy-on-write
/// faults are in the child-alive phase.
#[test]
fn intervals_keep_time_under_a_fault_storm() {
    let _t = host_test();
    let d = tmp();
    let (fs, wl) = (d.path().join("fs.json"), d.path().join("wl.json"));
    let out = faultscope(&[
        "record",
        "--interval",
        "0.1",
        "--json",
        fs.to_str().unwrap(),
        "--",
        workload(),
        "--size",
        "256M",
        "--thp",
        "never",
        "--child",
        "alive",
        "--out",
        wl.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    let iv = r.intervals.as_deref().unwrap_or_default();
    // The last interval ends with the run, not on a tick.
    let ticks: Vec<f64> = iv.iter().map(|i| i.t_s).take(iv.len().saturating_sub(1)).collect();
    assert!(ticks.len() >= 2, "{ticks:?}");
    for (n, t) in ticks.iter().enumerate() {
        let planned = 0.1 * (n + 1) as f64;
        assert!((t - planned).abs() <= 0.2, "interval {n} at {t:.3}s, planned {planned:.1}s: {ticks:?}");
    }
    let pages = 256 << 20 >> 12;
    let p = &r.processes[0];
    // Each interval names the phases the kernel put its faults in, in the
    // run's order, and every phase with faults is in one.
    let order: Vec<&str> = p.phases.iter().map(|ph| ph.name.as_str()).collect();
    let mut seen = std::collections::BTreeSet::new();
    for i in iv {
        let at: Vec<usize> = i.phases.iter().map(|n| order.iter().position(|o| o == n).unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "interval at {:.3}s: {:?}", i.t_s, i.phases);
        seen.extend(i.phases.iter().cloned());
    }
    for ph in p
        .phases
        .iter()
        .filter(|ph| ph.classes.get(&ReportClass::Faults).and_then(|v| v.count()).unwrap_or(0) > 0)
    {
        assert!(seen.contains(&ph.name), "{} has faults but no interval holds it: {seen:?}", ph.name);
    }
    let alive = phase(p, "fork#1 child-alive");
    let wp = alive.classes.get(&ReportClass::WpFaults).and_then(|v| v.count());
    assert!(
        wp.is_some_and(|n| (pages..=pages + TOLERANCE).contains(&n)),
        "child-alive wp_faults {wp:?}, {pages} pages"
    );
    // Per-mapping counts on (the default): the mapping has its pages, none
    // lost to a full map or left in another row.
    let (row, n) = alive.attribution.top_mapping(ReportClass::WpFaults).expect("a mapping with the writes");
    assert!((pages..=pages + TOLERANCE).contains(&n), "{n} in {row:?}, {pages} pages");
    assert_eq!(row.size, 256 << 20, "{row:?}");
    let full =
        faultscope::report::schema::DropReason::Kernel(faultscope_common::maps::DropKind::MappingsFull);
    assert_eq!(r.drops.get(full), 0);
}

/// A process that maps a file, faults it (a read, then a write, of each
/// page) and exits before faultscope's first look at its maps has its
/// mappings named all the same (the kernel describes each VMA it counts
/// in), run after run: 20 runs, or `FAULTSCOPE_TEST_REPEAT` where a run
/// costs seconds (an emulated guest).
#[test]
fn mappings_of_a_process_gone_before_its_maps_are_read_are_named() {
    let _t = host_test();
    let d = tmp();
    let file = d.path().join("data");
    std::fs::write(&file, vec![7u8; 64 << 10]).unwrap();
    let (mut faults, mut unnamed) = (0, 0);
    let runs = std::env::var("FAULTSCOPE_TEST_REPEAT").ok().and_then(|n| n.parse().ok()).unwrap_or(20);
    for run in 0..runs {
        let fs = d.path().join(format!("fs{run}.json"));
        let out = faultscope(&[
            "record",
            "--max-mappings",
            "1000",
            "--json",
            fs.to_str().unwrap(),
            "--",
            workload(),
            "--map-file",
            file.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let r = read_report(&fs);
        assert_backend(&r);
        let p = &r.processes[0];
        let total = p.classes.get(&ReportClass::Faults).and_then(|v| v.count()).unwrap_or(0);
        let rows = &p.attribution.mappings;
        let sum: u64 = rows.iter().filter_map(|m| m.counts.get(&ReportClass::Faults)).sum();
        assert_eq!(sum, total, "run {run}: the rows hold every fault: {rows:#?}");
        let lost: u64 = rows
            .iter()
            .filter(|m| m.mapping.starts_with("unresolved"))
            .filter_map(|m| m.counts.get(&ReportClass::Faults))
            .sum();
        // The file itself, by its name at least, with its pages' writes.
        let wp = |m: &&faultscope::report::schema::MappingRow| m.counts.get(&ReportClass::WpFaults).copied();
        assert!(
            rows.iter().any(|m| m.mapping.ends_with("/data") && wp(&m).is_some_and(|n| n > 0)),
            "run {run}: no write-protect fault in the file's row: {rows:#?}"
        );
        faults += total;
        unnamed += lost;
    }
    assert!(faults > 0);
    assert!(unnamed * 20 <= faults, "{unnamed} of {faults} faults in unnamed mappings over {runs} runs");
}

/// Every origin of a fault (`fs-workload --origins`): a third of each half
/// of its memory written by the kernel (read(2) into it), a third by
/// get_user_pages (pwrite(2) to /proc/self/mem) and a third by user stores,
/// the first half while a forked child lives, the second after it is
/// killed. Per phase and origin, the write classes measured here (copy
/// while the child lives, reuse + copy after; in tracepoint mode
/// wp_faults) are a third of the half, and each phase's faults are its
/// getrusage. get_user_pages raises no exception: in tracepoint mode its
/// third is the kernel check's derived count; where the fault path is
/// probed its faults are counted, named by their system call, and the
/// kernel check is equal.
#[test]
fn every_origin_of_a_fault_is_counted_in_its_phase() {
    use faultscope::report::schema::{CheckResult, PhaseKind};
    use faultscope_expect::{LRU_BATCH_COPIES, ORIGIN_SLACK};
    let _t = host_test();
    let d = tmp();
    let (report, wl, traced) = record_traced(
        d.path(),
        &["--sites", "copy,reuse"],
        &["--origins", "--size", "12M", "--thp", "never"],
    );
    let p = process(&report, wl["pid"].as_u64().unwrap());
    let n = wl["origins"]["pages_per_origin"].as_u64().expect("origins.pages_per_origin");
    let (mut table, mut fails) = (String::new(), Vec::new());
    let mut cl = Checklist::new("origins", &mut table, &mut fails);
    if let Some(t) = &traced {
        t.check(&mut cl, &report, p.pid);
    }
    let probed = p.count(ReportClass::Copy).is_some();
    for (kind, key) in [(PhaseKind::ChildAlive, "alive"), (PhaseKind::AfterChildExit, "after_exit")] {
        let Some(ph) = p.phases.iter().find(|ph| ph.kind == kind) else {
            cl.expect(false, format!("a {kind:?} phase"));
            continue;
        };
        // While the child lives every write copies; after its exit a write
        // reuses, or copies where the kernel still holds an extra
        // reference to the page (`LRU_BATCH_COPIES`).
        let classes: &[ReportClass] = match (probed, kind) {
            (false, _) => &[ReportClass::WpFaults],
            (true, PhaseKind::ChildAlive) => &[ReportClass::Copy],
            (true, _) => &[ReportClass::Reuse, ReportClass::Copy],
        };
        let what = classes.iter().map(|c| c.name()).collect::<Vec<_>>().join(" + ");
        let of = |c: &ReportClass, origin: &str| ph.classes.get(c).and_then(|v| v.origin_count(origin));
        for origin in faultscope_expect::oracle::ORIGINS {
            if !probed && origin == "gup" {
                continue;
            }
            // The phase after the exit runs on to the workload's end, whose
            // user-mode writes reuse more of its pages.
            let slack = if origin == "user" { TOLERANCE } else { ORIGIN_SLACK };
            let got: Option<u64> = classes.iter().map(|c| of(c, origin)).sum();
            let copies = if classes.len() > 1 { of(&ReportClass::Copy, origin).unwrap_or(0) } else { 0 };
            cl.expect(
                got.is_some_and(|g| (n..=n + slack).contains(&g)) && copies <= LRU_BATCH_COPIES,
                format!(
                    "{} {what}.{origin} = {got:?}, pages = {n} (+{slack}), copy {copies} <= {LRU_BATCH_COPIES}",
                    ph.name
                ),
            );
        }
        // The kernel's faults are named by their system call: read(2) for
        // the kernel's third, pwrite64(2) on /proc/self/mem for GUP's.
        if probed {
            for syscall in ["read(2)", "pwrite64(2)"] {
                let site: u64 = ph
                    .attribution
                    .sites
                    .iter()
                    .filter(|s| classes.contains(&s.class) && s.syscall.as_deref() == Some(syscall))
                    .map(|s| s.count)
                    .sum();
                cl.expect(site >= n, format!("{} sites in {syscall}: {site} >= {n}", ph.name));
            }
        }
        // The phase's faults against its getrusage (in tracepoint mode
        // plus get_user_pages' third, which raises no exception).
        let minflt = wl["origins"][key]["minflt"].as_u64().unwrap_or(0);
        let faults = ph.classes.get(&ReportClass::Faults).and_then(|v| v.count()).unwrap_or(0);
        let seen = if probed { faults } else { faults + n };
        cl.expect(
            minflt >= 3 * n && (minflt..=minflt + TOLERANCE).contains(&seen),
            format!(
                "{} faults {faults}{} against getrusage {minflt} (3 x {n} pages, +{TOLERANCE})",
                ph.name,
                if probed { "" } else { " + the GUP third" }
            ),
        );
    }
    let k = p.kernel_check.as_ref().expect("a kernel check");
    if probed {
        cl.expect(k.result == CheckResult::Equal, format!("kernel check {:?}: {:?}", k.result, k.reason));
        if let Some(t) = &traced {
            let completed = t.oracle.line(p.pid, "ALL").and_then(|l| l.get("completed").copied().flatten());
            cl.expect(
                completed == Some(k.faultscope),
                format!("faultscope's completed faults {} = the oracle's {completed:?}", k.faultscope),
            );
        }
    } else {
        let gup = k.gup_derived.map(|(lo, _)| lo.max(0) as u64);
        cl.expect(
            gup.is_some_and(|g| (2 * n..=2 * n + 2 * ORIGIN_SLACK).contains(&g)),
            format!("kernel check {:?}: get_user_pages derived {gup:?}, its two thirds {}", k.result, 2 * n),
        );
    }
    println!("{table}");
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}
