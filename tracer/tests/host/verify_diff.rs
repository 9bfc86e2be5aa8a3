//! verify and diff over recorded reports: their checks, their refusals,
//! and verify's private run directory.

use super::*;

#[test]
fn verify_and_diff_over_recorded_reports() {
    let _t = host_test();
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
}

#[test]
fn verify_run_uses_a_private_directory_and_never_a_planted_one() {
    let _t = host_test();
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
        let child = Command::new(bin())
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
    let _t = host_test();
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

/// Inputs are read with a bound: a report file past it is refused before
/// it is read (a sparse 1 GiB file), and a device (`/dev/urandom`, which
/// never ends) is refused as no report; each with one line and exit 2.
#[test]
fn inputs_past_the_bound_or_devices_are_refused_unread() {
    let _t = host_test();
    let d = tmp();
    let big = d.path().join("big.json");
    std::fs::File::create(&big).unwrap().set_len(faultscope::report::file::MAX_INPUT + 1).unwrap();
    let out_svg = d.path().join("p.svg");
    for input in [big.to_str().unwrap(), "/dev/urandom"] {
        let why = if input == "/dev/urandom" { "character device" } else { "the most faultscope reads" };
        assert_refused(&faultscope(&["plot", input, "-o", out_svg.to_str().unwrap()]), why);
        assert_refused(&faultscope(&["diff", input, input]), why);
        assert_refused(&faultscope(&["verify", "--expect", "faults>0", input]), why);
    }
    assert!(!out_svg.exists());
}
