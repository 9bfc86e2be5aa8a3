//! The walk-throughs' reports (docs/walkthrough-*.md), from the run that
//! makes them: the fenced block between `<!-- NAME:begin -->` and
//! `<!-- NAME:end -->` is checked against the text this run's report
//! renders to (its tables' headings and columns: the figures depend on
//! timing), and rewritten with it when `FAULTSCOPE_WRITE_DOCS=1`. Each
//! run's text is also kept under target/walkthroughs/NAME.txt.

use anyhow::{bail, Context as _, Result};
use faultscope::report::text::shape;

use crate::util::root;

/// Set to 1: rewrite the walk-throughs' blocks with this run's text.
const WRITE: &str = "FAULTSCOPE_WRITE_DOCS";

/// The fenced block of `doc` between `name`'s markers: the byte range of
/// its lines (between the fences).
fn block(doc: &str, name: &str) -> Result<std::ops::Range<usize>> {
    let (begin, end) = (format!("<!-- {name}:begin -->"), format!("<!-- {name}:end -->"));
    let b = doc.find(&begin).with_context(|| format!("no {begin}"))? + begin.len();
    let e = b + doc[b..].find(&end).with_context(|| format!("no {end} after {begin}"))?;
    let open = b + doc[b..e].find("```").context("no fenced block between the markers")?;
    let start = open + doc[open..e].find('\n').context("a fence without a line")? + 1;
    let close = start + doc[start..e].rfind("```").context("an unclosed fenced block")?;
    Ok(start..close)
}

/// A report's tables and columns, without what a guest's timing decides
/// (which classes had faults, whether an idle phase had any): each table's
/// heading (digits as `#`, without `: no faults`) and each distinct
/// column header.
fn coarse(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in shape(text) {
        if s.starts_with("PID ") {
            out.push(s.trim_end_matches(": no faults").to_string());
        } else if s.starts_with("CLASS") && !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// Checks (or rewrites) `name`'s block in docs/`file` against `text`.
pub fn check(file: &str, name: &str, text: &str) -> Result<()> {
    let kept = root().join("target/walkthroughs");
    std::fs::create_dir_all(&kept)?;
    std::fs::write(kept.join(format!("{name}.txt")), text)?;
    let path = root().join("docs").join(file);
    let doc = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let range = block(&doc, name).with_context(|| format!("docs/{file}"))?;
    if std::env::var(WRITE).is_ok_and(|v| v == "1") {
        let mut new = doc.clone();
        new.replace_range(range, text);
        std::fs::write(&path, new)?;
        println!("docs/{file}: {name} rewritten from this run");
        return Ok(());
    }
    let (want, got) = (coarse(&doc[range]), coarse(text));
    if want.is_empty() {
        bail!("docs/{file}: {name} has no table");
    }
    if want != got {
        bail!(
            "docs/{file}: {name} is not what this run prints (tables or columns differ: {want:?} against {got:?}); \
             the run's text is in target/walkthroughs/{name}.txt; {WRITE}=1 writes it there"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_is_the_fenced_text_between_the_markers() {
        let doc = "a\n<!-- x:begin -->\nsome words\n```\nPID 1 (a) whole run\n```\n<!-- x:end -->\nb\n";
        let r = block(doc, "x").unwrap();
        assert_eq!(&doc[r], "PID 1 (a) whole run\n");
        assert!(block(doc, "y").is_err());
    }
}
