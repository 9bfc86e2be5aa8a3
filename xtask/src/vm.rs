//! The guest runner: an initramfs with busybox, faultscope (the static
//! binary `cargo xtask dist` ships: no libraries), the guest scripts and one
//! case script, booted under QEMU TCG (KVM here is a nested
//! software hypervisor that stock kernels die under; arm64 is emulated
//! anyway). Results come back as marked sections of the console log.

use std::{
    collections::BTreeMap,
    fs,
    io::{BufRead as _, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use faultscope::report::cover_letter::STALE_TLB_MODEL;

use crate::{
    cross, dist,
    kernels::GuestKernel,
    util::{root, run},
};

pub struct GuestRun {
    pub console: String,
    pub sections: BTreeMap<String, String>,
    pub wall: Duration,
    /// With `--tlb stale`: the faults QEMU's stale-TLB model raised in the
    /// whole run, all vCPUs (its exit line); None with `--tlb exact`, or
    /// when QEMU did not exit normally.
    pub stale_tlb_faults: Option<u64>,
    /// The TLB model it ran under.
    pub tlb: Tlb,
}

/// How the guests' TLBs behave: the choice of `--tlb`, for every guest
/// this process boots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Tlb {
    /// Debian's QEMU: a store through a TLB entry without write permission
    /// re-walks the page tables, so no spurious write faults.
    #[default]
    Exact,
    /// QEMU patched with the stale-TLB model ([`crate::qemu`], built on
    /// first use): a vCPU that cached a page read-only takes a write fault
    /// on it until it flushes that entry, even when another CPU made the
    /// page writable, as real hardware may.
    Stale,
    /// The patched QEMU with the model switched off: it must behave as
    /// Debian's (the stale-TLB stage compares the two).
    ModelOff,
}

static TLB: OnceLock<Tlb> = OnceLock::new();

/// Sets the TLB model of the guests this process boots, once (`main` from
/// `--tlb`; a stage that boots under another model says so in its
/// [`Machine`]).
pub fn set_tlb(tlb: Tlb) {
    assert!(TLB.set(tlb).is_ok(), "the TLB model is set once, by main");
}

/// The TLB model the guests run with (`Exact` until [`set_tlb`]).
pub fn tlb() -> Tlb {
    TLB.get().copied().unwrap_or_default()
}

impl GuestRun {
    pub fn section(&self, name: &str) -> Result<&str> {
        self.sections.get(name).map(String::as_str).with_context(|| {
            format!(
                "the guest printed no section {name}; console tail:\n{}",
                crate::util::tail(&self.console, 40)
            )
        })
    }

    /// The kernel's warnings and errors (dmesg levels 0-4, kernel facility)
    /// printed while the case ran (after init's "case starts" line): the
    /// guest keeps them off the console then, so a run shows them from here.
    pub fn kernel_complaints(&self) -> Vec<&str> {
        let dmesg = self.sections.get("dmesg").map(String::as_str).unwrap_or("");
        dmesg
            .lines()
            .skip_while(|l| !l.contains("faultscope-guest: case starts"))
            .filter(|l| {
                let level = l
                    .strip_prefix('<')
                    .and_then(|r| r.split_once('>'))
                    .and_then(|(n, _)| n.parse::<u32>().ok());
                matches!(level, Some(n) if n <= 4)
            })
            .collect()
    }

    /// Values of marker lines `@@FS-<tag> <case> <value>`.
    pub fn marker(&self, tag: &str, case: &str) -> Option<String> {
        let prefix = format!("@@FS-{tag} {case} ");
        self.console
            .lines()
            .find_map(|l| l.trim_end_matches('\r').strip_prefix(&prefix).map(|v| v.trim().to_string()))
    }

    /// The rest of every marker line `@@FS-<tag> ...`.
    pub fn markers<'a>(&'a self, tag: &str) -> impl Iterator<Item = &'a str> + 'a {
        let prefix = format!("@@FS-{tag} ");
        self.console.lines().filter_map(move |l| l.trim_end_matches('\r').strip_prefix(prefix.as_str()))
    }

    /// An error if the guest script gave up (its `fail`: an `@@FS-FAIL`
    /// line) or ended with a status other than 0 (a shell error, such as an
    /// unset variable under `set -u`), naming `what` ran, with the tail of
    /// what the script printed (the kernel's log follows it).
    pub fn failed(&self, what: &str) -> Result<()> {
        let script = self.console.rsplit_once("@@FS-BEGIN dmesg").map_or(self.console.as_str(), |(s, _)| s);
        let tail = || crate::util::tail(script, 60);
        if let Some(l) = self.console.lines().find(|l| l.starts_with("@@FS-FAIL ")) {
            bail!("{what} failed: {l}\nconsole tail:\n{}", tail());
        }
        match self.markers("GUEST-DONE").find_map(|m| m.strip_prefix("rc=")) {
            Some(rc) if rc.trim() != "0" => {
                bail!("{what}: its script exited with {}:\nconsole tail:\n{}", rc.trim(), tail())
            }
            _ => Ok(()),
        }
    }

    /// A run that QEMU did not make (a host script's, a test's): its
    /// sections parsed from `console`, the exact TLB.
    pub fn from_console(console: String, wall: Duration) -> GuestRun {
        GuestRun { sections: sections(&console), console, wall, stale_tlb_faults: None, tlb: Tlb::Exact }
    }

    /// An error unless case `case` exited 0 (its `@@FS-RC` marker): the
    /// status it gave, and section `out_section` (what it printed).
    pub fn exited_ok(&self, case: &str, out_section: &str) -> Result<()> {
        let rc = self.marker("RC", case).unwrap_or_default();
        if rc != "0" {
            bail!("{case} exited with {rc:?}:\n{}", self.section(out_section).unwrap_or(""));
        }
        Ok(())
    }
}

