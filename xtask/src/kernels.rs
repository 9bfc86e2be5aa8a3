//! Guest kernels: stock Debian kernel packages, resolved from their
//! meta-packages, downloaded once with `apt-get download` and unpacked
//! (never installed) under target/kernels. Each suite and architecture gets
//! a private apt configuration there, so the host's apt setup is not changed.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{root, run, setup};

/// A guest kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct GuestKernel {
    /// `<version>-<flavour>`; the version must prefix the resolved package's.
    pub name: &'static str,
    /// Debian meta-package that names the current version.
    pub meta: &'static str,
    /// Debian architecture: amd64 or arm64.
    pub arch: &'static str,
    /// The suite that carries `meta`.
    pub suite: &'static str,
}

pub const KERNELS: &[GuestKernel] = &[
    GuestKernel {
        name: "6.12-cloud-amd64",
        meta: "linux-image-6.12-cloud-amd64",
        arch: "amd64",
        suite: "bookworm-security",
    },
    GuestKernel {
        name: "6.12-cloud-arm64",
        meta: "linux-image-6.12-cloud-arm64",
        arch: "arm64",
        suite: "bookworm-security",
    },
    GuestKernel {
        name: "7.3-cloud-amd64",
        meta: "linux-image-cloud-amd64",
        arch: "amd64",
        suite: "trixie-backports",
    },
    GuestKernel {
        name: "7.3-cloud-arm64",
        meta: "linux-image-cloud-arm64",
        arch: "arm64",
        suite: "trixie-backports",
    },
];

/// The generic (not -cloud) 6.12 amd64 kernel: it has 9p and virtio as
/// modules (the -cloud flavour has no 9p at all), so a guest can run the
/// host's own userspace over virtio-9p (`cargo xtask redis`). Kept out of
/// [`KERNELS`], the matrix's default list: it is a 100 MB download only the
/// Redis test needs.
pub const GENERIC_6_12_AMD64: GuestKernel = GuestKernel {
    name: "6.12-amd64",
    meta: "linux-image-6.12-amd64",
    arch: "amd64",
    suite: "bookworm-security",
};

pub fn by_name(name: &str) -> Result<GuestKernel> {
    KERNELS.iter().chain([&GENERIC_6_12_AMD64]).copied().find(|k| k.name == name).with_context(|| {
        let names: Vec<&str> = KERNELS.iter().chain([&GENERIC_6_12_AMD64]).map(|k| k.name).collect();
        format!("unknown kernel {name}; known: {}", names.join(", "))
    })
}

/// A private apt configuration for one suite and architecture: its own
/// sources, lists, cache and (empty) dpkg status under target/kernels/apt.
pub struct PrivateApt {
    dir: PathBuf,
    arch: &'static str,
}

impl PrivateApt {
    /// Writes the configuration and fetches the lists (always: this runs
    /// only when a kernel is not cached yet, and old lists may name versions
    /// the mirror has dropped). The mirror and keyring are those the host
    /// uses for `suite` if it has it (bookworm-security), else for its own
    /// codename (same archive).
    pub fn new(suite: &str, arch: &'static str) -> Result<Self> {
        let dir = root().join(format!("target/kernels/apt/{suite}-{arch}"));
        for d in ["lists/partial", "cache/archives/partial", "parts"] {
            fs::create_dir_all(dir.join(d))?;
        }
        let (uri, keyring) = match setup::debian_mirror(suite) {
            Ok(m) => m,
            Err(_) => setup::debian_mirror(&setup::codename()?)?,
        };
        let signed = keyring.map(|k| format!(" signed-by={k}")).unwrap_or_default();
        fs::write(dir.join("sources.list"), format!("deb [arch={arch}{signed}] {uri} {suite} main\n"))?;
        if !dir.join("status").exists() {
            fs::write(dir.join("status"), "")?;
        }
        let apt = Self { dir, arch };
        run(apt.cmd("apt-get").arg("update"))?;
        Ok(apt)
    }

    /// `prog` (apt-get, apt-cache) pointed at this configuration only.
    pub fn cmd(&self, prog: &str) -> Command {
        let d = |p: &str| self.dir.join(p).display().to_string();
        let mut c = Command::new(prog);
        for (k, v) in [
            ("Dir::State::Lists", d("lists")),
            ("Dir::State::status", d("status")),
            ("Dir::Etc::SourceList", d("sources.list")),
            ("Dir::Etc::SourceParts", d("parts")),
            ("Dir::Cache", d("cache")),
            ("APT::Architecture", self.arch.to_string()),
            ("APT::Architectures", self.arch.to_string()),
            // The checkout may not be readable by apt's `_apt` user.
            ("APT::Sandbox::User", "root".to_string()),
        ] {
            c.arg("-o").arg(format!("{k}={v}"));
        }
        c
    }

    /// The first dependency of `pkg` named `prefix*`.
    fn dep(&self, pkg: &str, prefix: &str) -> Result<String> {
        let out = self.cmd("apt-cache").args(["depends", pkg]).output().context("apt-cache")?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("Depends: "))
            .find(|d| d.starts_with(prefix) && !d.contains('<'))
            .map(|d| d.trim().to_string())
            .with_context(|| format!("apt-cache found no {prefix}* dependency of {pkg}: {text}"))
    }

    /// The package that holds the kernel image: the versioned
    /// linux-image-6.12.117+deb12-cloud-amd64 the meta-package depends on,
    /// or, from 7.x on, where that one is an empty stub, its
    /// linux-binary-7.3.4+deb13-cloud-amd64.
    fn resolve_image(&self, meta: &str) -> Result<String> {
        let image = self.dep(meta, "linux-image-")?;
        Ok(self.dep(&image, "linux-binary-").unwrap_or(image))
    }
}

