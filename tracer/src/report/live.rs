//! The live view: a compact table redrawn in place on a terminal while
//! recording, with the current phase. Never drawn when stdout is not a
//! terminal (pipes and files get the plain interval tables instead).

use std::{fmt::Write as _, io::IsTerminal as _};

use super::{schema::Report, text::safe};
use crate::kernel::classes::Metric;

pub fn enabled() -> bool {
    std::io::stdout().is_terminal()
}

/// One frame: clear the screen, then the table of the run so far.
pub fn frame(r: &Report, phase: &str, elapsed_s: f64) -> String {
    let mut out = String::from("\x1b[H\x1b[J");
    let _ = writeln!(out, "faultscope  {elapsed_s:.0}s  phase: {}", safe(phase));
    let _ = write!(out, "{:>8} {:<16}", "PID", "COMM");
    for m in Metric::summary() {
        let _ = write!(out, " {:>11}", m.name());
    }
    out.push('\n');
    for p in &r.processes {
        let comm = if p.comm.is_empty() { "?".to_string() } else { safe(&p.comm) };
        let _ = write!(out, "{:>8} {comm:<16}", p.pid);
        for m in Metric::summary() {
            let cell = p.count(m).map(|n| n.to_string()).unwrap_or_else(|| "n/m".into());
            let _ = write!(out, " {cell:>11}");
        }
        out.push('\n');
    }
    out.push_str("(Ctrl-C ends the run and prints the report)\n");
    out
}
