//! Reading and writing report files. A loaded report is checked once
//! against the schema types, so the rest reads fields, never guesses; a
//! report is written whole or not at all.

use std::{fs, io::Read as _, path::Path};

use anyhow::Result;

use super::schema::{ClassValue, Report, BENCH_SERIES_SCHEMA, SCHEMA};
use crate::error::Refusal;
use crate::kernel::classes::FORMER_NAMES;

/// A report read back, with the file it came from.
pub struct Loaded {
    pub path: String,
    pub report: Report,
}

/// The largest input faultscope reads (a report or a bench series): far
/// above a real report (a 301-process fork tree's is about 200 MB), and a
/// bound on what a wrong path (`/dev/urandom`, a FIFO that never ends)
/// can make it allocate.
pub const MAX_INPUT: u64 = 1 << 30;

/// Reads an input file whole: a regular file of at most [`MAX_INPUT`]
/// bytes (a larger one refused before reading) or a pipe, cut off past it;
/// a device or anything else is refused.
pub fn read_input(path: &Path) -> Result<String, Refusal> {
    let name = crate::term::safe(&path.display().to_string());
    let refuse = |why: String| Refusal::new(format!("{name}: {why}"));
    let f = fs::File::open(path).map_err(|e| refuse(e.to_string()))?;
    let m = f.metadata().map_err(|e| refuse(e.to_string()))?;
    use std::os::unix::fs::FileTypeExt as _;
    let t = m.file_type();
    let too_big =
        || refuse(format!("larger than {} MiB, the most faultscope reads: not a report", MAX_INPUT >> 20));
    if t.is_file() {
        if m.len() > MAX_INPUT {
            return Err(too_big());
        }
    } else if !t.is_fifo() {
        let what = if t.is_dir() {
            "a directory"
        } else if t.is_char_device() {
            "a character device"
        } else if t.is_block_device() {
            "a block device"
        } else {
            "a socket"
        };
        return Err(refuse(format!("it is {what}, not a report file (give a regular file or a pipe)")));
    }
    let mut buf = Vec::new();
    f.take(MAX_INPUT + 1).read_to_end(&mut buf).map_err(|e| refuse(e.to_string()))?;
    if buf.len() as u64 > MAX_INPUT {
        return Err(too_big());
    }
    String::from_utf8(buf).map_err(|e| refuse(format!("not a report: not UTF-8 text ({e})")))
}

/// Loads and checks a report; malformed or truncated files are refused with
/// the file name and what is wrong.
pub fn load(path: &Path) -> Result<Loaded, Refusal> {
    let name = path.display().to_string();
    let text = read_input(path)?;
    parse(name, &text)
}

pub fn parse(name: String, text: &str) -> Result<Loaded, Refusal> {
    if text.trim().is_empty() {
        return Err(Refusal::new(format!("{name}: empty file (was the run interrupted before the report?)")));
    }
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Refusal::new(format!("{name}: not a faultscope report: {e}")))?;
    if v.get("schema").and_then(|s| s.as_str()) == Some(BENCH_SERIES_SCHEMA) {
        return Err(Refusal::new(format!(
            "{name}: a bench series ({}, bench --runs), not one report: compare series with `diff --format changelog`",
            BENCH_SERIES_SCHEMA
        )));
    }
    if v.get("schema").and_then(|s| s.as_str()) != Some(SCHEMA) {
        return Err(Refusal::new(format!(
            "{name}: schema is {}, expected {SCHEMA:?}",
            v.get("schema").map(|s| s.to_string()).unwrap_or_else(|| "missing".into())
        )));
    }
    let mut v = v;
    migrate(&mut v);
    // The error names the field (`processes[0].classes.reuse`), not only
    // what serde could not match there.
    let mut report: Report = serde_path_to_error::deserialize(v)
        .map_err(|e| Refusal::new(format!("{name}: malformed report: at {}: {}", e.path(), e.inner())))?;
    report.restore_reasons();
    check(&report).map_err(|e| Refusal::new(format!("{name}: {e}")))?;
    Ok(Loaded { path: name, report })
}

