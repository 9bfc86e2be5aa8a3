//! The sleeping-fault guest case (`userfault4k@BACKEND` of the foundation
//! test): `fs-workload --userfault`, faults each held in the kernel by a
//! userfaultfd handler while another thread faults on the same CPUs. A
//! fault's state stays in its CPU's slot only while the thread runs there;
//! this case checks that a fault that slept is still counted once, in the
//! right mapping, and timed across its sleep: against the oracle, the
//! page arithmetic of each region, and the handler's hold.

use anyhow::{bail, Context as _, Result};
use faultscope::{
    kernel::classes::ReportClass,
    report::schema::{ClassValue, Mode},
};

use crate::{
    check::{self, Checklist, Oracle},
    foundation::{case_outputs, run_is_clean, CaseResult},
    vm,
};

/// The cases `foundation.sh` runs, one per backend.
pub const USERFAULT_CASES: [&str; 2] = ["userfault4k@kprobe", "userfault4k@fentry"];

pub fn check_userfault_case(run: &vm::GuestRun, case: &str) -> Result<CaseResult> {
    let rc = run.marker("RC", case).unwrap_or_default();
    if rc != "0" {
        bail!(
            "{case}: faultscope exited with {rc:?}:\n{}",
            run.section(&format!("{case}.out")).unwrap_or("")
        );
    }
    let (mut table, mut fails) = (String::new(), Vec::new());
    let (fs, wl, pid) = case_outputs(run, case)?;
    let p = check::process(&fs, pid).with_context(|| case.to_string())?;
    let oracle = Oracle::from_run(run, &format!("{case}.oracle"))?;
    let cmp = oracle
        .compare(case, &p.classes, pid, "ALL")
        .with_context(|| format!("{case}: the oracle saw no faults of pid {pid}"))?;
    table.push_str(&format!("{case} (pid {pid})\n"));
    table.push_str(&cmp.table("class"));
    fails.extend(cmp.failures);
    fails.extend(run_is_clean(run, case, &fs));
    let mut cl = Checklist::new(case, &mut table, &mut fails);
    cl.expect(fs.mode == Mode::Kprobe, format!("mode {}", check::mode_name(&fs)));
    let regions = wl["regions"].as_array().context("workload regions")?;
    let mut held_pages = 0;
    for r in regions {
        let role = r["role"].as_str().unwrap_or("?");
        let (start, pages) = (r["start"].as_u64().unwrap_or(0), r["pages"].as_u64().unwrap_or(0));
        let Some(row) = p.attribution.mappings.iter().find(|m| m.start == start) else {
            cl.expect(false, format!("{role}: no mapping row starts at {start:#x}"));
            continue;
        };
        let got = |m: ReportClass| row.counts.get(&m).copied().unwrap_or(0);
        let own = oracle.range(pid, "ALL", role);
        let o = own.and_then(|l| l.get(ReportClass::Faults.name()).copied().flatten());
        cl.expect(
            o == Some(got(ReportClass::Faults)),
            format!("{role}: faults {} = oracle in its range {o:?}", got(ReportClass::Faults)),
        );
        // A held page: the call that waited returns VM_FAULT_RETRY and its
        // retry completes; the kernel may add one more retried call first
        // (a fault under the per-VMA lock retried under mmap_lock), so
        // each page completes once and is retried once or twice. A busy
        // page: one first touch per pass.
        let (faults, retry) = (got(ReportClass::Faults), got(ReportClass::Retry));
        if role == "held" {
            held_pages = pages;
            cl.expect(
                faults.checked_sub(retry) == Some(pages),
                format!(
                    "{role}: faults {faults} less retry {retry} = its {pages} pages, each completed once"
                ),
            );
            cl.expect(
                (pages..=2 * pages).contains(&retry),
                format!("{role}: retry {retry}, each page once or twice ({pages} to {})", 2 * pages),
            );
        } else {
            let want = pages * r["passes"].as_u64().unwrap_or(0);
            cl.expect(
                faults == want && retry == 0,
                format!("{role}: faults {faults} = {want}, retry {retry} = 0"),
            );
        }
    }
    // Each held fault's latency holds the handler's hold: its bucket ends
    // above it.
    let hold = wl["hold_ns"].as_u64().unwrap_or(0);
    let above = match p.classes.get(&ReportClass::Retry) {
        Some(ClassValue::Measured(m)) => {
            m.latency.as_ref().map(|l| l.buckets.iter().filter(|b| b[1] > hold).map(|b| b[2]).sum::<u64>())
        }
        _ => None,
    };
    cl.expect(
        above.is_some_and(|n| n >= held_pages),
        format!("retry: {above:?} faults timed at or above the {hold} ns hold, of {held_pages} held"),
    );
    Ok(CaseResult { table, failures: fails })
}
