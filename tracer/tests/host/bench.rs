//! bench: its exact write step, the THP knobs it sets and restores (also
//! after SIGKILL), its threads and child.

use super::*;

/// The bench's write step (its mark and the phases up to the next mark).
fn bench_write(report: &Report) -> (u64, u64) {
    let p = report.bench_process().expect("the bench process");
    let wp = p.span("mark:write").expect("mark:write").count(ReportClass::WpFaults).expect("wp_faults");
    (wp, report.bench.as_ref().unwrap().pages)
}

#[test]
fn bench_counts_its_write_phase_exactly() {
    let _t = host_test();
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
        // Its own process's kernel check is not made, and says why.
        if let Some(k) = r.bench_process().and_then(|p| p.kernel_check.as_ref()) {
            let why = k.reason.as_deref().unwrap_or("");
            assert!(why.contains("bench's own process"), "{folio}: {k:?}");
        }
        // Where COW outcomes are measured: a large folio is reused page by
        // page since 6.16 (1da190f4d0a6), copied page by page before; the
        // kernel's release decides, from the report.
        let write = r.bench_process().and_then(|p| p.span("mark:write")).expect("mark:write");
        if let (Some(reuse), Some(copy), true) =
            (write.count(ReportClass::Reuse), write.count(ReportClass::Copy), folio != "4K")
        {
            let (class, n) = match faultscope_expect::kernel_at_least(&r.kernel, 6, 16) {
                true => ("reuse", reuse),
                false => ("copy", copy),
            };
            assert!(
                (pages..=pages + 8).contains(&n),
                "{folio} on {}: {class} {n} for {pages} pages",
                r.kernel
            );
        }
    }
    // PMD-mapped THPs: at least one write fault per 2M, at most one per
    // page. Where in between is the kernel's choice: it reuses a
    // THP whole, or splits the PMD where the folio holds another
    // reference (a CPU's LRU batch; 41 to 62 faults for 16 THPs on a
    // 6.18 host). The workload's own count of the step is the oracle.
    // The step's faults, not its wp_faults: where the fault path is probed
    // a THP's write fault is huge_pmd_wp (and wp_faults only where the
    // PMD was split and its PTE then faulted); in tracepoint mode the
    // error code makes each a wp fault.
    let r = bench(&["seq", "--size", "32M", "--folio", "2M", "--pmd"], &d.path().join("pmd.json"));
    let b = r.bench.as_ref().unwrap();
    assert_eq!(b.folio_check.pmd_mapped_bytes, 32 << 20);
    let p = r.bench_process().expect("the bench process");
    let faults = p.span("mark:write").and_then(|s| s.count(ReportClass::Faults)).expect("faults");
    let (pages, minflt) = (b.pages, b.step("write").unwrap().minflt as u64);
    assert!((16..=pages).contains(&faults), "PMD-mapped: {faults} faults for 16 THPs, {pages} pages");
    assert!(
        faults.abs_diff(minflt) <= 8,
        "PMD-mapped: faults {faults} against the write step's getrusage {minflt}"
    );
}

