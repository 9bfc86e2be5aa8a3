//! The report, `faultscope/1`: one set of types, written by record and bench,
//! read back by findings, diff, verify, the tests and xtask. The JSON Schema
//! published in the repository (`tracer/report.schema.json`) is generated
//! from these types (`faultscope schema`), and a test keeps the two equal.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::collect::{container::Container, phases::PhaseKind};
pub use crate::kernel::drops::{DropReason, Drops};
use crate::kernel::{
    classes::ReportClass,
    latency::{LatencyTier, LatencyWindow},
};

pub const SCHEMA: &str = "faultscope/1";
/// A bench series' schema id (`report::bench_series`): here beside the
/// report's, so that reading a report can tell one from the other.
pub const BENCH_SERIES_SCHEMA: &str = "faultscope-bench/1";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Always "faultscope/1".
    pub schema: String,
    /// `uname -r` of the kernel the run was traced on.
    pub kernel: String,
    pub arch: String,
    pub mode: Mode,
    /// Which faults were timed (`--latency`), where the fault path is
    /// probed: every one, one in `every` of those on each CPU, or none. A
    /// latency is the time from `latency_window`'s start to
    /// `handle_mm_fault`'s return, less faultscope's programs nested in it
    /// (`raw` keeps them in); its
    /// buckets count the timed faults. Absent in tracepoint mode, which
    /// times none, and in reports older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<LatencyTier>,
    /// Where a timed fault's time starts (`exception` or `entry`, see
    /// `LatencyWindow`); absent when no fault is timed, and in reports
    /// older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_window: Option<LatencyWindow>,
    pub duration_ns: u64,
    /// Every probe of the table: attached or why not.
    pub probes: Vec<ProbeStatus>,
    /// Things the kernel side could not record (never silently lost).
    pub drops: Drops,
    pub processes: Vec<Process>,
    /// A run over every process (`-a`): `processes` are the first `top` by
    /// `sort`; the others are summed in `other`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_wide: Option<SystemWide>,
    /// Why the run ended (record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// The exit status of the command record started, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command_exit_status: Option<i32>,
    /// What was attributed to mappings, sites and stacks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attribution: Option<AttributionInfo>,
    /// The time series of `record --interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intervals: Option<Vec<Interval>>,
    /// Each attached program's own cost from the kernel's accounting
    /// (`--prog-stats`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub programs: Option<Vec<ProgramCost>>,
    /// The kernel memory the run's maps took on this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_memory: Option<KernelMemory>,
    /// The workload's own numbers, when the run is a `bench`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bench: Option<Bench>,
    #[serde(default)]
    pub findings: Vec<Finding>,
    /// What the run was of, where and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provenance: Option<Provenance>,
    /// Why each class not measurable in this run is not: once here, not in
    /// every class of every phase and process.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub availability: BTreeMap<ReportClass, String>,
}

/// Enough to say later what a report describes, and what on the machine
/// shaped its counts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// faultscope's version.
    pub version: String,
    /// The commit faultscope was built from (`FAULTSCOPE_COMMIT` at its build;
    /// `unknown` when the build did not set it).
    pub commit: String,
    /// faultscope's own command line.
    pub argv: Vec<String>,
    /// What was traced: `pid N`, `command ARGV...`, `bench MODE`.
    pub target: String,
    pub hostname: String,
    /// The run's start on the wall clock (ns since the Unix epoch) ...
    pub start_unix_ns: u64,
    /// ... and on CLOCK_MONOTONIC at the same instant, the clock of every
    /// other time in the report: a time t is at
    /// `start_unix_ns + t - start_monotonic_ns` on the wall clock.
    pub start_monotonic_ns: u64,
    /// /proc/cmdline.
    pub kernel_cmdline: String,
    /// The THP and mTHP knobs under /sys/kernel/mm/transparent_hugepage
    /// (path below it -> value; the selected choice of a `[x]` list).
    pub thp: BTreeMap<String, String>,
    /// `vendor_id` (x86) or `CPU implementer` (arm64) of /proc/cpuinfo.
    pub cpu_vendor: String,
    /// `model name` (x86) or `CPU part` (arm64).
    pub cpu_model: String,
    /// The hypervisor the machine runs under, if any (e.g. KVM, TCG: a
    /// stale-TLB spurious fault does not occur under QEMU's TCG).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<String>,
    /// /proc/sys/kernel/random/boot_id: runs with the same one ran in one
    /// boot, so a series made over several boots can be told apart by boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
}

/// How the fault path is measured: kprobes, the tracepoint-only fallback,
/// nothing (no fault source), or not at all (`bench --no-trace`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Kprobe,
    Tracepoint,
    #[default]
    None,
    Off,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProbeStatus {
    pub program: String,
    pub target: String,
    pub attached: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// How it is attached: `tracepoint`, `tp_btf`, `kprobe`, `kretprobe`, `fentry` or
    /// `fexit` (absent when it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Why that way: fentry where BTF describes the function, else why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_reason: Option<String>,
}

