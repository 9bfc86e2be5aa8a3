//! `faultscope diff A.json B.json`: loads both reports and prints
//! `report::diff` of them; with `--format changelog`, loads two bench
//! series (or bench reports) and prints `report::changelog` of them.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::{
    error::Refusal,
    report::{bench_series, changelog::changelog, diff::diff, file},
};

/// What `diff` prints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DiffFormat {
    /// Every phase and class of two reports, with ratios.
    #[default]
    Table,
    /// Two bench series (`bench --runs N --json`) or bench reports, as a
    /// cover letter's text: the table of write faults and times per write
    /// pattern and folio size (a median per boot), the latency table, then
    /// per cell A and B (mean ± sample stddev over the runs), the change in
    /// %, and whether the runs' min-max ranges do not overlap.
    Changelog,
}

pub fn run(a: &Path, b: &Path, more: &[PathBuf], format: DiffFormat) -> Result<i32> {
    let text = match format {
        DiffFormat::Table => {
            if !more.is_empty() {
                return Err(Refusal::new("diff: more than two files only with --format changelog").into());
            }
            let (a, b) = (file::load(a)?, file::load(b)?);
            diff(&a, &b)
        }
        DiffFormat::Changelog => {
            let all = [a, b].into_iter().chain(more.iter().map(PathBuf::as_path));
            let cols = all.map(bench_series::load).collect::<Result<Vec<_>, _>>()?;
            changelog(&cols.iter().collect::<Vec<_>>())
        }
    };
    crate::term::out(&text)?;
    Ok(0)
}
