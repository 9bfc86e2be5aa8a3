//! QEMU with the stale-TLB model (`--tlb stale`): Debian's QEMU 10.0.2
//! source (the `+ds` orig tarball), patched with `xtask/qemu/stale-tlb.patch`
//! and built here for x86-64 and arm64 guests. The model is off unless QEMU
//! runs with `-accel tcg,stale-tlb=on`: a vCPU that cached a read-only
//! translation of a page (read-only by the page tables' permissions) takes
//! a write-permission fault on a store to the page until it flushes that
//! translation, even after another CPU made the page writable, as real
//! hardware may (a "spurious" fault); stock TCG re-walks the tables and
//! never faults. With the model on, QEMU prints `stale-tlb: N faults raised`
//! on exit (stderr): an oracle independent of the guest kernel.
//!
//! Each build is cached by (the tarball's sha256, the patch, the build
//! recipe) under `target/qemu/built/<key>/` and in the machine-wide
//! [`MACHINE_CACHE`], built in a scratch folder and installed by rename,
//! one build of a key at a time (as [`crate::kbuild`]).

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, ensure, Context as _, Result};
use sha2::{Digest as _, Sha256};

use crate::{
    kbuild::logged,
    util::{root, run},
};

pub const VERSION: &str = "10.0.2";
const TARBALL: &str = "qemu_10.0.2+ds.orig.tar.xz";
const URL: &str = "http://deb.debian.org/debian/pool/main/q/qemu/qemu_10.0.2+ds.orig.tar.xz";
const TARBALL_SHA256: &str = "0901da33844a331bf8b3602b9c1fbd178e60b737c8e3ade678255bd090c9b9f1";
const TARBALL_SIZE: u64 = 39_449_628;

/// The patch, part of the build's key.
pub const PATCH: &str = include_str!("../qemu/stale-tlb.patch");

/// Where a build is shared with other checkouts of this machine.
pub const MACHINE_CACHE: &str = "/var/cache/faultscope/qemu";

/// QEMU's configure: the two system emulators and nothing a headless
/// TCG guest does not (no GUI, audio, USB redirection, network
/// back ends: the guests run with `-nic none`; 9p stays, for
/// [`crate::vm::virtfs_host_root`]).
pub const CONFIGURE_ARGS: &[&str] = &[
    "--target-list=x86_64-softmmu,aarch64-softmmu",
    "--disable-docs",
    "--disable-tools",
    "--disable-install-blobs",
    "--disable-guest-agent",
    "--disable-werror",
    "--disable-gtk",
    "--disable-sdl",
    "--disable-opengl",
    "--disable-vnc",
    "--disable-spice",
    "--disable-curses",
    "--disable-alsa",
    "--disable-pa",
    "--disable-pipewire",
    "--disable-jack",
    "--disable-oss",
    "--disable-sndio",
    "--disable-gio",
    "--disable-libusb",
    "--disable-usb-redir",
    "--disable-virglrenderer",
    "--disable-vte",
    "--disable-xkbcommon",
    "--disable-slirp",
];

/// The binaries ninja builds: x86-64's, arm64's.
const BINARIES: [&str; 2] = ["qemu-system-x86_64", "qemu-system-aarch64"];

/// The `+ds` tarball has no firmware blobs: meson.build must not try to
/// unpack the edk2 ones (it would, bzip2 being installed).
const MESON_EDK2: (&str, &str) = ("unpack_edk2_blobs = bzip2.found()", "unpack_edk2_blobs = false");

/// From PyPI, in a venv of the system's python (bookworm's meson is older
/// than QEMU 10 needs; the `+ds` tarball has no python/wheels).
const PY_PACKAGES: &[&str] = &["meson==1.8.2", "pycotap==1.3.1"];

/// Debian's firmware (SeaBIOS, option ROMs), for QEMU's `-L`: this build
/// installs none of its own.
pub const FIRMWARE_ARGS: &[&str] = &["-L", "/usr/share/qemu", "-L", "/usr/share/seabios"];

