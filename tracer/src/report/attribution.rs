//! The attribution part of the report: the kernel's per-mapping, per-site
//! and per-stack counts of a process over a span, named with the maps
//! history (mappings, user frames) and kallsyms (kernel frames), folded to
//! the top N with an honest `other`.

use crate::term::safe;
use std::{cell::RefCell, collections::BTreeMap, fmt::Write as _};

use faultscope_common::{
    attrib::{ClassCounts, MappingKey, ADDR_GRANULE, START_IS_ADDR},
    KernelClass, PhaseId,
};

use super::schema::{Attribution, CopySources, Folded, FoldedSites, MappingRow, SiteRow, StackRow};
use crate::{
    attrib::{
        mapping::{top_n, Mapping, MapsHistory},
        sites::SiteSymbolizer,
        stacks::FoldedStacks,
    },
    collect::{attribution::Attribution as Attrib, collector::Snapshot},
    kernel::classes::{Availability, ReportClass},
};

/// What naming needs beyond the snapshot.
pub struct Namer<'a> {
    pub attrib: &'a Attrib,
    pub avail: &'a [(ReportClass, Availability)],
    pub symbolizer: RefCell<SiteSymbolizer>,
    /// The frames (leaf first) of a stack id.
    pub frames: &'a dyn Fn(i32) -> Vec<u64>,
}

impl<'a> Namer<'a> {
    pub fn new(
        attrib: &'a Attrib,
        avail: &'a [(ReportClass, Availability)],
        frames: &'a dyn Fn(i32) -> Vec<u64>,
    ) -> Self {
        Namer { attrib, avail, symbolizer: RefCell::new(SiteSymbolizer::new()), frames }
    }

    /// The measured report classes and the kernel class each is counted by.
    fn metrics(&self) -> impl Iterator<Item = (ReportClass, KernelClass)> + '_ {
        self.avail.iter().filter_map(|(m, a)| match a {
            Availability::Measured { class, .. } => Some((*m, *class)),
            _ => None,
        })
    }

    fn metric_of(&self, class: u32) -> Option<ReportClass> {
        self.metrics().find(|(_, c)| *c as u32 == class).map(|(m, _)| m)
    }

    fn counts(&self, c: &ClassCounts) -> BTreeMap<ReportClass, u64> {
        self.metrics()
            .filter_map(|(m, class)| c.counts.get(class as usize).copied().filter(|n| *n > 0).map(|n| (m, n)))
            .collect()
    }
}

