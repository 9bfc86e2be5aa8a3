//! Attribution: measured, or said why not; stacks that cannot be counted
//! are refused, never an empty file.

use super::*;

// ---- attribution ----

/// Per-mapping counts in every mode: by the fault's VMA with kprobes; in
/// tracepoint mode by the VMA the kernel finds at the address, or by
/// address granules named from the maps snapshots (rows `exact: false`).
/// The workload's region carries its writes either way.
#[test]
fn attribution_is_measured_or_says_why_not() {
    let _t = host_test();
    let d = tmp();
    let (out, report, wl) = record_workload(d.path(), "16M");
    let info = report.attribution.as_ref().expect("the report says what it attributed");
    let p = process(&report, wl["pid"].as_u64().unwrap());
    let pages = wl["pages"].as_u64().unwrap();
    assert!(info.mappings, "{info:?}");
    // Every page written after the fork is a write-protect fault; with the
    // fault path probed, a reuse, but for the few the kernel copies (a
    // folio still in an LRU-add batch).
    let (class, copied) = match report.mode {
        Mode::Tracepoint => {
            assert!(String::from_utf8_lossy(&out.stderr).contains("per-mapping counts in tracepoint mode"));
            // copy and spurious cannot be measured here, so no sites either.
            assert!(info.site_classes.is_empty(), "{:?}", info.site_classes);
            (ReportClass::WpFaults, 0)
        }
        _ => (ReportClass::Reuse, faultscope_expect::LRU_BATCH_COPIES),
    };
    let (row, region) = p.attribution.top_mapping(class).expect("a mapping with the writes");
    assert!(region + copied >= pages, "{class} {region} + up to {copied} copied < {pages} pages");
    // Only a granule is inexact: tracepoint mode's (the VMA not found), or
    // an arm64 contpte event the kernel made outside a fault (munmap,
    // mprotect: no fault's VMA), counted in the row that holds its address.
    let granules = row.counts.keys().any(|c| c.name().starts_with("contpte"));
    assert!(row.exact || report.mode == Mode::Tracepoint || granules, "{row:?}");
}

/// The workload's three mappings (an anonymous region, a private file
/// mapping, pages added to [heap]; the workload lists their ranges): each
/// carries the write faults of its own pages after the fork, in every mode,
/// within the granules at their edges (tracepoint mode names address
/// granules, which a small mapping beside another can share). Where the
/// fault path is probed (reuse and copy measured), each region is also
/// checked whole (`faultscope_expect::mappings`): its row against the
/// oracle in its range (a guest), the copies by kind of mapping, the rows'
/// sums, and the sites, stacks and flame graph naming each region's writer.
#[test]
fn each_mapping_carries_its_own_pages_writes() {
    let _t = host_test();
    let d = tmp();
    let svg = d.path().join("m.svg");
    let probed = fault_path_probed();
    let mut record = Vec::new();
    if probed {
        record.extend([
            "--sites",
            "reuse,copy",
            "--stacks",
            "reuse,copy",
            "--flamegraph",
            svg.to_str().unwrap(),
        ]);
    }
    let workload_args = ["--size", "4M", "--thp", "never", "--child", "exit", "--mappings", "--linger", "1"];
    let (report, wl, traced) = record_traced(d.path(), &record, &workload_args);
    let p = process(&report, wl["pid"].as_u64().unwrap());
    let after = phase(p, "fork#1 after-child-exit");
    // Write faults of this phase by mapping: those with kprobes are COW
    // reuse or copy, in tracepoint mode write-protect faults.
    let class =
        if report.mode == Mode::Tracepoint { ReportClass::WpFaults } else { ReportClass::WriteFaults };
    let edge = faultscope_common::attrib::ADDR_GRANULE / 4096;
    for r in wl["regions"].as_array().unwrap() {
        let (start, end) = (r["start"].as_u64().unwrap(), r["end"].as_u64().unwrap());
        let pages = r["pages"].as_u64().unwrap();
        let row = after
            .attribution
            .mappings
            .iter()
            .find(|m| m.start <= start && end <= m.end)
            .unwrap_or_else(|| panic!("no mapping row holds {r}: {:#?}", after.attribution.mappings));
        let n = row.counts.get(&class).copied().unwrap_or(0);
        assert!(
            n + 2 * edge >= pages && n <= pages + 2 * edge + TOLERANCE,
            "{}: {n} {class} in {}, {pages} pages written",
            r["role"],
            row.mapping
        );
    }
    if !probed {
        return;
    }
    let (mut table, mut fails) = (String::new(), Vec::new());
    let mut cl = Checklist::new("mappings", &mut table, &mut fails);
    if let Some(t) = &traced {
        t.check(&mut cl, &report, p.pid);
    }
    let svg = std::fs::read_to_string(&svg).unwrap_or_default();
    // The guest's kernel config says (FAULTSCOPE_ANON_VMA_NAME, y or n).
    let anon_vma_name = std::env::var("FAULTSCOPE_ANON_VMA_NAME").ok().map(|v| v == "y");
    let oracle = traced.as_ref().map(|t| &t.oracle);
    let run = faultscope_expect::mappings::Run { oracle, anon_vma_name, workload: workload(), svg: &svg };
    faultscope_expect::mappings::check(&mut cl, p, &wl, &run);
    cl.getrusage(p, Workload(&wl).faults_since_exec());
    println!("{table}");
    assert!(fails.is_empty(), "{fails:#?}\n{table}");
}