/// The kernel memory of the run's maps: keys and values of every entry,
/// on every possible CPU for a per-CPU map (the kernel's own overhead per
/// entry comes on top).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelMemory {
    pub cpus: u64,
    pub bytes: u64,
    /// Per map: its bound (entries) and bytes.
    pub maps: BTreeMap<String, MapMemory>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MapMemory {
    pub entries: u64,
    pub bytes: u64,
}

/// Defined where the kernel side measures it.
pub use crate::kernel::session::ProgramCost;

/// The classes of one process over a span; every class of the catalogue is
/// present, measured or not.
pub type Classes = BTreeMap<ReportClass, ClassValue>;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Process {
    pub pid: u32,
    pub comm: String,
    /// The whole run.
    pub classes: Classes,
    /// Where the whole run's faults happened.
    #[serde(flatten)]
    pub attribution: Attribution,
    /// The phases of the run, in order.
    pub phases: Vec<Phase>,
    /// faultscope's count against the kernel's own count of the process's
    /// faults over the run (`min_flt` + `maj_flt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_check: Option<KernelCheck>,
    /// The container, pod or systemd service it ran in (from its cgroup v2
    /// path, read when it was first seen); absent when it was in none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
}

/// How a run over every process is bounded.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SystemWide {
    /// The class the processes are ranked by (most first; ties by pid).
    pub sort: ReportClass,
    /// The most processes listed in `processes`.
    pub top: u64,
    /// The processes that faulted in the run, listed or not.
    pub faulted: u64,
    /// Those not listed, summed (counts, no latency).
    pub other: OtherProcesses,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OtherProcesses {
    pub processes: u64,
    pub classes: Classes,
}

/// The kernel check of one process: the faults `mm_account_fault()`
/// accounted to its threads over the run (getrusage, `/proc/PID/stat`),
/// beside faultscope's count of the same faults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelCheck {
    pub result: CheckResult,
    /// The kernel's minor faults over the run: the low end of its bracket
    /// (`minflt_high` when the bracket is a range).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minflt: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub majflt: Option<u64>,
    /// `minflt` + `majflt`, as a range: equal ends when the bracket is exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_low: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel_high: Option<u64>,
    /// faultscope's count of the same faults (see `counted`).
    pub faultscope: u64,
    /// What faultscope counted: completed `handle_mm_fault` calls of every
    /// origin (kprobe mode), or page-fault exceptions (tracepoint mode).
    pub counted: String,
    /// faultscope minus the kernel's nearest end (0 when within).
    pub difference: i64,
    /// How the window was bracketed at both ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bracket: Option<String>,
    /// Tracepoint mode: the faults no exception shows (get_user_pages,
    /// less exceptions that reached no fault), derived as the kernel's
    /// count minus the exceptions, low and high.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gup_derived: Option<(i64, i64)>,
    /// Why there is no check, or why the counts differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CheckResult {
    /// The bracket is exact and faultscope's count is the kernel's.
    Equal,
    /// faultscope's count lies inside the bracket's range.
    WithinBracket,
    /// faultscope's count is outside the bracket: a finding.
    Differs,
    /// Tracepoint mode: what no exception shows is derived, not checked.
    Derived,
    /// The kernel's count could not be bracketed (`reason`).
    NotChecked,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Phase {
    /// The kernel's phase id (unique in the run).
    pub id: u32,
    pub name: String,
    pub kind: PhaseKind,
    pub start_ns: u64,
    /// Absent while the phase was current at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_ns: Option<u64>,
    /// Forked children sharing the memory during this phase.
    pub children_alive: u64,
    pub classes: Classes,
    /// Where this phase's faults happened.
    #[serde(flatten)]
    pub attribution: Attribution,
}

/// Where a span's counts happened: per mapping (every class; the rows and
/// `mappings_other` add up to the class totals exactly, unless the kernel
/// dropped some, which `drops` says), the top code sites of the classes
/// asked for, and their stacks when asked.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Attribution {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mappings: Vec<MappingRow>,
    /// The mappings past `--max-mappings`, folded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mappings_other: Option<Folded>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<SiteRow>,
    /// Per class, the sites past `--max-sites`, folded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sites_other: Vec<FoldedSites>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<StackRow>,
}

impl Attribution {
    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty() && self.sites.is_empty() && self.stacks.is_empty()
    }
}

/// One mapping, named as `/proc/PID/maps` names it: `[heap]`, `[stack]`, a
/// file path (with ` (deleted)`), `[anon:NAME]`, or `anon 0x…-0x…`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MappingRow {
    pub mapping: String,
    pub start: u64,
    pub end: u64,
    pub size: u64,
    /// False when no maps snapshot had a mapping starting there and the one
    /// containing the address was taken (a stack that grew, a split VMA, an
    /// event outside a fault), or none was found (`unresolved`).
    pub exact: bool,
    /// Counts of the measured classes in this mapping (zeros left out).
    pub counts: BTreeMap<ReportClass, u64>,
}

