//! xtask (package `xtask`): developer tasks, `cargo xtask setup | dist | test | demo | guest-test`.

mod ab;
mod apt;
mod bpftrace;
mod cached;
mod check;
mod cross;
mod daemon;
mod demo;
mod dist;
mod foundation;
mod kbuild;
mod kernels;
mod matrix;
mod overhead;
mod qemu;
mod redis;
mod setup;
mod util;
mod vm;
mod walkthrough;

use std::{path::PathBuf, process::ExitCode, time::Instant};

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use util::{root, run};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The guests' TLB model: `exact`, Debian's QEMU (a store through a
    /// read-only TLB entry re-walks the page tables: never a spurious write
    /// fault); `stale`, QEMU patched with the stale-TLB model (`cargo xtask
    /// qemu`, built on first use): a vCPU faults on a store through its
    /// stale read-only entry, as hardware may; `model-off`, the patched QEMU
    /// with the model switched off (it must behave as Debian's).
    #[arg(long, global = true, value_enum, default_value = "exact")]
    tlb: vm::Tlb,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the toolchain, QEMU and bpf-linker (idempotent).
    Setup {
        /// Only what building faultscope and `dist` need: no QEMU, Redis,
        /// Prometheus or kernel build dependencies.
        #[arg(long)]
        build: bool,
    },
    /// The release under target/dist: static faultscope for x86-64 and
    /// arm64, a .deb of each (man pages, shell completions), SHA256SUMS.
    Dist {
        /// Then unpack and check the packages (the dist stage of `test`).
        #[arg(long)]
        check: bool,
    },
    /// Everything: setup, unit and host tests, the verifier check, the
    /// packages (`dist --check`), the guest tests.
    Test,
    /// The demo: faultscope tracing the fork/write workload in a guest.
    Demo,
    /// A against B (and more): the same `faultscope bench` series on each
    /// kernel in `--boots` boots taken alternately (A B A B), printed as a
    /// cover letter's table (a median per boot) and per cell A against each
    /// other kernel: mean ± stddev, the change, and whether the runs'
    /// min-max ranges do not overlap. Series and pictures under target/ab.
    Ab {
        /// Kernels, the baseline first: names of the matrix (or
        /// 7.3-reuse-16-ptes-ARCH), or an image that `cargo xtask kernel`
        /// built (its printed path). With --preset: none.
        kernels: Vec<String>,
        /// Runs of each bench cell per boot.
        #[arg(long, default_value_t = 15)]
        runs: u64,
        /// Boots of each kernel.
        #[arg(long, default_value_t = 2)]
        boots: usize,
        #[arg(long, default_value = "256M")]
        size: String,
        /// `faultscope bench` arguments, one bench per --bench (default:
        /// "seq --time-stores --folio 4K,64K,2M").
        #[arg(long = "bench")]
        benches: Vec<String>,
        /// The kernels and benches of a known comparison.
        #[arg(long, value_enum)]
        preset: Option<ab::Preset>,
        /// The preset's architecture.
        #[arg(long, default_value = "amd64", value_parser = ["amd64", "arm64"])]
        arch: String,
        /// Only the stage of `test`: stock 7.3 against the series, amd64,
        /// 3 runs x 2 boots on 16M, judged.
        #[arg(long, conflicts_with_all = ["kernels", "preset", "benches"])]
        test: bool,
    },
    /// Only the origins cases (read(2), /proc/self/mem and user stores,
    /// per origin against the oracle and the kernel's own count) in one
    /// guest.
    Origins {
        #[arg(long, default_value = "7.3-cloud-arm64", value_parser = kernel_names())]
        kernel: String,
    },
    /// Build QEMU 10.0.2 with the stale-TLB model (xtask/qemu/stale-tlb.patch)
    /// for x86-64 and arm64 guests, cached by tarball, patch and
    /// configuration; prints the binaries' paths (what `--tlb stale` runs).
    Qemu,
    /// Only the stale-TLB stage of `test`: reader-writer and read-then-store
    /// on QEMU as shipped (no spurious fault) and on the patched QEMU with
    /// the model off (the same counts), then under the stale-TLB model on
    /// stock 6.12 and 7.3, 7.3 with the whole-folio series and with the
    /// flush experiment, and reader-writer on arm64 6.12 and 7.3, against
    /// QEMU's own count of its faults.
    StaleTlb,
    /// Only the guest test (after setup).
    GuestTest {
        /// Also the origins guest on this arm64 kernel, booted at the same
        /// time (as `test` does).
        #[arg(long, value_parser = kernel_names())]
        with_origins: Option<String>,
        /// The guest kernel (kernels::KERNELS).
        #[arg(long, default_value = "6.12-cloud-amd64", value_parser = kernel_names())]
        kernel: String,
    },
    /// Boot a kernel and run a script of xtask/guest/ in it (for looking
    /// around: kallsyms, probe points); prints the console.
    GuestScript {
        #[arg(long, value_parser = kernel_names())]
        kernel: String,
        script: String,
    },
    /// What tracing costs the traced, beside bpftrace: the same bench bare,
    /// under bpftrace's kprobe and fentry scripts and under faultscope's
    /// backends, interleaved in one guest; per-program run time; attach
    /// time; faultscope's CPU and RSS over a storm (a benchmark, not part of
    /// `test`).
    Overhead {
        /// On this host (tracepoint mode) instead of a guest.
        #[arg(long)]
        host: bool,
        #[arg(long, default_value = "6.12-cloud-amd64", value_parser = kernel_names())]
        kernel: String,
        /// The bench's memory (4K pages: one write fault per 4K).
        #[arg(long, default_value = "256M")]
        size: String,
        /// Interleaved rounds of every variant.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Seconds of `record --interval 1` over a fault storm, per
        /// faultscope variant (0: none).
        #[arg(long, default_value_t = 60)]
        storm: u64,
        /// Bench runs per tracer with the kernel's BPF run time accounting
        /// on, for the per-program table.
        #[arg(long, default_value_t = 3)]
        stats_runs: usize,
        /// The guest's clock: guest instructions (the timings do not depend
        /// on this machine's load) or host time.
        #[arg(long, value_enum, default_value = "instructions")]
        clock: vm::Clock,
        /// The variants, bare first (default: the guest's or the host's set).
        #[arg(long = "variant", value_parser =
              clap::builder::PossibleValuesParser::new(overhead::variant_names()))]
        variants: Vec<String>,
    },
    /// The kernel matrix: bench cases against the tracefs oracle, on every
    /// kernel x arch (or those given).
    Matrix {
        /// Kernels (default: the matrix's, kernels::KERNELS; any other
        /// known kernel may be named).
        #[arg(long = "kernel", default_values = kernels::KERNELS.iter().map(|k| k.name), value_parser =
              clap::builder::PossibleValuesParser::new(kernels::all_names()))]
        kernels: Vec<String>,
        #[arg(long, default_value = "16M")]
        size: String,
        /// Cases (default: matrix::DEFAULT_CASES).
        #[arg(long = "case", default_values = matrix::DEFAULT_CASES)]
        cases: Vec<String>,
        /// Backends (`bench --backend`; default: kprobe, and fentry too on
        /// matrix::FENTRY_KERNELS).
        #[arg(long = "backend", value_parser = matrix::BACKENDS)]
        backends: Vec<String>,
    },
    /// The whole-folio reuse gates: 64K and PTE-mapped 2M at 256M against
    /// the oracle, and `verify --expect 'reuse/folio<=1.05'` (arm64 also
    /// `contpte_unfold=0`): pass on the patched 7.3 kernels, fail on stock.
    Gates {
        #[arg(long = "kernel", default_values = matrix::GATE_KERNELS, value_parser = kernel_names())]
        kernels: Vec<String>,
    },
    /// Build a kernel from Debian's linux-source-7.3 with a patch series
    /// (mbox or plain diffs), configured for the guests; cached by source
    /// version, diffs and config. Prints the image's path.
    Kernel {
        /// Patch files, applied in order: `git format-patch` output (one
        /// or several messages), a saved mail thread, or plain diffs.
        #[arg(long = "patch", num_args = 1..)]
        patches: Vec<PathBuf>,
        /// Only the messages whose subject contains this, e.g. "[PATCH v2 ".
        #[arg(long)]
        subject: Option<String>,
        #[arg(long, value_parser = ["amd64", "arm64"])]
        arch: String,
        /// The release's local version: `uname -r` is 7.3.4-NAME.
        #[arg(long)]
        name: Option<String>,
    },
    /// Redis end to end: the host's redis-server 7.0 in a guest of the
    /// generic 6.12 kernel (host userspace over 9p), traced by faultscope
    /// across a BGSAVE, against the tracefs oracle and Redis' own INFO.
    Redis {
        /// Keys loaded before each run (values of --value-size bytes).
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        #[arg(long, default_value_t = 512)]
        value_size: u64,
        /// SETs redis-benchmark sends in each run.
        #[arg(long, default_value_t = 100_000)]
        requests: u64,
    },
    /// `faultscope serve` under Debian's Prometheus, in a guest of the
    /// generic 6.12 kernel (host userspace over 9p): PromQL against `record`
    /// and the tracefs oracle across a BGSAVE and a restart of Redis, and
    /// the plot of the run rendered to PNG.
    Daemon {
        #[arg(long, default_value_t = 100_000)]
        keys: u64,
        #[arg(long, default_value_t = 512)]
        value_size: u64,
        /// SETs redis-benchmark sends in each window.
        #[arg(long, default_value_t = DAEMON_SETS)]
        requests: u64,
    },
}

