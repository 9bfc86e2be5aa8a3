//! The checks of `faultscope verify` (`cmd::verify`): assertions over a
//! report for CI, e.g.
//! `--expect contpte_unfold=0`, `--expect 'spurious<=1%'`,
//! `--expect 'reuse/folio<=1'`, `--expect 'copy.kernel<=10'` (one origin
//! of a class), `--expect 'copy.bytes<=64M'`, `--expect 'copy.size.64K>=1'`
//! (the new anon folios a class's faults mapped), `--expect
//! 'copy.source.file_exec=0'` (copies by the kind of mapping), `--expect
//! 'huge_pmd_wp.outcome.split=0'` (what came of PMD write-protect faults). Exit 0 when all hold, 1 when one fails (with the numbers),
//! 3 when a class is not measurable on that kernel.

use anyhow::Result;

use super::{
    file::Loaded,
    schema::{present_write_faults, ClassValue, CopySources, PmdOutcomes, Report},
};
use crate::{error::Refusal, kernel::classes::ReportClass};

pub const EXIT_FAILED: i32 = 1;
pub const EXIT_NOT_MEASURABLE: i32 = 3;

/// Which part of a report the checks sum: one process or all, one phase or
/// the whole run.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    pub phase: Option<String>,
    pub pid: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Expect {
    pub text: String,
    pub class: ReportClass,
    /// What of the class is compared.
    pub part: Part,
    pub per: Option<Per>,
    pub op: Op,
    pub value: f64,
    pub percent: bool,
}

