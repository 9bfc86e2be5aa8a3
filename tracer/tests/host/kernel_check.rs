//! The kernel check under loss: a run that dropped counts never derives
//! get_user_pages faults from them, and a kernel BTF that cannot be read
//! is refused, while one without the offsets of a thread's own fault count
//! leaves the check not made, and says why.

use super::*;

use faultscope::report::schema::CheckResult;

const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// `faultscope ARGS` with `file` bind-mounted over the kernel's BTF, in a
/// mount namespace of its own (private: nothing of it reaches the host's).
fn faultscope_with_btf(file: &Path, args: &[&str]) -> Output {
    let script = format!("mount --bind \"$1\" {VMLINUX} && shift && exec \"$@\"");
    Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(file)
        .arg(bin())
        .args(args)
        .output()
        .expect("running unshare")
}

/// The kernel's possible CPUs (each has its own pending slots of counts).
fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    s.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// `--max-stats 1` and more processes than every CPU's 16 pending slots
/// hold: counts are flushed into a stats map with room for one entry, and
/// dropped (`stats_map_full`). The kernel's count minus what was left is
/// not get_user_pages faults: no check is `derived`, and each says the
/// drops (with 436 drops the report said "65 faults without an exception
/// (get_user_pages)").
#[test]
fn a_run_with_dropped_counts_derives_nothing() {
    let _t = host_test();
    let d = tmp();
    let fs = d.path().join("fs.json");
    let n = 16 * possible_cpus() + 48;
    // Many short processes, and one that touches 1,024 pages (read(2)
    // writes dd's buffer).
    let script = format!("i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done; dd if=/dev/zero of=/dev/null bs=4M count=1 2>/dev/null");
    let out = faultscope(&[
        "record",
        "--max-stats",
        "1",
        "--follow-children",
        "--json",
        fs.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    let dropped = r.drops.of_counts();
    let dropped =
        dropped.as_deref().unwrap_or_else(|| panic!("{n} processes, 1 stats entry: no drop? {:?}", r.drops));
    assert!(dropped.contains("stats_map_full"), "{dropped}");
    let checked: Vec<_> = r.processes.iter().filter_map(|p| Some((p, p.kernel_check.as_ref()?))).collect();
    assert!(
        checked.len() > n / 2,
        "{} of {} processes have a kernel check",
        checked.len(),
        r.processes.len()
    );
    for (p, k) in &checked {
        assert_ne!(k.result, CheckResult::Derived, "pid {} ({}): {k:?}", p.pid, p.comm);
        assert_eq!(k.gup_derived, None, "pid {} ({}): {k:?}", p.pid, p.comm);
        match (r.mode, k.result) {
            // Kprobe mode: a process none of whose counts were dropped is
            // still equal; one that differs says the drops.
            (Mode::Kprobe, CheckResult::Equal | CheckResult::WithinBracket) => {}
            (_, CheckResult::NotChecked | CheckResult::Differs) => {
                let why = k.reason.as_deref().unwrap_or_default();
                assert!(
                    why.contains("stats_map_full"),
                    "pid {} ({}): the reason names the drops: {k:?}",
                    p.pid,
                    p.comm
                );
            }
            (mode, other) => panic!("{mode:?} mode, pid {} ({}): {other:?} with drops: {k:?}", p.pid, p.comm),
        }
    }
    // The tables say it too, on each process's line (on standard error:
    // the command has standard output).
    let text = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("kernel check:")).collect();
    assert_eq!(lines.len(), checked.len(), "{text}");
    assert!(!lines.iter().any(|l| l.contains("kernel check: derived")), "{lines:#?}");
    if r.mode == Mode::Tracepoint {
        assert!(lines.iter().all(|l| l.contains("stats_map_full")), "{lines:#?}");
    }
}

/// An empty and a truncated BTF are refused as a missing one is: one line, exit 2, nothing attached (the harness checks). The
/// run went on before, reading the kernel's count at unknown offsets ("the
/// kernel's min_flt+maj_flt 0: -2070 faults without an exception").
#[test]
fn an_unusable_btf_is_refused() {
    let _t = host_test();
    let d = tmp();
    let empty = d.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    // The real one cut after its header: its sections run past the end.
    let mut head = vec![0u8; 4000];
    std::fs::File::open(VMLINUX).unwrap().read_exact(&mut head).unwrap();
    let truncated = d.path().join("truncated");
    std::fs::write(&truncated, &head).unwrap();
    for (file, why) in [(&empty, "too short"), (&truncated, "past the end")] {
        let out = faultscope_with_btf(file, &["record", "--", "true"]);
        assert_refused(&out, VMLINUX);
        assert_refused(&out, why);
        assert_refused(&out, "CONFIG_DEBUG_INFO_BTF");
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    }
}

/// Well-formed BTF without `task_struct` (a header, no type): the run goes
/// on, but the kernel's own count of a thread cannot be read. Every
/// process's kernel check is not made, and says which offset is missing;
/// none is derived from the 0 the programs read instead.
#[test]
fn btf_without_the_count_offsets_leaves_the_check_not_made() {
    let _t = host_test();
    let d = tmp();
    let btf = d.path().join("notypes");
    // magic, version 1, flags 0; header 24 bytes; no types; a 1-byte
    // string section (the empty name).
    let mut b = vec![0x9f, 0xeb, 1, 0];
    for v in [24u32, 0, 0, 0, 1] {
        b.extend(v.to_le_bytes());
    }
    b.push(0);
    std::fs::write(&btf, &b).unwrap();
    let fs = d.path().join("fs.json");
    let out = faultscope_with_btf(
        &btf,
        &[
            "record",
            "--follow-children",
            "--json",
            fs.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "dd if=/dev/zero of=/dev/null bs=4M count=1 2>/dev/null; /bin/true",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("task_struct.min_flt"), "the start-up says it: {stderr}");
    let r = read_report(&fs);
    assert!(
        r.processes.len() >= 3,
        "sh, dd and true: {:?}",
        r.processes.iter().map(|p| &p.comm).collect::<Vec<_>>()
    );
    for p in &r.processes {
        let k = p
            .kernel_check
            .as_ref()
            .unwrap_or_else(|| panic!("pid {} ({}) has no kernel check", p.pid, p.comm));
        assert_eq!(k.result, CheckResult::NotChecked, "pid {} ({}): {k:?}", p.pid, p.comm);
        assert_eq!((k.kernel_low, k.gup_derived), (None, None), "{k:?}");
        let why = k.reason.as_deref().unwrap_or_default();
        assert!(why.contains("task_struct.min_flt"), "pid {} ({}): {why}", p.pid, p.comm);
    }
    // dd's 1,024 pages were counted all the same.
    assert!(r.processes.iter().any(|p| p.count(ReportClass::Faults).is_some_and(|n| n >= 1024)), "{r:#?}");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!text.contains("kernel check: derived"), "{text}");
}
