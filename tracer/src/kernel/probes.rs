//! The probe table: every probe faultscope may attach, with its kernel
//! function (and fallbacks), what it measures, and whether a run can go on
//! without it. At start-up the table is resolved against the running kernel;
//! the result says, for every reported class, whether it is measured here and
//! if not, why.

use std::path::Path;

use faultscope_common::Program;

use crate::kernel::{self, Kallsyms};

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
}

/// Every probe. The order is the order of attachment: the per-thread state is
/// created by the exception probes and `handle_mm_fault` entry, so marks and
/// returns attach after them.
pub const PROBES: &[ProbeSpec] = &[
    ProbeSpec {
        program: Program::TaskNewtask,
        hook: Hook::Tracepoint("task", "task_newtask"),
        arch: Arch::Any,
        min_kernel: "3.5",
        required: true,
        measures: "forks of traced processes (clone_flags tell processes from threads); follows children",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::ProcessExec,
        hook: Hook::Tracepoint("sched", "sched_process_exec"),
        arch: Arch::Any,
        min_kernel: "3.4",
        required: true,
        measures: "exec of traced processes (a started command counts from its exec)",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::ProcessExit,
        hook: Hook::Tracepoint("sched", "sched_process_exit"),
        arch: Arch::Any,
        min_kernel: "2.6.32",
        required: true,
        measures: "exit of traced processes (ends the run when all are gone)",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::PageFaultUser,
        hook: Hook::Tracepoint("exceptions", "page_fault_user"),
        arch: Arch::X86_64,
        min_kernel: "3.13",
        required: false,
        measures: "user faults by error code; PROT bit for the spurious rule; the tracepoint-only mode",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::MemAbort,
        hook: Hook::Kprobe(&["do_mem_abort"]),
        arch: Arch::Aarch64,
        min_kernel: "3.7",
        required: false,
        measures: "ESR of each abort: permission fault = present page (spurious rule)",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::FaultEntry,
        hook: Hook::Kprobe(&["handle_mm_fault"]),
        arch: Arch::Any,
        min_kernel: "4.9",
        required: false,
        measures: "start of each user fault (regs != NULL, FAULT_FLAG_USER)",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::FaultReturn,
        hook: Hook::Kretprobe(&["handle_mm_fault"]),
        arch: Arch::Any,
        min_kernel: "4.9",
        required: false,
        measures: "end of each user fault: latency, vm_fault_t, classification",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::WpPage,
        hook: Hook::Kprobe(&["do_wp_page"]),
        arch: Arch::Any,
        min_kernel: "2.6",
        required: false,
        measures: "write-protect faults on PTEs",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::HugePmdWp,
        hook: Hook::Kprobe(&["do_huge_pmd_wp_page"]),
        arch: Arch::Any,
        min_kernel: "2.6.38",
        required: false,
        measures: "write-protect faults on PMD-mapped THPs",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::NewAnonRmap,
        hook: Hook::Kprobe(&["folio_add_new_anon_rmap", "page_add_new_anon_rmap"]),
        arch: Arch::Any,
        min_kernel: "6.3 (folio_*), earlier page_*",
        required: false,
        measures: "a new anon folio mapped: inside do_wp_page, a COW copy",
        redundant_with: None,
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
    },
    ProbeSpec {
        program: Program::AccessFlagsCont,
        hook: Hook::Kprobe(&["contpte_ptep_set_access_flags"]),
        arch: Arch::Aarch64,
        min_kernel: "6.9",
        required: false,
        measures: "the same for contpte blocks",
        redundant_with: Some(Program::PageFaultUser),
    },
    ProbeSpec {
        program: Program::HugeAccessed,
        hook: Hook::Kprobe(&["huge_pmd_set_accessed"]),
        arch: Arch::Any,
        min_kernel: "3.8",
        required: false,
        measures: "the same for PMD-mapped THPs",
        redundant_with: Some(Program::PageFaultUser),
    },
    ProbeSpec {
        program: Program::ContpteTryUnfold,
        hook: Hook::Kprobe(&["__contpte_try_unfold"]),
        arch: Arch::Aarch64,
        min_kernel: "6.9",
        required: false,
        measures: "__contpte_try_unfold calls (6.12's unfold path)",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::ContpteConvert,
        hook: Hook::Kprobe(&["contpte_convert"]),
        arch: Arch::Aarch64,
        min_kernel: "6.9",
        required: false,
        measures: "contpte blocks rewritten: folded (PTE_CONT in the new PTE) or unfolded",
        redundant_with: None,
    },
    ProbeSpec {
        program: Program::ContpteTryFold,
        hook: Hook::Kprobe(&["__contpte_try_fold"]),
        arch: Arch::Aarch64,
        min_kernel: "6.9",
        required: false,
        measures: "contpte fold attempts",
        redundant_with: None,
    },
];

/// What resolution found for one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Attach to this kernel symbol (or tracepoint).
    Attach(String),
    /// Not attachable here, and why.
    Unavailable(String),
}

pub struct Resolved {
    pub spec: &'static ProbeSpec,
    pub resolution: Resolution,
}

