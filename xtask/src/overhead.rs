//! `cargo xtask overhead`: what tracing costs the traced, side by side with
//! bpftrace. The same `faultscope bench` (its own step timing, so every
//! variant times the same thing) runs bare, beside bpftrace scripts (the
//! floors among them: the probe mechanism with little or nothing in it),
//! traced by faultscope, and untraced while faultscope records another
//! process (what it costs those it does not trace), the variants
//! interleaved round after round in one session (these machines are noisy:
//! only ratios taken side by side mean anything). Then each tracer a few times more with the kernel's BPF run
//! time accounting on (`kernel.bpf_stats_enabled`), its programs read by
//! bpftool right before the bench's write step and at its end (the bench
//! stops itself there), and faultscope `record --interval 1` over two
//! storms of faults (by fork, by MADV_DONTNEED), its CPU time and RSS
//! sampled from `/proc`.
//!
//! In a guest (QEMU TCG, kprobes and fentry; bpftrace from
//! [`crate::bpftrace`]'s image; by default on an instruction clock, see
//! [`vm::Clock`]) or on this host (`--host`: tracepoint mode only).
//! `xtask/guest/overhead.sh` runs it in both.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use faultscope::{
    kernel::classes::ReportClass,
    report::{
        bench_series::Stats,
        schema::{BenchStep, Report},
    },
};
use serde::Deserialize;

use crate::{bpftrace, check, kernels, util::root, vm};

/// A bpftrace script the benchmark runs beside the bench.
struct Script {
    file: &'static str,
    text: &'static str,
    /// The map whose count must reach the pages written: bpftrace was
    /// attached while the bench wrote. None for the empty floors, which
    /// count nothing: a counter would be the very cost they leave out, so
    /// nothing tells that they saw the writes but their attach (BEGIN fires
    /// once every probe is attached) and the stats rounds, where bpftool
    /// lists their programs and the runs of each.
    counter: Option<&'static str>,
    /// On x86 only (`exceptions:page_fault_user` is arch/x86's tracepoint;
    /// arm64 has none): refused for another architecture.
    x86_only: bool,
}

/// A script of `file`: BEGIN's line first (BEGIN fires once every probe is
/// attached, so its line times the attach), then `lines`.
macro_rules! script {
    ($file:literal, $counter:expr, $x86_only:literal, $($line:expr),+) => {
        Script {
            file: $file,
            text: concat!("BEGIN { printf(\"bpftrace: attached\\n\"); }\n", $($line, "\n"),+),
            counter: $counter,
            x86_only: $x86_only,
        }
    };
}

/// Entry and return probes on `handle_mm_fault`, the latency in a hist(), a
/// count of `do_wp_page`, attached as `$entry`/`$exit`: what a new user
/// would write. No pid filter, as in such a one-liner (the guest runs
/// nothing else).
macro_rules! bt_fault_script {
    ($file:literal, $entry:literal, $exit:literal) => {
        script!(
            $file,
            Some("@do_wp_page"),
            false,
            concat!($entry, ":handle_mm_fault { @start[tid] = nsecs; }"),
            concat!($exit, ":handle_mm_fault /@start[tid]/ { @latency_ns = hist(nsecs - @start[tid]); delete(@start[tid]); }"),
            concat!($entry, ":do_wp_page { @do_wp_page = count(); }")
        )
    };
}

/// On kprobe and kretprobe.
const BT_KPROBE: Script = bt_fault_script!("kprobe.bt", "kprobe", "kretprobe");

/// The same on fentry/fexit (bpftrace's kfunc/kretfunc).
const BT_FENTRY: Script = bt_fault_script!("fentry.bt", "kfunc", "kretfunc");

/// Where there are no kprobes (this host): the x86 user fault tracepoint,
/// faults and write faults (error code bit 1) counted.
const BT_TRACEPOINT: Script = script!("tracepoint.bt", Some("@write_faults"), true,
    "tracepoint:exceptions:page_fault_user { @faults = count(); if (args->error_code & 2) { @write_faults = count(); } }");

/// The least any fentry tracer of the fault can cost: one program on
/// `handle_mm_fault`'s entry with one per-CPU count.
const BT_FLOOR: Script = script!("floor.bt", Some("@"), false, "kfunc:handle_mm_fault { @ = count(); }");

/// The mechanism alone of an entry and exit pair: empty programs on
/// `handle_mm_fault`'s fentry and fexit. bpftrace 0.17 keeps an empty body:
/// it loads and attaches a program that returns at once (`return 1`, which
/// fentry and fexit ignore), and bpftool lists both in the stats rounds.
const BT_FLOOR_PAIR: Script =
    script!("floor-pair.bt", None, false, "kfunc:handle_mm_fault {}", "kretfunc:handle_mm_fault {}");

/// The mechanism alone of x86's user fault tracepoint: one empty program.
/// Not quite the mechanism alone: bpftrace 0.17's programs return 1, and
/// it opens the tracepoint's perf event on CPU 0 only (the program runs on
/// every CPU), so a fault on CPU 0 goes on from the program to that perf
/// event's sample; a run takes one of two times, by the CPU the bench runs
/// on (docs/cost.md).
const BT_FLOOR_TP: Script = script!("floor-tp.bt", None, true, "tracepoint:exceptions:page_fault_user {}");

const SCRIPTS: [&Script; 6] =
    [&BT_KPROBE, &BT_FENTRY, &BT_TRACEPOINT, &BT_FLOOR, &BT_FLOOR_PAIR, &BT_FLOOR_TP];