/// Builds the binary the guest of `arch` runs: the static one `cargo xtask
/// dist` ships, so the guests test what is released ([`dist::static_build`]),
/// and beside it the test workload ([`dist::workload_beside`]).
pub fn build_faultscope(arch: &str) -> Result<PathBuf> {
    dist::static_build(arch)
}

fn copy_into(rootfs: &Path, src: &Path, dst: &str) -> Result<()> {
    let to = rootfs.join(dst.trim_start_matches('/'));
    fs::create_dir_all(to.parent().unwrap())?;
    fs::copy(src, &to).with_context(|| format!("copying {} into the initramfs", src.display()))?;
    Ok(())
}

/// The guest's C helpers, `xtask/guest/NAME.c`, built static into `/NAME`:
/// the tracefs oracle, and the attach timer of the overhead benchmark.
const HELPERS: [&str; 2] = ["oracle", "linetime"];

/// Builds `dir/init.cpio.gz` for an `arch` guest, holding the guest scripts
/// and `case_script`.
pub fn initramfs(
    dir: &Path,
    arch: &str,
    faultscope: &Path,
    case_script: &str,
    env: &[(&str, String)],
) -> Result<PathBuf> {
    initramfs_with(dir, arch, faultscope, case_script, env, &[])
}

/// [`initramfs`] plus `extra` files: (file on this machine, path in the
/// guest), e.g. kernel modules from [`kernel_modules`].
pub fn initramfs_with(
    dir: &Path,
    arch: &str,
    faultscope: &Path,
    case_script: &str,
    env: &[(&str, String)],
    extra: &[(PathBuf, String)],
) -> Result<PathBuf> {
    let rootfs = dir.join("root");
    if rootfs.exists() {
        fs::remove_dir_all(&rootfs)?;
    }
    for d in ["bin", "sbin", "proc", "sys", "dev", "tmp", "usr/bin"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    let (busybox, cc) = match arch {
        "arm64" => (cross::busybox()?, cross::CC),
        _ => (PathBuf::from("/bin/busybox"), "gcc"),
    };
    copy_into(&rootfs, &busybox, "/bin/busybox")?;
    copy_into(&rootfs, faultscope, "/faultscope")?;
    copy_into(&rootfs, &dist::workload_beside(faultscope), "/fs-workload")?;
    let guest = root().join("xtask/guest");
    for helper in HELPERS {
        let bin = dir.join(helper);
        run(Command::new(cc)
            .args(["-O2", "-Wall", "-static", "-o"])
            .arg(&bin)
            .arg(guest.join(format!("{helper}.c"))))?;
        copy_into(&rootfs, &bin, &format!("/{helper}"))?;
    }
    for f in ["init", "lib.sh"] {
        copy_into(&rootfs, &guest.join(f), f)?;
    }
    for (src, dst) in extra {
        copy_into(&rootfs, src, dst)?;
    }
    let mut script = String::new();
    for (k, v) in env {
        script.push_str(&format!("export {k}='{v}'\n"));
    }
    script.push_str(
        &fs::read_to_string(guest.join(case_script)).with_context(|| format!("reading {case_script}"))?,
    );
    fs::write(rootfs.join("case.sh"), script)?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(rootfs.join("init"), fs::Permissions::from_mode(0o755))?;
    let cpio = dir.join("init.cpio.gz");
    let status = Command::new("sh")
        .current_dir(&rootfs)
        .arg("-c")
        .arg(format!("find . | cpio -o -H newc --quiet | gzip -1 > {}", cpio.display()))
        .status()?;
    if !status.success() {
        bail!("building the initramfs failed");
    }
    Ok(cpio)
}

/// Boots `kernel` with the initramfs under QEMU TCG and returns the console.
pub fn boot(k: GuestKernel, vmlinuz: &Path, cpio: &Path, dir: &Path, timeout: Duration) -> Result<GuestRun> {
    boot_with(k, vmlinuz, cpio, dir, timeout, &[], Machine::host())
}

/// How QEMU runs a guest: its clock and its TLB model.
#[derive(Clone, Copy, Debug)]
pub struct Machine {
    pub clock: Clock,
    pub tlb: Tlb,
}

impl Machine {
    /// Host time, the TLB model this process was given ([`set_tlb`]).
    pub fn host() -> Machine {
        Machine { clock: Clock::Host, tlb: tlb() }
    }
}

/// What the guest's clock counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Clock {
    /// Host time, the vCPUs on threads of their own (multi-threaded TCG).
    Host,
    /// Guest instructions (`-icount shift=0`: each one is 1 ns, one host
    /// thread for all vCPUs, idle time skipped): the guest's timings are the
    /// same however loaded this machine is, at the price of a slower guest.
    Instructions,
}

