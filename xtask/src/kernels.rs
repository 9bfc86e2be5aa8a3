//! Guest kernels: stock Debian kernel packages, resolved from their
//! meta-packages, downloaded once with `apt-get download` and unpacked
//! (never installed) under target/kernels. Each suite and architecture gets
//! a private apt configuration there, so the host's apt setup is not changed.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
pub use faultscope_expect::cases::{Choices, FolioReuse};

use crate::{
    apt::{download_unpack, PrivateApt},
    kbuild,
    util::root,
};

/// A guest kernel of the matrix.
#[derive(Clone, Copy, Debug)]
pub struct GuestKernel {
    /// `<version>-<flavour or change>-<arch>`; for a Debian package the
    /// version must prefix the resolved package's.
    pub name: &'static str,
    /// Debian architecture: amd64 or arm64.
    pub arch: &'static str,
    pub source: Source,
}

/// Where a guest kernel comes from.
#[derive(Clone, Copy, Debug)]
pub enum Source {
    /// A Debian kernel package: `meta` is the meta-package that names the
    /// current version, in `suite`.
    Package { meta: &'static str, suite: &'static str },
    /// Built here ([`kbuild`]) from Debian's kernel source with a patch
    /// series, everything built in.
    Built(Patched),
    /// A kernel image given by its path (`cargo xtask kernel` prints it),
    /// e.g. for `cargo xtask ab`; what it changes is not known here.
    Image(&'static str),
}

/// A kernel built with a patch series, and what the series changes.
#[derive(Clone, Copy, Debug)]
pub struct Patched {
    /// The change, as the kernel's release names it (`7.3.4-<change>`).
    pub change: &'static str,
    /// None: the stock tree, built with the same configuration (the
    /// like-for-like baseline of an A/B: Debian's own kernels have another
    /// configuration, which changes the times).
    pub series: Option<kbuild::Fixture>,
    /// Diffs of this repository applied after the series, in order.
    pub diffs: &'static [&'static str],
    /// What the series makes the kernel choose.
    pub choices: Choices,
}

const fn package(
    name: &'static str,
    meta: &'static str,
    arch: &'static str,
    suite: &'static str,
) -> GuestKernel {
    GuestKernel { name, arch, source: Source::Package { meta, suite } }
}

/// The messages of the reuse-the-whole-folio series (`mm/memory: reuse the
/// whole exclusive large folio on a write fault`, v2, two patches;
/// docs/kernels.md says which) whose subject contains `subject`, from its
/// public linux-mm thread kept in the repo
/// (`xtask/series/folio-reuse-v2.thread`); FAULTSCOPE_PATCH_SERIES names
/// another copy.
const fn folio_reuse_thread(subject: &'static str) -> Option<kbuild::Fixture> {
    Some(kbuild::Fixture {
        env: "FAULTSCOPE_PATCH_SERIES",
        default: "xtask/series/folio-reuse-v2.thread",
        subject,
    })
}

/// The whole series.
const FOLIO_REUSE: Patched = Patched {
    change: "folio-reuse",
    series: folio_reuse_thread("[PATCH v2 "),
    diffs: &[],
    choices: Choices { reuse: FolioReuse::WholeFolio, ..Choices::STOCK },
};

/// The whole series with the cover letter's experiment on top
/// (`xtask/series/flush-tlb-local.diff`: `flush_tlb_local()` at the end of
/// the new function; x86 only).
const FOLIO_REUSE_FLUSH: Patched = Patched {
    change: "folio-reuse-flush",
    diffs: &["xtask/series/flush-tlb-local.diff"],
    choices: Choices { local_flush: true, ..FOLIO_REUSE.choices },
    ..FOLIO_REUSE
};

/// Only the series' first patch (`[PATCH v2 1/2] mm/memory: reuse 16 PTEs
/// of an exclusive large folio on a write fault`): the cover letter's
/// middle column. Not in the matrix: `cargo xtask ab --preset
/// cover-letter` runs it.
const REUSE_16_PTES: Patched = Patched {
    change: "reuse-16-ptes",
    series: folio_reuse_thread("[PATCH v2 1/2]"),
    diffs: &[],
    choices: Choices { reuse: FolioReuse::ContpteBlock, ..Choices::STOCK },
};

/// Debian's 7.3 source with no patch, built as the patched kernels are.
const STOCK_BUILD: Patched = Patched { change: "stock", series: None, diffs: &[], choices: Choices::STOCK };

