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

/// Medians per step, off and on, and their ratio.
fn summarize(off: &[Report], on: &[Report], what: &str) -> Result<()> {
    println!(
        "{what}: {} runs each, alternately; medians of the workload's own wall time per step",
        off.len()
    );
    println!("  {:<10} {:>12} {:>12} {:>8}", "step", "off (ms)", "on (ms)", "on/off");
    for step in ["populate", "fork", "write"] {
        let a: Vec<f64> = off.iter().filter_map(|r| step_ns(r, step)).collect();
        let b: Vec<f64> = on.iter().filter_map(|r| step_ns(r, step)).collect();
        if a.is_empty() || b.is_empty() {
            bail!("no {step} times in the reports");
        }
        let (ma, mb) = (median(a) / 1e6, median(b) / 1e6);
        println!("  {step:<10} {ma:>12.2} {mb:>12.2} {:>8.3}", mb / ma);
    }
    Ok(())
}

pub fn run(host: bool, kernel: &str, size: &str, runs: usize) -> Result<()> {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    if host {
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
        return summarize(&off, &on, &format!("host ({mode} mode), bench seq {size} 4K"));
    }
    let k = kernels::by_name(kernel)?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm/overhead").join(k.name);
    std::fs::create_dir_all(&dir)?;
    let env = [("SIZE", size.to_string()), ("RUNS", runs.to_string())];
    let cpio = vm::initramfs(&dir, k.arch, &bin, "overhead.sh", &env)?;
    let g = vm::boot(k, &vmlinuz, &cpio, &dir, Duration::from_secs(1200))?;
    for i in 1..=runs {
        for (t, list) in [("off", &mut off), ("on", &mut on)] {
            let case = format!("{t}{i}");
            if g.marker("RC", &case).as_deref() != Some("0") {
                bail!("{case} failed");
            }
            list.push(check::report(&g, &format!("{case}.json"))?);
        }
    }
    summarize(&off, &on, &format!("guest {} (kprobe mode, QEMU TCG), bench seq {size} 4K", k.name))
}

fn tempdir() -> Result<std::path::PathBuf> {
    let d = Path::new(&std::env::temp_dir()).join(format!("faultscope-overhead-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
