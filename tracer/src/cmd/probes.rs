//! `faultscope probes`: the mode a run would be in and why (first line),
//! then the probe table resolved against this kernel, with the backend
//! each probe would use and why. Every program is loaded (never attached)
//! to learn what the kernel refuses at load; `--load` prints each verdict.

use faultscope_common::Program;

use crate::term::safe;
use crate::{
    kernel::{
        self,
        probes::{self, BackendChoice},
        session::{self, Verdict},
    },
    term::safe_lines,
};

pub fn run(load: bool, backend: BackendChoice) -> anyhow::Result<i32> {
    kernel::require_root()?;
    let tracefs = kernel::tracefs()?;
    let kernel = probes::read_kernel(backend);
    let resolved = probes::resolve_here(&tracefs, &kernel, backend);
    let verdicts = session::load_all(&tracefs, &resolved, &kernel.btf, backend);
    let refused_at_load = |name: &str| match &verdicts {
        Ok(v) => v.iter().find(|(p, _)| *p == name).and_then(|(_, v)| match v {
            Verdict::NotHere(e) => Some(e.clone()),
            _ => None,
        }),
        Err(_) => None,
    };
    println!("{}", safe(&mode_line(&resolved, &refused_at_load)));
    println!("{:<18} {:<8} {:<10} {:<34} HERE", "PROGRAM", "ARCH", "REQUIRED", "HOOK");
    for r in &resolved {
        let hook = match r.spec.hook {
            probes::Hook::Kprobe(f) => format!("kprobe {}", f.join(" > ")),
            probes::Hook::Kretprobe(f) => format!("kretprobe {}", f.join(" > ")),
            probes::Hook::Tracepoint(c, n) => format!("tp {c}:{n}"),
        };
        let twin_refused = r.spec.program.fentry_name().and_then(&refused_at_load);
        let here = match &r.resolution {
            probes::Resolution::Attach { symbol, backend: probes::Backend::Fentry, fallback, .. }
                if twin_refused.is_some() =>
            {
                let fallback = match fallback {
                    Ok(()) => format!("kprobe {} instead", safe(symbol)),
                    Err(w) => format!("no kprobe either: {}", safe(w)),
                };
                format!(
                    "fentry refused at load ({}); {fallback}",
                    safe(twin_refused.as_deref().unwrap_or(""))
                )
            }
            probes::Resolution::Attach { symbol, .. }
                if r.spec.folded_into.is_some() && probes::exit_only(&resolved) =>
            {
                format!(
                    "folded into {} (exit-only mode: its fexit reads {} at the return, the exceptions open each fault)",
                    r.spec.folded_into.map(|p| p.name()).unwrap_or_default(),
                    safe(symbol)
                )
            }
            probes::Resolution::Attach { symbol, backend, why, .. } => {
                format!("{} {} ({})", backend.attach_kind(r.spec.hook), safe(symbol), safe(why))
            }
            probes::Resolution::Unavailable(w) => format!("unavailable: {}", safe(w)),
            probes::Resolution::Refused(w) => format!("refused: {}", safe(w)),
        };
        println!(
            "{:<18} {:<8} {:<10} {:<34} {}",
            r.spec.program,
            format!("{:?}", r.spec.arch).to_lowercase(),
            if r.spec.required { "yes" } else { "no" },
            hook,
            here
        );
        println!("{:<18} measures: {} (kernel >= {})", "", r.spec.measures, r.spec.min_kernel);
    }
    let cpus = kernel::footprint::cpus();
    for (what, default) in [
        ("record and bench", crate::cmd::record::DEFAULT_STATS),
        ("serve", crate::cmd::serve::DEFAULT_STATS),
        ("record -a and serve -a", crate::cmd::record::SYSTEM_WIDE_STATS),
    ] {
        let stats = kernel::footprint::stats_entries(None, default, cpus)?;
        let m = kernel::footprint::maps(&kernel::footprint::Sizes { stats, ..Default::default() }, cpus);
        println!(
            "kernel memory: {what} take {} on this machine's {cpus} CPUs by default ({stats} stats entries of {} bytes each; --max-stats sets it, at most {})",
            crate::units::bytes(kernel::footprint::total(&m)),
            kernel::footprint::stats_entry_bytes(cpus),
            crate::units::bytes(kernel::footprint::STATS_LIMIT_BYTES)
        );
    }
    if load {
        let mut failed = 0;
        let (mut insns, mut ms) = (0u64, 0.0);
        for (prog, verdict) in verdicts? {
            match verdict {
                Verdict::Ok(c) => {
                    insns += u64::from(c.verified_insns.unwrap_or(0));
                    ms += c.load.as_secs_f64() * 1e3;
                    println!("{}", loaded_line(prog, &c));
                }
                Verdict::NotHere(e) => {
                    println!("verifier: {prog}: not loadable here (auto uses the kprobe): {}", safe_lines(&e))
                }
                Verdict::Rejected(e) => {
                    failed += 1;
                    println!("verifier: {prog}: REJECTED: {}", safe_lines(&e));
                }
            }
        }
        println!("verifier: all loaded programs: {insns} instructions verified, loaded in {ms:.0} ms");
        return Ok(if failed == 0 { 0 } else { 1 });
    }
    Ok(0)
}