/// What of a class an expectation reads.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Part {
    /// Its count.
    Count,
    /// `.user`, `.kernel`, `.gup`: its faults of that origin.
    Origin(&'static str),
    /// `.bytes`: the bytes of the new anon folios its faults mapped.
    Bytes,
    /// `.size.64K`: its new anon folios of that size (in bytes).
    Size(u64),
    /// `copy.source.file`: its copies in that kind of mapping
    /// ([`CopySources::NAMES`]).
    Source(&'static str),
    /// `huge_pmd_wp.outcome.split`: its faults of that outcome
    /// ([`PmdOutcomes::NAMES`]).
    Outcome(&'static str),
}

impl Part {
    /// `.kernel`, `.bytes`, `.size.64K`, or nothing: as written after the
    /// class.
    fn suffix(self) -> String {
        match self {
            Part::Count => String::new(),
            Part::Origin(o) => format!(".{o}"),
            Part::Bytes => ".bytes".into(),
            Part::Size(b) => format!(".size.{}", crate::units::size(b)),
            Part::Source(k) => format!(".source.{k}"),
            Part::Outcome(o) => format!(".outcome.{o}"),
        }
    }

    fn parse(text: &str, s: &str) -> Result<Part, String> {
        if s == "bytes" {
            return Ok(Part::Bytes);
        }
        if let Some(size) = s.strip_prefix("size.") {
            return crate::units::parse_size(size)
                .ok()
                .filter(|b| b.is_power_of_two() && *b >= crate::units::PAGE)
                .map(Part::Size)
                .ok_or_else(|| {
                    format!("{text:?}: .size.{size}: a folio size is a power of two from 4K (4K, 64K, 2M)")
                });
        }
        // A part of a class's split: `.source.KIND` (copy) or
        // `.outcome.OUTCOME` (huge_pmd_wp).
        for (prefix, names, part, what) in [
            ("source.", &CopySources::NAMES, Part::Source as fn(&'static str) -> Part, "a copy's source"),
            ("outcome.", &PmdOutcomes::NAMES, Part::Outcome, "an outcome of huge_pmd_wp"),
        ] {
            if let Some(k) = s.strip_prefix(prefix) {
                return names
                    .iter()
                    .find(|x| **x == k)
                    .map(|k| part(k))
                    .ok_or_else(|| format!("{text:?}: .{prefix}{k}: {what} is one of {}", names.join(", ")));
            }
        }
        match ORIGINS.iter().find(|x| **x == s) {
            Some(o) => Ok(Part::Origin(o)),
            None => Err(format!(
                "{text:?}: .{s}: after a class come an origin ({}), .bytes, .size.SIZE, .source.KIND or .outcome.OUTCOME",
                ORIGINS.join(", ")
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Per {
    Folio,
    Page,
}

pub fn parse(text: &str) -> Result<Expect, String> {
    let t = text;
    let ops = [
        ("<=", Op::Le),
        (">=", Op::Ge),
        ("==", Op::Eq),
        ("!=", Op::Ne),
        ("<", Op::Lt),
        (">", Op::Gt),
        ("=", Op::Eq),
    ];
    let (pos, len, op) = ops
        .iter()
        .filter_map(|(s, op)| t.find(s).map(|i| (i, s.len(), *op)))
        .min_by_key(|(i, l, _)| (*i, std::cmp::Reverse(*l)))
        .ok_or_else(|| format!("{text:?}: no comparison (use = != < <= > >=)"))?;
    // Spaces may stand around the operator, the '/' and the '%', never
    // inside a name or a number ("reuse<1 0" is not 10).
    let (lhs, rhs) = (t[..pos].trim(), t[pos + len..].trim());
    let (class, per) = match lhs.split_once('/').map(|(c, p)| (c.trim_end(), p.trim_start())) {
        None => (lhs, None),
        Some((c, "folio")) => (c, Some(Per::Folio)),
        Some((c, "page")) => (c, Some(Per::Page)),
        Some((_, other)) => return Err(format!("{text:?}: /{other}: only /folio and /page are known")),
    };
    let (class, part) = match class.split_once('.') {
        None => (class, Part::Count),
        Some((c, o)) => (c, Part::parse(text, o)?),
    };
    let Some(class) = ReportClass::from_name(class) else {
        let known: Vec<&str> = ReportClass::ALL.iter().map(|m| m.name()).collect();
        return Err(format!("{text:?}: {class:?} is not a class (known: {})", known.join(", ")));
    };
    let (num, percent) = match rhs.strip_suffix('%') {
        Some(n) => (n.trim_end(), true),
        None => (rhs, false),
    };
    if percent && per.is_some() {
        return Err(format!("{text:?}: a percentage cannot be per folio or page"));
    }
    if matches!(part, Part::Source(_)) && class != ReportClass::Copy {
        return Err(format!("{text:?}: only copy is split by source"));
    }
    if matches!(part, Part::Outcome(_)) && class != ReportClass::HugePmdWp {
        return Err(format!("{text:?}: only huge_pmd_wp is split by outcome"));
    }
    if percent && matches!(part, Part::Bytes | Part::Size(_)) {
        return Err(format!("{text:?}: new folios and their bytes are compared as numbers, not percentages"));
    }
    // A byte count may have a size's suffix (64M).
    if part == Part::Bytes {
        if let Ok(b) = crate::units::parse_size(num) {
            return Ok(Expect { text: text.to_string(), class, part, per, op, value: b as f64, percent });
        }
    }
    // Finite numbers only: nan compares false with everything, and inf
    // (also from 1e999) true or false with every count.
    let value = num
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && !num.contains(char::is_whitespace))
        .ok_or_else(|| format!("{text:?}: {num:?} is not a number"))?;
    Ok(Expect { text: text.to_string(), class, part, per, op, value, percent })
}

/// The origins a class splits into (the report's `origins` keys).
pub const ORIGINS: [&str; 3] = ["user", "kernel", "gup"];

/// The verdict on one expectation.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Pass(String),
    Fail(String),
    NotMeasurable(String),
}

/// The class `m`, or the part of it asked for, summed over the processes
/// and phases asked for.
fn sum_class(r: &Report, m: ReportClass, part: Part, o: &Scope) -> Result<u64, Verdict> {
    let mut total: u64 = 0;
    let mut found = false;
    for p in &r.processes {
        if o.pid.is_some_and(|pid| u64::from(p.pid) != pid) {
            continue;
        }
        let value = match &o.phase {
            None => p.classes.get(&m).cloned(),
            Some(ph) => match p.span(ph) {
                Some(s) => s.classes.get(&m).cloned(),
                None => continue,
            },
        };
        match value {
            Some(ClassValue::Measured(x)) => {
                let folios = || {
                    x.folios.as_ref().ok_or_else(|| {
                        Verdict::NotMeasurable(format!(
                            "{m}{} is not measurable on this kernel: the new folios' sizes are not read (see the report's probes: new_anon_rmap)",
                            part.suffix()
                        ))
                    })
                };
                let n = match part {
                    Part::Count => x.count,
                    Part::Origin(or) => x.origins.as_ref().and_then(|os| os.get(or)).ok_or_else(|| {
                        Verdict::NotMeasurable(format!(
                            "{m}.{or} is not measurable on this kernel: {m} is counted from {}, which does not see that origin",
                            x.source
                        ))
                    })?,
                    Part::Bytes => folios()?.bytes,
                    Part::Size(b) => folios()?.of_size(&crate::units::size(b)),
                    Part::Source(k) => x.sources.as_ref().and_then(|s| s.get(k)).ok_or_else(|| {
                        Verdict::NotMeasurable(format!(
                            "{m}.source.{k} is not measurable in this report: per-mapping counts were off"
                        ))
                    })?,
                    Part::Outcome(o) => x.outcomes.as_ref().and_then(|os| os.get(o)).ok_or_else(|| {
                        Verdict::NotMeasurable(format!(
                            "{m}.outcome.{o} is not measurable on this kernel: a THP copy or a split cannot be told (see the report's probes: new_anon_rmap, wp_page)"
                        ))
                    })?,
                };
                total = total.checked_add(n).ok_or_else(|| {
                    Verdict::Fail(format!("{m}: the counts of the report overflow when summed"))
                })?;
                found = true;
            }
            Some(ClassValue::NotMeasurable(n)) => {
                return Err(Verdict::NotMeasurable(format!(
                    "{m} is not measurable on this kernel: {}",
                    n.reason
                )))
            }
            None => {}
        }
    }
    if !found {
        let scope = o.phase.as_deref().map(|p| format!(" in phase {p}")).unwrap_or_default();
        return Err(Verdict::Fail(format!("no process of the report has class {m}{scope}")));
    }
    Ok(total)
}

pub fn check(r: &Report, e: &Expect, o: &Scope) -> Verdict {
    let v = match sum_class(r, e.class, e.part, o) {
        Ok(v) => v as f64,
        Err(verdict) => return verdict,
    };
    let (lhs, what) = if e.percent {
        // An origin: of its class; spurious: of write faults on present
        // pages; others: of all faults.
        let denom = if e.part != Part::Count {
            match sum_class(r, e.class, Part::Count, o) {
                Ok(n) => n as f64,
                Err(verdict) => return verdict,
            }
        } else if e.class == ReportClass::Spurious {
            present_write_faults(|m| {
                if m == ReportClass::Spurious {
                    Some(v as u64)
                } else {
                    sum_class(r, m, Part::Count, o).ok()
                }
            }) as f64
        } else {
            match sum_class(r, ReportClass::Faults, Part::Count, o) {
                Ok(n) => n as f64,
                Err(verdict) => return verdict,
            }
        };
        (
            if denom == 0.0 { 0.0 } else { 100.0 * v / denom },
            format!("{}% ({v} of {denom})", fmt(100.0 * v / denom.max(1.0))),
        )
    } else if let Some(per) = e.per {
        let Some(b) = &r.bench else {
            return Verdict::Fail(format!(
                "{}: /folio and /page need a bench report (the folio count is known there)",
                e.text
            ));
        };
        let n = match per {
            Per::Folio => b.folios,
            Per::Page => b.pages,
        }
        .max(1) as f64;
        (v / n, format!("{} ({v} / {n})", fmt(v / n)))
    } else {
        (v, fmt(v))
    };
    let ok = match e.op {
        Op::Eq => lhs == e.value,
        Op::Ne => lhs != e.value,
        Op::Lt => lhs < e.value,
        Op::Le => lhs <= e.value,
        Op::Gt => lhs > e.value,
        Op::Ge => lhs >= e.value,
    };
    let name = format!("{}{}", e.class, e.part.suffix());
    let msg = format!("{}: {name} is {what}", e.text);
    if ok {
        Verdict::Pass(msg)
    } else {
        Verdict::Fail(msg)
    }
}

/// What the checks add up: which processes and which span.
pub fn summed(r: &Report, o: &Scope) -> String {
    let procs: Vec<String> = r
        .processes
        .iter()
        .filter(|p| o.pid.is_none_or(|pid| u64::from(p.pid) == pid))
        .filter(|p| o.phase.as_ref().is_none_or(|ph| p.span(ph).is_some()))
        .map(|p| format!("{} ({})", p.pid, p.comm))
        .collect();
    format!(
        "verify: summing {} of {} processes ({}) over {}",
        procs.len(),
        r.processes.len(),
        procs.join(", "),
        o.phase.as_deref().map(|p| format!("phase {p}")).unwrap_or_else(|| "the whole run".into())
    )
}

fn fmt(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

/// A `--pid` or `--phase` that the report does not have is a typo, not a
/// failed check: refused.
pub fn check_scope(l: &Loaded, o: &Scope) -> Result<(), Refusal> {
    let r = &l.report;
    let procs: Vec<_> =
        r.processes.iter().filter(|p| o.pid.is_none_or(|pid| u64::from(p.pid) == pid)).collect();
    if let (Some(pid), true) = (o.pid, procs.is_empty()) {
        let known: Vec<String> = r.processes.iter().map(|p| p.pid.to_string()).collect();
        return Err(Refusal::new(format!(
            "--pid {pid}: {} has no such process (it has: {})",
            l.path,
            known.join(", ")
        )));
    }
    if let Some(ph) = &o.phase {
        if !procs.iter().any(|p| p.span(ph).is_some()) {
            let mut known: Vec<String> = procs.iter().flat_map(|p| p.spans()).map(|s| s.name).collect();
            known.sort();
            known.dedup();
            return Err(Refusal::new(format!(
                "--phase {ph}: {} has no such phase (it has: {})",
                l.path,
                known.join(", ")
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::{
        testing::{classes, not_measurable, phase, process},
        Bench, ClassValue, PhaseKind,
    };

    fn opts(phase: Option<&str>) -> Scope {
        Scope { phase: phase.map(String::from), pid: None }
    }

    fn report(unfold: ClassValue) -> Report {
        let mut p =
            process(1, vec![phase("mark:write", PhaseKind::Mark, classes(&[(ReportClass::Reuse, 16000)]))]);
        p.classes = classes(&[
            (ReportClass::Faults, 20000),
            (ReportClass::WpFaults, 16384),
            (ReportClass::HugePmdWp, 0),
            (ReportClass::Spurious, 164),
            (ReportClass::Reuse, 16384),
        ]);
        p.classes.insert(ReportClass::ContpteUnfold, unfold);
        Report {
            bench: Some(Bench { folios: 1024, pages: 16384, ..Bench::default() }),
            processes: vec![p],
            ..Report::default()
        }
    }

    #[test]
    fn parse_expressions() {
        let e = parse("contpte_unfold=0").unwrap();
        assert_eq!(
            (e.class, e.op, e.value, e.percent, e.per),
            (ReportClass::ContpteUnfold, Op::Eq, 0.0, false, None)
        );
        let e = parse("spurious <= 1%").unwrap();
        assert_eq!((e.op, e.value, e.percent), (Op::Le, 1.0, true));
        let e = parse("reuse/folio<=1").unwrap();
        assert_eq!(e.per, Some(Per::Folio));
        assert_eq!(parse("copy!=0").unwrap().op, Op::Ne);
        assert!(parse("reuse").is_err());
        assert!(parse("reuse/foo<1").is_err());
        assert!(parse("reuse<=x").is_err());
        // Spaces around the parts, never inside a number; finite numbers only.
        let e = parse(" reuse / folio <= 1 ").unwrap();
        assert_eq!((e.class, e.per, e.value), (ReportClass::Reuse, Some(Per::Folio), 1.0));
        assert_eq!(parse("spurious <= 1 %").unwrap().value, 1.0);
        for bad in ["reuse<1 0", "reuse<nan", "reuse<inf", "reuse<-inf", "reuse<1e999", "re use<1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        // A typo is refused, not read as a failed check.
        assert!(parse("resue=0").unwrap_err().contains("not a class"));
        let e = parse("copy.kernel<=10").unwrap();
        assert_eq!((e.class, e.part, e.value), (ReportClass::Copy, Part::Origin("kernel"), 10.0));
        assert_eq!(parse("reuse.gup/page<=1").unwrap().per, Some(Per::Page));
        assert!(parse("copy.kernal<=1")
            .unwrap_err()
            .contains("an origin (user, kernel, gup), .bytes, .size.SIZE, .source.KIND or .outcome.OUTCOME"));
    }

    #[test]
    fn origins_are_checked_apart() {
        use crate::report::schema::{Measured, Origins};
        let mut r = report(not_measurable("arm64 only"));
        let copy = |kernel: u64, gup: Option<u64>| {
            ClassValue::Measured(Measured {
                count: 100 + kernel + gup.unwrap_or(0),
                origins: Some(Origins { user: 100, kernel: Some(kernel), gup }),
                source: "kprobe".into(),
                ..Measured::default()
            })
        };
        r.processes[0].classes.insert(ReportClass::Copy, copy(30, Some(20)));
        let o = opts(None);
        let v = |t: &str, r: &Report| check(r, &parse(t).unwrap(), &o);
        assert!(matches!(v("copy.kernel<=10", &r), Verdict::Fail(m) if m.contains("copy.kernel is 30")));
        assert!(matches!(v("copy.gup=20", &r), Verdict::Pass(_)));
        assert!(matches!(v("copy.user=100", &r), Verdict::Pass(_)));
        // 30 of the 150 copies.
        assert!(matches!(v("copy.kernel<=20%", &r), Verdict::Pass(m) if m.contains("20% (30 of 150)")));
        // GUP unseen (tracepoint mode): not measurable, never 0.
        r.processes[0].classes.insert(ReportClass::Copy, copy(30, None));
        assert!(matches!(v("copy.gup=0", &r), Verdict::NotMeasurable(m) if m.contains("copy.gup")));
    }

    #[test]
    fn new_folios_by_size_and_bytes() {
        use crate::report::schema::{Folios, Measured};
        let e = parse("copy.bytes<=64M").unwrap();
        assert_eq!((e.part, e.value), (Part::Bytes, (64u64 << 20) as f64));
        let e = parse("copy.size.64K>=1").unwrap();
        assert_eq!((e.part, e.value), (Part::Size(64 << 10), 1.0));
        assert!(parse("copy.size.3K>=1").unwrap_err().contains("power of two from 4K"));
        assert!(parse("copy.bytes<=10%").unwrap_err().contains("not percentages"));
        let mut r = report(not_measurable("arm64 only"));
        // 16 copies of 4K and 2 of 64K: 192K.
        let by_order = [(0u32, 16u64), (4, 2)].into();
        let copy = |folios: Option<Folios>| {
            ClassValue::Measured(Measured {
                count: 18,
                folios: folios.map(Box::new),
                source: "k".into(),
                ..Measured::default()
            })
        };
        r.processes[0].classes.insert(ReportClass::Copy, copy(Some(Folios::from_orders(&by_order))));
        let o = opts(None);
        let v = |t: &str, r: &Report| check(r, &parse(t).unwrap(), &o);
        assert!(matches!(v("copy.bytes=192K", &r), Verdict::Pass(m) if m.contains("copy.bytes is 196608")));
        assert!(matches!(v("copy.size.64K=2", &r), Verdict::Pass(_)));
        assert!(matches!(v("copy.size.4K=16", &r), Verdict::Pass(_)));
        // A size none was mapped of is 0, where sizes are measured.
        assert!(matches!(v("copy.size.2M=0", &r), Verdict::Pass(_)));
        assert!(matches!(v("copy.size.16K>=1", &r), Verdict::Fail(m) if m.contains("copy.size.16K is 0")));
        // Not read on this kernel: not measurable, never 0.
        r.processes[0].classes.insert(ReportClass::Copy, copy(None));
        assert!(matches!(v("copy.bytes=0", &r), Verdict::NotMeasurable(m) if m.contains("copy.bytes")));
    }

    #[test]
    fn copies_by_the_kind_of_mapping() {
        use crate::report::schema::{CopySources, Measured};
        assert_eq!(parse("copy.source.file_exec=0").unwrap().part, Part::Source("file_exec"));
        assert!(parse("copy.source.shm=0").unwrap_err().contains("one of anon, file, file_exec"));
        assert!(parse("reuse.source.file=0").unwrap_err().contains("only copy"));
        let mut r = report(not_measurable("arm64 only"));
        let copy = |sources: Option<CopySources>| {
            ClassValue::Measured(Measured {
                count: 10,
                sources: sources.map(Box::new),
                source: "k".into(),
                ..Measured::default()
            })
        };
        let s = CopySources { anon: 6, file: 3, file_exec: 1, unattributed: 1 };
        r.processes[0].classes.insert(ReportClass::Copy, copy(Some(s)));
        let o = opts(None);
        let v = |t: &str, r: &Report| check(r, &parse(t).unwrap(), &o);
        assert!(matches!(v("copy.source.file=3", &r), Verdict::Pass(_)));
        assert!(matches!(v("copy.source.file_exec=0", &r), Verdict::Fail(m) if m.contains("is 1")));
        assert!(matches!(v("copy.source.unattributed<=1", &r), Verdict::Pass(_)));
        r.processes[0].classes.insert(ReportClass::Copy, copy(None));
        assert!(
            matches!(v("copy.source.anon=0", &r), Verdict::NotMeasurable(m) if m.contains("per-mapping"))
        );
    }

    #[test]
    fn pmd_faults_by_outcome() {
        use crate::report::schema::{Measured, PmdOutcomes};
        assert_eq!(parse("huge_pmd_wp.outcome.split=0").unwrap().part, Part::Outcome("split"));
        assert!(parse("huge_pmd_wp.outcome.moved=0")
            .unwrap_err()
            .contains("one of reused, copied, split, other"));
        assert!(parse("copy.outcome.split=0").unwrap_err().contains("only huge_pmd_wp"));
        let mut r = report(not_measurable("arm64 only"));
        let wp = |outcomes: Option<PmdOutcomes>| {
            ClassValue::Measured(Measured {
                count: 8,
                outcomes: outcomes.map(Box::new),
                source: "k".into(),
                ..Measured::default()
            })
        };
        r.processes[0].classes.insert(
            ReportClass::HugePmdWp,
            wp(Some(PmdOutcomes { reused: 6, split: 2, ..PmdOutcomes::default() })),
        );
        let o = opts(None);
        let v = |t: &str, r: &Report| check(r, &parse(t).unwrap(), &o);
        assert!(matches!(v("huge_pmd_wp.outcome.reused=6", &r), Verdict::Pass(_)));
        assert!(matches!(v("huge_pmd_wp.outcome.split=0", &r), Verdict::Fail(m) if m.contains("is 2")));
        r.processes[0].classes.insert(ReportClass::HugePmdWp, wp(None));
        assert!(matches!(v("huge_pmd_wp.outcome.copied=0", &r), Verdict::NotMeasurable(_)));
    }

    #[test]
    fn verdicts() {
        let r = report(
            classes(&[(ReportClass::ContpteUnfold, 512)]).remove(&ReportClass::ContpteUnfold).unwrap(),
        );
        let o = opts(None);
        assert!(
            matches!(check(&r, &parse("contpte_unfold=0").unwrap(), &o), Verdict::Fail(m) if m.contains("is 512"))
        );
        assert!(matches!(check(&r, &parse("contpte_unfold>=512").unwrap(), &o), Verdict::Pass(_)));
        // 164 of 16548 = 0.99%.
        assert!(matches!(check(&r, &parse("spurious<=1%").unwrap(), &o), Verdict::Pass(_)));
        assert!(matches!(check(&r, &parse("spurious<=0.5%").unwrap(), &o), Verdict::Fail(_)));
        assert!(
            matches!(check(&r, &parse("reuse/folio<=1").unwrap(), &o), Verdict::Fail(m) if m.contains("16 (16384 / 1024)"))
        );
        let o = opts(Some("mark:write"));
        assert!(matches!(check(&r, &parse("reuse<=16000").unwrap(), &o), Verdict::Pass(_)));
    }

    #[test]
    fn not_measurable_is_distinct() {
        let r = report(not_measurable("arm64 only"));
        let v = check(&r, &parse("contpte_unfold=0").unwrap(), &opts(None));
        assert!(matches!(v, Verdict::NotMeasurable(m) if m.contains("arm64 only")));
    }
}