/// The attribution of process `tgid` over phase `phase` (the whole run when
/// `None`), names resolved as of time `at` (monotonic ns).
pub fn attribution(
    snap: &Snapshot,
    n: &Namer<'_>,
    tgid: u32,
    phase: Option<PhaseId>,
    at: u64,
) -> Attribution {
    let history = n.attrib.histories.get(&tgid);
    let in_span = |t: u32, p: PhaseId| t == tgid && phase.is_none_or(|x| x == p);
    let mut out = Attribution::default();

    // Mappings: sum per key over the span, name each, merge the keys that
    // name one mapping (address granules), rank by total, fold the rest.
    let mut rows: Vec<MappingRow> = Vec::new();
    for (start, c) in &by_start(snap, tgid, phase) {
        let counts = n.counts(c);
        if counts.is_empty() {
            continue;
        }
        let row = mapping_row(history, *start, at, counts);
        match rows.iter_mut().find(|r| (&r.mapping, r.start, r.end) == (&row.mapping, row.start, row.end)) {
            Some(r) => {
                r.exact &= row.exact;
                for (m, c) in row.counts {
                    *r.counts.entry(m).or_insert(0) += c;
                }
            }
            None => rows.push(row),
        }
    }
    let total = |r: &MappingRow| r.counts.values().sum::<u64>();
    rows.sort_by(|a, b| total(b).cmp(&total(a)).then(a.start.cmp(&b.start)));
    let max = n.attrib.opts.max_mappings;
    for (i, row) in rows.into_iter().enumerate() {
        if i < max {
            out.mappings.push(row);
        } else {
            let o = out.mappings_other.get_or_insert_with(Folded::default);
            o.entries += 1;
            for (m, c) in row.counts {
                *o.counts.entry(m).or_insert(0) += c;
            }
        }
    }

    // Sites: per class, the top (ip, system call) pairs, named.
    let mut per_class: BTreeMap<ReportClass, BTreeMap<(u64, u32), u64>> = BTreeMap::new();
    for (k, v) in snap.sites.iter().filter(|(k, _)| in_span(k.tgid, k.phase)) {
        if let Some(m) = n.metric_of(k.class) {
            *per_class.entry(m).or_default().entry((k.ip, k.syscall)).or_insert(0) += v;
        }
    }
    // The kernel's faults for the process (a system call's) are ranked on
    // their own: a few copies by read(2) stay in sight beside thousands of
    // user stores.
    for (m, ips) in per_class {
        let (user, kernel): (Vec<_>, Vec<_>) = ips.into_iter().partition(|((_, sc), _)| *sc == 0);
        let (mut entries, mut count) = (0u64, 0u64);
        for part in [user, kernel] {
            let (top, folded) = top_n(part, n.attrib.opts.max_sites);
            let names = name_ips(n, history, at, &top.iter().map(|((ip, _), _)| *ip).collect::<Vec<_>>());
            for (((ip, sc), count), (site, mapping)) in top.into_iter().zip(names) {
                out.sites.push(SiteRow { class: m, ip, site, mapping, syscall: syscall_name(sc), count });
            }
            entries += folded.entries as u64;
            count += folded.count;
        }
        if entries > 0 {
            out.sites_other.push(FoldedSites { class: m, entries, count });
        }
    }

    // Stacks: per (class, user stack, kernel stack, kernel caller).
    let mut stacks: BTreeMap<(ReportClass, i32, i32, u64), u64> = BTreeMap::new();
    for (k, v) in snap.stacks.iter().filter(|(k, _)| in_span(k.tgid, k.phase)) {
        if let Some(m) = n.metric_of(k.class) {
            *stacks.entry((m, k.user_stack, k.kernel_stack, k.kernel_caller)).or_insert(0) += v;
        }
    }
    for ((m, u, k, caller), count) in stacks {
        let mut user: Vec<String> =
            name_ips(n, history, at, &(n.frames)(u)).into_iter().map(|(s, _)| s).collect();
        let mut kernel =
            without_trampolines(n.symbolizer.borrow().kernel_frames(&with_caller((n.frames)(k), caller)));
        // Leaf first from the kernel; the report has outermost first.
        user.reverse();
        kernel.reverse();
        out.stacks.push(StackRow { class: m, user, kernel, count });
    }
    out.stacks.sort_by(|a, b| a.class.cmp(&b.class).then(b.count.cmp(&a.count)));
    out
}

/// A kernel stack (leaf first) taken at a function's entry, with the
/// return address into its direct caller (`StackKey::kernel_caller`, arm64)
/// put back as the second frame, unless the unwinder has it already.
fn with_caller(mut frames: Vec<u64>, caller: u64) -> Vec<u64> {
    if caller != 0 && !frames.is_empty() && frames.get(1) != Some(&caller) {
        frames.insert(1, caller);
    }
    frames
}

/// A kernel stack (named, leaf first) as the kernel ran it, without what
/// fentry/fexit put in it: the program's own frames and its trampoline at
/// the leaf (the probed function's frame, `f+0x8` at its patched entry,
/// stays: it is the leaf), and, further out, each fexit trampoline with the
/// patched entry of the function it wraps (`f+0xc4 <- bpf_trampoline_N <-
/// f+0x8` is one call of `f`). A kprobe's stack has none of these.
fn without_trampolines(frames: Vec<String>) -> Vec<String> {
    let func = |f: &str| f.split('+').next().unwrap_or(f).to_string();
    let is_bpf = |f: &str| f.starts_with("bpf_prog_") || f.starts_with("bpf_trampoline_");
    let mut out: Vec<String> = Vec::new();
    let mut it = frames.into_iter().skip_while(|f| is_bpf(f)).peekable();
    while let Some(f) = it.next() {
        if f.starts_with("bpf_trampoline_") {
            if let (Some(last), Some(next)) = (out.last(), it.peek()) {
                if func(last) == func(next) {
                    it.next();
                }
            }
            continue;
        }
        out.push(f);
    }
    out
}

