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

/// Attribution that cannot be done here (tracepoint mode) is said, and no
/// empty folded file stands for it.
#[test]
fn stacks_that_cannot_be_counted_are_said_not_written_empty() {
    let _t = host_test();
    let d = tmp();
    let (fs, folded) = (d.path().join("fs.json"), d.path().join("s.folded"));
    let out = faultscope(&["record", "--json", fs.to_str().unwrap(), "--stacks", "faults", "--", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = read_report(&fs);
    if r.mode == Mode::Tracepoint {
        let a = r.attribution.unwrap();
        assert!(a.stack_classes.is_empty(), "{a:?}");
        assert!(a.stacks_reason.unwrap().contains("faults"));
        assert!(String::from_utf8_lossy(&out.stderr).contains("--stacks: not attributed: faults"));
        let out =
            faultscope(&["record", "--stacks", "faults", "--folded", folded.to_str().unwrap(), "--", "true"]);
        assert_eq!(out.status.code(), Some(2));
        assert!(!folded.exists());
    }
}
