//! Attribution of the workload's `--mappings` run (`record --sites
//! reuse,copy --stacks reuse,copy --flamegraph`): three mappings of
//! different kinds written after the fork, each by a function of its own.
//! Checked per mapping against the page arithmetic and, where there is an
//! oracle, against its counts in the same address ranges; the sites and
//! stacks must name the writers.

use faultscope::{
    kernel::classes::ReportClass,
    report::schema::{Attribution, ClassValue, Process},
};
use serde::Deserialize;
use serde_json::Value;

use crate::{
    oracle::{count, Line, Oracle},
    Checklist,
};

/// A region of the workload's JSON (`regions[]`).
#[derive(Debug, Deserialize)]
pub struct Region {
    /// `named`, `file`, `heap`: also the oracle's range for its pages.
    pub role: String,
    /// The name column of /proc/self/maps ("" for unnamed anonymous memory).
    pub mapping: String,
    pub start: u64,
    pub end: u64,
    pub vma_start: u64,
    pub vma_end: u64,
    pub pages: u64,
    /// `reuse` or `copy`: what each write after the fork must be.
    pub class: String,
    /// The function that writes it.
    pub writer: String,
}

impl Region {
    /// The class its writes are (the workload's `class`), and the other.
    fn classes(&self) -> (ReportClass, ReportClass) {
        if self.class == "copy" {
            (ReportClass::Copy, ReportClass::Reuse)
        } else {
            (ReportClass::Reuse, ReportClass::Copy)
        }
    }

    /// The name the report gives its mapping.
    pub fn report_name(&self) -> String {
        if self.mapping.is_empty() {
            format!("anon {:#x}-{:#x}", self.vma_start, self.vma_end)
        } else {
            self.mapping.clone()
        }
    }

    /// Whether the region is its whole mapping (the heap pages are part of
    /// `[heap]`).
    fn whole(&self) -> bool {
        (self.start, self.end) == (self.vma_start, self.vma_end)
    }

    /// The oracle's range for the whole mapping (`heap-vma` for the heap).
    fn vma_range(&self) -> String {
        if self.whole() {
            self.role.clone()
        } else {
            format!("{}-vma", self.role)
        }
    }
}

/// The workload's `anon_name`: whether the kernel named the region.
#[derive(Debug, Deserialize)]
struct AnonName {
    set: bool,
    #[serde(default)]
    refused: Option<String>,
}

/// What the run around the report gives the check.
pub struct Run<'a> {
    /// The oracle of the run, where there is one (a guest).
    pub oracle: Option<&'a Oracle>,
    /// The kernel's CONFIG_ANON_VMA_NAME, where known: whether the region
    /// may be named.
    pub anon_vma_name: Option<bool>,
    /// The workload's binary: its writers' sites are in it.
    pub workload: &'a str,
    /// The flame graph's SVG.
    pub svg: &'a str,
}

/// Checks the report's process `p` of the workload's report `wl`.
pub fn check(cl: &mut Checklist, p: &Process, wl: &Value, run: &Run) {
    let regions: Vec<Region> = match serde_json::from_value(wl["regions"].clone()) {
        Ok(r) => r,
        Err(e) => return cl.expect(false, format!("the workload's regions[]: {e}")),
    };
    match serde_json::from_value::<AnonName>(wl["anon_name"].clone()) {
        Ok(anon) => check_anon_name(cl, &anon, run.anon_vma_name),
        Err(e) => cl.expect(false, format!("the workload's anon_name: {e}")),
    }
    cl.line(format!(
        "  {:<6} {:<44} {:>5} {:>6} {:>10} {:>10} {:>10}",
        "region", "mapping (report)", "class", "pages", "faultscope", "oracle", "oracle-own"
    ));
    for r in &regions {
        check_region(cl, p, run.oracle, r);
    }
    let a = &p.attribution;
    let folded = a.mappings_other.as_ref().map_or(0, |o| o.entries);
    cl.line(format!("  {} mapping rows, {folded} folded into other", a.mappings.len()));
    check_sums(cl, p);
    check_sources(cl, p, run.oracle, &regions);
    check_sites(cl, p, &regions, run.workload);
    check_stacks(cl, p, &regions, run.svg);
}

