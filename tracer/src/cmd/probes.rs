//! `faultscope probes`: the probe table resolved against this kernel, with
//! the backend each probe would use and why; `--load` also runs every
//! program through the verifier.

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
    let btf = probes::kernel_btf();
    let resolved = probes::resolve_here(&tracefs, &btf, backend);
    println!("{:<18} {:<8} {:<10} {:<34} HERE", "PROGRAM", "ARCH", "REQUIRED", "HOOK");
    for r in &resolved {
        let hook = match r.spec.hook {
            probes::Hook::Kprobe(f) => format!("kprobe {}", f.join(" > ")),
            probes::Hook::Kretprobe(f) => format!("kretprobe {}", f.join(" > ")),
            probes::Hook::Tracepoint(c, n) => format!("tp {c}:{n}"),
        };
        let here = match &r.resolution {
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
    for (what, default) in
        [("record and bench", crate::cmd::record::DEFAULT_STATS), ("serve", crate::cmd::serve::DEFAULT_STATS)]
    {
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
        for (prog, verdict) in session::load_all(&tracefs, &resolved, &btf, backend)? {
            match verdict {
                Verdict::Ok => println!("verifier: {prog}: ok"),
                Verdict::NotHere(e) => {
                    println!("verifier: {prog}: not loadable here (auto uses the kprobe): {}", safe_lines(&e))
                }
                Verdict::Rejected(e) => {
                    failed += 1;
                    println!("verifier: {prog}: REJECTED: {}", safe_lines(&e));
                }
            }
        }
        return Ok(if failed == 0 { 0 } else { 1 });
    }
    Ok(0)
}
