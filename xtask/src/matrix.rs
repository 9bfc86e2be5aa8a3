//! The kernel matrix: `faultscope bench` cases in guests of every kernel x
//! arch, each compared, per bench phase, with the tracefs oracle of the same
//! run and with the workload's page arithmetic.

use std::{collections::BTreeMap, fmt::Write as _};

use anyhow::{Context as _, Result};
use serde_json::Value;

use crate::vm::GuestRun;

use crate::foundation::{oracle_unknown, ORACLE_COLUMNS};

/// Faults of the bench's own pages (stack, heap) in its write phase: 0-4
/// with the child gone; with the child alive every such page is copied
/// too (4-9 seen across the matrix). The oracle comparison stays exact.
pub const SLACK: u64 = 16;

/// Why the oracle of `section` has no counts for (`pid`, `phase`): its own
/// summary line (trace lines, unknown tgids, exec'd pids, phase markers
/// seen) and the trace buffer's overrun, so that a failed run says whether
/// the trace lost the process, the marker, or the whole section.
pub fn oracle_gap(run: &GuestRun, case: &str, section: &str, pid: u64, phase: &str) -> String {
    let text = run.section(section).unwrap_or("");
    let summary = text.lines().find(|l| l.starts_with("oracle:")).unwrap_or("no oracle summary line");
    let overrun = run.marker("OVERRUN", case).unwrap_or_else(|| "not reported".into());
    let out = run.section(&format!("{case}.out")).map(|o| crate::vm::tail(o, 15)).unwrap_or_default();
    format!(
        "the oracle has no {phase} phase for pid {pid} ({summary}; trace buffer overrun {overrun}); \
         oracle section:\n{text}faultscope's output:\n{out}"
    )
}

/// `oracle tgid=N phase=P k=v...` lines, by (tgid, phase).
pub fn parse_oracle(text: &str) -> BTreeMap<(u64, String), BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("oracle ") else { continue };
        let mut tgid = None;
        let mut phase = None;
        let mut counts = BTreeMap::new();
        for kv in rest.split_whitespace() {
            let Some((k, v)) = kv.split_once('=') else { continue };
            match k {
                "tgid" => tgid = v.parse().ok(),
                "phase" => phase = Some(v.to_string()),
                _ => {
                    if let Ok(n) = v.parse() {
                        counts.insert(k.to_string(), n);
                    }
                }
            }
        }
        if let (Some(t), Some(p)) = (tgid, phase) {
            out.insert((t, p), counts);
        }
    }
    out
}

/// faultscope's counts of a bench step (its mark and the automatic phases up
/// to the next mark); `None` for a class not measurable there.
pub fn step_counts(report: &Value, pid: u64, step: &str) -> Result<BTreeMap<String, Option<u64>>> {
    let p = crate::foundation::report_process(report, pid)?;
    let phases = p["phases"].as_array().context("no phases")?;
    let i = phases.iter().position(|ph| ph["name"] == step).with_context(|| format!("no phase {step}"))?;
    let span: Vec<&Value> = std::iter::once(&phases[i])
        .chain(
            phases[i + 1..].iter().take_while(|ph| !ph["name"].as_str().unwrap_or("").starts_with("mark:")),
        )
        .collect();
    let mut out = BTreeMap::new();
    for (class, _, _) in ORACLE_COLUMNS {
        let measurable = span[0]["classes"][class]["measurable"] != false;
        let n: u64 = span.iter().filter_map(|ph| ph["classes"][class]["count"].as_u64()).sum();
        out.insert(class.to_string(), measurable.then_some(n));
    }
    Ok(out)
}

pub struct CaseResult {
    pub table: String,
    pub failures: Vec<String>,
}

