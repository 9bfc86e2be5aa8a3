//! faultscope (package `faultscope`), the command line: it only dispatches
//! to `faultscope::cmd` (see lib.rs for the data flow).

use clap::{Parser, Subcommand};
use faultscope::term::{safe, say};
use faultscope::{
    cmd::{self, bench, diff, mark, plot, probes, record, serve, verify},
    collect::target::{ExecFailed, EXIT_EXEC_FAILED},
    error::{Refusal, EXIT_REFUSED},
    report::schema,
};

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
    /// Show the probe table resolved against this kernel, with the backend
    /// each probe would use and why; --load also loads every program
    /// through the verifier without attaching it.
    Probes {
        #[arg(long)]
        load: bool,
        /// The backend asked for (see `record --backend`).
        #[arg(long, value_enum, default_value_t = faultscope::kernel::probes::BackendChoice::Auto)]
        backend: faultscope::kernel::probes::BackendChoice,
    },
    /// The fork/COW scenario as a benchmark that traces itself: folios of a
    /// given size, populate, fork (the child exits or stays), a write
    /// pattern; counts per step beside the workload's own numbers.
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
    /// Print the JSON Schema of the report (faultscope/1).
    Schema,
    /// Trace until SIGINT/SIGTERM and serve OpenMetrics on
    /// http://127.0.0.1:9853/metrics (targets by -p, --comm, --cgroup).
    Serve(serve::ServeOpts),
    /// Draw a report's time series (record --interval): fault rates per
    /// class over time with the phases shaded and the marks labelled, and
    /// p99 latency per interval.
    Plot {
        report: std::path::PathBuf,
        #[arg(short = 'o', long = "output")]
        output: std::path::PathBuf,
    },
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    // Commands that only print end quietly on a closed stdout (`| head`),
    // as Unix filters do; record and bench handle it and keep their report.
    if matches!(cli.cmd, Cmd::Diff { .. } | Cmd::Schema | Cmd::Probes { .. } | Cmd::Verify(_)) {
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    // What a faultscope killed earlier left behind (THP settings, sockets).
    cmd::recover();
    let res = match cli.cmd {
        Cmd::Record(o) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(record::run(o))),
        Cmd::Serve(o) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(serve::run(o))),
        Cmd::Probes { load, backend } => probes::run(load, backend),
        Cmd::Mark { recorder, label } => mark::mark(&label, recorder),
        Cmd::Bench(o) => bench::run(&o),
        Cmd::Diff { a, b } => diff::run(&a, &b),
        Cmd::Plot { report, output } => plot::run(&report, &output),
        Cmd::Verify(o) => verify::run(&o),
        Cmd::Schema => serde_json::to_string_pretty(&schema::json_schema())
            .map(|s| {
                println!("{s}");
                0
            })
            .map_err(anyhow::Error::from),
    };
    match res {
        Ok(code) => std::process::exit(code),
        // Messages can quote foreign text (paths, a report's fields, serde's
        // errors about them): escaped before they reach a terminal.
        Err(e) => {
            if let Some(r) = e.downcast_ref::<Refusal>() {
                say(&format!("faultscope: {}", safe(&r.to_string())));
                std::process::exit(EXIT_REFUSED);
            }
            if let Some(x) = e.downcast_ref::<ExecFailed>() {
                say(&format!("faultscope: {}", safe(&x.to_string())));
                std::process::exit(EXIT_EXEC_FAILED);
            }
            say(&format!("faultscope: error: {}", safe(&format!("{e:#}"))));
            std::process::exit(1);
        }
    }
}
