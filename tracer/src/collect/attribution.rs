//! What to attribute, and the process memory maps that name where: the
//! `--sites`/`--stacks` options, the kernel configuration they become, and a
//! `/proc/PID/maps` history per traced process (taken at attach, at every
//! phase change and at the end, so a mapping unmapped mid-run keeps its
//! name).

use std::{collections::BTreeMap, path::PathBuf};

use clap::Args;
use faultscope_common::{maps::Config, KernelClass};

use crate::{
    attrib::mapping::MapsHistory,
    kernel::classes::{Availability, ReportClass},
};

#[derive(Args, Debug, Clone)]
pub struct AttribOpts {
    /// Count the faulting instruction of these classes (comma-separated, or
    /// `none`), symbolized in the report's top sites.
    #[arg(long, default_value = "copy,spurious,contpte_unfold,contpte_fold", value_parser = parse_classes)]
    pub sites: ClassList,
    /// Count full user stacks of these classes (kernel stacks for the
    /// contpte classes: which kernel path unfolded a block).
    #[arg(long, default_value = "none", value_parser = parse_classes)]
    pub stacks: ClassList,
    /// Do not count per mapping.
    #[arg(long)]
    pub no_mappings: bool,
    /// Mappings per process and phase in the report; the rest are folded
    /// into `other`, with their count.
    #[arg(long, default_value_t = 16)]
    pub max_mappings: usize,
    /// Sites per class, process and phase in the report.
    #[arg(long, default_value_t = 10)]
    pub max_sites: usize,
    /// Write the stacks of `--stacks` as folded lines (class;comm;frames count).
    #[arg(long)]
    pub folded: Option<PathBuf>,
    /// Write the stacks of `--stacks` as an SVG flame graph.
    #[arg(long)]
    pub flamegraph: Option<PathBuf>,
}

impl Default for AttribOpts {
    fn default() -> Self {
        AttribOpts {
            sites: parse_classes("copy,spurious,contpte_unfold,contpte_fold").unwrap_or_default(),
            stacks: ClassList::default(),
            no_mappings: false,
            max_mappings: 16,
            max_sites: 10,
            folded: None,
            flamegraph: None,
        }
    }
}

impl AttribOpts {
    /// `--folded` and `--flamegraph` must be writable, checked before the
    /// run (nothing is written yet).
    pub fn check_writable(&self) -> Result<(), crate::error::Refusal> {
        for p in self.folded.iter().chain(self.flamegraph.iter()) {
            crate::output::check(p)?;
        }
        Ok(())
    }
}

/// A list of report classes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassList(pub Vec<ReportClass>);

fn parse_classes(s: &str) -> Result<ClassList, String> {
    if s == "none" || s.is_empty() {
        return Ok(ClassList::default());
    }
    let mut v = Vec::new();
    for name in s.split(',') {
        let m = ReportClass::from_name(name.trim()).ok_or_else(|| {
            let known: Vec<&str> = ReportClass::ALL.iter().map(|m| m.name()).collect();
            format!("{name:?} is not a class (known: {})", known.join(", "))
        })?;
        v.push(m);
    }
    v.sort();
    v.dedup();
    Ok(ClassList(v))
}

/// The kernel classes (`ClassSet` bits) measuring these report classes here.
/// Every program that counts a class attributes its events: the fault
/// path, the contpte probes, and the exception tracepoints (sites and
/// stacks; a tracepoint has no VMA, so no mapping).
fn bits(list: &ClassList, avail: &[(ReportClass, Availability)]) -> u32 {
    list.0
        .iter()
        .filter_map(|m| match avail.iter().find(|(x, _)| x == m).map(|(_, a)| a) {
            Some(Availability::Measured { class, .. }) => Some(class.bit()),
            _ => None,
        })
        .fold(0, |a, b| a | b)
}

/// Of `list`, the classes this run can attribute (those measured here),
/// and why the others cannot be (`None` when all can).
pub fn attributable_here(
    list: &ClassList,
    avail: &[(ReportClass, Availability)],
) -> (Vec<ReportClass>, Option<String>) {
    let mut yes = Vec::new();
    let mut no = Vec::new();
    for m in &list.0 {
        match avail.iter().find(|(x, _)| x == m).map(|(_, a)| a) {
            Some(Availability::Measured { .. }) => yes.push(*m),
            _ => no.push(format!("{m} (not measurable here)")),
        }
    }
    let why = (!no.is_empty()).then(|| format!("not attributed: {}", no.join(", ")));
    (yes, why)
}

/// Per-mapping counting: by the fault's VMA (the handle_mm_fault probe and
/// the VMA start offset from BTF), or, in tracepoint mode (no fault path),
/// by the fault's address in `ADDR_GRANULE`s that user space names from
/// the maps snapshots (rows `exact: false`).
pub fn mappings_availability(
    fault_probe: bool,
    tracepoint: bool,
    vma_offset: &Result<u32, String>,
    off: bool,
) -> Result<(), String> {
    if off {
        return Err("switched off (--no-mappings)".into());
    }
    if !fault_probe {
        return if tracepoint {
            Ok(())
        } else {
            Err("needs the handle_mm_fault probe or the exception tracepoint".into())
        };
    }
    vma_offset.as_ref().map(drop).map_err(Clone::clone)
}

