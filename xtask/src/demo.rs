//! The demo: `faultscope bench` in guests of the oldest and newest kernel
//! (x86-64), reuse after the child exited, for 4K, 64K and 2M PTE-mapped,
//! printed as the seed's "write faults / time" table from faultscope's own
//! counts, then `faultscope diff` of the 64K runs.

use std::{fmt::Write as _, fs, time::Duration};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use crate::{kernels, root, run, vm};

const ROWS: [(&str, &str); 3] = [("4K", "4K pages"), ("64K", "64K mTHP"), ("2M", "2M THP, PTE-mapped")];

/// faultscope's count of a class in the bench's write step.
fn write_step(report: &Value, class: &str) -> Option<u64> {
    let pid = report["bench"]["pid"].as_u64()?;
    let p = report["processes"].as_array()?.iter().find(|p| p["pid"].as_u64() == Some(pid))?;
    let ph = p["phases"].as_array()?;
    let i = ph.iter().position(|x| x["name"] == "mark:write")?;
    let mut n = 0;
    for x in std::iter::once(&ph[i])
        .chain(ph[i + 1..].iter().take_while(|x| !x["name"].as_str().unwrap_or("").starts_with("mark:")))
    {
        n += x["classes"][class]["count"].as_u64()?;
    }
    Some(n)
}

fn step_ms(report: &Value, step: &str) -> f64 {
    report["bench"]["phases"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == step))
        .and_then(|p| p["wall_ns"].as_u64())
        .unwrap_or(0) as f64
        / 1e6
}

pub fn run_demo(size: &str) -> Result<()> {
    let names = ["6.12-cloud-amd64", "7.3-cloud-amd64"];
    let mut reports: Vec<Vec<Value>> = Vec::new();
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
            let j: Value = serde_json::from_str(g.section(&format!("{case}.json"))?).context("bench JSON")?;
            fs::write(dir.join(format!("bench-{f}.json")), serde_json::to_string_pretty(&j)?)?;
            per.push(j);
        }
        releases.push(per[0]["kernel"].as_str().unwrap_or(name).to_string());
        reports.push(per);
    }
    let mut t = String::new();
    let _ = writeln!(t, "\n{size} of anonymous memory, fork(), the child exits, then the parent stores to the memory (QEMU TCG guests)");
    let _ = writeln!(t, "{:<28} {:>24} {:>24}", "", releases[0], releases[1]);
    let _ = writeln!(t, "  one byte per page, a clock_gettime() between the stores");
    for (what, class) in [
        ("write faults", "write_faults"),
        ("  of which reuse", "reuse"),
        ("  of which copy", "copy"),
        ("  spurious", "spurious"),
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
