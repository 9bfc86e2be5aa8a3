//! A small bench report and the oracle's lines for it, for the tests of
//! the checks here and in xtask.

use std::collections::BTreeMap;

use faultscope::kernel::classes::ReportClass;
use serde_json::{json, Value};

/// Classes of the catalogue: the given counts (wp_faults = reuse + copy),
/// others 0, contpte not measurable (x86).
fn classes(faults: u64, reuse: u64, copy: u64) -> Value {
    let mut c = serde_json::Map::new();
    for m in ReportClass::ALL {
        let n = match m {
            ReportClass::Faults => faults,
            ReportClass::Reuse => reuse,
            ReportClass::Copy => copy,
            ReportClass::WpFaults => reuse + copy,
            _ => 0,
        };
        // Every fault not a write-protect one maps a new 4K folio.
        let new_folios = match m {
            ReportClass::NotPresent => Some(faults - reuse - copy),
            ReportClass::Copy => Some(copy),
            _ => None,
        };
        let v = if m.name().starts_with("contpte") {
            json!({"measurable": false, "reason": "arm64 only"})
        } else if let Some(f) = new_folios {
            let mut v = json!({"count": n.max(f), "source": "test",
                               "folios": {"sizes": {"4K": f}, "bytes": f * 4096}});
            // The copies are in a private file mapping.
            if m == ReportClass::Copy {
                v["sources"] = json!({"anon": 0, "file": copy, "file_exec": 0, "unattributed": 0});
            }
            v
        } else {
            json!({"count": n, "source": "test"})
        };
        c.insert(m.name().into(), v);
    }
    Value::Object(c)
}

fn phase(id: u64, name: &str, kind: &str, classes: Value) -> Value {
    json!({"id": id, "name": name, "kind": kind, "start_ns": id, "end_ns": id + 1,
           "children_alive": 0, "classes": classes})
}

/// `faultscope bench` of 16 4K pages by pid 7: populate, fork (its mark
/// and the fork's automatic phases), write.
pub fn bench_json() -> String {
    json!({
        "schema": "faultscope/1", "kernel": "6.12.0", "arch": "x86_64", "mode": "kprobe",
        "duration_ns": 9, "drops": {"lost_kretprobe_returns": 0},
        "probes": [{"program": "fault_return", "target": "handle_mm_fault", "attached": true,
                    "backend": "kretprobe"}],
        "processes": [{"pid": 7, "comm": "faultscope", "classes": classes(39, 20, 1), "phases": [
            phase(1, "mark:populate", "mark", classes(16, 0, 0)),
            phase(2, "mark:fork", "mark", classes(2, 0, 0)),
            phase(3, "fork#1 child-alive", "child-alive", classes(1, 0, 1)),
            phase(4, "fork#1 after-child-exit", "after-child-exit", classes(0, 0, 0)),
            phase(5, "mark:write", "mark", classes(20, 20, 0)),
        ]}],
        "bench": {
            "mode": "seq", "size": 65536, "folio": "4K", "mapping": "pte", "child": "exit",
            "threads": 1, "pages": 16, "folios": 16,
            "folio_check": {"blocks": 16, "whole_folios": 16, "pmd_mapped_bytes": 0},
            "pid": 7, "child_pid": 8,
            "steps": [{"name": "populate", "minflt": 16, "majflt": 0, "wall_ns": 1000},
                      {"name": "fork", "minflt": 3, "majflt": 0, "wall_ns": 2000},
                      {"name": "write", "minflt": 20, "majflt": 0, "wall_ns": 5000}],
        },
    })
    .to_string()
}

/// An oracle line of pid 7 as oracle.c prints it in an x86 guest: the
/// contpte classes unknown (`?`), nowp (not a class) 0.
pub fn oracle_line(phase: &str, faults: u64, reuse: u64, copy: u64) -> String {
    format!(
        "oracle tgid=7 phase={phase} faults={faults} wp_faults={} reuse={reuse} copy={copy} wp_shared=0 \
         spurious=0 huge_pmd_wp=0 contpte_unfold=? contpte_fold=? contpte_convert=? \
         contpte_try_unfold=? contpte_fold_attempt=? nowp=0 completed={faults}\n",
        reuse + copy
    )
}

/// The oracle's window line before a mark's `phase` (pid 7), empty: the
/// mark's two markers seen with no fault between them.
pub fn window_line(phase: &str) -> String {
    oracle_line(phase, 0, 0, 0).replacen("oracle ", "oracle-window ", 1)
}

/// oracle.c's lines in an x86 guest naming the events it misses.
pub const X86_UNKNOWN: &str = "oracle unknown contpte_unfold: conv\n\
                               oracle unknown contpte_fold: conv\n\
                               oracle unknown contpte_convert: conv\n\
                               oracle unknown contpte_try_unfold: unfold\n\
                               oracle unknown contpte_fold_attempt: fold\n";

/// The x86 guest's refusals (lib.sh), as the oracle reads them: no
/// contpte events.
pub fn x86_refused() -> BTreeMap<String, String> {
    ["unfold", "conv", "fold", "accc"].map(|e| (e.to_string(), "contpte is arm64 only".to_string())).into()
}
