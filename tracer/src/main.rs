//! faultscope: counts and times what the Linux fault path does to a process.
//!
//! Data flow, one module each: probes (the table) -> session (load, attach) ->
//! kernel maps -> collector (snapshots) -> classes (what is measurable here)
//! -> report (table, JSON).

mod attrib;
mod bench;
mod classes;
mod collector;
mod diff;
mod error;
mod findings;
mod folio;
mod kernel;
mod live;
mod marks;
mod phases;
mod probes;
mod record;
mod report;
mod reportfile;
mod session;
mod target;
mod verify;
mod workload;

use clap::{Parser, Subcommand};
use error::{Refusal, EXIT_REFUSED};

#[derive(Parser)]
#[command(
    name = "faultscope",
    version,
    about = "eBPF tracer of the Linux page-fault path: COW reuse and copy, spurious write faults, contpte unfolds"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Trace processes (-p PID) or a command (-- CMD ARGS) and report.
    Record(record::RecordOpts),
    /// Show the probe table resolved against this kernel; --load also loads
    /// every program through the verifier without attaching it.
    Probes {
        #[arg(long)]
        load: bool,
    },
    /// The seed's scenario as a benchmark that traces itself: folios of a
    /// given size, populate, fork, a write pattern; counts per phase.
    Bench(bench::BenchOpts),
    /// Two reports side by side, per phase and class, with ratios.
    Diff { a: std::path::PathBuf, b: std::path::PathBuf },
    /// Assertions over a report (or a run) for CI; exit 1 when one fails,
    /// 3 when a class is not measurable on that kernel.
    Verify(verify::VerifyOpts),
    /// Start a new phase in a running `faultscope record`.
    Mark {
        /// The recorder's pid, when several are running.
        #[arg(long)]
        recorder: Option<u32>,
        label: String,
    },
    /// The built-in fork/write workload (populate, fork, child exits or
    /// stays, write one byte per page), reporting its own page arithmetic.
    Workload(workload::WorkloadOpts),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Record(o) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(record::run(o))),
        Cmd::Probes { load } => probes_cmd(load),
        Cmd::Mark { recorder, label } => marks::mark(&label, recorder),
        Cmd::Workload(o) => workload::run(&o).map(|()| 0),
        Cmd::Bench(o) => bench::run(&o),
        Cmd::Diff { a, b } => diff::run(&a, &b),
        Cmd::Verify(o) => verify::run(&o),
    };
    match res {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            if let Some(r) = e.downcast_ref::<Refusal>() {
                eprintln!("faultscope: {r}");
                std::process::exit(EXIT_REFUSED);
            }
            eprintln!("faultscope: error: {e:#}");
            std::process::exit(1);
        }
    }
}

fn probes_cmd(load: bool) -> anyhow::Result<i32> {
    kernel::require_root()?;
    let tracefs = kernel::tracefs()?;
    println!("{:<16} {:<8} {:<10} {:<34} HERE", "PROGRAM", "ARCH", "REQUIRED", "HOOK");
    for r in probes::resolve_here(&tracefs) {
        let hook = match r.spec.hook {
            probes::Hook::Kprobe(f) => format!("kprobe {}", f.join(" > ")),
            probes::Hook::Kretprobe(f) => format!("kretprobe {}", f.join(" > ")),
            probes::Hook::Tracepoint(c, n) => format!("tp {c}:{n}"),
        };
        let here = match r.resolution {
            probes::Resolution::Attach(s) => format!("attach {s}"),
            probes::Resolution::Unavailable(w) => format!("unavailable: {w}"),
        };
        println!(
            "{:<16} {:<8} {:<10} {:<34} {}",
            r.spec.program,
            format!("{:?}", r.spec.arch).to_lowercase(),
            if r.spec.required { "yes" } else { "no" },
            hook,
            here
        );
        println!("{:<16} measures: {} (kernel >= {})", "", r.spec.measures, r.spec.min_kernel);
    }
    if load {
        let mut failed = 0;
        for (prog, res) in session::load_all(&tracefs)? {
            match res {
                Ok(()) => println!("verifier: {prog}: ok"),
                Err(e) => {
                    failed += 1;
                    println!("verifier: {prog}: REJECTED: {e}");
                }
            }
        }
        return Ok(if failed == 0 { 0 } else { 1 });
    }
    Ok(0)
}