/// The attribution of a run: what is counted, and the maps histories.
pub struct Attribution {
    pub opts: AttribOpts,
    /// Per-mapping counts are measured, or why not.
    pub mappings: Result<(), String>,
    pub histories: BTreeMap<u32, MapsHistory>,
}

impl Attribution {
    pub fn new(opts: AttribOpts, mappings: Result<(), String>) -> Attribution {
        Attribution { opts, mappings, histories: BTreeMap::new() }
    }

    /// The `CONFIG` entries for the kernel side.
    pub fn config(&self, avail: &[(ReportClass, Availability)]) -> Vec<(Config, u32)> {
        let stacks = bits(&self.opts.stacks, avail);
        let contpte = KernelClass::CONTPTE.iter().fold(0, |a, c| a | c.bit());
        vec![
            (Config::Mappings, self.mappings.is_ok() as u32),
            (Config::SiteClasses, bits(&self.opts.sites, avail)),
            (Config::UserStackClasses, stacks & !contpte),
            (Config::KernelStackClasses, stacks & contpte),
        ]
    }

    /// Whether stacks are asked for (the stack map is sized only then).
    pub fn wants_stacks(&self) -> bool {
        !self.opts.stacks.0.is_empty()
    }

    fn active(&self) -> bool {
        self.mappings.is_ok() || !self.opts.sites.0.is_empty() || !self.opts.stacks.0.is_empty()
    }

    /// A followed child forked at `at`: it starts with its parent's maps as
    /// they were then (its own snapshots, taken later, come after).
    pub fn inherit(&mut self, child: u32, parent: u32, at: u64) {
        if !self.active() {
            return;
        }
        let latest = self.histories.get(&parent).and_then(|h| {
            h.snapshots()
                .iter()
                .rev()
                .find(|s| s.at <= at)
                .or(h.snapshots().last())
                .map(|s| s.mappings.clone())
        });
        if let Some(m) = latest {
            self.histories.entry(child).or_insert_with(|| MapsHistory::new(child)).push(at, "fork", m);
        }
    }

    /// `pid` exec'd at `at`: its earlier snapshots were another program's
    /// and must not name what it does from now on.
    pub fn exec(&mut self, pid: u32, at: u64) {
        if let Some(h) = self.histories.get_mut(&pid) {
            let keep: Vec<_> = h.snapshots().iter().filter(|s| s.at >= at).cloned().collect();
            let mut fresh = MapsHistory::new(pid);
            for s in keep {
                fresh.push(s.at, s.label, s.mappings);
            }
            *h = fresh;
        }
    }

    /// Takes a maps snapshot of `pid` at `at` (monotonic ns). A process
    /// that is already gone keeps its earlier snapshots.
    pub fn snapshot(&mut self, pid: u32, at: u64, label: &str) {
        if !self.active() {
            return;
        }
        let h = self.histories.entry(pid).or_insert_with(|| MapsHistory::new(pid));
        let _ = h.snapshot(at, label);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_lists() {
        assert_eq!(parse_classes("none").unwrap(), ClassList::default());
        assert_eq!(parse_classes("copy,reuse,copy").unwrap().0, vec![ReportClass::Reuse, ReportClass::Copy]);
        assert!(parse_classes("cpoy").unwrap_err().contains("not a class"));
        // Counted from the exception tracepoint, it has a site and stacks too.
        assert_eq!(parse_classes("first_touch").unwrap().0, vec![ReportClass::FirstTouch]);
    }

    #[test]
    fn a_child_inherits_its_parents_maps_and_an_exec_forgets_them() {
        use crate::attrib::mapping::parse_maps;
        let maps =
            parse_maps("7f0000000000-7f0000400000 rw-p 00000000 00:00 0                          [heap]\n")
                .unwrap();
        let mut a = Attribution::new(AttribOpts::default(), Ok(()));
        let mut h = MapsHistory::new(1);
        h.push(10, "attach", maps);
        a.histories.insert(1, h);
        a.inherit(2, 1, 20);
        assert_eq!(a.histories[&2].resolve(0x7f0000000000, 30).unwrap().mapping.name.to_string(), "[heap]");
        a.exec(2, 40);
        assert!(a.histories[&2].resolve(0x7f0000000000, 50).is_none());
    }

    #[test]
    fn kernel_config_follows_what_is_measured() {
        let avail = vec![
            (
                ReportClass::Copy,
                Availability::Measured { class: KernelClass::Copy, timed: true, source: "k" },
            ),
            (
                ReportClass::ContpteUnfold,
                Availability::Measured { class: KernelClass::ContpteUnfold, timed: false, source: "k" },
            ),
            (ReportClass::Spurious, Availability::NotMeasurable("x".into())),
        ];
        let o = AttribOpts { stacks: parse_classes("copy,contpte_unfold").unwrap(), ..Default::default() };
        let a = Attribution::new(o, Ok(()));
        let c: BTreeMap<u32, u32> = a.config(&avail).into_iter().map(|(k, v)| (k.index(), v)).collect();
        assert_eq!(c[&Config::Mappings.index()], 1);
        assert_eq!(
            c[&Config::SiteClasses.index()],
            KernelClass::Copy.bit() | KernelClass::ContpteUnfold.bit()
        );
        assert_eq!(c[&Config::UserStackClasses.index()], KernelClass::Copy.bit());
        assert_eq!(c[&Config::KernelStackClasses.index()], KernelClass::ContpteUnfold.bit());
    }
}
