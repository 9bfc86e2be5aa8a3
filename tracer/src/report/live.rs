//! The live view: a compact table redrawn in place on a terminal while
//! recording, with the current phase. Never drawn when stdout is not a
//! terminal (pipes and files get the plain interval tables instead). Its
//! footer says how the run ends and where it goes next: `plot` for a
//! report with intervals, `serve` to keep the same counts for Prometheus.

use crate::term::safe;
use std::{fmt::Write as _, io::IsTerminal as _, path::Path};

use super::schema::Report;
use crate::kernel::classes::ReportClass;

pub fn enabled() -> bool {
    std::io::stdout().is_terminal()
}

/// The frame's footer for a run that writes `json` (if any), with or
/// without `--interval` (the time series `plot` draws).
pub fn footer(json: Option<&Path>, interval: bool) -> String {
    let end = match json {
        Some(p) if interval => {
            let p = safe(&p.display().to_string());
            format!("Ctrl-C ends the run and writes {p}; `faultscope plot {p} -o run.svg` draws it")
        }
        Some(p) => format!(
            "Ctrl-C ends the run and writes {} (with --interval SECS, `faultscope plot` draws it)",
            safe(&p.display().to_string())
        ),
        None => "Ctrl-C ends the run and prints the report (--json FILE keeps it)".to_string(),
    };
    format!("{end}\nTo keep these counts for days, for Prometheus: `faultscope serve -p PID | --comm NAME`\n")
}

/// One frame: clear the screen, then the table of the run so far, then
/// `footer`.
pub fn frame(r: &Report, phase: &str, elapsed_s: f64, footer: &str) -> String {
    let mut out = String::from("\x1b[H\x1b[J");
    let _ = writeln!(out, "faultscope  {elapsed_s:.0}s  phase: {}", safe(phase));
    let _ = write!(out, "{:>8} {:<16}", "PID", "COMM");
    for m in ReportClass::summary() {
        let _ = write!(out, " {:>11}", m.name());
    }
    out.push('\n');
    for p in &r.processes {
        let comm = if p.comm.is_empty() { "?".to_string() } else { safe(&p.comm) };
        let _ = write!(out, "{:>8} {comm:<16}", p.pid);
        for m in ReportClass::summary() {
            let cell = p.count(m).map(|n| n.to_string()).unwrap_or_else(|| "n/m".into());
            let _ = write!(out, " {cell:>11}");
        }
        out.push('\n');
    }
    out.push_str(footer);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_footer_points_to_plot_and_serve() {
        let f = footer(Some(Path::new("bgsave.json")), true);
        assert!(f.contains("writes bgsave.json; `faultscope plot bgsave.json -o run.svg`"), "{f}");
        assert!(f.contains("faultscope serve"));
        assert!(footer(Some(Path::new("r.json")), false).contains("with --interval SECS, `faultscope plot`"));
        assert!(footer(None, true).contains("--json FILE"));
        // A path is text from elsewhere: no raw control characters.
        assert!(!footer(Some(Path::new("a\x1b[2Jb.json")), true).contains('\x1b'));
        let frame = frame(&Report::default(), "before-fork", 1.0, &f);
        assert!(frame.ends_with(&f));
    }
}