/// `apt-get download`s `pkg` (with `apt`'s options) and unpacks it into
/// `dir`, through a temporary folder so an interrupted run leaves nothing
/// that looks complete; the .deb is removed.
pub fn download_unpack(mut apt: Command, pkg: &str, dir: &Path) -> Result<()> {
    let cache = dir.parent().context("no parent folder")?;
    fs::create_dir_all(cache)?;
    run(apt.current_dir(cache).args(["download", pkg]))?;
    let name = pkg.split(':').next().unwrap_or(pkg);
    let deb = fs::read_dir(cache)?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{name}_")) && n.ends_with(".deb"))
        })
        .with_context(|| format!("apt-get download left no .deb for {pkg}"))?;
    let tmp = cache.join(format!("{}.tmp", dir.file_name().context("no folder name")?.to_string_lossy()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp)?;
    }
    run(Command::new("dpkg").arg("-x").arg(&deb).arg(&tmp))?;
    fs::rename(&tmp, dir)?;
    fs::remove_file(&deb)?;
    Ok(())
}

/// Returns the path of the unpacked vmlinuz, downloading on first use.
pub fn fetch(k: GuestKernel) -> Result<PathBuf> {
    vmlinuz(&package_dir(k)?)
}

/// The folder `k`'s image package is unpacked in, downloading it on first
/// use.
fn package_dir(k: GuestKernel) -> Result<PathBuf> {
    let cache = root().join("target/kernels");
    fs::create_dir_all(&cache)?;
    let marker = cache.join(format!("{}.pkg", k.name));
    if let Ok(p) = fs::read_to_string(&marker) {
        let dir = cache.join(p.trim());
        if vmlinuz(&dir).is_ok() {
            return Ok(dir);
        }
    }
    let apt = PrivateApt::new(k.suite, k.arch)?;
    let pkg = apt.resolve_image(k.meta)?;
    let version = k.name.split('-').next().unwrap_or_default();
    if !pkg.contains(&format!("-{version}.")) {
        bail!("{} in {} is now {pkg}, not {version}: update the kernel matrix", k.meta, k.suite);
    }
    let dir = cache.join(&pkg);
    if !dir.is_dir() {
        download_unpack(apt.cmd("apt-get"), &pkg, &dir)?;
    }
    vmlinuz(&dir)?;
    fs::write(&marker, &pkg)?;
    Ok(dir)
}

/// The modules folder (`lib/modules/<release>` or
/// `usr/lib/modules/<release>`, holding `kernel/`) of `k`'s unpacked
/// package, downloading it on first use. A .deb has no modules.dep (depmod
/// writes it when the package is installed): whoever loads modules from here
/// must know their order.
pub fn modules_dir(k: GuestKernel) -> Result<PathBuf> {
    let dir = package_dir(k)?;
    ["lib/modules", "usr/lib/modules"]
        .iter()
        .flat_map(|m| fs::read_dir(dir.join(m)).into_iter().flatten().flatten())
        .map(|e| e.path())
        .find(|p| p.join("kernel").is_dir())
        .with_context(|| format!("no lib/modules/*/kernel in {}", dir.display()))
}

/// A kernel's build option, from the config its package ships
/// (`boot/config-*`; 6.12's have it, 7.x's linux-binary packages do not):
/// `Some(true)` for `=y` or `=m`, `Some(false)` when not set, `None` without
/// a config.
pub fn config_option(k: GuestKernel, option: &str) -> Result<Option<bool>> {
    let dir = package_dir(k)?;
    let config = fs::read_dir(dir.join("boot"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("config-")));
    let Some(config) = config else { return Ok(None) };
    let text = fs::read_to_string(&config).with_context(|| format!("reading {}", config.display()))?;
    Ok(Some(parse_config_option(&text, option)))
}

fn parse_config_option(config: &str, option: &str) -> bool {
    config.lines().filter_map(|l| l.strip_prefix(option)?.strip_prefix('=')).any(|v| v == "y" || v == "m")
}

/// The kernel image in an unpacked package: boot/vmlinuz-* (6.12) or
/// usr/lib/modules/*/vmlinuz (7.x).
fn vmlinuz(pkg_dir: &Path) -> Result<PathBuf> {
    let boot = fs::read_dir(pkg_dir.join("boot")).into_iter().flatten().flatten().map(|e| e.path());
    let modules = fs::read_dir(pkg_dir.join("usr/lib/modules"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("vmlinuz"));
    boot.filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("vmlinuz-")))
        .chain(modules.filter(|p| p.is_file()))
        .next()
        .with_context(|| format!("no vmlinuz in {}", pkg_dir.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn config_options() {
        let c = "CONFIG_A=y\n# CONFIG_ANON_VMA_NAME is not set\nCONFIG_AB=m\nCONFIG_C=\"x\"\n";
        assert!(super::parse_config_option(c, "CONFIG_A"));
        assert!(super::parse_config_option(c, "CONFIG_AB"));
        assert!(!super::parse_config_option(c, "CONFIG_ANON_VMA_NAME"));
        assert!(!super::parse_config_option(c, "CONFIG_C"));
    }
}
