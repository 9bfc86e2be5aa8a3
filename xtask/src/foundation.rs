//! The foundation guest test: faultscope's counts against the tracefs
//! kprobe oracle of the same run, and against the workload's page
//! arithmetic and getrusage.

use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use crate::{kernels, root, vm};

/// Faults of the workload outside its write phase that land in the same
/// classes: COW of the binary's data pages after exec, stack and heap pages
/// shared with the child after fork. Measured at 20-40; the write phase
/// itself is exact.
pub const TOLERANCE: u64 = 64;

pub struct CaseResult {
    pub table: String,
    pub failures: Vec<String>,
}

/// Classes compared with the oracle, their key in its output line
/// (`oracle tgid=N phase=ALL faults=.. wp=.. reuse=.. ...`), and the oracle
/// events (lib.sh `oracle_event`) the key needs.
pub const ORACLE_COLUMNS: [(&str, &str, &[&str]); 12] = [
    ("faults", "faults", &["hmf", "hmfr"]),
    ("wp_faults", "wp", &["hmf", "hmfr", "wp"]),
    // Without "dsp" both sides count shared write-notify as reuse.
    ("reuse", "reuse", &["hmf", "hmfr", "wp", "nar"]),
    ("copy", "copy", &["hmf", "hmfr", "wp", "nar"]),
    ("wp_shared", "shared", &["hmf", "hmfr", "wp", "dsp"]),
    ("huge_pmd_wp", "huge", &["hmf", "hmfr", "hwp"]),
    ("spurious", "spurious", &["hmf", "hmfr", "wp", "hwp", "nar", "exc|acc"]),
    ("contpte_unfold", "unfold", &["conv"]),
    ("contpte_fold", "folded", &["conv"]),
    ("contpte_convert", "convert", &["conv"]),
    ("contpte_try_unfold", "tryunfold", &["unfold"]),
    ("contpte_fold_attempt", "fold", &["fold"]),
];

/// Why the oracle cannot count a column: the events it needs that the
/// guest kernel refused ("a|b" needs one of them). Empty when it can.
pub fn oracle_unknown(run: &vm::GuestRun, events: &[&str]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| {
            let alts: Vec<&str> = e.split('|').collect();
            let miss: Vec<String> = alts.iter().filter_map(|a| run.marker("ORACLE-MISSING", a)).collect();
            (miss.len() == alts.len()).then(|| miss.join("; "))
        })
        .collect()
}

/// The process `pid` of a faultscope report.
pub fn report_process(report: &Value, pid: u64) -> Result<&Value> {
    report["processes"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["pid"].as_u64() == Some(pid)))
        .with_context(|| format!("no process {pid} in faultscope's report"))
}

fn count(proc_: &Value, class: &str) -> Option<u64> {
    proc_["classes"][class]["count"].as_u64()
}