/// `--load`'s line for a program the kernel accepted, read back by
/// [`read_loaded_line`].
fn loaded_line(prog: &str, c: &session::LoadCost) -> String {
    let over = match c.verified_insns {
        Some(n) if n > session::VERIFIED_INSNS_BUDGET => {
            format!(", over the budget of {}", session::VERIFIED_INSNS_BUDGET)
        }
        _ => String::new(),
    };
    format!(
        "verifier: {prog}: ok ({} instructions verified, loaded in {:.1} ms{over})",
        c.verified_insns.map_or("?".to_string(), |n| n.to_string()),
        c.load.as_secs_f64() * 1e3
    )
}

/// A program's name and verified instructions from a line of `--load`
/// (the tests' and the guest matrix's reading); `None` for other lines and
/// where the kernel gave no count.
pub fn read_loaded_line(line: &str) -> Option<(&str, u32)> {
    let (prog, rest) = line.strip_prefix("verifier: ")?.split_once(": ok (")?;
    Some((prog, rest.split(' ').next()?.parse().ok()?))
}

/// The mode a run would be in, and why: the fault path by fentry or
/// kprobes, else the x86 tracepoint, else nothing. `refused(twin)`: why
/// the kernel refused a fentry twin at load, if it did.
fn mode_line(resolved: &[probes::Resolved], refused: &dyn Fn(&str) -> Option<String>) -> String {
    use probes::{Backend, Resolution};
    let find = |p: Program| resolved.iter().find(|r| r.spec.program == p).map(|r| &r.resolution);
    let fault_path = match find(Program::FaultEntry) {
        Some(Resolution::Attach { backend: Backend::Fentry, fallback, .. }) => {
            match (Program::FaultEntry.fentry_name().and_then(refused), fallback) {
                (None, _) if probes::exit_only(resolved) => Ok(
                    "fentry mode: the fault path by fentry/fexit (BPF trampolines), exit-only: the exception opens each fault, the fexit closes it"
                        .to_string(),
                ),
                (None, _) => Ok("fentry mode: the fault path by fentry/fexit (BPF trampolines)".to_string()),
                (Some(_), Ok(())) => {
                    Ok("kprobe mode: the fault path by kprobes (the kernel refused fentry at load)"
                        .to_string())
                }
                (Some(f), Err(k)) => Err(format!("the kernel refused fentry at load ({f}); {k}")),
            }
        }
        Some(Resolution::Attach { .. }) => Ok("kprobe mode: the fault path by kprobes".to_string()),
        Some(Resolution::Unavailable(w) | Resolution::Refused(w)) => Err(w.clone()),
        None => Err("no fault-path probe in the table".to_string()),
    };
    match fault_path {
        Ok(line) => format!("mode: {line}; every class whose probes are below is measured"),
        Err(why) => match find(Program::PageFaultUser) {
            Some(Resolution::Attach { .. }) => format!(
                "mode: tracepoint mode (no fault path: {why}): faults, write_faults, wp_faults and not_present by the exceptions tracepoints; no latency, reuse, copy, spurious"
            ),
            _ => format!("mode: none: no fault source here ({why}); nothing would be measured"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaded_lines_read_back() {
        let c =
            session::LoadCost { verified_insns: Some(21_118), load: std::time::Duration::from_millis(27) };
        assert_eq!(read_loaded_line(&loaded_line("fault_return", &c)), Some(("fault_return", 21_118)));
        let over = session::LoadCost { verified_insns: Some(session::VERIFIED_INSNS_BUDGET + 1), ..c };
        assert!(loaded_line("x", &over).contains("over the budget"));
        let unknown = session::LoadCost { verified_insns: None, ..c };
        assert_eq!(read_loaded_line(&loaded_line("x", &unknown)), None);
        assert_eq!(read_loaded_line("verifier: all loaded programs: 5 instructions verified"), None);
    }
}
