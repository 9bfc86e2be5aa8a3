//! `faultscope verify`: assertions over a report for CI, e.g.
//! `--expect contpte_unfold=0`, `--expect 'spurious<=1%'`,
//! `--expect 'reuse/folio<=1'`. Exit 0 when all hold, 1 when one fails
//! (with the numbers), 3 when a class is not measurable on that kernel.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use crate::{
    error::Refusal,
    findings,
    reportfile::{class, ClassValue, Report},
};

pub const EXIT_FAILED: i32 = 1;
pub const EXIT_NOT_MEASURABLE: i32 = 3;

#[derive(Args, Debug)]
pub struct VerifyOpts {
    /// An assertion: CLASS[/folio|/page] OP NUMBER[%], OP one of = == != < <= > >=.
    #[arg(long = "expect", required = true)]
    pub expects: Vec<String>,
    /// Only this phase (a bench step such as mark:write, or a phase name).
    #[arg(long)]
    pub phase: Option<String>,
    /// Only this process (default: all processes of the report, summed).
    #[arg(long)]
    pub pid: Option<u64>,
    /// The report to check; or, after `--`, a faultscope command to run
    /// (e.g. `-- bench seq --folio 64K`) whose report is checked.
    pub report: Option<PathBuf>,
    #[arg(last = true)]
    pub run: Vec<String>,
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
    pub class: String,
    pub per: Option<Per>,
    pub op: Op,
    pub value: f64,
    pub percent: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Per {
    Folio,
    Page,
}

pub fn parse(text: &str) -> Result<Expect, String> {
    let t: String = text.chars().filter(|c| !c.is_whitespace()).collect();
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
    let (lhs, rhs) = (&t[..pos], &t[pos + len..]);
    let (class, per) = match lhs.split_once('/') {
        None => (lhs, None),
        Some((c, "folio")) => (c, Some(Per::Folio)),
        Some((c, "page")) => (c, Some(Per::Page)),
        Some((_, other)) => return Err(format!("{text:?}: /{other}: only /folio and /page are known")),
    };
    if class.is_empty() || !class.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("{text:?}: {class:?} is not a class name"));
    }
    let (num, percent) = match rhs.strip_suffix('%') {
        Some(n) => (n, true),
        None => (rhs, false),
    };
    if percent && per.is_some() {
        return Err(format!("{text:?}: a percentage cannot be per folio or page"));
    }
    let value: f64 = num.parse().map_err(|_| format!("{text:?}: {num:?} is not a number"))?;
    Ok(Expect { text: text.to_string(), class: class.to_string(), per, op, value, percent })
}

/// The verdict on one expectation.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Pass(String),
    Fail(String),
    NotMeasurable(String),
}

fn sum_class(r: &Report, name: &str, o: &VerifyOpts) -> Result<u64, Verdict> {
    let mut total = 0;
    let mut found = false;
    for p in r.processes() {
        if o.pid.is_some_and(|pid| p["pid"].as_u64() != Some(pid)) {
            continue;
        }
        let classes = match &o.phase {
            None => p["classes"].clone(),
            Some(ph) => match findings::span_classes(p, ph) {
                Some(c) => c,
                None => continue,
            },
        };
        match class(&classes, name) {
            ClassValue::Count(n) => {
                total += n;
                found = true;
            }
            ClassValue::NotMeasurable(why) => {
                return Err(Verdict::NotMeasurable(format!("{name} is not measurable on this kernel: {why}")))
            }
            ClassValue::Absent => {}
        }
    }
    if !found {
        let scope = o.phase.as_deref().map(|p| format!(" in phase {p}")).unwrap_or_default();
        return Err(Verdict::Fail(format!("no process of the report has class {name}{scope}")));
    }
    Ok(total)
}