/// Checks one bench case of a guest run. An error is the harness's (the
/// guest printed no results for the case); wrong counts are `failures`.
pub fn check_case(run: &GuestRun, kernel: &str, case: &str) -> Result<CaseResult> {
    let mut fails = Vec::new();
    let rc = run
        .marker("RC", case)
        .with_context(|| format!("{kernel} {case}: the guest printed no exit status for the bench"))?;
    if rc != "0" {
        // faultscope's own failure: a result, never rerun.
        let out = run.section(&format!("{case}.out")).unwrap_or("");
        let failures = vec![format!("{kernel} {case}: bench exited with {rc:?}:\n{out}")];
        return Ok(CaseResult { table: String::new(), failures });
    }
    let report: Value = serde_json::from_str(run.section(&format!("{case}.json"))?).context("bench JSON")?;
    let sec = format!("{case}.oracle");
    let oracle = parse_oracle(run.section(&sec)?);
    let b = &report["bench"];
    let pid = b["pid"].as_u64().context("bench pid")?;
    let pages = b["pages"].as_u64().unwrap_or(0);
    let folios = b["folios"].as_u64().unwrap_or(0);
    let write_minflt = b["phases"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == "write"))
        .and_then(|p| p["minflt"].as_u64())
        .unwrap_or(0);
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{kernel} {case}: {pages} pages, {folios} folios of {}, write-phase getrusage minflt {write_minflt}, guest wall {:.1}s",
        b["folio"].as_str().unwrap_or("?"),
        run.wall.as_secs_f64()
    );
    // Every bench step, phase by phase, against the oracle's counts between
    // the same trace markers.
    let steps = ["mark:populate", "mark:fork", "mark:write"];
    let _ = write!(table, "  {:<20}", "faultscope/oracle");
    for st in steps {
        let _ = write!(table, " {st:>21}");
    }
    table.push('\n');
    let mut per_step = Vec::new();
    for st in steps {
        let mine = step_counts(&report, pid, st)?;
        let theirs = oracle
            .get(&(pid, st.to_string()))
            .with_context(|| format!("{kernel} {case}: {}", oracle_gap(run, case, &sec, pid, st)))?
            .clone();
        per_step.push((mine, theirs));
    }
    for (class, col, events) in ORACLE_COLUMNS {
        let _ = write!(table, "  {class:<20}");
        for (st, (mine, theirs)) in steps.iter().zip(&per_step) {
            let f = mine[class];
            // Unknown to the oracle (a refused event) is not 0: then
            // faultscope must say "not measurable" too.
            let o = if oracle_unknown(run, events).is_empty() { theirs.get(col).copied() } else { None };
            let show = |v: Option<u64>, none: &str| v.map(|v| v.to_string()).unwrap_or_else(|| none.into());
            let _ = write!(table, " {:>21}", format!("{}/{}", show(f, "n/m"), show(o, "-")));
            if f != o {
                fails.push(format!("{kernel} {case} {st}: {class} faultscope {f:?} != oracle {o:?}"));
            }
        }
        table.push('\n');
    }
    let (mine, theirs) = (&per_step[2].0, &per_step[2].1);
    let get = |c: &str| mine[c].unwrap_or(0);
    let within = |v: u64, want: u64| (want..=want + SLACK).contains(&v);
    let mut expect = |ok: bool, what: String| {
        let _ = writeln!(table, "  {} {what}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            fails.push(format!("{kernel} {case}: {what}"));
        }
    };
    let folio = b["folio"].as_str().unwrap_or("");
    match case {
        "4k-exit" => {
            expect(within(get("reuse"), pages), format!("reuse {} = pages {pages} (+{SLACK})", get("reuse")))
        }
        "64k-exit" | "2m-pte-exit" => {
            let (r, c) = (get("reuse"), get("copy"));
            expect(
                within(r + c, pages),
                format!(
                    "reuse {r} + copy {c} = pages {pages}: this kernel {} {folio} folios page by page",
                    if c > r { "copies" } else { "reuses" }
                ),
            );
        }
        "2m-pmd-exit" => {
            expect(
                within(get("huge_pmd_wp"), folios),
                format!("huge_pmd_wp {} = THPs {folios}", get("huge_pmd_wp")),
            );
        }
        "4k-alive" | "64k-alive" => {
            expect(within(get("copy"), pages), format!("copy {} = pages {pages} (child alive)", get("copy")))
        }
        "spurious-race" => {
            let sp = get("spurious");
            expect(
                true,
                format!(
                    "spurious write faults from 4 threads racing: {sp} (oracle {:?})",
                    theirs.get("spurious")
                ),
            );
        }
        _ => {}
    }
    if b["mapping"] == "pte" && folio == "64K" && mine["contpte_unfold"].is_some() && case == "64k-exit" {
        let u = get("contpte_unfold");
        expect(u == folios, format!("contpte_unfold {u} = 64K blocks written {folios}"));
    }
    if run.marker("OVERRUN", case).as_deref() != Some("0") {
        fails.push(format!("{kernel} {case}: the oracle's trace buffer overran"));
    }
    Ok(CaseResult { table, failures: fails })
}

/// `faultscope verify --expect contpte_unfold=0` over the write phase of the
/// 64K and 4K runs: on arm64 it must fail (exit 1, count printed) where the
/// kernel unfolded and pass where it did not; on x86 the class is not
/// measurable (exit 3).
fn check_verify(run: &GuestRun, k: crate::kernels::GuestKernel) -> Vec<String> {
    let mut fails = Vec::new();
    for case in ["64k-exit", "4k-exit"] {
        let Some(rc) = run.marker("VERIFY", case) else { continue };
        let out = run.section(&format!("verify-{case}")).unwrap_or("").trim().to_string();
        let unfolds = run
            .section(&format!("{case}.json"))
            .ok()
            .and_then(|j| serde_json::from_str::<Value>(j).ok())
            .and_then(|r| step_counts(&r, r["bench"]["pid"].as_u64()?, "mark:write").ok())
            .and_then(|m| m["contpte_unfold"]);
        let want = match (k.arch, unfolds) {
            ("arm64", Some(0)) => "0",
            ("arm64", Some(_)) => "1",
            _ => "3",
        };
        println!("{} verify contpte_unfold=0 on {case}: exit {rc} (want {want}): {out}", k.name);
        if rc != want {
            fails.push(format!("{} verify on {case}: exit {rc}, want {want}: {out}", k.name));
        }
        if want == "1" && !out.contains(&format!("contpte_unfold is {}", unfolds.unwrap_or(0))) {
            fails.push(format!("{} verify on {case} does not print the count: {out}", k.name));
        }
    }
    fails
}