#[test]
fn bench_reader_writer_counts_the_writers_reuses_and_the_readers_stores() {
    let _t = host_test();
    let d = tmp();
    let r = bench(&["reader-writer", "--size", "16M", "--time-stores"], &d.path().join("rw.json"));
    let b = r.bench.as_ref().unwrap();
    let (wp, pages) = bench_write(&r);
    // The writer's stores: a write-protect fault a page. The reader's: a
    // spurious fault each where its CPU kept the read-only TLB entry (this
    // host's CPU may or may not), at most one a page.
    assert!((pages..=2 * pages + 8).contains(&wp), "wp {wp} for {pages} pages, twice stored to");
    let minflt = b.step("write").unwrap().minflt as u64;
    assert!(wp.abs_diff(minflt) <= 8, "wp {wp} against the write step's getrusage {minflt}");
    assert_eq!(b.store_latency.unwrap().n, pages, "the reader's stores, timed");
    let p = r.bench_process().unwrap();
    let write = p.span("mark:write").unwrap();
    // Where the fault path is probed, the split adds up; where it is not
    // (the x86 tracepoint alone), neither half is a count.
    let (stale, race) = (write.count(ReportClass::SpuriousStaleTlb), write.count(ReportClass::SpuriousRace));
    match write.count(ReportClass::Spurious) {
        Some(sp) => {
            assert_eq!(stale.zip(race).map(|(s, r)| s + r), Some(sp), "stale TLB + race = spurious");
            assert_eq!(race, Some(0), "the reader stores after the writer is done: no race");
        }
        None => assert_eq!((stale, race), (None, None), "split where spurious is not measurable"),
    }
    // One CPU: refused before anything runs.
    let out = Command::new("taskset")
        .args(["-c", "0", bin(), "bench", "reader-writer", "--size", "16M"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("reader-writer needs two CPUs"), "{stderr}");
}

#[test]
fn bench_restores_sysfs_knobs_when_terminated() {
    let _t = host_test();
    let knobs = [
        "/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled",
        "/sys/kernel/mm/transparent_hugepage/khugepaged/scan_sleep_millisecs",
    ];
    let before: Vec<String> = knobs.iter().map(|k| std::fs::read_to_string(k).unwrap()).collect();
    let child = Command::new(bin())
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
}

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
    let mut child = Command::new(bin())
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
    let _t = host_test();
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
}

/// A cgroup (v1 pids controller) allowing `max` tasks, removed with it.
fn pids_cgroup(max: u32) -> Option<Rmdir> {
    let root = Path::new("/sys/fs/cgroup/pids");
    let root = if root.join("cgroup.procs").exists() { root } else { Path::new("/sys/fs/cgroup") };
    let d = root.join(format!("faultscope-test-{}", std::process::id()));
    std::fs::create_dir(&d).ok()?;
    let cg = Rmdir(d);
    std::fs::write(cg.0.join("pids.max"), max.to_string()).ok()?;
    Some(cg)
}

#[test]
fn bench_that_cannot_start_a_thread_says_so() {
    let _t = host_test();
    // bench, its forked child (waited for) and one writer: the second
    // writer thread cannot be started.
    let Some(cg) = pids_cgroup(2) else {
        eprintln!("no pids cgroup to limit threads with: skipped");
        return;
    };
    let procs = std::ffi::CString::new(cg.0.join("cgroup.procs").to_str().unwrap()).unwrap();
    let mut cmd = Command::new(bin());
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
}

fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X'])),
    }
}

#[test]
fn bench_child_alive_dies_with_the_bench() {
    let _t = host_test();
    let mut bench = Command::new(bin())
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
}