/// What was folded into one `other` row.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Folded {
    /// How many entries were folded.
    pub entries: u64,
    pub counts: BTreeMap<ReportClass, u64>,
}

/// A faulting user instruction of a class.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SiteRow {
    pub class: ReportClass,
    pub ip: u64,
    /// `func+0x3c (module)`; `module+0x… (build id …)` where stripped;
    /// `[no fault]` for events outside a fault (a syscall).
    pub site: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapping: Option<String>,
    /// For a fault the kernel took for the process (kernel or GUP origin),
    /// the system call it was in, e.g. `read(2)`; `site` is then where
    /// user mode made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    pub count: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FoldedSites {
    pub class: ReportClass,
    pub entries: u64,
    pub count: u64,
}

/// A stack of a class: user frames, then kernel frames (contpte classes),
/// each outermost first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StackRow {
    pub class: ReportClass,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernel: Vec<String>,
    pub count: u64,
}

/// What the run attributed, and what it could not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AttributionInfo {
    /// Per-mapping counts are measured here.
    pub mappings: bool,
    /// Why not, when they are not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mappings_reason: Option<String>,
    /// The classes whose sites are counted (and measurable here).
    pub site_classes: Vec<ReportClass>,
    /// The classes asked for whose sites cannot be counted here, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sites_reason: Option<String>,
    /// The classes whose stacks are counted.
    pub stack_classes: Vec<ReportClass>,
    /// The classes asked for whose stacks cannot be counted here, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stacks_reason: Option<String>,
    pub max_mappings: u64,
    pub max_sites: u64,
}

/// One class: a count (with latency when timed), or why it cannot be
/// measured on that kernel (never a 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ClassValue {
    Measured(Measured),
    NotMeasurable(NotMeasurable),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Measured {
    pub count: u64,
    /// `count` split by who asked for the faults: all three add up to it
    /// where all are measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origins: Option<Origins>,
    #[serde(default, skip_serializing_if = "Option::is_none", flatten)]
    pub latency: Option<Latency>,
    /// `copy` and `not_present`: the new anon folios their faults mapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folios: Option<Box<Folios>>,
    /// `copy`: the copies by the kind of mapping they were made in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Box<CopySources>>,
    /// `huge_pmd_wp`: what came of the faults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcomes: Option<Box<PmdOutcomes>>,
    /// How it was measured on that kernel.
    pub source: String,
}

/// The new anon folios a class's faults mapped (`copy`: what each COW
/// copy allocated; `not_present`: first touches of anon memory, first
/// writes to a private file page, swap-ins into a new folio), by size as
/// `bench --folio` names it (`4K`, `16K`, `64K`, `2M`), and their bytes.
/// Absent: not measurable here (no probe where a new anon folio is
/// mapped, or no folio order in the kernel's BTF).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Folios {
    pub sizes: BTreeMap<String, u64>,
    pub bytes: u64,
}

impl Folios {
    /// From counts by folio order (0: a base page).
    pub fn from_orders(by_order: &BTreeMap<u32, u64>) -> Folios {
        let mut out = Folios::default();
        for (order, n) in by_order {
            let bytes = crate::units::PAGE << order.min(&30);
            *out.sizes.entry(crate::units::size(bytes)).or_default() += n;
            out.bytes += bytes * n;
        }
        out
    }

    pub fn add(&mut self, o: &Folios) {
        for (size, n) in &o.sizes {
            *self.sizes.entry(size.clone()).or_default() += n;
        }
        self.bytes += o.bytes;
    }

    /// The folios of one size (`64K`); none of a size measured is 0.
    pub fn of_size(&self, name: &str) -> u64 {
        let want = crate::units::parse_size(name).ok();
        self.sizes.iter().filter(|(s, _)| crate::units::parse_size(s).ok() == want).map(|(_, n)| n).sum()
    }

    /// The sizes, smallest first.
    pub fn by_size(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self
            .sizes
            .iter()
            .filter_map(|(s, n)| crate::units::parse_size(s).ok().map(|b| (b, *n)))
            .collect();
        v.sort_unstable();
        v
    }
}

/// Write-protect faults on PMD-mapped THPs by what the kernel did
/// (`reused + copied + split + other = count`): the PMD made writable in
/// place, the THP copied into a new one, or the PMD split into PTEs (the
/// fault then goes on as a PTE write-protect fault, counted also as the
/// `reuse` or `copy` it is; a private file THP's PMD is dropped instead,
/// and the page written copied from the file: a 4K `copy`); `other`:
/// retried or failed. A THP copied is also a `copy`, of its THP's size. A
/// private file THP's split is seen where `__split_huge_pmd` attaches. Absent where a copy cannot be told
/// (folio sizes not read) or the PTE fault is not seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PmdOutcomes {
    pub reused: u64,
    pub copied: u64,
    pub split: u64,
    pub other: u64,
}

