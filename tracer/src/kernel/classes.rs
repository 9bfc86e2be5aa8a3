//! The classes a report shows, and where each comes from on this kernel:
//! kprobes where they attach, the x86 tracepoint's error code otherwise, or
//! "not measurable here" with the reason. Never a silent 0.

use std::{collections::BTreeMap, fmt};

use faultscope_common::{
    catalogue,
    class::ClassSet,
    KernelClass,
    Program::{self, *},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use Need::{Any, One};

catalogue! {
    /// A class as the report shows it: the one catalogue that the report's keys,
    /// the text tables, diff, verify, findings and the tests derive from. The
    /// JSON key is the snake_case name; the order is the report's order.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum ReportClass: u8 {
        Faults = 0,
        WriteFaults = 1,
        WpFaults = 2,
        Reuse = 3,
        Copy = 4,
        WpShared = 5,
        Spurious = 6,
        // The spurious faults no other thread of the process was in a
        // write-protect fault on the page for (a stale TLB entry), and those
        // another thread was (a race).
        SpuriousStaleTlb = 7,
        SpuriousRace = 8,
        HugePmdWp = 9,
        ContpteUnfold = 10,
        ContpteFold = 11,
        ContpteConvert = 12,
        ContpteTryUnfold = 13,
        ContpteFoldAttempt = 14,
        // A fault on a page not present (the error code without PROT):
        // first touches, and swap-ins and NUMA-hinting faults too.
        // `first_touch` in older reports, read as this (`FORMER_NAMES`).
        NotPresent = 15,
        Major = 16,
        Retry = 17,
        Error = 18,
    }
}

/// Names classes had in older reports, still read: on a command line, and
/// in a report file (`report::file::migrate`).
pub const FORMER_NAMES: [(&str, ReportClass); 1] = [("first_touch", ReportClass::NotPresent)];

impl ReportClass {
    pub fn spec(self) -> &'static ClassSpec {
        &CLASSES[self as usize]
    }

    /// Whether any kernel of `arch` (`std::env::consts::ARCH`: a report's
    /// `arch`) can measure the class: one of its sources needs only
    /// programs that exist there. The contpte classes are arm64's.
    pub fn exists_on(self, arch: &str) -> bool {
        let on = |p: Program| super::probes::PROBES.iter().any(|s| s.program == p && s.arch.is(arch));
        self.spec().sources.iter().any(|src| {
            src.needs.iter().all(|n| match n {
                One(p) => on(*p),
                Any(ps) => ps.iter().any(|p| on(*p)),
            })
        })
    }

    /// The report's name of the class (its JSON key).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    pub fn from_name(name: &str) -> Option<ReportClass> {
        let former = FORMER_NAMES.iter().find(|(n, _)| *n == name).map(|(_, c)| *c);
        former.or_else(|| ReportClass::ALL.iter().copied().find(|m| m.name() == name))
    }

    /// A class by its name, or an error that lists the names (a command
    /// line's value parser).
    pub fn parse(name: &str) -> Result<ReportClass, String> {
        ReportClass::from_name(name).ok_or_else(|| {
            let known: Vec<&str> = ReportClass::ALL.iter().map(|m| m.name()).collect();
            format!("{name:?} is not a class (known: {})", known.join(", "))
        })
    }

    /// The columns of the compact tables (live view, bench summary).
    pub fn summary() -> impl Iterator<Item = ReportClass> {
        ReportClass::ALL.into_iter().filter(|m| m.spec().columns.summary)
    }

    /// The classes diff compares.
    pub fn compared() -> impl Iterator<Item = ReportClass> {
        ReportClass::ALL.into_iter().filter(|m| m.spec().columns.diff)
    }
}

impl std::fmt::Display for ReportClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the tables show a class besides the full report.
#[derive(Clone, Copy, Debug)]
pub struct Columns {
    /// The compact tables: live view and bench summary.
    pub summary: bool,
    /// `faultscope diff`.
    pub diff: bool,
}

const MAIN: Columns = Columns { summary: true, diff: true };
const DIFF: Columns = Columns { summary: false, diff: true };
const FULL_ONLY: Columns = Columns { summary: false, diff: false };