pub fn check(r: &Report, e: &Expect, o: &VerifyOpts) -> Verdict {
    let v = match sum_class(r, &e.class, o) {
        Ok(v) => v as f64,
        Err(verdict) => return verdict,
    };
    let (lhs, what) = if e.percent {
        // spurious: of write faults on present pages; others: of all faults.
        let denom = if e.class == "spurious" {
            ["wp_faults", "huge_pmd_wp"].iter().map(|c| sum_class(r, c, o).unwrap_or(0)).sum::<u64>() as f64
                + v
        } else {
            match sum_class(r, "faults", o) {
                Ok(n) => n as f64,
                Err(verdict) => return verdict,
            }
        };
        (
            if denom == 0.0 { 0.0 } else { 100.0 * v / denom },
            format!("{}% ({v} of {denom})", fmt(100.0 * v / denom.max(1.0))),
        )
    } else if let Some(per) = e.per {
        let Some(b) = r.bench() else {
            return Verdict::Fail(format!(
                "{}: /folio and /page need a bench report (the folio count is known there)",
                e.text
            ));
        };
        let n = match per {
            Per::Folio => b["folios"].as_f64(),
            Per::Page => b["pages"].as_f64(),
        }
        .unwrap_or(0.0)
        .max(1.0);
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
    let msg = format!("{}: {} is {what}", e.text, e.class);
    if ok {
        Verdict::Pass(msg)
    } else {
        Verdict::Fail(msg)
    }
}

fn fmt(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

pub fn run(o: &VerifyOpts) -> Result<i32> {
    let expects: Vec<Expect> =
        o.expects.iter().map(|e| parse(e)).collect::<Result<_, _>>().map_err(Refusal::new)?;
    let report = match (&o.report, o.run.is_empty()) {
        (Some(p), true) => Report::load(p)?,
        (None, false) => live(&o.run)?,
        _ => return Err(Refusal::new("give a report file, or a faultscope command after --").into()),
    };
    let mut code = 0;
    for e in &expects {
        match check(&report, e, o) {
            Verdict::Pass(m) => println!("PASS {m}"),
            Verdict::Fail(m) => {
                println!("FAIL {m}");
                if code == 0 {
                    code = EXIT_FAILED;
                }
            }
            Verdict::NotMeasurable(m) => {
                println!("NOT MEASURABLE {}: {m}", e.text);
                code = EXIT_NOT_MEASURABLE;
            }
        }
    }
    Ok(code)
}

/// Runs `faultscope ARGS --json TMP` and loads its report.
fn live(args: &[String]) -> Result<Report> {
    if !matches!(args.first().map(String::as_str), Some("bench" | "record")) {
        return Err(Refusal::new("after --, give a faultscope bench or record command").into());
    }
    let dir = std::env::temp_dir().join(format!("faultscope-verify-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let json = dir.join("report.json");
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg(&args[0]).arg("--json").arg(&json).args(&args[1..]);
    let st = cmd.status()?;
    if !st.success() {
        return Err(Refusal::new(format!("the run failed ({st}); nothing to verify")).into());
    }
    let r = Report::load(&json)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn opts(phase: Option<&str>) -> VerifyOpts {
        VerifyOpts { expects: vec![], phase: phase.map(String::from), pid: None, report: None, run: vec![] }
    }

    fn report(unfold: serde_json::Value) -> Report {
        Report::from_json(
            "t".into(),
            json!({"schema": "faultscope/1", "bench": {"folios": 1024, "pages": 16384},
                "processes": [{"pid": 1, "classes": {
                    "faults": {"count": 20000}, "wp_faults": {"count": 16384}, "huge_pmd_wp": {"count": 0},
                    "spurious": {"count": 164}, "reuse": {"count": 16384}, "contpte_unfold": unfold},
                  "phases": [{"name": "mark:write", "classes": {"reuse": {"count": 16000}}}]}]}),
        )
        .unwrap()
    }

    #[test]
    fn parse_expressions() {
        let e = parse("contpte_unfold=0").unwrap();
        assert_eq!(
            (e.class.as_str(), e.op, e.value, e.percent, e.per),
            ("contpte_unfold", Op::Eq, 0.0, false, None)
        );
        let e = parse("spurious <= 1%").unwrap();
        assert_eq!((e.op, e.value, e.percent), (Op::Le, 1.0, true));
        let e = parse("reuse/folio<=1").unwrap();
        assert_eq!(e.per, Some(Per::Folio));
        assert_eq!(parse("copy!=0").unwrap().op, Op::Ne);
        assert!(parse("reuse").is_err());
        assert!(parse("reuse/foo<1").is_err());
        assert!(parse("reuse<=x").is_err());
        assert!(parse("a b<1").unwrap().class == "ab");
    }

    #[test]
    fn verdicts() {
        let r = report(json!({"count": 512}));
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
        let r = report(json!({"measurable": false, "reason": "arm64 only"}));
        let v = check(&r, &parse("contpte_unfold=0").unwrap(), &opts(None));
        assert!(matches!(v, Verdict::NotMeasurable(m) if m.contains("arm64 only")));
    }
}
