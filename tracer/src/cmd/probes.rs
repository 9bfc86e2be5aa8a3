//! `faultscope probes`: the probe table resolved against this kernel;
//! `--load` also runs every program through the verifier.

use crate::{
    kernel::{self, probes, session},
    report::text::{safe, safe_lines},
};

pub fn run(load: bool) -> anyhow::Result<i32> {
    kernel::require_root()?;
    let tracefs = kernel::tracefs()?;
    println!("{:<16} {:<8} {:<10} {:<34} HERE", "PROGRAM", "ARCH", "REQUIRED", "HOOK");
    for r in probes::resolve_here(&tracefs) {
        let hook = match r.spec.hook {
            probes::Hook::Kprobe(f) => format!("kprobe {}", f.join(" > ")),
            probes::Hook::Kretprobe(f) => format!("kretprobe {}", f.join(" > ")),
            probes::Hook::Tracepoint(c, n) => format!("tp {c}:{n}"),
        };
        let here = match r.resolution {
            probes::Resolution::Attach(s) => format!("attach {}", safe(&s)),
            probes::Resolution::Unavailable(w) => format!("unavailable: {}", safe(&w)),
        };
        println!(
            "{:<16} {:<8} {:<10} {:<34} {}",
            r.spec.program,
            format!("{:?}", r.spec.arch).to_lowercase(),
            if r.spec.required { "yes" } else { "no" },
            hook,
            here
        );
        println!("{:<16} measures: {} (kernel >= {})", "", r.spec.measures, r.spec.min_kernel);
    }
    if load {
        let mut failed = 0;
        for (prog, res) in session::load_all(&tracefs)? {
            match res {
                Ok(()) => println!("verifier: {prog}: ok"),
                Err(e) => {
                    failed += 1;
                    println!("verifier: {prog}: REJECTED: {}", safe_lines(&e));
                }
            }
        }
        return Ok(if failed == 0 { 0 } else { 1 });
    }
    Ok(0)
}
