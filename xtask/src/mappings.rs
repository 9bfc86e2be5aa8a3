//! The attribution guest case (`mappings4k` of the foundation test):
//! `faultscope record --sites reuse,copy --stacks reuse,copy --flamegraph`
//! over `fs-workload --mappings`, which writes three mappings of
//! different kinds after the fork, each by a function of its own. Checked
//! per mapping against the page arithmetic and against the oracle's counts
//! in the same address ranges; the sites and stacks must name the writers.

use anyhow::{Context as _, Result};
use faultscope::{
    kernel::classes::ReportClass,
    report::schema::{Attribution, ClassValue, Process},
};
use serde::Deserialize;

use crate::{
    check::{count, Checklist, Oracle},
    vm::GuestRun,
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
    /// The class its writes are (the workload's `class`).
    fn report_class(&self) -> ReportClass {
        if self.class == "copy" {
            ReportClass::Copy
        } else {
            ReportClass::Reuse
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

    /// The oracle's range for the whole mapping: the region is one, but the
    /// heap pages are part of `[heap]` (`heap-vma`).
    fn vma_range(&self) -> String {
        if (self.start, self.end) == (self.vma_start, self.vma_end) {
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

/// The workload's binary in the guest: its writers' sites are in it.
const WORKLOAD: &str = "/fs-workload";

/// Checks the case. `anon_vma_name`: the guest kernel's CONFIG_ANON_VMA_NAME
/// (from its package's config; `None` when the package has none), which
/// decides whether the region may be named.
pub fn check(
    run: &GuestRun,
    case: &str,
    p: &Process,
    wl: &serde_json::Value,
    anon_vma_name: Option<bool>,
    table: &mut String,
    fails: &mut Vec<String>,
) -> Result<()> {
    let regions: Vec<Region> =
        serde_json::from_value(wl["regions"].clone()).context("the workload's regions[]")?;
    let anon: AnonName =
        serde_json::from_value(wl["anon_name"].clone()).context("the workload's anon_name")?;
    let oracle = crate::check::oracle_of(run, &format!("{case}.oracle"))?;
    let mut cl = Checklist::new(case, table, fails);
    check_anon_name(&mut cl, &anon, anon_vma_name);
    cl.line(format!(
        "  {:<6} {:<44} {:>5} {:>6} {:>10} {:>10} {:>10}",
        "region", "mapping (report)", "class", "pages", "faultscope", "oracle", "oracle-own"
    ));
    for r in &regions {
        check_region(&mut cl, p, &oracle, r);
    }
    let a = &p.attribution;
    let folded = a.mappings_other.as_ref().map_or(0, |o| o.entries);
    cl.line(format!("  {} mapping rows, {folded} folded into other", a.mappings.len()));
    check_sums(&mut cl, p);
    check_sources(&mut cl, p, &oracle, &regions);
    check_sites(&mut cl, p, &regions);
    check_stacks(&mut cl, run, case, p, &regions);
    Ok(())
}

/// `copy` split by the kind of mapping: the parts add up to the count; the
/// file region's copies (the oracle in its range) are in `file` and the
/// anonymous regions' in `anon`; nothing writes an executable mapping;
/// unattributed copies are at most those of the rows the report could not
/// name or folded.
fn check_sources(cl: &mut Checklist, p: &Process, oracle: &Oracle, regions: &[Region]) {
    let Some(ClassValue::Measured(copy)) = p.classes.get(&ReportClass::Copy) else {
        cl.expect(false, "copy is not measured");
        return;
    };
    let Some(s) = copy.sources.as_ref() else {
        cl.expect(false, "copy has no split by mapping (sources)");
        return;
    };
    let in_oracle = |file: bool| -> u64 {
        regions
            .iter()
            .filter(|r| (r.role == "file") == file)
            .filter_map(|r| oracle.range(p.pid, "ALL", &r.vma_range()))
            .filter_map(|l| l.get(ReportClass::Copy.name()).copied().flatten())
            .sum()
    };
    let a = &p.attribution;
    let unnamed: u64 = a
        .mappings
        .iter()
        .filter(|m| m.mapping.starts_with("unresolved"))
        .map(|m| m.counts.get(&ReportClass::Copy).copied().unwrap_or(0))
        .chain(a.mappings_other.iter().map(|o| o.counts.get(&ReportClass::Copy).copied().unwrap_or(0)))
        .sum();
    let (file, anon) = (in_oracle(true), in_oracle(false));
    cl.expect(
        s.anon + s.file + s.unattributed == copy.count
            && s.file >= file
            && s.anon >= anon
            && s.file_exec == 0
            && s.unattributed <= unnamed,
        format!(
            "copy {} in: anon {} (>= oracle's {anon} in the anonymous regions), private file {} (>= oracle's {file} in the file region), exec {} = 0, no mapping {} (<= {unnamed} unnamed or folded)",
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
    let ok = match anon_vma_name {
        Some(cfg) => anon.set == cfg,
        None => true,
    };
    let cfg = anon_vma_name
        .map_or("unknown (no config in the package)".into(), |y| if y { "y" } else { "not set" }.to_string());
    cl.expect(
        ok,
        format!("anonymous region: kernel CONFIG_ANON_VMA_NAME {cfg}; the workload's region was {how}"),
    );
}

/// One mapping: the report's row, the oracle in its range, the pages.
fn check_region(cl: &mut Checklist, p: &Process, oracle: &Oracle, r: &Region) {
    let pid = p.pid;
    let name = r.report_name();
    let Some(row) = p.attribution.mappings.iter().find(|m| m.start == r.vma_start) else {
        cl.expect(false, format!("{}: no mapping row starts at {:#x} ({name})", r.role, r.vma_start));
        return;
    };
    let (class, other) = match r.class.as_str() {
        "copy" => (ReportClass::Copy, ReportClass::Reuse),
        _ => (ReportClass::Reuse, ReportClass::Copy),
    };
    let got = |m: ReportClass| row.counts.get(&m).copied().unwrap_or(0);
    let vma = oracle.range(pid, "ALL", &r.vma_range());
    let own = oracle.range(pid, "ALL", &r.role);
    let o =
        |l: Option<&crate::check::Line>, m: ReportClass| l.and_then(|l| l.get(m.name()).copied().flatten());
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
    // faultscope's row = the oracle in the whole mapping, every class it
    // splits. The heap mapping may have grown after the workload read its
    // end (malloc, for the JSON): new pages, first faults only.
    let whole = r.vma_range() == r.role;
    for m in [ReportClass::Faults, ReportClass::WpFaults, ReportClass::Reuse, ReportClass::Copy] {
        if m == ReportClass::Faults && !whole {
            continue;
        }
        let ov = o(vma, m);
        if ov != Some(got(m)) {
            cl.expect(false, format!("{}: {m}: faultscope {} != oracle {}", r.role, got(m), cell(ov)));
        }
    }
    if whole {
        cl.expect(
            got(class) == r.pages && got(other) == 0,
            format!(
                "{}: {class} {} = pages {}, {other} {} = 0 (= oracle)",
                r.role,
                got(class),
                r.pages,
                got(other)
            ),
        );
    } else {
        // [heap] also holds malloc's chunks, which the program writes
        // after the fork too: the oracle outside the region counts them.
        let malloc = o(vma, class).unwrap_or(0).saturating_sub(o(own, class).unwrap_or(0));
        cl.expect(
            got(class) == r.pages + malloc,
            format!(
                "{}: {class} {} = the region's pages {} + malloc's own pages of [heap] {malloc} (= oracle)",
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

/// Sites: every write of a region is one of its writer's instructions.
fn check_sites(cl: &mut Checklist, p: &Process, regions: &[Region]) {
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
        let m = r.report_class();
        let mine: Vec<_> =
            a.sites.iter().filter(|s| s.class == m && s.site.contains(&format!("::{}", r.writer))).collect();
        let n: u64 = mine.iter().map(|s| s.count).sum();
        let modules: Vec<&str> = mine.iter().filter_map(|s| s.mapping.as_deref()).collect();
        cl.expect(
            n == r.pages && modules.iter().all(|m| *m == WORKLOAD),
            format!(
                "{}: {m} sites in {} ({} instruction(s), in {modules:?}) = {n} = pages {}",
                r.role,
                r.writer,
                mine.len(),
                r.pages
            ),
        );
    }
}

/// Stacks (user, --stacks reuse,copy): the writer is the leaf of each
/// write's stack; the flame graph names every writer.
fn check_stacks(cl: &mut Checklist, run: &GuestRun, case: &str, p: &Process, regions: &[Region]) {
    for r in regions {
        let m = r.report_class();
        let n: u64 = p
            .attribution
            .stacks
            .iter()
            .filter(|s| s.class == m && s.user.last().is_some_and(|f| f.contains(&format!("::{}", r.writer))))
            .map(|s| s.count)
            .sum();
        cl.expect(
            n == r.pages,
            format!("{}: {m} stacks with leaf {} = {n} = pages {}", r.role, r.writer, r.pages),
        );
    }
    let svg = run.marker("SVG-BYTES", case).unwrap_or_default();
    let titles = run.section(&format!("{case}.svg-titles")).unwrap_or("");
    let bytes: u64 = svg.parse().unwrap_or(0);
    let named: Vec<&str> = regions
        .iter()
        .map(|r| r.writer.as_str())
        .filter(|w| titles.lines().any(|l| l.contains(&format!("::{w}"))))
        .collect();
    cl.expect(
        bytes > 0 && named.len() == regions.len(),
        format!(
            "flame graph: {} bytes, {} frame titles, naming {named:?}",
            if bytes > 0 { bytes.to_string() } else { format!("none ({svg})") },
            titles.lines().count()
        ),
    );
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::WORKLOAD;

    use crate::{check::testing::*, check::CaseResult, foundation::check_case};

    fn row(name: &str, start: u64, end: u64, counts: Value) -> Value {
        json!({"mapping": name, "start": start, "end": end, "size": end - start, "exact": true, "counts": counts})
    }

    fn site(class: &str, ip: u64, site: &str, mapping: &str, count: u64) -> Value {
        json!({"class": class, "ip": ip, "site": site, "mapping": mapping, "count": count})
    }

    fn writer(f: &str) -> String {
        format!("fs_workload::{f}+0x20 (fs-workload)")
    }

    fn range(name: &str, f: u64, wp: u64, reuse: u64, copy: u64) -> String {
        format!(
            "oracle-range tgid=7 phase=ALL range={name} faults={f} wp_faults={wp} reuse={reuse} copy={copy} \
             wp_shared=0 spurious=0 huge_pmd_wp=0 nowp=0\n"
        )
    }

    /// pid 7 of `bench_json` (faults 39, reuse 20, copy 1) over three
    /// regions: 8 pages reused in an unnamed anonymous mapping, 1 copied in a
    /// file, 4 reused in [heap] beside 2 of malloc's; 6 reuses in [stack].
    fn case(edit: impl Fn(&mut Value, &mut String)) -> CaseResult {
        let mut fs: Value = serde_json::from_str(&bench_json()).unwrap();
        let p = &mut fs["processes"][0];
        p["phases"] = json!([]);
        p["mappings"] = json!([
            row(
                "anon 0x1000000-0x1008000",
                0x100_0000,
                0x100_8000,
                json!({"faults": 16, "wp_faults": 8, "reuse": 8})
            ),
            row("/tmp/f.dat", 0x200_0000, 0x200_1000, json!({"faults": 2, "wp_faults": 1, "copy": 1})),
            row("[heap]", 0x50_0000, 0x52_0000, json!({"faults": 10, "wp_faults": 6, "reuse": 6})),
            row("[stack]", 0x7f_f000, 0x80_0000, json!({"faults": 11, "wp_faults": 6, "reuse": 6})),
        ]);
        p["sites"] = json!([
            site("reuse", 1, &writer("write_named_region"), WORKLOAD, 8),
            site("reuse", 2, "malloc+0x1 (libc.so.6)", "/lib/libc.so.6", 8),
            site("reuse", 3, &writer("write_heap"), WORKLOAD, 4),
            site("copy", 4, &writer("write_file_mapping"), WORKLOAD, 1),
        ]);
        p["stacks"] = json!([
            {"class": "reuse", "user": ["main", writer("write_named_region")], "count": 8},
            {"class": "reuse", "user": [writer("write_heap")], "count": 4},
            {"class": "copy", "user": [writer("write_file_mapping")], "count": 1},
        ]);
        let region = |role: &str,
                      mapping: &str,
                      (s, e): (u64, u64),
                      (vs, ve): (u64, u64),
                      pages: u64,
                      class: &str,
                      w: &str| {
            json!({"role": role, "mapping": mapping, "start": s, "end": e, "vma_start": vs, "vma_end": ve,
                   "pages": pages, "class": class, "writer": w})
        };
        let named = (0x100_0000, 0x100_8000);
        let mut wl = json!({
            "pid": 7, "pages": 8, "minflt_total": 38, "majflt_total": 1,
            "anon_name": {"requested": "faultscope-named", "set": false,
                          "refused": "prctl(PR_SET_VMA_ANON_NAME) refused: Invalid argument"},
            "regions": [
                region("named", "", named, named, 8, "reuse", "write_named_region"),
                region("file", "/tmp/f.dat", (0x200_0000, 0x200_1000), (0x200_0000, 0x200_1000), 1, "copy",
                       "write_file_mapping"),
                region("heap", "[heap]", (0x51_0000, 0x51_4000), (0x50_0000, 0x52_0000), 4, "reuse", "write_heap"),
            ],
        });
        let mut oracle = X86_UNKNOWN.to_string()
            + &oracle_line("ALL", 39, 20, 1)
            + &range("named", 16, 8, 8, 0)
            + &range("file", 2, 1, 0, 1)
            + &range("heap", 8, 4, 4, 0)
            + &range("heap-vma", 10, 6, 6, 0);
        edit(&mut wl, &mut oracle);
        let markers = format!(
            "@@FS-RC m 0\n@@FS-OVERRUN m 0\n@@FS-KPROBES-LEFT m 0\n@@FS-SVG-BYTES m 900\n{X86_REFUSED}"
        );
        let titles = ["write_named_region", "write_file_mapping", "write_heap"]
            .map(|w| format!("<title>{} (1 faults, 1%)</title>", writer(w)))
            .join("\n");
        let run = guest_run(
            &markers,
            &[
                ("m.fs.json", &fs.to_string()),
                ("m.wl.json", &wl.to_string()),
                ("m.oracle", &oracle),
                ("m.svg-titles", &titles),
            ],
        );
        check_case(&run, "m", "mappings", Some(false)).unwrap()
    }

    #[test]
    fn each_mapping_against_its_pages_and_the_oracle_in_its_range() {
        let r = case(|_, _| {});
        assert!(r.failures.is_empty(), "{:?}\n{}", r.failures, r.table);
        for line in [
            "  named  anon 0x1000000-0x1008000                     reuse      8          8          8          8\n",
            "ok   heap: reuse 6 = the region's pages 4 + malloc's own pages of [heap] 2 (= oracle)",
            "ok   the top reuse site names write_named_region",
            "ok   file: copy sites in write_file_mapping (1 instruction(s), in [\"/fs-workload\"]) = 1 = pages 1",
            "ok   mapping rows + other = class totals (whole run and 0 phases)",
            "ok   flame graph: 900 bytes, 3 frame titles",
            "ok   copy 1 in: anon 0 (>= oracle's 0 in the anonymous regions), private file 1 (>= oracle's 1 in the file region), exec 0 = 0",
        ] {
            assert!(r.table.contains(line), "no {line:?} in\n{}", r.table);
        }
        // The oracle saw another copy in the file: faultscope's row and the
        // page arithmetic disagree with it.
        let r = case(|_, o| {
            *o = o.replace(
                "range=file faults=2 wp_faults=1 reuse=0 copy=1",
                "range=file faults=3 wp_faults=2 reuse=0 copy=2",
            )
        });
        assert!(
            r.failures.contains(&"m: file: copy: faultscope 1 != oracle 2".to_string()),
            "{:?}",
            r.failures
        );
        assert!(
            r.failures.iter().any(|f| f.contains("file: oracle in the region: copy 2 = pages 1")),
            "{:?}",
            r.failures
        );
        assert!(
            r.failures.iter().any(|f| f.contains("private file 1 (>= oracle's 2 in the file region)")),
            "{:?}",
            r.failures
        );
        // A kernel that can name anonymous memory must have named it.
        let r = case(|wl, _| wl["anon_name"]["set"] = json!(true));
        assert!(
            r.failures.iter().any(|f| f.contains("anonymous region: kernel CONFIG_ANON_VMA_NAME not set")),
            "{:?}",
            r.failures
        );
        // The region's mapping named otherwise than maps does.
        let r = case(|wl, _| wl["regions"][1]["mapping"] = json!("/tmp/g.dat"));
        assert!(
            r.failures.iter().any(|f| f.contains("file: the report names it \"/tmp/f.dat\"")),
            "{:?}",
            r.failures
        );
    }
}
