//! Attribution: measured, or said why not; stacks that cannot be counted
//! are refused, never an empty file.

use super::*;

// ---- attribution ----

/// In tracepoint mode (no kprobes on this host) per-mapping counts need the
/// handle_mm_fault kprobe: the report says so instead of showing none, and
/// the run still counts. Where kprobes work, the workload's region carries
/// its writes.
#[test]
fn attribution_is_measured_or_says_why_not() {
    let _t = host_test();
    let d = tmp();
    let (out, report, wl) = record_workload(d.path(), "16M");
    let info = report.attribution.as_ref().expect("the report says what it attributed");
    let p = process(&report, wl["pid"].as_u64().unwrap());
    match report.mode {
        Mode::Tracepoint => {
            assert!(!info.mappings);
            let why = info.mappings_reason.as_deref().unwrap_or("");
            assert!(why.contains("handle_mm_fault kprobe"), "{why}");
            assert!(String::from_utf8_lossy(&out.stderr).contains("per-mapping counts not measurable here"));
            assert!(p.attribution.mappings.is_empty());
            // copy and spurious cannot be measured here, so no sites either.
            assert!(info.site_classes.is_empty(), "{:?}", info.site_classes);
        }
        _ => {
            assert!(info.mappings);
            let pages = wl["pages"].as_u64().unwrap();
            let region = p.attribution.top_mapping(ReportClass::Reuse).expect("a mapping with reuse").1;
            assert!(region >= pages, "{region} < {pages}");
        }
    }
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
    let lost = r
        .drop_count(faultscope::report::schema::DropReason::Kernel(faultscope_common::maps::Drop::StackLost));
    let stacked: u64 = std::fs::read_to_string(&folded)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("write_faults;"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert!(stacked + lost >= writes && stacked <= writes, "stacks {stacked} + lost {lost} vs {writes}");
}