impl PmdOutcomes {
    /// The outcomes' names (the JSON keys).
    pub const NAMES: [&'static str; 4] = ["reused", "copied", "split", "other"];

    pub fn add(&mut self, o: &PmdOutcomes) {
        self.reused += o.reused;
        self.copied += o.copied;
        self.split += o.split;
        self.other += o.other;
    }

    /// The count of the outcome named `name` (one of [`Self::NAMES`]).
    pub fn get(&self, name: &str) -> Option<u64> {
        Some(match name {
            "reused" => self.reused,
            "copied" => self.copied,
            "split" => self.split,
            "other" => self.other,
            _ => return None,
        })
    }
}

/// COW copies by the mapping the fault was in, from the per-mapping counts
/// (`anon + file + unattributed = count`): anonymous memory (heap, stack,
/// mmap), a private file mapping (of those, `file_exec`: executable, where
/// a hot patch or a uprobe writes), and copies in no mapping the maps
/// history holds (a process gone before its maps were read, a full
/// per-mapping map). A copy in a file mapping may copy a page that an
/// earlier copy made anonymous; the first write to a file page that was
/// not mapped yet is `not_present`. Absent: per-mapping counts are off.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CopySources {
    pub anon: u64,
    pub file: u64,
    pub file_exec: u64,
    pub unattributed: u64,
}

impl CopySources {
    /// The parts' names (the JSON keys), as `verify` and `diff` name them.
    pub const NAMES: [&'static str; 4] = ["anon", "file", "file_exec", "unattributed"];

    /// The part named `name` (one of [`Self::NAMES`]).
    pub fn get(&self, name: &str) -> Option<u64> {
        Some(match name {
            "anon" => self.anon,
            "file" => self.file,
            "file_exec" => self.file_exec,
            "unattributed" => self.unattributed,
            _ => return None,
        })
    }

    pub fn add(&mut self, o: &CopySources) {
        self.anon += o.anon;
        self.file += o.file;
        self.file_exec += o.file_exec;
        self.unattributed += o.unattributed;
    }
}

/// A class's count by origin: `user` (a fault in user mode), `kernel` (the
/// kernel's fault on user memory in a system call: `copy_to_user` in
/// read, recv), `gup` (get_user_pages for the task: `/proc/PID/mem`,
/// `process_vm_writev`, O_DIRECT, io_uring). Absent: not measurable here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Origins {
    pub user: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gup: Option<u64>,
}

impl Origins {
    pub fn add(&mut self, o: &Origins) {
        self.user += o.user;
        self.kernel = self.kernel.zip(o.kernel).map(|(a, b)| a + b);
        self.gup = self.gup.zip(o.gup).map(|(a, b)| a + b);
    }

    /// The count of origin `name` (`user`, `kernel`, `gup`), when measured.
    pub fn get(&self, name: &str) -> Option<u64> {
        match name {
            "user" => Some(self.user),
            "kernel" => self.kernel,
            "gup" => self.gup,
            _ => None,
        }
    }
}

/// Latency of a timed class, from the kernel's log-linear histogram.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
    /// The time in faults: the timed faults' latencies summed (with
    /// `--latency sample=N`, of the sampled faults only; N times it
    /// estimates all). 0 in reports older than it.
    #[serde(default)]
    pub sum_ns: u64,
    /// The kernel's own log-linear buckets, so that a reader can draw the
    /// distribution (`plot --latency`): `[lo_ns, hi_ns, count]` of each
    /// bucket that counted something, ascending, the values `[lo, hi)`.
    /// Absent in reports older than it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<[u64; 3]>,
    /// The figures above are the fault's time in the kernel less what
    /// faultscope's own programs nested in the fault measured of
    /// themselves; these are the whole time, and that own time's mean.
    /// Absent in reports older than it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<RawLatency>,
}

/// A timed class's latency with faultscope's nested programs' own time
/// left in (see `Latency::raw`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLatency {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
    /// The mean time per fault taken out (the nested programs' own clock
    /// reads; the probe mechanism around them is not in it).
    pub own_mean_ns: u64,
}