/// The exec THP COW series ("THP COW support for private executable file
/// mmap", next v2, two patches; the thread is
/// `xtask/series/exec-thp-cow-v2.thread`), as
/// `xtask/series/exec-thp-cow-v2-on-7.3.diff`: its two patches onto 7.3.4,
/// where two lines had to change (docs/kernels.md): the declaration, in
/// `mm/internal.h` (the posted `huge_mm.h` context is gone from 7.3), and
/// `is_cow_mapping(vm_flags)`, gone in 7.3, as `vma_is_cow_mapping(vma)`.
/// The suite's COW memory stage runs it.
const EXEC_THP_COW: Patched = Patched {
    change: "exec-thp-cow",
    series: None,
    diffs: &["xtask/series/exec-thp-cow-v2-on-7.3.diff"],
    choices: Choices { exec_thp_cow: true, ..STOCK_BUILD.choices },
};

pub const KERNELS: &[GuestKernel] = &[
    // bookworm's own 6.1 LTS (the point release's, not -security's): no
    // mTHP, no arm64 contpte, page_add_new_anon_rmap.
    package("6.1-cloud-amd64", "linux-image-cloud-amd64", "amd64", "bookworm"),
    package("6.1-cloud-arm64", "linux-image-cloud-arm64", "arm64", "bookworm"),
    package("6.12-cloud-amd64", "linux-image-6.12-cloud-amd64", "amd64", "bookworm-security"),
    package("6.12-cloud-arm64", "linux-image-6.12-cloud-arm64", "arm64", "bookworm-security"),
    package("7.3-cloud-amd64", "linux-image-cloud-amd64", "amd64", "trixie-backports"),
    package("7.3-cloud-arm64", "linux-image-cloud-arm64", "arm64", "trixie-backports"),
    GuestKernel { name: "7.3-folio-reuse-amd64", arch: "amd64", source: Source::Built(FOLIO_REUSE) },
    GuestKernel { name: "7.3-folio-reuse-arm64", arch: "arm64", source: Source::Built(FOLIO_REUSE) },
];

/// The generic (not -cloud) 6.12 amd64 kernel: it has 9p and virtio as
/// modules (the -cloud flavour has no 9p at all), so a guest can run the
/// host's own userspace over virtio-9p (`cargo xtask redis`). Kept out of
/// [`KERNELS`], the matrix's default list: it is a 100 MB download only the
/// Redis test needs.
pub const GENERIC_6_12_AMD64: GuestKernel =
    package("6.12-amd64", "linux-image-6.12-amd64", "amd64", "bookworm-security");

/// The generic 7.3 amd64 kernel, with 9p as modules, for the Redis test.
pub const GENERIC_7_3_AMD64: GuestKernel =
    package("7.3-amd64", "linux-image-amd64", "amd64", "trixie-backports");

const EXTRA: &[GuestKernel] = &[
    GENERIC_6_12_AMD64,
    GENERIC_7_3_AMD64,
    GuestKernel { name: "7.3-stock-build-amd64", arch: "amd64", source: Source::Built(STOCK_BUILD) },
    GuestKernel { name: "7.3-exec-thp-cow-amd64", arch: "amd64", source: Source::Built(EXEC_THP_COW) },
    GuestKernel { name: "7.3-stock-build-arm64", arch: "arm64", source: Source::Built(STOCK_BUILD) },
    GuestKernel { name: "7.3-reuse-16-ptes-amd64", arch: "amd64", source: Source::Built(REUSE_16_PTES) },
    GuestKernel { name: "7.3-reuse-16-ptes-arm64", arch: "arm64", source: Source::Built(REUSE_16_PTES) },
    GuestKernel {
        name: "7.3-folio-reuse-flush-amd64",
        arch: "amd64",
        source: Source::Built(FOLIO_REUSE_FLUSH),
    },
];

/// A kernel by name, or by the path of an image `cargo xtask kernel`
/// built (its folder, `<release>-<hash>-<arch>`, gives the version and the
/// architecture).
pub fn by_name_or_image(name: &str) -> Result<GuestKernel> {
    let p = Path::new(name);
    if !p.is_file() {
        return by_name(name);
    }
    let dir =
        p.parent().and_then(|d| d.file_name()).map(|d| d.to_string_lossy().into_owned()).unwrap_or_default();
    let arch = ["amd64", "arm64"].into_iter().find(|a| dir.ends_with(&format!("-{a}")));
    let Some(arch) = arch else {
        bail!(
            "{name}: not in a folder named <release>-<hash>-<amd64|arm64> (as `cargo xtask kernel` builds)"
        );
    };
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    Ok(GuestKernel { name: leak(dir), arch, source: Source::Image(leak(p.display().to_string())) })
}

/// Every kernel's name: the matrix's and the others (the generic ones,
/// the other builds).
pub fn all_names() -> impl Iterator<Item = &'static str> {
    KERNELS.iter().chain(EXTRA).map(|k| k.name)
}

