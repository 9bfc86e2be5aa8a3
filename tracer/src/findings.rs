//! Diagnosis: rules that turn a report's counts into plain findings, each
//! with the numbers it rests on.

use serde::Serialize;
use serde_json::{json, Value};

use crate::{
    folio,
    reportfile::{class, count, phases, ClassValue, Report},
};

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Finding {
    pub rule: &'static str,
    pub pid: u64,
    pub phase: String,
    pub text: String,
    pub numbers: Value,
}

/// COW copies while a child lives that are worth saying.
const COPY_NOTABLE: u64 = 16;

/// A stretch of a process's run the rules look at: one phase, or a bench
/// step (its mark and the automatic phases up to the next mark).
struct Span {
    name: String,
    classes: Value,
    /// Some phase of the span had a forked child sharing the memory.
    child_alive: bool,
}

/// Sums the class counts of several phases (measurability from the first).
fn sum_classes(ps: &[&Value]) -> Value {
    let mut out = ps.first().map(|p| p["classes"].clone()).unwrap_or(json!({}));
    if let Some(obj) = out.as_object_mut() {
        for (name, v) in obj.iter_mut() {
            if v.get("count").is_some() {
                let total: u64 = ps.iter().filter_map(|p| count(&p["classes"], name)).sum();
                v["count"] = json!(total);
            }
        }
    }
    out
}