impl Latency {
    /// Adds `from`'s buckets to `into` (both ascending), bucket by bucket
    /// (the same `lo` is the same kernel bucket): the distribution of the
    /// two sets of faults together.
    pub fn add_buckets(into: &mut Vec<[u64; 3]>, from: &[[u64; 3]]) {
        for b in from {
            match into.binary_search_by_key(&b[0], |x| x[0]) {
                Ok(i) => {
                    into[i][1] = into[i][1].max(b[1]);
                    into[i][2] += b[2];
                }
                Err(i) => into.insert(i, *b),
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotMeasurable {
    /// Always false.
    pub measurable: bool,
    /// Why: stored once per report, in `availability`, and filled in here
    /// when a report is read (`Report::restore_reasons`); accepted here on
    /// input (older reports), never written.
    #[serde(default, skip_serializing)]
    pub reason: String,
}

impl ClassValue {
    pub fn count(&self) -> Option<u64> {
        match self {
            ClassValue::Measured(m) => Some(m.count),
            ClassValue::NotMeasurable(_) => None,
        }
    }

    /// The count of one origin (`user`, `kernel`, `gup`), when measured.
    pub fn origin_count(&self, origin: &str) -> Option<u64> {
        match self {
            ClassValue::Measured(m) => m.origins.as_ref()?.get(origin),
            ClassValue::NotMeasurable(_) => None,
        }
    }
}

/// One interval of `record --interval`: what each process did in it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Interval {
    pub t_s: f64,
    /// The phase current at its end.
    pub phase: String,
    /// Every phase the kernel put its faults in, in order: more than one
    /// when a phase changed within it (the faults before the change are
    /// the earlier phase's, whatever the interval's end).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases: Vec<String>,
    pub processes: Vec<IntervalProcess>,
    /// Under `-a`: the processes past the report's `top` in this interval
    /// (by its `sort`), summed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub others: Option<IntervalOthers>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IntervalOthers {
    pub processes: u64,
    pub counts: BTreeMap<ReportClass, u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IntervalProcess {
    pub pid: u32,
    /// Measured classes only.
    pub counts: BTreeMap<ReportClass, u64>,
    /// The p99 latency in the interval of the timed classes that had
    /// faults in it (from the kernel's histogram of the interval).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub p99_ns: BTreeMap<ReportClass, u64>,
    /// The time in faults in the interval of the timed classes that had
    /// faults in it: their timed faults' latencies summed (see
    /// `Latency::sum_ns`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sum_ns: BTreeMap<ReportClass, u64>,
}

/// `bench`: the workload's parameters and its own view of each step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Bench {
    pub mode: String,
    pub size: u64,
    pub folio: String,
    /// "pte" or "pmd".
    pub mapping: String,
    /// "exit" or "alive"; "none" for a hot patch (no fork).
    pub child: String,
    pub threads: u64,
    pub pages: u64,
    pub folios: u64,
    pub folio_check: FolioCheck,
    /// The same after the write step (the child still alive): the folios
    /// the copies left mapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_write: Option<FolioCheck>,
    pub pid: u32,
    pub child_pid: i32,
    /// populate, fork, write: each the span of the mark `mark:STEP` and the
    /// automatic phases up to the next mark (see `Process::span`).
    pub steps: Vec<BenchStep>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_latency: Option<StoreLatency>,
    /// `hotpatch` modes: the executable file mapping before and after the
    /// write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hotpatch: Option<Hotpatch>,
}

/// A hot patch of a private executable file mapping backed by file THPs,
/// as `/proc/self/smaps` saw the mapping (`Rss` is what the exec THP COW
/// series' cover letter reports as "Exec mmap Rss").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Hotpatch {
    /// "mprotect" (then stores) or "proc-mem" (`/proc/self/mem` writes).
    pub poke: String,
    /// Bytes written: one per folio.
    pub writes: u64,
    /// Of those, the writes the kernel refused (`/proc/self/mem`: EIO),
    /// and the first one's error.
    #[serde(default)]
    pub refused: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_error: Option<String>,
    /// The file's file system (`statfs`): "tmpfs" (shmem THPs, which the
    /// exec THP COW series does not copy whole), "ext2/3/4", "xfs", ...
    pub file_system: String,
    pub before: ExecMapping,
    pub after: ExecMapping,
}

/// One mapping's memory, in bytes, from `/proc/self/smaps`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecMapping {
    pub rss: u64,
    /// Anonymous: the pages its COW copies made.
    pub anonymous: u64,
    /// Of those, in PMD-mapped THPs.
    pub anon_huge: u64,
    /// File (or shmem) THPs mapped by PMDs.
    pub file_pmd_mapped: u64,
}

/// How many folio-sized blocks are exactly one folio of that size (head
/// page first, physically contiguous tails), and how much is PMD-mapped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FolioCheck {
    pub blocks: u64,
    pub whole_folios: u64,
    pub pmd_mapped_bytes: u64,
    /// The folios mapped in the range by size, each counted once at its
    /// head page (pagemap and kpageflags): made another way than
    /// faultscope's folio sizes, from the pages themselves.
    #[serde(default)]
    pub mapped: Folios,
}