pub fn by_name(name: &str) -> Result<GuestKernel> {
    KERNELS.iter().chain(EXTRA).copied().find(|k| k.name == name).with_context(|| {
        let names: Vec<&str> = KERNELS.iter().chain(EXTRA).map(|k| k.name).collect();
        format!("unknown kernel {name}; known: {}", names.join(", "))
    })
}

impl GuestKernel {
    pub fn reuse(&self) -> FolioReuse {
        self.choices().reuse
    }

    /// What the kernel chooses: a stock kernel's, but for a kernel built
    /// here with a series.
    pub fn choices(&self) -> Choices {
        match self.source {
            Source::Built(p) => p.choices,
            _ => Choices::STOCK,
        }
    }

    /// Why this kernel cannot be had here: a built kernel whose patch
    /// series fixture is absent. Callers skip it, loudly.
    pub fn missing(&self) -> Option<String> {
        match self.source {
            Source::Package { .. } => None,
            Source::Built(p) => p.series.and_then(|f| f.path().err()),
            Source::Image(p) => (!Path::new(p).is_file()).then(|| format!("{p}: no such kernel image")),
        }
    }

    /// Prints the loud line of a skipped kernel; true when `self` is skipped.
    pub fn skipped(&self, what: &str) -> bool {
        match self.missing() {
            Some(why) => {
                println!("SKIPPED: {what} on {}: {why}", self.name);
                true
            }
            None => false,
        }
    }
}

/// Returns the path of the kernel image: a package's unpacked vmlinuz,
/// downloaded on first use, or a built kernel's image, built on first use.
pub fn fetch(k: GuestKernel) -> Result<PathBuf> {
    match k.source {
        Source::Package { .. } => vmlinuz(&package_dir(k)?),
        Source::Built(p) => Ok(built(k, p, true)?.image),
        Source::Image(p) => Ok(PathBuf::from(p)),
    }
}

/// As [`fetch`], but a kernel built here is built alone, not with the rest
/// of its [`BUILT_TOGETHER`] (what the demo waits for).
pub fn fetch_alone(k: GuestKernel) -> Result<PathBuf> {
    match k.source {
        Source::Built(p) => Ok(built(k, p, false)?.image),
        _ => fetch(k),
    }
}

/// True for a kernel built here (as against downloaded or given).
pub fn is_built(k: GuestKernel) -> bool {
    matches!(k.source, Source::Built(_))
}

/// The kernels the suite builds, in one tree per arch: when one is built,
/// the others of its arch not built yet are made after it in its tree
/// (their diffs touch `mm/` only, so each after the first recompiles `mm/`
/// and links).
const BUILT_TOGETHER: &[&str] = &[
    "7.3-folio-reuse-amd64",
    "7.3-folio-reuse-flush-amd64",
    "7.3-exec-thp-cow-amd64",
    "7.3-folio-reuse-arm64",
];

/// The build of a [`Source::Built`] kernel (cached, or built now, with the
/// rest of its [`BUILT_TOGETHER`] when `together`).
fn built(k: GuestKernel, p: Patched, together: bool) -> Result<kbuild::Built> {
    let mut family = vec![(p.change, diffs_of(p)?)];
    if together && BUILT_TOGETHER.contains(&k.name) {
        for other in BUILT_TOGETHER.iter().filter(|n| **n != k.name) {
            let other = by_name(other)?;
            let Source::Built(q) = other.source else { continue };
            // A fixture that is missing leaves that kernel out.
            if let (true, Ok(d)) = (other.arch == k.arch, diffs_of(q)) {
                family.push((q.change, d));
            }
        }
    }
    let variants: Vec<kbuild::Variant> =
        family.iter().map(|(name, diffs)| kbuild::Variant { name, diffs }).collect();
    kbuild::build(k.arch, &variants)
}

/// The diffs of a built kernel: its series' messages, then its diff files.
fn diffs_of(p: Patched) -> Result<Vec<kbuild::Diff>> {
    let mut diffs = match p.series {
        Some(f) => kbuild::read_series(&[f.path().map_err(anyhow::Error::msg)?], Some(f.subject))?,
        None => Vec::new(),
    };
    if !p.diffs.is_empty() {
        let files: Vec<PathBuf> = p.diffs.iter().map(|d| root().join(d)).collect();
        diffs.extend(kbuild::read_series(&files, None)?);
    }
    Ok(diffs)
}