/// An older report's class names (`classes::FORMER_NAMES`) as this
/// version's: as keys (a class's counts) and as the values of the fields
/// that hold one class or a list of them. A process name or a path is never
/// touched.
pub fn migrate(v: &mut serde_json::Value) {
    use serde_json::Value;
    let now = |name: &str| FORMER_NAMES.iter().find(|(n, _)| *n == name).map(|(_, c)| c.name());
    match v {
        Value::Object(m) => {
            let former: Vec<String> = m.keys().filter(|k| now(k).is_some()).cloned().collect();
            for k in former {
                if let Some(x) = m.remove(&k) {
                    m.insert(now(&k).unwrap_or_default().to_string(), x);
                }
            }
            for (k, x) in m.iter_mut() {
                match (k.as_str(), x) {
                    ("class", Value::String(s)) => {
                        if let Some(n) = now(s) {
                            *s = n.to_string();
                        }
                    }
                    ("site_classes" | "stack_classes", Value::Array(items)) => {
                        for i in items.iter_mut() {
                            if let Some(n) = i.as_str().and_then(now) {
                                *i = Value::String(n.to_string());
                            }
                        }
                    }
                    (_, x) => migrate(x),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(migrate),
        _ => {}
    }
}

/// What serde cannot say: a class marked not measurable must say false,
/// and the counts must be summable. (serde already refuses a count that is
/// not an integer in 0..2^64: negative, fractional, 1e999, NaN, Infinity.)
/// Every sum that is taken of a report (a span's phases, the processes
/// verify adds up, the denominators of percentages) is a sum of some of
/// its counts, so none can overflow once all of them together fit in u64;
/// real counts are far from that.
fn check(r: &Report) -> Result<(), String> {
    let mut total: u64 = 0;
    for p in &r.processes {
        for c in std::iter::once(&p.classes).chain(p.phases.iter().map(|ph| &ph.classes)) {
            for v in c.values() {
                total = total
                    .checked_add(v.count().unwrap_or(0))
                    .ok_or("its counts overflow a 64-bit integer when summed")?;
            }
        }
    }
    for (i, p) in r.processes.iter().enumerate() {
        let all = std::iter::once(&p.classes).chain(p.phases.iter().map(|ph| &ph.classes));
        for c in all {
            for (m, v) in c {
                if let ClassValue::NotMeasurable(n) = v {
                    if n.measurable {
                        return Err(format!("processes[{i}]: class {m} has no count but measurable: true"));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Writes a report whole or not at all (see `crate::output`).
pub fn write(p: &Path, r: &Report) -> Result<()> {
    crate::output::write(p, serde_json::to_string_pretty(r)?.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::classes::ReportClass;

    fn load_str(s: &str) -> Result<Loaded, Refusal> {
        parse("r.json".into(), s)
    }

    const MIN: &str = r#""kernel": "6.12", "arch": "x86_64", "mode": "kprobe", "duration_ns": 1, "probes": [], "drops": {}"#;

    #[test]
    fn malformed_reports_are_refused_clearly() {
        let e = load_str("").err().unwrap();
        assert!(e.0.contains("empty file"), "{e}");
        let e = load_str("{\"schema\": \"faultscope/1\", \"processes\": [").err().unwrap();
        assert!(e.0.contains("not a faultscope report: EOF"), "{e}");
        let e = load_str("{\"schema\": \"other\"}").err().unwrap();
        assert!(e.0.contains("schema is \"other\""), "{e}");
        let e = load_str(&format!("{{\"schema\": \"faultscope/1\", {MIN}}}")).err().unwrap();
        assert!(e.0.contains("missing field `processes`"), "{e}");
        let e =
            load_str(&format!("{{\"schema\": \"faultscope/1\", {MIN}, \"processes\": [{{\"pid\": 1}}]}}"))
                .err()
                .unwrap();
        assert!(e.0.contains("malformed report"), "{e}");
        let e = load_str(&format!(
            "{{\"schema\": \"faultscope/1\", {MIN}, \"processes\": [{{\"pid\": 1, \"comm\": \"x\", \"phases\": [], \"classes\": {{\"reuse\": {{\"count\": -1, \"source\": \"k\"}}}}}}]}}"
        ))
        .err()
        .unwrap();
        assert!(e.0.contains("malformed report"), "{e}");
        assert!(load(Path::new("/nonexistent/r.json")).err().unwrap().0.contains("/nonexistent/r.json"));
        // Counts: integers in 0..2^64 only, and summable.
        let with_count = |n: &str| {
            format!(
                "{{\"schema\": \"faultscope/1\", {MIN}, \"processes\": [{{\"pid\": 1, \"comm\": \"x\", \"phases\": [], \"classes\": {{\"reuse\": {{\"count\": {n}, \"source\": \"k\"}}}}}}]}}"
            )
        };
        for bad in ["NaN", "Infinity", "1e999", "1 0", "-1", "1.5", "18446744073709551616"] {
            assert!(load_str(&with_count(bad)).is_err(), "{bad}");
        }
        assert!(load_str(&with_count("18446744073709551615")).is_ok());
        let two = with_count("18446744073709551615").replacen(
            "\"classes\": {",
            "\"classes\": {\"copy\": {\"count\": 1, \"source\": \"k\"}, ",
            1,
        );
        let e = load_str(&two).err().unwrap();
        assert!(e.0.contains("overflow"), "{e}");
    }

    #[test]
    fn classes_read_back() {
        let r = load_str(&format!(
            r#"{{"schema": "faultscope/1", {MIN}, "processes": [{{"pid": 1, "comm": "w", "phases": [], "classes": {{
                "faults": {{"count": 5, "source": "k"}}, "reuse": {{"measurable": false, "reason": "no PMU"}}}}}}]}}"#
        ))
        .unwrap();
        let p = &r.report.processes[0];
        assert_eq!(p.count(ReportClass::Faults), Some(5));
        assert!(
            matches!(&p.classes[&ReportClass::Reuse], ClassValue::NotMeasurable(n) if n.reason == "no PMU")
        );
        assert_eq!(p.count(ReportClass::Copy), None);
    }

    /// An older report's `first_touch` reads as `not_present`, as a key and
    /// as a class value; a process of that name stays as it is.
    #[test]
    fn former_class_names_read_as_todays() {
        let r = load_str(&format!(
            r#"{{"schema": "faultscope/1", {MIN}, "processes": [{{"pid": 1, "comm": "first_touch", "phases": [], "classes": {{
                "faults": {{"count": 5, "source": "k"}}, "first_touch": {{"count": 3, "source": "k"}}}}}}]}}"#
        ))
        .unwrap();
        let p = &r.report.processes[0];
        assert_eq!(p.count(ReportClass::NotPresent), Some(3));
        assert_eq!(p.comm, "first_touch");
        let mut v =
            serde_json::json!({"site_classes": ["first_touch", "copy"], "rows": [{"class": "first_touch"}]});
        migrate(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"site_classes": ["not_present", "copy"], "rows": [{"class": "not_present"}]})
        );
    }

    #[test]
    fn written_whole_and_through_a_link_of_ours() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        let r = Report { schema: SCHEMA.into(), ..Report::default() };
        write(&p, &r).unwrap();
        assert_eq!(load(&p).unwrap().report, r);
        // A link of this user's (`latest.json -> runs/1.json`) stays a
        // link: what it points at is replaced whole.
        let target = dir.path().join("run1.json");
        fs::write(&target, "old").unwrap();
        fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("run1.json", &p).unwrap();
        write(&p, &r).unwrap();
        assert_eq!(load(&target).unwrap().report, r);
        assert!(fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        let left: Vec<_> = fs::read_dir(dir.path()).unwrap().filter_map(|e| e.ok()).collect();
        assert_eq!(left.len(), 2, "no temporary file left: {left:?}");
    }
}
