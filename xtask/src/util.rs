//! What every stage of xtask shares: the repository's root, the tools it
//! installs, and running a command.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn tools_bin() -> PathBuf {
    root().join("target/tools/bin")
}

/// `cargo` in the repository, with `FAULTSCOPE_COMMIT` (git's HEAD) for
/// the faultscope binary it may build: only `main.rs` reads it, so a new
/// commit recompiles that file and relinks.
pub fn cargo(program: &str) -> Command {
    let head = Command::new("git")
        .current_dir(root())
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let mut c = Command::new(program);
    c.current_dir(root()).env("FAULTSCOPE_COMMIT", head.as_deref().unwrap_or("unknown"));
    c
}

/// `c` at nice 19 (`nice -n 19`, its program, arguments, environment and
/// folder): a build beside tests, which get the CPUs first.
pub fn niced(c: &Command) -> Command {
    let mut n = Command::new("nice");
    n.args(["-n", "19"]).arg(c.get_program()).args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => n.env(k, v),
            None => n.env_remove(k),
        };
    }
    if let Some(d) = c.get_current_dir() {
        n.current_dir(d);
    }
    n
}

/// Runs a command, echoing it, failing on a non-zero exit.
pub fn run(c: &mut Command) -> Result<()> {
    eprintln!("+ {c:?}");
    let st = c.status().with_context(|| format!("starting {c:?}"))?;
    if !st.success() {
        bail!("{c:?} failed: {st}");
    }
    Ok(())
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod layout_tests {
    use super::root;

    /// Every source file of the product and of xtask is named in
    /// docs/design.md's layout (the map a reader starts from).
    #[test]
    fn every_source_file_is_in_the_design_layout() {
        let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
        let from = design.find("## Layout").expect("docs/design.md has a Layout section");
        let block = design[from..].split("```").nth(1).expect("the layout's fenced block");
        let mut missing = Vec::new();
        for dir in [
            "tracer/src",
            "tracer-ebpf/src",
            "tracer-common/src",
            "xtask/src",
            "xtask/workload/src",
            "xtask/expect/src",
        ] {
            let mut stack = vec![root().join(dir)];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap().flatten() {
                    let p = e.path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "rs") {
                        let name = p.file_name().unwrap().to_string_lossy().to_string();
                        let named = block
                            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
                            .any(|w| w == name);
                        if !named {
                            missing.push(p.strip_prefix(root()).unwrap().display().to_string());
                        }
                    }
                }
            }
        }
        assert!(missing.is_empty(), "not in docs/design.md's layout: {missing:?}");
    }
}
