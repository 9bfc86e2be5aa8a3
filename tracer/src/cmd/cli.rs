//! The command line, declared once: `main` parses it, `generate` derives
//! the man pages, the completions and docs/reference.md from it, and the
//! pages below (examples, fields, overhead, exit status) end each
//! subcommand's `--help` and fill its man page.

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

use super::{bench, diff::DiffFormat, record, serve, verify};
use crate::kernel::{classes::ReportClass, probes::BackendChoice};

#[derive(Parser)]
#[command(
    name = "faultscope",
    about = "eBPF tracer of the Linux page-fault path: COW reuse and copy, spurious write faults, contpte unfolds"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Trace processes (-p PID) or a command (-- CMD ARGS) and report.
    Record(record::RecordOpts),
    /// Show the probe table resolved against this kernel, with the backend
    /// each probe would use and why.
    Probes {
        /// Also load every program through the verifier, without attaching
        /// it (what a run would load, and the first error if one is refused),
        /// with the instructions the verifier processed and the time each
        /// load took (every attach pays them).
        #[arg(long)]
        load: bool,
        /// The backend asked for (see `record --backend`).
        #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
        backend: BackendChoice,
    },
    /// The fork/COW scenario as a benchmark that traces itself: folios of a
    /// given size, populate, fork (the child exits or stays), a write
    /// pattern; counts per step beside the workload's own numbers.
    Bench(bench::BenchOpts),
    /// Two reports side by side, per phase and class, with ratios; or two
    /// bench series as a kernel changelog's table (--format changelog).
    Diff {
        /// The report before (the baseline).
        a: PathBuf,
        /// The report after.
        b: PathBuf,
        /// With --format changelog: more series, as further columns (a
        /// series' parts, e.g. v2 1/2 and 1/2+2/2).
        more: Vec<PathBuf>,
        /// What to print.
        #[arg(long, value_enum, default_value_t = DiffFormat::Table)]
        format: DiffFormat,
    },
    /// Assertions over a report (or a run) for CI; exit 1 when one fails,
    /// 3 when a class is not measurable on that kernel.
    Verify(verify::VerifyOpts),
    /// Start a new phase in a running `faultscope record`.
    Mark {
        /// The recorder's pid, when several are running.
        #[arg(long)]
        recorder: Option<u32>,
        /// The new phase's name (printable, at most 64 bytes).
        label: String,
    },
    /// Print the JSON Schema of the report (faultscope/1), or of a bench
    /// series (faultscope-bench/1).
    Schema {
        /// The schema of a bench series (`bench --runs N --json`) instead.
        #[arg(long)]
        bench: bool,
    },
    /// Trace until SIGINT/SIGTERM and serve OpenMetrics on
    /// http://127.0.0.1:9853/metrics (targets by -p, --comm, --cgroup).
    Serve(serve::ServeOpts),
    /// Draw a report's time series (record --interval): fault rates per
    /// class over time with the phases shaded and the marks labelled, and
    /// p99 latency per interval. With --compare or --latency, two bench
    /// series A and B against each other.
    Plot {
        /// A report of `record --interval ... --json`; with --compare or
        /// --latency, the two bench series (or bench reports) A and B.
        #[arg(value_name = "FILE", required = true, num_args = 1..=2)]
        files: Vec<PathBuf>,
        /// The file to write: FILE.svg, or FILE.png (the same picture, rasterized).
        #[arg(short = 'o', long = "output")]
        output: PathBuf,
        /// A beside B per (mode, folio, mapping) cell: the write step's wall
        /// time and write faults, median with a min-max whisker.
        #[arg(long, conflicts_with = "latency")]
        compare: bool,
        /// The CDF of CLASS's fault latency (e.g. reuse, copy, not_present)
        /// in a bench step of A and B, one panel per cell, from the
        /// kernel's buckets.
        #[arg(long, value_name = "CLASS", value_parser = ReportClass::parse)]
        latency: Option<ReportClass>,
        /// With --latency: the bench step (populate, fork, write).
        #[arg(long, value_name = "NAME", default_value = "write", requires = "latency")]
        step: String,
    },
    /// Write the man pages, the shell completions or the command reference
    /// (for packaging).
    #[command(hide = true)]
    Generate {
        #[arg(value_enum)]
        what: What,
        /// The directory to write into (reference: the file; `-` or none:
        /// standard output).
        dir: Option<PathBuf>,
    },
}