/// A build by [`build`].
#[derive(Clone, Debug)]
pub struct Built {
    pub x86_64: PathBuf,
    pub aarch64: PathBuf,
}

impl Built {
    fn at(dir: PathBuf) -> Option<Built> {
        let b = Built { x86_64: dir.join(BINARIES[0]), aarch64: dir.join(BINARIES[1]) };
        (b.x86_64.is_file() && b.aarch64.is_file()).then_some(b)
    }

    /// The emulator of a guest arch.
    pub fn binary(&self, arch: &str) -> Result<&Path> {
        match arch {
            "amd64" => Ok(&self.x86_64),
            "arm64" => Ok(&self.aarch64),
            other => bail!("--tlb stale: the stale-TLB model has no emulator for a {other} guest"),
        }
    }
}

/// The cache key: the tarball's sha256, the patch and the recipe.
pub fn key(tarball_sha256: &str, patch: &str, configure: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(format!("qemu {VERSION} {tarball_sha256}\n"));
    h.update(Sha256::digest(patch.as_bytes()));
    for a in configure {
        h.update(format!("{a}\n"));
    }
    h.update(format!("meson.build: {} -> {}\n", MESON_EDK2.0, MESON_EDK2.1));
    for p in PY_PACKAGES {
        h.update(format!("pip {p}\n"));
    }
    let hex: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{VERSION}-{hex}")
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The tarball under target/qemu, downloaded once and checked.
fn tarball() -> Result<PathBuf> {
    let dir = root().join("target/qemu");
    fs::create_dir_all(&dir)?;
    let path = dir.join(TARBALL);
    if !path.is_file() {
        let part = dir.join(format!("{TARBALL}.part-{}", std::process::id()));
        run(Command::new("curl").args(["-fsSL", "--retry", "3", "-o"]).arg(&part).arg(URL))?;
        fs::rename(&part, &path)?;
    }
    let size = fs::metadata(&path)?.len();
    let sum = sha256_file(&path)?;
    if size != TARBALL_SIZE || sum != TARBALL_SHA256 {
        let _ = fs::remove_file(&path);
        bail!(
            "{} is not the expected tarball ({size} bytes, sha256 {sum}; expected {TARBALL_SIZE}, \
             {TARBALL_SHA256}): removed, run again to download it again",
            path.display()
        );
    }
    Ok(path)
}

/// The venv with meson and pycotap (made once).
fn python() -> Result<PathBuf> {
    let venv = root().join("target/tools/qemu-venv");
    let py = venv.join("bin/python3");
    let stamp = venv.join(format!(".{}", PY_PACKAGES.join(",")));
    if !stamp.exists() {
        run(Command::new("/usr/bin/python3").args(["-m", "venv", "--clear"]).arg(&venv))?;
        run(Command::new(&py).args(["-m", "pip", "install", "--quiet"]).args(PY_PACKAGES))?;
        fs::write(&stamp, "")?;
    }
    Ok(py)
}

/// PATH without pyenv's shims: QEMU's build runs `python3` only as the
/// interpreter configure was given, but a shim on PATH would pick another.
fn path_without_pyenv() -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !d.contains(".pyenv"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Builds (or finds cached) the patched QEMU.
pub fn build() -> Result<Built> {
    let key = key(TARBALL_SHA256, PATCH, CONFIGURE_ARGS);
    let cache = crate::cached::Cache {
        what: "xtask qemu",
        key: &key,
        parent: root().join("target/qemu/built"),
        machine: Path::new(MACHINE_CACHE),
        at: Built::at,
    };
    cache.get(|scratch| build_in(&tarball()?, &python()?, scratch))
}

fn build_in(tar: &Path, py: &Path, scratch: &Path) -> Result<()> {
    let log = scratch.join("build.log");
    let tree = scratch.join("qemu");
    fs::create_dir_all(&tree)?;
    run(Command::new("tar").arg("-xf").arg(tar).arg("-C").arg(&tree).arg("--strip-components=1"))?;
    let patch = scratch.join("stale-tlb.patch");
    fs::write(&patch, PATCH)?;
    logged(
        Command::new("patch")
            .current_dir(&tree)
            .args(["-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i"])
            .arg(&patch),
        &log,
        "applying xtask/qemu/stale-tlb.patch",
    )?;
    let meson = tree.join("meson.build");
    let text = fs::read_to_string(&meson)?;
    ensure!(
        text.matches(MESON_EDK2.0).count() == 1,
        "meson.build has no line {:?} to turn off",
        MESON_EDK2.0
    );
    fs::write(&meson, text.replace(MESON_EDK2.0, MESON_EDK2.1))?;
    let build = tree.join("build");
    fs::create_dir_all(&build)?;
    let path = path_without_pyenv();
    logged(
        Command::new(tree.join("configure"))
            .current_dir(&build)
            .env("PATH", &path)
            .arg(format!("--python={}", py.display()))
            .args(CONFIGURE_ARGS),
        &log,
        "QEMU's configure",
    )?;
    logged(Command::new("ninja").current_dir(&build).env("PATH", &path).args(BINARIES), &log, "ninja")?;
    let out = scratch.join("out");
    fs::create_dir_all(&out)?;
    for b in BINARIES {
        fs::rename(build.join(b), out.join(b)).with_context(|| format!("ninja built no {b}"))?;
    }
    fs::write(out.join("stale-tlb.patch"), PATCH)?;
    fs::write(out.join("configure-args"), CONFIGURE_ARGS.join("\n") + "\n")?;
    Ok(())
}

/// The model's count from QEMU's stderr: its exit line
/// `stale-tlb: N faults raised` (None when there is none: the model was
/// off, or QEMU did not exit normally).
pub fn faults_raised(stderr: &str) -> Option<u64> {
    stderr.lines().rev().find_map(|l| {
        l.trim_end_matches('\r')
            .strip_prefix("stale-tlb: ")?
            .strip_suffix(" faults raised")?
            .trim()
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_follows_the_patch_the_tarball_and_the_configuration() {
        let k = key(TARBALL_SHA256, PATCH, CONFIGURE_ARGS);
        assert_eq!(k, key(TARBALL_SHA256, PATCH, CONFIGURE_ARGS), "the key is stable");
        assert!(k.starts_with("10.0.2-"), "{k}");
        assert_ne!(k, key(TARBALL_SHA256, &format!("{PATCH}\n"), CONFIGURE_ARGS), "the patch");
        assert_ne!(k, key(&TARBALL_SHA256.replace('0', "1"), PATCH, CONFIGURE_ARGS), "the tarball");
        assert_ne!(k, key(TARBALL_SHA256, PATCH, &CONFIGURE_ARGS[1..]), "the configuration");
    }

    #[test]
    fn the_exit_line_is_parsed() {
        assert_eq!(
            faults_raised("qemu: terminating on signal 15\nstale-tlb: 119 faults raised\n"),
            Some(119)
        );
        assert_eq!(faults_raised("stale-tlb: 0 faults raised\r\n"), Some(0));
        assert_eq!(faults_raised(""), None);
        assert_eq!(faults_raised("stale-tlb: many faults raised\n"), None);
    }

    #[test]
    fn the_patch_adds_the_switch_and_its_exit_line() {
        assert!(PATCH.contains("\"stale-tlb\""), "the accelerator property");
        assert!(
            PATCH.contains("stale-tlb: %\" PRIu64 \" faults raised"),
            "the exit line faults_raised reads"
        );
        assert!(PATCH.lines().any(|l| l.starts_with("--- a/target/i386/")), "the x86 model");
        assert!(PATCH.lines().any(|l| l.starts_with("--- a/target/arm/")), "the arm64 model");
    }
}