/// A bench step as the workload saw it (getrusage, wall clock, CPU time).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BenchStep {
    pub name: String,
    pub minflt: i64,
    pub majflt: i64,
    pub wall_ns: u64,
    /// The bench process's CPU time in the step (CLOCK_PROCESS_CPUTIME_ID):
    /// its stores and the kernel's work for them, faults and the BPF
    /// programs they run included, but not time spent waiting for a CPU, so
    /// it tells a tracer's cost on a busy machine where wall time cannot.
    #[serde(default)]
    pub cpu_ns: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StoreLatency {
    pub n: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Finding {
    pub rule: String,
    pub pid: u32,
    /// The phase or bench step (`mark:write`) it is about.
    pub phase: String,
    pub text: String,
    /// The numbers the finding rests on.
    pub numbers: BTreeMap<String, Number>,
}

/// A number of a finding: counts stay integers in JSON.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Number {
    Int(u64),
    Float(f64),
}

impl From<u64> for Number {
    fn from(v: u64) -> Number {
        Number::Int(v)
    }
}

impl From<f64> for Number {
    fn from(v: f64) -> Number {
        Number::Float(v)
    }
}

/// A span of a process's run: one phase, or a bench step (its mark and the
/// automatic phases up to the next mark, e.g. a fork and its child's exit).
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: String,
    pub classes: Classes,
    /// A forked child shared the memory during some phase of the span.
    pub child_alive: bool,
    pub attribution: Attribution,
}

fn add_counts(into: &mut BTreeMap<ReportClass, u64>, from: &BTreeMap<ReportClass, u64>) {
    for (m, n) in from {
        *into.entry(*m).or_insert(0) += n;
    }
}

/// Sums the attribution of several phases: rows of the same mapping, site or
/// stack add up; the folded rows add up too.
pub fn sum_attribution<'a>(parts: impl IntoIterator<Item = &'a Attribution>) -> Attribution {
    let mut out = Attribution::default();
    for a in parts {
        for r in &a.mappings {
            match out.mappings.iter_mut().find(|x| x.mapping == r.mapping && x.start == r.start) {
                Some(x) => add_counts(&mut x.counts, &r.counts),
                None => out.mappings.push(r.clone()),
            }
        }
        if let Some(o) = &a.mappings_other {
            let x = out.mappings_other.get_or_insert_with(Folded::default);
            x.entries += o.entries;
            add_counts(&mut x.counts, &o.counts);
        }
        for r in &a.sites {
            match out.sites.iter_mut().find(|x| x.class == r.class && x.ip == r.ip && x.syscall == r.syscall)
            {
                Some(x) => x.count += r.count,
                None => out.sites.push(r.clone()),
            }
        }
        for r in &a.sites_other {
            match out.sites_other.iter_mut().find(|x| x.class == r.class) {
                Some(x) => {
                    x.entries += r.entries;
                    x.count += r.count;
                }
                None => out.sites_other.push(r.clone()),
            }
        }
        for r in &a.stacks {
            match out
                .stacks
                .iter_mut()
                .find(|x| x.class == r.class && x.user == r.user && x.kernel == r.kernel)
            {
                Some(x) => x.count += r.count,
                None => out.stacks.push(r.clone()),
            }
        }
    }
    let total = |c: &BTreeMap<ReportClass, u64>| c.values().sum::<u64>();
    out.mappings.sort_by(|a, b| total(&b.counts).cmp(&total(&a.counts)).then(a.start.cmp(&b.start)));
    out.sites.sort_by(|a, b| a.class.cmp(&b.class).then(b.count.cmp(&a.count)).then(a.ip.cmp(&b.ip)));
    out.stacks.sort_by(|a, b| a.class.cmp(&b.class).then(b.count.cmp(&a.count)));
    out
}

impl Attribution {
    /// The mapping with the most events of `m`, and that count.
    pub fn top_mapping(&self, m: ReportClass) -> Option<(&MappingRow, u64)> {
        self.mappings
            .iter()
            .filter_map(|r| r.counts.get(&m).map(|n| (r, *n)))
            .filter(|(_, n)| *n > 0)
            .max_by_key(|(r, n)| (*n, std::cmp::Reverse(r.start)))
    }

    /// The site with the most events of `m`.
    pub fn top_site(&self, m: ReportClass) -> Option<&SiteRow> {
        self.sites.iter().filter(|s| s.class == m).max_by_key(|s| (s.count, std::cmp::Reverse(s.ip)))
    }
}

/// Sums class counts over phases (measurability and source from the first;
/// latency is not summable and is left out).
pub fn sum_classes<'a>(phases: impl IntoIterator<Item = &'a Classes>) -> Classes {
    let mut out = Classes::new();
    for classes in phases {
        for (m, v) in classes {
            match (out.get_mut(m), v) {
                (None, ClassValue::Measured(x)) => {
                    out.insert(*m, ClassValue::Measured(Measured { latency: None, ..x.clone() }));
                }
                (None, v) => {
                    out.insert(*m, v.clone());
                }
                (Some(ClassValue::Measured(a)), ClassValue::Measured(b)) => {
                    a.count += b.count;
                    if let (Some(x), Some(y)) = (a.origins.as_mut(), b.origins.as_ref()) {
                        x.add(y);
                    }
                    if let (Some(x), Some(y)) = (a.folios.as_mut(), b.folios.as_ref()) {
                        x.add(y);
                    }
                    if let (Some(x), Some(y)) = (a.sources.as_mut(), b.sources.as_ref()) {
                        x.add(y);
                    }
                    if let (Some(x), Some(y)) = (a.outcomes.as_mut(), b.outcomes.as_ref()) {
                        x.add(y);
                    }
                }
                _ => {}
            }
        }
    }
    out
}