/// The mapping a `MAPPINGS` key's start names at time `at`, and whether
/// it is exact (see [`MappingRow::exact`]).
fn resolve(history: Option<&MapsHistory>, start: u64, at: u64) -> Option<(&Mapping, bool)> {
    let addr = start & !START_IS_ADDR;
    history.and_then(|h| {
        if start & START_IS_ADDR != 0 {
            // A granule: the mapping it falls in, else the first it overlaps.
            h.containing(addr, at).map(|r| (r.mapping, false)).or_else(|| {
                h.snapshots()
                    .iter()
                    .rev()
                    .flat_map(|s| s.mappings.iter())
                    .find(|m| m.start < addr + ADDR_GRANULE && addr < m.end)
                    .map(|m| (m, false))
            })
        } else {
            h.resolve(start, at).map(|r| (r.mapping, r.exact))
        }
    })
}

/// The copies of `tgid` over `phase` (the whole run when `None`) by the
/// kind of mapping they were in; `count` is the class's total, the rest of
/// which no mapping was found for.
pub fn copy_sources(
    snap: &Snapshot,
    n: &Namer<'_>,
    (tgid, phase): (u32, Option<PhaseId>),
    at: u64,
    count: u64,
) -> Option<CopySources> {
    let class = n.metrics().find(|(m, _)| *m == ReportClass::Copy)?.1 as usize;
    n.attrib.mappings.as_ref().ok()?;
    let history = n.attrib.histories.get(&tgid);
    let mut out = CopySources::default();
    for (start, c) in by_start(snap, tgid, phase) {
        let copies = c.counts.get(class).copied().unwrap_or(0);
        match resolve(history, start, at) {
            _ if copies == 0 => {}
            Some((m, _)) if m.inode != 0 => {
                out.file += copies;
                out.file_exec += if m.perms.exec { copies } else { 0 };
            }
            Some(_) => out.anon += copies,
            None => {}
        }
    }
    out.unattributed = count.saturating_sub(out.anon + out.file);
    Some(out)
}

/// A process's per-mapping counts over a span, summed per key start.
fn by_start(snap: &Snapshot, tgid: u32, phase: Option<PhaseId>) -> BTreeMap<u64, ClassCounts> {
    let mut out: BTreeMap<u64, ClassCounts> = BTreeMap::new();
    // The keys sort by process first: its own, not every process's.
    let own = snap
        .mappings
        .range(MappingKey { tgid, ..MappingKey::default() }..)
        .take_while(|(k, _)| k.tgid == tgid);
    for (k, v) in own.filter(|(k, _)| phase.is_none_or(|x| x == k.phase)) {
        out.entry(k.start).or_insert(ClassCounts::ZERO).merge(v);
    }
    out
}

fn mapping_row(
    history: Option<&MapsHistory>,
    start: u64,
    at: u64,
    counts: BTreeMap<ReportClass, u64>,
) -> MappingRow {
    let addr = start & !START_IS_ADDR;
    let found = resolve(history, start, at);
    match found {
        Some((m, exact)) => MappingRow {
            mapping: m.name.to_string(),
            start: m.start,
            end: m.end,
            size: m.size(),
            exact,
            counts,
        },
        // Address granules in no snapshot are one row (they are many: a
        // process gone before its maps could be read); a VMA start keeps
        // its address.
        None if start & START_IS_ADDR != 0 => MappingRow {
            mapping: "unresolved (addresses in no maps snapshot)".into(),
            start: 0,
            end: 0,
            size: 0,
            exact: false,
            counts,
        },
        None => MappingRow {
            mapping: format!("unresolved {addr:#x}"),
            start: addr,
            end: addr,
            size: 0,
            exact: false,
            counts,
        },
    }
}