pub fn check_case(run: &vm::GuestRun, case: &str, folio: &str) -> Result<CaseResult> {
    let mut fails = Vec::new();
    let rc = run.marker("RC", case).unwrap_or_default();
    if rc != "0" {
        bail!(
            "{case}: faultscope exited with {rc:?}:\n{}",
            run.section(&format!("{case}.out")).unwrap_or("")
        );
    }
    let fs: Value =
        serde_json::from_str(run.section(&format!("{case}.fs.json"))?).context("faultscope JSON")?;
    let wl: Value =
        serde_json::from_str(run.section(&format!("{case}.wl.json"))?).context("workload JSON")?;
    let pid = wl["pid"].as_u64().context("workload pid")?;
    let pages = wl["pages"].as_u64().context("workload pages")?;
    let p = report_process(&fs, pid).with_context(|| case.to_string())?;
    if fs["mode"] != "kprobe" {
        fails.push(format!("{case}: mode is {}, not kprobe", fs["mode"]));
    }
    let (tgid, all) = (format!("tgid={pid}"), "phase=ALL");
    let oracle: HashMap<&str, u64> = run
        .section(&format!("{case}.oracle"))?
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.contains(&tgid.as_str()) && w.contains(&all))
        .with_context(|| format!("{case}: the oracle saw no faults of pid {pid}"))?
        .into_iter()
        .filter_map(|kv| kv.split_once('=').and_then(|(k, v)| Some((k, v.parse().ok()?))))
        .collect();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{case} (pid {pid}, {pages} pages of 4K, folio {folio}, guest wall {:.1}s)",
        run.wall.as_secs_f64()
    );
    let _ = writeln!(table, "  {:<20} {:>10} {:>10}", "class", "faultscope", "oracle");
    let mut unknown = BTreeSet::new();
    for (class, key, events) in ORACLE_COLUMNS {
        let f = count(p, class);
        // A key whose events the kernel refused is unknown, not 0: then
        // faultscope must say "not measurable" too.
        let missing = oracle_unknown(run, events);
        let o = if missing.is_empty() { oracle.get(key).copied() } else { None };
        let _ = writeln!(table, "  {:<20} {:>10} {:>10}", class, fmt(f), fmt(o));
        unknown.extend(missing);
        if f != o {
            fails.push(format!("{case}: {class}: faultscope {} != oracle {}", fmt(f), fmt(o)));
        }
    }
    for why in unknown {
        let _ = writeln!(table, "  oracle cannot count: {why}");
    }
    // Page arithmetic. Large anonymous folios are reused on a write fault
    // since 6.16 (1da190f4d0a6, "mm: Copy-on-Write (COW) reuse support for
    // PTE-mapped THP"), page by page; before, every page is copied.
    let kernel = fs["kernel"].as_str().unwrap_or("");
    let (class, what) = match folio {
        "shared" => ("wp_shared", "soft-dirty cleared on shared memory: one write-notify fault per page"),
        "4K" => ("reuse", "4K pages are reused one by one"),
        _ if kernel_at_least(kernel, 6, 16) => ("reuse", "large folios are reused, one page per fault"),
        _ => ("copy", "no large-folio reuse before 6.16: every page is copied"),
    };
    let got = count(p, class).unwrap_or(0);
    let _ =
        writeln!(table, "  arithmetic: {class} = {got}, pages = {pages} ({what}; tolerance +{TOLERANCE})");
    if got < pages || got > pages + TOLERANCE {
        fails.push(format!("{case}: {class} = {got}, expected pages {pages} (+{TOLERANCE})"));
    }
    if folio == "64K" {
        let alloc: u64 = run.marker("MTHP64-ALLOC", case).and_then(|v| v.parse().ok()).unwrap_or(0);
        let _ = writeln!(table, "  64K mTHP folios allocated: {alloc} (pages/16 = {})", pages / 16);
        if alloc < pages / 16 {
            fails.push(format!("{case}: only {alloc} 64K folios allocated; the memory was not 64K mTHP"));
        }
    }
    // getrusage: all of the workload's faults since exec.
    let minflt = wl["minflt_total"].as_u64().unwrap_or(0) + wl["majflt_total"].as_u64().unwrap_or(0);
    let faults = count(p, "faults").unwrap_or(0);
    let retries = count(p, "retry").unwrap_or(0);
    let _ = writeln!(
        table,
        "  getrusage: minflt+majflt = {minflt}; faultscope faults - retries = {}",
        faults - retries.min(faults)
    );
    if (faults - retries.min(faults)).abs_diff(minflt) > TOLERANCE {
        fails.push(format!("{case}: faults {faults} (retries {retries}) vs getrusage {minflt}"));
    }
    if fs["drops"]["lost_kretprobe_returns"].as_u64() != Some(0) {
        fails.push(format!("{case}: kretprobe returns lost: {}", fs["drops"]["lost_kretprobe_returns"]));
    }
    for (tag, want) in [("KPROBES-LEFT", "0"), ("OVERRUN", "0")] {
        let v = run.marker(tag, case).unwrap_or_default();
        if v != want {
            fails.push(format!("{case}: {tag} = {v:?}, want {want}"));
        }
    }
    let _ = writeln!(
        table,
        "  trace lines: {}, kprobes left after faultscope: {}",
        run.marker("TRACE-LINES", case).unwrap_or_default(),
        run.marker("KPROBES-LEFT", case).unwrap_or_default()
    );
    Ok(CaseResult { table, failures: fails })
}

/// Whether a release string ("7.3.4+deb13-cloud-amd64") is at least major.minor.
pub fn kernel_at_least(release: &str, major: u64, minor: u64) -> bool {
    let mut it = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u64>().ok());
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

fn fmt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Boots `kernel` (a name of `kernels::KERNELS`) and runs the 4K and 64K
/// cases, and the shared-memory soft-dirty case.
pub fn run(kernel: &str, size: &str) -> Result<()> {
    let k = kernels::by_name(kernel)?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm/foundation").join(k.name);
    std::fs::create_dir_all(&dir)?;
    let cpio = vm::initramfs(&dir, k.arch, &bin, "foundation.sh", &[("SIZE", size.to_string())])?;
    let run = vm::boot(k, &vmlinuz, &cpio, &dir, Duration::from_secs(600))?;
    let mut failures = Vec::new();
    for (case, folio) in [("fork4k", "4K"), ("fork64k", "64K"), ("shared4k", "shared")] {
        let r = check_case(&run, case, folio)?;
        print!("{}", r.table);
        failures.extend(r.failures);
    }
    println!("guest {} booted, ran and powered off in {:.1}s", k.name, run.wall.as_secs_f64());
    if !failures.is_empty() {
        bail!("guest test failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}