/// Where a reported class can be measured from, in order of preference.
pub struct ClassSpec {
    pub metric: ReportClass,
    /// JSON key (schema faultscope/1); equals the serde name of `metric`.
    pub name: &'static str,
    pub columns: Columns,
    pub sources: &'static [Source],
}

pub struct Source {
    pub class: KernelClass,
    /// What must all be attached.
    pub needs: &'static [Need],
    /// Latency comes with it (timed by the handle_mm_fault kretprobe).
    pub timed: bool,
    pub describe: &'static str,
}

/// One need of a source: a program, or any one of several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    One(Program),
    Any(&'static [Program]),
}

impl Need {
    pub fn programs(&self) -> &[Program] {
        match self {
            One(p) => std::slice::from_ref(p),
            Any(ps) => ps,
        }
    }
}

/// `a` or, for a choice, `a|b`.
impl fmt::Display for Need {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.programs().iter().map(|p| p.name()).collect();
        f.write_str(&names.join("|"))
    }
}

const FAULT: [Need; 2] = [One(FaultEntry), One(FaultReturn)];
/// The spurious rule's programs; its split needs no other (`do_wp_page`
/// writes the page buckets, the return reads them).
const SPURIOUS: [Need; 6] = [
    One(FaultEntry),
    One(FaultReturn),
    One(WpPage),
    One(HugePmdWp),
    One(NewAnonRmap),
    Any(&[PageFaultUser, MemAbort, AccessFlags]),
];