#[derive(Clone, Copy)]
enum Kind {
    /// `bench --no-trace` alone.
    Bare,
    /// `bench --no-trace` while bpftrace runs the script.
    Bpftrace(&'static Script),
    /// The bench traced by faultscope, with these flags.
    Faultscope(&'static str),
    /// `bench --no-trace`, not traced, while `faultscope record -p` with
    /// these flags traces another process (a `sleep`) for the whole run:
    /// what faultscope costs the processes it does not trace.
    Untraced(&'static str),
}

struct Variant {
    name: &'static str,
    kind: Kind,
}

const fn v(name: &'static str, kind: Kind) -> Variant {
    Variant { name, kind }
}

/// Every variant, by name (`--variant`).
const VARIANTS: &[Variant] = &[
    v("bare", Kind::Bare),
    v("bpftrace-kprobe", Kind::Bpftrace(&BT_KPROBE)),
    v("bpftrace-fentry", Kind::Bpftrace(&BT_FENTRY)),
    v("bpftrace-tracepoint", Kind::Bpftrace(&BT_TRACEPOINT)),
    v("floor", Kind::Bpftrace(&BT_FLOOR)),
    v("floor-pair", Kind::Bpftrace(&BT_FLOOR_PAIR)),
    v("floor-tp", Kind::Bpftrace(&BT_FLOOR_TP)),
    v("faultscope-kprobe", Kind::Faultscope("--backend kprobe")),
    v("faultscope-fentry", Kind::Faultscope("--backend fentry")),
    // The latency tiers: one fault in 16 timed, and none (counts only).
    v("faultscope-fentry-sampled", Kind::Faultscope("--backend fentry --latency sample=16")),
    v("faultscope-fentry-counts", Kind::Faultscope("--backend fentry --latency off")),
    v("faultscope-kprobe-sampled", Kind::Faultscope("--backend kprobe --latency sample=16")),
    v("faultscope-kprobe-counts", Kind::Faultscope("--backend kprobe --latency off")),
    // Whatever the kernel allows (on this host: the tracepoint).
    v("faultscope", Kind::Faultscope("")),
    // What attribution costs: none at all, and every written page's site
    // and user stack (per-mapping counts are the default).
    v("faultscope-kprobe-no-attribution", Kind::Faultscope("--backend kprobe --no-mappings --sites none")),
    v(
        "faultscope-kprobe-stacks",
        Kind::Faultscope("--backend kprobe --sites reuse,copy --stacks reuse,copy"),
    ),
    // Not traced: faultscope records a sleeper meanwhile.
    v("untraced-kprobe", Kind::Untraced("--backend kprobe")),
    v("untraced-fentry", Kind::Untraced("--backend fentry")),
    v("untraced", Kind::Untraced("")),
];

/// The cost goals in ns added per fault of the write step: (the report's
/// arch, variant, goal).
const GOALS_NS: &[(&str, &str, f64)] = &[
    ("x86_64", "faultscope-fentry", 700.0),
    ("x86_64", "faultscope-fentry-counts", 500.0),
    ("x86_64", "untraced-fentry", 400.0),
    ("x86_64", "faultscope-kprobe", 1500.0),
    ("aarch64", "faultscope-fentry", 800.0),
];

pub const GUEST_DEFAULT: [&str; 6] =
    ["bare", "floor", "bpftrace-kprobe", "bpftrace-fentry", "faultscope-kprobe", "faultscope-fentry"];
pub const HOST_DEFAULT: [&str; 3] = ["bare", "bpftrace-tracepoint", "faultscope"];

pub fn variant_names() -> impl Iterator<Item = &'static str> {
    VARIANTS.iter().map(|v| v.name)
}

fn variant(name: &str) -> Result<&'static Variant> {
    VARIANTS.iter().find(|v| v.name == name).with_context(|| {
        format!("unknown variant {name}; known: {}", variant_names().collect::<Vec<_>>().join(", "))
    })
}

pub struct Opts {
    pub host: bool,
    pub kernel: String,
    pub size: String,
    pub runs: usize,
    /// Seconds of the `record --interval 1` storm per faultscope variant (0:
    /// none).
    pub storm: u64,
    /// Bench runs per tracer with the kernel's run time accounting on.
    pub stats_runs: usize,
    /// The guest's clock.
    pub clock: vm::Clock,
    pub variants: Vec<String>,
}

/// What the guest script runs: `NAME KIND ARGS` per line.
fn variant_lines(vs: &[&Variant]) -> String {
    let mut s = String::new();
    for v in vs {
        let _ = match v.kind {
            Kind::Bare => writeln!(s, "{} none", v.name),
            Kind::Bpftrace(b) => writeln!(s, "{} bpftrace {}", v.name, b.file),
            Kind::Faultscope(flags) => writeln!(s, "{} faultscope {flags}", v.name),
            Kind::Untraced(flags) => writeln!(s, "{} untraced {flags}", v.name),
        };
    }
    s
}

/// The variants that cannot run on `arch` (Debian's name), refused before
/// anything is built.
fn refuse_elsewhere(vs: &[&Variant], arch: &str) -> Result<()> {
    for v in vs {
        if let Kind::Bpftrace(b) = v.kind {
            if b.x86_only && arch != "amd64" {
                bail!(
                    "{}: not available on {arch}: tracepoint:exceptions:page_fault_user is x86's \
                     (an {arch} kernel has no such tracepoint)",
                    v.name
                );
            }
        }
    }
    Ok(())
}

fn write_scripts(dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    fs::create_dir_all(dir)?;
    SCRIPTS
        .iter()
        .map(|b| {
            let p = dir.join(b.file);
            fs::write(&p, b.text)?;
            Ok((p, format!("/bt-scripts/{}", b.file)))
        })
        .collect()
}

/// The bench every variant runs (4K pages, the child exits: the write step
/// is one reuse fault per page).
fn bench_args(size: &str) -> String {
    format!("seq --size {size} --folio 4K --child exit")
}

pub fn run(o: &Opts) -> Result<()> {
    let names: Vec<String> = if !o.variants.is_empty() {
        o.variants.clone()
    } else {
        let defaults: &[&str] = if o.host { &HOST_DEFAULT } else { &GUEST_DEFAULT };
        defaults.iter().map(|s| s.to_string()).collect()
    };
    let vs: Vec<&Variant> = names.iter().map(|n| variant(n)).collect::<Result<_>>()?;
    if !matches!(vs.first().map(|v| v.kind), Some(Kind::Bare)) {
        bail!("the first variant must be bare: the ratios are to it");
    }
    let k = if o.host { None } else { Some(kernels::by_name(&o.kernel)?) };
    let arch = match k {
        Some(k) => k.arch,
        None if cfg!(target_arch = "x86_64") => "amd64",
        None => std::env::consts::ARCH,
    };
    refuse_elsewhere(&vs, arch)?;
    let mut env = vec![
        ("BENCH", bench_args(&o.size)),
        ("RUNS", o.runs.to_string()),
        ("STATS_RUNS", o.stats_runs.to_string()),
        ("STORM", o.storm.to_string()),
        ("STORM_SIZE", o.size.clone()),
        ("VARIANTS", variant_lines(&vs)),
    ];
    let (g, place) = match k {
        None => (run_host(&mut env)?, "this host".to_string()),
        Some(k) => {
            // (its work folder's suffix, how the report names it)
            let (dir, clock) = match o.clock {
                vm::Clock::Host => ("host-clock", "host time"),
                vm::Clock::Instructions => {
                    ("icount", "its clock counts instructions, 1 ns each (-icount shift=0)")
                }
            };
            (run_guest(k, &env, o, dir)?, format!("guest {} (QEMU TCG, 2 vCPUs; {clock})", k.name))
        }
    };
    g.failed("the benchmark")?;
    let results = Results::parse(&g, &vs, o.runs, o.stats_runs)?;
    print!("{}", results.text(&place, &o.size, g.wall));
    Ok(())
}

fn run_guest(k: kernels::GuestKernel, env: &[(&str, String)], o: &Opts, clock: &str) -> Result<vm::GuestRun> {
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let img = bpftrace::image(k.arch)?;
    let dir = root().join("target/vm/overhead").join(format!("{}-{clock}", k.name));
    let extra = write_scripts(&dir.join("scripts"))?;
    let cpio = vm::initramfs_with(&dir, k.arch, &bin, "overhead.sh", env, &extra)?;
    // Under TCG a round of bench runs takes about a minute (bpftrace
    // compiles its script each time), arm64 twice that.
    let timeout = Duration::from_secs(900 + 240 * (o.runs + o.stats_runs) as u64 + 6 * o.storm);
    eprintln!("overhead: {} rounds in the {} guest, bpftrace image {}", o.runs, k.name, img.display());
    vm::boot_with(
        k,
        &vmlinuz,
        &cpio,
        &dir,
        timeout,
        &bpftrace::qemu_args(&img),
        vm::Machine { clock: o.clock, ..vm::Machine::host() },
    )
}

/// The same script on this machine as it is: the host's bpftrace and
/// bpftool, faultscope's release build, its own work folder.
fn run_host(env: &mut Vec<(&str, String)>) -> Result<vm::GuestRun> {
    let dir = root().join("target/vm/overhead/host");
    let work = dir.join("work");
    if work.exists() {
        fs::remove_dir_all(&work)?;
    }
    fs::create_dir_all(&work)?;
    let bin = vm::build_faultscope("amd64")?;
    let linetime = dir.join("linetime");
    crate::util::run(
        Command::new("gcc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&linetime)
            .arg(root().join("xtask/guest/linetime.c")),
    )?;
    write_scripts(&dir.join("scripts"))?;
    let guest = root().join("xtask/guest");
    let path = |p: &Path| p.display().to_string();
    env.extend([
        ("FAULTSCOPE", path(&bin)),
        ("FS_WORKLOAD", path(&crate::dist::workload_beside(&bin))),
        ("LINETIME", path(&linetime)),
        ("LIB", path(&guest.join("lib.sh"))),
        ("SCRIPTS", path(&dir.join("scripts"))),
        ("WORK", path(&work)),
        ("BT_ROOT", String::new()),
    ]);
    let stats = "/proc/sys/kernel/bpf_stats_enabled";
    let stats0 = fs::read_to_string(stats).unwrap_or_default();
    let log = dir.join("console.log");
    let started = Instant::now();
    use std::os::unix::process::CommandExt as _;
    let status = Command::new("sh")
        .arg(guest.join("overhead.sh"))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log)?)
        .stderr(Stdio::inherit())
        // Its own process group: whatever it leaves running is ended with it.
        .process_group(0)
        .spawn()
        .and_then(|mut c| {
            let pgid = c.id();
            let st = c.wait();
            let _ = Command::new("kill").arg("--").arg(format!("-{pgid}")).stderr(Stdio::null()).status();
            st
        })
        .context("running xtask/guest/overhead.sh")?;
    if !stats0.is_empty() {
        let _ = fs::write(stats, stats0.trim());
    }
    let console = fs::read_to_string(&log)?;
    if !status.success() && !console.contains("@@FS-FAIL") {
        bail!(
            "overhead.sh failed ({status}); output {}:\n{}",
            log.display(),
            crate::util::tail(&console, 40)
        );
    }
    Ok(vm::GuestRun::from_console(console, started.elapsed()))
}

