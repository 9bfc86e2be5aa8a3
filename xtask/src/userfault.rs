//! The sleeping-fault guest case (`userfault4k@BACKEND` of the foundation
//! test): `fs-workload --userfault`, faults each held in the kernel by a
//! userfaultfd handler while another thread faults on the same CPUs. A
//! fault's state stays in its CPU's slot only while the thread runs there;
//! this case checks that a fault that slept is still counted once, in the
//! right mapping, and timed across its sleep: against the oracle, the
//! page arithmetic of each region, and the handler's hold.

use anyhow::{Context as _, Result};
use faultscope::{kernel::classes::ReportClass, report::schema::ClassValue};

use crate::{
    check::{self, against_oracle, case_outputs, region_rows, CaseResult, Checklist},
    vm,
};

/// The cases `foundation.sh` runs, one per backend.
pub const USERFAULT_CASES: [&str; 2] = ["userfault4k@kprobe", "userfault4k@fentry"];

pub fn check_userfault_case(run: &vm::GuestRun, case: &str) -> Result<CaseResult> {
    let (fs, wl, pid) = case_outputs(run, case)?;
    let p = check::process(&fs, pid).with_context(|| case.to_string())?;
    let (oracle, mut table, mut fails) = against_oracle(run, case, &fs, pid, &format!("{case} (pid {pid})"))?;
    let mut cl = Checklist::new(case, &mut table, &mut fails);
    let mut held_pages = 0;
    for r in region_rows(&mut cl, p, &oracle, &wl, &[ReportClass::Faults])? {
        let (role, pages) = (r.role, r.pages);
        // A held page: the call that waited returns VM_FAULT_RETRY and its
        // retry completes; the kernel may add one more retried call first
        // (a fault under the per-VMA lock retried under mmap_lock), so
        // each page completes once and is retried once or twice. A busy
        // page: one first touch per pass, completed once; the kernel may
        // retry a fault under mmap_lock that the per-VMA lock could not
        // finish (the VMA's first, which prepares its anon_vma; one that
        // met a held lock), at most once a pass here.
        let (faults, retry) = (r.get(ReportClass::Faults), r.get(ReportClass::Retry));
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
            let passes = r.region["passes"].as_u64().unwrap_or(0);
            let want = pages * passes;
            cl.expect(
                faults.checked_sub(retry) == Some(want) && retry <= passes,
                format!("{role}: faults {faults} less retry {retry} = {want}, retry at most one a pass ({passes})"),
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