/// The QEMU binary for `k` on `machine`, and its arguments up to the
/// kernel's: accelerator, clock, TLB model, machine and command line.
fn qemu_command(k: GuestKernel, machine: Machine) -> Result<(PathBuf, Vec<String>)> {
    let Machine { clock, tlb } = machine;
    let stale = if tlb == Tlb::Stale { ",stale-tlb=on" } else { "" };
    let mut tcg: Vec<String> = match clock {
        Clock::Host => vec!["-accel".into(), format!("tcg,thread=multi{stale}")],
        Clock::Instructions => vec![
            "-accel".into(),
            format!("tcg,thread=single{stale}"),
            "-icount".into(),
            "shift=0,align=off,sleep=off".into(),
        ],
    };
    // The guest's command line says so too: the reports keep it
    // (`provenance.kernel_cmdline`), and the cover letter labels their
    // spurious faults as modelled.
    let model = if tlb == Tlb::Stale { format!(" {STALE_TLB_MODEL}") } else { String::new() };
    let (qemu, mut args): (&str, Vec<String>) = match k.arch {
        "amd64" => (
            "qemu-system-x86_64",
            ["-cpu", "max", "-smp", "2", "-m", "2G", "-append", "console=ttyS0 panic=-1 quiet"]
                .map(String::from)
                .to_vec(),
        ),
        // pauth-impdef: QEMU's default pointer-authentication algorithm
        // makes the guest about 3x slower.
        "arm64" => (
            "qemu-system-aarch64",
            [
                "-M",
                "virt",
                "-cpu",
                "max,pauth-impdef=on",
                "-smp",
                "2",
                "-m",
                "2G",
                "-append",
                "console=ttyAMA0 panic=-1 quiet",
            ]
            .map(String::from)
            .to_vec(),
        ),
        other => bail!("no guest runner for arch {other}"),
    };
    if let Some(cmdline) = args.last_mut() {
        cmdline.push_str(&model);
        // bench hotpatch-mem writes its own read-only text through
        // /proc/self/mem, as a debugger does; a kernel built with
        // PROC_MEM_FORCE_PTRACE (the 7.3 kernels built here) lets only a
        // ptracer do that (EIO before any fault). Older kernels ignore it.
        cmdline.push_str(" proc_mem.force_override=always");
    }
    let qemu: PathBuf = match tlb {
        Tlb::Exact => PathBuf::from(qemu),
        Tlb::Stale | Tlb::ModelOff => {
            // Debian's firmware: the patched build installs none.
            tcg.extend(crate::qemu::FIRMWARE_ARGS.iter().map(|s| s.to_string()));
            crate::qemu::build()?.binary(k.arch)?.to_path_buf()
        }
    };
    tcg.extend(args);
    Ok((qemu, tcg))
}

