//! The demo: `faultscope bench` in guests of the oldest and newest kernel
//! (x86-64), reuse after the child exited, for 4K, 64K and 2M PTE-mapped,
//! printed in the shape of the whole-folio reuse patch's "write faults /
//! time" table (README, the demo) from faultscope's own counts, then
//! `faultscope diff` of the 64K runs.

use std::{fmt::Write as _, fs, time::Duration};

use anyhow::{bail, Result};
use faultscope::{kernel::classes::Metric, report::schema::Report};

use crate::{check, kernels, root, run, vm};

const ROWS: [(&str, &str); 3] = [("4K", "4K pages"), ("64K", "64K mTHP"), ("2M", "2M THP, PTE-mapped")];

/// faultscope's count of a class in the bench's write step.
fn write_step(report: &Report, m: Metric) -> Option<u64> {
    report.bench_process()?.span("mark:write")?.count(m)
}

fn step_ms(report: &Report, step: &str) -> f64 {
    report.bench.as_ref().and_then(|b| b.step(step)).map_or(0, |s| s.wall_ns) as f64 / 1e6
}

pub fn run_demo(size: &str) -> Result<()> {
    let names = ["6.12-cloud-amd64", "7.3-cloud-amd64"];
    let mut reports: Vec<Vec<Report>> = Vec::new();
    let mut releases = Vec::new();
    for name in names {
        let k = kernels::by_name(name)?;
        let vmlinuz = kernels::fetch(k)?;
        let bin = vm::build_faultscope(k.arch)?;
        let dir = root().join("target/vm/demo").join(k.name);
        fs::create_dir_all(&dir)?;
        let cpio = vm::initramfs(&dir, k.arch, &bin, "demo.sh", &[("SIZE", size.to_string())])?;
        let g = vm::boot(k, &vmlinuz, &cpio, &dir, Duration::from_secs(900))?;
        let mut per = Vec::new();
        for (f, _) in ROWS {
            let case = format!("demo{f}");
            if g.marker("RC", &case).as_deref() != Some("0") {
                bail!("{name}: bench {f} failed:\n{}", g.section(&format!("{case}.out")).unwrap_or(""));
            }
            println!(
                "=== {name}: faultscope bench seq --size {size} --folio {f} --child exit --time-stores ==="
            );
            print!("{}", g.section(&format!("{case}.out"))?);
            let section = format!("{case}.json");
            let j = check::report(&g, &section)?;
            fs::write(dir.join(format!("bench-{f}.json")), g.section(&section)?)?;
            per.push(j);
        }
        releases.push(per[0].kernel.clone());
        reports.push(per);
    }
    let mut t = String::new();
    let _ = writeln!(t, "\n{size} of anonymous memory, fork(), the child exits, then the parent stores to the memory (QEMU TCG guests)");
    let _ = writeln!(t, "{:<28} {:>24} {:>24}", "", releases[0], releases[1]);
    let _ = writeln!(t, "  one byte per page, a clock_gettime() between the stores");
    for (what, class) in [
        ("write faults", Metric::WriteFaults),
        ("  of which reuse", Metric::Reuse),
        ("  of which copy", Metric::Copy),
        ("  spurious", Metric::Spurious),
    ] {
        let _ = writeln!(t, "    {what}");
        for (i, (_, row)) in ROWS.iter().enumerate() {
            let cell =
                |k: usize| write_step(&reports[k][i], class).map(|v| v.to_string()).unwrap_or("n/m".into());
            let _ = writeln!(t, "      {row:<22} {:>24} {:>24}", cell(0), cell(1));
        }
    }
    let _ = writeln!(t, "    time (ms)");
    for (i, (_, row)) in ROWS.iter().enumerate() {
        let _ = writeln!(
            t,
            "      {row:<22} {:>24.1} {:>24.1}",
            step_ms(&reports[0][i], "write"),
            step_ms(&reports[1][i], "write")
        );
    }
    print!("{t}");
    // The two kernels' 64K runs side by side, by faultscope itself.
    let a = root().join("target/vm/demo").join(names[0]).join("bench-64K.json");
    let b = root().join("target/vm/demo").join(names[1]).join("bench-64K.json");
    println!("\n=== faultscope diff (64K mTHP: {} vs {}) ===", names[0], names[1]);
    run(std::process::Command::new(root().join("target/release/faultscope")).arg("diff").arg(&a).arg(&b))
}