pub const CLASSES: &[ClassSpec] = &[
    ClassSpec {
        metric: ReportClass::Faults,
        name: "faults",
        columns: MAIN,
        sources: &[
            Source {
                class: KernelClass::Faults,
                needs: &FAULT,
                timed: true,
                describe: "kprobe handle_mm_fault (user faults, each call)",
            },
            Source {
                class: KernelClass::TpFaults,
                needs: &[One(PageFaultUser)],
                timed: false,
                describe: "tracepoint exceptions:page_fault_user",
            },
        ],
    },
    ClassSpec {
        metric: ReportClass::WriteFaults,
        name: "write_faults",
        columns: DIFF,
        sources: &[
            Source {
                class: KernelClass::WriteFaults,
                needs: &FAULT,
                timed: true,
                describe: "kprobe handle_mm_fault, FAULT_FLAG_WRITE",
            },
            Source {
                class: KernelClass::TpWrite,
                needs: &[One(PageFaultUser)],
                timed: false,
                describe: "tracepoint exceptions:page_fault_user, error_code WRITE",
            },
        ],
    },
    ClassSpec {
        metric: ReportClass::WpFaults,
        name: "wp_faults",
        columns: MAIN,
        sources: &[
            Source {
                class: KernelClass::WpFaults,
                needs: &[One(FaultEntry), One(FaultReturn), One(WpPage)],
                timed: true,
                describe: "kprobe do_wp_page within a user fault",
            },
            Source {
                class: KernelClass::TpPresentWrite,
                needs: &[One(PageFaultUser)],
                timed: false,
                describe:
                    "tracepoint exceptions:page_fault_user, error_code PROT|WRITE (includes spurious faults)",
            },
        ],
    },
    ClassSpec {
        metric: ReportClass::Reuse,
        name: "reuse",
        columns: MAIN,
        sources: &[
            Source {
                class: KernelClass::Reuse,
                needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(NewAnonRmap), One(DirtyShared)],
                timed: true,
                describe: "do_wp_page without folio_add_new_anon_rmap or fault_dirty_shared_page",
            },
            // Without fault_dirty_shared_page a shared mapping's write-notify
            // fault looks like a reuse; the source says so.
            Source {
                class: KernelClass::Reuse,
                needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(NewAnonRmap)],
                timed: true,
                describe: "do_wp_page without folio_add_new_anon_rmap (includes write-notify faults of shared mappings: fault_dirty_shared_page is not probed)",
            },
        ],
    },
    ClassSpec {
        metric: ReportClass::Copy,
        name: "copy",
        columns: MAIN,
        sources: &[Source {
            class: KernelClass::Copy,
            needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(NewAnonRmap)],
            timed: true,
            describe: "do_wp_page with folio_add_new_anon_rmap",
        }],
    },
    ClassSpec {
        metric: ReportClass::WpShared,
        name: "wp_shared",
        columns: DIFF,
        sources: &[Source {
            class: KernelClass::WpShared,
            needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(DirtyShared)],
            timed: true,
            describe: "do_wp_page with fault_dirty_shared_page: write-notify of a shared mapping, no COW",
        }],
    },
    ClassSpec {
        metric: ReportClass::Spurious,
        name: "spurious",
        columns: MAIN,
        sources: &[Source {
            class: KernelClass::Spurious,
            needs: &SPURIOUS,
            timed: true,
            describe: "write fault on a present page (x86 error code PROT, else the present-entry path) that reached no write-protect or new-folio path",
        }],
    },
    ClassSpec {
        metric: ReportClass::SpuriousStaleTlb,
        name: "spurious_stale_tlb",
        columns: DIFF,
        sources: &[Source {
            class: KernelClass::SpuriousStaleTlb,
            needs: &SPURIOUS,
            timed: true,
            describe: "spurious, while no other thread of the process was in a write-protect fault on the page (do_wp_page to return): a stale read-only TLB entry",
        }],
    },
    ClassSpec {
        metric: ReportClass::SpuriousRace,
        name: "spurious_race",
        columns: DIFF,
        sources: &[Source {
            class: KernelClass::SpuriousRace,
            needs: &SPURIOUS,
            timed: true,
            describe: "spurious, while another thread of the process was in a write-protect fault on the page (do_wp_page to return): it lost a race",
        }],
    },
    ClassSpec {
        metric: ReportClass::HugePmdWp,
        name: "huge_pmd_wp",
        columns: MAIN,
        sources: &[Source {
            class: KernelClass::HugePmdWp,
            needs: &[One(FaultEntry), One(FaultReturn), One(HugePmdWp)],
            timed: true,
            describe: "kprobe do_huge_pmd_wp_page within a user fault (and, where they attach, __split_huge_pmd within a write fault: a private file THP; do_huge_pmd_exec_cow)",
        }],
    },
    ClassSpec {
        metric: ReportClass::ContpteUnfold,
        name: "contpte_unfold",
        columns: MAIN,
        sources: &[Source {
            class: KernelClass::ContpteUnfold,
            needs: &[One(ContpteConvert)],
            timed: false,
            describe: "kprobe contpte_convert, new PTE without PTE_CONT",
        }],
    },
    ClassSpec {
        metric: ReportClass::ContpteFold,
        name: "contpte_fold",
        columns: DIFF,
        sources: &[Source {
            class: KernelClass::ContpteFold,
            needs: &[One(ContpteConvert)],
            timed: false,
            describe: "kprobe contpte_convert, new PTE with PTE_CONT",
        }],
    },
    ClassSpec {
        metric: ReportClass::ContpteConvert,
        name: "contpte_convert",
        columns: DIFF,
        sources: &[Source {
            class: KernelClass::ContpteConvert,
            needs: &[One(ContpteConvert)],
            timed: false,
            describe: "kprobe contpte_convert",
        }],
    },
    ClassSpec {
        metric: ReportClass::ContpteTryUnfold,
        name: "contpte_try_unfold",
        columns: FULL_ONLY,
        sources: &[Source {
            class: KernelClass::ContpteTryUnfold,
            needs: &[One(ContpteTryUnfold)],
            timed: false,
            describe: "kprobe __contpte_try_unfold",
        }],
    },
    ClassSpec {
        metric: ReportClass::ContpteFoldAttempt,
        name: "contpte_fold_attempt",
        columns: FULL_ONLY,
        sources: &[Source {
            class: KernelClass::ContpteFoldAttempt,
            needs: &[One(ContpteTryFold)],
            timed: false,
            describe: "kprobe __contpte_try_fold",
        }],
    },
    ClassSpec {
        metric: ReportClass::NotPresent,
        name: "not_present",
        columns: DIFF,
        sources: &[Source {
            class: KernelClass::TpNotPresent,
            needs: &[One(PageFaultUser)],
            timed: false,
            describe: "tracepoint exceptions:page_fault_user, error_code without PROT",
        }],
    },
    ClassSpec {
        metric: ReportClass::Major,
        name: "major",
        columns: FULL_ONLY,
        sources: &[Source {
            class: KernelClass::Major,
            needs: &FAULT,
            timed: true,
            describe: "handle_mm_fault returned VM_FAULT_MAJOR",
        }],
    },
    ClassSpec {
        metric: ReportClass::Retry,
        name: "retry",
        columns: FULL_ONLY,
        sources: &[Source {
            class: KernelClass::Retry,
            needs: &FAULT,
            timed: true,
            describe: "handle_mm_fault returned VM_FAULT_RETRY",
        }],
    },
    ClassSpec {
        metric: ReportClass::Error,
        name: "error",
        columns: FULL_ONLY,
        sources: &[Source {
            class: KernelClass::Error,
            needs: &FAULT,
            timed: true,
            describe: "handle_mm_fault returned VM_FAULT_ERROR",
        }],
    },
];

