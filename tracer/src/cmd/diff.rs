//! `faultscope diff A.json B.json`: loads both reports and prints
//! `report::diff` of them; with `--format changelog`, loads two bench
//! series (or bench reports) and prints `report::changelog` of them.

use std::path::Path;

use anyhow::Result;

use crate::report::{bench_series, changelog::changelog, diff::diff, file};

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

pub fn run(a: &Path, b: &Path, format: DiffFormat) -> Result<i32> {
    let text = match format {
        DiffFormat::Table => {
            let (a, b) = (file::load(a)?, file::load(b)?);
            diff(&a, &b)
        }
        DiffFormat::Changelog => {
            let (a, b) = (bench_series::load(a)?, bench_series::load(b)?);
            changelog(&[&a, &b])
        }
    };
    crate::term::out(&text)?;
    Ok(0)
}