impl Process {
    /// The spans of the run: each phase that is not a mark, and each mark
    /// with the automatic phases that follow it up to the next mark. This
    /// is the one definition of "a bench step".
    pub fn spans(&self) -> Vec<Span> {
        if self.phases.is_empty() {
            return vec![Span {
                name: "whole run".into(),
                classes: self.classes.clone(),
                child_alive: false,
                attribution: self.attribution.clone(),
            }];
        }
        let ph = &self.phases;
        let mut out = Vec::new();
        let mut i = 0;
        while i < ph.len() {
            let mut j = i + 1;
            if ph[i].kind == PhaseKind::Mark {
                while j < ph.len() && ph[j].kind != PhaseKind::Mark {
                    j += 1;
                }
            }
            out.push(Span {
                name: ph[i].name.clone(),
                classes: sum_classes(ph[i..j].iter().map(|p| &p.classes)),
                child_alive: ph[i..j].iter().any(|p| p.kind == PhaseKind::ChildAlive),
                attribution: if j == i + 1 {
                    ph[i].attribution.clone()
                } else {
                    sum_attribution(ph[i..j].iter().map(|p| &p.attribution))
                },
            });
            i = j;
        }
        out
    }

    /// The span named `name` (a phase name, or a bench step `mark:STEP`).
    pub fn span(&self, name: &str) -> Option<Span> {
        self.spans().into_iter().find(|s| s.name == name)
    }

    pub fn count(&self, m: ReportClass) -> Option<u64> {
        self.classes.get(&m).and_then(ClassValue::count)
    }
}

impl Span {
    pub fn count(&self, m: ReportClass) -> Option<u64> {
        self.classes.get(&m).and_then(ClassValue::count)
    }
}

/// Write faults on present pages, the denominator of the spurious share:
/// write-protect faults (PTE and PMD) plus the spurious ones themselves.
pub fn present_write_faults(count: impl Fn(ReportClass) -> Option<u64>) -> u64 {
    [ReportClass::WpFaults, ReportClass::HugePmdWp, ReportClass::Spurious]
        .iter()
        .filter_map(|m| count(*m))
        .sum()
}

impl Report {
    pub fn process(&self, pid: u32) -> Option<&Process> {
        self.processes.iter().find(|p| p.pid == pid)
    }

    /// The bench's own process, when the report is a bench run.
    pub fn bench_process(&self) -> Option<&Process> {
        self.bench.as_ref().and_then(|b| self.process(b.pid))
    }

    /// Fills each not-measurable class's reason from `availability` (a
    /// report read back stores them there only).
    pub fn restore_reasons(&mut self) {
        let avail = &self.availability;
        for p in &mut self.processes {
            for c in std::iter::once(&mut p.classes).chain(p.phases.iter_mut().map(|ph| &mut ph.classes)) {
                for (m, v) in c.iter_mut() {
                    if let (ClassValue::NotMeasurable(n), Some(r)) = (v, avail.get(m)) {
                        if n.reason.is_empty() {
                            n.reason = r.clone();
                        }
                    }
                }
            }
        }
    }

    pub fn drop_count(&self, d: DropReason) -> u64 {
        self.drops.get(d)
    }
}

impl Bench {
    pub fn step(&self, name: &str) -> Option<&BenchStep> {
        self.steps.iter().find(|s| s.name == name)
    }
}

/// The schema of the report, generated from these types.
pub fn json_schema() -> schemars::Schema {
    schemars::schema_for!(Report)
}

/// Builders for tests of the report's readers.
#[cfg(test)]
pub mod testing {
    use super::*;

    pub fn measured(count: u64) -> ClassValue {
        ClassValue::Measured(Measured { count, source: "test".into(), ..Measured::default() })
    }

    pub fn not_measurable(reason: &str) -> ClassValue {
        ClassValue::NotMeasurable(NotMeasurable { measurable: false, reason: reason.into() })
    }

    pub fn classes(counts: &[(ReportClass, u64)]) -> Classes {
        counts.iter().map(|(m, n)| (*m, measured(*n))).collect()
    }

    pub fn phase(name: &str, kind: PhaseKind, classes: Classes) -> Phase {
        Phase {
            id: 0,
            name: name.into(),
            kind,
            start_ns: 0,
            end_ns: None,
            children_alive: 0,
            classes,
            attribution: Attribution::default(),
        }
    }