/// One timed run of a variant.
struct Run {
    report: Report,
    /// Start to "attached" (bpftrace's BEGIN line, faultscope's "measuring").
    attach_ns: Option<u64>,
    /// What the tracer counted during the run: bpftrace's counter map,
    /// faultscope's faults in the write step.
    counted: Option<u64>,
    /// An untraced variant's `faultscope record` report (of the sleeper).
    tracer: Option<Report>,
}

impl Run {
    fn step(&self, name: &str) -> Result<&BenchStep> {
        self.report
            .bench
            .as_ref()
            .and_then(|b| b.step(name))
            .with_context(|| format!("no {name} step in the bench report"))
    }
}

/// What a step's time is taken as.
#[derive(Clone, Copy)]
struct Measure {
    of: fn(&BenchStep) -> u64,
    what: &'static str,
}

impl Measure {
    /// The workload's wall time.
    const WALL: Measure = Measure { of: |s| s.wall_ns, what: "the workload's own wall time" };
    /// The bench process's CPU time: no time waiting for a CPU.
    const CPU: Measure =
        Measure { of: |s| s.cpu_ns, what: "the bench process's CPU time (CLOCK_PROCESS_CPUTIME_ID)" };
}

/// A BPF program as `bpftool -j prog show` prints it.
#[derive(Deserialize)]
struct Prog {
    id: u64,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    run_time_ns: u64,
    #[serde(default)]
    run_cnt: u64,
}

/// Storm samples of faultscope's /proc: (uptime s, utime + stime ticks, RSS
/// kB, peak RSS kB).
struct Storm {
    attach_ns: Option<u64>,
    samples: Vec<(f64, u64, u64, u64)>,
    faults: Option<u64>,
    rc: String,
}

/// USER_HZ: the unit of utime and stime in /proc/PID/stat (100 on every
/// architecture Linux runs these guests on).
const USER_HZ: f64 = 100.0;

/// Each stats round's programs of a tracer, in load order.
type Progs<'a> = BTreeMap<&'a str, Vec<Vec<Prog>>>;

struct Results<'a> {
    variants: Vec<&'a Variant>,
    runs: BTreeMap<&'a str, Vec<Run>>,
    progs: Progs<'a>,
    storms: BTreeMap<String, Storm>,
    bpftrace: String,
    pages: u64,
}

/// An untraced run's `faultscope record` (of the sleeper): attached before
/// the bench, exited 0 on its SIGINT after it, and never traced the bench.
fn untraced_record(g: &vm::GuestRun, case: &str, bench: &Report, attach_ns: Option<u64>) -> Result<Report> {
    let out = || g.section(&format!("{case}.out")).map(|s| crate::util::tail(s, 20)).unwrap_or_default();
    if attach_ns.is_none() {
        bail!("{case}: faultscope record did not attach:\n{}", out());
    }
    let rc = g.marker("TRACER-RC", case).unwrap_or_default();
    if rc != "0" {
        bail!("{case}: faultscope record exited with {rc:?}:\n{}", out());
    }
    let rec = check::report(g, &format!("{case}.record.json"))?;
    if let Some(b) = &bench.bench {
        if rec.processes.iter().any(|p| p.pid == b.pid) {
            bail!("{case}: faultscope record traced the bench (pid {}), which it was not to", b.pid);
        }
    }
    Ok(rec)
}

