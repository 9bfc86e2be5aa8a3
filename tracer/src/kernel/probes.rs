//! The probe table: every probe faultscope may attach, with its kernel
//! function (and fallbacks), what it measures, and whether a run can go on
//! without it. At start-up the table is resolved against the running kernel;
//! the result says, for every reported class, whether it is measured here and
//! if not, why.

use std::{collections::BTreeSet, path::Path};

use faultscope_common::Program;

use crate::kernel::{self, btf::KernelBtf, Kallsyms};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// kprobe on the first of `functions` found in /proc/kallsyms.
    Kprobe(&'static [&'static str]),
    /// kretprobe on the same.
    Kretprobe(&'static [&'static str]),
    /// Tracepoint `category:name`.
    Tracepoint(&'static str, &'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Any,
    X86_64,
    Aarch64,
}

impl Arch {
    fn here(self) -> bool {
        match self {
            Arch::Any => true,
            Arch::X86_64 => cfg!(target_arch = "x86_64"),
            Arch::Aarch64 => cfg!(target_arch = "aarch64"),
        }
    }
    /// Whether it is `arch`, as `std::env::consts::ARCH` names them.
    pub fn is(self, arch: &str) -> bool {
        match self {
            Arch::Any => true,
            Arch::X86_64 => arch == "x86_64",
            Arch::Aarch64 => arch == "aarch64",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Arch::Any => "any",
            Arch::X86_64 => "x86-64",
            Arch::Aarch64 => "arm64",
        }
    }
}

pub struct ProbeSpec {
    /// The eBPF program (tracer-ebpf).
    pub program: Program,
    pub hook: Hook,
    pub arch: Arch,
    pub min_kernel: &'static str,
    /// Without it faultscope cannot run at all.
    pub required: bool,
    pub measures: &'static str,
    /// Not attached when this other program is: it would only repeat what
    /// that one tells, at a cost on every fault.
    pub redundant_with: Option<Program>,
    /// Attached only when this other program is, which cannot be right
    /// without it; where it fails to attach, the run refuses to start.
    pub only_with: Option<Program>,
    /// Not attached in exit-only mode ([`exit_only`]) where this other
    /// program attached as fexit: that one reads this one's arguments at
    /// the return, and the exception opens the fault.
    pub folded_into: Option<Program>,
}

