//! `cargo xtask redis`: Redis end to end. The host's redis-server runs in a
//! guest of the generic Debian 6.12 amd64 kernel (it has 9p, as modules),
//! chrooted into the host's `/` over virtio-9p (`xtask/guest/redis.sh`).
//! Two runs on a fresh, loaded redis-server:
//!
//! 1. BGSAVE to its end, then `faultscope record -p` and SETs: the pages
//!    the fork write-protected are reused.
//! 2. `record -p` first, then BGSAVE and SETs: the fork phases must match
//!    the BGSAVE Redis reports.
//!
//! In both, faultscope's counts for redis-server equal the oracle's in its
//! phase "attach" (faultscope's attach to detach trace markers).
//!
//! Then run 1 again on 64K mTHP (`mthp`), on stock 6.12, stock 7.3 (the
//! generic flavours, 9p as modules) and 7.3 with the whole-folio reuse
//! series (9p built in): the row of redis-server's faults per kernel.

use faultscope::kernel::drops::{DropKind, DropReason};
use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use anyhow::{bail, Context as _, Result};
use faultscope::{
    kernel::classes::ReportClass,
    report::schema::{ClassValue, Mode, Phase},
};

use crate::{
    check::{self, count, Checklist},
    kernels::{self, FolioReuse, GuestKernel, Source},
    setup,
    util::root,
    vm,
};

/// Modules the guest needs for `mount -t 9p` over virtio (their
/// dependencies, netfs and 9pnet, are found from their modinfo).
const MODULES: &[&str] = &["9pnet_virtio", "9p"];

/// Resolution of `/proc/uptime` (10 ms), which times the guest's BGSAVE.
const UPTIME_RES_NS: u64 = 10_000_000;

/// The kernels of the 64K mTHP row: stock 6.12, stock 7.3, 7.3 with the
/// whole-folio reuse series.
pub const MTHP_KERNELS: [&str; 3] = ["6.12-amd64", "7.3-amd64", "7.3-folio-reuse-amd64"];

/// The runs of redis.sh, with what each does.
const RUNS: [(&str, &str); 4] = [
    ("run1", "attach after BGSAVE (the child has exited), then SETs"),
    ("run2", "attach, then BGSAVE, then SETs"),
    ("cow", "attach, then a slowed BGSAVE, SETs while the child saves"),
    ("mthp", "64K mTHP: attach after BGSAVE, then SETs"),
];

/// SETs of the test's mTHP runs: enough to write most of the 64K folios
/// the keys fill (so each kernel's shape shows), in a third of the time of
/// the walk-through's 100k. The demo's row sends `requests`.
const TEST_MTHP_REQUESTS: u64 = 30_000;

/// SETs of the COW run, sent while the child saves: 20,000 took 4.6 s
/// under TCG, traced.
const COW_REQUESTS: u64 = 10_000;

/// The COW run's child sleeps this long a key (`rdb-key-save-delay`, µs).
/// Under TCG each sleep costs about 190 µs more: at 100 µs, 100k keys took
/// 29 s. At 20, several times the SETs' time.
const COW_SAVE_DELAY_US: u64 = 20;

/// What a parent's copies may add that the child's private dirty memory
/// does not: a copy of the zero page (memory read before it was written)
/// leaves the child nothing. 256 pages.
const ZERO_PAGE_COPIES: u64 = 256 * 4096;