/// The folder `k`'s image package is unpacked in, downloading it on first
/// use.
fn package_dir(k: GuestKernel) -> Result<PathBuf> {
    let Source::Package { meta, suite } = k.source else {
        bail!("{} is built here, not a package", k.name);
    };
    let cache = root().join("target/kernels");
    fs::create_dir_all(&cache)?;
    let marker = cache.join(format!("{}.pkg", k.name));
    if let Ok(p) = fs::read_to_string(&marker) {
        let dir = cache.join(p.trim());
        if vmlinuz(&dir).is_ok() {
            return Ok(dir);
        }
    }
    let apt = PrivateApt::new(suite, k.arch)?;
    let pkg = apt.resolve_image(meta)?;
    let version = k.name.split('-').next().unwrap_or_default();
    if !pkg.contains(&format!("-{version}.")) {
        bail!("{meta} in {suite} is now {pkg}, not {version}: update the kernel matrix");
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
/// package, downloading it on first use: in the image package (6.12), or
/// from 7.x on in the `linux-modules-<release>` package the versioned image
/// package depends on. A .deb has no modules.dep (depmod writes it when the
/// package is installed): whoever loads modules from here must know their
/// order.
pub fn modules_dir(k: GuestKernel) -> Result<PathBuf> {
    let find = |dir: &Path| {
        ["lib/modules", "usr/lib/modules"]
            .iter()
            .flat_map(|m| fs::read_dir(dir.join(m)).into_iter().flatten().flatten())
            .map(|e| e.path())
            .find(|p| p.join("kernel").is_dir())
    };
    let dir = package_dir(k)?;
    if let Some(m) = find(&dir) {
        return Ok(m);
    }
    let Source::Package { meta, suite } = k.source else {
        bail!("{} is built with everything built in: it has no modules", k.name);
    };
    let cache = root().join("target/kernels");
    let marker = cache.join(format!("{}.modules", k.name));
    if let Some(m) = fs::read_to_string(&marker).ok().and_then(|p| find(&cache.join(p.trim()))) {
        return Ok(m);
    }
    let apt = PrivateApt::new(suite, k.arch)?;
    let image = apt.dep(meta, "linux-image-")?;
    let pkg = apt.dep(&image, "linux-modules-")?;
    let mdir = cache.join(&pkg);
    if !mdir.is_dir() {
        download_unpack(apt.cmd("apt-get"), &pkg, &mdir)?;
    }
    let m = find(&mdir)
        .with_context(|| format!("no lib/modules/*/kernel in {} or {}", dir.display(), mdir.display()))?;
    fs::write(&marker, &pkg)?;
    Ok(m)
}

/// A kernel's build option, from the config its package ships
/// (`boot/config-*`; 6.12's have it, 7.x's linux-binary packages do not) or
/// the one it was built with:
/// `Some(true)` for `=y` or `=m`, `Some(false)` when not set, `None` without
/// a config.
pub fn config_option(k: GuestKernel, option: &str) -> Result<Option<bool>> {
    let config = match k.source {
        Source::Built(p) => built(k, p, true)?.config,
        _ => {
            let found = fs::read_dir(package_dir(k)?.join("boot"))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("config-")));
            let Some(config) = found else { return Ok(None) };
            config
        }
    };
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
    /// The exec THP COW series as built onto 7.3.4 adds the thread's own
    /// lines, but for the two that 7.3 made change (docs/kernels.md).
    #[test]
    fn exec_thp_cow_rebase_adds_the_threads_lines() {
        let root = crate::util::root();
        let added = |diffs: Vec<crate::kbuild::Diff>| -> Vec<String> {
            let mut v: Vec<String> = diffs
                .iter()
                .flat_map(|d| d.text.lines())
                .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
                .map(|l| l.trim_end().to_string())
                .collect();
            v.sort();
            v
        };
        let thread = crate::kbuild::read_series(
            &[root.join("xtask/series/exec-thp-cow-v2.thread")],
            Some("[PATCH next v2 "),
        )
        .unwrap();
        assert_eq!(thread.len(), 2, "the series' two patches");
        let mut want = added(thread);
        let changed = "+\t    is_cow_mapping(vm_flags)) {";
        let i = want.iter().position(|l| *l == changed).expect("the thread's is_cow_mapping line");
        want[i] = "+\t    vma_is_cow_mapping(vma)) {".to_string();
        want.sort();
        let built = crate::kbuild::read_series(&[root.join(super::EXEC_THP_COW.diffs[0])], None).unwrap();
        assert_eq!(added(built), want);
    }

    #[test]
    fn config_options() {
        let c = "CONFIG_A=y\n# CONFIG_ANON_VMA_NAME is not set\nCONFIG_AB=m\nCONFIG_C=\"x\"\n";
        assert!(super::parse_config_option(c, "CONFIG_A"));
        assert!(super::parse_config_option(c, "CONFIG_AB"));
        assert!(!super::parse_config_option(c, "CONFIG_ANON_VMA_NAME"));
        assert!(!super::parse_config_option(c, "CONFIG_C"));
    }
}