/// Every probe. The order is the order of attachment: the per-thread state is
/// created by the exception probes and `handle_mm_fault` entry, so marks
/// attach after them; the return attaches before the entry, which is not
/// needed where the return is an fexit in exit-only mode.
pub const PROBES: &[ProbeSpec] = &[
    ProbeSpec {
        program: Program::TaskNewtask,
        hook: Hook::Tracepoint("task", "task_newtask"),
        arch: Arch::Any,
        min_kernel: "3.5",
        required: true,
        measures: "forks of traced processes (clone_flags tell processes from threads); follows children",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::ProcessExec,
        hook: Hook::Tracepoint("sched", "sched_process_exec"),
        arch: Arch::Any,
        min_kernel: "3.4",
        required: true,
        measures: "exec of traced processes (a started command counts from its exec)",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::ProcessExit,
        hook: Hook::Tracepoint("sched", "sched_process_exit"),
        arch: Arch::Any,
        min_kernel: "2.6.32",
        required: true,
        measures: "exit of traced processes (ends the run when all are gone)",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::CgroupMkdir,
        hook: Hook::Tracepoint("cgroup", "cgroup_mkdir"),
        arch: Arch::Any,
        min_kernel: "4.19",
        required: false,
        measures: "cgroup v2 directories made: the container of a process that exits before its /proc is read",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::PageFaultUser,
        hook: Hook::Tracepoint("exceptions", "page_fault_user"),
        arch: Arch::X86_64,
        min_kernel: "3.13",
        required: false,
        measures: "user faults by error code; PROT bit for the spurious rule; the tracepoint-only mode",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::PageFaultKernel,
        hook: Hook::Tracepoint("exceptions", "page_fault_kernel"),
        arch: Arch::X86_64,
        min_kernel: "3.13",
        required: false,
        measures: "kernel-mode faults on user addresses (copy_to_user in a system call): their error code; in tracepoint-only mode, the kernel-origin faults",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::MemAbort,
        hook: Hook::Kprobe(&["do_mem_abort"]),
        arch: Arch::Aarch64,
        min_kernel: "3.7",
        required: false,
        measures: "ESR of each abort: permission fault = present page (spurious rule)",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::FaultReturn,
        hook: Hook::Kretprobe(&["handle_mm_fault"]),
        arch: Arch::Any,
        min_kernel: "4.9",
        required: false,
        measures: "end of each fault: latency, vm_fault_t, classification",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::FaultEntry,
        hook: Hook::Kprobe(&["handle_mm_fault"]),
        arch: Arch::Any,
        min_kernel: "4.9",
        required: false,
        measures: "start of each fault of a traced task, with its origin (user; kernel: regs set, no FAULT_FLAG_USER; gup: regs NULL)",
        redundant_with: None,
        only_with: None,
        folded_into: Some(Program::FaultReturn),
    },
    ProbeSpec {
        program: Program::SchedSwitch,
        hook: Hook::Tracepoint("sched", "sched_switch"),
        arch: Arch::Any,
        min_kernel: "2.6.28",
        required: false,
        measures: "a thread switched out in the middle of a fault (it sleeps: I/O, the page lock, userfaultfd) takes the fault's state from its CPU's slot to its task storage",
        redundant_with: None,
        only_with: Some(Program::FaultReturn),
        folded_into: None,
    },
    ProbeSpec {
        program: Program::WpPage,
        hook: Hook::Kprobe(&["do_wp_page"]),
        arch: Arch::Any,
        min_kernel: "2.6",
        required: false,
        measures: "write-protect faults on PTEs",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::HugePmdWp,
        hook: Hook::Kprobe(&["do_huge_pmd_wp_page"]),
        arch: Arch::Any,
        min_kernel: "2.6.38",
        required: false,
        measures: "write-protect faults on PMD-mapped THPs",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::SplitHugePmd,
        hook: Hook::Kprobe(&["__split_huge_pmd"]),
        arch: Arch::Any,
        min_kernel: "4.5",
        required: false,
        measures: "a PMD split inside a write fault: the write-protect fault of a private file THP (wp_huge_pmd splits it without do_huge_pmd_wp_page); runs only where a PMD splits",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::HugePmdExecCow,
        hook: Hook::Kprobe(&["do_huge_pmd_exec_cow"]),
        arch: Arch::Any,
        min_kernel: "none (the exec THP COW series)",
        required: false,
        measures: "a private executable file THP copied whole on a write fault (the exec THP COW series)",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::NewAnonRmap,
        hook: Hook::Kprobe(&["folio_add_new_anon_rmap", "page_add_new_anon_rmap"]),
        arch: Arch::Any,
        min_kernel: "6.3 (folio_*), earlier page_*",
        required: false,
        measures: "a new anon folio mapped: inside do_wp_page, a COW copy",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::DirtyShared,
        hook: Hook::Kprobe(&["fault_dirty_shared_page"]),
        arch: Arch::Any,
        min_kernel: "4.10",
        required: false,
        measures:
            "a shared mapping's page dirtied: inside do_wp_page, write-notify (wp_page_shared), not COW",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::AccessFlags,
        hook: Hook::Kprobe(&[
            "ptep_set_access_flags",
            "__ptep_set_access_flags",
            "__ptep_set_access_flags_anysz",
        ]),
        arch: Arch::Any,
        min_kernel: "2.6 (arm64: __ptep_set_access_flags since 6.9, __ptep_set_access_flags_anysz in 7.x)",
        required: false,
        measures: "present-entry tail of a fault (spurious rule where no exception record exists)",
        redundant_with: Some(Program::PageFaultUser),
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::AccessFlagsCont,
        hook: Hook::Kprobe(&["contpte_ptep_set_access_flags"]),
        arch: Arch::Aarch64,
        min_kernel: "6.9",
        required: false,
        measures: "the same for contpte blocks",
        redundant_with: Some(Program::PageFaultUser),
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::HugeAccessed,
        hook: Hook::Kprobe(&["huge_pmd_set_accessed"]),
        arch: Arch::Any,
        min_kernel: "3.8",
        required: false,
        measures: "the same for PMD-mapped THPs",
        redundant_with: Some(Program::PageFaultUser),
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::ContpteTryUnfold,
        hook: Hook::Kprobe(&["__contpte_try_unfold"]),
        arch: Arch::Aarch64,
        min_kernel: "6.9",
        required: false,
        measures: "__contpte_try_unfold calls (6.12's unfold path)",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::ContpteConvert,
        hook: Hook::Kprobe(&["contpte_convert"]),
        arch: Arch::Aarch64,
        min_kernel: "6.9",
        required: false,
        measures: "contpte blocks rewritten: folded (PTE_CONT in the new PTE) or unfolded",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
    ProbeSpec {
        program: Program::ContpteTryFold,
        hook: Hook::Kprobe(&["__contpte_try_fold"]),
        arch: Arch::Aarch64,
        min_kernel: "6.9",
        required: false,
        measures: "contpte fold attempts",
        redundant_with: None,
        only_with: None,
        folded_into: None,
    },
];

/// The backend asked for on the command line (`--backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    /// fentry/fexit where the kernel's BTF describes the function, else
    /// kprobe, per probe.
    #[default]
    Auto,
    /// kprobes (and kretprobes) only.
    Kprobe,
    /// fentry/fexit for every probe on a kernel function; a probe that
    /// cannot have it is an error.
    Fentry,
}

