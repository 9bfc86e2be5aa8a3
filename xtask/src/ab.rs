//! `cargo xtask ab KERNEL-A KERNEL-B...`: the same `faultscope bench`
//! series on each kernel, in `--boots` boots of each taken alternately (A B
//! A B), every boot running every bench; the runs of a kernel's boots are
//! joined into one series (`Series::merge`) and printed as
//! `faultscope diff --format changelog` prints two: the cover letter's
//! layout, a value per boot, and A against each other kernel with the
//! change and the min-max test. Each kernel's series is kept under
//! target/ab/NAME/ with the A/B pictures (`plot --compare`, the reuse
//! fault's latency CDF).

use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use faultscope::{
    cmd::plot,
    kernel::classes::ReportClass,
    report::{
        bench_series::{self, LoadedSeries, Series},
        changelog,
    },
};

use crate::{
    kernels::{self, GuestKernel},
    util::root,
    vm,
};

/// A named set of kernels and benches.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Preset {
    /// The whole-folio reuse series' cover letter: 7.3 built without a
    /// patch (the same configuration as the patched ones), 7.3 with v2 1/2
    /// (16 PTEs) and with 1/2 + 2/2 (the whole folio); seq with a clock
    /// read between the stores (4K, 64K, 1M, 2M PTE- and PMD-mapped),
    /// memset(), 8 threads in random order, read-then-store, a 4K COW
    /// copy with the child alive. On arm64 (`--arch arm64`, where the
    /// cover letter gives the contpte unfolds) only the first: seq 4K, 64K
    /// and 2M.
    CoverLetter,
    /// The cover letter's `flush_tlb_local()` experiment, amd64 only:
    /// Debian's 7.3, 7.3 with the series, and with the series and the
    /// flush; read-then-store and seq with a clock read between the
    /// stores, 64K folios. With `--tlb stale` (the read-then-store row's
    /// spurious faults need QEMU's stale-TLB model; the seq row's need
    /// speculative fills, which the model leaves out).
    LocalFlush,
    /// The exec THP COW series ("THP COW support for private executable
    /// file mmap"), amd64 only: 7.3 built without a patch against 7.3
    /// with the series; bench hotpatch (mprotect, stores) and
    /// hotpatch-mem (/proc/self/mem), one byte a file THP, on ext4.
    ExecThpCow,
}

/// The hot-patch benches (the guest makes /mnt/hotpatch: `lib.sh`'s
/// `hotpatch_dir`).
const HOTPATCH: &[&str] =
    &["hotpatch --folio 2M --file-dir /mnt/hotpatch", "hotpatch-mem --folio 2M --file-dir /mnt/hotpatch"];

