//! Debian packages fetched without touching the host's apt setup: a
//! private apt configuration per suite and architecture under
//! target/kernels/apt, and packages downloaded and unpacked (never
//! installed).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::{
    setup,
    util::{root, run},
};

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
    pub fn dep(&self, pkg: &str, prefix: &str) -> Result<String> {
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
    pub fn resolve_image(&self, meta: &str) -> Result<String> {
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
    let name = pkg.split([':', '=']).next().unwrap_or(pkg);
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