/// One round of variant `v` (`case`): its report, the count its tracer
/// made of the write step, and what the tracer of an untraced run saw.
fn parse_run(g: &vm::GuestRun, v: &Variant, case: &str) -> Result<Run> {
    g.exited_ok(case, &format!("{case}.bench")).context("the bench")?;
    let report = check::report(g, &format!("{case}.json"))?;
    let pages = report.bench.as_ref().map_or(0, |b| b.pages);
    let counted = match v.kind {
        Kind::Bare | Kind::Untraced(_) => None,
        // The empty floors count nothing (see `Script::counter`).
        Kind::Bpftrace(Script { counter: None, .. }) => None,
        Kind::Bpftrace(Script { counter: Some(key), .. }) => {
            let out = g.section(&format!("{case}.bt"))?;
            Some(counter(out, key).with_context(|| {
                format!("{case}: bpftrace printed no {key}:\n{}", crate::util::tail(out, 20))
            })?)
        }
        Kind::Faultscope(_) => report
            .bench_process()
            .and_then(|p| p.span("mark:write"))
            .and_then(|s| s.count(ReportClass::Faults)),
    };
    // The tracer saw the writes: at least one fault per page.
    if let Some(n) = counted {
        if n < pages {
            bail!("{case}: the tracer counted {n} < {pages} pages written: it did not trace the bench");
        }
    } else if matches!(v.kind, Kind::Faultscope(_)) {
        bail!("{case}: faultscope counted no faults in the write step");
    }
    let attach_ns = g.marker("ATTACH", case).and_then(|s| s.parse().ok());
    let tracer = match v.kind {
        Kind::Untraced(_) => Some(untraced_record(g, case, &report, attach_ns)?),
        _ => None,
    };
    Ok(Run { report, attach_ns, counted, tracer })
}

/// Each variant's programs, as bpftool listed them, per statistics round.
fn parse_progs<'a>(g: &vm::GuestRun, vs: &[&'a Variant], stats_rounds: usize) -> Result<Progs<'a>> {
    let mut progs = Progs::new();
    for v in vs {
        if matches!(v.kind, Kind::Bare) {
            continue;
        }
        for round in 1..=stats_rounds {
            let case = format!("{}-stats{round}", v.name);
            let all = bpftool_progs(g, &format!("{case}.progs"))?;
            // The tracer's own programs: those its fds hold.
            let ids: Vec<u64> = g
                .marker("PROG-IDS", &case)
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|i| i.parse().ok())
                .collect();
            if ids.is_empty() {
                bail!("{case}: the tracer holds no BPF program fd");
            }
            let mut mine: Vec<Prog> = all.into_iter().filter(|p| ids.contains(&p.id)).collect();
            mine.sort_by_key(|p| p.id);
            // Over the write step alone: less what bpftool read right
            // before it.
            for b in bpftool_progs(g, &format!("{case}.before.progs"))? {
                if let Some(p) = mine.iter_mut().find(|p| p.id == b.id) {
                    p.run_cnt = p.run_cnt.saturating_sub(b.run_cnt);
                    p.run_time_ns = p.run_time_ns.saturating_sub(b.run_time_ns);
                }
            }
            progs.entry(v.name).or_default().push(mine);
        }
    }
    Ok(progs)
}

/// The programs `bpftool -j prog show` listed in section `name`.
fn bpftool_progs(g: &vm::GuestRun, name: &str) -> Result<Vec<Prog>> {
    let text = g.section(name)?;
    serde_json::from_str(text.trim())
        .with_context(|| format!("{name}: bpftool's output is not its JSON:\n{text}"))
}

/// The storm cases' samples, by case.
fn parse_storms(g: &vm::GuestRun) -> BTreeMap<String, Storm> {
    let mut storms = BTreeMap::new();
    for l in g.markers("STORM-SAMPLE") {
        // CASE UPTIME UTIME STIME RSS HWM
        let w: Vec<&str> = l.split_whitespace().collect();
        let n: Vec<u64> = w.iter().skip(2).take(4).map_while(|x| x.parse().ok()).collect();
        let (Some(u), &[ut, st, rss, hwm]) = (w.get(1).and_then(|x| x.parse::<f64>().ok()), &n[..]) else {
            continue;
        };
        let case = w[0];
        storms
            .entry(case.to_string())
            .or_insert_with(|| Storm {
                attach_ns: g.marker("ATTACH", case).and_then(|s| s.parse().ok()),
                samples: Vec::new(),
                faults: check::report(g, &format!("{case}.json"))
                    .ok()
                    .and_then(|r| r.processes.iter().map(|p| p.count(ReportClass::Faults)).sum()),
                rc: g.marker("RC", case).unwrap_or_default(),
            })
            .samples
            .push((u, ut + st, rss, hwm));
    }
    storms
}

fn counter(output: &str, key: &str) -> Option<u64> {
    output.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(':')?.trim().parse().ok())
}

