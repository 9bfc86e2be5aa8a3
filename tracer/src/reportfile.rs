//! Reading `faultscope/1` reports back (diff, verify, findings): a loaded
//! report is checked once, so the rest can index it without guessing.

use std::path::Path;

use serde_json::Value;

use crate::{error::Refusal, report::SCHEMA};

pub struct Report {
    pub path: String,
    pub json: Value,
}

impl Report {
    /// Loads and checks a report; malformed or truncated files are refused
    /// with the file name and what is wrong.
    pub fn load(path: &Path) -> Result<Report, Refusal> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Refusal::new(format!("{name}: {e}")))?;
        if text.trim().is_empty() {
            return Err(Refusal::new(format!(
                "{name}: empty file (was the run interrupted before the report?)"
            )));
        }
        let json: Value = serde_json::from_str(&text)
            .map_err(|e| Refusal::new(format!("{name}: not a faultscope report: {e}")))?;
        Report::from_json(name, json)
    }

    pub fn from_json(path: String, json: Value) -> Result<Report, Refusal> {
        if json["schema"] != SCHEMA {
            return Err(Refusal::new(format!("{path}: schema is {}, expected {SCHEMA:?}", json["schema"])));
        }
        let Some(procs) = json["processes"].as_array() else {
            return Err(Refusal::new(format!("{path}: no \"processes\" array")));
        };
        for (i, p) in procs.iter().enumerate() {
            if p["pid"].as_u64().is_none() || !p["classes"].is_object() {
                return Err(Refusal::new(format!("{path}: processes[{i}] has no pid or classes")));
            }
            if let Some(ph) = p.get("phases") {
                let ok = ph
                    .as_array()
                    .is_some_and(|a| a.iter().all(|x| x["name"].is_string() && x["classes"].is_object()));
                if !ok {
                    return Err(Refusal::new(format!("{path}: processes[{i}].phases is malformed")));
                }
            }
        }
        Ok(Report { path, json })
    }

    pub fn processes(&self) -> &[Value] {
        self.json["processes"].as_array().map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn bench(&self) -> Option<&Value> {
        self.json.get("bench").filter(|b| b.is_object())
    }

    /// Folio size in bytes, when the workload's is known (bench).
    pub fn folio_bytes(&self) -> Option<u64> {
        self.bench().and_then(|b| b["folio"].as_str()).and_then(|f| crate::workload::parse_size(f).ok())
    }
}

/// A class object: measured count, or the reason it is not measurable.
pub enum ClassValue<'a> {
    Count(u64),
    NotMeasurable(&'a str),
    Absent,
}

pub fn class<'a>(classes: &'a Value, name: &str) -> ClassValue<'a> {
    let c = &classes[name];
    if c["measurable"] == false {
        return ClassValue::NotMeasurable(c["reason"].as_str().unwrap_or("not measurable"));
    }
    match c["count"].as_u64() {
        Some(n) => ClassValue::Count(n),
        None => ClassValue::Absent,
    }
}

pub fn count(classes: &Value, name: &str) -> Option<u64> {
    match class(classes, name) {
        ClassValue::Count(n) => Some(n),
        _ => None,
    }
}

/// The phases of a process, with their names.
pub fn phases(p: &Value) -> Vec<&Value> {
    p["phases"].as_array().map(|a| a.iter().collect()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_str(s: &str) -> Result<Report, Refusal> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.json");
        std::fs::write(&p, s).unwrap();
        Report::load(&p)
    }

    #[test]
    fn malformed_reports_are_refused_clearly() {
        let e = load_str("").err().unwrap();
        assert!(e.0.contains("empty file"), "{e}");
        let e = load_str("{\"schema\": \"faultscope/1\", \"processes\": [").err().unwrap();
        assert!(e.0.contains("not a faultscope report: EOF"), "{e}");
        let e = load_str("{\"schema\": \"other\"}").err().unwrap();
        assert!(e.0.contains("schema is \"other\""), "{e}");
        let e = load_str("{\"schema\": \"faultscope/1\"}").err().unwrap();
        assert!(e.0.contains("no \"processes\""), "{e}");
        let e = load_str("{\"schema\": \"faultscope/1\", \"processes\": [{\"pid\": 1}]}").err().unwrap();
        assert!(e.0.contains("processes[0] has no pid or classes"), "{e}");
        assert!(Report::load(Path::new("/nonexistent/r.json"))
            .err()
            .unwrap()
            .0
            .contains("/nonexistent/r.json"));
    }

    #[test]
    fn classes_read_back() {
        let r = load_str(
            r#"{"schema": "faultscope/1", "processes": [{"pid": 1, "classes": {
                "faults": {"count": 5}, "reuse": {"measurable": false, "reason": "no PMU"}}}]}"#,
        )
        .unwrap();
        let c = &r.processes()[0]["classes"];
        assert_eq!(count(c, "faults"), Some(5));
        assert!(matches!(class(c, "reuse"), ClassValue::NotMeasurable("no PMU")));
        assert!(matches!(class(c, "copy"), ClassValue::Absent));
    }
}