/// The names of [`kernels::KERNELS`], for a `--kernel` argument.
fn kernel_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(kernels::KERNELS.iter().map(|k| k.name))
}

/// SETs per window of the daemon test: enough to outlast the BGSAVE (about
/// 1 s of them under TCG) and show the reuse after it, few enough to keep
/// the suite short.
const DAEMON_SETS: u64 = 40_000;

/// An error ends in one line, its causes joined, without a backtrace: the
/// last lines of a long run (all a CI log may keep) then say what failed.
fn main() -> ExitCode {
    match dispatch(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Boots `kernel` with `xtask/guest/SCRIPT` as its case and prints the
/// console.
fn guest_script(kernel: &str, script: &str) -> Result<()> {
    let k = kernels::by_name(kernel)?;
    let vmlinuz = kernels::fetch(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm/script").join(k.name);
    std::fs::create_dir_all(&dir)?;
    let cpio = vm::initramfs(&dir, k.arch, &bin, script, &[])?;
    let run = vm::boot(k, &vmlinuz, &cpio, &dir, std::time::Duration::from_secs(600))?;
    print!("{}", run.console);
    if let Some(n) = run.stale_tlb_faults {
        eprintln!("xtask guest-script: the stale-TLB model raised {n} faults");
    }
    Ok(())
}

fn dispatch(cli: Cli) -> Result<()> {
    vm::set_tlb(cli.tlb);
    match cli.cmd {
        Cmd::Qemu => {
            let b = qemu::build()?;
            println!("{}", b.x86_64.display());
            println!("{}", b.aarch64.display());
            Ok(())
        }
        Cmd::StaleTlb => matrix::stale_tlb(),
        Cmd::Setup { build: false } => setup::setup(),
        Cmd::Setup { build: true } => setup::setup_build(),
        Cmd::Dist { check: false } => dist::dist(),
        Cmd::Dist { check: true } => dist::check(),
        Cmd::Test => test(),
        Cmd::Demo => {
            setup::setup()?;
            demo::run_demo("256M")
        }
        Cmd::GuestTest { kernel, with_origins: None } => foundation::run(&kernel),
        Cmd::GuestTest { kernel, with_origins: Some(arm64) } => foundation::run_both(&kernel, &arm64),
        Cmd::Origins { kernel } => foundation::run_origins(&kernel),
        Cmd::Overhead { host, kernel, size, runs, storm, stats_runs, clock, variants } => {
            setup::setup()?;
            overhead::run(&overhead::Opts { host, kernel, size, runs, storm, stats_runs, clock, variants })
        }
        Cmd::GuestScript { kernel, script } => guest_script(&kernel, &script),
        Cmd::Matrix { kernels: names, size, cases, backends } => {
            let ks = names.iter().map(|n| kernels::by_name(n)).collect::<Result<Vec<_>>>()?;
            matrix::run(&ks, &size, &cases, &backends)
        }
        Cmd::Gates { kernels: names } => {
            let ks = names.iter().map(|n| kernels::by_name(n)).collect::<Result<Vec<_>>>()?;
            matrix::gates(&ks)
        }
        Cmd::Kernel { patches, subject, arch, name } => {
            setup::setup()?;
            let diffs = if patches.is_empty() {
                Vec::new()
            } else {
                kbuild::read_series(&patches, subject.as_deref())?
            };
            let name = name.unwrap_or_else(|| if diffs.is_empty() { "stock" } else { "patched" }.to_string());
            let b = kbuild::build(&arch, &[kbuild::Variant { name: &name, diffs: &diffs }])?;
            println!("{}", b.image.display());
            Ok(())
        }
        Cmd::Ab { test: true, .. } => {
            setup::setup()?;
            ab::test()
        }
        Cmd::Ab { kernels, runs, boots, size, benches, preset, arch, test: false } => {
            setup::setup()?;
            let o = match preset {
                Some(p) => {
                    if !kernels.is_empty() || !benches.is_empty() {
                        bail!("ab --preset: give no kernels and no --bench (the preset names them)");
                    }
                    ab::Opts::preset(p, &arch, runs, boots, size)?
                }
                None => ab::Opts {
                    kernels,
                    runs,
                    boots,
                    size,
                    benches: if benches.is_empty() {
                        vec!["seq --time-stores --folio 4K,64K,2M".into()]
                    } else {
                        benches
                    },
                },
            };
            ab::run(&o).map(|_| ())
        }
        Cmd::Redis { keys, value_size, requests } => redis::run(keys, value_size, requests),
        Cmd::Daemon { keys, value_size, requests } => daemon::run(keys, value_size, requests),
    }
}

fn test() -> Result<()> {
    let t0 = Instant::now();
    setup::setup()?;
    // The guests' static host tests build beside the host tests, at nice
    // 19, in target folders of their own; a failure here is the foundation
    // stage's to report, which builds them again.
    let log = root().join("target/host-tests-prebuild.log");
    let _ = std::fs::remove_file(&log);
    let prebuild = std::thread::spawn({
        let log = log.clone();
        move || dist::prebuild_host_tests(&log)
    });
    // Unit tests and host tests (tracepoint mode, verifier, refusals, no
    // leftover BPF programs). One thread: host tests attach to the kernel.
    // The host tests run the test workload, a binary of its own crate.
    let host = run(util::cargo("cargo").args(["build", "-p", "faultscope-workload"])).and_then(|()| {
        run(util::cargo("cargo").args([
            "test",
            "--workspace",
            "--exclude",
            "faultscope-ebpf",
            "--",
            "--test-threads=1",
        ]))
    });
    let beside = prebuild.join();
    host?;
    let t1 = Instant::now();
    eprintln!("xtask test: [{:.0} s] set-up, unit and host tests passed", t0.elapsed().as_secs_f64());
    match beside {
        Ok(Ok(())) => eprintln!(
            "xtask test: [{:.0} s] the guests' static host tests built beside them",
            t0.elapsed().as_secs_f64()
        ),
        Ok(Err(e)) => {
            eprintln!("xtask test: building the guests' host tests beside them: {e:#} ({})", log.display())
        }
        Err(_) => eprintln!("xtask test: building the guests' host tests beside them panicked"),
    }
    // Every stage runs even when one before it failed: one run of the
    // suite then tells all that is wrong.
    let cases: Vec<String> = matrix::DEFAULT_CASES.iter().map(|c| c.to_string()).collect();
    let gate_kernels: Vec<kernels::GuestKernel> =
        matrix::GATE_KERNELS.iter().map(|n| kernels::by_name(n)).collect::<Result<_>>()?;
    let stages: [(&str, &dyn Fn() -> Result<()>); 9] = [
        // First: it builds the static binaries every guest stage runs.
        ("dist packages", &dist::check),
        ("foundation and every origin (amd64, arm64)", &|| {
            foundation::run_both("6.12-cloud-amd64", "7.3-cloud-arm64")
        }),
        ("kernel matrix", &|| matrix::run(kernels::KERNELS, "16M", &cases, &[])),
        ("whole-folio reuse gates", &|| matrix::gates(&gate_kernels)),
        ("COW memory: hot patches, mTHP copies", &matrix::cow_memory),
        ("stale TLB entries (QEMU's model)", &matrix::stale_tlb),
        ("A/B, stock 7.3 against the series", &ab::test),
        ("Redis end to end", &|| redis::run(100_000, 512, 100_000)),
        ("daemon end to end (Prometheus)", &|| daemon::run(100_000, 512, DAEMON_SETS)),
    ];
    let mut failed = Vec::new();
    let mut times = Vec::new();
    for (name, stage) in stages {
        let ts = Instant::now();
        // As it happens: a run cut short by a time limit still shows where
        // its time went.
        let at = |what: &str| eprintln!("xtask test: [{:.0} s] {what}", t0.elapsed().as_secs_f64());
        at(&format!("{name}: starting"));
        let result = stage();
        let took = ts.elapsed().as_secs_f64();
        match result {
            Ok(()) => at(&format!("{name}: passed in {took:.0} s")),
            Err(e) => {
                at(&format!("{name}: FAILED in {took:.0} s: {e:#}"));
                failed.push(format!("{name}: {e:#}"));
            }
        }
        times.push(format!("{name} {took:.0}s"));
    }
    eprintln!("xtask test: stage times: {}", times.join(", "));
    if !failed.is_empty() {
        // Last, one line a stage: the tail of the log says what failed.
        for f in &failed {
            eprintln!("xtask test: FAILED {f}");
        }
        bail!("xtask test: {} of {} stages failed (each one's output above)", failed.len(), times.len());
    }
    eprintln!(
        "xtask test: all passed (host {:.0}s, guest {:.0}s, total {:.0}s)",
        (t1 - t0).as_secs_f64(),
        t1.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