pub fn run(keys: u64, value_size: u64, requests: u64) -> Result<()> {
    let mthp_requests = requests.min(TEST_MTHP_REQUESTS);
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for (i, name) in MTHP_KERNELS.iter().enumerate() {
        let k = kernels::by_name(name)?;
        if k.skipped("Redis on 64K mTHP") {
            continue;
        }
        // The 4K walk-through runs in the first kernel's guest too.
        let runs: &[&str] = if i == 0 { &["run1", "run2", "cow", "mthp"] } else { &["mthp"] };
        match guest(k, runs, keys, value_size, requests, mthp_requests) {
            Ok((row, mut f)) => {
                rows.push(row);
                failures.append(&mut f);
            }
            Err(e) => failures.push(format!("{}: {e:#}", k.name)),
        }
    }
    print!("{}", mthp_table(&rows, keys, value_size, mthp_requests));
    failures.extend(mthp_shape(&rows));
    if !failures.is_empty() {
        bail!("redis test failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

/// The demo's Redis row: the mTHP run on each kernel of [`MTHP_KERNELS`]
/// (skipping one that cannot be had), its table, and its failures said.
pub fn demo_row() -> Result<()> {
    let (keys, value_size, requests) = (100_000, 512, 100_000);
    let mut rows = Vec::new();
    for name in MTHP_KERNELS {
        let k = kernels::by_name(name)?;
        if k.skipped("the Redis row") {
            continue;
        }
        let (row, failures) = guest(k, &["mthp"], keys, value_size, requests, requests)?;
        for f in failures {
            println!("  (oracle check failed: {f})");
        }
        rows.push(row);
    }
    print!("{}", mthp_table(&rows, keys, value_size, requests));
    Ok(())
}

/// One kernel's mTHP run: redis-server's counts over the SETs, all checked
/// against the oracle.
pub struct MthpRow {
    pub kernel: GuestKernel,
    pub release: String,
    pub faults: u64,
    pub write_faults: u64,
    pub reuse: u64,
    pub copy: u64,
    /// 64K folios the kernel allocated during the run (its mTHP stats).
    pub folios_64k: u64,
}

/// Boots `k` with redis.sh running `runs`: the host's root over 9p, with
/// the modules it needs for that where the kernel has them as modules.
/// Returns the mTHP run's row and the failures of every run.
fn guest(
    k: GuestKernel,
    runs: &[&str],
    keys: u64,
    value_size: u64,
    requests: u64,
    mthp_requests: u64,
) -> Result<(MthpRow, Vec<String>)> {
    let env = [
        ("KEYS", keys.to_string()),
        ("VALUE_SIZE", value_size.to_string()),
        ("REQUESTS", requests.to_string()),
        ("MTHP_REQUESTS", mthp_requests.to_string()),
        ("COW_REQUESTS", COW_REQUESTS.to_string()),
        ("COW_SAVE_DELAY_US", COW_SAVE_DELAY_US.to_string()),
        ("RUNS", runs.join(" ")),
    ];
    let name = format!("redis/{}", k.name);
    let HostRootRun { run, modules: names, .. } = boot_host_root_on(k, &name, "redis.sh", &env, &[])?;
    println!(
        "{} on {} ({}), {keys} keys of {value_size} bytes, {requests} SETs per run ({mthp_requests} on mTHP)",
        run.marker("REDIS-VERSION", "Redis").map(|v| format!("Redis {v}")).unwrap_or("Redis ?".into()),
        k.name,
        if names.is_empty() { "9p built in".to_string() } else { format!("modules {}", names.join(", ")) }
    );
    let mut failures = Vec::new();
    let mut row = None;
    for (name, what) in RUNS.iter().filter(|(n, _)| runs.contains(n)) {
        match check_run(&run, name, what) {
            Ok(r) => {
                print!("{}", r.table);
                failures.extend(r.failures.into_iter().map(|f| format!("{}: {f}", k.name)));
            }
            Err(e) => failures.push(format!("{} {name}: {e:#}", k.name)),
        }
        if *name == "mthp" {
            row = mthp_row(&run, k).map_err(|e| failures.push(format!("{} mthp: {e:#}", k.name))).ok();
        }
    }
    println!(
        "guest {} booted, ran {} and powered off in {:.1}s",
        k.name,
        runs.join(", "),
        run.wall.as_secs_f64()
    );
    // Without its row, the failures are the error: they say why.
    let Some(row) = row else {
        bail!("no mthp row:\n  {}", failures.join("\n  "));
    };
    Ok((row, failures))
}

fn mthp_row(run: &vm::GuestRun, k: GuestKernel) -> Result<MthpRow> {
    let pid: u32 = run.marker("PID", "mthp").and_then(|p| p.parse().ok()).context("no redis-server pid")?;
    let report = check::report(run, "mthp.fs.json")?;
    let p = check::process(&report, pid)?;
    let get = |m: ReportClass| p.count(m).unwrap_or(0);
    Ok(MthpRow {
        kernel: k,
        release: report.kernel.clone(),
        faults: get(ReportClass::Faults),
        write_faults: get(ReportClass::WriteFaults),
        reuse: get(ReportClass::Reuse),
        copy: get(ReportClass::Copy),
        folios_64k: run.marker("MTHP-ALLOC", "mthp").and_then(|v| v.parse().ok()).unwrap_or(0),
    })
}

fn mthp_table(rows: &[MthpRow], keys: u64, value_size: u64, requests: u64) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nRedis on 64K mTHP: {keys} keys of {value_size} B, BGSAVE, then faultscope record -p over {requests} SETs; redis-server (faultscope = oracle)"
    );
    let _ = write!(t, "  {:<24}", "");
    for r in rows {
        let _ = write!(t, " {:>26}", r.release);
    }
    t.push('\n');
    type Cell = (&'static str, fn(&MthpRow) -> u64);
    let cells: [Cell; 5] = [
        ("faults", |r| r.faults),
        ("write faults", |r| r.write_faults),
        ("reuse", |r| r.reuse),
        ("copy", |r| r.copy),
        ("64K folios allocated", |r| r.folios_64k),
    ];
    for (what, f) in cells {
        let _ = write!(t, "  {what:<24}");
        for r in rows {
            let _ = write!(t, " {:>26}", f(r));
        }
        t.push('\n');
    }
    t
}

/// What each kernel must show on 64K mTHP, beyond the oracle: Redis got
/// 64K folios; 6.12 copies them page by page, stock 7.3 reuses them page
/// by page, and with the series far fewer faults are taken than on stock
/// 7.3 (the series' own Redis figures: 262,100 -> 18,550).
fn mthp_shape(rows: &[MthpRow]) -> Vec<String> {
    let mut f = Vec::new();
    let stock73 = rows.iter().find(|r| {
        r.kernel.reuse() == FolioReuse::PageByPage && crate::check::kernel_at_least(&r.release, 6, 16)
    });
    for r in rows {
        let n = r.kernel.name;
        if r.folios_64k == 0 {
            f.push(format!("{n} mthp: Redis got no 64K folios"));
        }
        match r.kernel.reuse() {
            FolioReuse::PageByPage if crate::check::kernel_at_least(&r.release, 6, 16) => {
                if r.reuse <= r.copy {
                    f.push(format!(
                        "{n} mthp: reuse {} <= copy {}: 7.3 reuses 64K folios page by page",
                        r.reuse, r.copy
                    ));
                }
            }
            FolioReuse::PageByPage => {
                if r.copy <= r.reuse {
                    f.push(format!(
                        "{n} mthp: copy {} <= reuse {}: before 6.16, 64K folios are copied",
                        r.copy, r.reuse
                    ));
                }
            }
            FolioReuse::WholeFolio | FolioReuse::ContpteBlock => match stock73 {
                Some(s) if r.write_faults * 4 >= s.write_faults => f.push(format!(
                    "{n} mthp: {} write faults, not under a quarter of stock 7.3's {}",
                    r.write_faults, s.write_faults
                )),
                Some(_) => {}
                None => f.push(format!("{n} mthp: no stock 7.3 run to compare with")),
            },
        }
    }
    f
}

/// A guest that runs `script` (of xtask/guest) on this machine's root over
/// 9p, the 9p modules loaded first where the kernel has them as modules
/// (`MODULES`), with `env` and the `extra` files; the guest's `@@FS-FAIL`
/// line fails it. `name` names its folder under target/vm and the error.
pub struct HostRootRun {
    pub run: vm::GuestRun,
    pub modules: Vec<String>,
    /// Its folder, for what the checks write beside it.
    pub dir: std::path::PathBuf,
}

/// [`HostRootRun`] on kernel `k`: a Debian package's 9p modules, or none
/// for a kernel built here (9p built in).
pub fn boot_host_root_on(
    k: GuestKernel,
    name: &str,
    script: &str,
    env: &[(&str, String)],
    extra: &[(std::path::PathBuf, String)],
) -> Result<HostRootRun> {
    setup::setup()?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm").join(name);
    std::fs::create_dir_all(&dir)?;
    // The 9p modules of the unpacked kernel package, decompressed under
    // `dir`: the initramfs files (dependencies first) and their names in
    // the order the guest's `host_root` (redis.sh) loads them (its `MODULES`).
    let mut files = match k.source {
        Source::Package { .. } => vm::kernel_modules(&kernels::modules_dir(k)?, MODULES, &dir)?,
        Source::Built(_) | Source::Image(_) => Vec::new(),
    };
    let names: Vec<String> = files
        .iter()
        .filter_map(|(_, g)| g.strip_prefix("/modules/").and_then(|n| n.strip_suffix(".ko")))
        .map(str::to_string)
        .collect();
    files.extend(extra.iter().cloned());
    let mut env = env.to_vec();
    env.push(("MODULES", names.join(" ")));
    let cpio = vm::initramfs_with(&dir, k.arch, &bin, script, &env, &files)?;
    let run = vm::boot_with(
        k,
        &vmlinuz,
        &cpio,
        &dir,
        Duration::from_secs(600),
        &vm::virtfs_host_root(),
        vm::Machine::host(),
    )?;
    run.failed(&format!("the {name} guest"))?;
    Ok(HostRootRun { run, modules: names, dir })
}

/// `key:value` lines of an INFO reply.
pub fn parse_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// "123.45" (seconds, from /proc/uptime) in ns: exact for its two
/// decimals (rounded, up to 10^6 s).
fn uptime_ns(s: &str) -> Option<u64> {
    Some((s.parse::<f64>().ok()? * 1e9).round() as u64)
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

/// Run `name`'s `faultscope record` of redis-server: its pid and report
/// (an error when record failed: its output).
pub fn recorded(run: &vm::GuestRun, name: &str) -> Result<(u32, faultscope::report::schema::Report)> {
    run.exited_ok(name, &format!("{name}.out")).context("faultscope record")?;
    let pid: u32 = run.marker("PID", name).and_then(|p| p.parse().ok()).context("no redis-server pid")?;
    Ok((pid, check::report(run, &format!("{name}.fs.json"))?))
}

/// What every traced run of `name` must show: no kretprobe return lost, no
/// kprobe left after detaching, no oracle trace overrun (ok, what).
pub fn health(
    run: &vm::GuestRun,
    name: &str,
    report: &faultscope::report::schema::Report,
) -> Vec<(bool, String)> {
    let lost = report.drop_count(DropReason::Kernel(DropKind::LostReturn));
    let mut out = vec![(lost == 0, format!("kretprobe returns lost: {lost}"))];
    for (tag, want) in [("KPROBES-LEFT", "0"), ("OVERRUN", "0")] {
        let v = run.marker(tag, name).unwrap_or_default();
        out.push((v == want, format!("{tag} = {v}")));
    }
    out
}

fn check_run(run: &vm::GuestRun, name: &str, what: &str) -> Result<check::CaseResult> {
    let mut fails = Vec::new();
    let (pid, report) = recorded(run, name)?;
    let p = check::process(&report, pid)?;
    if report.mode != Mode::Kprobe {
        fails.push(format!("{name}: mode is {}, not kprobe", check::mode_name(&report)));
    }
    if p.comm != "redis-server" {
        fails.push(format!("{name}: pid {pid} is {:?}, not redis-server", p.comm));
    }
    let sec = format!("{name}.oracle");
    let cmp = check::oracle_of(run, &sec)?
        .compare(name, &p.classes, pid, "attach")
        .with_context(|| format!("redis-server: {}", check::oracle_gap(run, name, &sec, pid, "attach")))?
        .allowing_skipped(name, &report);

    let mut t = String::new();
    let _ = writeln!(t, "=== {name}: {what} ===");
    let _ = writeln!(
        t,
        "  redis-server pid {pid}; {}; redis-benchmark: {}",
        run.marker("POPULATE", name).unwrap_or_default(),
        run.marker("BENCH", name).unwrap_or_default()
    );
    t.push_str(&cmp.table("redis-server"));
    fails.extend(cmp.failures);
    let get = |m: ReportClass| p.count(m).unwrap_or(0);
    let keys = run.marker("KEYS", name).unwrap_or_default();
    let mut cl = Checklist::new(name, &mut t, &mut fails);
    let loaded = run.marker("POPULATE", name).unwrap_or_default();
    cl.expect(loaded == format!("loaded dbsize={keys}"), format!("{keys} keys loaded: {loaded:?}"));
    let (reuse, copy) = (get(ReportClass::Reuse), get(ReportClass::Copy));
    cl.expect(
        reuse + copy > 0,
        format!("the SETs' write-protect faults show: reuse {reuse} + copy {copy} > 0"),
    );
    for (ok, what) in health(run, name, &report) {
        cl.expect(ok, what);
    }
    kernel_side(&mut cl, p, check::skipped_runs(&report));
    phase_table(&mut cl, p);
    let phases = &p.phases;
    let forks: Vec<&str> =
        phases.iter().map(|ph| ph.name.as_str()).filter(|n| n.starts_with("fork#")).collect();

    let bg = run.marker("BGSAVE", name).context("no BGSAVE marker")?;
    let bgw: Vec<&str> = bg.split_whitespace().collect();
    let (t0, t1) = match bgw.as_slice() {
        [a, b, ..] => (uptime_ns(a).context("BGSAVE t0")?, uptime_ns(b).context("BGSAVE t1")?),
        _ => bail!("bad BGSAVE marker {bg:?}"),
    };
    let reply = bgw.get(2..).map(|w| w.join(" ")).unwrap_or_default();
    cl.expect(reply == "Background saving started", format!("BGSAVE replied {reply:?}"));

    if name == "run1" || name == "mthp" {
        let info = parse_info(run.section(&format!("{name}.info.after-bgsave"))?);
        let v = |k: &str| info.get(k).map(String::as_str).unwrap_or("?");
        cl.line(format!("  Redis INFO before attaching: rdb_bgsave_in_progress {}, rdb_last_bgsave_status {}, latest_fork_usec {}, rdb_last_cow_size {}, total_forks {}",
            v("rdb_bgsave_in_progress"),
            v("rdb_last_bgsave_status"),
            v("latest_fork_usec"),
            v("rdb_last_cow_size"),
            v("total_forks")
        ));
        cl.expect(
            v("rdb_bgsave_in_progress") == "0" && v("rdb_last_bgsave_status") == "ok",
            "BGSAVE had ended, ok, before faultscope attached",
        );
        // The child was reaped before faultscope attached: nothing forked or
        // exited during the trace.
        cl.expect(forks.is_empty(), format!("no fork phase while attached after the BGSAVE: {forks:?}"));
        // Pages written after a fork whose child is gone are the parent's
        // alone: 4K anonymous pages are reused, not copied (large folios:
        // per kernel, `mthp_shape`).
        if name == "run1" {
            cl.expect(
                reuse > copy,
                format!("reuse {reuse} > copy {copy} (child gone: write-protected pages are reused)"),
            );
        }
    } else {
        check_bgsave_phases(run, name, phases, &forks, (t0, t1), &mut cl)?;
    }
    if name == "cow" {
        check_cow(run, name, phases, &mut cl)?;
    }
    if name == "run2" {
        for (file, block, text) in walkthroughs(&report) {
            let checked = crate::walkthrough::check(file, block, &text);
            cl.expect(
                checked.is_ok(),
                checked
                    .err()
                    .map_or(format!("docs/{file}: {block} as this run prints it"), |e| format!("{e:#}")),
            );
        }
    }
    Ok(check::CaseResult { table: t, failures: fails })
}

/// The walk-throughs this run makes (see `walkthrough`): (file, block,
/// text). The BGSAVE one is the report's tables without attribution; the
/// mappings one is the child-alive phase's section, attribution included,
/// with the findings.
fn walkthroughs(report: &faultscope::report::schema::Report) -> Vec<(&'static str, &'static str, String)> {
    use faultscope::report::text::to_text;
    let mut plain = report.clone();
    for p in &mut plain.processes {
        p.attribution = Default::default();
        for ph in &mut p.phases {
            ph.attribution = Default::default();
        }
    }
    let findings = faultscope::report::findings::to_text(&report.findings);
    let full = to_text(report) + &findings;
    let mut section = String::new();
    let mut inside = false;
    for l in full.lines() {
        if l.starts_with("PID ") {
            inside = l.contains(" child-alive ");
        } else if l.starts_with("Findings:") {
            inside = true;
        }
        if inside {
            section.push_str(l);
            section.push('\n');
        }
    }
    vec![
        ("walkthrough-redis-bgsave.md", "redis-bgsave", to_text(&plain) + &findings),
        ("walkthrough-mappings.md", "redis-child-alive", section),
    ]
}

/// The faults the kernel took for redis-server (read(2) of a request into
/// a COW-shared buffer...), and the kernel's own count of the window:
/// /proc at attach and at the end, a range while it serves.
fn kernel_side(cl: &mut Checklist, p: &faultscope::report::schema::Process, skipped: u64) {
    let origin = |m: ReportClass, o: &str| p.classes.get(&m).and_then(|v| v.origin_count(o)).unwrap_or(0);
    let mut by_syscall: BTreeMap<String, u64> = BTreeMap::new();
    for s in p.attribution.sites.iter().filter(|s| s.syscall.is_some()) {
        *by_syscall
            .entry(format!("{} {} from {}", s.class, s.syscall.as_deref().unwrap_or("?"), s.site))
            .or_default() += s.count;
    }
    cl.line(format!(
        "  kernel-origin faults: {} (copy {}, reuse {}), get_user_pages: {}; sites: {by_syscall:?}",
        origin(ReportClass::Faults, "kernel"),
        origin(ReportClass::Copy, "kernel"),
        origin(ReportClass::Reuse, "kernel"),
        origin(ReportClass::Faults, "gup"),
    ));
    match &p.kernel_check {
        Some(k) => cl.expect(
            check::kernel_check_agrees(k, skipped),
            format!(
                "kernel check {:?}: faultscope {} in min_flt+maj_flt {:?}..{:?} ({}; program runs the kernel skipped: {skipped})",
                k.result,
                k.faultscope,
                k.kernel_low,
                k.kernel_high,
                k.bracket.as_deref().or(k.reason.as_deref()).unwrap_or("")
            ),
        ),
        None => cl.expect(false, "the report has a kernel check"),
    }
}

/// faultscope's phases, and their sums against the process's totals.
fn phase_table(cl: &mut Checklist, p: &faultscope::report::schema::Process) {
    let get = |m: ReportClass| p.count(m).unwrap_or(0);
    let phases = &p.phases;
    cl.line("  faultscope phases:");
    for ph in phases {
        let c = |m: ReportClass| count(&ph.classes, m).unwrap_or(0);
        cl.line(format!(
            "    {:<28} {:>10}  faults {:>6} wp {:>6} reuse {:>6} copy {:>6} spurious {:>3}",
            ph.name,
            ms(ph.end_ns.unwrap_or(0).saturating_sub(ph.start_ns)),
            c(ReportClass::Faults),
            c(ReportClass::WpFaults),
            c(ReportClass::Reuse),
            c(ReportClass::Copy),
            c(ReportClass::Spurious),
        ));
    }
    // The phases split the process' counts: their sums are its totals.
    for m in [ReportClass::Faults, ReportClass::WpFaults, ReportClass::Reuse, ReportClass::Copy] {
        let sum: u64 = phases.iter().filter_map(|ph| count(&ph.classes, m)).sum();
        if sum != get(m) {
            cl.expect(false, format!("{m}: phases sum to {sum}, total {}", get(m)));
        }
    }
}

/// The COW run: the bytes the parent's copies allocated while the child
/// saved, beside Redis's own measure of them, `rdb_last_cow_size`: the
/// child's private dirty memory (smaps) when it finished. Each copy leaves
/// the child the old page, dirty and its own, so the copies' bytes are at
/// most that (plus [`ZERO_PAGE_COPIES`]); the rest is the child's own
/// memory and pages the parent freed while the child lived.
fn check_cow(run: &vm::GuestRun, name: &str, phases: &[Phase], cl: &mut Checklist) -> Result<()> {
    let saving = run.marker("SAVING-AFTER-SETS", name).unwrap_or_default();
    cl.expect(
        saving == "1",
        format!("the child still saved when the SETs ended (rdb_bgsave_in_progress {saving:?}; if 0, raise COW_SAVE_DELAY_US)"),
    );
    let info = parse_info(run.section(&format!("{name}.info.end"))?);
    let rdb: u64 =
        info.get("rdb_last_cow_size").and_then(|v| v.parse().ok()).context("no rdb_last_cow_size")?;
    let Some(alive) = phases.iter().find(|ph| ph.name == "fork#1 child-alive") else {
        cl.expect(false, "no child-alive phase");
        return Ok(());
    };
    let Some(ClassValue::Measured(copy)) = alive.classes.get(&ReportClass::Copy) else {
        cl.expect(false, "copy is not measured");
        return Ok(());
    };
    let Some(bytes) = copy.folios.as_ref().map(|f| f.bytes) else {
        cl.expect(false, "copy has no folio sizes");
        return Ok(());
    };
    cl.line(format!(
        "  COW while the child saved: faultscope {} copies, {} copied ({bytes} bytes); Redis rdb_last_cow_size {rdb} bytes; the difference {} (the child's own memory, pages the parent freed)",
        copy.count,
        faultscope::units::bytes(bytes),
        rdb as i64 - bytes as i64
    ));
    cl.expect(
        copy.count > 0 && bytes == copy.count * 4096,
        format!("the SETs copied pages, each 4K (Redis turns THP off): {} copies, {bytes} bytes", copy.count),
    );
    cl.expect(
        bytes <= rdb + ZERO_PAGE_COPIES,
        format!("copied {bytes} <= rdb_last_cow_size {rdb} + {ZERO_PAGE_COPIES} (zero-page copies)"),
    );
    Ok(())
}

/// Run 2: the fork phases against Redis' own account of the BGSAVE:
/// exactly one fork while attached (INFO total_forks and rdb_saves +1), the
/// BGSAVE ended ok, the child lived within the BGSAVE command's window (one
/// clock: BPF ktime and /proc/uptime), and its duration is bounded by
/// rdb_last_bgsave_time_sec + 1 s + latest_fork_usec (sound) and at least
/// latest_fork_usec (plausibility only).
fn check_bgsave_phases(
    run: &vm::GuestRun,
    name: &str,
    phases: &[Phase],
    forks: &[&str],
    (t0, t1): (u64, u64),
    cl: &mut Checklist,
) -> Result<()> {
    let before = parse_info(run.section(&format!("{name}.info.before"))?);
    let after = parse_info(run.section(&format!("{name}.info.end"))?);
    let num = |m: &BTreeMap<String, String>, k: &str| m.get(k).and_then(|v| v.parse::<i64>().ok());
    let show = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
    let v = |k: &str| after.get(k).map(String::as_str).unwrap_or("?");
    cl.line(format!(
        "  Redis INFO: total_forks {} -> {}, rdb_saves {} -> {}, rdb_last_bgsave_status {}, rdb_bgsave_in_progress {}, latest_fork_usec {}, rdb_last_bgsave_time_sec {}, rdb_last_cow_size {}",
        show(num(&before, "total_forks")),
        show(num(&after, "total_forks")),
        show(num(&before, "rdb_saves")),
        show(num(&after, "rdb_saves")),
        v("rdb_last_bgsave_status"),
        v("rdb_bgsave_in_progress"),
        v("latest_fork_usec"),
        v("rdb_last_bgsave_time_sec"),
        v("rdb_last_cow_size"),
    ));
    let delta = |k: &str| Some(num(&after, k)? - num(&before, k)?);
    cl.expect(
        delta("total_forks") == Some(1),
        format!("Redis forked once while attached: total_forks +{}", show(delta("total_forks"))),
    );
    if num(&after, "rdb_saves").is_some() {
        cl.expect(
            delta("rdb_saves") == Some(1),
            format!("one RDB save: rdb_saves +{}", show(delta("rdb_saves"))),
        );
    }
    cl.expect(
        v("rdb_last_bgsave_status") == "ok" && v("rdb_bgsave_in_progress") == "0",
        format!(
            "the BGSAVE ended ok (rdb_last_bgsave_status {}, rdb_bgsave_in_progress {})",
            v("rdb_last_bgsave_status"),
            v("rdb_bgsave_in_progress")
        ),
    );
    cl.expect(
        forks == ["fork#1 child-alive", "fork#1 after-child-exit"],
        format!("exactly one fork, the BGSAVE's: fork phases {forks:?}"),
    );
    let find = |n: &str| phases.iter().find(|ph| ph.name == n);
    let (Some(alive), Some(exit)) = (find("fork#1 child-alive"), find("fork#1 after-child-exit")) else {
        return Ok(());
    };
    let start = alive.start_ns;
    let end = alive.end_ns.unwrap_or(0);
    let d = end.saturating_sub(start);
    cl.expect(exit.start_ns == end, "after-child-exit starts where child-alive ends");
    cl.line(format!(
        "  BGSAVE seen by the guest: sent at {:.2}s, end seen at {:.2}s ({}); fork#1 child-alive {:.3}s .. {:.3}s ({})",
        t0 as f64 / 1e9,
        t1 as f64 / 1e9,
        ms(t1 - t0),
        start as f64 / 1e9,
        end as f64 / 1e9,
        ms(d)
    ));
    cl.expect(
        t0 <= start && end <= t1 + UPTIME_RES_NS,
        "the child lived within the BGSAVE command's window (sent .. seen ended)",
    );
    let fork_ns = num(&after, "latest_fork_usec").unwrap_or(-1);
    let save_s = num(&after, "rdb_last_bgsave_time_sec").unwrap_or(-1);
    if fork_ns >= 0 && save_s >= 0 {
        let fork_ns = fork_ns as u64 * 1000;
        let bound = (save_s as u64 + 1) * 1_000_000_000 + fork_ns;
        cl.expect(
            d < bound,
            format!("child-alive {} < rdb_last_bgsave_time_sec {save_s} s + 1 s + latest_fork_usec", ms(d)),
        );
        cl.expect(
            d >= fork_ns,
            format!("child-alive {} >= latest_fork_usec {} (plausibility)", ms(d), ms(fork_ns)),
        );
    } else {
        cl.expect(false, "INFO has no latest_fork_usec or rdb_last_bgsave_time_sec");
    }
    check_child_alive_attribution(alive, cl);
    // The COW run's SETs end before the child does.
    if name != "cow" {
        let reuse_after = count(&exit.classes, ReportClass::Reuse).unwrap_or(0);
        cl.expect(
            reuse_after > 0,
            format!("the SETs after the child's exit reuse write-protected pages: reuse {reuse_after}"),
        );
    }
    Ok(())
}

/// The COW copies while the BGSAVE child lived, attributed: the phase's
/// mapping rows (and `mappings_other`) add up to its copy total, some named
/// mapping holds copies, and the copy sites (default `--sites` has copy),
/// with `sites_other`, add up to the same total.
fn check_child_alive_attribution(alive: &Phase, cl: &mut Checklist) {
    let a = &alive.attribution;
    let copies = count(&alive.classes, ReportClass::Copy).unwrap_or(0);
    let copy = |c: &BTreeMap<ReportClass, u64>| c.get(&ReportClass::Copy).copied().unwrap_or(0);
    let mut rows: Vec<_> = a.mappings.iter().filter(|r| copy(&r.counts) > 0).collect();
    rows.sort_by_key(|r| std::cmp::Reverse(copy(&r.counts)));
    cl.line(format!("  fork#1 child-alive: {copies} copies, by mapping:"));
    for r in rows.iter().take(6) {
        cl.line(format!(
            "    {:>6}  {} ({} KiB{})",
            copy(&r.counts),
            r.mapping,
            r.size >> 10,
            if r.exact { "" } else { ", not exact" }
        ));
    }
    let other = a.mappings_other.as_ref().map_or(0, |o| copy(&o.counts));
    let in_rows: u64 = rows.iter().map(|r| copy(&r.counts)).sum();
    if other > 0 {
        cl.line(format!(
            "    {other:>6}  other ({} mappings)",
            a.mappings_other.as_ref().map_or(0, |o| o.entries)
        ));
    }
    cl.expect(
        in_rows + other == copies,
        format!("child-alive copies by mapping {in_rows} + other {other} = {copies}"),
    );
    let named: u64 =
        rows.iter().filter(|r| !r.mapping.starts_with("unresolved")).map(|r| copy(&r.counts)).sum();
    cl.expect(named > 0, format!("child-alive copies in named mappings: {named}"));
    let mut sites: Vec<_> = a.sites.iter().filter(|s| s.class == ReportClass::Copy).collect();
    sites.sort_by_key(|s| std::cmp::Reverse(s.count));
    cl.line("  fork#1 child-alive: copy sites:");
    for s in sites.iter().take(6) {
        cl.line(format!("    {:>6}  {}", s.count, s.site));
    }
    let folded = a.sites_other.iter().find(|f| f.class == ReportClass::Copy);
    if let Some(f) = folded {
        cl.line(format!("    {:>6}  other ({} sites)", f.count, f.entries));
    }
    let in_sites: u64 = sites.iter().map(|s| s.count).sum();
    let other = folded.map_or(0, |f| f.count);
    cl.expect(
        !sites.is_empty() && in_sites + other == copies,
        format!("child-alive copy sites {in_sites} + other {other} = {copies} ({} sites)", sites.len()),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_parses() {
        assert_eq!(uptime_ns("12.34"), Some(12_340_000_000));
        assert_eq!(uptime_ns("7"), Some(7_000_000_000));
        assert_eq!(uptime_ns("x"), None);
    }

    #[test]
    fn info_parses() {
        let i = parse_info("# Persistence\nrdb_bgsave_in_progress:0\nlatest_fork_usec:123\n\n");
        assert_eq!(i["rdb_bgsave_in_progress"], "0");
        assert_eq!(i["latest_fork_usec"], "123");
    }
}