/// The partition of the faults by what the kernel did with each, for sums
/// that mean something (the classes nest: a reuse is a wp fault, a write
/// fault and a fault). A fault is a set with `Faults` (fault path probed)
/// or `TpFaults` (tracepoint mode); its kind is the first rule its set
/// matches, so each fault is of exactly one kind and the kinds add up to
/// the faults.
pub const FAULT_KINDS: &[(&str, KernelClass)] = &[
    ("copy", KernelClass::Copy),
    ("reuse", KernelClass::Reuse),
    ("wp_shared", KernelClass::WpShared),
    ("huge_pmd_wp", KernelClass::HugePmdWp),
    ("spurious", KernelClass::Spurious),
    // A write-protect fault none of the above took (a retry, an error, or
    // a class not measurable here).
    ("wp_other", KernelClass::WpFaults),
    // Tracepoint mode: a write to a present page (wp or spurious).
    ("present_write", KernelClass::TpPresentWrite),
    // A write that took no write-protect path: a page not present (first
    // touch, swap-in), or spurious where that is not measurable.
    ("other_write", KernelClass::WriteFaults),
    ("other_write", KernelClass::TpWrite),
    ("read", KernelClass::Faults),
    ("read", KernelClass::TpFaults),
];

/// The kind of a fault of class set `set`, or None when the set is not a
/// fault (contpte events, kprobe mode's separate error-code sets).
pub fn fault_kind(set: ClassSet) -> Option<&'static str> {
    if !set.is_fault() {
        return None;
    }
    FAULT_KINDS.iter().find(|(_, c)| set.has(*c)).map(|(k, _)| *k)
}

/// The kinds that can occur given what is measured (serve declares them
/// at 0), in the table's order, each once.
pub fn fault_kinds_here(avail: &[(ReportClass, Availability)]) -> Vec<&'static str> {
    let measured = |c: KernelClass| {
        avail.iter().any(|(_, a)| matches!(a, Availability::Measured { class, .. } if *class == c))
    };
    let mut out: Vec<&'static str> = Vec::new();
    for (k, c) in FAULT_KINDS {
        if measured(*c) && !out.contains(k) {
            out.push(k);
        }
    }
    out
}

/// What came of a write-protect fault on a PMD-mapped THP
/// (`do_huge_pmd_wp_page`; a private file THP's `__split_huge_pmd` or
/// `do_huge_pmd_exec_cow`), told from the rest of its fault's set. The
/// kernel reuses the PMD (an exclusive THP: made writable in place), or
/// copies the THP into a new one (a new anon folio in the same fault, no
/// PTE fault: a `copy`), or
/// splits the PMD and returns `VM_FAULT_FALLBACK`, after which the same
/// `handle_mm_fault` takes the page's write-protect fault on the PTEs
/// (`do_wp_page`: counted as the reuse or copy it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PmdOutcome {
    Reused,
    Copied,
    Split,
    /// Retried or failed: no outcome yet.
    Other,
}