impl<'a> Results<'a> {
    fn parse(g: &vm::GuestRun, vs: &[&'a Variant], rounds: usize, stats_rounds: usize) -> Result<Self> {
        let mut runs: BTreeMap<&str, Vec<Run>> = BTreeMap::new();
        let mut pages = 0;
        for i in 1..=rounds {
            for v in vs {
                let case = format!("{}{i}", v.name);
                let run = parse_run(g, v, &case)?;
                pages = run.report.bench.as_ref().map_or(0, |b| b.pages);
                runs.entry(v.name).or_default().push(run);
            }
        }
        let progs = parse_progs(g, vs, stats_rounds)?;
        let storms = parse_storms(g);
        Ok(Self {
            variants: vs.to_vec(),
            runs,
            progs,
            storms,
            bpftrace: g.markers("BPFTRACE-VERSION").next().unwrap_or("?").trim().to_string(),
            pages,
        })
    }

    /// The medians, ranges and ratios of a step, per variant.
    fn step_stats(&self, step: &str, m: Measure) -> Result<Vec<StepStats>> {
        let bare: Vec<u64> =
            self.runs[self.variants[0].name].iter().map(|r| r.step(step).map(m.of)).collect::<Result<_>>()?;
        self.variants
            .iter()
            .map(|v| {
                let rs = &self.runs[v.name];
                let times: Vec<u64> = rs.iter().map(|r| r.step(step).map(m.of)).collect::<Result<_>>()?;
                let faults: Vec<u64> =
                    rs.iter().map(|r| r.step(step).map(|s| s.minflt.max(0) as u64)).collect::<Result<_>>()?;
                // Each round's ratio to the bare run of the same round.
                let ratios: Vec<f64> =
                    times.iter().zip(&bare).map(|(w, b)| *w as f64 / (*b).max(1) as f64).collect();
                Ok(StepStats {
                    name: v.name,
                    median: median_u(&times),
                    min: *times.iter().min().unwrap_or(&0),
                    max: *times.iter().max().unwrap_or(&0),
                    round_ratios: (min_f(&ratios), median_f(&ratios), max_f(&ratios)),
                    faults: median_u(&faults),
                    attach: median_opt(rs.iter().map(|r| r.attach_ns)),
                    counted: median_opt(rs.iter().map(|r| r.counted)),
                })
            })
            .collect()
    }

    /// The write step's table in measure `m`, and the goals judged on it.
    fn write_table(&self, m: Measure) -> Result<String> {
        let write = self.step_stats("write", m)?;
        let mut t = String::new();
        let base = write[0].median as f64;
        if base == 0.0 {
            bail!("the bare runs have no {}", m.what);
        }
        let _ = writeln!(
            t,
            "\nwrite step, {} (ms): median, min-max; ratio of medians to bare,\n\
             the per-round ratios (min / median / max); added per fault = (median - bare) / faults;\n\
             x floor = added as a multiple of what the floor (one count on handle_mm_fault's entry) adds",
            m.what
        );
        let _ = writeln!(
            t,
            "  {:<34} {:>9} {:>19} {:>6} {:>19} {:>9} {:>8} {:>9} {:>10}",
            "variant", "median", "min-max", "ratio", "per round", "added/f", "x floor", "attach", "counted"
        );
        let floor =
            write.iter().find(|s| s.name == "floor").map(|f| f.median as f64 - base).filter(|a| *a > 0.0);
        for s in &write {
            let added = s.added_per_fault(base);
            let x_floor = match floor {
                Some(f) if s.name != write[0].name => format!("{:.2}x", (s.median as f64 - base) / f),
                _ => "-".into(),
            };
            let _ = writeln!(
                t,
                "  {:<34} {:>9.1} {:>19} {:>5.2}x {:>19} {:>9} {x_floor:>8} {:>9} {:>10}",
                s.name,
                s.median as f64 / 1e6,
                format!("{:.1}-{:.1}", s.min as f64 / 1e6, s.max as f64 / 1e6),
                s.median as f64 / base,
                format!("{:.2}/{:.2}/{:.2}", s.round_ratios.0, s.round_ratios.1, s.round_ratios.2),
                if s.name == write[0].name { "-".into() } else { format!("{added:.0} ns") },
                s.attach.map_or("-".into(), |a| format!("{:.2} s", a as f64 / 1e9)),
                s.counted.map_or("-".into(), |c| c.to_string()),
            );
        }
        t.push_str(&self.goals(&write, m));
        Ok(t)
    }

    fn text(&self, place: &str, size: &str, wall: Duration) -> String {
        let mut t = String::new();
        let rounds = self.runs.values().next().map_or(0, Vec::len);
        let _ = writeln!(
            t,
            "{place}: bench {} ({} pages; the child exits, so the write step is one reuse fault per page)\n\
             {rounds} rounds of {} variants, interleaved; bpftrace: {}; took {:.0} s",
            bench_args(size),
            self.pages,
            self.variants.len(),
            self.bpftrace,
            wall.as_secs_f64()
        );
        for m in [Measure::WALL, Measure::CPU] {
            match self.write_table(m) {
                Ok(w) => t.push_str(&w),
                Err(e) => {
                    let _ = writeln!(t, "\nwrite step, {}: {e:#}", m.what);
                }
            }
        }
        let _ = writeln!(
            t,
            "\n  faults in the write step (the workload's getrusage): {}; counted: what the tracer counted in\n  the run (bpftrace's do_wp_page or write-fault count, system-wide; faultscope's faults in the step)",
            self.runs[self.variants[0].name].first().and_then(|r| r.step("write").ok()).map_or(0, |s| s.minflt)
        );
        for v in &self.variants {
            // The traced bench's report, or the untraced run's record of the
            // sleeper.
            let Some((r, whose)) = self.runs[v.name].first().and_then(|r| match v.kind {
                Kind::Faultscope(_) => Some((&r.report, "")),
                Kind::Untraced(_) => {
                    r.tracer.as_ref().map(|t| (t, " (record of a sleeper; the bench untraced)"))
                }
                _ => None,
            }) else {
                continue;
            };
            let mut by: BTreeMap<&str, usize> = BTreeMap::new();
            for p in r.probes.iter().filter(|p| p.attached) {
                // No backend of its own: the entry folded into the fexit
                // (exit-only mode).
                *by.entry(p.backend.as_deref().unwrap_or("folded")).or_default() += 1;
            }
            let by: Vec<String> = by.iter().map(|(b, n)| format!("{n} {b}")).collect();
            let _ = writeln!(
                t,
                "  {}: {} mode, probes attached as {}{whose}",
                v.name,
                check::mode_name(r),
                by.join(", ")
            );
        }
        for step in ["populate", "fork"] {
            if let Ok(st) = self.step_stats(step, Measure::WALL) {
                let cells: Vec<String> = st
                    .iter()
                    .map(|s| {
                        format!(
                            "{} {:.1} ({:.2}x)",
                            s.name,
                            s.median as f64 / 1e6,
                            s.median as f64 / st[0].median as f64
                        )
                    })
                    .collect();
                let _ = writeln!(t, "  {step} step, wall time medians (ms): {}", cells.join(", "));
            }
        }
        t.push_str(&self.prog_table());
        t.push_str(&self.storm_table());
        t
    }

    /// The cost goals (docs/cost.md), met or the distance left: ns added
    /// per fault of the write step, by variant, on this report's arch; on
    /// this host (tracepoint mode), faults per second against bare.
    fn goals(&self, write: &[StepStats], m: Measure) -> String {
        let mut t = format!("  goals, on {}:\n", m.what);
        let base = write[0].median as f64;
        let arch = self.runs[self.variants[0].name].first().map_or("", |r| r.report.arch.as_str());
        for (name, goal) in GOALS_NS.iter().filter(|(a, ..)| *a == arch).map(|(_, n, g)| (n, g)) {
            let Some(s) = write.iter().find(|s| s.name == *name) else { continue };
            let ns = s.added_per_fault(base);
            let verdict = if ns <= *goal {
                "met".to_string()
            } else {
                format!("NOT met (distance {:.0} ns)", ns - goal)
            };
            let _ = writeln!(t, "    {name}: adds {ns:.0} ns a fault; goal <= {goal:.0}: {verdict}");
        }
        // What a process faultscope does not trace pays, against the
        // mechanism alone (the empty floors).
        let floors: Vec<(&str, f64)> = ["floor-pair", "floor-tp", "floor"]
            .into_iter()
            .filter_map(|n| write.iter().find(|s| s.name == n).map(|f| (n, f.median as f64 - base)))
            .filter(|(_, a)| *a > 0.0)
            .collect();
        let untraced = |s: &&StepStats| {
            self.variants.iter().any(|v| v.name == s.name && matches!(v.kind, Kind::Untraced(_)))
        };
        for s in write.iter().filter(untraced) {
            let added = s.median as f64 - base;
            let xs: Vec<String> = floors.iter().map(|(n, f)| format!("{:.2}x {n}", added / f)).collect();
            if !xs.is_empty() {
                let _ = writeln!(t, "    {} against the empty floors: {}", s.name, xs.join(", "));
            }
        }
        if let Some(s) = write.iter().find(|s| s.name == "faultscope") {
            let rate = |s: &StepStats| s.faults as f64 / (s.median as f64 / 1e9);
            let drop = 1.0 - rate(s) / rate(&write[0]);
            let _ = writeln!(
                t,
                "    faultscope: {:.0} k faults/s vs {:.0} k bare: {:.1}% fewer; goal <= 5%: {}",
                rate(s) / 1e3,
                rate(&write[0]) / 1e3,
                drop * 100.0,
                if drop <= 0.05 { "met" } else { "NOT met" }
            );
            if let Some(b) = write.iter().find(|s| s.name == "bpftrace-tracepoint") {
                let _ = writeln!(t, "    bpftrace-tracepoint: {:.0} k faults/s", rate(b) / 1e3);
            }
        }
        t
    }

    fn prog_table(&self) -> String {
        if self.progs.is_empty() {
            return String::new();
        }
        let rounds = self.progs.values().next().map_or(0, Vec::len);
        let empty = self.empty_ns();
        let mut t = format!(
            "\nper program: {rounds} more bench runs per tracer with kernel.bpf_stats_enabled=1, read by bpftool\n\
             right before the write step and at its end: the write step alone; medians (ns/run min-max).\n\
             The kernel's run time of the program itself, not of the probe mechanism around it (breakpoint,\n\
             trampoline); less empty: less what an empty program of the type runs (the floors'), the\n\
             accounting's own clock reads:\n"
        );
        let _ = writeln!(
            t,
            "  {:<26} {:<18} {:<11} {:>9} {:>8} {:>15} {:>10} {:>9}",
            "variant", "program", "type", "runs", "ns/run", "min-max", "less empty", "total ms"
        );
        for (v, rounds) in &self.progs {
            // A program is its name and type, and which of that name it is
            // in load order (bpftrace names the kprobe and the kretprobe of
            // one function alike).
            let mut by: BTreeMap<(String, String, usize), Vec<&Prog>> = BTreeMap::new();
            let mut order: Vec<(String, String, usize)> = Vec::new();
            for progs in rounds {
                let mut seen: BTreeMap<(&str, &str), usize> = BTreeMap::new();
                for p in progs {
                    let n = seen.entry((&p.name, &p.kind)).or_default();
                    let key = (p.name.clone(), p.kind.clone(), *n);
                    *n += 1;
                    if !order.contains(&key) {
                        order.push(key.clone());
                    }
                    by.entry(key).or_default().push(p);
                }
            }
            let median_of =
                |ps: &[&Prog], f: fn(&Prog) -> u64| median_u(&ps.iter().map(|p| f(p)).collect::<Vec<_>>());
            order.sort_by_key(|k| std::cmp::Reverse(median_of(&by[k], |p| p.run_cnt)));
            let totals: Vec<u64> = rounds.iter().map(|ps| ps.iter().map(|p| p.run_time_ns).sum()).collect();
            for key in &order {
                let ps = &by[key];
                let per: Vec<f64> = ps
                    .iter()
                    .filter(|p| p.run_cnt > 0)
                    .map(|p| p.run_time_ns as f64 / p.run_cnt as f64)
                    .collect();
                let (ns, range, less) = if per.is_empty() {
                    ("-".into(), "-".into(), "-".into())
                } else {
                    let m = median_f(&per);
                    (
                        format!("{m:.0}"),
                        format!("{:.0}-{:.0}", min_f(&per), max_f(&per)),
                        // As an integer: no "-0".
                        empty
                            .get(key.1.as_str())
                            .map_or("-".into(), |e| ((m - e).round() as i64).to_string()),
                    )
                };
                let _ = writeln!(
                    t,
                    "  {:<26} {:<18} {:<11} {:>9} {ns:>8} {range:>15} {less:>10} {:>9.1}",
                    v,
                    key.0,
                    key.1,
                    median_of(ps, |p| p.run_cnt),
                    median_of(ps, |p| p.run_time_ns) as f64 / 1e6
                );
            }
            let _ = writeln!(t, "  {v:<26} {:<75} {:>9.1}", "(all)", median_u(&totals) as f64 / 1e6);
        }
        t
    }

    /// What the accounting alone costs a run, by program type: the median
    /// ns a run of the empty floors' programs (bpftrace's BEGIN aside), to
    /// take out of the other programs' figures.
    fn empty_ns(&self) -> BTreeMap<&str, f64> {
        let mut by: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let empty = ["floor-pair", "floor-tp"].into_iter().filter_map(|v| self.progs.get(v));
        for p in empty.flatten().flatten().filter(|p| p.run_cnt > 0 && p.name != "BEGIN") {
            by.entry(p.kind.as_str()).or_default().push(p.run_time_ns as f64 / p.run_cnt as f64);
        }
        by.into_iter().map(|(k, v)| (k, median_f(&v))).collect()
    }

    fn storm_table(&self) -> String {
        if self.storms.is_empty() {
            return String::new();
        }
        let mut t = String::from(
            "\nfaultscope record --interval 1 attached to a storm of faults (workload --repeat-for; -fork: rounds\n\
             of fork, the child's exit and a write of every page, reuse faults and two phases a round;\n\
             -dontneed: rounds of MADV_DONTNEED and the writes, first-touch faults only). Its /proc sampled\n\
             each second from attach to exit: CPU = (utime + stime) / wall, one core = 100%; RSS max = VmHWM\n",
        );
        let _ = writeln!(
            t,
            "  {:<40} {:>8} {:>8} {:>8} {:>9} {:>11} {:>4}  goals (CPU <= 0.5%, RSS <= 30 MB)",
            "storm", "attach", "seconds", "CPU", "RSS max", "faults/s", "rc"
        );
        for (v, s) in &self.storms {
            let (first, last) = (s.samples[0], s.samples[s.samples.len() - 1]);
            let secs = last.0 - first.0;
            let cpu = if secs > 0.0 { (last.1 - first.1) as f64 / USER_HZ / secs } else { f64::NAN };
            let hwm = s.samples.iter().map(|x| x.3).max().unwrap_or(0) as f64 / 1024.0;
            let met = |ok: bool| if ok { "met" } else { "NOT met" };
            let _ = writeln!(
                t,
                "  {:<40} {:>8} {:>8.1} {:>7.2}% {:>6.1} MB {:>11} {:>4}  CPU {}, RSS {}",
                v,
                s.attach_ns.map_or("-".into(), |a| format!("{:.2} s", a as f64 / 1e9)),
                secs,
                cpu * 100.0,
                hwm,
                s.faults.map_or("-".into(), |f| format!("{:.0}", f as f64 / secs.max(1.0))),
                s.rc,
                met(cpu <= 0.005),
                met(hwm <= 30.0)
            );
        }
        t
    }
}

struct StepStats {
    name: &'static str,
    median: u64,
    min: u64,
    max: u64,
    round_ratios: (f64, f64, f64),
    faults: u64,
    attach: Option<u64>,
    counted: Option<u64>,
}

impl StepStats {
    /// What the variant adds to each fault of the step, over bare's `base`.
    fn added_per_fault(&self, base: f64) -> f64 {
        (self.median as f64 - base) / self.faults.max(1) as f64
    }
}

/// The median; of an even count, the mean of the middle two, rounded down.
fn median_u(v: &[u64]) -> u64 {
    Stats::of(v).map_or(0, |s| s.median as u64)
}

fn median_opt(v: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    let v: Vec<u64> = v.flatten().collect();
    (!v.is_empty()).then(|| median_u(&v))
}

fn median_f(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn min_f(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max_f(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::testing::{bench_json, guest_run};

    /// The test bench (16 pages, 20 faults in the write step) with the write
    /// step's wall and CPU time set.
    fn bench(wall_ns: u64, cpu_ns: u64) -> String {
        let mut v: serde_json::Value = serde_json::from_str(&bench_json()).unwrap();
        v["bench"]["steps"][2]["wall_ns"] = wall_ns.into();
        v["bench"]["steps"][2]["cpu_ns"] = cpu_ns.into();
        v.to_string()
    }

    /// Two rounds of bare and bpftrace-kprobe, one stats round.
    fn run(do_wp_page: u64) -> vm::GuestRun {
        let progs = r#"[{"id":5,"type":"kprobe","name":"handle_mm_fault","run_time_ns":3000,"run_cnt":10},
            {"id":6,"type":"kprobe","name":"handle_mm_fault","run_time_ns":500,"run_cnt":10},
            {"id":9,"type":"tracepoint","name":"someone_elses","run_time_ns":7,"run_cnt":1}]"#;
        // Read before the write step: the program is counted over the step alone.
        let before = r#"[{"id":5,"type":"kprobe","name":"handle_mm_fault","run_time_ns":1000,"run_cnt":5}]"#;
        let bt = format!("bpftrace: attached\n\n@do_wp_page: {do_wp_page}\n");
        let (b1, b2, t1, t2) = (bench(5000, 4000), bench(6000, 4000), bench(10000, 8000), bench(15000, 9000));
        guest_run(
            "@@FS-BPFTRACE-VERSION bpftrace v0.17.0\n@@FS-RC bare1 0\n@@FS-RC bpftrace-kprobe1 0\n\
             @@FS-ATTACH bpftrace-kprobe1 700000000\n@@FS-RC bare2 0\n@@FS-RC bpftrace-kprobe2 0\n\
             @@FS-ATTACH bpftrace-kprobe2 900000000\n@@FS-PROG-IDS bpftrace-kprobe-stats1 5 6 \n",
            &[
                ("bare1.json", &b1),
                ("bpftrace-kprobe1.json", &t1),
                ("bpftrace-kprobe1.bt", &bt),
                ("bare2.json", &b2),
                ("bpftrace-kprobe2.json", &t2),
                ("bpftrace-kprobe2.bt", &bt),
                ("bpftrace-kprobe-stats1.progs", progs),
                ("bpftrace-kprobe-stats1.before.progs", before),
            ],
        )
    }

    #[test]
    fn medians_ratios_and_the_tracers_own_programs() {
        let vs = [variant("bare").unwrap(), variant("bpftrace-kprobe").unwrap()];
        let g = run(16);
        let r = Results::parse(&g, &vs, 2, 1).unwrap();
        let w = r.step_stats("write", Measure::WALL).unwrap();
        assert_eq!((w[0].median, w[1].median), (5500, 12500));
        assert_eq!(w[1].round_ratios, (2.0, 2.25, 2.5));
        assert_eq!(w[1].attach, Some(800_000_000));
        let c = r.step_stats("write", Measure::CPU).unwrap();
        assert_eq!((c[0].median, c[1].median), (4000, 8500));
        let text = r.text("guest", "64K", Duration::ZERO);
        assert!(text.contains("2.27x"), "{text}");
        // Its two programs, told apart by load order; not the one it does not hold.
        assert!(text.contains("handle_mm_fault    kprobe              5      400"), "{text}");
        assert!(text.contains("handle_mm_fault    kprobe             10       50"), "{text}");
        assert!(!text.contains("someone_elses"), "{text}");
    }

    #[test]
    fn a_tracer_that_missed_the_writes_fails_the_run() {
        let vs = [variant("bare").unwrap(), variant("bpftrace-kprobe").unwrap()];
        let e = Results::parse(&run(3), &vs, 2, 1).err().expect("3 do_wp_page for 16 pages");
        assert!(e.to_string().contains("counted 3 < 16 pages"), "{e}");
    }

    #[test]
    fn bpftrace_counters_are_read() {
        let out = "bpftrace: attached\n\n\n@do_wp_page: 65612\n\n@latency_ns:\n[1K, 2K) 3 |@|\n";
        assert_eq!(counter(out, "@do_wp_page"), Some(65612));
        assert_eq!(counter(out, "@faults"), None);
    }

    /// Two rounds of bare, the empty floors and untraced-fentry (its
    /// record report: a sleeper, pid `recorded`; TRACER-RC `tracer_rc`), one
    /// stats round each.
    fn run_floors_untraced(recorded: u32, tracer_rc: &str) -> vm::GuestRun {
        let mut rec: serde_json::Value = serde_json::from_str(&bench_json()).unwrap();
        rec.as_object_mut().unwrap().remove("bench");
        rec["processes"][0]["pid"] = recorded.into();
        rec["processes"][0]["comm"] = "sleep".into();
        rec["probes"][0]["backend"] = "fexit".into();
        let rec = rec.to_string();
        // Empty programs print nothing but the BEGIN line.
        let bt = "bpftrace: attached\n";
        let pair = r#"[{"id":3,"type":"tracing","name":"BEGIN","run_time_ns":9,"run_cnt":1},
            {"id":4,"type":"tracing","name":"handle_mm_fault","run_time_ns":1600,"run_cnt":20},
            {"id":5,"type":"tracing","name":"handle_mm_fault","run_time_ns":1800,"run_cnt":20}]"#;
        let tp = r#"[{"id":7,"type":"tracepoint","name":"page_fault_user","run_time_ns":400,"run_cnt":20}]"#;
        let fs = r#"[{"id":11,"type":"tracing","name":"fault_entry_fe","run_time_ns":8000,"run_cnt":20},
            {"id":12,"type":"tracing","name":"fault_return_fe","run_time_ns":16000,"run_cnt":20}]"#;
        let mut markers = String::from("@@FS-BPFTRACE-VERSION bpftrace v0.17.0\n");
        let mut sections: Vec<(String, String)> = Vec::new();
        // Round i's bench times: bare's base, each variant's its own more.
        for (i, base) in [(1, 5000), (2, 6000)] {
            markers += &format!(
                "@@FS-RC bare{i} 0\n@@FS-ATTACH floor-pair{i} 700000000\n@@FS-RC floor-pair{i} 0\n\
                 @@FS-ATTACH floor-tp{i} 600000000\n@@FS-RC floor-tp{i} 0\n\
                 @@FS-ATTACH untraced-fentry{i} 1500000000\n@@FS-TRACER-RC untraced-fentry{i} {tracer_rc}\n\
                 @@FS-RC untraced-fentry{i} 0\n"
            );
            for (v, more) in [("bare", 0), ("floor-pair", 500), ("floor-tp", 300), ("untraced-fentry", 3000)]
            {
                sections.push((format!("{v}{i}.json"), bench(base + more, base + more)));
            }
            sections.push((format!("floor-pair{i}.bt"), bt.into()));
            sections.push((format!("floor-tp{i}.bt"), bt.into()));
            sections.push((format!("untraced-fentry{i}.record.json"), rec.clone()));
            let out = "faultscope: measuring faults\nfaultscope: interrupted";
            sections.push((format!("untraced-fentry{i}.out"), out.into()));
        }
        markers += "@@FS-PROG-IDS floor-pair-stats1 3 4 5 \n@@FS-PROG-IDS floor-tp-stats1 7 \n\
                    @@FS-PROG-IDS untraced-fentry-stats1 11 12 \n";
        for (v, progs) in [("floor-pair", pair), ("floor-tp", tp), ("untraced-fentry", fs)] {
            sections.push((format!("{v}-stats1.progs"), progs.into()));
            sections.push((format!("{v}-stats1.before.progs"), "[]".into()));
        }
        let sections: Vec<(&str, &str)> = sections.iter().map(|(n, b)| (n.as_str(), b.as_str())).collect();
        guest_run(&markers, &sections)
    }