/// Checks `cases` of a guest run: prints their tables, adds wrong counts to
/// `failures`, and returns the harness errors (case, error) of cases that
/// left no results.
fn check_cases(
    run: &GuestRun,
    kernel: &str,
    cases: &[String],
    failures: &mut Vec<String>,
) -> Vec<(String, String)> {
    let mut harness_errors = Vec::new();
    for case in cases {
        match check_case(run, kernel, case) {
            Ok(r) => {
                print!("{}", r.table);
                failures.extend(r.failures);
            }
            Err(e) => harness_errors.push((case.clone(), format!("{e:#}"))),
        }
    }
    harness_errors
}

/// Prints the guest kernel's warnings of a run, if it had any.
fn print_complaints(run: &GuestRun) {
    let c = run.kernel_complaints();
    if !c.is_empty() {
        println!("  the guest kernel warned:\n    {}", c.join("\n    "));
    }
}

/// Cases run on every kernel by default (`cargo xtask test`).
pub const DEFAULT_CASES: &[&str] =
    &["4k-exit", "64k-exit", "2m-pte-exit", "2m-pmd-exit", "4k-alive", "spurious-race"];

/// Boots each kernel once and runs `cases` in it.
pub fn run(kernels: &[crate::kernels::GuestKernel], size: &str, cases: &[String]) -> Result<()> {
    use crate::{kernels, root, vm};
    let mut failures = Vec::new();
    for &k in kernels {
        let vmlinuz = kernels::fetch(k)?;
        let bin = vm::build_faultscope(k.arch)?;
        let dir = root().join("target/vm/matrix").join(k.name);
        std::fs::create_dir_all(&dir)?;
        let boot = |cases: &[String]| -> Result<GuestRun> {
            let env = [("SIZE", size.to_string()), ("CASES", cases.join(" "))];
            let cpio = vm::initramfs(&dir, k.arch, &bin, "matrix.sh", &env)?;
            vm::boot(k, &vmlinuz, &cpio, &dir, std::time::Duration::from_secs(900))
        };
        let run = boot(cases)?;
        let harness_errors = check_cases(&run, k.name, cases, &mut failures);
        failures.extend(check_verify(&run, k));
        println!("guest {} ran {} cases in {:.1}s", k.name, cases.len(), run.wall.as_secs_f64());
        print_complaints(&run);
        // A case without results (no bench output, no oracle counts for it)
        // measured nothing, right or wrong: it runs once more in a fresh
        // guest, and the first error stays in the log. Count mismatches are
        // never rerun.
        if !harness_errors.is_empty() {
            let again: Vec<String> = harness_errors.iter().map(|(c, _)| c.clone()).collect();
            for (_, e) in &harness_errors {
                println!("HARNESS ERROR (the case runs again in a new guest): {e}");
            }
            let rerun = boot(&again)?;
            for (_, e) in check_cases(&rerun, k.name, &again, &mut failures) {
                failures.push(format!("{e} (twice)"));
            }
            println!("guest {} reran {} cases in {:.1}s", k.name, again.len(), rerun.wall.as_secs_f64());
            print_complaints(&rerun);
        }
    }
    if !failures.is_empty() {
        anyhow::bail!("matrix failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oracle_lines() {
        let o = parse_oracle(
            "oracle tgid=5 phase=ALL faults=3 wp=1\noracle tgid=5 phase=mark:write faults=2 wp=1\njunk\n",
        );
        assert_eq!(o[&(5, "mark:write".to_string())]["faults"], 2);
        assert_eq!(o[&(5, "ALL".to_string())]["wp"], 1);
        assert_eq!(o.len(), 2);
    }

    #[test]
    fn a_missing_oracle_phase_says_what_the_trace_held() {
        let console = "@@FS-RC c 0\n@@FS-OVERRUN c 0\n@@FS-BEGIN c.oracle\n\
                       oracle tgid=7 phase=ALL faults=1\n\
                       oracle: 9 trace lines, 0 with an unknown tgid, 1 processes exec'd: 7; phases: x\n\
                       @@FS-END c.oracle\n";
        let run = GuestRun {
            console: console.into(),
            sections: crate::vm::sections(console),
            wall: std::time::Duration::ZERO,
        };
        let e = check_case(&run, "k", "c").err().expect("no JSON: a harness error").to_string();
        assert!(e.contains("no section c.json"), "{e}");
        let gap = oracle_gap(&run, "c", "c.oracle", 8, "mark:write");
        assert!(gap.contains("no mark:write phase for pid 8"), "{gap}");
        assert!(gap.contains("1 processes exec'd: 7; phases: x; trace buffer overrun 0"), "{gap}");
    }
}