impl PmdOutcome {
    /// The outcome of a fault of set `set`, if it reached
    /// a PMD write-protect path. A copy is its new anon folio with no PTE
    /// write-protect fault (the state machine's `copy`) of the THP's size.
    pub fn of(set: ClassSet) -> Option<PmdOutcome> {
        if !set.is_fault() || !set.has(KernelClass::HugePmdWp) {
            return None;
        }
        Some(if set.has(KernelClass::Retry) || set.has(KernelClass::Error) {
            PmdOutcome::Other
        } else if set.has(KernelClass::WpFaults) {
            PmdOutcome::Split
        } else if set.has(KernelClass::Copy) {
            // A THP-sized new folio is the THP copied; a smaller one is a
            // private file THP's split, after which the page written was
            // copied from the file into a new page (`do_cow_fault`).
            let pmd_order = (crate::units::PMD_SIZE / crate::units::PAGE).trailing_zeros();
            match set.folio_order() {
                Some(o) if o >= pmd_order => PmdOutcome::Copied,
                _ => PmdOutcome::Split,
            }
        } else {
            PmdOutcome::Reused
        })
    }
}

/// A short, bounded code for a reason `availability` gave: the need that
/// is missing (`needs:wp_page`), for a metric label; the prose goes to
/// the log.
pub fn reason_code(why: &str) -> String {
    let code = why.strip_prefix("needs ").and_then(|r| r.split(':').next()).unwrap_or("unavailable");
    let code: String =
        code.chars().filter(|c| c.is_ascii_alphanumeric() || "_|".contains(*c)).take(64).collect();
    format!("needs:{code}")
}

/// How a class is measured in this run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    Measured { class: KernelClass, timed: bool, source: &'static str },
    NotMeasurable(String),
}

/// Decides each class's source given which programs are attached and, for
/// those that are not, why.
pub fn availability(
    attached: impl Fn(Program) -> bool,
    reason: impl Fn(Program) -> Option<String>,
) -> Vec<(ReportClass, Availability)> {
    CLASSES
        .iter()
        .map(|spec| {
            let mut why = None;
            for src in spec.sources {
                let missing = src.needs.iter().find(|need| !need.programs().iter().any(|p| attached(*p)));
                match missing {
                    None => {
                        return (
                            spec.metric,
                            Availability::Measured {
                                class: src.class,
                                timed: src.timed,
                                source: src.describe,
                            },
                        )
                    }
                    Some(need) => {
                        if why.is_none() {
                            let r = need
                                .programs()
                                .iter()
                                .filter_map(|p| reason(*p))
                                .collect::<Vec<_>>()
                                .join("; ");
                            why = Some(format!("needs {need}: {r}"));
                        }
                    }
                }
            }
            (spec.metric, Availability::NotMeasurable(why.unwrap_or_default()))
        })
        .collect()
}

/// The `ClassSet` bits of the error-code classes the report takes from the
/// tracepoint: the kernel side counts only these.
pub fn error_code_classes(avail: &[(ReportClass, Availability)]) -> u32 {
    avail
        .iter()
        .filter_map(|(_, a)| match a {
            Availability::Measured { class, .. } if KernelClass::ERROR_CODE.contains(class) => {
                Some(class.bit())
            }
            _ => None,
        })
        .fold(0, |m, b| m | b)
}