    pub fn process(pid: u32, phases: Vec<Phase>) -> Process {
        Process {
            pid,
            comm: "test".into(),
            classes: Classes::new(),
            attribution: Attribution::default(),
            phases,
            kernel_check: None,
            container: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{testing::*, *};

    /// The published schema file, beside Cargo.toml.
    pub const PUBLISHED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/report.schema.json");

    fn generated() -> String {
        serde_json::to_string_pretty(&json_schema()).unwrap() + "\n"
    }

    #[test]
    fn published_schema_is_current() {
        let published = std::fs::read_to_string(PUBLISHED).unwrap_or_default();
        assert!(
            published == generated(),
            "tracer/report.schema.json is out of date: run `cargo run -p faultscope -- schema > tracer/report.schema.json`"
        );
    }

    fn sample() -> Report {
        let mut p = process(
            7,
            vec![
                phase("before-fork", PhaseKind::BeforeFork, classes(&[(ReportClass::Faults, 3)])),
                phase("mark:write", PhaseKind::Mark, classes(&[(ReportClass::Reuse, 16)])),
            ],
        );
        p.classes = classes(&[(ReportClass::Faults, 3), (ReportClass::Reuse, 16)]);
        p.classes.insert(ReportClass::ContpteUnfold, not_measurable("arm64 only"));
        if let Some(ClassValue::Measured(m)) = p.classes.get_mut(&ReportClass::Faults) {
            m.latency = Some(Latency {
                p50_ns: 1,
                p99_ns: 2,
                max_ns: 3,
                mean_ns: 2,
                sum_ns: 4,
                buckets: vec![[1, 2, 1], [2, 3, 1]],
                raw: Some(RawLatency { p50_ns: 2, p99_ns: 3, max_ns: 4, mean_ns: 3, own_mean_ns: 1 }),
            });
        }
        Report {
            schema: SCHEMA.into(),
            kernel: "6.12".into(),
            arch: "x86_64".into(),
            mode: Mode::Kprobe,
            drops: Drops::default(),
            processes: vec![p],
            bench: Some(Bench { folio: "64K".into(), steps: vec![], ..Bench::default() }),
            findings: vec![Finding {
                rule: "r".into(),
                pid: 7,
                phase: "mark:write".into(),
                text: "t".into(),
                numbers: [("n".to_string(), Number::Int(1)), ("p".to_string(), Number::Float(0.5))].into(),
            }],
            availability: [(ReportClass::ContpteUnfold, "arm64 only".to_string())].into(),
            ..Report::default()
        }
    }

    /// The reasons are written once (`availability`) and come back in every
    /// class on reading.
    #[test]
    fn round_trip_through_json() {
        let r = sample();
        let text = serde_json::to_string_pretty(&r).unwrap();
        assert_eq!(text.matches("arm64 only").count(), 1, "{text}");
        let mut back: Report = serde_json::from_str(&text).unwrap();
        back.restore_reasons();
        assert_eq!(back, r);
    }

    #[test]
    fn the_schema_validates_a_report_and_rejects_a_broken_one() {
        let schema = serde_json::to_value(json_schema()).unwrap();
        let v = jsonschema::validator_for(&schema).unwrap();
        let good = serde_json::to_value(sample()).unwrap();
        assert!(v.is_valid(&good), "{:?}", v.iter_errors(&good).map(|e| e.to_string()).collect::<Vec<_>>());
        let mut bad = good.clone();
        bad["processes"][0]["classes"]["faults"]["count"] = serde_json::json!(-1);
        assert!(!v.is_valid(&bad));
        let mut bad = good;
        bad["processes"][0]["phases"][0]["kind"] = serde_json::json!("sometime");
        assert!(!v.is_valid(&bad));
    }

    #[test]
    fn a_mark_and_the_phases_after_it_are_one_step() {
        let p = process(
            1,
            vec![
                phase("mark:fork", PhaseKind::Mark, classes(&[(ReportClass::Copy, 1)])),
                phase("fork#1 child-alive", PhaseKind::ChildAlive, classes(&[(ReportClass::Copy, 5)])),
                phase(
                    "fork#1 after-child-exit",
                    PhaseKind::AfterChildExit,
                    classes(&[(ReportClass::Copy, 2)]),
                ),
                phase("mark:write", PhaseKind::Mark, classes(&[(ReportClass::Copy, 100)])),
            ],
        );
        let s = p.spans();
        assert_eq!(s.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["mark:fork", "mark:write"]);
        assert_eq!(s[0].count(ReportClass::Copy), Some(8));
        assert!(s[0].child_alive && !s[1].child_alive);
        let p = process(2, vec![phase("before-fork", PhaseKind::BeforeFork, classes(&[]))]);
        assert_eq!(p.spans()[0].name, "before-fork");
    }
}