/// What each seed series' own figures measured, and what of it the copies
/// table stands beside: printed under it.
const SEEDS: &str = "\
The seeds' own figures, beside which the copies above stand:
- exec THP COW (Zhang Qilong, next v2): MySQL 8.0.25 hot-patched, \"Exec mmap
  Rss\" 32,868 kB with page COW and 43,516 kB with exec THP COW (+10,648 kB,
  about five 2M THPs' worth over 4K copies), tpmC +9.3%. Its Rss is the
  mapping's resident memory; the bytes copied above are what each write's COW
  allocated (smaps: the mapping's Anonymous after the write), and the Rss
  before and after are in each run's report (bench.hotpatch).
- mTHP for wp copy (Vernon Yang, RFC, 7 patches on v6.16): usemem KB/s
  +9.09% (16K), +12.09% (32K), +14.48% (64K). Series not available: its
  thread holds only the cover letter (no diffs), and the public list
  archive cannot be reached from here; no column is made for it.
";

/// The cover letter's benches, one `faultscope bench` each per boot.
const COVER_LETTER: &[&str] = &[
    "seq --time-stores --folio 4K,64K,1M,2M",
    "seq --time-stores --folio 2M --pmd",
    "memset --folio 4K,64K,2M",
    "memset --folio 2M --pmd",
    "threads --threads 8 --folio 64K,2M",
    "read-then-store --folio 64K",
    "seq --child alive --folio 4K",
];

/// What to run.
pub struct Opts {
    pub kernels: Vec<String>,
    pub runs: u64,
    pub boots: usize,
    pub size: String,
    /// `faultscope bench` arguments (mode, --folio ...), one bench each.
    pub benches: Vec<String>,
}

impl Opts {
    /// The preset's kernels (for `arch`) and benches.
    pub fn preset(p: Preset, arch: &str, runs: u64, boots: usize, size: String) -> Result<Opts> {
        let strings = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (kernels, benches) = match p {
            Preset::LocalFlush if arch != "amd64" => {
                bail!(
                    "ab --preset local-flush: the flush experiment is x86's (flush_tlb_local); --arch amd64"
                )
            }
            Preset::LocalFlush => (
                strings(&["7.3-cloud-amd64", "7.3-folio-reuse-amd64", "7.3-folio-reuse-flush-amd64"]),
                strings(&["read-then-store --folio 64K", "seq --time-stores --folio 64K"]),
            ),
            Preset::ExecThpCow if arch != "amd64" => {
                bail!("ab --preset exec-thp-cow: the series' kernel is built for amd64 only; --arch amd64")
            }
            Preset::ExecThpCow => {
                (strings(&["7.3-stock-build-amd64", "7.3-exec-thp-cow-amd64"]), strings(HOTPATCH))
            }
            Preset::CoverLetter => (
                ["7.3-stock-build", "7.3-reuse-16-ptes", "7.3-folio-reuse"]
                    .iter()
                    .map(|k| format!("{k}-{arch}"))
                    .collect(),
                match arch {
                    "arm64" => strings(&["seq --time-stores --folio 4K,64K,2M"]),
                    _ => strings(COVER_LETTER),
                },
            ),
        };
        Ok(Opts { kernels, runs, boots, size, benches })
    }
}

/// An A/B picture of A against a later kernel (the bars with their spread,
/// or the reuse fault's latency CDF), as SVG and PNG: (path without its
/// extension, SVG, PNG, non-white pixels of the PNG).
type Picture = (PathBuf, String, Vec<u8>, usize);

fn draw(a: &LoadedSeries, b: &LoadedSeries, dir: &std::path::Path, name: &str) -> Result<Vec<Picture>> {
    let mut drawn = Vec::new();
    let svgs = [
        ("compare", plot::compare::svg(a, b)?),
        ("latency-reuse", plot::latency::svg(ReportClass::Reuse, "write", a, b)?),
    ];
    for (what, svg) in svgs {
        let path = dir.join(format!("{name}-{what}"));
        let (png, non_white) = crate::daemon::render_png(&svg)?;
        fs::write(dir.join(format!("{name}-{what}.svg")), &svg)?;
        fs::write(dir.join(format!("{name}-{what}.png")), &png)?;
        drawn.push((path, svg, png, non_white));
    }
    Ok(drawn)
}

/// The series of one boot of `k`: every bench's, merged.
fn one_boot(k: GuestKernel, o: &Opts, boot: usize) -> Result<Series> {
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm/ab").join(k.name).join(format!("boot{boot}"));
    fs::create_dir_all(&dir)?;
    for b in &o.benches {
        if b.contains(';') || b.contains('\'') {
            bail!("bench arguments {b:?}: no ';' or quote");
        }
    }
    let env = [("BENCHES", o.benches.join(";")), ("RUNS", o.runs.to_string()), ("SIZE", o.size.clone())];
    let cpio = vm::initramfs(&dir, k.arch, &bin, "ab.sh", &env)?;
    let t = Instant::now();
    let g = vm::boot(k, &vmlinuz, &cpio, &dir, Duration::from_secs(3600))?;
    let mut parts = Vec::new();
    for (i, b) in o.benches.iter().enumerate() {
        let case = format!("ab{}", i + 1);
        g.exited_ok(&case, &format!("{case}.out"))
            .with_context(|| format!("{} boot {boot}: faultscope bench {b} failed", k.name))?;
        let section = format!("{case}.json");
        let text = g.section(&section)?;
        fs::write(dir.join(format!("{case}.json")), text)?;
        let name = format!("{} boot {boot}: bench {b}", k.name);
        parts.push(bench_series::parse(name, text)?.series);
    }
    println!(
        "xtask ab: {} boot {boot}: {} benches in {:.0}s",
        k.name,
        o.benches.len(),
        t.elapsed().as_secs_f64()
    );
    Ok(Series::merge(parts)?)
}

/// Runs the comparison; returns each kernel's merged series (written to
/// target/ab/NAME/series.json), the changelog text (also printed and
/// written to target/ab/changelog.txt) and the pictures.
pub fn run(o: &Opts) -> Result<(Vec<LoadedSeries>, String, Vec<Picture>)> {
    if o.kernels.len() < 2 {
        bail!("ab: give two kernels or more (A first: the baseline)");
    }
    if o.boots == 0 || o.runs == 0 {
        bail!("ab: --boots and --runs must be at least 1");
    }
    let ks: Vec<GuestKernel> =
        o.kernels.iter().map(|n| kernels::by_name_or_image(n)).collect::<Result<_>>()?;
    if let Some(k) = ks.iter().find(|k| k.arch != ks[0].arch) {
        bail!(
            "ab: {} is {}, {} is {}: compare kernels of one architecture",
            ks[0].name,
            ks[0].arch,
            k.name,
            k.arch
        );
    }
    for k in &ks {
        if let Some(why) = k.missing() {
            bail!("ab: {}: {why}", k.name);
        }
    }
    let t = Instant::now();
    let mut boots: Vec<Vec<Series>> = vec![Vec::new(); ks.len()];
    // Alternately: boot i of every kernel before boot i + 1 of any.
    for boot in 1..=o.boots {
        for (i, k) in ks.iter().enumerate() {
            boots[i].push(one_boot(*k, o, boot)?);
        }
    }
    let out = root().join("target/ab");
    let mut cols = Vec::new();
    for (k, parts) in ks.iter().zip(boots) {
        let series = Series::merge(parts).with_context(|| k.name.to_string())?;
        let dir = out.join(k.name);
        fs::create_dir_all(&dir)?;
        let path: PathBuf = dir.join("series.json");
        bench_series::write(&path, &series)?;
        cols.push(LoadedSeries { path: path.display().to_string(), series });
    }
    let refs: Vec<&LoadedSeries> = cols.iter().collect();
    let mut text = changelog::changelog(&refs);
    text.push_str(&copies(&ks, &cols));
    fs::write(out.join("changelog.txt"), &text)?;
    let mut pictures = Vec::new();
    for (k, c) in ks.iter().zip(&cols).skip(1) {
        pictures.extend(draw(&cols[0], c, &out, k.name)?);
    }
    print!("{text}");
    println!(
        "xtask ab: {} kernels x {} boots x {} benches of {} runs on {} in {:.0}s; series and pictures under {}",
        ks.len(),
        o.boots,
        o.benches.len(),
        o.runs,
        o.size,
        t.elapsed().as_secs_f64(),
        out.display()
    );
    Ok((cols, text, pictures))
}

/// The write step's copies of every cell on every kernel, by folio size,
/// and the bytes they allocated, from each run's report (the median run
/// by bytes; min-max over the runs), then what the seeds measured.
fn copies(ks: &[GuestKernel], cols: &[LoadedSeries]) -> String {
    use faultscope::report::schema::Folios;
    use faultscope_expect::cases::folios_of;
    use std::fmt::Write as _;
    let mut out =
        String::from("\nCOW copies in the write step, by folio size (median run), and bytes copied:\n");
    for (k, c) in ks.iter().zip(cols) {
        for cell in &c.series.cells {
            let mut runs: Vec<(u64, Folios)> = cell
                .runs
                .iter()
                .filter_map(|r| {
                    let span = r.bench_process()?.span("mark:write")?;
                    Some((span.count(ReportClass::Copy)?, folios_of(&span.classes, ReportClass::Copy)?))
                })
                .collect();
            let what = format!("{} {} {}", cell.mode, cell.folio, cell.mapping);
            if runs.is_empty() {
                let _ = writeln!(out, "  {:<28} {:<40} copy sizes not measured", k.name, what);
                continue;
            }
            runs.sort_by_key(|(_, f)| f.bytes);
            let (n, f) = &runs[runs.len() / 2];
            let sizes: Vec<String> = f.sizes.iter().map(|(s, v)| format!("{s} {v}")).collect();
            let _ = writeln!(
                out,
                "  {:<28} {:<40} copy {n} ({}), {} bytes (runs {}-{})",
                k.name,
                what,
                if sizes.is_empty() { "none".into() } else { sizes.join(", ") },
                f.bytes,
                runs[0].1.bytes,
                runs[runs.len() - 1].1.bytes
            );
        }
    }
    out.push('\n');
    out.push_str(SEEDS);
    out
}

/// The guest test of `ab`: stock 7.3 against 7.3 with the whole-folio
/// series, amd64, 3 runs x 2 boots of seq on 16M for 4K, 64K and 2M
/// (PTE-mapped). The series' 64K and 2M write faults must lie beyond the
/// stock kernel's spread, and inside the page arithmetic (stock: one per
/// page; the series: one per folio, plus the bench's own few); 4K must not
/// (both reuse page by page), and both kernels' 4K counts must be one per
/// page. The text must have a value per boot.
pub fn test() -> Result<()> {
    let o = Opts {
        kernels: vec!["7.3-cloud-amd64".into(), "7.3-folio-reuse-amd64".into()],
        runs: 3,
        boots: 2,
        size: "16M".into(),
        benches: vec!["seq --folio 4K,64K,2M".into()],
    };
    let (cols, text, pictures) = run(&o)?;
    let mut fails = judge(&cols, &text, 16 << 20);
    for (path, svg, png, non_white) in &pictures {
        let labels = ["seq 4K", "seq 64K", "seq 2M"];
        if path.to_string_lossy().ends_with("-compare") {
            if let Some(l) = labels.iter().find(|l| !svg.contains(*l)) {
                fails.push(format!("{}.svg has no label {l:?}", path.display()));
            }
        }
        if png.len() < 20_000 || *non_white < 20_000 {
            fails.push(format!("{}.png: {} bytes, {non_white} non-white pixels", path.display(), png.len()));
        }
    }
    if !fails.is_empty() {
        bail!("ab test:\n  {}", fails.join("\n  "));
    }
    println!("xtask ab test: passed");
    Ok(())
}

/// Faults beyond the page arithmetic the bench's own memory may take in
/// the write step: the matrix's bound (measured here: 0 to 2).
const SLACK: f64 = faultscope_expect::cases::SLACK as f64;

fn judge(cols: &[LoadedSeries], text: &str, size: u64) -> Vec<String> {
    let mut fails = Vec::new();
    let (a, b) = (&cols[0].series, &cols[1].series);
    for (folio, bytes) in [("4K", 4096u64), ("64K", 64 << 10), ("2M", 2 << 20)] {
        let cell = |s: &Series| s.cells.iter().find(|c| c.mode == "seq" && c.folio == folio).cloned();
        let (Some(ca), Some(cb)) = (cell(a), cell(b)) else {
            fails.push(format!("seq {folio}: a kernel has no cell"));
            continue;
        };
        let wf =
            |c: &bench_series::Cell| c.step("write").and_then(|s| s.class(ReportClass::WriteFaults)).cloned();
        let (Some(sa), Some(sb)) = (wf(&ca), wf(&cb)) else {
            fails.push(format!("seq {folio}: write faults not measured"));
            continue;
        };
        let (pages, folios) = ((size / 4096) as f64, (size / bytes) as f64);
        let within = |s: &bench_series::Stats, n: f64| s.min as f64 >= n && s.max as f64 <= n + SLACK;
        if !within(&sa, pages) {
            fails.push(format!(
                "seq {folio}: stock 7.3's write faults {}-{} not one per page ({pages})",
                sa.min, sa.max
            ));
        }
        let want_b = if folio == "4K" { pages } else { folios };
        if !within(&sb, want_b) {
            fails.push(format!(
                "seq {folio}: the series' write faults {}-{} not {want_b} (+{SLACK})",
                sb.min, sb.max
            ));
        }
        let beyond = bench_series::Stats::beyond_spread(&sa, &sb);
        let want = folio != "4K";
        if beyond != Some(want) {
            fails.push(format!(
                "seq {folio}: write faults beyond the spread is {beyond:?}, want {want} (A {}-{}, B {}-{})",
                sa.min, sa.max, sb.min, sb.max
            ));
        }
        let line = text.lines().find(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() > 3 && w[0] == "seq" && w[1] == folio && w[2] == "write"
        });
        let word = if want { "yes" } else { "no" };
        if !line.is_some_and(|l| l.trim_end().ends_with(word)) {
            fails.push(format!("seq {folio}: the statistics row does not end in {word:?}: {line:?}"));
        }
        if ca.boots().len() != 2 || cb.boots().len() != 2 {
            fails.push(format!(
                "seq {folio}: runs not in 2 boots ({} and {})",
                ca.boots().len(),
                cb.boots().len()
            ));
        }
    }
    if !text.contains("2 boots of each kernel, taken alternately") {
        fails.push("the text does not say the boots alternated".into());
    }
    let time_row = text.lines().find(|l| l.trim_start().starts_with("64K mTHP") && l.contains(" / "));
    if time_row.is_none() {
        fails.push("no time row with a value per boot (`x / y`) for 64K".into());
    }
    fails
}