/// How a probe is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Tracepoint,
    /// kprobe, or kretprobe on a return.
    Kprobe,
    /// fentry, or fexit on a return: a BPF trampoline, no breakpoint; on a
    /// tracepoint, tp_btf: its arguments as they are, no trace record.
    Fentry,
}

impl Backend {
    /// The kernel's name for the attachment of `hook` this way.
    pub fn attach_kind(self, hook: Hook) -> &'static str {
        let ret = matches!(hook, Hook::Kretprobe(_));
        match (self, ret) {
            (Backend::Tracepoint, _) => "tracepoint",
            (Backend::Fentry, _) if matches!(hook, Hook::Tracepoint(..)) => "tp_btf",
            (Backend::Kprobe, false) => "kprobe",
            (Backend::Kprobe, true) => "kretprobe",
            (Backend::Fentry, false) => "fentry",
            (Backend::Fentry, true) => "fexit",
        }
    }
}

/// What resolution found for one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Attach to this kernel symbol (or tracepoint), this way, and why this
    /// way. `fallback`: whether a kprobe (a classic tracepoint) could take
    /// it instead, or why not (`auto` falls back to it when the kernel
    /// refuses the fentry).
    Attach { symbol: String, backend: Backend, why: String, fallback: Result<(), String> },
    /// Not attachable here, and why.
    Unavailable(String),
    /// Attachable, but not by the backend asked for (`--backend fentry`),
    /// and why: the run refuses to start.
    Refused(String),
}

pub struct Resolved {
    pub spec: &'static ProbeSpec,
    pub resolution: Resolution,
}

/// Whether the run will be in exit-only mode: the return resolves to an
/// fexit and x86's exception tracepoints are attachable, so that the
/// exceptions open each fault, the fexit (which sees the arguments) closes
/// it, and no program runs at `handle_mm_fault`'s entry (one probe less on
/// every fault). get_user_pages raises no exception: its faults are counted
/// and classified alike, untimed. Decided before the object is loaded (a
/// load-time constant); where the attach then falls short of it, the entry
/// is attached after all and the programs run as without it.
pub fn exit_only(resolved: &[Resolved]) -> bool {
    let resolves = |p: Program, fexit: bool| {
        resolved.iter().any(|r| {
            r.spec.program == p
                && matches!(r.resolution, Resolution::Attach { backend, .. } if !fexit || backend == Backend::Fentry)
        })
    };
    resolves(Program::FaultReturn, true)
        && resolves(Program::PageFaultUser, false)
        && resolves(Program::PageFaultKernel, false)
}

/// Facts about the kernel that resolution depends on, gathered once so that
/// resolution itself is a pure function (and testable).
pub struct KernelFacts<'a> {
    pub tracefs: &'a Path,
    pub kallsyms: Option<&'a Kallsyms>,
    pub kprobe_pmu: bool,
    pub blacklist: &'a [String],
    pub lockdown: Option<String>,
    /// The kernel functions BTF describes, among those of the table (for
    /// fentry), and `btf_trace_NAME` for the tracepoints it describes (for
    /// tp_btf), or why there is no BTF.
    pub btf_functions: Result<&'a BTreeSet<String>, String>,
    pub backend: BackendChoice,
}

/// BTF's name of a tracepoint's prototype (what tp_btf attaches by).
pub fn btf_trace(name: &str) -> String {
    format!("btf_trace_{name}")
}