/// Classes each row and `mappings_other` split exactly: every class of the
/// fault path (`not_present` comes from the error-code tracepoint, which
/// has no VMA).
fn split_classes() -> impl Iterator<Item = ReportClass> {
    ReportClass::ALL.into_iter().filter(|m| *m != ReportClass::NotPresent)
}

/// Failures for `what` where the mapping rows plus `mappings_other` of `a`
/// do not add up to the class totals `total`.
fn sums(what: &str, a: &Attribution, total: impl Fn(ReportClass) -> Option<u64>) -> Vec<String> {
    let mut fails = Vec::new();
    for m in split_classes() {
        let Some(t) = total(m) else { continue };
        let rows: u64 = a.mappings.iter().filter_map(|r| r.counts.get(&m)).sum();
        let other = a.mappings_other.as_ref().and_then(|o| o.counts.get(&m)).copied().unwrap_or(0);
        if rows + other != t {
            fails.push(format!("{what}: {m}: mappings {rows} + other {other} != total {t}"));
        }
    }
    fails
}

/// `copy` split by the kind of mapping: the parts add up to the count; the
/// file region's copies (the oracle in its range) are in `file` and the
/// anonymous regions' in `anon`; nothing writes an executable mapping;
/// unattributed copies are at most those of the rows the report could not
/// name or folded.
fn check_sources(cl: &mut Checklist, p: &Process, oracle: Option<&Oracle>, regions: &[Region]) {
    let Some(ClassValue::Measured(copy)) = p.classes.get(&ReportClass::Copy) else {
        return cl.expect(false, "copy is not measured");
    };
    let Some(s) = copy.sources.as_ref() else {
        return cl.expect(false, "copy has no split by mapping (sources)");
    };
    // Without an oracle, the page arithmetic: the copied regions' pages.
    let in_region = |r: &Region| -> u64 {
        match oracle {
            Some(o) => o
                .range(p.pid, "ALL", &r.vma_range())
                .and_then(|l| l.get(ReportClass::Copy.name()).copied().flatten())
                .unwrap_or(0),
            None if r.class == "copy" => r.pages,
            None => 0,
        }
    };
    let in_kind =
        |file: bool| -> u64 { regions.iter().filter(|r| (r.role == "file") == file).map(in_region).sum() };
    let a = &p.attribution;
    let unnamed: u64 = a
        .mappings
        .iter()
        .filter(|m| m.mapping.starts_with("unresolved"))
        .map(|m| m.counts.get(&ReportClass::Copy).copied().unwrap_or(0))
        .chain(a.mappings_other.iter().map(|o| o.counts.get(&ReportClass::Copy).copied().unwrap_or(0)))
        .sum();
    let (file, anon) = (in_kind(true), in_kind(false));
    let by = if oracle.is_some() { "oracle's" } else { "pages" };
    cl.expect(
        s.anon + s.file + s.unattributed == copy.count
            && s.file >= file
            && s.anon >= anon
            && s.file_exec == 0
            && s.unattributed <= unnamed,
        format!(
            "copy {} in: anon {} (>= {by} {anon} in the anonymous regions), private file {} (>= {by} {file} in the file region), exec {} = 0, no mapping {} (<= {unnamed} unnamed or folded)",
            copy.count, s.anon, s.file, s.file_exec, s.unattributed
        ),
    );
}

/// The anonymous region's name: what the kernel can do, from its config.
fn check_anon_name(cl: &mut Checklist, anon: &AnonName, anon_vma_name: Option<bool>) {
    let how = match &anon.refused {
        None => "named".to_string(),
        Some(why) => format!("left unnamed: {why}"),
    };
    let ok = anon_vma_name.is_none_or(|cfg| anon.set == cfg);
    let cfg = anon_vma_name.map_or("unknown".into(), |y| if y { "y" } else { "not set" }.to_string());
    cl.expect(
        ok,
        format!("anonymous region: kernel CONFIG_ANON_VMA_NAME {cfg}; the workload's region was {how}"),
    );
}

