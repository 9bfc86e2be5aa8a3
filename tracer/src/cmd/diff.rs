//! `faultscope diff A.json B.json`: loads both reports and prints
//! `report::diff` of them.

use std::path::Path;

use anyhow::Result;

use crate::report::{diff::diff, file};

pub fn run(a: &Path, b: &Path) -> Result<i32> {
    let (a, b) = (file::load(a)?, file::load(b)?);
    crate::term::out(&diff(&a, &b))?;
    Ok(0)
}