/// [`boot`] with `extra` QEMU arguments (e.g. [`virtfs_host_root`]) on
/// `machine`.
pub fn boot_with(
    k: GuestKernel,
    vmlinuz: &Path,
    cpio: &Path,
    dir: &Path,
    timeout: Duration,
    extra: &[String],
    machine: Machine,
) -> Result<GuestRun> {
    let (qemu, args) = qemu_command(k, machine)?;
    let log = dir.join("console.log");
    let stderr_log = dir.join("qemu.stderr");
    let started = Instant::now();
    let mut child = Command::new("timeout")
        .arg("--kill-after=5")
        .arg(timeout.as_secs().to_string())
        .arg(&qemu)
        .args(&args)
        .args(["-nographic", "-no-reboot", "-nic", "none", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(cpio)
        .args(extra)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log)?)
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} (run `cargo xtask setup`)", qemu.display()))?;
    // QEMU's stderr, echoed as it comes and kept for the model's exit line.
    let pipe = child.stderr.take().context("no stderr pipe")?;
    let mut kept = fs::File::create(&stderr_log)?;
    let echo = std::thread::spawn(move || {
        for line in std::io::BufReader::new(pipe).split(b'\n').map_while(Result::ok) {
            let _ = kept.write_all(&line).and_then(|()| kept.write_all(b"\n"));
            eprintln!("{}", String::from_utf8_lossy(&line));
        }
    });
    let status = child.wait()?;
    let _ = echo.join();
    let wall = started.elapsed();
    let stale_tlb_faults = crate::qemu::faults_raised(&String::from_utf8_lossy(&fs::read(&stderr_log)?));
    if machine.tlb == Tlb::Stale && stale_tlb_faults.is_none() {
        eprintln!(
            "xtask: QEMU printed no stale-tlb line (it did not exit normally?): {}",
            stderr_log.display()
        );
    }
    let console = String::from_utf8_lossy(&fs::read(&log)?).replace('\r', "");
    if !console.contains("@@FS-GUEST-DONE") {
        bail!(
            "the {} guest did not finish (qemu {status}, {:.0}s); console log {}:\n{}",
            k.name,
            wall.as_secs_f64(),
            log.display(),
            crate::util::tail(&console, 60)
        );
    }
    Ok(GuestRun { sections: sections(&console), console, wall, stale_tlb_faults, tlb: machine.tlb })
}

