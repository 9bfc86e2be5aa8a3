//! `--pprof FILE`: the report's counted stacks as a gzipped pprof
//! `profile.proto`, the format continuous profilers exchange (`go tool
//! pprof`, Pyroscope, Parca, the OpenTelemetry eBPF profiler). One sample
//! type per class (`copy/count`, ...), one sample per (class, process name,
//! stack) with a `comm` label, leaf first; a function per symbol (a
//! frame's `+0x…` offset dropped, so that a function's faults add up), and
//! a mapping per module a frame names.

use std::{collections::BTreeMap, io::Write as _};

use anyhow::Result;
use prost::Message;

use super::schema::Report;

#[derive(Clone, PartialEq, Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
    #[prost(int64, tag = "10")]
    duration_nanos: i64,
    #[prost(int64, tag = "14")]
    default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
struct Label {
    #[prost(int64, tag = "1")]
    key: i64,
    #[prost(int64, tag = "2")]
    str: i64,
}

#[derive(Clone, PartialEq, Message)]
struct Mapping {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "5")]
    filename: i64,
    #[prost(bool, tag = "7")]
    has_functions: bool,
}

#[derive(Clone, PartialEq, Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(uint64, tag = "2")]
    mapping_id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
}

#[derive(Clone, PartialEq, Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
    #[prost(int64, tag = "3")]
    system_name: i64,
    #[prost(int64, tag = "4")]
    filename: i64,
}

/// A frame as the report names it: `func+0x3c (module)`, `func+0x3c`,
/// `module+0x1a2b (build id …)`, `[unknown] 0x…`. Returns the function and
/// the module, if it names one.
fn split_frame(frame: &str) -> (&str, Option<&str>) {
    let (head, module) = match frame.strip_suffix(')').and_then(|f| f.rsplit_once(" (")) {
        Some((h, m)) if !m.starts_with("build id") => (h, Some(m)),
        Some((h, _)) => (h, None),
        None => (frame, None),
    };
    let func = match head.rsplit_once("+0x") {
        Some((f, off)) if !f.is_empty() && off.bytes().all(|b| b.is_ascii_hexdigit()) => f,
        _ => head,
    };
    (func, module)
}

/// Interns strings, functions, mappings and locations in first-seen order
/// (ids from 1; string 0 is "", as the format wants).
#[derive(Default)]
struct Tables {
    strings: Vec<String>,
    string_ids: BTreeMap<String, i64>,
    functions: BTreeMap<(String, String), u64>,
    mappings: BTreeMap<String, u64>,
    locations: BTreeMap<String, u64>,
    profile: Profile,
}

impl Tables {
    fn string(&mut self, s: &str) -> i64 {
        if self.strings.is_empty() {
            self.strings.push(String::new());
            self.string_ids.insert(String::new(), 0);
        }
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), i);
        i
    }

    fn location(&mut self, frame: &str) -> u64 {
        if let Some(&id) = self.locations.get(frame) {
            return id;
        }
        let (func, module) = split_frame(frame);
        let module = module.unwrap_or_default().to_string();
        let mapping_id = match module.is_empty() {
            true => 0,
            false => match self.mappings.get(&module) {
                Some(&id) => id,
                None => {
                    let id = self.mappings.len() as u64 + 1;
                    let filename = self.string(&module);
                    self.profile.mapping.push(Mapping { id, filename, has_functions: true });
                    self.mappings.insert(module.clone(), id);
                    id
                }
            },
        };
        let key = (func.to_string(), module.clone());
        let function_id = match self.functions.get(&key) {
            Some(&id) => id,
            None => {
                let id = self.functions.len() as u64 + 1;
                let (name, filename) = (self.string(func), self.string(&module));
                self.profile.function.push(Function { id, name, system_name: name, filename });
                self.functions.insert(key, id);
                id
            }
        };
        let id = self.locations.len() as u64 + 1;
        self.profile.location.push(Location { id, mapping_id, line: vec![Line { function_id }] });
        self.locations.insert(frame.to_string(), id);
        id
    }
}

