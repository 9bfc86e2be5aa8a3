//! The demo: `faultscope bench` in guests of stock 6.12, stock 7.3 and 7.3
//! with the whole-folio reuse series (x86-64): the write pass after fork
//! with the child exited, for 4K, 64K and 2M PTE-mapped, printed in the
//! shape of the series' own tables from faultscope's counts; an arm64 block
//! with the contpte unfolds per 64K block; `faultscope diff` of stock 7.3
//! against the patched kernel's 64K run; and the Redis row.

use std::{
    fmt::Write as _,
    fs,
    path::PathBuf,
    slice,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use faultscope::{
    kernel::classes::ReportClass,
    report::schema::{ClassValue, Report},
    units::count,
};

use crate::{
    check,
    kernels::{self, GuestKernel},
    redis,
    util::{root, run},
    vm,
};

const ROWS: [(&str, &str); 3] = [("4K", "4K pages"), ("64K", "64K mTHP"), ("2M", "2M THP, PTE-mapped")];

/// The columns: stock 6.12, stock 7.3, 7.3 with the series.
const AMD64: [&str; 3] = ["6.12-cloud-amd64", "7.3-cloud-amd64", "7.3-folio-reuse-amd64"];
const ARM64: [&str; 3] = ["6.12-cloud-arm64", "7.3-cloud-arm64", "7.3-folio-reuse-arm64"];
const HEADS: [&str; 3] = ["stock 6.12", "stock 7.3", "7.3 + folio-reuse"];

/// One folio size's bench: its report, the report's file, and the same
/// bench's with `--no-trace`.
struct Bench {
    folio: String,
    report: Report,
    json: PathBuf,
    untraced: Report,
}

/// One kernel's benches by folio size, or why it has none.
struct Column {
    kernel: GuestKernel,
    /// The column's heading (one of [`HEADS`]).
    head: &'static str,
    release: String,
    benches: Vec<Bench>,
    missing: Option<String>,
}

impl Column {
    fn bench(&self, folio: &str) -> Option<&Bench> {
        self.benches.iter().find(|b| b.folio == folio)
    }

    fn report(&self, folio: &str) -> Option<&Report> {
        self.bench(folio).map(|b| &b.report)
    }
}

/// faultscope's count of a class in the bench's write step.
fn write_step(report: &Report, m: ReportClass) -> Option<u64> {
    report.bench_process()?.span("mark:write")?.count(m)
}

/// The write step's per-fault latency of its write faults (the
/// `mark:write` phase: the child has exited before it, so the step is that
/// one phase): p50 and p99 with faultscope's own nested time taken out, or
/// with it left in (`raw`).
fn write_latency(report: &Report, raw: bool) -> Option<String> {
    let phase = report.bench_process()?.phases.iter().find(|p| p.name == "mark:write")?;
    let ClassValue::Measured(x) = phase.classes.get(&ReportClass::WriteFaults)? else { return None };
    let l = x.latency.as_ref()?;
    let (p50, p99) = if raw { l.raw.as_ref().map(|r| (r.p50_ns, r.p99_ns))? } else { (l.p50_ns, l.p99_ns) };
    Some(us(p50, p99))
}

/// The bench's store latency, p50 and p99.
fn store(report: &Report) -> Option<String> {
    let s = report.bench.as_ref()?.store_latency?;
    Some(us(s.p50_ns, s.p99_ns))
}

/// The write step's wall time in ms.
fn pass_ms(report: &Report) -> Option<String> {
    report.bench.as_ref()?.step("write").map(|s| format!("{:.1}", s.wall_ns as f64 / 1e6))
}

fn boot_column(name: &str, head: &'static str, size: &str, folios: &[&str]) -> Result<Column> {
    let k = kernels::by_name(name)?;
    if let Some(why) = k.missing() {
        println!("=== {name}: not shown: {why} ===");
        return Ok(Column { kernel: k, head, release: name.into(), benches: vec![], missing: Some(why) });
    }
    // Built alone: the suite's kernels built with it in one tree are not
    // the demo's to wait for.
    let vmlinuz = kernels::fetch_alone(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm/demo").join(k.name);
    fs::create_dir_all(&dir)?;
    let env = [("SIZE", size.to_string()), ("FOLIOS", folios.join(" "))];
    let cpio = vm::initramfs(&dir, k.arch, &bin, "demo.sh", &env)?;
    let g = vm::boot(k, &vmlinuz, &cpio, &dir, Duration::from_secs(900))?;
    let mut benches = Vec::new();
    for f in folios {
        let case = format!("demo{f}");
        g.exited_ok(&case, &format!("{case}.out")).with_context(|| format!("{name}: bench {f} failed"))?;
        println!("=== {name}: faultscope bench seq --size {size} --folio {f} --child exit --time-stores ===");
        print!("{}", g.section(&format!("{case}.out"))?);
        let section = format!("{case}.json");
        let report = check::report(&g, &section)?;
        let json = dir.join(format!("bench-{f}.json"));
        fs::write(&json, g.section(&section)?)?;
        let case = format!("demo{f}-untraced");
        g.exited_ok(&case, &format!("{case}.out"))
            .with_context(|| format!("{name}: untraced bench {f} failed"))?;
        let untraced = check::report(&g, &format!("{case}.json"))?;
        benches.push(Bench { folio: f.to_string(), report, json, untraced });
    }
    let release = benches.first().map_or(name.to_string(), |b| b.report.kernel.clone());
    Ok(Column { kernel: k, head, release, benches, missing: None })
}

/// The cells of one row across the columns, right-aligned.
fn row(t: &mut String, label: &str, cols: &[Column], cell: impl Fn(&Column) -> Option<String>) {
    let _ = write!(t, "      {label:<22}");
    for c in cols {
        let v = if c.missing.is_some() { "-".to_string() } else { cell(c).unwrap_or("n/m".into()) };
        let _ = write!(t, " {v:>27}");
    }
    t.push('\n');
}

/// A class's count in the write step per folio written.
fn per_folio(r: &Report, m: ReportClass) -> Option<String> {
    let folios = r.bench.as_ref()?.folios.max(1);
    Some(format!("{:.2}", write_step(r, m)? as f64 / folios as f64))
}

/// p50 and p99 in us.
fn us(p50: u64, p99: u64) -> String {
    format!("{:.1} / {:.1}", p50 as f64 / 1e3, p99 as f64 / 1e3)
}

/// The columns' headings, then their kernels' releases.
fn header(t: &mut String, cols: &[Column]) {
    let lines: [fn(&Column) -> &str; 2] = [|c| c.head, |c| &c.release];
    for line in lines {
        let _ = write!(t, "{:<28}", "");
        for c in cols {
            let _ = write!(t, " {:>27}", line(c));
        }
        t.push('\n');
    }
}

/// The amd64 table: per folio size, write faults, reuse per folio, the
/// pass's time, per-fault latency and store latency.
fn amd64_table(size: &str, cols: &[Column]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n{size} of anonymous memory, fork(), the child exits, then one byte per page (x86-64 QEMU TCG guests; faultscope's counts)"
    );
    header(&mut t, cols);
    // A cell from the traced report and the untraced one of a folio size.
    type Cell = fn(&Report, &Report) -> Option<String>;
    let blocks: [(&str, Cell); 10] = [
        ("write faults", |r, _| write_step(r, ReportClass::WriteFaults).map(count)),
        ("reuse per folio", |r, _| per_folio(r, ReportClass::Reuse)),
        ("copy per folio", |r, _| per_folio(r, ReportClass::Copy)),
        ("time of the pass (ms)", |r, _| pass_ms(r)),
        ("write fault p50/p99 (us)", |r, _| write_latency(r, false)),
        ("  raw: faultscope's nested programs' own time left in", |r, _| write_latency(r, true)),
        ("store p50/p99 (us), traced", |r, _| store(r)),
        ("store p50/p99 (us), untraced (--no-trace)", |_, u| store(u)),
        ("spurious", |r, _| write_step(r, ReportClass::Spurious).map(count)),
        ("untraced time of the pass (ms)", |_, u| pass_ms(u)),
    ];
    for (what, cell) in &blocks {
        let _ = writeln!(t, "  {what}");
        for (f, label) in ROWS {
            row(&mut t, label, cols, |c| c.bench(f).and_then(|b| cell(&b.report, &b.untraced)));
        }
    }
    t
}

/// The arm64 block: contpte unfolds per 64K block written, and the write
/// faults, per kernel.
fn arm64_table(size: &str, cols: &[Column]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\n{size} of 64K mTHP, fork(), the child exits, one byte per page (arm64 QEMU TCG guests)"
    );
    header(&mut t, cols);
    let _ = writeln!(t, "  64K mTHP");
    row(&mut t, "contpte unfolds", cols, |c| {
        write_step(c.report("64K")?, ReportClass::ContpteUnfold).map(count)
    });
    row(&mut t, "  per 64K block", cols, |c| per_folio(c.report("64K")?, ReportClass::ContpteUnfold));
    row(&mut t, "write faults", cols, |c| write_step(c.report("64K")?, ReportClass::WriteFaults).map(count));
    row(&mut t, "reuse per folio", cols, |c| per_folio(c.report("64K")?, ReportClass::Reuse));
    row(&mut t, "time of the pass (ms)", cols, |c| pass_ms(c.report("64K")?));
    t
}

pub fn run_demo(size: &str) -> Result<()> {
    let t0 = Instant::now();
    let folios: Vec<&str> = ROWS.iter().map(|(f, _)| *f).collect();
    // (name, head, amd64?), each column printed as soon as it is booted:
    // the downloaded kernels first, as they need no kernel build.
    let mut order: Vec<(&'static str, &'static str, bool)> = AMD64
        .iter()
        .zip(HEADS)
        .map(|(n, h)| (*n, h, true))
        .chain(ARM64.iter().zip(HEADS).map(|(n, h)| (*n, h, false)))
        .collect();
    order.sort_by_key(|(name, ..)| kernels::by_name(name).is_ok_and(kernels::is_built));
    let (mut amd, mut arm): (Vec<Column>, Vec<Column>) = (Vec::new(), Vec::new());
    for (name, head, is_amd) in order {
        let c = boot_column(name, head, size, if is_amd { &folios } else { &["64K"] })?;
        let table = if is_amd {
            amd64_table(size, slice::from_ref(&c))
        } else {
            arm64_table(size, slice::from_ref(&c))
        };
        print!("{table}");
        println!("xtask demo: [{:.0} s] {name} shown", t0.elapsed().as_secs_f64());
        if is_amd {
            amd.push(c)
        } else {
            arm.push(c)
        }
    }
    let by_head = |cols: &mut Vec<Column>| cols.sort_by_key(|c| HEADS.iter().position(|h| *h == c.head));
    by_head(&mut amd);
    by_head(&mut arm);
    println!("\n=== all kernels side by side ===");
    print!("{}", amd64_table(size, &amd));
    print!("{}", arm64_table(size, &arm));
    for c in amd.iter().chain(&arm) {
        if let Some(why) = &c.missing {
            println!("  ({} is not shown: {why}; the stock columns are.)", c.kernel.name);
        }
    }
    // For the arm64 patched kernel: the gate CI would run, on its report.
    let fs_bin = vm::build_faultscope("amd64")?;
    if let Some(j) = arm[2].bench("64K") {
        println!(
            "\n=== faultscope verify --phase mark:write --expect contpte_unfold=0 ({}) ===",
            arm[2].kernel.name
        );
        let st = std::process::Command::new(&fs_bin)
            .args(["verify", "--phase", "mark:write", "--expect", "contpte_unfold=0"])
            .arg(&j.json)
            .status()?;
        println!("exit {}", st.code().unwrap_or(-1));
    }
    // The 64K runs side by side, by faultscope itself: stock 7.3 against
    // the patched kernel (6.12 against 7.3 without the series).
    let (a, b) = if amd[2].missing.is_none() { (&amd[1], &amd[2]) } else { (&amd[0], &amd[1]) };
    if let (Some(x), Some(y)) = (a.bench("64K"), b.bench("64K")) {
        println!("\n=== faultscope diff (64K mTHP: {} vs {}) ===", a.kernel.name, b.kernel.name);
        run(std::process::Command::new(&fs_bin).arg("diff").arg(&x.json).arg(&y.json))?;
    }
    redis::demo_row()
}