/// Stacks of a class that cannot be counted here are said, and refused
/// with --folded rather than written empty.
#[test]
fn stacks_that_cannot_be_counted_are_said_not_written_empty() {
    let _t = host_test();
    let d = tmp();
    let (fs, folded) = (d.path().join("fs.json"), d.path().join("s.folded"));
    let out = faultscope(&["record", "--json", fs.to_str().unwrap(), "--stacks", "copy", "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    if r.mode == Mode::Tracepoint {
        let a = r.attribution.unwrap();
        assert!(a.stack_classes.is_empty(), "{a:?}");
        assert!(a.stacks_reason.unwrap().contains("copy"));
        let out =
            faultscope(&["record", "--stacks", "copy", "--folded", folded.to_str().unwrap(), "--", "true"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(!folded.exists());
    }
}

/// Sites and stacks of the classes every mode measures (here from the
/// exception tracepoint in tracepoint mode, from the fault path with
/// kprobes): the sites of write_faults, with the folded rest, sum to the
/// class's count, and dd's read(2) into its 8 MiB buffer (2,048 faults the
/// kernel takes for it) is one site, in read(2); the folded stacks sum to
/// the count, less the stacks lost.
#[test]
fn sites_and_stacks_of_write_faults_add_up_in_every_mode() {
    let _t = host_test();
    let d = tmp();
    let (fs, folded) = (d.path().join("fs.json"), d.path().join("s.folded"));
    let out = faultscope(&[
        "record",
        "--json",
        fs.to_str().unwrap(),
        "--sites",
        "write_faults",
        "--stacks",
        "write_faults",
        "--folded",
        folded.to_str().unwrap(),
        "--",
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=8M",
        "count=1",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    let p = &r.processes[0];
    let writes = count(p, ReportClass::WriteFaults);
    assert!(writes >= 2048, "{writes}");
    let a = &p.attribution;
    let sites: u64 = a.sites.iter().filter(|s| s.class == ReportClass::WriteFaults).map(|s| s.count).sum();
    let other: u64 =
        a.sites_other.iter().filter(|s| s.class == ReportClass::WriteFaults).map(|s| s.count).sum();
    assert_eq!(sites + other, writes, "sites {sites} + other {other} != write_faults {writes}");
    let read = a
        .sites
        .iter()
        .find(|s| s.class == ReportClass::WriteFaults && s.syscall.as_deref() == Some("read(2)"));
    assert!(read.is_some_and(|s| (2048..=2048 + TOLERANCE).contains(&s.count)), "{:#?}", a.sites);
    let lost = r.drop_count(faultscope::report::schema::DropReason::Kernel(
        faultscope_common::maps::DropKind::StackLost,
    ));
    let stacked: u64 = std::fs::read_to_string(&folded)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("write_faults;"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(stacked + lost >= writes && stacked <= writes, "stacks {stacked} + lost {lost} vs {writes}");
}

/// `--pprof`: `go tool pprof -top` reads the profile faultscope wrote and
/// finds what the report's stacks hold: the same total of write faults,
/// and each leaf function's faults (its frames' offsets merged) as the
/// report's stacks sum them.
#[test]
fn pprof_profiles_read_back_in_go_tool_pprof() {
    let _t = host_test();
    let d = tmp();
    let (fs, prof) = (d.path().join("fs.json"), d.path().join("p.pb.gz"));
    let out = faultscope(&[
        "record",
        "--json",
        fs.to_str().unwrap(),
        "--stacks",
        "write_faults",
        "--pprof",
        prof.to_str().unwrap(),
        "--",
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=4M",
        "count=1",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    let mut by_leaf: std::collections::BTreeMap<String, u64> = Default::default();
    for s in r.processes[0].attribution.stacks.iter().filter(|s| s.class == ReportClass::WriteFaults) {
        let leaf = s.kernel.last().or(s.user.last()).unwrap();
        let func = leaf.split(" (").next().unwrap().rsplit_once("+0x").map_or(leaf.as_str(), |(f, _)| f);
        *by_leaf.entry(func.to_string()).or_default() += s.count;
    }
    let total: u64 = by_leaf.values().sum();
    assert!(total >= 1024, "{by_leaf:?}");
    let top = Command::new("go")
        .args(["tool", "pprof", "-top", "-nodecount=1000", "-nodefraction=0", "-sample_index=write_faults"])
        .arg(&prof)
        .env("HOME", d.path())
        .output()
        .expect("go (golang-go, installed by cargo xtask setup)");
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{text}{}", String::from_utf8_lossy(&top.stderr));
    assert!(text.contains(&format!("of {total} total")), "total {total}:\n{text}");
    for (func, n) in &by_leaf {
        let row = text.lines().find(|l| l.trim_end().ends_with(&format!(" {func}")));
        let flat = row.and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok());
        assert_eq!(flat, Some(*n), "{func}:\n{text}");
    }
}

/// The end of a `--stacks` run names every stack's kernel frames from one
/// parse of /proc/kallsyms (it is 100,000+ lines: parsed once per stack, a
/// run of `true` took seconds, deaf to signals). Counted by the run's own
/// opens of the file under strace, against the stacks it wrote.
#[test]
fn kallsyms_is_read_once_per_run() {
    let _t = host_test();
    let d = tmp();
    let (fs, log) = (d.path().join("fs.json"), d.path().join("strace.log"));
    let out = Command::new("strace")
        .args(["-f", "-qq", "-e", "trace=openat,open", "-o"])
        .arg(&log)
        .args([bin(), "record", "--json", fs.to_str().unwrap(), "--stacks", "faults", "--"])
        .args(["sh", "-c", "ls / > /dev/null; cat /dev/null; true"])
        .output()
        .expect("strace (cargo xtask setup installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stacks: usize = read_report(&fs).processes.iter().map(|p| p.attribution.stacks.len()).sum();
    assert!(stacks >= 3, "a run with several stacks: {stacks}");
    let opens =
        std::fs::read_to_string(&log).unwrap().lines().filter(|l| l.contains("\"/proc/kallsyms\"")).count();
    assert!(opens <= 2, "/proc/kallsyms opened {opens} times for {stacks} stacks");
}

/// The user-stack walks of `--stacks` read the target's stack with page
/// faults disabled; the CPU raises a kernel-mode exception for each page
/// it cannot read, which the kernel never handles nor counts. faultscope
/// counts none of them either: with stacks, every process of a compile has
/// the kernel's own count (no negative "faults without an exception"), as
/// without.
#[test]
fn stacks_add_no_faults_of_their_own() {
    let _t = host_test();
    let d = tmp();
    let src = d.path().join("hello.c");
    std::fs::write(&src, "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n").unwrap();
    let bin = d.path().join("hello");
    for stacks in [false, true] {
        let fs = d.path().join(format!("fs-{stacks}.json"));
        let mut args = vec!["record", "--follow-children", "--json", fs.to_str().unwrap()];
        if stacks {
            args.extend(["--stacks", "faults"]);
        }
        args.extend(["--", "gcc", "-O2", "-o", bin.to_str().unwrap(), src.to_str().unwrap()]);
        let out = faultscope(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let r = read_report(&fs);
        assert!(r.processes.len() >= 2, "gcc and its cc1 at least: {}", r.processes.len());
        for p in r.processes.iter().filter(|p| p.kernel_check.is_some()) {
            let (kernel, gup) = kernel_check(p);
            assert!(
                gup >= -4,
                "--stacks {stacks}: {} counted {} faults, the kernel {kernel}",
                p.comm,
                count(p, ReportClass::Faults)
            );
        }
    }
}

/// A stack whose hash bucket in the stack map holds another is lost, and
/// said: counted in `drops`, with the option that makes the map larger.
/// With one entry every stack after the first is lost; the map is as
/// large as asked, and the default otherwise.
#[test]
fn lost_stacks_are_counted_and_the_map_is_sized_as_asked() {
    let _t = host_test();
    let d = tmp();
    let lost = faultscope::report::schema::DropReason::Kernel(faultscope_common::maps::DropKind::StackLost);
    for (max, entries) in [(Some("1"), 1), (None, faultscope::kernel::footprint::STACK_ENTRIES as u64)] {
        let fs = d.path().join("fs.json");
        let mut args = vec!["record", "--json", fs.to_str().unwrap(), "--stacks", "faults"];
        if let Some(m) = max {
            args.extend(["--max-stacks", m]);
        }
        args.extend(["--", "sh", "-c", "ls / > /dev/null; cat /dev/null; true"]);
        let out = faultscope(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let r = read_report(&fs);
        let m = r.kernel_memory.as_ref().expect("kernel_memory");
        assert_eq!(m.maps["STACK_TRACES"].entries, entries);
        let stacks: usize = r.processes.iter().map(|p| p.attribution.stacks.len()).sum();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        if max.is_some() {
            assert!(r.drops.get(lost) > 0, "one entry, {stacks} stacks: none lost?");
            assert!(text.contains("rerun with a larger --max-stacks"), "{text}");
        } else {
            assert!(stacks >= 3, "a run with several stacks: {stacks}");
        }
    }
}