/// Every kernel function the table may attach to, and `btf_trace_NAME`
/// for each tracepoint that has a tp_btf twin.
pub fn functions() -> BTreeSet<String> {
    PROBES
        .iter()
        .flat_map(|p| match p.hook {
            Hook::Kprobe(f) | Hook::Kretprobe(f) => f.iter().map(|s| s.to_string()).collect(),
            Hook::Tracepoint(_, name) if p.program.fentry_name().is_some() => vec![btf_trace(name)],
            Hook::Tracepoint(..) => vec![],
        })
        .collect()
}

/// What resolution reads of the running kernel, once per run: its BTF
/// (with which of the table's functions it describes) and its symbols.
pub struct KernelReadings {
    pub btf: KernelBtf,
    kallsyms: Option<Kallsyms>,
    blacklist: Vec<String>,
}

/// Reads the kernel's BTF and kallsyms side by side: kallsyms on a thread
/// of its own (the kernel formats every symbol; under emulation it is most
/// of a start-up) and aya's loader on another (it parses BTF when made)
/// while this one parses BTF, and also aya's parse of it where fentry may
/// be used (`backend`).
pub fn read_kernel(backend: BackendChoice) -> KernelReadings {
    let wanted = functions();
    std::thread::scope(|s| {
        let symbols = std::thread::Builder::new()
            .spawn_scoped(s, || (Kallsyms::load(&wanted).ok(), kernel::kprobe_blacklist()))
            .ok();
        let loader = std::thread::Builder::new().spawn_scoped(s, aya::EbpfLoader::new).ok();
        let btf = KernelBtf::load(&wanted);
        if backend != BackendChoice::Kprobe {
            // An error is kept in `btf` and said where fentry needs it.
            let _ = btf.aya();
        }
        log::debug!("start: kernel BTF parsed");
        if let Some(l) = loader.and_then(|t| t.join().ok()) {
            btf.keep_loader(l);
        }
        let (kallsyms, blacklist) = symbols.and_then(|t| t.join().ok()).unwrap_or_default();
        log::debug!("start: kallsyms read");
        KernelReadings { btf, kallsyms, blacklist }
    })
}

/// Resolves the table against the running kernel (`k`, and the PMU and
/// lockdown read here).
pub fn resolve_here(tracefs: &Path, k: &KernelReadings, backend: BackendChoice) -> Vec<Resolved> {
    resolve(&KernelFacts {
        tracefs,
        kallsyms: k.kallsyms.as_ref(),
        kprobe_pmu: kernel::has_kprobe_pmu(),
        blacklist: &k.blacklist,
        lockdown: kernel::lockdown(),
        btf_functions: k.btf.functions(),
        backend,
    })
}

pub fn resolve(facts: &KernelFacts<'_>) -> Vec<Resolved> {
    PROBES.iter().map(|spec| Resolved { spec, resolution: resolve_one(spec, facts) }).collect()
}

/// Whether a kernel function can have a fentry/fexit program: its BTF
/// must describe it by the name kallsyms has. `Err` says why not.
pub fn fentry_possible(
    symbol: &str,
    btf_functions: &Result<&BTreeSet<String>, String>,
) -> Result<(), String> {
    let funcs = btf_functions.as_ref().map_err(|why| format!("no kernel BTF ({why})"))?;
    if let Some((base, _)) = symbol.split_once('.') {
        return Err(format!(
            "{symbol} is a compiler-made copy of {base} (its arguments may differ); BTF describes functions by their source name only"
        ));
    }
    if !funcs.contains(symbol) {
        return Err(format!(
            "the kernel's BTF has no function {symbol} (not in its DWARF, or left out by pahole)"
        ));
    }
    Ok(())
}

/// The backend of a probe on kernel function `symbol`: a pure function of
/// the probe, what BTF offers and what was asked for. `Err` is a refusal
/// (`--backend fentry` where fentry cannot be had).
pub fn choose_backend(
    spec: &ProbeSpec,
    symbol: &str,
    want: BackendChoice,
    btf_functions: &Result<&BTreeSet<String>, String>,
) -> Result<(Backend, String), String> {
    let (classic, btf_name) = match spec.hook {
        Hook::Tracepoint(..) if spec.program.fentry_name().is_none() => {
            return Ok((Backend::Tracepoint, "a tracepoint".into()))
        }
        Hook::Tracepoint(_, name) => (Backend::Tracepoint, btf_trace(name)),
        Hook::Kprobe(_) | Hook::Kretprobe(_) => (Backend::Kprobe, symbol.to_string()),
    };
    if want == BackendChoice::Kprobe {
        return Ok((classic, "--backend kprobe".into()));
    }
    match (fentry_possible(&btf_name, btf_functions), want) {
        (Ok(()), _) => Ok((Backend::Fentry, format!("BTF describes {btf_name}"))),
        (Err(why), BackendChoice::Fentry) => Err(format!(
            "--backend fentry: probe {} on {symbol} cannot have {}: {why}",
            spec.program,
            Backend::Fentry.attach_kind(spec.hook)
        )),
        (Err(why), _) => Ok((classic, why)),
    }
}

