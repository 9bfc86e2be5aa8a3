//! faultscope (package `faultscope`), the command line: it only dispatches
//! to `faultscope::cmd` (see lib.rs for the data flow; the flags are
//! declared in `cmd::cli`).

use clap::FromArgMatches;
use faultscope::term::{error as say, safe};
use faultscope::{
    cmd::{
        self, bench,
        cli::{self, Cli, Cmd},
        diff, generate, mark, plot, probes, record, serve, verify,
    },
    collect::target::{ExecFailed, EXIT_EXEC_FAILED},
    error::{Refusal, EXIT_REFUSED},
    report::{bench_series, schema},
};

fn main() {
    // Read here, not in the library: a new commit then rebuilds this file
    // alone (xtask sets it from git; a plain `cargo build` says `unknown`).
    faultscope::set_commit(option_env!("FAULTSCOPE_COMMIT").unwrap_or("unknown"));
    // Each line with the seconds since start: `RUST_LOG=faultscope=debug`
    // then shows where a start-up or an end goes.
    let started = std::time::Instant::now();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn,usvg=error"))
        .format(move |buf, r| {
            use std::io::Write;
            writeln!(
                buf,
                "[{:8.3} {} {}] {}",
                started.elapsed().as_secs_f64(),
                r.level(),
                r.target(),
                r.args()
            )
        })
        .init();
    let cli = Cli::from_arg_matches(&cli::command().get_matches()).unwrap_or_else(|e| e.exit());
    // Commands that only print end quietly on a closed stdout (`| head`),
    // as Unix filters do; record and bench handle it and keep their report.
    if matches!(
        cli.cmd,
        Cmd::Diff { .. } | Cmd::Schema { .. } | Cmd::Probes { .. } | Cmd::Verify(_) | Cmd::Generate { .. }
    ) {
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
        Cmd::Diff { a, b, more, format } => diff::run(&a, &b, &more, format),
        Cmd::Plot { files, output, compare, latency, step } => {
            let what = match (compare, latency) {
                (true, _) => plot::What::Compare,
                (_, Some(class)) => plot::What::Latency { class, step },
                _ => plot::What::Timeline,
            };
            plot::run(&files, &output, what)
        }
        Cmd::Verify(o) => verify::run(&o),
        Cmd::Generate { what, dir } => generate::run(what, dir.as_deref()),
        Cmd::Schema { bench } => serde_json::to_string_pretty(&if bench {
            bench_series::json_schema()
        } else {
            schema::json_schema()
        })
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
