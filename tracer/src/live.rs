//! The live view: a compact table redrawn in place on a terminal while
//! recording, with the current phase. Never drawn when stdout is not a
//! terminal (pipes and files get the plain interval tables instead).

use std::{fmt::Write as _, io::IsTerminal as _};

use crate::{classes::Availability, collector::Snapshot, report::Context};

const COLUMNS: [&str; 7] =
    ["faults", "wp_faults", "reuse", "copy", "spurious", "huge_pmd_wp", "contpte_unfold"];

pub fn enabled() -> bool {
    std::io::stdout().is_terminal()
}

/// One frame: clear the screen, then the table.
pub fn frame(snap: &Snapshot, ctx: &Context<'_>, elapsed_s: f64) -> String {
    let mut out = String::from("\x1b[H\x1b[J");
    let _ = writeln!(out, "faultscope  {elapsed_s:.0}s  phase: {}", ctx.timeline.current().name);
    let _ = write!(out, "{:>8} {:<16}", "PID", "COMM");
    for c in COLUMNS {
        let _ = write!(out, " {:>11}", c);
    }
    out.push('\n');
    for tgid in
        snap.pids().into_iter().chain(ctx.comms.keys().copied()).collect::<std::collections::BTreeSet<_>>()
    {
        let comm = ctx.comms.get(&tgid).map(String::as_str).unwrap_or("?");
        let _ = write!(out, "{tgid:>8} {comm:<16}");
        for c in COLUMNS {
            let cell = match ctx.availability.iter().find(|(n, _)| *n == c).map(|(_, a)| a) {
                Some(Availability::Measured { class, .. }) => {
                    snap.get(tgid, *class).map(|s| s.count).unwrap_or(0).to_string()
                }
                _ => "n/m".into(),
            };
            let _ = write!(out, " {cell:>11}");
        }
        out.push('\n');
    }
    out.push_str("(Ctrl-C ends the run and prints the report)\n");
    out
}