fn resolve_one(spec: &ProbeSpec, facts: &KernelFacts<'_>) -> Resolution {
    if !spec.arch.here() {
        return Resolution::Unavailable(format!("{} only", spec.arch.name()));
    }
    match spec.hook {
        Hook::Tracepoint(cat, name) => {
            if !kernel::tracepoint_exists(facts.tracefs, cat, name) {
                return Resolution::Unavailable(format!("no tracepoint {cat}:{name} in this kernel"));
            }
            let symbol = format!("{cat}:{name}");
            match choose_backend(spec, &symbol, facts.backend, &facts.btf_functions) {
                Err(why) => Resolution::Refused(why),
                Ok((backend, why)) => Resolution::Attach { symbol, backend, why, fallback: Ok(()) },
            }
        }
        Hook::Kprobe(funcs) | Hook::Kretprobe(funcs) => {
            if facts.lockdown.as_deref() == Some("confidentiality") {
                return Resolution::Unavailable(
                    "kernel lockdown=confidentiality forbids kprobe and tracing programs".into(),
                );
            }
            let Some(k) = facts.kallsyms else {
                return Resolution::Unavailable("/proc/kallsyms is not readable".into());
            };
            // Both backends take the functions kprobes could take, so that
            // they measure the same classes (and the guest oracle, made of
            // kprobes, sees what they see).
            let Some(sym) = funcs.iter().find_map(|f| k.resolve(f)) else {
                return Resolution::Unavailable(format!(
                    "no symbol {} in /proc/kallsyms (inlined or absent in this kernel)",
                    funcs.join(" or ")
                ));
            };
            if facts.blacklist.iter().any(|b| b == &sym) {
                return Resolution::Unavailable(format!("{sym} is on the kprobe blacklist"));
            }
            let fallback = if facts.backend == BackendChoice::Fentry {
                Err("--backend fentry".to_string())
            } else if !facts.kprobe_pmu {
                Err("no kprobe PMU (kernel built without CONFIG_KPROBES)".into())
            } else {
                Ok(())
            };
            match choose_backend(spec, &sym, facts.backend, &facts.btf_functions) {
                Err(why) => Resolution::Refused(why),
                Ok((Backend::Kprobe, _)) if fallback.is_err() => {
                    Resolution::Unavailable(fallback.err().unwrap_or_default())
                }
                Ok((backend, why)) => Resolution::Attach { symbol: sym, backend, why, fallback },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use faultscope_common::program::Site;

    use super::*;

    fn facts<'a>(k: &'a Kallsyms, pmu: bool, tracefs: &'a Path) -> KernelFacts<'a> {
        KernelFacts {
            tracefs,
            kallsyms: Some(k),
            kprobe_pmu: pmu,
            blacklist: &[],
            lockdown: None,
            btf_functions: Err("test".into()),
            backend: BackendChoice::Auto,
        }
    }

    fn attach(symbol: &str, backend: Backend) -> Resolution {
        let why = match backend {
            Backend::Kprobe => "no kernel BTF (test)".into(),
            Backend::Fentry => format!("BTF describes {symbol}"),
            Backend::Tracepoint => "a tracepoint".into(),
        };
        Resolution::Attach { symbol: symbol.into(), backend, why, fallback: Ok(()) }
    }

    #[test]
    fn fallback_symbol_is_used() {
        let k = Kallsyms::parse(
            b"0 T handle_mm_fault\n0 t do_wp_page.isra.0\n0 T page_add_new_anon_rmap\n",
            |_| true,
        );
        let dir = tempfile::tempdir().unwrap();
        let r = resolve(&facts(&k, true, dir.path()));
        let get = |p: Program| r.iter().find(|r| r.spec.program == p).unwrap().resolution.clone();
        assert_eq!(get(Program::FaultEntry), attach("handle_mm_fault", Backend::Kprobe));
        assert_eq!(get(Program::WpPage), attach("do_wp_page.isra.0", Backend::Kprobe));
        assert_eq!(get(Program::NewAnonRmap), attach("page_add_new_anon_rmap", Backend::Kprobe));
        assert!(matches!(get(Program::HugePmdWp), Resolution::Unavailable(r) if r.contains("no symbol")));
        assert!(
            matches!(get(Program::TaskNewtask), Resolution::Unavailable(r) if r.contains("no tracepoint"))
        );
        assert!(
            matches!(get(Program::PageFaultUser), Resolution::Unavailable(r) if r.contains("no tracepoint"))
        );
    }

    #[test]
    fn no_pmu_means_no_kprobes() {
        let k = Kallsyms::parse(b"0 T handle_mm_fault\n", |_| true);
        let dir = tempfile::tempdir().unwrap();
        let r = resolve(&facts(&k, false, dir.path()));
        let e = r.iter().find(|r| r.spec.program == Program::FaultEntry).unwrap();
        assert!(matches!(&e.resolution, Resolution::Unavailable(r) if r.contains("CONFIG_KPROBES")));
    }

    #[test]
    fn blacklisted_is_refused() {
        let k = Kallsyms::parse(b"0 T handle_mm_fault\n", |_| true);
        let dir = tempfile::tempdir().unwrap();
        let bl = vec!["handle_mm_fault".to_string()];
        let mut f = facts(&k, true, dir.path());
        f.blacklist = &bl;
        let r = resolve(&f);
        let e = r.iter().find(|r| r.spec.program == Program::FaultEntry).unwrap();
        assert!(matches!(&e.resolution, Resolution::Unavailable(r) if r.contains("blacklist")));
    }

    /// Exit-only mode needs the return as fexit and both x86 exception
    /// tracepoints; a kretprobe, or no exception tracepoint (arm64), keeps
    /// the entry program. The return attaches before the entry, which
    /// looks at how it attached.
    #[test]
    fn exit_only_needs_the_fexit_and_the_exception_tracepoints() {
        let spec = |p: Program| PROBES.iter().find(|s| s.program == p).unwrap();
        let with = |ret: Backend, tps: bool| {
            let mut v = vec![Resolved {
                spec: spec(Program::FaultReturn),
                resolution: attach("handle_mm_fault", ret),
            }];
            for p in [Program::PageFaultUser, Program::PageFaultKernel] {
                let resolution = if tps {
                    attach("exceptions:page_fault", Backend::Fentry)
                } else {
                    Resolution::Unavailable("x86-64 only".into())
                };
                v.push(Resolved { spec: spec(p), resolution });
            }
            exit_only(&v)
        };
        assert!(with(Backend::Fentry, true));
        assert!(!with(Backend::Kprobe, true));
        assert!(!with(Backend::Fentry, false));
        let at = |p: Program| PROBES.iter().position(|s| s.program == p).unwrap();
        assert!(at(Program::FaultReturn) < at(Program::FaultEntry));
        assert!(at(Program::PageFaultKernel) < at(Program::FaultEntry));
        assert_eq!(spec(Program::FaultEntry).folded_into, Some(Program::FaultReturn));
    }

    /// The backend choice per probe: fentry where BTF describes the very
    /// function kallsyms has, else kprobe with the reason; `--backend
    /// fentry` refuses instead of falling back; `--backend kprobe` never
    /// asks BTF; tracepoints stay tracepoints.
    #[test]
    fn backend_choice_follows_btf() {
        let k = Kallsyms::parse(
            b"0 T handle_mm_fault\n0 t do_wp_page.isra.0\n0 T folio_add_new_anon_rmap\n",
            |_| true,
        );
        let dir = tempfile::tempdir().unwrap();
        let btf: BTreeSet<String> = ["handle_mm_fault", "do_wp_page"].map(String::from).into();
        let mut f = facts(&k, true, dir.path());
        f.btf_functions = Ok(&btf);
        let get = |f: &KernelFacts<'_>, p: Program| {
            resolve(f).into_iter().find(|r| r.spec.program == p).unwrap().resolution
        };
        assert_eq!(get(&f, Program::FaultEntry), attach("handle_mm_fault", Backend::Fentry));
        assert_eq!(get(&f, Program::FaultReturn), attach("handle_mm_fault", Backend::Fentry));
        let Resolution::Attach { backend: Backend::Kprobe, why, .. } = get(&f, Program::WpPage) else {
            panic!("a compiler-made copy falls back to kprobe")
        };
        assert!(why.contains("do_wp_page.isra.0 is a compiler-made copy of do_wp_page"), "{why}");
        let Resolution::Attach { backend: Backend::Kprobe, why, .. } = get(&f, Program::NewAnonRmap) else {
            panic!("a function without BTF falls back to kprobe")
        };
        assert!(why.contains("BTF has no function folio_add_new_anon_rmap"), "{why}");

        f.backend = BackendChoice::Fentry;
        let Resolution::Refused(why) = get(&f, Program::WpPage) else { panic!("forced fentry refuses") };
        assert!(why.contains("probe wp_page on do_wp_page.isra.0"), "{why}");
        assert!(matches!(get(&f, Program::FaultEntry), Resolution::Attach { backend: Backend::Fentry, .. }));
        // No kprobe PMU: fentry still attaches; auto's fallback cannot.
        f.kprobe_pmu = false;
        let Resolution::Attach { backend: Backend::Fentry, fallback: Err(why), .. } =
            get(&f, Program::FaultEntry)
        else {
            panic!()
        };
        assert!(why.contains("--backend fentry"), "{why}");
        f.backend = BackendChoice::Auto;
        assert!(
            matches!(get(&f, Program::NewAnonRmap), Resolution::Unavailable(r) if r.contains("CONFIG_KPROBES"))
        );
        let Resolution::Attach { backend: Backend::Fentry, fallback: Err(why), .. } =
            get(&f, Program::FaultEntry)
        else {
            panic!()
        };
        assert!(why.contains("CONFIG_KPROBES"), "{why}");
        f.kprobe_pmu = true;

        f.backend = BackendChoice::Kprobe;
        assert!(matches!(get(&f, Program::FaultEntry), Resolution::Attach { backend: Backend::Kprobe, .. }));
        // Without BTF at all, auto is kprobe everywhere, and says why.
        f.backend = BackendChoice::Auto;
        f.btf_functions = Err("no /sys/kernel/btf/vmlinux".into());
        let Resolution::Attach { backend: Backend::Kprobe, why, .. } = get(&f, Program::FaultEntry) else {
            panic!()
        };
        assert!(why.contains("no kernel BTF (no /sys/kernel/btf/vmlinux)"), "{why}");
        // The pure function itself, on tracepoint rows: tp_btf where BTF
        // has their prototype, else the classic tracepoint.
        let pf = PROBES.iter().find(|p| p.program == Program::PageFaultUser).unwrap();
        let sym = "exceptions:page_fault_user";
        let (b, why) = choose_backend(pf, sym, BackendChoice::Auto, &Ok(&btf)).unwrap();
        assert_eq!(b, Backend::Tracepoint);
        assert!(why.contains("BTF has no function btf_trace_page_fault_user"), "{why}");
        assert!(choose_backend(pf, sym, BackendChoice::Fentry, &Ok(&btf)).unwrap_err().contains("tp_btf"));
        let with_tp: BTreeSet<String> = ["btf_trace_page_fault_user".to_string()].into();
        assert_eq!(choose_backend(pf, sym, BackendChoice::Auto, &Ok(&with_tp)).unwrap().0, Backend::Fentry);
        assert_eq!(Backend::Fentry.attach_kind(pf.hook), "tp_btf");
        assert_eq!(
            choose_backend(pf, sym, BackendChoice::Kprobe, &Ok(&with_tp)).unwrap().0,
            Backend::Tracepoint
        );
    }

    /// A kernel function's row is a function's program (with its fentry
    /// twin); a tracepoint's row a tracepoint's.
    #[test]
    fn hooks_agree_with_the_catalogue() {
        for p in PROBES {
            let function = !matches!(p.hook, Hook::Tracepoint(..));
            assert_eq!(function, p.program.site() == Site::Function, "{}", p.program);
        }
        assert!(functions().contains("btf_trace_page_fault_user"));
        assert!(functions().contains("btf_trace_task_newtask"));
        assert!(functions().contains("handle_mm_fault"));
    }

    #[test]
    fn program_names_are_unique() {
        let mut programs: Vec<_> = PROBES.iter().map(|p| p.program).collect();
        programs.sort();
        programs.dedup();
        assert_eq!(programs.len(), PROBES.len());
    }
}
