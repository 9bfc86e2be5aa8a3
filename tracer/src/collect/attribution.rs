//! What to attribute, and the process memory maps that name where: the
//! `--sites`/`--stacks` options, the kernel configuration they become, and a
//! `/proc/PID/maps` history per traced process (taken at attach, at every
//! phase change and at the end, so a mapping unmapped mid-run keeps its
//! name).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
};

use clap::Args;
use faultscope_common::{
    attrib::{VmaInfo, VmaKey},
    maps::Config,
    KernelClass,
};

use crate::{
    attrib::mapping::{dev_string, Mapping, MappingName, MapsHistory, MapsSnapshot, KERNEL},
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
    /// Entries of the kernel's stack map under `--stacks`, one a distinct
    /// stack of up to 127 frames (1,020 bytes). A stack whose hash bucket
    /// holds another is lost (`stack_ids_lost`): a larger map loses fewer.
    /// By default 65,536 (64 MiB); refused past 1 GiB.
    #[arg(long)]
    pub max_stacks: Option<u32>,
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
    /// Write the stacks of `--stacks` as a gzipped pprof profile (one
    /// sample type per class), for `go tool pprof`, Pyroscope or Parca.
    #[arg(long)]
    pub pprof: Option<PathBuf>,
}

impl Default for AttribOpts {
    fn default() -> Self {
        AttribOpts {
            sites: parse_classes("copy,spurious,contpte_unfold,contpte_fold").unwrap_or_default(),
            stacks: ClassList::default(),
            max_stacks: None,
            no_mappings: false,
            max_mappings: 16,
            max_sites: 10,
            folded: None,
            flamegraph: None,
            pprof: None,
        }
    }
}

impl AttribOpts {
    /// The files the stacks are written to: (flag, path).
    pub fn stack_outputs(&self) -> impl Iterator<Item = (&'static str, &std::path::Path)> {
        [("--folded", &self.folded), ("--flamegraph", &self.flamegraph), ("--pprof", &self.pprof)]
            .into_iter()
            .filter_map(|(f, p)| Some((f, p.as_deref()?)))
    }

    /// The stack map's entries: 0 without `--stacks` (the map preallocates
    /// every entry), else `--max-stacks` within its bound.
    pub fn stack_entries(&self) -> Result<u32, crate::error::Refusal> {
        let entries = crate::kernel::footprint::stack_entries(self.max_stacks)?;
        Ok(if self.stacks.0.is_empty() { 0 } else { entries })
    }

    /// The stacks' files must be writable, checked before the run (nothing
    /// is written yet).
    pub fn check_writable(&self) -> Result<(), crate::error::Refusal> {
        for (_, p) in self.stack_outputs() {
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
        let m = ReportClass::parse(name.trim())?;
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
    /// The path of each file (device, inode) any maps snapshot has shown:
    /// what names a file the kernel described by its name alone.
    paths: HashMap<(String, u64), String>,
    /// The kernel descriptions already taken in: (tgid, start, end, inode).
    described: HashSet<(u32, u64, u64, u64)>,
}

impl Attribution {
    pub fn new(opts: AttribOpts, mappings: Result<(), String>) -> Attribution {
        let mut a = Attribution {
            opts,
            mappings,
            histories: BTreeMap::new(),
            paths: HashMap::new(),
            described: HashSet::new(),
        };
        // faultscope's own files (the C library, the loader) are most
        // processes' too.
        if let Ok(own) = crate::attrib::mapping::snapshot_pid(std::process::id()) {
            learn_paths(&mut a.paths, &own);
        }
        a
    }

    /// Takes in the kernel's descriptions of VMAs it counted in: each is a
    /// snapshot of one mapping of its process, at the time the kernel read
    /// it, so that a process gone before its maps were read still has its
    /// mappings named (and an exec forgets them like any snapshot).
    pub fn kernel_vmas(&mut self, vmas: Vec<(VmaKey, VmaInfo)>) {
        for (k, v) in vmas {
            if !self.described.insert((k.tgid, k.start, v.end, v.ino)) {
                continue;
            }
            let path = (v.file != 0).then(|| self.paths.get(&(dev_string(v.dev), v.ino)).cloned()).flatten();
            let mut m = Mapping::from_vma(k.start, &v, path);
            let h = self.histories.entry(k.tgid).or_insert_with(|| MapsHistory::new(k.tgid));
            // The name the process's own maps gave it, where they had it.
            let named = h.snapshots().iter().rev().filter(|s| s.label != KERNEL).find_map(|s| {
                s.mappings.iter().find(|x| x.start == m.start && x.inode == m.inode).map(|x| x.name.clone())
            });
            if let Some(n) = named {
                m.name = n;
            }
            h.push(v.at, KERNEL, vec![m]);
        }
    }

    /// Learns from `pid`'s latest maps snapshot: its mappings' names for
    /// what the kernel described of `pid` at the same start (one name for
    /// one mapping, whichever source a query finds first), and its files'
    /// paths for every process's files described by name alone.
    fn learn(&mut self, pid: u32) {
        let Attribution { histories, paths, .. } = self;
        let Some(s) = histories.get(&pid).and_then(|h| h.snapshots().iter().max_by_key(|s| s.seq)) else {
            return;
        };
        let names: HashMap<(u64, u64), MappingName> =
            s.mappings.iter().map(|m| ((m.start, m.inode), m.name.clone())).collect();
        let learned = learn_paths(paths, &s.mappings);
        if let Some(h) = histories.get_mut(&pid) {
            for m in h.mappings_mut(KERNEL) {
                if let Some(n) = names.get(&(m.start, m.inode)) {
                    m.name = n.clone();
                }
            }
        }
        if learned {
            for h in histories.values_mut() {
                for m in h.mappings_mut(KERNEL) {
                    if let (MappingName::FileName(_), Some(p)) =
                        (&m.name, paths.get(&(m.dev.clone(), m.inode)))
                    {
                        m.name = MappingName::File { path: p.clone(), deleted: false };
                    }
                }
            }
        }
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
        let Some(h) = self.histories.get(&parent) else {
            return;
        };
        let full = |s: &&MapsSnapshot| s.label != KERNEL;
        let latest =
            h.snapshots().iter().rev().filter(full).find(|s| s.at <= at).or(h.snapshots().iter().rfind(full));
        // And what the kernel described before the fork, where the
        // snapshot has nothing at that start.
        let mut by_start: BTreeMap<u64, &Mapping> =
            latest.iter().flat_map(|s| s.mappings.iter()).map(|m| (m.start, m)).collect();
        for m in
            h.snapshots().iter().filter(|s| s.label == KERNEL && s.at <= at).flat_map(|s| s.mappings.iter())
        {
            by_start.entry(m.start).or_insert(m);
        }
        let inherited: Vec<Mapping> = by_start.into_values().cloned().collect();
        if !inherited.is_empty() {
            self.histories
                .entry(child)
                .or_insert_with(|| MapsHistory::new(child))
                .push(at, "fork", inherited);
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
        if h.snapshot(at, label).is_ok() {
            self.learn(pid);
        }
    }
}

/// Notes in `paths` the paths of the files in `mappings`; true if one is
/// new.
fn learn_paths(paths: &mut HashMap<(String, u64), String>, mappings: &[Mapping]) -> bool {
    let mut new = false;
    for m in mappings {
        if let (Some(p), true) = (m.name.path(), m.inode != 0) {
            new |= paths.insert((m.dev.clone(), m.inode), p.to_string()).is_none();
        }
    }
    new
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
        assert_eq!(parse_classes("not_present").unwrap().0, vec![ReportClass::NotPresent]);
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