#[test]
fn bench_runs_keep_every_run_with_statistics_and_diff_as_a_changelog() {
    let _t = host_test();
    use faultscope::report::bench_series;
    // Bad lists and counts are refused before anything is attached.
    for (args, needle) in [
        (&["--runs", "0"][..], "--runs 0"),
        (&["--runs", "1001"][..], "--runs 1001"),
        (&["--folio", "4K,48K"][..], "not 48K"),
        (&["--folio", "4K,64K,4K"][..], "4K is listed twice"),
    ] {
        let mut a = vec!["bench", "seq", "--size", "4M"];
        a.extend_from_slice(args);
        assert_refused(&faultscope(&a), needle);
    }
    assert_refused(&faultscope(&["bench", "seq,random,seq", "--size", "4M"]), "seq is listed twice");
    let d = tmp();
    let f = d.path().join("series.json");
    let fs = f.to_str().unwrap();
    let out = faultscope(&["bench", "seq", "--folio", "4K", "--size", "4M", "--runs", "3", "--json", fs]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("faultscope bench seq 4K") && stdout.contains("3 runs"), "{stdout}");
    // What is measured here is said once, not once per run.
    assert_eq!(stderr.matches("faultscope: measuring").count(), 1, "{stderr}");
    // Every run is kept, as its full report; the statistics in the file
    // are those of its runs.
    let raw = read_json(&f);
    assert_eq!(raw["schema"], "faultscope-bench/1");
    // It is what the schema says (the runs, what the report's schema
    // says; the unit tests keep the published files equal to these).
    let to_value = |s: schemars::Schema| serde_json::to_value(s).unwrap();
    let registry = jsonschema::Registry::new()
        .add("json-schema:///report.schema.json", to_value(faultscope::report::schema::json_schema()))
        .unwrap()
        .prepare()
        .unwrap();
    let v =
        jsonschema::options().with_registry(&registry).build(&to_value(bench_series::json_schema())).unwrap();
    let errors: Vec<String> = v.iter_errors(&raw).take(5).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    let s = bench_series::load(&f).unwrap_or_else(|e| panic!("{e}")).series;
    assert_eq!((s.runs, s.cells.len()), (3, 1));
    let c = &s.cells[0];
    assert_eq!(c.runs.len(), 3);
    let again = serde_json::to_value(&c.steps).unwrap();
    for (st, written) in again.as_array().unwrap().iter().zip(raw["cells"][0]["steps"].as_array().unwrap()) {
        for k in ["name", "wall_ns", "cpu_ns", "minflt"] {
            assert_eq!(st[k], written[k], "{k}");
        }
        for (m, x) in st["classes"].as_object().unwrap() {
            let y = &written["classes"][m];
            match x.get("measurable") {
                Some(_) => assert_eq!(y["measurable"], false, "{m}"),
                None => assert_eq!(x, y, "{m}"),
            }
        }
    }
    let pages = (4u64 << 20) / 4096;
    for r in &c.runs {
        assert_eq!(r.bench.as_ref().unwrap().pages, pages);
        let w = r.bench_process().unwrap().span("mark:write").unwrap();
        let n = w.count(ReportClass::WriteFaults).expect("write_faults is measured in either mode");
        assert!((pages..=pages + TOLERANCE).contains(&n), "write faults {n} for {pages} pages");
    }
    let write = c.step("write").expect("the write step");
    for (what, st) in [
        ("write_faults", write.class(ReportClass::WriteFaults).unwrap()),
        ("wall", &write.wall_ns),
        ("minflt", &write.minflt),
    ] {
        assert_eq!(st.n, 3, "{what}");
        assert!(st.min as f64 <= st.median && st.median <= st.max as f64, "{what}: {st:?}");
        assert!(st.stddev.is_some(), "{what}: {st:?}");
    }
    // A class not measurable here stays so, never a 0.
    for (m, v) in &write.classes {
        let measured = c.runs[0].bench_process().unwrap().span("mark:write").unwrap().count(*m).is_some();
        assert_eq!(v.stats().is_some(), measured, "{m}");
    }
    // The changelog of the series against itself: no change in any cell.
    let out = faultscope(&["diff", "--format", "changelog", fs, fs]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("seq ")).collect();
    assert_eq!(rows.len(), 2, "write faults and time:\n{text}");
    for r in rows {
        assert!(r.contains(" 0.00% ") && r.trim_end().ends_with("no"), "{r}\n{text}");
    }
    // Above them, the cover letter's layout: the workload said in words,
    // and both columns' medians of the same runs alike.
    assert!(text.replace('\n', " ").contains("of anonymous memory, fork(), the child exits"), "{text}");
    assert!(text.contains("\n  one byte per page, ascending\n    write faults\n"), "{text}");
    let pages: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("4K pages"))
        .map(|l| l.split_whitespace().skip(2).collect())
        .collect();
    assert_eq!(pages.len(), 2, "a write faults row and a time row:\n{text}");
    let median = write.class(faultscope::kernel::classes::ReportClass::WriteFaults).map(|s| s.median);
    for (i, p) in pages.iter().enumerate() {
        assert!(p.len() == 2 && p[0] == p[1], "{p:?}\n{text}");
        if i == 0 {
            let n: f64 = p[0].replace(',', "").parse().unwrap();
            assert_eq!(Some(n), median, "the row is the median of the runs\n{text}");
        }
    }
}