/// The whole command, with each subcommand's page appended to its help.
pub fn command() -> clap::Command {
    let mut cmd = Cli::command().version(crate::version());
    for p in PAGES {
        let help = p.after_help();
        cmd = cmd.mut_subcommand(p.name, |s| s.after_help(help));
    }
    cmd
}

/// A subcommand's page beyond its options: bcc-style sections.
pub struct Page {
    pub name: &'static str,
    /// (command line, what it shows)
    pub examples: &'static [(&'static str, &'static str)],
    /// What the output's columns or fields mean (empty: none).
    pub fields: &'static str,
    /// What it costs the traced (empty: it traces nothing).
    pub overhead: &'static str,
    pub exit_status: &'static [(i32, &'static str)],
}

impl Page {
    fn after_help(&self) -> String {
        let mut s = String::from("Examples:\n");
        for (cmd, what) in self.examples {
            s.push_str(&format!("  {cmd}\n      {what}\n"));
        }
        s
    }
}

const REFUSED: (i32, &str) = (2, "refused: bad input (a missing pid, not root, a malformed file, an output path that cannot be written safely, an absurd size), said in one line on standard error before anything is lost");
const ERROR: (i32, &str) = (1, "an error during the run (the message says what to do)");
const OK: (i32, &str) = (0, "success");

const TRACE_OVERHEAD: &str = "Every fault of a traced process runs faultscope's programs: on the fault's entry and return (kprobe or fentry; on x86 with fentry, the exception tracepoint and the return only) and in the write-protect path; in tracepoint mode only the exceptions:page_fault_user tracepoint. All counting is done in the kernel, in per-CPU maps; nothing is sent to user space per fault. Measured with `cargo xtask overhead` on the instruction clock (6.12 amd64): about 1,750 ns added per write fault with fentry when every fault is timed (the figure moves by up to 100 ns between boots), 1,480 ns with --latency sample=16 and 1,460 ns with --latency off; about 3,200 ns with kprobes; in tracepoint mode 130 to 230 ns on the build host (by its speed that day). The programs are attached for the whole system: a fault of a process faultscope does not trace pays about 810 ns with fentry and 1,930 ns with kprobes (the probes' mechanism, and a per-CPU note that stops each program), and every context switch about 90 ns (the switch moves a fault that sleeps to its thread's storage); see docs/cost.md. With -a every process is traced: every fault on the host runs the traced path (the figures above for a traced process; the traced-set lookup is skipped). The kernel skips a kprobe or tracepoint program on a CPU while its BPF guard is held there, by another BPF program or by any process's BPF map system call preempted on that CPU (faultscope's own reads among them), and an fentry program while a run of it is preempted there: a preemptible kernel (every 7.x) makes both possible. faultscope reports the runs the kernel skipped (drops: program_runs_skipped, from 5.12 for fentry and 6.7 for kprobes; the kernel-mode exception programs excepted, whose skipped runs are faultscope's own nested faults), and a kernel check that differs by no more than that says so.";

const COUNT_FIELDS: &str = "faults: every fault of the process, each call of handle_mm_fault (so a fault the kernel retried counts twice; the kernel's own minflt + majflt counts it once: faults - retry is what getrusage says). write_faults: faults on a write access. wp_faults: write-protect faults (a write to a present, read-only PTE). reuse: a COW fault that reused the page in place. copy: a COW fault that copied. wp_shared: a write-notify fault on a shared mapping. spurious: a write fault on an already-writable PTE (stale TLB entry or a lost race). not_present: a fault on a PTE that was not present (a first touch, a swap-in, a NUMA-hinting fault; first_touch in older reports). huge_pmd_wp: a write-protect fault on a PMD-mapped THP (anon, or a private file THP), with its outcome (reused in place, THP copied: also a copy, of the THP's size; or split to PTEs, after which the same fault is also the reuse or copy of one page). new folios (under copy and not_present): the new anon folios the faults mapped, by size, and their bytes. copied in (under copy): the copies by the kind of mapping they were in (anon, private file, of those executable; no mapping: not attributed). contpte_unfold/contpte_fold: arm64 contiguous-PTE blocks split or formed. n/m: not measurable on this kernel, with the reason. Latency p50/p99: the fault's time from entry to return.";

