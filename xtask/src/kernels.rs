//! Guest kernels: stock Debian kernel packages, resolved from their
//! meta-packages, downloaded once with `apt-get download` and unpacked
//! (never installed) under target/kernels.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::{root, run};

/// A guest kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct GuestKernel {
    pub name: &'static str,
    /// Debian meta-package that names the current version.
    pub meta: &'static str,
    pub arch: &'static str,
}

pub const KERNELS: &[GuestKernel] = &[GuestKernel {
    name: "6.12-cloud-amd64",
    meta: "linux-image-6.12-cloud-amd64",
    arch: "amd64",
}];

pub fn by_name(name: &str) -> Result<GuestKernel> {
    KERNELS
        .iter()
        .copied()
        .find(|k| k.name == name)
        .with_context(|| {
            let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
            format!("unknown kernel {name}; known: {}", names.join(", "))
        })
}

/// The versioned package a meta-package depends on, e.g.
/// linux-image-6.12.57+deb12-cloud-amd64.
fn resolve_meta(meta: &str) -> Result<String> {
    let out = Command::new("apt-cache")
        .args(["depends", meta])
        .output()
        .context("apt-cache")?;
    let text = String::from_utf8_lossy(&out.stdout);
    for l in text.lines() {
        if let Some(dep) = l.trim().strip_prefix("Depends: ") {
            if dep.starts_with("linux-image-") && !dep.contains('<') {
                return Ok(dep.trim().to_string());
            }
        }
    }
    bail!("apt-cache could not resolve {meta} (run apt-get update?): {text}")
}

/// Returns the path of the unpacked vmlinuz, downloading on first use.
pub fn fetch(k: GuestKernel) -> Result<PathBuf> {
    let cache = root().join("target/kernels");
    fs::create_dir_all(&cache)?;
    let marker = cache.join(format!("{}.pkg", k.name));
    let pkg = match fs::read_to_string(&marker) {
        Ok(p) if cache.join(p.trim()).is_dir() => p.trim().to_string(),
        _ => {
            let mut pkg = resolve_meta(k.meta);
            if pkg.is_err() {
                run(Command::new("apt-get").arg("update"))?;
                pkg = resolve_meta(k.meta);
            }
            let pkg = pkg?;
            let dir = cache.join(&pkg);
            if !dir.is_dir() {
                run(Command::new("apt-get")
                    .current_dir(&cache)
                    .args(["download", &pkg]))?;
                let deb = fs::read_dir(&cache)?
                    .flatten()
                    .map(|e| e.path())
                    .find(|p| {
                        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                            n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb")
                        })
                    })
                    .with_context(|| format!("apt-get download left no .deb for {pkg}"))?;
                run(Command::new("dpkg").arg("-x").arg(&deb).arg(&dir))?;
                fs::remove_file(&deb)?;
            }
            fs::write(&marker, &pkg)?;
            pkg
        }
    };
    let boot = cache.join(&pkg).join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .with_context(|| format!("reading {}", boot.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .with_context(|| format!("no vmlinuz in {}", boot.display()))?;
    Ok(vmlinuz)
}
