//! bpftrace in the guests, for the overhead benchmark's side-by-side runs.
//!
//! Debian's bpftrace and bpftool for the guest's architecture, with their
//! whole dependency closure (bpftrace links LLVM, clang and libbcc),
//! downloaded (never installed) through a private apt configuration of the
//! machine's own suite, so they are the same versions as the host's, and
//! unpacked into a read-only ext4 image under `target/bpftrace/<arch>`.
//! The guest gets the image as an NVMe disk and chroots into it: every
//! stock -cloud kernel of the matrix has NVMe and ext4 built in, and none
//! has 9p.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::{
    apt::PrivateApt,
    setup,
    util::{root, run},
};

/// What the image holds (with their dependencies).
const PACKAGES: [&str; 2] = ["bpftrace", "bpftool"];

/// The ext4 image of `arch`'s bpftrace and bpftool, built on first use.
pub fn image(arch: &'static str) -> Result<PathBuf> {
    let dir = root().join("target/bpftrace").join(arch);
    let img = dir.join("bpftrace.ext4");
    if img.is_file() {
        return Ok(img);
    }
    fs::create_dir_all(&dir)?;
    let debs = dir.join("debs");
    let tree = dir.join("root");
    for d in [&debs, &tree].into_iter().filter(|d| d.exists()) {
        fs::remove_dir_all(d)?;
    }
    fs::create_dir_all(debs.join("partial"))?;
    // The machine's own suite: the guest runs the bpftrace `setup`
    // installs here, built for its architecture.
    let apt = PrivateApt::new(&setup::codename()?, arch)?;
    let mut c = apt.cmd("apt-get");
    c.arg("-o").arg(format!("Dir::Cache::archives={}", debs.display()));
    c.args(["install", "-y", "--download-only", "--no-install-recommends"]).args(PACKAGES);
    run(&mut c)?;
    let mut names: Vec<PathBuf> = fs::read_dir(&debs)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    names.sort();
    if names.is_empty() {
        bail!("apt-get downloaded no package for {}", PACKAGES.join(", "));
    }
    for deb in &names {
        run(Command::new("dpkg").arg("-x").arg(deb).arg(&tree))?;
    }
    // Mount points for the guest's own file systems, and no documentation.
    for d in ["proc", "sys", "dev", "tmp"] {
        fs::create_dir_all(tree.join(d))?;
    }
    let _ = fs::remove_dir_all(tree.join("usr/share/doc"));
    let _ = fs::remove_dir_all(tree.join("usr/share/man"));
    for bin in ["usr/bin/bpftrace", "usr/sbin/bpftool"] {
        if !tree.join(bin).is_file() {
            bail!("the unpacked packages have no {bin}");
        }
    }
    let mb = du_mb(&tree)? * 5 / 4 + 32;
    let tmp = dir.join("bpftrace.ext4.tmp");
    let _ = fs::remove_file(&tmp);
    // No journal: the guest mounts it read-only, and the image never
    // changes after this.
    run(Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-O", "^has_journal", "-L", "bpftrace", "-d"])
        .arg(&tree)
        .arg(&tmp)
        .arg(format!("{mb}M")))
    .context("mke2fs (run `cargo xtask setup`: e2fsprogs)")?;
    fs::rename(&tmp, &img)?;
    let listing: Vec<String> =
        names.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
    fs::write(dir.join("packages.txt"), listing.join("\n") + "\n")?;
    fs::remove_dir_all(&tree)?;
    fs::remove_dir_all(&debs)?;
    Ok(img)
}

fn du_mb(dir: &Path) -> Result<u64> {
    let out = Command::new("du").args(["-sm"]).arg(dir).output().context("du")?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("du -sm {} printed nothing", dir.display()))
}

/// QEMU arguments that attach `image` read-only as an NVMe disk (the guest
/// sees `/dev/nvme0n1`).
pub fn qemu_args(image: &Path) -> Vec<String> {
    vec![
        "-drive".into(),
        format!("file={},if=none,id=bpftrace,format=raw,readonly=on", image.display()),
        "-device".into(),
        "nvme,serial=bpftrace,drive=bpftrace".into(),
    ]
}