    fn floors_untraced() -> [&'static Variant; 4] {
        ["bare", "floor-pair", "floor-tp", "untraced-fentry"].map(|n| variant(n).unwrap())
    }

    #[test]
    fn empty_floors_count_nothing_and_untraced_runs_are_measured() {
        let vs = floors_untraced();
        let g = run_floors_untraced(99, "0");
        let r = Results::parse(&g, &vs, 2, 1).unwrap();
        let w = r.step_stats("write", Measure::WALL).unwrap();
        let medians: Vec<u64> = w.iter().map(|s| s.median).collect();
        assert_eq!(medians, [5500, 6000, 5800, 8500]);
        // No counter for the floors or the untraced bench.
        assert!(w.iter().all(|s| s.counted.is_none()));
        assert_eq!(w[3].attach, Some(1_500_000_000));
        let text = r.text("guest", "64K", Duration::ZERO);
        for want in [
            // (8500 - 5500) / 20 faults; 3000 / 500 of floor-pair, / 300 of floor-tp.
            "untraced-fentry: adds 150 ns a fault; goal <= 400: met",
            "untraced-fentry against the empty floors: 6.00x floor-pair, 10.00x floor-tp",
            "untraced-fentry: kprobe mode, probes attached as 1 fexit (record of a sleeper",
            // floor-pair's two empty programs (and its BEGIN), the record's programs.
            "floor-pair                 handle_mm_fault    tracing            20       80",
            "floor-pair                 handle_mm_fault    tracing            20       90",
            "floor-tp                   page_fault_user    tracepoint         20       20",
            "untraced-fentry            fault_return_fe    tracing            20      800",
            // Less the empty fentry programs' 85 ns a run (the median of 80 and 90).
            "800-800        715",
        ] {
            assert!(text.contains(want), "{want:?} in {text}");
        }
    }

