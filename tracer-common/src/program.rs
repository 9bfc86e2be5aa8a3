//! The catalogue of faultscope's eBPF programs: one name per program, used
//! by the probe table, the class sources and the loader in user space.
//!
//! A program on a kernel function exists twice in the object: as a kprobe
//! (or kretprobe) and as its fentry (or fexit) twin, named `NAME_fe`, which
//! runs the same code from a BPF trampoline where the kernel's BTF
//! describes the function. Most tracepoints have a twin too, a BTF
//! tracepoint (`tp_btf`: the arguments as they are, no trace record built,
//! and a detach in milliseconds where a classic one waits for a grace
//! period). The probe table chooses one per probe.
//!
//! The eBPF side cannot use this enum (a program's name is its function's
//! name in tracer-ebpf); a unit test of the tracer checks that the built
//! object holds exactly these programs, twins included.

/// What a program is attached to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// A tracepoint: one program.
    Tracepoint,
    /// A kernel function: a kprobe program and its fentry twin.
    Function,
}

macro_rules! programs {
    ($($(#[$doc:meta])* $variant:ident = $name:literal, $site:ident;)*) => {
        /// One eBPF program of tracer-ebpf, named after the function it is.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Program {
            $($(#[$doc])* $variant,)*
        }

        impl Program {
            pub const COUNT: usize = [$(Program::$variant),*].len();

            pub const ALL: [Program; Program::COUNT] = [$(Program::$variant),*];

            /// The program's name in the eBPF object (its function's name;
            /// for a kernel function, the kprobe's). The kernel keeps only
            /// the first 15 bytes (BPF_OBJ_NAME_LEN).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Program::$variant => $name,)*
                }
            }

            /// What the program is attached to.
            pub const fn site(self) -> Site {
                match self {
                    $(Program::$variant => programs!(@site $site),)*
                }
            }

            /// The name of the fentry (fexit, tp_btf) twin of a program:
            /// `NAME_fe`.
            pub const fn fentry_name(self) -> Option<&'static str> {
                match self {
                    $(Program::$variant => programs!(@fe $site $name),)*
                }
            }
        }
    };
    (@fe Tracepoint $name:literal) => { None };
    (@fe BtfTracepoint $name:literal) => { Some(concat!($name, "_fe")) };
    (@fe Function $name:literal) => { Some(concat!($name, "_fe")) };
    (@site Tracepoint) => { Site::Tracepoint };
    (@site BtfTracepoint) => { Site::Tracepoint };
    (@site Function) => { Site::Function };
}

programs! {
    /// Tracepoint `task:task_newtask`.
    TaskNewtask = "task_newtask", BtfTracepoint;
    /// Tracepoint `sched:sched_process_exec`.
    ProcessExec = "process_exec", BtfTracepoint;
    /// Tracepoint `sched:sched_process_exit`.
    ProcessExit = "process_exit", BtfTracepoint;
    /// Tracepoint `exceptions:page_fault_user` (x86).
    PageFaultUser = "page_fault_user", BtfTracepoint;
    /// Tracepoint `exceptions:page_fault_kernel` (x86), on user addresses.
    PageFaultKernel = "page_fault_kernel", BtfTracepoint;
    /// `do_mem_abort` (arm64).
    MemAbort = "mem_abort", Function;
    /// `handle_mm_fault` entry.
    FaultEntry = "fault_entry", Function;
    /// `handle_mm_fault` return (kretprobe, or fexit).
    FaultReturn = "fault_return", Function;
    /// `do_wp_page`.
    WpPage = "wp_page", Function;
    /// `do_huge_pmd_wp_page`.
    HugePmdWp = "huge_pmd_wp", Function;
    /// `folio_add_new_anon_rmap` (or `page_add_new_anon_rmap`).
    NewAnonRmap = "new_anon_rmap", Function;
    /// `fault_dirty_shared_page`.
    DirtyShared = "dirty_shared", Function;
    /// `ptep_set_access_flags` (or an arm64 variant).
    AccessFlags = "access_flags", Function;
    /// `contpte_ptep_set_access_flags` (arm64).
    AccessFlagsCont = "access_flags_cont", Function;
    /// `huge_pmd_set_accessed`.
    HugeAccessed = "huge_accessed", Function;
    /// `__contpte_try_unfold` (arm64).
    ContpteTryUnfold = "contpte_try_unfold", Function;
    /// `contpte_convert` (arm64).
    ContpteConvert = "contpte_convert", Function;
    /// `__contpte_try_fold` (arm64).
    ContpteTryFold = "contpte_try_fold", Function;
    /// Tracepoint `cgroup:cgroup_mkdir`: names a container whose
    /// processes are gone before user space reads their place.
    CgroupMkdir = "cgroup_mkdir", BtfTracepoint;
    /// Tracepoint `sched:sched_switch`: a fault's state leaves its CPU's
    /// slot with the thread.
    SchedSwitch = "sched_switch", BtfTracepoint;
    /// `__split_huge_pmd`: inside a write fault, a PMD-mapped THP split
    /// so the write is handled on PTEs (a private file THP's COW).
    SplitHugePmd = "split_huge_pmd", Function;
    /// `do_huge_pmd_exec_cow` (the exec THP COW series, not mainline): a
    /// private executable file THP copied into an anonymous THP.
    HugePmdExecCow = "huge_pmd_exec_cow", Function;
}

impl Program {
    /// The program of that name (either twin of a kernel function's).
    pub fn from_name(name: &str) -> Option<Program> {
        Program::ALL.iter().copied().find(|p| p.name() == name || p.fentry_name() == Some(name))
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
            if let Some(fe) = a.fentry_name() {
                assert_eq!(Program::from_name(fe), Some(*a));
            }
            for b in &Program::ALL[i + 1..] {
                assert_ne!(a, b);
                assert_ne!(a.name(), b.name());
            }
        }
        for w in Program::ALL.windows(2) {
            assert!(w[0] < w[1]);
        }
        assert_eq!(Program::ALL.last().map(|p| *p as usize), Some(Program::COUNT - 1));
    }

    #[test]
    fn kernel_functions_and_tracepoints_have_a_twin() {
        assert_eq!(Program::WpPage.fentry_name(), Some("wp_page_fe"));
        assert_eq!(Program::TaskNewtask.fentry_name(), Some("task_newtask_fe"));
        assert_eq!(Program::PageFaultUser.fentry_name(), Some("page_fault_user_fe"));
        assert_eq!(Program::PageFaultUser.site(), Site::Tracepoint);
        for p in Program::ALL {
            assert!(p.fentry_name().is_some(), "{p}");
        }
    }
}
