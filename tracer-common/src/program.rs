//! The catalogue of faultscope's eBPF programs: one name per program, used
//! by the probe table, the class sources and the loader in user space.
//!
//! The eBPF side cannot use this enum (a program's name is its function's
//! name in tracer-ebpf); a unit test of the tracer checks that the built
//! object holds exactly these programs.

/// One eBPF program of tracer-ebpf, named after the function it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Program {
    /// Tracepoint `task:task_newtask`.
    TaskNewtask,
    /// Tracepoint `sched:sched_process_exec`.
    ProcessExec,
    /// Tracepoint `sched:sched_process_exit`.
    ProcessExit,
    /// Tracepoint `exceptions:page_fault_user` (x86).
    PageFaultUser,
    /// Kprobe `do_mem_abort` (arm64).
    MemAbort,
    /// Kprobe `handle_mm_fault`.
    FaultEntry,
    /// Kretprobe `handle_mm_fault`.
    FaultReturn,
    /// Kprobe `do_wp_page`.
    WpPage,
    /// Kprobe `do_huge_pmd_wp_page`.
    HugePmdWp,
    /// Kprobe `folio_add_new_anon_rmap` (or `page_add_new_anon_rmap`).
    NewAnonRmap,
    /// Kprobe `fault_dirty_shared_page`.
    DirtyShared,
    /// Kprobe `ptep_set_access_flags` (or an arm64 variant).
    AccessFlags,
    /// Kprobe `contpte_ptep_set_access_flags` (arm64).
    AccessFlagsCont,
    /// Kprobe `huge_pmd_set_accessed`.
    HugeAccessed,
    /// Kprobe `__contpte_try_unfold` (arm64).
    ContpteTryUnfold,
    /// Kprobe `contpte_convert` (arm64).
    ContpteConvert,
    /// Kprobe `__contpte_try_fold` (arm64).
    ContpteTryFold,
}

impl Program {
    pub const COUNT: usize = 17;

    pub const ALL: [Program; Program::COUNT] = [
        Program::TaskNewtask,
        Program::ProcessExec,
        Program::ProcessExit,
        Program::PageFaultUser,
        Program::MemAbort,
        Program::FaultEntry,
        Program::FaultReturn,
        Program::WpPage,
        Program::HugePmdWp,
        Program::NewAnonRmap,
        Program::DirtyShared,
        Program::AccessFlags,
        Program::AccessFlagsCont,
        Program::HugeAccessed,
        Program::ContpteTryUnfold,
        Program::ContpteConvert,
        Program::ContpteTryFold,
    ];

    /// The program's name in the eBPF object (its function's name). The
    /// kernel keeps only the first 15 bytes (BPF_OBJ_NAME_LEN).
    pub const fn name(self) -> &'static str {
        match self {
            Program::TaskNewtask => "task_newtask",
            Program::ProcessExec => "process_exec",
            Program::ProcessExit => "process_exit",
            Program::PageFaultUser => "page_fault_user",
            Program::MemAbort => "mem_abort",
            Program::FaultEntry => "fault_entry",
            Program::FaultReturn => "fault_return",
            Program::WpPage => "wp_page",
            Program::HugePmdWp => "huge_pmd_wp",
            Program::NewAnonRmap => "new_anon_rmap",
            Program::DirtyShared => "dirty_shared",
            Program::AccessFlags => "access_flags",
            Program::AccessFlagsCont => "access_flags_cont",
            Program::HugeAccessed => "huge_accessed",
            Program::ContpteTryUnfold => "contpte_try_unfold",
            Program::ContpteConvert => "contpte_convert",
            Program::ContpteTryFold => "contpte_try_fold",
        }
    }

    /// The program of that name.
    pub fn from_name(name: &str) -> Option<Program> {
        Program::ALL.iter().copied().find(|p| p.name() == name)
    }
}

impl core::fmt::Display for Program {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.pad(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_program_once_with_a_unique_name() {
        for (i, a) in Program::ALL.iter().enumerate() {
            assert_eq!(Program::from_name(a.name()), Some(*a));
            for b in &Program::ALL[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(a.name(), b.name());
            }
        }
        // `ALL` is in declaration order: a variant missing from it would
        // shift the ones after it.
        for w in Program::ALL.windows(2) {
            assert!(w[0] < w[1]);
        }
        assert_eq!(Program::ALL.last().map(|p| *p as usize), Some(Program::COUNT - 1));
    }
}