/// The 9p tag [`virtfs_host_root`] exports this machine's `/` under.
pub const HOST_ROOT_TAG: &str = "hostroot";

/// QEMU arguments that export this machine's whole `/`, read-only, to the
/// guest over virtio-9p (tag [`HOST_ROOT_TAG`]), so a guest can chroot into
/// the host's own userspace. `multidevs=remap` keeps inode numbers of the
/// host's several file systems apart. The guest kernel needs 9p: the generic
/// Debian flavour has it as modules ([`kernel_modules`]); -cloud has none.
pub fn virtfs_host_root() -> Vec<String> {
    vec![
        "-virtfs".into(),
        format!("local,path=/,mount_tag={HOST_ROOT_TAG},security_model=none,readonly=on,multidevs=remap"),
    ]
}

/// The `depends=` entry of a kernel module's .modinfo (its NUL-separated
/// `key=value` strings): the modules it needs loaded first.
fn module_depends(ko: &[u8]) -> Vec<String> {
    ko.split(|&b| b == 0)
        .filter_map(|s| s.strip_prefix(b"depends="))
        .flat_map(|d| String::from_utf8_lossy(d).split(',').map(str::to_string).collect::<Vec<_>>())
        .filter(|d| !d.is_empty())
        .collect()
}

/// Kernel modules `wanted` (by name, e.g. "9p") and what they depend on,
/// from an unpacked Debian package's `modules` folder (`kernel/**.ko.xz`):
/// decompressed under `dir/modules`, in load order (dependencies first;
/// read from each module's own `depends=`, since a .deb has no modules.dep).
/// Returns (decompressed file, `/modules/NAME.ko` in the guest) pairs; the
/// guest `insmod`s them in this order.
pub fn kernel_modules(modules: &Path, wanted: &[&str], dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    fn find(dir: &Path, file: &str) -> Option<PathBuf> {
        for e in fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            if p.is_dir() {
                if let Some(f) = find(&p, file) {
                    return Some(f);
                }
            } else if p.file_name().is_some_and(|n| n == file) {
                return Some(p);
            }
        }
        None
    }
    fn visit(
        name: &str,
        modules: &Path,
        out_dir: &Path,
        chain: &mut Vec<String>,
        out: &mut Vec<(PathBuf, String)>,
    ) -> Result<()> {
        let guest = format!("/modules/{name}.ko");
        if out.iter().any(|(_, g)| *g == guest) {
            return Ok(());
        }
        if chain.iter().any(|c| c == name) {
            bail!("kernel modules depend on each other in a cycle: {} -> {name}", chain.join(" -> "));
        }
        // Module names use '_' where files may use '-'.
        let src =
            [format!("{name}.ko.xz"), format!("{}.ko.xz", name.replace('_', "-")), format!("{name}.ko")]
                .iter()
                .find_map(|f| find(&modules.join("kernel"), f))
                .with_context(|| format!("no module {name} under {}", modules.join("kernel").display()))?;
        let dst = out_dir.join(format!("{name}.ko"));
        if src.extension().is_some_and(|e| e == "xz") {
            let o =
                Command::new("xz").arg("-dc").arg(&src).output().context("xz (run `cargo xtask setup`)")?;
            if !o.status.success() {
                bail!("xz -dc {} failed: {}", src.display(), String::from_utf8_lossy(&o.stderr));
            }
            fs::write(&dst, &o.stdout)?;
        } else {
            fs::copy(&src, &dst)?;
        }
        chain.push(name.to_string());
        for d in module_depends(&fs::read(&dst)?) {
            visit(&d, modules, out_dir, chain, out)?;
        }
        chain.pop();
        out.push((dst, guest));
        Ok(())
    }
    let out_dir = dir.join("modules");
    fs::create_dir_all(&out_dir)?;
    let mut out = Vec::new();
    for w in wanted {
        visit(w, modules, &out_dir, &mut Vec::new(), &mut out)?;
    }
    Ok(out)
}