/// One mapping: the report's row, the oracle in its range where there is
/// one, the pages.
fn check_region(cl: &mut Checklist, p: &Process, oracle: Option<&Oracle>, r: &Region) {
    let pid = p.pid;
    let name = r.report_name();
    let Some(row) = p.attribution.mappings.iter().find(|m| m.start == r.vma_start) else {
        return cl.expect(false, format!("{}: no mapping row starts at {:#x} ({name})", r.role, r.vma_start));
    };
    let (class, other) = r.classes();
    let got = |m: ReportClass| row.counts.get(&m).copied().unwrap_or(0);
    let vma = oracle.and_then(|o| o.range(pid, "ALL", &r.vma_range()));
    let own = oracle.and_then(|o| o.range(pid, "ALL", &r.role));
    let o = |l: Option<&Line>, m: ReportClass| l.and_then(|l| l.get(m.name()).copied().flatten());
    let cell = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
    cl.line(format!(
        "  {:<6} {:<44} {:>5} {:>6} {:>10} {:>10} {:>10}",
        r.role,
        row.mapping,
        class.name(),
        r.pages,
        got(class),
        cell(o(vma, class)),
        cell(o(own, class))
    ));
    cl.expect(
        row.mapping == name,
        format!("{}: the report names it {:?} (maps: {name:?})", r.role, row.mapping),
    );
    if oracle.is_some() {
        // Arithmetic: each page of the region written once after the fork,
        // nothing else writes it (the oracle over its own range).
        cl.expect(
            o(own, class) == Some(r.pages) && o(own, other) == Some(0),
            format!(
                "{}: oracle in the region: {class} {} = pages {}, {other} {} = 0",
                r.role,
                cell(o(own, class)),
                r.pages,
                cell(o(own, other))
            ),
        );
        // faultscope's row = the oracle in the whole mapping, every class
        // it splits. The heap mapping may have grown after the workload
        // read its end (malloc, for the JSON): new pages, first faults only.
        for m in [ReportClass::Faults, ReportClass::WpFaults, ReportClass::Reuse, ReportClass::Copy] {
            if m == ReportClass::Faults && !r.whole() {
                continue;
            }
            let ov = o(vma, m);
            if ov != Some(got(m)) {
                cl.expect(false, format!("{}: {m}: faultscope {} != oracle {}", r.role, got(m), cell(ov)));
            }
        }
    }
    if r.whole() {
        cl.expect(
            got(class) == r.pages && got(other) == 0,
            format!("{}: {class} {} = pages {}, {other} {} = 0", r.role, got(class), r.pages, got(other)),
        );
    } else {
        // [heap] also holds malloc's chunks, which the program writes after
        // the fork too: the oracle outside the region counts them; without
        // one, at most the tolerance of the workload's own writes.
        let (malloc, most) = match oracle {
            Some(_) => {
                let m = o(vma, class).unwrap_or(0).saturating_sub(o(own, class).unwrap_or(0));
                (m, m)
            }
            None => (0, crate::TOLERANCE),
        };
        cl.expect(
            (r.pages + malloc..=r.pages + most).contains(&got(class)),
            format!(
                "{}: {class} {} = the region's pages {} + malloc's own pages of [heap] ({malloc} to {most})",
                r.role,
                got(class),
                r.pages
            ),
        );
    }
}

/// The rows add up to the class totals, for the run and every phase.
fn check_sums(cl: &mut Checklist, p: &Process) {
    let mut sum_fails = sums("whole run", &p.attribution, |m| p.count(m));
    for ph in &p.phases {
        sum_fails.extend(sums(&ph.name, &ph.attribution, |m| count(&ph.classes, m)));
    }
    cl.expect(
        sum_fails.is_empty(),
        format!(
            "mapping rows + other = class totals (whole run and {} phases){}",
            p.phases.len(),
            if sum_fails.is_empty() { String::new() } else { format!(": {}", sum_fails.join("; ")) }
        ),
    );
}