fn spans(p: &Value) -> Vec<Span> {
    let ph = phases(p);
    if ph.is_empty() {
        return vec![Span { name: "whole run".into(), classes: p["classes"].clone(), child_alive: false }];
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < ph.len() {
        let name = ph[i]["name"].as_str().unwrap_or("").to_string();
        let mut j = i + 1;
        if name.starts_with("mark:") {
            while j < ph.len() && !ph[j]["name"].as_str().unwrap_or("").starts_with("mark:") {
                j += 1;
            }
        }
        let child_alive = ph[i..j].iter().any(|x| x["name"].as_str().unwrap_or("").contains("child-alive"));
        out.push(Span { name, classes: sum_classes(&ph[i..j]), child_alive });
        i = j;
    }
    out
}

/// The class counts of the span named `name` (a bench step such as
/// `mark:write`, or a phase name), for verify and diff.
pub fn span_classes(p: &Value, name: &str) -> Option<Value> {
    spans(p).into_iter().find(|s| s.name == name).map(|s| s.classes)
}

/// Span names of a process, in order.
pub fn span_names(p: &Value) -> Vec<String> {
    spans(p).into_iter().map(|s| s.name).collect()
}

pub fn findings(r: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    let folio = r.folio_bytes().filter(|f| *f > folio::PAGE);
    let bench = r.bench();
    let child_exited = bench.is_some_and(|b| b["child"] == "exit");
    for p in r.processes() {
        let pid = p["pid"].as_u64().unwrap_or(0);
        for s in spans(p) {
            let c = &s.classes;
            let mut add = |rule, text: String, numbers: Value| {
                out.push(Finding { rule, pid, phase: s.name.clone(), text, numbers })
            };
            let reuse = count(c, "reuse").unwrap_or(0);
            let copy = count(c, "copy").unwrap_or(0);
            let is_write_step = s.name == "mark:write";
            if let (Some(f), Some(b), true) = (folio, bench, is_write_step) {
                let folios = b["folios"].as_u64().unwrap_or(0).max(1);
                let per = f / folio::PAGE;
                let label = folio::human(f);
                if reuse as f64 / folios as f64 >= 2.0 {
                    add(
                        "large-folio-reuse-per-page",
                        format!(
                            "{label} folios are reused page by page: {:.1} reuse faults per folio ({reuse} for {folios} folios of {per} pages); reusing the whole exclusive folio would take 1 per folio",
                            reuse as f64 / folios as f64
                        ),
                        json!({"reuse": reuse, "folios": folios, "pages_per_folio": per}),
                    );
                }
                if child_exited && copy as f64 / folios as f64 >= 2.0 {
                    add(
                        "large-folio-copy-after-exit",
                        format!(
                            "{label} folios are copied page by page after fork although the child has exited: {copy} copies, {:.1} per folio; this kernel does not reuse large anonymous folios",
                            copy as f64 / folios as f64
                        ),
                        json!({"copy": copy, "folios": folios}),
                    );
                }
            }
            if let Some(sp) = count(c, "spurious").filter(|n| *n > 0) {
                let present = count(c, "wp_faults").unwrap_or(0) + count(c, "huge_pmd_wp").unwrap_or(0) + sp;
                let pct = 100.0 * sp as f64 / present as f64;
                add(
                    "spurious-write-faults",
                    format!(
                        "spurious write faults were {pct:.1}% of write faults on present pages ({sp} of {present}): the PTE was already writable; likely stale read-only TLB entries (pages read since fork, or stores run ahead speculatively while an earlier store faulted), or threads racing on the same pages"
                    ),
                    json!({"spurious": sp, "present_write_faults": present, "percent": pct}),
                );
            }
            if let Some(unfold) = count(c, "contpte_unfold").filter(|n| *n > 0) {
                // Folds anywhere later in the run count as "folded again".
                let folded = count(&p["classes"], "contpte_fold");
                let tail = match folded {
                    Some(0) => ", and none was folded again in the run".to_string(),
                    Some(n) => format!(", and {n} blocks were folded in the run"),
                    None => String::new(),
                };
                let via = count(c, "contpte_try_unfold")
                    .map(|t| format!(", {t} through __contpte_try_unfold"))
                    .unwrap_or_default();
                add(
                    "contpte-unfold",
                    format!("{unfold} contpte blocks were unfolded{via}{tail}"),
                    json!({"contpte_unfold": unfold, "contpte_fold": folded}),
                );
            }
            // Write-protect faults that are not COW at all: a reader who
            // sums reuse + copy would miss them.
            if let Some(shared) = count(c, "wp_shared").filter(|n| *n > 0) {
                add(
                    "shared-write-notify",
                    format!(
                        "{shared} write-protect faults were on shared mappings (write-notify for dirty tracking: writeback, soft-dirty or page_mkwrite), not COW reuse or copy"
                    ),
                    json!({"wp_shared": shared, "wp_faults": count(c, "wp_faults")}),
                );
            }
            // A handful of copies is the process's own bookkeeping after
            // fork (stack, heap), not a finding.
            if copy >= COPY_NOTABLE && s.child_alive {
                add(
                    "copy-while-child-alive",
                    format!("{copy} COW copies while a forked child shared the memory"),
                    json!({"copy": copy}),
                );
            }
        }
        // Once per process: what could not be measured.
        for name in ["reuse", "copy", "spurious"] {
            if let ClassValue::NotMeasurable(why) = class(&p["classes"], name) {
                out.push(Finding {
                    rule: "not-measurable",
                    pid,
                    phase: "whole run".into(),
                    text: format!("{name} is not measurable on this kernel: {why}"),
                    numbers: json!({"class": name}),
                });
            }
        }
    }
    out
}

/// Adds `findings[]` to a report being written; returns them as text.
pub fn attach(report: &mut Value) -> String {
    let f = match Report::from_json(String::new(), report.clone()) {
        Ok(r) => findings(&r),
        Err(e) => return format!("Findings: none (report not checkable: {e})\n"),
    };
    report["findings"] = serde_json::to_value(&f).unwrap_or_default();
    to_text(&f)
}

pub fn to_text(f: &[Finding]) -> String {
    let mut s = String::from("Findings:\n");
    if f.is_empty() {
        s.push_str("  none\n");
    }
    for x in f {
        s.push_str(&format!("  [{}] pid {} {}: {}\n", x.rule, x.pid, x.phase, x.text));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(folio: &str, child: &str, write: Value) -> Report {
        let j = json!({
            "schema": "faultscope/1",
            "bench": {"folio": folio, "folios": 1024, "child": child},
            "processes": [{"pid": 9, "classes": write.clone(), "phases": [
                {"name": "mark:fork", "classes": {"copy": {"count": 0}}},
                {"name": "fork#1 child-alive", "classes": {"copy": {"count": 30}}},
                {"name": "mark:write", "classes": write},
            ]}]
        });
        Report::from_json("t".into(), j).unwrap()
    }

    fn rules(r: &Report) -> Vec<&'static str> {
        findings(r).iter().map(|f| f.rule).collect()
    }

    #[test]
    fn reuse_page_by_page() {
        let r = report(
            "64K",
            "exit",
            json!({"reuse": {"count": 16384}, "copy": {"count": 2}, "spurious": {"count": 0}}),
        );
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "large-folio-reuse-per-page").unwrap();
        assert_eq!(x.phase, "mark:write");
        assert!(x.text.contains("16.0 reuse faults per folio"), "{}", x.text);
        // 4K pages: nothing to say about reuse.
        let r = report("4K", "exit", json!({"reuse": {"count": 16384}}));
        assert!(!rules(&r).contains(&"large-folio-reuse-per-page"));
    }

    #[test]
    fn copy_after_exit() {
        let r = report("64K", "exit", json!({"reuse": {"count": 10}, "copy": {"count": 16390}}));
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "large-folio-copy-after-exit").unwrap();
        assert!(x.text.contains("16.0 per folio"), "{}", x.text);
        // With the child alive, copies are expected: no such finding.
        let r = report("64K", "alive", json!({"copy": {"count": 16390}}));
        assert!(!rules(&r).contains(&"large-folio-copy-after-exit"));
    }

    #[test]
    fn shared_write_notify_is_said_apart_from_cow() {
        let r = report("4K", "exit", json!({"wp_faults": {"count": 4100}, "wp_shared": {"count": 4096}}));
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "shared-write-notify").unwrap();
        assert_eq!(x.phase, "mark:write");
        assert!(x.text.starts_with("4096 write-protect faults were on shared mappings"), "{}", x.text);
        assert_eq!(x.numbers["wp_faults"], 4100);
        let r = report("4K", "exit", json!({"wp_shared": {"count": 0}}));
        assert!(!rules(&r).contains(&"shared-write-notify"));
    }

    #[test]
    fn spurious_share() {
        let r = report(
            "4K",
            "exit",
            json!({"wp_faults": {"count": 900}, "spurious": {"count": 100}, "huge_pmd_wp": {"count": 0}}),
        );
        let f = findings(&r);
        let x = f.iter().find(|f| f.rule == "spurious-write-faults").unwrap();
        assert!(
            x.text.starts_with(
                "spurious write faults were 10.0% of write faults on present pages (100 of 1000)"
            ),
            "{}",
            x.text
        );
    }

    #[test]
    fn contpte_never_folded() {
        let r = report(
            "64K",
            "exit",
            json!({"contpte_unfold": {"count": 512}, "contpte_fold": {"count": 0}, "contpte_try_unfold": {"count": 0}}),
        );
        let x = findings(&r).into_iter().find(|f| f.rule == "contpte-unfold").unwrap();
        assert!(
            x.text.starts_with("512 contpte blocks were unfolded, 0 through __contpte_try_unfold, and none was folded again in the run"),
            "{}",
            x.text
        );
        let r =
            report("64K", "exit", json!({"contpte_unfold": {"count": 512}, "contpte_fold": {"count": 88}}));
        let x = findings(&r).into_iter().find(|f| f.rule == "contpte-unfold").unwrap();
        assert!(x.text.contains("and 88 blocks were folded in the run"), "{}", x.text);
    }

    #[test]
    fn copies_while_child_alive_and_not_measurable() {
        let mut r =
            report("64K", "exit", json!({"spurious": {"measurable": false, "reason": "no kprobe PMU"}}));
        let f = findings(&r);
        assert!(f.iter().any(|f| f.rule == "copy-while-child-alive"
            && f.phase == "mark:fork"
            && f.text.starts_with("30 COW")));
        assert!(f.iter().any(|f| f.rule == "not-measurable" && f.text.contains("no kprobe PMU")));
        r.json["processes"][0]["classes"] = json!({});
        assert!(!rules(&r).contains(&"not-measurable"));
        // A few copies (the process's own stack and heap) are not a finding.
        r.json["processes"][0]["phases"][1]["classes"]["copy"]["count"] = json!(3);
        assert!(!rules(&r).contains(&"copy-while-child-alive"));
    }
}
