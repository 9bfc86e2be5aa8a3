//! `cargo xtask overhead`: what tracing costs the traced, as a ratio. The
//! same `faultscope bench` runs with the tracer off and on, alternately, in
//! one session (these machines are noisy: only a ratio taken side by side
//! means anything). In a guest by default (kprobe mode), or on this host
//! (`--host`: whatever mode its kernel allows).

use std::{path::Path, process::Command, time::Duration};

use anyhow::{bail, Result};
use faultscope::report::{file, schema::Report};

use crate::{check, kernels, root, vm};

fn step_ns(report: &Report, step: &str) -> Option<f64> {
    Some(report.bench.as_ref()?.step(step)?.wall_ns as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The variants of a guest run: the tracer off, on without attribution, on
/// with per-mapping counts (the default), and with sites and stacks of the
/// written classes too (`xtask/guest/overhead.sh`).
const VARIANTS: [&str; 4] = ["off", "bare", "mappings", "all"];

/// Medians per step of each variant, and their ratios to the first.
fn summarize(runs: &[(&str, Vec<Report>)], what: &str) -> Result<()> {
    println!(
        "{what}: {} runs each, in turn; medians of the workload's own wall time per step (ms), ratio to {}",
        runs[0].1.len(),
        runs[0].0
    );
    print!("  {:<10}", "step");
    for (name, _) in runs {
        print!(" {name:>18}");
    }
    println!();
    for step in ["populate", "fork", "write"] {
        print!("  {step:<10}");
        let mut base = None;
        for (_, reports) in runs {
            let v: Vec<f64> = reports.iter().filter_map(|r| step_ns(r, step)).collect();
            if v.is_empty() {
                bail!("no {step} times in the reports");
            }
            let m = median(v) / 1e6;
            let b = *base.get_or_insert(m);
            print!(" {:>18}", format!("{m:.2} ({:.3})", m / b));
        }
        println!();
    }
    Ok(())
}

pub fn run(host: bool, kernel: &str, size: &str, runs: usize) -> Result<()> {
    if host {
        let (mut off, mut on) = (Vec::new(), Vec::new());
        let bin = root().join("target/release/faultscope");
        crate::run(Command::new("cargo").current_dir(root()).args([
            "build",
            "--release",
            "-p",
            "faultscope",
        ]))?;
        let dir = tempdir()?;
        for i in 0..runs {
            for traced in [false, true] {
                let json = dir.join(format!("{traced}{i}.json"));
                let mut c = Command::new(&bin);
                c.args(["bench", "seq", "--size", size, "--folio", "4K", "--json"]).arg(&json);
                if !traced {
                    c.arg("--no-trace");
                }
                let out = c.output()?;
                if !out.status.success() {
                    bail!("bench failed: {}", String::from_utf8_lossy(&out.stderr));
                }
                let r = file::load(&json)?.report;
                if traced {
                    on.push(r)
                } else {
                    off.push(r)
                }
            }
        }
        let mode = check::mode_name(&on[0]);
        return summarize(&[("off", off), ("on", on)], &format!("host ({mode} mode), bench seq {size} 4K"));
    }
    let k = kernels::by_name(kernel)?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm/overhead").join(k.name);
    std::fs::create_dir_all(&dir)?;
    let env = [("SIZE", size.to_string()), ("RUNS", runs.to_string())];
    let cpio = vm::initramfs(&dir, k.arch, &bin, "overhead.sh", &env)?;
    let g = vm::boot(k, &vmlinuz, &cpio, &dir, Duration::from_secs(1200))?;
    let mut all: Vec<(&str, Vec<Report>)> = VARIANTS.iter().map(|v| (*v, Vec::new())).collect();
    for i in 1..=runs {
        for (t, list) in all.iter_mut() {
            let case = format!("{t}{i}");
            if g.marker("RC", &case).as_deref() != Some("0") {
                bail!("{case} failed");
            }
            list.push(check::report(&g, &format!("{case}.json"))?);
        }
    }
    summarize(&all, &format!("guest {} (kprobe mode, QEMU TCG), bench seq {size} 4K", k.name))
}

fn tempdir() -> Result<std::path::PathBuf> {
    let d = Path::new(&std::env::temp_dir()).join(format!("faultscope-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