/// `@@FS-BEGIN name` .. `@@FS-END name` blocks of the console.
pub fn sections(console: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut cur: Option<(String, String)> = None;
    for l in console.lines() {
        if let Some(n) = l.strip_prefix("@@FS-BEGIN ") {
            cur = Some((n.trim().to_string(), String::new()));
        } else if let Some(n) = l.strip_prefix("@@FS-END ") {
            if let Some((name, body)) = cur.take() {
                if name == n.trim() {
                    out.insert(name, body);
                }
            }
        } else if let Some((_, body)) = cur.as_mut() {
            body.push_str(l);
            body.push('\n');
        }
    }
    out
}

/// How many guests boot at once: `XTASK_GUESTS`, else one per host CPU, at
/// most 4 (each has 2 vCPUs and 2 GiB). A guest keeps about one host CPU
/// busy (its own single-threaded work, and idle waits such as the kernel's
/// grace periods at detach), so two guests on two CPUs share them well.
pub fn guests_at_once() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
    std::env::var("XTASK_GUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(cpus).max(1)
}

/// Runs `boot` on each of `items`, [`guests_at_once`] at a time; the
/// results in the order of `items`.
pub fn boot_each<T: Sync, R: Send>(items: &[T], boot: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> = items.iter().map(|_| Default::default()).collect();
    std::thread::scope(|sc| {
        for _ in 0..guests_at_once().min(items.len()) {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = boot(item);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
        }
    });
    results.into_iter().filter_map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner())).collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_script_that_died_is_a_failure() {
        let run = |c: &str| super::GuestRun::from_console(c.into(), Duration::ZERO).failed("the case");
        let died = "@@FS-UP boot 1\nsh: 2: parameter not set\n@@FS-BEGIN dmesg\n<6>x\n@@FS-END dmesg\n@@FS-GUEST-DONE rc=2\n";
        let e = run(died).unwrap_err().to_string();
        assert!(e.contains("exited with 2") && e.contains("parameter not set") && !e.contains("<6>x"), "{e}");
        let gave_up = "@@FS-FAIL run1: no start\n@@FS-GUEST-DONE rc=1\n";
        assert!(run(gave_up).unwrap_err().to_string().contains("failed: @@FS-FAIL run1: no start"));
        run("@@FS-UP done 2\n@@FS-GUEST-DONE rc=0\n").unwrap();
    }

    #[test]
    fn sections_are_parsed() {
        let s = super::sections("x\n@@FS-BEGIN a\n1\n2\n@@FS-END a\n@@FS-BEGIN b\n3\n");
        assert_eq!(s["a"], "1\n2\n");
        assert!(!s.contains_key("b"), "an unterminated section is not a result");
    }

    #[test]
    fn kernel_complaints_are_warnings_and_worse() {
        let console = "@@FS-BEGIN dmesg\n<4>[ 0.5] boot warning\n<12>[ 1.0] faultscope-guest: case starts\n\
                       <6>[ 1.1] info\n<3>[ 9.1] rcu: INFO: stall\n<12>[ 9.2] user\n\
                       <4>[ 9.3] WARNING: x\n@@FS-END dmesg\n";
        let run = super::GuestRun::from_console(console.into(), std::time::Duration::ZERO);
        assert_eq!(run.kernel_complaints(), ["<3>[ 9.1] rcu: INFO: stall", "<4>[ 9.3] WARNING: x"]);
    }

    #[test]
    fn module_depends_are_read_from_modinfo() {
        let ko = b"\x7fELF\0junk\0license=GPL\0depends=netfs,9pnet\0intree=Y\0name=9p\0";
        assert_eq!(super::module_depends(ko), ["netfs", "9pnet"]);
        assert!(super::module_depends(b"depends=\0name=netfs\0").is_empty());
    }
}
