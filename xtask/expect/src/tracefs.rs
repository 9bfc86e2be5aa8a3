//! The oracle live, in a test: the kernel traces its own kprobes and
//! tracepoints around one run, then the counting program (`oracle.c`)
//! reads the trace. Only where a guest made the oracle's events
//! (`oracle_setup` in `xtask/guest/lib.sh`) and named the program in
//! `FAULTSCOPE_ORACLE`; on the build host, which has no kprobes, there is
//! no oracle and a test keeps its page arithmetic and getrusage.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use faultscope::{
    kernel::drops::{DropKind, DropReason},
    report::schema::Report,
};

use crate::{oracle::Oracle, Checklist};

const TRACEFS: &str = "/sys/kernel/tracing";
const KPROBES: &str = "/sys/kernel/debug/kprobes/list";

/// The oracle's program, when this run has one.
pub fn program() -> Option<PathBuf> {
    std::env::var_os("FAULTSCOPE_ORACLE").map(PathBuf::from)
}

/// Tracing under way for one run.
pub struct Tracing {
    program: PathBuf,
    kprobes_before: usize,
}

/// What the oracle saw of one run, and whether the run left the tracing
/// clean.
pub struct Traced {
    pub oracle: Oracle,
    /// The oracle's own summary line (`oracle: N trace lines, ...`).
    pub summary: String,
    /// Kprobes registered after the run less before it: faultscope must
    /// leave none.
    pub kprobes_left: i64,
    /// Events the trace buffer lost: the oracle's counts are short then.
    pub overrun: u64,
}

fn write(name: &str, value: &str) {
    let p = Path::new(TRACEFS).join(name);
    fs::write(&p, value).unwrap_or_else(|e| panic!("writing {value:?} to {}: {e}", p.display()));
}

fn kprobes() -> usize {
    fs::read_to_string(KPROBES).map(|t| t.lines().count()).unwrap_or(0)
}

/// Starts tracing for the oracle, where this run has one (else `None`).
/// Panics when the oracle is named but its events are missing: a guest
/// that asked for it must have it.
pub fn start() -> Option<Tracing> {
    let program = program()?;
    let events = Path::new(TRACEFS).join("events/fso");
    assert!(events.is_dir(), "FAULTSCOPE_ORACLE is set but {} is missing", events.display());
    write("trace", "");
    let kprobes_before = kprobes();
    write("tracing_on", "1");
    Some(Tracing { program, kprobes_before })
}

impl Tracing {
    /// Stops tracing and counts; `ranges` are the workload's address ranges
    /// (`NAME=START-END` each, its `--regions-out`), for the oracle to
    /// count within.
    pub fn finish(self, ranges: &[String]) -> Traced {
        write("tracing_on", "0");
        let kprobes_left = kprobes() as i64 - self.kprobes_before as i64;
        let trace = fs::File::open(Path::new(TRACEFS).join("trace")).expect("opening the trace");
        let out = Command::new(&self.program)
            .args(ranges)
            .stdin(trace)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", self.program.display()));
        assert!(out.status.success(), "{} exited {}", self.program.display(), out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        let summary = text.lines().find(|l| l.starts_with("oracle:")).unwrap_or("no summary").to_string();
        Traced { oracle: Oracle::parse(&text, refused()), summary, kprobes_left, overrun: overrun() }
    }
}

/// The events the guest's kernel refused and why: `oracle_setup` writes
/// them to `FAULTSCOPE_ORACLE_REFUSED`, a line each (`EVENT WHY`).
fn refused() -> BTreeMap<String, String> {
    let Some(p) = std::env::var_os("FAULTSCOPE_ORACLE_REFUSED") else { return BTreeMap::new() };
    crate::oracle::parse_refused(fs::read_to_string(p).unwrap_or_default().lines())
}

/// The trace buffer's lost events, summed over the CPUs.
fn overrun() -> u64 {
    let Ok(cpus) = fs::read_dir(Path::new(TRACEFS).join("per_cpu")) else { return 0 };
    cpus.filter_map(Result::ok)
        .filter_map(|d| fs::read_to_string(d.path().join("stats")).ok())
        .flat_map(|s| {
            s.lines()
                .filter_map(|l| l.strip_prefix("overrun:").and_then(|n| n.trim().parse::<u64>().ok()))
                .collect::<Vec<_>>()
        })
        .sum()
}

impl Traced {
    /// Process `pid` of `report` against the oracle's line for it over the
    /// whole run, every class and origin; and the run clean: no kretprobe
    /// return lost, no kprobe left behind, no trace event lost.
    pub fn check(&self, cl: &mut Checklist<'_>, report: &Report, pid: u32) {
        self.check_phase(cl, report, pid, "ALL");
    }

    /// [`Traced::check`] against the oracle's `phase` (`attach`: from
    /// faultscope's attach to its detach, for `record -p`).
    pub fn check_phase(&self, cl: &mut Checklist<'_>, report: &Report, pid: u32, phase: &str) {
        cl.line(format!("  the oracle: {}", self.summary));
        match report.process(pid).and_then(|p| self.oracle.compare("oracle", &p.classes, pid, phase)) {
            Some(cmp) => {
                let cmp = cmp.allowing_skipped("oracle", report);
                cl.line(cmp.table("class").trim_end());
                for f in cmp.failures {
                    cl.expect(false, f);
                }
            }
            None => {
                cl.expect(false, format!("the oracle has a {phase} line for pid {pid} ({})", self.summary))
            }
        }
        let skipped = crate::oracle::skipped_runs(report);
        cl.line(format!("  program runs the kernel skipped: {skipped}"));
        let lost = report.drop_count(DropReason::Kernel(DropKind::LostReturn));
        cl.expect(lost == 0, format!("kretprobe returns lost: {lost}"));
        cl.expect(self.kprobes_left == 0, format!("kprobes left after faultscope: {}", self.kprobes_left));
        cl.expect(self.overrun == 0, format!("trace events lost (overrun): {}", self.overrun));
    }
}