/// The gzipped profile of the report's stacks.
pub fn encode(r: &Report) -> Result<Vec<u8>> {
    let mut t = Tables::default();
    let mut classes: Vec<_> =
        r.processes.iter().flat_map(|p| p.attribution.stacks.iter().map(|s| s.class)).collect();
    classes.sort();
    classes.dedup();
    let count = t.string("count");
    for c in &classes {
        let ty = t.string(c.name());
        t.profile.sample_type.push(ValueType { r#type: ty, unit: count });
    }
    let comm_key = t.string("comm");
    for p in &r.processes {
        let comm = t.string(&crate::attrib::mapping::display_safe(&p.comm));
        for s in &p.attribution.stacks {
            // Leaf first, as pprof has it; the report has them outermost first.
            let frames: Vec<&String> = s.user.iter().chain(s.kernel.iter()).rev().collect();
            let location_id = frames.into_iter().map(|f| t.location(f)).collect();
            let mut value = vec![0i64; classes.len()];
            if let Some(i) = classes.iter().position(|c| *c == s.class) {
                value[i] = s.count as i64;
            }
            t.profile.sample.push(Sample {
                location_id,
                value,
                label: vec![Label { key: comm_key, str: comm }],
            });
        }
    }
    t.profile.duration_nanos = r.duration_ns as i64;
    t.profile.string_table = std::mem::take(&mut t.strings);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&t.profile.encode_to_vec())?;
    Ok(gz.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_into_function_and_module() {
        assert_eq!(split_frame("main+0x3c (redis-server)"), ("main", Some("redis-server")));
        assert_eq!(split_frame("do_wp_page+0x1f0"), ("do_wp_page", None));
        assert_eq!(split_frame("redis-server+0x1a2b (build id 3fa0)"), ("redis-server", None));
        assert_eq!(split_frame("[unknown] 0x7f43cba348d0"), ("[unknown] 0x7f43cba348d0", None));
        assert_eq!(split_frame("anon+0x40"), ("anon", None));
    }

    /// Two stacks of one class and one of another, ending in the same
    /// function at two offsets: one function, its faults added up; the
    /// message reads back with every table consistent.
    #[test]
    fn stacks_encode_and_read_back() {
        use crate::{
            kernel::classes::ReportClass,
            report::schema::{testing::process, StackRow},
        };
        let row = |class, leaf: &str, count| StackRow {
            class,
            user: vec!["main+0x10 (prog)".into(), leaf.into()],
            kernel: vec!["handle_mm_fault+0x20".into()],
            count,
        };
        let mut p = process(7, Vec::new());
        p.attribution.stacks = vec![
            row(ReportClass::Copy, "w+0x4 (prog)", 5),
            row(ReportClass::Copy, "w+0x8 (prog)", 7),
            row(ReportClass::Reuse, "w+0x4 (prog)", 1),
        ];
        let r = Report { processes: vec![p], ..Report::default() };
        let gz = encode(&r).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        let prof = Profile::decode(&raw[..]).unwrap();
        let s = |i: i64| prof.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<&str> = prof.sample_type.iter().map(|v| s(v.r#type)).collect();
        assert_eq!(types, ["reuse", "copy"]);
        let names: Vec<&str> = prof.function.iter().map(|f| s(f.name)).collect();
        assert_eq!(names, ["handle_mm_fault", "w", "main"]);
        // Leaf first: the kernel frame, then w, then main.
        assert_eq!(prof.sample[0].location_id.len(), 3);
        let copies: i64 = prof.sample.iter().map(|x| x.value[1]).sum();
        assert_eq!(copies, 12);
        assert_eq!(prof.mapping.len(), 1);
        assert_eq!(s(prof.mapping[0].filename), "prog");
    }
}