/// The system call a kernel-side fault was taken in (`SiteKey::syscall`),
/// by this machine's numbering: `None` for a user-mode fault.
pub fn syscall_name(key: u32) -> Option<String> {
    match key {
        0 => None,
        faultscope_common::attrib::NOT_IN_SYSCALL => Some("no system call".into()),
        k => Some(match syscalls::Sysno::new((k - 1) as usize) {
            Some(s) => format!("{}(2)", s.name()),
            None => format!("system call {}", k - 1),
        }),
    }
}

/// User ips to (site, mapping) names; ip 0 is an event outside a fault.
fn name_ips(
    n: &Namer<'_>,
    history: Option<&MapsHistory>,
    at: u64,
    ips: &[u64],
) -> Vec<(String, Option<String>)> {
    let Some(h) = history else {
        return ips.iter().map(|ip| (format!("[unknown] {ip:#x}"), None)).collect();
    };
    let sites = n.symbolizer.borrow_mut().symbolize(h, at, ips);
    sites
        .into_iter()
        .map(|s| {
            if s.ip == 0 {
                ("[no fault]".to_string(), None)
            } else {
                (s.to_string(), s.mapping.as_ref().map(|m| m.to_string()))
            }
        })
        .collect()
}

/// The "by mapping" and "top sites" tables of one span.
pub fn to_text(out: &mut String, a: &Attribution) {
    if !a.mappings.is_empty() {
        let mut classes: Vec<ReportClass> =
            a.mappings.iter().flat_map(|r| r.counts.keys().copied()).collect();
        classes.sort();
        classes.dedup();
        classes.retain(|m| m.spec().columns.summary);
        let mut rows: Vec<(String, &BTreeMap<ReportClass, u64>)> = a
            .mappings
            .iter()
            .map(|r| (format!("{} ({})", safe(&r.mapping), crate::units::size_or_unknown(r.size)), &r.counts))
            .collect();
        if let Some(o) = &a.mappings_other {
            rows.push((format!("other ({} mappings)", crate::units::count(o.entries)), &o.counts));
        }
        let width = rows.iter().map(|(n, _)| n.chars().count()).max().unwrap_or(0).max(10);
        let _ = write!(out, "  {:<w$}", "BY MAPPING", w = width + 2);
        for m in &classes {
            let _ = write!(out, " {:>11}", m.name());
        }
        out.push('\n');
        for (name, counts) in rows {
            let _ = write!(out, "    {name:<width$}");
            for m in &classes {
                let _ = write!(out, " {:>11}", crate::units::count(counts.get(m).copied().unwrap_or(0)));
            }
            out.push('\n');
        }
    }
    if !a.sites.is_empty() {
        let _ = writeln!(out, "  {:<22} {:>10}  SITE", "TOP SITES", "COUNT");
        for s in &a.sites {
            let via = s.syscall.as_deref().map(|c| format!(", in {c}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "    {:<20} {:>10}  {}{via}",
                s.class.name(),
                crate::units::count(s.count),
                safe(&s.site)
            );
        }
        for f in &a.sites_other {
            let _ = writeln!(
                out,
                "    {:<20} {:>10}  other ({} sites)",
                f.class.name(),
                crate::units::count(f.count),
                crate::units::count(f.entries)
            );
        }
    }
}

/// The stacks of a report as folded lines (class;comm;frames count), for
/// `--folded` and `--flamegraph`.
pub fn folded(r: &super::schema::Report) -> FoldedStacks {
    let mut f = FoldedStacks::new();
    for p in &r.processes {
        for s in &p.attribution.stacks {
            // FoldedStacks takes leaf first.
            let frames: Vec<&String> = s.user.iter().chain(s.kernel.iter()).rev().collect();
            f.add(s.class.name(), &p.comm, &frames, s.count);
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        attrib::mapping::parse_maps,
        collect::attribution::{AttribOpts, Attribution as Attrib},
    };
    use faultscope_common::attrib::{addr_key, MappingKey, SiteKey};

    /// A 7.3 arm64 stack of `contpte_convert`'s fentry program, inside an
    /// fexit-wrapped `handle_mm_fault`, as the kernel took it (leaf first).
    #[test]
    fn system_calls_are_named() {
        assert_eq!(syscall_name(0), None);
        let read = syscalls::Sysno::read as u32;
        assert_eq!(
            syscall_name(faultscope_common::attrib::syscall_key(read as i64)).as_deref(),
            Some("read(2)")
        );
        assert_eq!(
            syscall_name(faultscope_common::attrib::NOT_IN_SYSCALL).as_deref(),
            Some("no system call")
        );
        assert_eq!(syscall_name(100_000).as_deref(), Some("system call 99999"));
    }

    #[test]
    fn fentry_stacks_lose_their_trampolines() {
        let taken = "bpf_prog_3d46b06297f0d4c6_contpte_convert_fe+0x414 bpf_prog_3d46b06297f0d4c6_contpte_convert_fe+0x414 \
                     bpf_trampoline_6442527990+0x70 contpte_convert+0x8 contpte_ptep_set_access_flags+0x140 \
                     wp_page_reuse+0x120 do_wp_page+0x25c __handle_mm_fault+0xa08 handle_mm_fault+0xc4 \
                     bpf_trampoline_6442540524+0xc4 handle_mm_fault+0x8 do_page_fault+0x220 do_mem_abort+0x48";
        let frames: Vec<String> = taken.split_whitespace().map(String::from).collect();
        assert_eq!(
            without_trampolines(frames).join(" "),
            "contpte_convert+0x8 contpte_ptep_set_access_flags+0x140 wp_page_reuse+0x120 do_wp_page+0x25c \
             __handle_mm_fault+0xa08 handle_mm_fault+0xc4 do_page_fault+0x220 do_mem_abort+0x48"
        );
        // A kprobe's stack is left as it is.
        let kprobe: Vec<String> = ["contpte_convert+0x0", "wp_page_reuse+0x120"].map(String::from).into();
        assert_eq!(without_trampolines(kprobe.clone()), kprobe);
    }

    const MAPS: &str = "\
555d3e04e000-555d3e06f000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000400000 rw-p 00000000 00:00 0                          [anon:faultscope-named]
7f0000400000-7f0000800000 rw-p 00000000 00:00 0 
7f0000800000-7f0000a00000 rw-p 00000000 08:01 77                         /tmp/data (deleted)
7ffd1c7b9000-7ffd1c7da000 rw-p 00000000 00:00 0                          [stack]
";

    fn counts(pairs: &[(KernelClass, u64)]) -> ClassCounts {
        let mut c = ClassCounts::ZERO;
        for (k, n) in pairs {
            c.counts[*k as usize] = *n;
        }
        c
    }

    fn fixture(max_mappings: usize) -> (Snapshot, Attrib, Vec<(ReportClass, Availability)>) {
        let avail = vec![
            (
                ReportClass::Reuse,
                Availability::Measured { class: KernelClass::Reuse, timed: true, source: "k" },
            ),
            (
                ReportClass::Copy,
                Availability::Measured { class: KernelClass::Copy, timed: true, source: "k" },
            ),
            (ReportClass::ContpteUnfold, Availability::NotMeasurable("arm64 only".into())),
        ];
        let opts = AttribOpts { max_mappings, sites: Default::default(), ..AttribOpts::default() };
        let mut a = Attrib::new(opts, Ok(()));
        let mut h = MapsHistory::new(7);
        h.push(100, "attach", parse_maps(MAPS).unwrap());
        // Later the heap is gone, and another mapping starts where it was.
        h.push(
            300,
            "end",
            parse_maps(
                "555d3e04e000-555d3e050000 rw-p 00000000 00:00 0                          [anon:later]\n",
            )
            .unwrap(),
        );
        a.histories.insert(7, h);
        let mut snap = Snapshot::default();
        let mut put = |phase, start, c| {
            snap.mappings.insert(MappingKey { tgid: 7, phase, start }, c);
        };
        put(1, 0x555d3e04e000, counts(&[(KernelClass::Reuse, 10), (KernelClass::Copy, 2)]));
        put(1, 0x7f0000000000, counts(&[(KernelClass::Reuse, 1024)]));
        put(1, 0x7f0000400000, counts(&[(KernelClass::Copy, 5)]));
        put(1, 0x7f0000800000, counts(&[(KernelClass::Copy, 512)]));
        put(2, 0x7f0000800000, counts(&[(KernelClass::Copy, 1)]));
        put(1, addr_key(0x7ffd1c7b0123), counts(&[(KernelClass::Reuse, 3)]));
        snap.sites
            .insert(SiteKey { tgid: 7, phase: 1, ip: 0, class: KernelClass::Copy as u32, syscall: 0 }, 4);
        (snap, a, avail)
    }

    #[test]
    fn mappings_are_named_and_add_up_to_the_class_totals() {
        let (snap, a, avail) = fixture(16);
        let frames = |_: i32| Vec::new();
        let n = Namer::new(&a, &avail, &frames);
        let r = attribution(&snap, &n, 7, Some(1), 150);
        let names: Vec<&str> = r.mappings.iter().map(|m| m.mapping.as_str()).collect();
        assert_eq!(
            names,
            [
                "[anon:faultscope-named]",
                "/tmp/data (deleted)",
                "[heap]",
                "anon 0x7f0000400000-0x7f0000800000",
                "[stack]"
            ]
        );
        assert!(r.mappings[..4].iter().all(|m| m.exact));
        // An event outside a fault: named by the containing mapping, not exact.
        assert!(!r.mappings[4].exact);
        assert_eq!(r.mappings[1].size, 2 << 20);
        let sum = |m: ReportClass| r.mappings.iter().filter_map(|x| x.counts.get(&m)).sum::<u64>();
        assert_eq!((sum(ReportClass::Reuse), sum(ReportClass::Copy)), (10 + 1024 + 3, 2 + 5 + 512));
        // Not measurable classes have no counts in the rows.
        assert!(r.mappings.iter().all(|m| !m.counts.contains_key(&ReportClass::ContpteUnfold)));
        assert_eq!(
            r.sites,
            vec![SiteRow {
                class: ReportClass::Copy,
                ip: 0,
                site: "[no fault]".into(),
                mapping: None,
                syscall: None,
                count: 4
            }]
        );
        // Resolved later, the heap's start names the mapping there then.
        let r = attribution(&snap, &n, 7, Some(1), 400);
        assert!(r.mappings.iter().any(|m| m.mapping == "[anon:later]"));
    }

    #[test]
    fn copies_split_by_the_kind_of_mapping_and_the_rest_is_unattributed() {
        let (mut snap, mut a, avail) = fixture(1);
        // An executable private file mapping (a hot-patched text), and a
        // start no snapshot has.
        let text = "7f1000000000-7f1000200000 r-xp 00000000 08:01 78                         /usr/bin/x\n";
        a.histories.get_mut(&7).unwrap().push(120, "exec", parse_maps(text).unwrap());
        snap.mappings.insert(
            MappingKey { tgid: 7, phase: 1, start: 0x7f1000000000 },
            counts(&[(KernelClass::Copy, 4)]),
        );
        snap.mappings
            .insert(MappingKey { tgid: 7, phase: 1, start: 0x1000 }, counts(&[(KernelClass::Copy, 3)]));
        let frames = |_: i32| Vec::new();
        let n = Namer::new(&a, &avail, &frames);
        // Phase 1's copies: [heap] 2 and the anonymous region 5; the
        // private mapping of /tmp/data 512 and the text 4; 3 unresolved;
        // 2 the class counted that no mapping did.
        let s = copy_sources(&snap, &n, (7, Some(1)), 150, 2 + 5 + 512 + 4 + 3 + 2).unwrap();
        assert_eq!(s, CopySources { anon: 7, file: 516, file_exec: 4, unattributed: 5 });
        // The whole run adds phase 2's copy in /tmp/data; folding the rows
        // (max_mappings 1) loses nothing.
        let s = copy_sources(&snap, &n, (7, None), 150, 529).unwrap();
        assert_eq!((s.anon, s.file, s.unattributed), (7, 517, 5));
        // Without per-mapping counts there is no split.
        let b = Attrib::new(AttribOpts::default(), Err("off".into()));
        let n = Namer::new(&b, &avail, &frames);
        assert_eq!(copy_sources(&snap, &n, (7, None), 150, 529), None);
    }

    #[test]
    fn stacks_add_up_per_class_and_stack_and_fold_for_flame_graphs() {
        use faultscope_common::attrib::{StackKey, NO_STACK};
        let (mut snap, a, avail) = fixture(16);
        let key = |phase, class: KernelClass, user| StackKey {
            tgid: 7,
            phase,
            class: class as u32,
            user_stack: user,
            kernel_stack: NO_STACK,
            _pad: 0,
            kernel_caller: 0,
        };
        snap.stacks.insert(key(1, KernelClass::Copy, 5), 3);
        snap.stacks.insert(key(2, KernelClass::Copy, 5), 2);
        snap.stacks.insert(key(1, KernelClass::Reuse, 6), 1);
        // Leaf first, as the kernel's stack map has them: both stacks are
        // in the anonymous mappings of the fixture (no file to symbolize).
        let frames = |id: i32| match id {
            5 => vec![0x7f0000400010, 0x7f0000000020],
            6 => vec![0x7f0000000030],
            _ => vec![],
        };
        let n = Namer::new(&a, &avail, &frames);
        let r = attribution(&snap, &n, 7, None, 150);
        assert_eq!(r.stacks.len(), 2);
        let copy = r.stacks.iter().find(|s| s.class == ReportClass::Copy).unwrap();
        assert_eq!(copy.count, 5);
        // Outermost first in the report.
        assert_eq!(copy.user, ["[anon:faultscope-named]+0x20", "anon+0x10"]);
        let report = crate::report::schema::Report {
            processes: vec![crate::report::schema::Process {
                pid: 7,
                comm: "w".into(),
                classes: Default::default(),
                attribution: r,
                phases: vec![],
                kernel_check: None,
                container: None,
            }],
            ..Default::default()
        };
        let f = folded(&report);
        assert_eq!(
            f.to_folded(),
            "copy;w;[anon:faultscope-named]+0x20;anon+0x10 5\nreuse;w;[anon:faultscope-named]+0x30 1\n"
        );
    }

    #[test]
    fn the_direct_caller_goes_back_into_a_kernel_stack() {
        // contpte_convert <- (lr: __contpte_try_unfold) <- ptep_clear_flush
        assert_eq!(with_caller(vec![0x10, 0x30, 0x40], 0x20), [0x10, 0x20, 0x30, 0x40]);
        // None, or the unwinder has it (a tail call): unchanged.
        assert_eq!(with_caller(vec![0x10, 0x30], 0), [0x10, 0x30]);
        assert_eq!(with_caller(vec![0x10, 0x30], 0x30), [0x10, 0x30]);
        assert_eq!(with_caller(vec![], 0x30), Vec::<u64>::new());
        assert_eq!(with_caller(vec![0x10], 0x20), [0x10, 0x20]);
    }

    #[test]
    fn past_the_limit_mappings_fold_into_other_and_nothing_is_lost() {
        let (snap, a, avail) = fixture(2);
        let frames = |_: i32| Vec::new();
        let n = Namer::new(&a, &avail, &frames);
        let r = attribution(&snap, &n, 7, None, 150);
        assert_eq!(r.mappings.len(), 2);
        let o = r.mappings_other.as_ref().unwrap();
        assert_eq!(o.entries, 3);
        let sum = |m: ReportClass| {
            r.mappings.iter().filter_map(|x| x.counts.get(&m)).sum::<u64>()
                + o.counts.get(&m).copied().unwrap_or(0)
        };
        // The whole run: phase 2's copy too.
        assert_eq!((sum(ReportClass::Reuse), sum(ReportClass::Copy)), (1037, 520));
        let mut t = String::new();
        to_text(&mut t, &r);
        assert!(t.contains("other (3 mappings)"), "{t}");
        assert!(t.contains("[anon:faultscope-named] (4M)"), "{t}");
    }
}