/// What is measured here, and then each reason for what is not, once,
/// with the classes it costs (classes of another architecture left out).
pub fn measured_line(avail: &[(ReportClass, Availability)]) -> String {
    let measured: Vec<&str> = avail
        .iter()
        .filter(|(_, a)| matches!(a, Availability::Measured { .. }))
        .map(|(m, _)| m.name())
        .collect();
    let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (m, a) in avail {
        if let Availability::NotMeasurable(r) = a {
            if m.exists_on(std::env::consts::ARCH) {
                reasons.entry(r.as_str()).or_default().push(m.name());
            }
        }
    }
    let mut s = format!("faultscope: measuring {}", measured.join(", "));
    for (r, ns) in &reasons {
        s.push_str(&format!("\nfaultscope: not measurable here: {} ({r})", ns.join(", ")));
    }
    s
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_pmd_faults_outcome_from_the_rest_of_its_set() {
        use faultscope_common::class::ClassSet;
        let pmd = ClassSet::default().with(KernelClass::Faults).with(KernelClass::HugePmdWp);
        assert_eq!(PmdOutcome::of(pmd), Some(PmdOutcome::Reused));
        // The PTE fault after the split is the same handle_mm_fault.
        let split = pmd.with(KernelClass::WpFaults).with(KernelClass::Copy).with_folio(1);
        assert_eq!(PmdOutcome::of(split), Some(PmdOutcome::Split));
        assert_eq!(fault_kind(split), Some("copy"));
        // The THP copied whole: the state machine made it a copy.
        let thp_copy = pmd.with(KernelClass::Copy).with_folio(10);
        assert_eq!(PmdOutcome::of(thp_copy), Some(PmdOutcome::Copied));
        assert_eq!(fault_kind(thp_copy), Some("copy"));
        // A private file THP split, then its page copied from the file.
        let file_split = pmd.with(KernelClass::Copy).with_folio(1);
        assert_eq!(PmdOutcome::of(file_split), Some(PmdOutcome::Split));
        assert_eq!(fault_kind(file_split), Some("copy"));
        assert_eq!(PmdOutcome::of(pmd.with(KernelClass::Retry)), Some(PmdOutcome::Other));
        assert_eq!(PmdOutcome::of(ClassSet::default().with(KernelClass::Faults)), None);
    }
    use super::*;

    #[test]
    fn measured_line_groups_reasons() {
        let avail = vec![
            (
                ReportClass::Faults,
                Availability::Measured { class: KernelClass::TpFaults, timed: false, source: "t" },
            ),
            (ReportClass::Reuse, Availability::NotMeasurable("no PMU".into())),
            (ReportClass::Copy, Availability::NotMeasurable("no PMU".into())),
        ];
        assert_eq!(
            measured_line(&avail),
            "faultscope: measuring faults\nfaultscope: not measurable here: reuse, copy (no PMU)"
        );
    }

    #[test]
    fn every_fault_is_of_exactly_one_kind() {
        // Every set the fault path can make (its classes, in any
        // combination), and the tracepoint's.
        let kprobe: Vec<KernelClass> = KernelClass::FAULT_RETURN.to_vec();
        let tp: Vec<KernelClass> = KernelClass::ERROR_CODE.to_vec();
        for (base, classes) in [(KernelClass::Faults, kprobe), (KernelClass::TpFaults, tp)] {
            for bits in 0u32..(1 << classes.len()) {
                let mut set = ClassSet::default().with(base);
                for (i, c) in classes.iter().enumerate() {
                    if bits & (1 << i) != 0 {
                        set = set.with(*c);
                    }
                }
                let kind = fault_kind(set).expect("a fault has a kind");
                let rule = FAULT_KINDS.iter().position(|(k, c)| *k == kind && set.has(*c)).unwrap();
                assert!(FAULT_KINDS[..rule].iter().all(|(_, c)| !set.has(*c)), "{set:?}: {kind}");
            }
        }
        // Not faults: contpte events, kprobe mode's not_present sets.
        assert_eq!(fault_kind(ClassSet::default().with(KernelClass::ContpteUnfold)), None);
        assert_eq!(fault_kind(ClassSet::default().with(KernelClass::TpNotPresent)), None);
        assert_eq!(reason_code("needs wp_page: kprobe refused"), "needs:wp_page");
        assert_eq!(reason_code("needs page_fault_user|mem_abort: x"), "needs:page_fault_user|mem_abort");
    }

    #[test]
    fn catalogue_is_in_metric_order_and_names_are_serde_names() {
        assert_eq!(CLASSES.len(), ReportClass::ALL.len());
        for (i, m) in ReportClass::ALL.iter().enumerate() {
            assert_eq!(*m as usize, i);
            assert_eq!(CLASSES[i].metric, *m, "CLASSES[{i}]");
            let json = serde_json::to_string(m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
            assert_eq!(ReportClass::from_name(m.name()), Some(*m));
        }
        // Former names, on a command line.
        for (name, class) in FORMER_NAMES {
            assert_eq!(ReportClass::from_name(name), Some(class));
        }
    }

    #[test]
    fn every_kernel_class_is_the_source_of_a_report_class() {
        // A kernel class no report class reads would be counted and never
        // shown; a report class without a source could never be measured.
        for c in KernelClass::ALL {
            assert!(
                CLASSES.iter().any(|spec| spec.sources.iter().any(|s| s.class == c)),
                "{c:?} is the source of no report class"
            );
        }
        assert!(CLASSES.iter().all(|spec| !spec.sources.is_empty()));
        // The ABI: each kernel class's value is its place in ALL.
        for (i, c) in KernelClass::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{c:?}");
        }
    }

    /// A kprobe kernel's x86 attach set (without `dirty_shared`).
    const KPROBES_AND_TP: [Program; 6] =
        [FaultEntry, FaultReturn, WpPage, HugePmdWp, NewAnonRmap, PageFaultUser];

    fn avail(on: &[Program]) -> Vec<(ReportClass, Availability)> {
        availability(|p| on.contains(&p), |p| Some(format!("{p} missing")))
    }

    fn get(v: &[(ReportClass, Availability)], n: &str) -> Availability {
        v.iter().find(|(k, _)| k.name() == n).unwrap().1.clone()
    }

    #[test]
    fn tracepoint_only_mode() {
        let v = avail(&[PageFaultUser, TaskNewtask]);
        assert!(matches!(
            get(&v, "faults"),
            Availability::Measured { class: KernelClass::TpFaults, timed: false, .. }
        ));
        assert!(matches!(
            get(&v, "wp_faults"),
            Availability::Measured { class: KernelClass::TpPresentWrite, .. }
        ));
        assert!(matches!(
            get(&v, "not_present"),
            Availability::Measured { class: KernelClass::TpNotPresent, .. }
        ));
        match get(&v, "reuse") {
            Availability::NotMeasurable(r) => assert!(r.contains("fault_entry missing"), "{r}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(get(&v, "contpte_unfold"), Availability::NotMeasurable(_)));
    }

    #[test]
    fn tracepoint_counts_only_what_is_reported() {
        let tp = avail(&[PageFaultUser]);
        assert_eq!(
            error_code_classes(&tp),
            KernelClass::ERROR_CODE.iter().fold(0, |m, c| m | c.bit()),
            "without kprobes every error-code class is reported"
        );
        let kp = avail(&KPROBES_AND_TP);
        assert_eq!(error_code_classes(&kp), KernelClass::TpNotPresent.bit(), "with kprobes only not_present");
    }

    #[test]
    fn kprobe_mode_prefers_kprobes() {
        let v = avail(&KPROBES_AND_TP);
        assert!(matches!(
            get(&v, "faults"),
            Availability::Measured { class: KernelClass::Faults, timed: true, .. }
        ));
        assert!(matches!(get(&v, "wp_faults"), Availability::Measured { class: KernelClass::WpFaults, .. }));
        assert!(matches!(get(&v, "spurious"), Availability::Measured { class: KernelClass::Spurious, .. }));
    }

    #[test]
    fn reuse_says_when_it_includes_shared_write_notify() {
        let base = KPROBES_AND_TP;
        let v = avail(&base);
        match get(&v, "reuse") {
            Availability::Measured { class: KernelClass::Reuse, source, .. } => {
                assert!(source.contains("includes write-notify"), "{source}")
            }
            other => panic!("{other:?}"),
        }
        match get(&v, "wp_shared") {
            Availability::NotMeasurable(r) => assert!(r.contains("dirty_shared missing"), "{r}"),
            other => panic!("{other:?}"),
        }
        let v = avail(&[&base[..], &[DirtyShared]].concat());
        assert!(matches!(get(&v, "wp_shared"), Availability::Measured { class: KernelClass::WpShared, .. }));
        match get(&v, "reuse") {
            Availability::Measured { source, .. } => assert!(!source.contains("includes"), "{source}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn spurious_accepts_either_exception_source() {
        let v = avail(&[FaultEntry, FaultReturn, WpPage, HugePmdWp, NewAnonRmap, MemAbort]);
        assert!(matches!(get(&v, "spurious"), Availability::Measured { .. }));
        let v = avail(&[FaultEntry, FaultReturn, WpPage, HugePmdWp, NewAnonRmap]);
        match get(&v, "spurious") {
            Availability::NotMeasurable(r) => assert!(
                r.starts_with("needs page_fault_user|mem_abort|access_flags: page_fault_user missing;"),
                "{r}"
            ),
            other => panic!("{other:?}"),
        }
    }
}