    #[test]
    fn an_untraced_run_whose_record_failed_or_traced_the_bench_fails() {
        let vs = floors_untraced();
        let e = Results::parse(&run_floors_untraced(99, "1"), &vs, 2, 1).err().expect("record exited 1");
        assert!(e.to_string().contains("untraced-fentry1: faultscope record exited with \"1\""), "{e}");
        assert!(e.to_string().contains("faultscope: interrupted"), "{e}");
        // The bench's pid (7) in the record's report: it was traced.
        let e = Results::parse(&run_floors_untraced(7, "0"), &vs, 2, 1).err().expect("the bench traced");
        assert!(e.to_string().contains("traced the bench (pid 7)"), "{e}");
    }

    #[test]
    fn x86_tracepoints_are_refused_on_arm64() {
        let vs = floors_untraced();
        assert!(refuse_elsewhere(&vs, "amd64").is_ok());
        let e = refuse_elsewhere(&vs, "arm64").unwrap_err().to_string();
        assert!(e.contains("floor-tp: not available on arm64"), "{e}");
        let bt = [variant("bare").unwrap(), variant("bpftrace-tracepoint").unwrap()];
        assert!(refuse_elsewhere(&bt, "arm64").is_err());
        let fine = ["bare", "floor", "floor-pair", "untraced-kprobe"].map(|n| variant(n).unwrap());
        assert!(refuse_elsewhere(&fine, "arm64").is_ok());
    }