/// Facts about the kernel that resolution depends on, gathered once so that
/// resolution itself is a pure function (and testable).
pub struct KernelFacts<'a> {
    pub tracefs: &'a Path,
    pub kallsyms: Option<&'a Kallsyms>,
    pub kprobe_pmu: bool,
    pub blacklist: &'a [String],
    pub lockdown: Option<String>,
}

/// Resolves the table against the running kernel (reads kallsyms, the
/// kprobe blacklist, the PMU and lockdown once).
pub fn resolve_here(tracefs: &Path) -> Vec<Resolved> {
    let kallsyms = Kallsyms::load().ok();
    let blacklist = kernel::kprobe_blacklist();
    resolve(&KernelFacts {
        tracefs,
        kallsyms: kallsyms.as_ref(),
        kprobe_pmu: kernel::has_kprobe_pmu(),
        blacklist: &blacklist,
        lockdown: kernel::lockdown(),
    })
}

pub fn resolve(facts: &KernelFacts<'_>) -> Vec<Resolved> {
    PROBES.iter().map(|spec| Resolved { spec, resolution: resolve_one(spec, facts) }).collect()
}

fn resolve_one(spec: &ProbeSpec, facts: &KernelFacts<'_>) -> Resolution {
    if !spec.arch.here() {
        return Resolution::Unavailable(format!("{} only", spec.arch.name()));
    }
    match spec.hook {
        Hook::Tracepoint(cat, name) => {
            if kernel::tracepoint_exists(facts.tracefs, cat, name) {
                Resolution::Attach(format!("{cat}:{name}"))
            } else {
                Resolution::Unavailable(format!("no tracepoint {cat}:{name} in this kernel"))
            }
        }
        Hook::Kprobe(funcs) | Hook::Kretprobe(funcs) => {
            if !facts.kprobe_pmu {
                return Resolution::Unavailable("no kprobe PMU (kernel built without CONFIG_KPROBES)".into());
            }
            if facts.lockdown.as_deref() == Some("confidentiality") {
                return Resolution::Unavailable(
                    "kernel lockdown=confidentiality forbids kprobe programs".into(),
                );
            }
            let Some(k) = facts.kallsyms else {
                return Resolution::Unavailable("/proc/kallsyms is not readable".into());
            };
            for f in funcs {
                if let Some(sym) = k.resolve(f) {
                    if facts.blacklist.iter().any(|b| b == &sym) {
                        return Resolution::Unavailable(format!("{sym} is on the kprobe blacklist"));
                    }
                    return Resolution::Attach(sym);
                }
            }
            Resolution::Unavailable(format!(
                "no symbol {} in /proc/kallsyms (inlined or absent in this kernel)",
                funcs.join(" or ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(k: &'a Kallsyms, pmu: bool, tracefs: &'a Path) -> KernelFacts<'a> {
        KernelFacts { tracefs, kallsyms: Some(k), kprobe_pmu: pmu, blacklist: &[], lockdown: None }
    }

    #[test]
    fn fallback_symbol_is_used() {
        let k = Kallsyms::parse("0 T handle_mm_fault\n0 t do_wp_page.isra.0\n0 T page_add_new_anon_rmap\n");
        let dir = tempfile::tempdir().unwrap();
        let r = resolve(&facts(&k, true, dir.path()));
        let get = |p: Program| r.iter().find(|r| r.spec.program == p).unwrap().resolution.clone();
        assert_eq!(get(Program::FaultEntry), Resolution::Attach("handle_mm_fault".into()));
        assert_eq!(get(Program::WpPage), Resolution::Attach("do_wp_page.isra.0".into()));
        assert_eq!(get(Program::NewAnonRmap), Resolution::Attach("page_add_new_anon_rmap".into()));
        assert!(matches!(get(Program::HugePmdWp), Resolution::Unavailable(r) if r.contains("no symbol")));
        assert!(
            matches!(get(Program::TaskNewtask), Resolution::Unavailable(r) if r.contains("no tracepoint"))
        );
    }

    #[test]
    fn no_pmu_means_no_kprobes() {
        let k = Kallsyms::parse("0 T handle_mm_fault\n");
        let dir = tempfile::tempdir().unwrap();
        let r = resolve(&facts(&k, false, dir.path()));
        let e = r.iter().find(|r| r.spec.program == Program::FaultEntry).unwrap();
        assert!(matches!(&e.resolution, Resolution::Unavailable(r) if r.contains("CONFIG_KPROBES")));
    }

    #[test]
    fn blacklisted_is_refused() {
        let k = Kallsyms::parse("0 T handle_mm_fault\n");
        let dir = tempfile::tempdir().unwrap();
        let bl = vec!["handle_mm_fault".to_string()];
        let mut f = facts(&k, true, dir.path());
        f.blacklist = &bl;
        let r = resolve(&f);
        let e = r.iter().find(|r| r.spec.program == Program::FaultEntry).unwrap();
        assert!(matches!(&e.resolution, Resolution::Unavailable(r) if r.contains("blacklist")));
    }

    #[test]
    fn program_names_are_unique() {
        let mut programs: Vec<_> = PROBES.iter().map(|p| p.program).collect();
        programs.sort();
        programs.dedup();
        assert_eq!(programs.len(), PROBES.len());
    }
}
