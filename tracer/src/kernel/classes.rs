//! The classes a report shows, and where each comes from on this kernel:
//! kprobes where they attach, the x86 tracepoint's error code otherwise, or
//! "not measurable here" with the reason. Never a silent 0.

use std::{collections::BTreeMap, fmt};

use faultscope_common::{
    class::ClassSet,
    Class,
    Program::{self, *},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use Need::{Any, One};

/// A class as the report shows it: the one catalogue that the report's keys,
/// the text tables, diff, verify, findings and the tests derive from. The
/// JSON key is the snake_case name; the order is the report's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    Faults,
    WriteFaults,
    WpFaults,
    Reuse,
    Copy,
    WpShared,
    Spurious,
    HugePmdWp,
    ContpteUnfold,
    ContpteFold,
    ContpteConvert,
    ContpteTryUnfold,
    ContpteFoldAttempt,
    FirstTouch,
    Major,
    Retry,
    Error,
}

impl Metric {
    pub const ALL: [Metric; 17] = [
        Metric::Faults,
        Metric::WriteFaults,
        Metric::WpFaults,
        Metric::Reuse,
        Metric::Copy,
        Metric::WpShared,
        Metric::Spurious,
        Metric::HugePmdWp,
        Metric::ContpteUnfold,
        Metric::ContpteFold,
        Metric::ContpteConvert,
        Metric::ContpteTryUnfold,
        Metric::ContpteFoldAttempt,
        Metric::FirstTouch,
        Metric::Major,
        Metric::Retry,
        Metric::Error,
    ];

    pub fn spec(self) -> &'static ClassSpec {
        &CLASSES[self as usize]
    }

    /// The report's name of the class (its JSON key).
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    pub fn from_name(name: &str) -> Option<Metric> {
        Metric::ALL.iter().copied().find(|m| m.name() == name)
    }

    /// The columns of the compact tables (live view, bench summary).
    pub fn summary() -> impl Iterator<Item = Metric> {
        Metric::ALL.into_iter().filter(|m| m.spec().columns.summary)
    }

    /// The classes diff compares.
    pub fn compared() -> impl Iterator<Item = Metric> {
        Metric::ALL.into_iter().filter(|m| m.spec().columns.diff)
    }
}

impl std::fmt::Display for Metric {
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
    pub metric: Metric,
    /// JSON key (schema faultscope/1); equals the serde name of `metric`.
    pub name: &'static str,
    pub columns: Columns,
    pub sources: &'static [Source],
}