/// The pages, one per visible subcommand (a test checks that none is missing).
pub const PAGES: &[Page] = &[
    Page {
        name: "record",
        examples: &[
            ("faultscope record -- ./prog", "trace a command from its exec to its exit and print the tables"),
            ("faultscope record -p 1234 -d 10", "trace a running process for 10 seconds"),
            ("faultscope record -p 1234 -i 1 -c 30 -j run.json", "30 one-second intervals, then the report as JSON"),
            ("faultscope record --follow-children --stacks copy --flamegraph copy.svg -- redis-server", "a process and its forks, with the stacks of every COW copy"),
            ("faultscope record --mark-on-signal USR1 -p 1234", "start a new phase at each SIGUSR1 to faultscope"),
            ("faultscope record --comm cc1 -i 1 --sort copy --top 10", "every cc1 of a build, the ten with most COW copies each second"),
            ("faultscope record -a -d 10 --top 20", "every process on the host for 10 seconds: the 20 that faulted most, the others summed on one row"),
        ],
        fields: COUNT_FIELDS,
        overhead: TRACE_OVERHEAD,
        exit_status: &[OK, ERROR, REFUSED, (127, "the command could not be executed")],
    },
    Page {
        name: "probes",
        examples: &[
            ("faultscope probes", "the probe table on this kernel: each probe's point, backend and why"),
            ("faultscope probes --load", "also load every program through the verifier"),
        ],
        fields: "probe: what faultscope hooks. point: the kernel function or tracepoint. backend: kprobe, fentry or tracepoint, and why that one.",
        overhead: "",
        exit_status: &[OK, ERROR, REFUSED],
    },
    Page {
        name: "bench",
        examples: &[
            ("faultscope bench seq --size 256M --folio 64K", "64K mTHP folios: fork, the child exits, sequential writes"),
            ("faultscope bench seq --folio 2M --pmd", "PMD-mapped THPs"),
            ("faultscope bench random --child alive --threads 8", "8 threads writing in random order while the child lives: copies"),
            ("faultscope bench seq --time-stores -j bench.json", "the latency of every store, and the report as JSON"),
            ("faultscope bench seq --no-trace", "the same workload untraced, for comparison"),
            ("faultscope bench seq,random --folio 4K,64K,2M --runs 5 -j series.json", "5 runs of each of the 6 cells, interleaved round by round: median, min-max, mean ± stddev per step, every run kept in the series"),
        ],
        fields: COUNT_FIELDS,
        overhead: TRACE_OVERHEAD,
        exit_status: &[OK, ERROR, REFUSED],
    },
    Page {
        name: "diff",
        examples: &[
            ("faultscope diff stock.json patched.json", "per phase and class: A, B and B/A"),
            ("faultscope diff --format changelog stock-series.json patched-series.json", "a cover letter's text: per write pattern and folio size the write step's write faults and time (a median per boot), the latency table, then A and B with their spread and the change"),
            ("faultscope diff --format changelog stock.json v2-1of2.json v2-2of2.json", "three columns: a series' parts side by side"),
        ],
        fields: "",
        overhead: "",
        exit_status: &[OK, ERROR, REFUSED],
    },
    Page {
        name: "verify",
        examples: &[
            ("faultscope verify --expect 'copy=0' run.json", "fail unless no COW copy was counted"),
            ("faultscope verify --phase mark:write --expect 'reuse/folio<=1.05' -- bench seq --folio 64K", "at most 1.05 reuse faults per 64K folio in the write step"),
            ("faultscope verify --expect 'copy.kernel<=10%' run.json", "at most a tenth of the copies were the kernel's"),
            ("faultscope verify --phase mark:write --expect 'copy.bytes<=64M' --expect 'copy.source.file_exec=0' run.json", "at most 64 MiB duplicated by COW copies in the write step, none in an executable mapping"),
            ("faultscope verify --expect 'huge_pmd_wp.outcome.split=0' run.json", "no PMD-mapped THP split by a write-protect fault"),
        ],
        fields: "",
        overhead: "",
        exit_status: &[(0, "every assertion holds"), (1, "an assertion failed"), REFUSED, (3, "a class asserted on is not measurable on that kernel")],
    },
    Page {
        name: "mark",
        examples: &[("faultscope mark after-warmup", "start the phase after-warmup in the running record")],
        fields: "",
        overhead: "",
        exit_status: &[OK, ERROR, REFUSED],
    },
    Page {
        name: "schema",
        examples: &[
            ("faultscope schema > faultscope-1.json", "the report's JSON Schema"),
            ("faultscope schema --bench > faultscope-bench-1.json", "the JSON Schema of a bench series"),
        ],
        fields: "",
        overhead: "",
        exit_status: &[OK],
    },
    Page {
        name: "serve",
        examples: &[
            ("faultscope serve --comm redis-server", "every redis-server, also those started later; scrape http://127.0.0.1:9853/metrics"),
            ("faultscope serve --cgroup /sys/fs/cgroup/system.slice/redis.service --label-cgroup", "a service's cgroup, labelled"),
            ("faultscope serve -a --label-container", "every process of the node, labelled with its container, pod, QoS class or systemd service"),
        ],
        fields: "faultscope_faults_total{kind}: every fault (retries included: each handle_mm_fault call), partitioned by kind (summing the kinds gives the faults). faultscope_class_faults_total{class}: the nested classes. faultscope_fault_duration_seconds: the kernel's latency histogram. faultscope_drops_total{reason}: what was lost. faultscope_faults_seen_total, faultscope_faults_lost_total: the faults the kernel brought to its maps by its own count, and those lost there (seen = the sum of faultscope_faults_total + lost). faultscope_class_measurable{class,reason}: 0 where a class cannot be measured. faultscope_program_*, faultscope_map_*: faultscope's own programs and maps.",
        overhead: TRACE_OVERHEAD,
        exit_status: &[OK, ERROR, REFUSED],
    },
    Page {
        name: "plot",
        examples: &[
            ("faultscope plot run.json -o run.svg", "fault rates per class and p99 latency over time, phases shaded"),
            ("faultscope plot run.json -o run.png", "the same as a PNG"),
            ("faultscope plot --compare stock-series.json patched-series.json -o ab.svg", "per (mode, folio, mapping): the write step's wall time and write faults, A beside B, median and min-max of the runs"),
            ("faultscope plot --latency copy stock-series.json patched-series.json -o copy.png", "the CDF of the copy faults' latency in the write step, A solid, B dashed, one panel per cell"),
            ("faultscope plot --latency not_present --step populate a.json b.json -o ft.svg", "not_present latency in the populate step"),
        ],
        fields: "",
        overhead: "",
        exit_status: &[OK, ERROR, REFUSED],
    },
];

/// What `faultscope generate` writes.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum What {
    /// faultscope.1 and faultscope-SUBCOMMAND.1.
    Man,
    /// faultscope.bash, _faultscope (zsh), faultscope.fish.
    Completions,
    /// The command reference in Markdown (docs/reference.md).
    Reference,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_subcommand_has_a_page_and_every_argument_help() {
        let cmd = command();
        for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            assert!(PAGES.iter().any(|p| p.name == s.get_name()), "no Page for `{}`", s.get_name());
            for a in s.get_arguments() {
                let id = a.get_id().as_str();
                assert!(
                    a.get_help().is_some() || id == "help" || id == "version",
                    "`{} {id}` has no help",
                    s.get_name()
                );
            }
        }
        for p in PAGES {
            assert!(cmd.find_subcommand(p.name).is_some(), "Page for no subcommand: {}", p.name);
            assert!(!p.examples.is_empty(), "{} has no example", p.name);
        }
        cmd.debug_assert();
    }

    #[test]
    fn version_names_the_commit() {
        assert!(command().render_version().contains("(commit "), "{}", crate::version());
    }
}
