//! Folded stacks and flame graphs of the costly fault classes.
//!
//! The kernel side keeps stack ids per fault class; once the frames are
//! symbolized (sites.rs) they are aggregated here into Brendan Gregg's folded
//! format, `class;comm;outermost;...;leaf count`, which flamegraph.pl,
//! inferno, speedscope and others read, and drawn as an SVG with inferno.

use std::{collections::BTreeMap, io::Write};

use anyhow::{bail, Context as _, Result};

use super::mapping::display_safe;

/// Makes a symbolized frame safe for one field of a folded line: control
/// characters escaped (`\xNN`, so no newline), `;` (the frame separator)
/// escaped as `\x3b`, outer whitespace trimmed, an empty frame named
/// `[unknown]`. A frame ending in ` <number>` would be read as a sample
/// count by flame graph tools, so that last space becomes `_`.
pub fn sanitize_frame(frame: &str) -> String {
    let mut s = display_safe(frame).replace(';', "\\x3b").trim().to_string();
    if s.is_empty() {
        return "[unknown]".into();
    }
    if let Some(i) = s.rfind(' ') {
        let tail = &s[i + 1..];
        if tail.chars().all(|c| c.is_ascii_digit() || c == '.') {
            s.replace_range(i..i + 1, "_");
        }
    }
    s
}

/// Counts per (class, comm, stack), merged and kept in a fixed order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldedStacks {
    /// The folded line without its count -> count. A BTreeMap so that the
    /// output is sorted and the same for the same input.
    stacks: BTreeMap<String, u64>,
}

impl FoldedStacks {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `count` faults of `class` in process `comm` at a stack given
    /// **leaf first** (`frames[0]` is where the fault happened), the order
    /// BPF stack maps return ips in. Identical stacks merge; a zero count
    /// adds nothing. An empty stack counts at the comm frame.
    pub fn add<S: AsRef<str>>(&mut self, class: &str, comm: &str, frames_leaf_first: &[S], count: u64) {
        if count == 0 {
            return;
        }
        let mut key = sanitize_frame(class);
        key.push(';');
        key.push_str(&sanitize_frame(comm));
        for f in frames_leaf_first.iter().rev() {
            key.push(';');
            key.push_str(&sanitize_frame(f.as_ref()));
        }
        let e = self.stacks.entry(key).or_insert(0);
        *e = e.saturating_add(count);
    }

    /// Distinct stacks.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// Sum of all counts (saturating).
    pub fn total(&self) -> u64 {
        self.stacks.values().fold(0u64, |a, c| a.saturating_add(*c))
    }

    /// `class;comm;outermost;...;leaf count`, sorted by stack.
    pub fn lines(&self) -> Vec<String> {
        self.stacks.iter().map(|(k, c)| format!("{k} {c}")).collect()
    }

    /// The folded file: one line each, newline-terminated.
    pub fn to_folded(&self) -> String {
        self.lines().into_iter().map(|l| l + "\n").collect()
    }

    /// Draws the flame graph as SVG into `out`. Colors hash the function
    /// names, so the same input gives the same SVG. An empty aggregate is an
    /// error (inferno would draw an error picture).
    pub fn write_svg<W: Write>(&self, title: &str, out: W) -> Result<()> {
        if self.is_empty() {
            bail!("no stacks to draw a flame graph of");
        }
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = display_safe(title);
        opts.count_name = "faults".into();
        opts.hash = true;
        let lines = self.lines();
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)
            .context("inferno flame graph")
    }

    /// `write_svg` into a string.
    pub fn to_svg(&self, title: &str) -> Result<String> {
        let mut buf = Vec::new();
        self.write_svg(title, &mut buf)?;
        String::from_utf8(buf).context("inferno wrote non-UTF-8 SVG")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> FoldedStacks {
        let mut f = FoldedStacks::new();
        f.add("cow_copy", "redis-server", &["zmalloc+0x3c (redis-server)", "main+0x10 (redis-server)"], 5);
        f.add("cow_copy", "redis-server", &["memcpy+0x8 (libc.so.6)", "main+0x10 (redis-server)"], 2);
        // Same stack again: merged.
        f.add("cow_copy", "redis-server", &["zmalloc+0x3c (redis-server)", "main+0x10 (redis-server)"], 3);
        f.add("contpte_unfold", "bench", &["do_fault", "handle_mm_fault"], 1);
        f.add("cow_copy", "redis-server", &["ignored"], 0);
        f
    }

    #[test]
    fn folded_output_is_exact_and_merged() {
        let f = sample();
        assert_eq!(f.len(), 3);
        assert_eq!(f.total(), 11);
        assert_eq!(
            f.to_folded(),
            "contpte_unfold;bench;handle_mm_fault;do_fault 1\n\
             cow_copy;redis-server;main+0x10 (redis-server);memcpy+0x8 (libc.so.6) 2\n\
             cow_copy;redis-server;main+0x10 (redis-server);zmalloc+0x3c (redis-server) 8\n"
        );
        let mut empty = FoldedStacks::new();
        empty.add("c", "comm", &[] as &[&str], 4);
        assert_eq!(empty.lines(), ["c;comm 4"]);
    }

    #[test]
    fn frames_are_sanitized() {
        assert_eq!(sanitize_frame("a;b\nc\u{1b}"), "a\\x3bb\\x0ac\\x1b");
        assert_eq!(sanitize_frame("  "), "[unknown]");
        assert_eq!(sanitize_frame("kworker 12"), "kworker_12");
        assert_eq!(sanitize_frame("f (lib 2.so)"), "f (lib 2.so)");
        let mut f = FoldedStacks::new();
        f.add("c", "evil\ncomm;x", &["leaf;1 2"], 1);
        assert_eq!(f.lines(), ["c;evil\\x0acomm\\x3bx;leaf\\x3b1_2 1"]);
    }

    #[test]
    fn svg_has_title_and_functions() {
        let f = sample();
        let svg = f.to_svg("faults by stack <test>").unwrap();
        assert!(svg.starts_with("<?xml"), "{}", &svg[..100.min(svg.len())]);
        for name in ["zmalloc+0x3c (redis-server)", "memcpy+0x8 (libc.so.6)", "do_fault", "cow_copy"] {
            assert!(svg.contains(name), "{name} missing");
        }
        assert!(svg.contains("faults by stack &lt;test&gt;"));
        assert_eq!(svg, f.to_svg("faults by stack <test>").unwrap(), "deterministic");
        assert!(FoldedStacks::new().to_svg("x").is_err());
    }
}