    #[test]
    fn the_floors_scripts_are_empty_probes() {
        assert_eq!(
            BT_FLOOR_PAIR.text,
            "BEGIN { printf(\"bpftrace: attached\\n\"); }\nkfunc:handle_mm_fault {}\nkretfunc:handle_mm_fault {}\n"
        );
        assert!(BT_FLOOR_TP.text.ends_with("\ntracepoint:exceptions:page_fault_user {}\n"));
        assert_eq!((BT_FLOOR_PAIR.counter, BT_FLOOR_TP.counter), (None, None));
        let files: Vec<&str> = SCRIPTS.iter().map(|s| s.file).collect();
        assert!(files.contains(&"floor-pair.bt") && files.contains(&"floor-tp.bt"), "{files:?}");
    }

    #[test]
    fn variants_are_named_once_and_lines_name_their_kind() {
        let mut names: Vec<&str> = variant_names().collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), VARIANTS.len());
        for n in GUEST_DEFAULT.iter().chain(&HOST_DEFAULT) {
            assert!(variant(n).is_ok(), "{n}");
        }
        let vs = ["bare", "bpftrace-fentry", "faultscope-kprobe"].map(|n| variant(n).unwrap());
        assert_eq!(
            variant_lines(&vs),
            "bare none\nbpftrace-fentry bpftrace fentry.bt\nfaultscope-kprobe faultscope --backend kprobe\n"
        );
        let vs = ["floor-pair", "floor-tp", "untraced-kprobe", "untraced-fentry", "untraced"]
            .map(|n| variant(n).unwrap());
        assert_eq!(
            variant_lines(&vs),
            "floor-pair bpftrace floor-pair.bt\nfloor-tp bpftrace floor-tp.bt\n\
             untraced-kprobe untraced --backend kprobe\nuntraced-fentry untraced --backend fentry\nuntraced untraced \n"
        );
    }
}