/// Sites: every write of a region is one of its writer's instructions, in
/// the workload's binary.
fn check_sites(cl: &mut Checklist, p: &Process, regions: &[Region], workload: &str) {
    let a = &p.attribution;
    cl.line("  top sites:");
    for m in [ReportClass::Reuse, ReportClass::Copy] {
        let mut sites: Vec<_> = a.sites.iter().filter(|s| s.class == m).collect();
        sites.sort_by_key(|s| std::cmp::Reverse(s.count));
        for s in sites.iter().take(4) {
            cl.line(format!("    {:<6} {:>6}  {}", m.name(), s.count, s.site));
        }
        let other: u64 = a.sites_other.iter().filter(|f| f.class == m).map(|f| f.count).sum();
        let total: u64 = sites.iter().map(|s| s.count).sum::<u64>() + other;
        let t = p.count(m).unwrap_or(0);
        cl.expect(total == t, format!("{m}: sites {} + other {other} = total {t}", total - other));
        // The region with the most pages of the class: its writer is the
        // top site.
        if let Some(r) = regions.iter().filter(|r| r.class == m.name()).max_by_key(|r| r.pages) {
            let top = sites.first().map_or("none", |s| s.site.as_str());
            cl.expect(
                top.contains(&format!("::{}", r.writer)),
                format!("the top {m} site names {}: {top}", r.writer),
            );
        }
    }
    for r in regions {
        let (m, _) = r.classes();
        let mine: Vec<_> =
            a.sites.iter().filter(|s| s.class == m && s.site.contains(&format!("::{}", r.writer))).collect();
        let n: u64 = mine.iter().map(|s| s.count).sum();
        let modules: Vec<&str> = mine.iter().filter_map(|s| s.mapping.as_deref()).collect();
        let frame = own_frame(p, m);
        cl.expect(
            (r.pages..=r.pages + frame).contains(&n) && modules.iter().all(|m| *m == workload),
            format!(
                "{}: {m} sites in {} ({} instruction(s), in {modules:?}) = {n} = pages {} (+ up to {frame})",
                r.role,
                r.writer,
                mine.len(),
                r.pages
            ),
        );
    }
}

/// How many faults of class `m` beyond its region's pages a writer may
/// take: its own frame's stores (x86's spill of the pointer to the red
/// zone, arm64's `str` below `sp`) fault where the stack page holding them
/// was last written before the fork, which depends on where the kernel
/// placed the stack. A writer runs once and its frame spans at most two
/// pages, and each such fault is also in the `[stack]` row.
fn own_frame(p: &Process, m: ReportClass) -> u64 {
    let stack: u64 = p
        .attribution
        .mappings
        .iter()
        .filter(|row| row.mapping == "[stack]")
        .filter_map(|row| row.counts.get(&m))
        .sum();
    stack.min(2)
}

/// Stacks (user, --stacks reuse,copy): the writer is the leaf of each
/// write's stack; the flame graph (`svg`) names every writer.
fn check_stacks(cl: &mut Checklist, p: &Process, regions: &[Region], svg: &str) {
    for r in regions {
        let (m, _) = r.classes();
        let n: u64 = p
            .attribution
            .stacks
            .iter()
            .filter(|s| s.class == m && s.user.last().is_some_and(|f| f.contains(&format!("::{}", r.writer))))
            .map(|s| s.count)
            .sum();
        let frame = own_frame(p, m);
        cl.expect(
            (r.pages..=r.pages + frame).contains(&n),
            format!(
                "{}: {m} stacks with leaf {} = {n} = pages {} (+ up to {frame})",
                r.role, r.writer, r.pages
            ),
        );
    }
    let titles: Vec<&str> =
        svg.split("<title>").skip(1).filter_map(|t| t.split_once("</title>").map(|(t, _)| t)).collect();
    let named: Vec<&str> = regions
        .iter()
        .map(|r| r.writer.as_str())
        .filter(|w| titles.iter().any(|t| t.contains(&format!("::{w}"))))
        .collect();
    cl.expect(
        !svg.is_empty() && named.len() == regions.len(),
        format!("flame graph: {} bytes, {} frame titles, naming {named:?}", svg.len(), titles.len()),
    );
}
