//! The guest runner: an initramfs with busybox, faultscope (and, on amd64,
//! the shared libraries it links; the arm64 build is static), the guest
//! scripts and one case script, booted under QEMU TCG (KVM here is a nested
//! software hypervisor that stock kernels die under; arm64 is emulated
//! anyway). Results come back as marked sections of the console log.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{cross, kernels::GuestKernel, root, run};

pub struct GuestRun {
    pub console: String,
    pub sections: BTreeMap<String, String>,
    pub wall: Duration,
}

impl GuestRun {
    pub fn section(&self, name: &str) -> Result<&str> {
        self.sections.get(name).map(String::as_str).with_context(|| {
            format!("the guest printed no section {name}; console tail:\n{}", tail(&self.console, 40))
        })
    }

    /// Values of marker lines `@@FS-<tag> <case> <value>`.
    pub fn marker(&self, tag: &str, case: &str) -> Option<String> {
        let prefix = format!("@@FS-{tag} {case} ");
        self.console
            .lines()
            .find_map(|l| l.trim_end_matches('\r').strip_prefix(&prefix).map(|v| v.trim().to_string()))
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Builds the release binary the guest of `arch` runs.
pub fn build_faultscope(arch: &str) -> Result<PathBuf> {
    match arch {
        "amd64" => {}
        "arm64" => return cross::build_faultscope(),
        other => bail!("no faultscope build for arch {other}"),
    }
    run(Command::new("cargo").current_dir(root()).args(["build", "--release", "-p", "faultscope"]))?;
    Ok(root().join("target/release/faultscope"))
}

/// Shared libraries a dynamic binary needs, from ldd: (path, path again),
/// since the guest keeps the host's layout.
fn shared_libs(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(bin).output().context("ldd")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for l in text.lines() {
        let l = l.trim();
        let path = if let Some((_, rhs)) = l.split_once("=>") {
            rhs.split_whitespace().next()
        } else {
            l.split_whitespace().next()
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

fn copy_into(rootfs: &Path, src: &Path, dst: &str) -> Result<()> {
    let to = rootfs.join(dst.trim_start_matches('/'));
    fs::create_dir_all(to.parent().unwrap())?;
    fs::copy(src, &to).with_context(|| format!("copying {} into the initramfs", src.display()))?;
    Ok(())
}

/// Builds `dir/init.cpio.gz` for an `arch` guest, holding the guest scripts
/// and `case_script`.
pub fn initramfs(
    dir: &Path,
    arch: &str,
    faultscope: &Path,
    case_script: &str,
    env: &[(&str, String)],
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
    if arch == "amd64" {
        for lib in shared_libs(faultscope)? {
            copy_into(&rootfs, &lib, lib.to_str().unwrap())?;
        }
    }
    let guest = root().join("xtask/guest");
    let oracle = dir.join("oracle");
    run(Command::new(cc).args(["-O2", "-Wall", "-static", "-o"]).arg(&oracle).arg(guest.join("oracle.c")))?;
    copy_into(&rootfs, &oracle, "/oracle")?;
    for f in ["init", "lib.sh"] {
        copy_into(&rootfs, &guest.join(f), f)?;
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
    let (qemu, args): (&str, Vec<String>) = match k.arch {
        "amd64" => (
            "qemu-system-x86_64",
            [
                "-accel",
                "tcg,thread=multi",
                "-cpu",
                "max",
                "-smp",
                "2",
                "-m",
                "2G",
                "-append",
                "console=ttyS0 panic=-1 quiet",
            ]
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
    let log = dir.join("console.log");
    let started = Instant::now();
    let status = Command::new("timeout")
        .arg("--kill-after=5")
        .arg(timeout.as_secs().to_string())
        .arg(qemu)
        .args(&args)
        .args(["-nographic", "-no-reboot", "-nic", "none", "-kernel"])
        .arg(vmlinuz)
        .arg("-initrd")
        .arg(cpio)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log)?)
        .stderr(Stdio::inherit())
        .status()
        .with_context(|| format!("starting {qemu} (run `cargo xtask setup`)"))?;
    let wall = started.elapsed();
    let console = String::from_utf8_lossy(&fs::read(&log)?).replace('\r', "");
    if !console.contains("@@FS-GUEST-DONE") {
        bail!(
            "the {} guest did not finish (qemu {status}, {:.0}s); console log {}:\n{}",
            k.name,
            wall.as_secs_f64(),
            log.display(),
            tail(&console, 60)
        );
    }
    Ok(GuestRun { sections: sections(&console), console, wall })
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

#[cfg(test)]
mod tests {
    #[test]
    fn sections_are_parsed() {
        let s = super::sections("x\n@@FS-BEGIN a\n1\n2\n@@FS-END a\n@@FS-BEGIN b\n3\n");
        assert_eq!(s["a"], "1\n2\n");
        assert!(!s.contains_key("b"), "an unterminated section is not a result");
    }
}
