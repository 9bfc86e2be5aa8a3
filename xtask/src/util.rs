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
