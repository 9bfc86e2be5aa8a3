//! The foundation guest test: faultscope's counts against the tracefs
//! kprobe oracle of the same run, and against the workload's page
//! arithmetic and getrusage.

use std::{fmt::Write as _, time::Duration};

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

/// Classes compared with the oracle, and their column in its output line
/// (`oracle TGID faults wp reuse copy huge write_nowp spurious`).
pub const ORACLE_COLUMNS: [(&str, usize); 6] = [
    ("faults", 0),
    ("wp_faults", 1),
    ("reuse", 2),
    ("copy", 3),
    ("huge_pmd_wp", 4),
    ("spurious", 6),
];

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
    let fs: Value = serde_json::from_str(run.section(&format!("{case}.fs.json"))?)
        .context("faultscope JSON")?;
    let wl: Value =
        serde_json::from_str(run.section(&format!("{case}.wl.json"))?).context("workload JSON")?;
    let pid = wl["pid"].as_u64().context("workload pid")?;
    let pages = wl["pages"].as_u64().context("workload pages")?;
    let p = fs["processes"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["pid"].as_u64() == Some(pid)))
        .with_context(|| format!("{case}: no process {pid} in faultscope's report"))?;
    if fs["mode"] != "kprobe" {
        fails.push(format!("{case}: mode is {}, not kprobe", fs["mode"]));
    }
    let oracle_line = run
        .section(&format!("{case}.oracle"))?
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(pid.to_string().as_str()))
        .with_context(|| format!("{case}: the oracle saw no faults of pid {pid}"))?
        .to_string();
    let oracle: Vec<u64> = oracle_line
        .split_whitespace()
        .skip(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "{case} (pid {pid}, {pages} pages of 4K, folio {folio}, guest wall {:.1}s)",
        run.wall.as_secs_f64()
    );
    let _ = writeln!(
        table,
        "  {:<12} {:>10} {:>10}",
        "class", "faultscope", "oracle"
    );
    for (class, col) in ORACLE_COLUMNS {
        let f = count(p, class);
        let o = oracle.get(col).copied();
        let _ = writeln!(table, "  {:<12} {:>10} {:>10}", class, fmt(f), fmt(o));
        if f != o {
            fails.push(format!(
                "{case}: {class}: faultscope {} != oracle {}",
                fmt(f),
                fmt(o)
            ));
        }
    }
    // Page arithmetic.
    let (class, what) = match folio {
        "4K" => ("reuse", "4K pages are reused one by one"),
        _ => (
            "copy",
            "6.12 has no large-folio reuse: every page is copied",
        ),
    };
    let got = count(p, class).unwrap_or(0);
    let _ = writeln!(
        table,
        "  arithmetic: {class} = {got}, pages = {pages} ({what}; tolerance +{TOLERANCE})"
    );
    if got < pages || got > pages + TOLERANCE {
        fails.push(format!(
            "{case}: {class} = {got}, expected pages {pages} (+{TOLERANCE})"
        ));
    }
    if folio == "64K" {
        let alloc: u64 = run
            .marker("MTHP64-ALLOC", case)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let _ = writeln!(
            table,
            "  64K mTHP folios allocated: {alloc} (pages/16 = {})",
            pages / 16
        );
        if alloc < pages / 16 {
            fails.push(format!(
                "{case}: only {alloc} 64K folios allocated; the memory was not 64K mTHP"
            ));
        }
    }
    // getrusage: all of the workload's faults since exec.
    let minflt =
        wl["minflt_total"].as_u64().unwrap_or(0) + wl["majflt_total"].as_u64().unwrap_or(0);
    let faults = count(p, "faults").unwrap_or(0);
    let retries = count(p, "retry").unwrap_or(0);
    let _ = writeln!(
        table,
        "  getrusage: minflt+majflt = {minflt}; faultscope faults - retries = {}",
        faults - retries.min(faults)
    );
    if (faults - retries.min(faults)).abs_diff(minflt) > TOLERANCE {
        fails.push(format!(
            "{case}: faults {faults} (retries {retries}) vs getrusage {minflt}"
        ));
    }
    if p.get("lost_returns").is_some() {
        fails.push(format!(
            "{case}: kretprobe lost returns: {}",
            p["lost_returns"]
        ));
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
    Ok(CaseResult {
        table,
        failures: fails,
    })
}

fn fmt(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Boots 6.12 amd64 and runs the 4K and 64K cases.
pub fn run(size: &str) -> Result<()> {
    let k = kernels::by_name("6.12-cloud-amd64")?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope()?;
    let dir = root().join("target/vm/foundation");
    std::fs::create_dir_all(&dir)?;
    let cpio = vm::initramfs(&dir, &bin, "foundation.sh", &[("SIZE", size.to_string())])?;
    let run = vm::boot(k, &vmlinuz, &cpio, &dir, Duration::from_secs(600))?;
    let mut failures = Vec::new();
    for (case, folio) in [("fork4k", "4K"), ("fork64k", "64K")] {
        let r = check_case(&run, case, folio)?;
        print!("{}", r.table);
        failures.extend(r.failures);
    }
    println!(
        "guest {} booted, ran and powered off in {:.1}s",
        k.name,
        run.wall.as_secs_f64()
    );
    if !failures.is_empty() {
        bail!("guest test failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}
