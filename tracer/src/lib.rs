//! faultscope (package `faultscope`): counts and times what the Linux fault
//! path does to a process. This library is the whole tool; `main.rs` only
//! dispatches, and the tests and xtask read reports through its types.
//!
//! Data flow, one directory per stage:
//! `kernel` (probe table, class catalogue, load and attach)
//! -> kernel maps (tracer-ebpf, tracer-common)
//! -> `collect` (snapshots of the maps, phases, targets, and `engine`, the
//!    Recorder that drives the stages for the commands)
//! -> `report` (typed report, text, findings, the checks of diff and verify)
//! -> `cmd`, the commands. Leaves any stage may use: `units`, `term`
//! (terminal output, foreign strings), `signals`, `output` (every file
//! written), `memory` (bench's mappings and forked child), `error` (the
//! refusal).

/// The commit the binary was built from, which `main` sets from its own
/// compile-time `FAULTSCOPE_COMMIT`: the library does not read it, so a new
/// commit recompiles `main.rs` alone and relinks.
static COMMIT: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Sets [`commit`] once, before anything reads it.
pub fn set_commit(c: &'static str) {
    let _ = COMMIT.set(c);
}

/// The commit of this build, `unknown` when the build did not say.
pub fn commit() -> &'static str {
    COMMIT.get().copied().unwrap_or("unknown")
}

/// The version line: the package's version and [`commit`].
pub fn version() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| format!("{} (commit {})", env!("CARGO_PKG_VERSION"), commit()))
}

/// Attribution building blocks (mapping names, code sites, stacks, BTF
/// offsets), used by `collect` and `report`.
pub mod attrib;
pub mod cmd;
pub mod collect;
pub mod error;
pub mod kernel;
pub mod memory;
pub mod output;
pub mod report;
pub mod signals;
pub mod term;
pub mod units;

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                sources(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    /// docs/design.md's layout map names every source file of the three
    /// crates (by its name, as a word), so that it stays the map.
    #[test]
    fn the_design_layout_names_every_source_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let doc = std::fs::read_to_string(root.join("docs/design.md")).unwrap();
        let start = doc.find("## Layout").unwrap();
        let open = start + doc[start..].find("```").unwrap() + 3;
        let block = &doc[open..open + doc[open..].find("```").unwrap()];
        let words: std::collections::BTreeSet<&str> =
            block.split(|c: char| !(c.is_alphanumeric() || c == '_')).collect();
        let mut files = Vec::new();
        for crate_src in ["tracer-common/src", "tracer-ebpf/src", "tracer/src"] {
            sources(&root.join(crate_src), &mut files);
        }
        let missing: Vec<String> = files
            .iter()
            .filter(|f| !words.contains(f.file_stem().unwrap().to_str().unwrap()))
            .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
            .collect();
        assert!(missing.is_empty(), "docs/design.md's layout does not name {missing:?}");
    }
}