pub struct Source {
    pub class: Class,
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

pub const CLASSES: &[ClassSpec] = &[
    ClassSpec {
        metric: Metric::Faults,
        name: "faults",
        columns: MAIN,
        sources: &[
            Source {
                class: Class::Faults,
                needs: &FAULT,
                timed: true,
                describe: "kprobe handle_mm_fault (user faults, each call)",
            },
            Source {
                class: Class::TpFaults,
                needs: &[One(PageFaultUser)],
                timed: false,
                describe: "tracepoint exceptions:page_fault_user",
            },
        ],
    },
    ClassSpec {
        metric: Metric::WriteFaults,
        name: "write_faults",
        columns: DIFF,
        sources: &[
            Source {
                class: Class::WriteFaults,
                needs: &FAULT,
                timed: true,
                describe: "kprobe handle_mm_fault, FAULT_FLAG_WRITE",
            },
            Source {
                class: Class::TpWrite,
                needs: &[One(PageFaultUser)],
                timed: false,
                describe: "tracepoint exceptions:page_fault_user, error_code WRITE",
            },
        ],
    },
    ClassSpec {
        metric: Metric::WpFaults,
        name: "wp_faults",
        columns: MAIN,
        sources: &[
            Source {
                class: Class::WpFaults,
                needs: &[One(FaultEntry), One(FaultReturn), One(WpPage)],
                timed: true,
                describe: "kprobe do_wp_page within a user fault",
            },
            Source {
                class: Class::TpPresentWrite,
                needs: &[One(PageFaultUser)],
                timed: false,
                describe:
                    "tracepoint exceptions:page_fault_user, error_code PROT|WRITE (includes spurious faults)",
            },
        ],
    },
    ClassSpec {
        metric: Metric::Reuse,
        name: "reuse",
        columns: MAIN,
        sources: &[
            Source {
                class: Class::Reuse,
                needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(NewAnonRmap), One(DirtyShared)],
                timed: true,
                describe: "do_wp_page without folio_add_new_anon_rmap or fault_dirty_shared_page",
            },
            // Without fault_dirty_shared_page a shared mapping's write-notify
            // fault looks like a reuse; the source says so.
            Source {
                class: Class::Reuse,
                needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(NewAnonRmap)],
                timed: true,
                describe: "do_wp_page without folio_add_new_anon_rmap (includes write-notify faults of shared mappings: fault_dirty_shared_page is not probed)",
            },
        ],
    },
    ClassSpec {
        metric: Metric::Copy,
        name: "copy",
        columns: MAIN,
        sources: &[Source {
            class: Class::Copy,
            needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(NewAnonRmap)],
            timed: true,
            describe: "do_wp_page with folio_add_new_anon_rmap",
        }],
    },
    ClassSpec {
        metric: Metric::WpShared,
        name: "wp_shared",
        columns: DIFF,
        sources: &[Source {
            class: Class::WpShared,
            needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(DirtyShared)],
            timed: true,
            describe: "do_wp_page with fault_dirty_shared_page: write-notify of a shared mapping, no COW",
        }],
    },
    ClassSpec {
        metric: Metric::Spurious,
        name: "spurious",
        columns: MAIN,
        sources: &[Source {
            class: Class::Spurious,
            needs: &[One(FaultEntry), One(FaultReturn), One(WpPage), One(HugePmdWp), One(NewAnonRmap), Any(&[PageFaultUser, MemAbort, AccessFlags])],
            timed: true,
            describe: "write fault on a present page (x86 error code PROT, else the present-entry path) that reached no write-protect or new-folio path",
        }],
    },
    ClassSpec {
        metric: Metric::HugePmdWp,
        name: "huge_pmd_wp",
        columns: MAIN,
        sources: &[Source {
            class: Class::HugePmdWp,
            needs: &[One(FaultEntry), One(FaultReturn), One(HugePmdWp)],
            timed: true,
            describe: "kprobe do_huge_pmd_wp_page within a user fault",
        }],
    },
    ClassSpec {
        metric: Metric::ContpteUnfold,
        name: "contpte_unfold",
        columns: MAIN,
        sources: &[Source {
            class: Class::ContpteUnfold,
            needs: &[One(ContpteConvert)],
            timed: false,
            describe: "kprobe contpte_convert, new PTE without PTE_CONT",
        }],
    },
    ClassSpec {
        metric: Metric::ContpteFold,
        name: "contpte_fold",
        columns: DIFF,
        sources: &[Source {
            class: Class::ContpteFold,
            needs: &[One(ContpteConvert)],
            timed: false,
            describe: "kprobe contpte_convert, new PTE with PTE_CONT",
        }],
    },
    ClassSpec {
        metric: Metric::ContpteConvert,
        name: "contpte_convert",
        columns: DIFF,
        sources: &[Source {
            class: Class::ContpteConvert,
            needs: &[One(ContpteConvert)],
            timed: false,
            describe: "kprobe contpte_convert",
        }],
    },
    ClassSpec {
        metric: Metric::ContpteTryUnfold,
        name: "contpte_try_unfold",
        columns: FULL_ONLY,
        sources: &[Source {
            class: Class::ContpteTryUnfold,
            needs: &[One(ContpteTryUnfold)],
            timed: false,
            describe: "kprobe __contpte_try_unfold",
        }],
    },
    ClassSpec {
        metric: Metric::ContpteFoldAttempt,
        name: "contpte_fold_attempt",
        columns: FULL_ONLY,
        sources: &[Source {
            class: Class::ContpteFoldAttempt,
            needs: &[One(ContpteTryFold)],
            timed: false,
            describe: "kprobe __contpte_try_fold",
        }],
    },
    ClassSpec {
        metric: Metric::FirstTouch,
        name: "first_touch",
        columns: DIFF,
        sources: &[Source {
            class: Class::TpNotPresent,
            needs: &[One(PageFaultUser)],
            timed: false,
            describe: "tracepoint exceptions:page_fault_user, error_code without PROT",
        }],
    },
    ClassSpec {
        metric: Metric::Major,
        name: "major",
        columns: FULL_ONLY,
        sources: &[Source {
            class: Class::Major,
            needs: &FAULT,
            timed: true,
            describe: "handle_mm_fault returned VM_FAULT_MAJOR",
        }],
    },
    ClassSpec {
        metric: Metric::Retry,
        name: "retry",
        columns: FULL_ONLY,
        sources: &[Source {
            class: Class::Retry,
            needs: &FAULT,
            timed: true,
            describe: "handle_mm_fault returned VM_FAULT_RETRY",
        }],
    },
    ClassSpec {
        metric: Metric::Error,
        name: "error",
        columns: FULL_ONLY,
        sources: &[Source {
            class: Class::Error,
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
pub const FAULT_KINDS: &[(&str, Class)] = &[
    ("copy", Class::Copy),
    ("reuse", Class::Reuse),
    ("wp_shared", Class::WpShared),
    ("huge_pmd_wp", Class::HugePmdWp),
    ("spurious", Class::Spurious),
    // A write-protect fault none of the above took (a retry, an error, or
    // a class not measurable here).
    ("wp_other", Class::WpFaults),
    // Tracepoint mode: a write to a present page (wp or spurious).
    ("present_write", Class::TpPresentWrite),
    // A write that took no write-protect path: a page not present (first
    // touch, swap-in), or spurious where that is not measurable.
    ("other_write", Class::WriteFaults),
    ("other_write", Class::TpWrite),
    ("read", Class::Faults),
    ("read", Class::TpFaults),
];

/// The kind of a fault of class set `set`, or None when the set is not a
/// fault (contpte events, kprobe mode's separate error-code sets).
pub fn fault_kind(set: ClassSet) -> Option<&'static str> {
    if !set.has(Class::Faults) && !set.has(Class::TpFaults) {
        return None;
    }
    FAULT_KINDS.iter().find(|(_, c)| set.has(*c)).map(|(k, _)| *k)
}

/// The kinds that can occur given what is measured (serve declares them
/// at 0), in the table's order, each once.
pub fn fault_kinds_here(avail: &[(Metric, Availability)]) -> Vec<&'static str> {
    let measured = |c: Class| {
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
    Measured { class: Class, timed: bool, source: &'static str },
    NotMeasurable(String),
}

/// Decides each class's source given which programs are attached and, for
/// those that are not, why.
pub fn availability(
    attached: impl Fn(Program) -> bool,
    reason: impl Fn(Program) -> Option<String>,
) -> Vec<(Metric, Availability)> {
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
pub fn error_code_classes(avail: &[(Metric, Availability)]) -> u32 {
    avail
        .iter()
        .filter_map(|(_, a)| match a {
            Availability::Measured { class, .. } if Class::ERROR_CODE.contains(class) => Some(class.bit()),
            _ => None,
        })
        .fold(0, |m, b| m | b)
}

/// One line saying what is measured here and what is not, and why.
pub fn measured_line(avail: &[(Metric, Availability)]) -> String {
    let measured: Vec<&str> = avail
        .iter()
        .filter(|(_, a)| matches!(a, Availability::Measured { .. }))
        .map(|(m, _)| m.name())
        .collect();
    let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (m, a) in avail {
        if let Availability::NotMeasurable(r) = a {
            reasons.entry(r.as_str()).or_default().push(m.name());
        }
    }
    let mut s = format!("faultscope: measuring {}", measured.join(", "));
    if !reasons.is_empty() {
        s.push_str("; not measurable here: ");
        let parts: Vec<String> = reasons.iter().map(|(r, ns)| format!("{} ({r})", ns.join(", "))).collect();
        s.push_str(&parts.join("; "));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measured_line_groups_reasons() {
        let avail = vec![
            (Metric::Faults, Availability::Measured { class: Class::TpFaults, timed: false, source: "t" }),
            (Metric::Reuse, Availability::NotMeasurable("no PMU".into())),
            (Metric::Copy, Availability::NotMeasurable("no PMU".into())),
        ];
        assert_eq!(
            measured_line(&avail),
            "faultscope: measuring faults; not measurable here: reuse, copy (no PMU)"
        );
    }

    #[test]
    fn every_fault_is_of_exactly_one_kind() {
        // Every set the fault path can make (its classes, in any
        // combination), and the tracepoint's.
        let kprobe: Vec<Class> = Class::FAULT_RETURN.to_vec();
        let tp: Vec<Class> = Class::ERROR_CODE.to_vec();
        for (base, classes) in [(Class::Faults, kprobe), (Class::TpFaults, tp)] {
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
        // Not faults: contpte events, kprobe mode's first_touch sets.
        assert_eq!(fault_kind(ClassSet::default().with(Class::ContpteUnfold)), None);
        assert_eq!(fault_kind(ClassSet::default().with(Class::TpNotPresent)), None);
        assert_eq!(reason_code("needs wp_page: kprobe refused"), "needs:wp_page");
        assert_eq!(reason_code("needs page_fault_user|mem_abort: x"), "needs:page_fault_user|mem_abort");
    }

    #[test]
    fn catalogue_is_in_metric_order_and_names_are_serde_names() {
        assert_eq!(CLASSES.len(), Metric::ALL.len());
        for (i, m) in Metric::ALL.iter().enumerate() {
            assert_eq!(*m as usize, i);
            assert_eq!(CLASSES[i].metric, *m, "CLASSES[{i}]");
            let json = serde_json::to_string(m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.name()));
            assert_eq!(Metric::from_name(m.name()), Some(*m));
        }
    }

    /// A kprobe kernel's x86 attach set (without `dirty_shared`).
    const KPROBES_AND_TP: [Program; 6] =
        [FaultEntry, FaultReturn, WpPage, HugePmdWp, NewAnonRmap, PageFaultUser];

    fn avail(on: &[Program]) -> Vec<(Metric, Availability)> {
        availability(|p| on.contains(&p), |p| Some(format!("{p} missing")))
    }

    fn get(v: &[(Metric, Availability)], n: &str) -> Availability {
        v.iter().find(|(k, _)| k.name() == n).unwrap().1.clone()
    }

    #[test]
    fn tracepoint_only_mode() {
        let v = avail(&[PageFaultUser, TaskNewtask]);
        assert!(matches!(
            get(&v, "faults"),
            Availability::Measured { class: Class::TpFaults, timed: false, .. }
        ));
        assert!(matches!(get(&v, "wp_faults"), Availability::Measured { class: Class::TpPresentWrite, .. }));
        assert!(matches!(get(&v, "first_touch"), Availability::Measured { class: Class::TpNotPresent, .. }));
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
            Class::ERROR_CODE.iter().fold(0, |m, c| m | c.bit()),
            "without kprobes every error-code class is reported"
        );
        let kp = avail(&KPROBES_AND_TP);
        assert_eq!(error_code_classes(&kp), Class::TpNotPresent.bit(), "with kprobes only first_touch");
    }

    #[test]
    fn kprobe_mode_prefers_kprobes() {
        let v = avail(&KPROBES_AND_TP);
        assert!(matches!(
            get(&v, "faults"),
            Availability::Measured { class: Class::Faults, timed: true, .. }
        ));
        assert!(matches!(get(&v, "wp_faults"), Availability::Measured { class: Class::WpFaults, .. }));
        assert!(matches!(get(&v, "spurious"), Availability::Measured { class: Class::Spurious, .. }));
    }

    #[test]
    fn reuse_says_when_it_includes_shared_write_notify() {
        let base = KPROBES_AND_TP;
        let v = avail(&base);
        match get(&v, "reuse") {
            Availability::Measured { class: Class::Reuse, source, .. } => {
                assert!(source.contains("includes write-notify"), "{source}")
            }
            other => panic!("{other:?}"),
        }
        match get(&v, "wp_shared") {
            Availability::NotMeasurable(r) => assert!(r.contains("dirty_shared missing"), "{r}"),
            other => panic!("{other:?}"),
        }
        let v = avail(&[&base[..], &[DirtyShared]].concat());
        assert!(matches!(get(&v, "wp_shared"), Availability::Measured { class: Class::WpShared, .. }));
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
