//! Kernels built here: Debian's kernel source package (fetched like the
//! guest kernels: a private apt configuration, `apt-get download`, never
//! installed) with a patch series applied, configured for the guest harness
//! and built for amd64 or arm64 (cross), with everything the guests need
//! built in (no modules). `cargo xtask kernel --patch FILE...` builds one for
//! any series; the matrix builds its patched kernels on demand.
//!
//! Each build is cached by (source package version, the series' diffs, the
//! config recipe and arch) under `target/kernels/built/<key>/` and, where it
//! can be written, in the machine-wide [`MACHINE_CACHE`], so a fresh checkout
//! on the same machine (CI) does not build again.

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context as _, Result};
use sha2::{Digest as _, Sha256};

use crate::util::{root, run};

/// The kernel source: Debian's `linux-source-7.3` (a tarball under
/// /usr/src), from the suite the 7.3 guest kernels come from.
pub const SOURCE_PACKAGE: &str = "linux-source-7.3";
const SOURCE_SUITE: &str = "trixie-backports";

/// Built kernels shared by every checkout on this machine, when writable.
pub const MACHINE_CACHE: &str = "/var/cache/faultscope/kernels";

/// A patch series given by a file of this machine that is a test fixture,
/// not part of the repo: where it is absent, its kernels are skipped.
#[derive(Clone, Copy, Debug)]
pub struct Fixture {
    /// The environment variable that names the file.
    pub env: &'static str,
    /// The file when the variable is not set, relative to the repo root.
    pub default: &'static str,
    /// Only the messages whose subject contains this (a thread holds
    /// several versions of a series).
    pub subject: &'static str,
}

impl Fixture {
    /// The fixture's file, or why there is none.
    pub fn path(&self) -> Result<PathBuf, String> {
        let p = match std::env::var_os(self.env) {
            Some(v) => PathBuf::from(v),
            None => root().join(self.default),
        };
        if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "the patch series fixture {} is missing (set {} to the series' mbox)",
                p.display(),
                self.env
            ))
        }
    }
}

/// How a build is configured, per architecture: `allnoconfig` with every
/// option of `on` set to y (`KCONFIG_ALLCONFIG`), then `olddefconfig`;
/// every option of `on` is checked `=y` in the final .config and every one
/// of `off` unset. What a QEMU guest that boots an initramfs never uses
/// stays off, which takes about a third off a trimmed defconfig's build
/// time (docs/kernels.md). Only the image is built.
pub struct Recipe {
    pub arch: &'static str,
    make_arch: &'static str,
    cross_compile: Option<&'static str>,
    target: &'static str,
    image: &'static str,
    on: &'static [&'static str],
    off: &'static [&'static str],
}

/// What faultscope, its tests and the guest harness need on both
/// architectures: the probes (kprobes and kprobe events for the oracle,
/// BPF with BTF from full DWARF, ftrace, perf events, jump labels as a
/// distribution kernel has them); the fault path's features (THP and
/// mTHP, swap, migration, userfaultfd, KSM, hugetlbfs, anonymous VMA
/// names, memory cgroups); the guest's boot (initramfs, devtmpfs, the 9p
/// root over virtio, loop and ext4 for the hot-patch file, NVMe for the
/// bpftrace image, TCP for Redis); /proc/config.gz.
const ON_COMMON: &[&str] = &[
    // The kernel and its system calls.
    "SMP",
    "NUMA",
    "SCHED_SMT",
    "SCHED_MC",
    "SCHED_CLUSTER",
    "PREEMPT_LAZY",
    "JUMP_LABEL",
    "NO_HZ_IDLE",
    "RELOCATABLE",
    "RANDOMIZE_BASE",
    "CPU_MITIGATIONS",
    "MULTIUSER",
    "SYSCTL",
    "PRINTK",
    "PRINTK_TIME",
    "BUG",
    "ELF_CORE",
    "FUTEX",
    "EPOLL",
    "SIGNALFD",
    "TIMERFD",
    "EVENTFD",
    "SHMEM",
    "AIO",
    "IO_URING",
    "ADVISE_SYSCALLS",
    "MEMBARRIER",
    "FILE_LOCKING",
    "POSIX_TIMERS",
    "SYSVIPC",
    "POSIX_MQUEUE",
    "RSEQ",
    "SECCOMP",
    "CGROUPS",
    "MEMCG",
    "CGROUP_SCHED",
    "FAIR_GROUP_SCHED",
    "CGROUP_PIDS",
    "CGROUP_BPF",
    "CGROUP_FREEZER",
    "NAMESPACES",
    "USER_NS",
    "PID_NS",
    "BINFMT_ELF",
    "BINFMT_SCRIPT",
    "MAGIC_SYSRQ",
    // Memory management.
    "SWAP",
    "COMPACTION",
    "MIGRATION",
    "KSM",
    "USERFAULTFD",
    "TRANSPARENT_HUGEPAGE",
    "TRANSPARENT_HUGEPAGE_MADVISE",
    "ANON_VMA_NAME",
    "PROC_PAGE_MONITOR",
    "CHECKPOINT_RESTORE",
    "HUGETLBFS",
    // Tracing and BPF.
    "PERF_EVENTS",
    "KPROBES",
    "KPROBE_EVENTS",
    "UPROBES",
    "UPROBE_EVENTS",
    "BPF",
    "BPF_SYSCALL",
    "BPF_JIT",
    "BPF_JIT_ALWAYS_ON",
    "BPF_EVENTS",
    "FTRACE",
    "FUNCTION_TRACER",
    "FUNCTION_GRAPH_TRACER",
    "DYNAMIC_FTRACE",
    "FTRACE_SYSCALLS",
    "STACKTRACE",
    "DEBUG_FS",
    "DEBUG_KERNEL",
    "DEBUG_INFO_DWARF_TOOLCHAIN_DEFAULT",
    "DEBUG_INFO_BTF",
    "KALLSYMS",
    "KALLSYMS_ALL",
    "IKCONFIG",
    "IKCONFIG_PROC",
    // The guest's boot, root and disks.
    "BLK_DEV_INITRD",
    "RD_GZIP",
    "DEVTMPFS",
    "DEVTMPFS_MOUNT",
    "PROC_FS",
    "SYSFS",
    "TMPFS",
    "TMPFS_XATTR",
    "TTY",
    "PCI",
    "PCI_MSI",
    "VIRTIO_MENU",
    "VIRTIO_PCI",
    "NET",
    "INET",
    "UNIX",
    "NETWORK_FILESYSTEMS",
    "NET_9P",
    "NET_9P_VIRTIO",
    "9P_FS",
    "BLOCK",
    "BLK_DEV",
    "BLK_DEV_LOOP",
    "BLK_DEV_NVME",
    "EXT4_FS",
];

/// BTF needs full DWARF (not reduced, not split).
const OFF_COMMON: &[&str] = &["DEBUG_INFO_NONE", "DEBUG_INFO_REDUCED", "DEBUG_INFO_SPLIT"];

/// x86's guest: the 8250 console, ACPI (the guest's `poweroff`), KVM's
/// paravirt guest support, ORC unwinding, defconfig's 1000 Hz.
pub const AMD64: Recipe = Recipe {
    arch: "amd64",
    make_arch: "x86",
    cross_compile: None,
    target: "bzImage",
    image: "arch/x86/boot/bzImage",
    on: &[
        "64BIT",
        "SERIAL_8250",
        "SERIAL_8250_CONSOLE",
        "ACPI",
        "HYPERVISOR_GUEST",
        "PARAVIRT",
        "KVM_GUEST",
        "X86_X2APIC",
        "X86_MPPARSE",
        "HOTPLUG_CPU",
        "PREEMPT_DYNAMIC",
        "UNWINDER_ORC",
        "HZ_1000",
        "MEM_SOFT_DIRTY",
    ],
    off: &[],
};

/// arm64's guest on QEMU's `virt` machine: the PL011 console and PL031
/// clock, generic PCI, the CPU features of defconfig's 52-bit 4K-page
/// kernel, contpte, defconfig's 250 Hz.
pub const ARM64: Recipe = Recipe {
    arch: "arm64",
    make_arch: "arm64",
    cross_compile: Some("aarch64-linux-gnu-"),
    target: "Image",
    image: "arch/arm64/boot/Image",
    on: &[
        "SERIAL_AMBA_PL011",
        "SERIAL_AMBA_PL011_CONSOLE",
        "RTC_CLASS",
        "RTC_DRV_PL031",
        "PCI_HOST_GENERIC",
        "VIRTIO_MMIO",
        "ARM64_4K_PAGES",
        "ARM64_VA_BITS_52",
        "ARM64_HW_AFDBM",
        "ARM64_HAFT",
        "ARM64_EPAN",
        "ARM64_E0PD",
        "ARM64_POE",
        "ARM64_GCS",
        "ARM64_PTR_AUTH_KERNEL",
        "ARM64_PTR_AUTH",
        "ARM64_BTI",
        "ARM64_TAGGED_ADDR_ABI",
        "ARM64_MTE",
        "ARM64_SVE",
        "ARM64_TLB_RANGE",
        "ARM64_CNP",
        "UNMAP_KERNEL_AT_EL0",
        "ARM64_CONTPTE",
        "HZ_250",
    ],
    // Lazy preemption (ON_COMMON), as Debian's arm64 kernels and x86's
    // defconfig have it: with full preemption the bench migrates between
    // populate and write often enough that the folios still in the other
    // CPU's LRU-add batch (each holding a reference) are copied, not
    // reused: 13-20 copies of 4K pages in a third of the runs.
    off: &["PREEMPT"],
};

pub fn recipe(arch: &str) -> Result<&'static Recipe> {
    match arch {
        "amd64" => Ok(&AMD64),
        "arm64" => Ok(&ARM64),
        other => bail!("no kernel build for arch {other:?} (amd64 or arm64)"),
    }
}

impl Recipe {
    fn on(&self) -> impl Iterator<Item = &'static str> + '_ {
        ON_COMMON.iter().chain(self.on).copied()
    }

    fn off(&self) -> impl Iterator<Item = &'static str> + '_ {
        OFF_COMMON.iter().chain(self.off).copied()
    }

    /// Everything that decides the configuration, as text: hashed into the
    /// cache key, and kept beside the build.
    fn describe(&self, localversion: &str) -> String {
        let mut s = format!(
            "arch {} (make ARCH={} {})\nbase allnoconfig\nLOCALVERSION={localversion}\n",
            self.arch, self.make_arch, self.target
        );
        for o in self.on() {
            s.push_str(&format!("+{o}\n"));
        }
        for o in self.off() {
            s.push_str(&format!("-{o}\n"));
        }
        s
    }

    fn make(&self, tree: &Path) -> Command {
        let mut c = Command::new("make");
        c.current_dir(tree).arg(format!("ARCH={}", self.make_arch));
        if let Some(cc) = self.cross_compile {
            c.arg(format!("CROSS_COMPILE={cc}"));
        }
        c
    }
}

/// One message's diff of a patch series.
#[derive(Clone, Debug, PartialEq)]
pub struct Diff {
    /// The message's subject, or "" where the file has none (a plain diff).
    pub subject: String,
    /// The diff, from its first header line to its last hunk line.
    pub text: String,
}

/// A mail header or a rendered thread's title line: the subject of the
/// diffs that follow it.
fn subject_line(line: &str) -> Option<&str> {
    line.strip_prefix("Subject: ").or_else(|| {
        (line.starts_with("[PATCH") || line.starts_with("[RFC PATCH") || line.starts_with("Re: ["))
            .then_some(line)
    })
}

/// An mbox's message separator, `From <sha> Mon Sep 17 00:00:00 2001`
/// (not a line of prose that starts with "From ").
fn mbox_separator(line: &str) -> bool {
    let w: Vec<&str> = line.split_whitespace().collect();
    w.len() >= 7 && w[0] == "From" && w[5].matches(':').count() == 2
}

/// `@@ -a[,b] +c[,d] @@`: the old and new line counts of a hunk.
fn hunk_counts(line: &str) -> Option<(u64, u64)> {
    let rest = line.strip_prefix("@@ -")?;
    let (old, rest) = rest.split_once(" +")?;
    let (new, _) = rest.split_once(" @@")?;
    let n = |r: &str| -> Option<u64> {
        match r.split_once(',') {
            Some((_, n)) => n.parse().ok(),
            None => r.parse::<u64>().ok().map(|_| 1),
        }
    };
    Some((n(old)?, n(new)?))
}

/// Header lines of a file's diff in git's format, between `diff --git` and
/// the first hunk.
const GIT_HEADERS: &[&str] = &[
    "index ",
    "--- ",
    "+++ ",
    "old mode ",
    "new mode ",
    "deleted file mode ",
    "new file mode ",
    "similarity index ",
    "dissimilarity index ",
    "rename from ",
    "rename to ",
    "copy from ",
    "copy to ",
];

/// A git extended header line, as leniently as GNU patch reads one: after
/// any indentation, its word followed by a space or a tab.
fn git_header(l: &str) -> bool {
    let l = l.trim_start_matches([' ', '\t', 'X']);
    GIT_HEADERS.iter().any(|h| l.strip_prefix(h.trim_end()).is_some_and(|r| r.starts_with([' ', '\t'])))
}

/// Cuts the diffs out of a patch file: a `git format-patch` mbox (several
/// messages, each with a diff), a rendered mail thread, or a plain unified
/// diff. A message's diff runs from its first `diff --git` (or `---`/`+++`
/// pair) over every file's hunks, counted by their headers, so the
/// signature, trailers and the next message's text are never part of it.
/// Quoted diffs (`> ...` in replies) are not diffs.
pub fn cut_diffs(text: &str) -> Result<Vec<Diff>> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<Diff> = Vec::new();
    let mut subject = String::new();
    let mut i = 0;
    let starts_diff = |i: usize| {
        lines[i].starts_with("diff --git ")
            || (lines[i].starts_with("--- ")
                && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ "))
                && lines.get(i + 2).is_some_and(|l| l.starts_with("@@ -")))
    };
    while i < lines.len() {
        if mbox_separator(lines[i]) {
            subject.clear();
        }
        if let Some(s) = subject_line(lines[i]) {
            subject = s.trim().to_string();
            i += 1;
            continue;
        }
        if !starts_diff(i) {
            i += 1;
            continue;
        }
        let start = i;
        // One file after another, as long as they follow without a gap.
        loop {
            if lines[i].starts_with("diff --git ") {
                i += 1;
                while i < lines.len() && git_header(lines[i]) {
                    i += 1;
                }
                if lines.get(i).is_some_and(|l| l.starts_with("Binary files ")) {
                    bail!("line {}: binary diffs cannot be applied with patch", i + 1);
                }
            } else {
                i += 2;
            }
            while let Some((mut old, mut new)) = lines.get(i).and_then(|l| hunk_counts(l)) {
                let header = i;
                i += 1;
                while old > 0 || new > 0 {
                    let Some(l) = lines.get(i) else {
                        bail!(
                            "the diff's hunk at line {} ends before its {old} old and {new} new lines",
                            header + 1
                        );
                    };
                    match l.as_bytes().first() {
                        // Some mailers strip a context line's one space.
                        Some(b' ') | None => {
                            old = old.checked_sub(1).context("hunk overrun")?;
                            new = new.checked_sub(1).context("hunk overrun")?;
                        }
                        Some(b'-') => old = old.checked_sub(1).context("hunk overrun")?,
                        Some(b'+') => new = new.checked_sub(1).context("hunk overrun")?,
                        Some(b'\\') => {}
                        _ => bail!(
                            "line {}: {l:?} inside the hunk of line {} (a mangled diff?)",
                            i + 1,
                            header + 1
                        ),
                    }
                    i += 1;
                }
                if lines.get(i).is_some_and(|l| l.starts_with('\\')) {
                    i += 1;
                }
            }
            if i >= lines.len() || !starts_diff(i) {
                break;
            }
        }
        let mut diff = lines[start..i].join("\n");
        diff.push('\n');
        out.push(Diff { subject: subject.clone(), text: diff });
    }
    Ok(out)
}

/// The diffs of `files`, in order, keeping only the messages whose subject
/// contains `subject` when one is given. Fails on a file without any.
pub fn read_series(files: &[PathBuf], subject: Option<&str>) -> Result<Vec<Diff>> {
    let mut all = Vec::new();
    for f in files {
        let text =
            fs::read_to_string(f).with_context(|| format!("reading the patch file {}", f.display()))?;
        let diffs = cut_diffs(&text).with_context(|| format!("cutting the diffs of {}", f.display()))?;
        let n = diffs.len();
        let kept: Vec<Diff> =
            diffs.into_iter().filter(|d| subject.is_none_or(|s| d.subject.contains(s))).collect();
        if kept.is_empty() {
            match subject {
                Some(s) => {
                    bail!("{}: none of its {n} diffs is in a message whose subject has {s:?}", f.display())
                }
                None => bail!("{}: no diff in it (a `diff --git` or `---`/`+++`/`@@` block)", f.display()),
            }
        }
        for d in &kept {
            check_diff(d).with_context(|| format!("{}: {}", f.display(), d.subject))?;
        }
        all.extend(kept);
    }
    Ok(all)
}

/// The paths a diff writes (`-p1`: the first component stripped).
fn diff_paths(d: &Diff) -> Vec<String> {
    let mut out = Vec::new();
    for l in d.text.lines() {
        let p = if let Some(r) = l.strip_prefix("diff --git ") {
            out.extend(r.split_whitespace().map(str::to_string));
            continue;
        } else if let Some(r) = l.strip_prefix("+++ ").or_else(|| l.strip_prefix("--- ")) {
            r.split('\t').next().unwrap_or("").trim().to_string()
        } else if let Some(r) = l.strip_prefix("rename to ").or_else(|| l.strip_prefix("copy to ")) {
            format!("b/{}", r.trim())
        } else {
            continue;
        };
        out.push(p);
    }
    out.into_iter()
        .filter(|p| p != "/dev/null")
        .map(|p| p.split_once('/').map(|(_, rest)| rest.to_string()).unwrap_or(p))
        .collect()
}

/// The file modes a diff's git headers give, as GNU patch reads them:
/// `old mode`, `new mode`, `new file mode`, `deleted file mode` and the
/// mode after an `index` line's hashes, each after any indentation and
/// with any spacing, in octal. An unreadable mode is `Err(text)`.
fn diff_modes(d: &Diff) -> Vec<(String, Result<u32, String>)> {
    let mut out = Vec::new();
    for l in d.text.lines() {
        let h = l.trim_start_matches([' ', '\t', 'X']);
        let rest = ["old mode", "new mode", "new file mode", "deleted file mode"]
            .iter()
            .find_map(|k| h.strip_prefix(k).filter(|r| r.starts_with([' ', '\t'])))
            .or_else(|| {
                // `index abc..def 100644`: the mode is the third word, if any.
                let r = h.strip_prefix("index").filter(|r| r.starts_with([' ', '\t']))?;
                let mut w = r.split_whitespace();
                w.next().filter(|hashes| hashes.contains(".."))?;
                w.next()
            });
        if let Some(m) = rest {
            let m = m.trim();
            let v = u32::from_str_radix(m, 8).map_err(|_| m.to_string());
            out.push((l.to_string(), v));
        }
    }
    out
}

/// A series is code the build runs (its Makefiles, as whoever builds):
/// refused when a diff gives any file mode but a regular file's (a link,
/// a gitlink, a directory: GNU patch makes links from git's modes) or
/// names a path outside the tree.
fn check_diff(d: &Diff) -> Result<()> {
    for (l, mode) in diff_modes(d) {
        match mode {
            Ok(m) if m & 0o170000 == 0o100000 => {}
            Ok(m) if m & 0o170000 == 0o120000 => bail!(
                "the diff makes or changes a symbolic link ({l:?}): refused, a link could point the build outside the tree"
            ),
            Ok(m) => bail!("the diff gives the mode {m:o}, not a regular file's ({l:?}): refused"),
            Err(m) => bail!("the diff gives the mode {m:?}, not an octal number ({l:?}): refused"),
        }
    }
    for p in diff_paths(d) {
        if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c == "..") {
            bail!("the diff names the path {p:?}, outside the kernel tree: refused");
        }
    }
    Ok(())
}

/// Every symbolic link under `tree` (relative paths): taken before and
/// after each patch, so that a link made by a way the diff's headers do not
/// show is refused all the same.
fn links_in(tree: &Path) -> Result<std::collections::BTreeSet<PathBuf>> {
    let mut links = std::collections::BTreeSet::new();
    let mut todo = vec![tree.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_symlink() {
                links.insert(e.path().strip_prefix(tree).unwrap_or(&e.path()).to_path_buf());
            } else if t.is_dir() {
                todo.push(e.path());
            }
        }
    }
    Ok(links)
}

/// Each path a diff writes resolves inside `tree` (no link in the tree
/// leads out of it).
fn check_paths_in_tree(tree: &Path, d: &Diff) -> Result<()> {
    let root = tree.canonicalize()?;
    for p in diff_paths(d) {
        let mut at = tree.join(&p);
        while !at.exists() {
            match at.parent() {
                Some(up) => at = up.to_path_buf(),
                None => break,
            }
        }
        let real = at.canonicalize().unwrap_or_else(|_| at.clone());
        if !real.starts_with(&root) {
            bail!("the diff writes {p:?}, which resolves to {} outside the tree: refused", real.display());
        }
    }
    Ok(())
}

/// A kernel built by [`build`].
#[derive(Clone, Debug)]
pub struct Built {
    /// bzImage or Image, for QEMU's `-kernel`.
    pub image: PathBuf,
    /// The final .config.
    pub config: PathBuf,
}

impl Built {
    fn at(dir: PathBuf) -> Option<Built> {
        let b = Built { image: dir.join("vmlinuz"), config: dir.join("config") };
        (b.image.is_file() && b.config.is_file()).then_some(b)
    }
}

/// The version of [`SOURCE_PACKAGE`] to build from: the one unpacked under
/// target/kernels (no network), else the suite's current one.
fn source_version() -> Result<(String, Option<crate::apt::PrivateApt>)> {
    let marker = root().join(format!("target/kernels/{SOURCE_PACKAGE}.version"));
    if let Ok(v) = fs::read_to_string(&marker) {
        if tarball(v.trim()).is_ok() {
            return Ok((v.trim().to_string(), None));
        }
    }
    let apt = crate::apt::PrivateApt::new(SOURCE_SUITE, "amd64")?;
    let out = apt.cmd("apt-cache").args(["show", "--no-all-versions", SOURCE_PACKAGE]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.lines().find_map(|l| l.strip_prefix("Version: ")).with_context(|| {
        format!("{SOURCE_PACKAGE} is not in {SOURCE_SUITE}: {}", String::from_utf8_lossy(&out.stderr))
    })?;
    Ok((v.trim().to_string(), Some(apt)))
}

fn source_dir(version: &str) -> PathBuf {
    root().join(format!("target/kernels/source/{SOURCE_PACKAGE}_{version}"))
}

/// The source tarball of an unpacked package.
fn tarball(version: &str) -> Result<PathBuf> {
    let usr_src = source_dir(version).join("usr/src");
    fs::read_dir(&usr_src)
        .with_context(|| format!("reading {}", usr_src.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.ends_with(".tar.xz")))
        .with_context(|| format!("no .tar.xz in {}", usr_src.display()))
}

/// Downloads and unpacks the source package (once).
fn fetch_source(version: &str, apt: Option<crate::apt::PrivateApt>) -> Result<PathBuf> {
    let t = match tarball(version) {
        Ok(t) => t,
        Err(_) => {
            let apt = match apt {
                Some(a) => a,
                None => crate::apt::PrivateApt::new(SOURCE_SUITE, "amd64")?,
            };
            let pkg = format!("{SOURCE_PACKAGE}={version}");
            crate::apt::download_unpack(apt.cmd("apt-get"), &pkg, &source_dir(version))?;
            tarball(version)?
        }
    };
    fs::write(root().join(format!("target/kernels/{SOURCE_PACKAGE}.version")), version)?;
    Ok(t)
}

/// The cache key of a build: the source version, the diffs in order, the
/// recipe (with the arch and the local version).
fn key(version: &str, diffs: &[Diff], recipe_text: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!("{SOURCE_PACKAGE} {version}\n"));
    for d in diffs {
        h.update(Sha256::digest(d.text.as_bytes()));
    }
    h.update(recipe_text.as_bytes());
    let hex: String = h.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect();
    let upstream = version.split('-').next().unwrap_or(version);
    format!("{upstream}-{hex}")
}

/// `name` as a kernel local version (`uname -r` = `7.3.4-NAME`): letters,
/// digits, `-`, `.` and `_` only.
fn localversion(name: &str) -> Result<String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c)) {
        bail!("--name {name:?}: use letters, digits, '-', '.' or '_'");
    }
    Ok(format!("-{name}"))
}

/// One kernel of a build: its name (the release's local version) and the
/// diffs applied to the source.
pub struct Variant<'a> {
    pub name: &'a str,
    pub diffs: &'a [Diff],
}

/// Builds (or finds cached) the first kernel of `variants` for `arch`;
/// where it must be built, the others not cached are built after it, in
/// its source tree: the tree is patched from the last one's diffs to the
/// next one's and made again, so kbuild recompiles what those diffs touch
/// (and what includes it), not the whole kernel. Each is cached under its
/// own key, the key of a build from a clean tree.
pub fn build(arch: &str, variants: &[Variant]) -> Result<Built> {
    let recipe = recipe(arch)?;
    let (version, apt) = source_version()?;
    let mut apt = Some(apt);
    let t0 = Instant::now();
    let keyed = |v: &Variant| -> Result<(String, String, String)> {
        let lv = localversion(v.name)?;
        let recipe_text = recipe.describe(&lv);
        Ok((format!("{}-{arch}", key(&version, v.diffs, &recipe_text)), lv, recipe_text))
    };
    fn cache(key: &str) -> crate::cached::Cache<'_, Built> {
        crate::cached::Cache {
            what: "xtask kernel",
            key,
            parent: root().join("target/kernels/built"),
            machine: Path::new(MACHINE_CACHE),
            at: Built::at,
        }
    }
    let first = variants.first().context("no kernel to build")?;
    if let Some(b) = cache(&keyed(first)?.0).cached() {
        return Ok(b);
    }
    // The tree shared by this call's builds, and the diffs applied in it.
    let mut shared: Option<(PathBuf, &[Diff])> = None;
    let mut first_built = None;
    for v in variants {
        let (key, lv, recipe_text) = keyed(v)?;
        let got = cache(&key).get(|scratch| {
            let (log, out) = (scratch.join("build.log"), scratch.join("out"));
            fs::create_dir_all(&out)?;
            let fresh = shared.is_none();
            // A tree that failed to take its diffs is removed.
            let kept = |tree: PathBuf, r: Result<()>| match r {
                Ok(()) => Ok(tree),
                Err(e) => {
                    let _ = fs::remove_dir_all(&tree);
                    Err(e)
                }
            };
            let tree = match shared.take() {
                Some((tree, applied)) => {
                    let r = repatch(&tree, applied, v.diffs, &out, &version);
                    kept(tree, r)
                }
                None => {
                    let tar = fetch_source(&version, apt.take().flatten())?;
                    let tree = new_tree(arch)?;
                    let r = run(Command::new("tar")
                        .arg("-xf")
                        .arg(&tar)
                        .arg("-C")
                        .arg(&tree)
                        .arg("--strip-components=1"))
                    .and_then(|()| apply_patches(&tree, v.diffs, &out, &version));
                    kept(tree, r)
                }
            }?;
            let made = make_in(recipe, &lv, &recipe_text, &version, v.diffs, &tree, &log, &out, t0, fresh);
            match made {
                Ok(()) => shared = Some((tree, v.diffs)),
                Err(_) => drop(fs::remove_dir_all(&tree)),
            }
            made.with_context(|| format!("building {} for {arch}", v.name))
        });
        match (got, first_built.is_none()) {
            (Ok(b), first) => {
                eprintln!("xtask kernel: {} {arch}: {}", v.name, b.image.display());
                if first {
                    first_built = Some(b);
                }
            }
            (Err(e), true) => return Err(e),
            // The kernel asked for is built: a later one is for later.
            (Err(e), false) => {
                eprintln!("xtask kernel: {} {arch} not built with the others: {e:#}", v.name);
                break;
            }
        }
    }
    if let Some((tree, _)) = shared {
        let _ = fs::remove_dir_all(&tree);
    }
    first_built.context("no kernel built")
}

/// Runs a build step with its output to `log`; on failure, its last lines.
pub fn logged(c: &mut Command, log: &Path, what: &str) -> Result<()> {
    let f = fs::OpenOptions::new().create(true).append(true).open(log)?;
    eprintln!("+ {c:?}  (output: {})", log.display());
    let st = c
        .stdout(f.try_clone()?)
        .stderr(f)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("starting {c:?}"))?;
    if !st.success() {
        let text = fs::read_to_string(log).unwrap_or_default();
        bail!("{what} failed ({st}); the log's end:\n{}", crate::util::tail(&text, 30));
    }
    Ok(())
}

/// Applies `diffs` in order to `tree` (each kept in `patches` as
/// `NNNN.diff`); a patch that does not apply, touches a path outside the
/// tree or makes a symbolic link is refused.
fn apply_patches(tree: &Path, diffs: &[Diff], patches: &Path, version: &str) -> Result<()> {
    let links = links_in(tree)?;
    for (n, d) in diffs.iter().enumerate() {
        let file = patches.join(format!("{:04}.diff", n + 1));
        fs::write(&file, &d.text)?;
        check_paths_in_tree(tree, d)?;
        let (ok, said) = patch(tree, &file, &[])?;
        let subject = if d.subject.is_empty() { "(no subject)" } else { &d.subject };
        if !ok {
            bail!(
                "patch {} of {}, {subject}, does not apply to {SOURCE_PACKAGE} {version}:\n{}",
                n + 1,
                diffs.len(),
                said.trim_end()
            );
        }
        if let Some(l) = links_in(tree)?.difference(&links).next() {
            bail!(
                "patch {} of {}, {subject}, made the symbolic link {}: refused",
                n + 1,
                diffs.len(),
                l.display()
            );
        }
        eprintln!(
            "xtask kernel: applied {}/{}: {subject}\n  {}",
            n + 1,
            diffs.len(),
            said.trim_end().replace('\n', "\n  ")
        );
    }
    Ok(())
}

/// The kernel's configuration: `allnoconfig` with the recipe's options,
/// checked as set; returns the `.config`.
fn configure(recipe: &Recipe, tree: &Path, lv: &str, log: &Path) -> Result<String> {
    let mut wanted = format!("CONFIG_LOCALVERSION=\"{lv}\"\n# CONFIG_LOCALVERSION_AUTO is not set\n");
    for o in recipe.on() {
        wanted.push_str(&format!("CONFIG_{o}=y\n"));
    }
    let fragment = tree.join(".faultscope.config");
    fs::write(&fragment, wanted)?;
    logged(
        recipe.make(tree).arg("allnoconfig").env("KCONFIG_ALLCONFIG", &fragment),
        log,
        "make allnoconfig",
    )?;
    logged(recipe.make(tree).arg("olddefconfig"), log, "make olddefconfig")?;
    let config = fs::read_to_string(tree.join(".config"))?;
    check_config(&config, recipe.on(), recipe.off())?;
    Ok(config)
}

/// A new empty folder for a shared tree, after removing the trees of
/// builds whose process is gone (killed mid-build).
fn new_tree(arch: &str) -> Result<PathBuf> {
    let parent = root().join("target/kernels/built");
    fs::create_dir_all(&parent)?;
    for e in fs::read_dir(&parent)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.strip_prefix(".tree-").and_then(|r| r.rsplit_once('-')).map(|(_, p)| p.to_string());
        if pid.is_some_and(|p| !Path::new("/proc").join(&p).exists()) {
            eprintln!("xtask kernel: removing {}, left by a build that did not finish", e.path().display());
            fs::remove_dir_all(e.path())?;
        }
    }
    let tree = parent.join(format!(".tree-{arch}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tree);
    fs::create_dir_all(&tree)?;
    Ok(tree)
}

/// Takes `tree` from the diffs `applied` (reversed, last first) to `next`,
/// each kept in `patches`.
fn repatch(tree: &Path, applied: &[Diff], next: &[Diff], patches: &Path, version: &str) -> Result<()> {
    for (n, d) in applied.iter().enumerate().rev() {
        let file = patches.join(format!("reverse-{:04}.diff", n + 1));
        fs::write(&file, &d.text)?;
        let (ok, said) = patch(tree, &file, &["--reverse"])?;
        if !ok {
            bail!("taking back {:?} from the shared tree failed:\n{said}", d.subject);
        }
    }
    apply_patches(tree, next, patches, version)
}

/// Runs GNU patch on `tree` with the diff `file`: never a diff that looks
/// applied the other way (`--forward`), no questions, no backups. Returns
/// whether it applied, and what patch said.
fn patch(tree: &Path, file: &Path, extra: &[&str]) -> Result<(bool, String)> {
    let out = Command::new("patch")
        .current_dir(tree)
        .args(["-p1", "--forward", "--batch", "--no-backup-if-mismatch"])
        .args(extra)
        .arg("-i")
        .arg(file)
        .output()
        .context("running patch")?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), said))
}

/// Configures and makes the patched `tree` (`fresh`: its first build),
/// leaving the image, config and `about.txt` in `out`.
#[allow(clippy::too_many_arguments)]
fn make_in(
    recipe: &Recipe,
    lv: &str,
    recipe_text: &str,
    version: &str,
    diffs: &[Diff],
    tree: &Path,
    log: &Path,
    out: &Path,
    t0: Instant,
    fresh: bool,
) -> Result<()> {
    let config = configure(recipe, tree, lv, log)?;
    let jobs = std::thread::available_parallelism().map_or(2, |n| n.get());
    let tb = Instant::now();
    let cpu0 = children_cpu_s();
    logged(recipe.make(tree).arg(format!("-j{jobs}")).arg(recipe.target), log, "the kernel build")?;
    let build_s = tb.elapsed().as_secs_f64();
    let cpu_s = children_cpu_s().zip(cpu0).map(|(a, b)| a - b);
    fs::copy(tree.join(recipe.image), out.join("vmlinuz"))?;
    fs::write(out.join("config"), &config)?;
    let release = fs::read_to_string(tree.join("include/config/kernel.release")).unwrap_or_default();
    let mut about = fs::File::create(out.join("about.txt"))?;
    writeln!(about, "{SOURCE_PACKAGE} {version}, release {}", release.trim())?;
    for (n, d) in diffs.iter().enumerate() {
        writeln!(about, "patch {:04}.diff: {}", n + 1, d.subject)?;
    }
    let cpu = cpu_s.map_or(String::new(), |c| format!(", {c:.0}s of CPU"));
    let how = if fresh { "" } else { ", again in the tree of the build before it" };
    let said = format!(
        "make -j{jobs} {}{how} took {build_s:.0}s{cpu} ({:.0}s in all)",
        recipe.target,
        t0.elapsed().as_secs_f64()
    );
    eprintln!("xtask kernel: {said}");
    writeln!(about, "{said}\n{recipe_text}")?;
    Ok(())
}

/// User + system CPU seconds of this process's waited-for children
/// (`/proc/self/stat` cutime and cstime): a build's time on a machine that
/// others share says little; its CPU time says what it costs.
fn children_cpu_s() -> Option<f64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of stat(5); `rest` starts at 3.
    let ticks = f.get(13)?.parse::<f64>().ok()? + f.get(14)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Fails unless every `on` option is `=y` and no `off` option is set in
/// `config`: a dependency that Kconfig turned down silently would otherwise
/// give a kernel without kprobes or BTF, found out only in a guest.
fn check_config<'a>(
    config: &str,
    on: impl Iterator<Item = &'a str>,
    off: impl Iterator<Item = &'a str>,
) -> Result<()> {
    let value = |o: &str| {
        let p = format!("CONFIG_{o}=");
        config.lines().find_map(|l| l.strip_prefix(p.as_str())).map(str::to_string)
    };
    let mut wrong = Vec::new();
    for o in on {
        match value(o) {
            Some(v) if v == "y" => {}
            Some(v) => wrong.push(format!("CONFIG_{o}={v} (want y)")),
            None => wrong.push(format!("CONFIG_{o} is not set (want y)")),
        }
    }
    for o in off {
        if let Some(v) = value(o) {
            wrong.push(format!("CONFIG_{o}={v} (want it unset: something selects it)"));
        }
    }
    if !wrong.is_empty() {
        bail!("the kernel's .config does not have what was asked for:\n  {}", wrong.join("\n  "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::Source;

    /// A two-message `git format-patch` mbox: cover letter without a diff,
    /// then two patches, the first touching two files.
    const MBOX: &str = "From 1111 Mon Sep 17 00:00:00 2001
From: A <a@b>
Subject: [PATCH 0/2] mm: things

cover letter, no diff

From 2222 Mon Sep 17 00:00:00 2001
From: A <a@b>
Subject: [PATCH 1/2] mm: one

why
---
 mm/a.c | 2 +-
 mm/b.c | 1 +

diff --git a/mm/a.c b/mm/a.c
index 1..2 100644
--- a/mm/a.c
+++ b/mm/a.c
@@ -1,3 +1,3 @@
 a
-b
+B
 c
diff --git a/mm/b.c b/mm/b.c
--- a/mm/b.c
+++ b/mm/b.c
@@ -1 +1,2 @@
 x
+y
-- 
2.43.0

From 3333 Mon Sep 17 00:00:00 2001
Subject: [PATCH 2/2] mm: two

> diff --git a/quoted b/quoted
diff --git a/mm/a.c b/mm/a.c
--- a/mm/a.c
+++ b/mm/a.c
@@ -5,2 +5,2 @@ static int f(void)
-d
+D

\\ No newline at end of file
base-commit: 1234
";

    #[test]
    fn diffs_that_make_links_or_leave_the_tree_are_refused() {
        let link = "diff --git a/evil b/evil\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+/etc\n\\ No newline at end of file\n";
        let d = cut_diffs(link).unwrap();
        assert!(format!("{:#}", check_diff(&d[0]).unwrap_err()).contains("symbolic link"));
        // Every spelling GNU patch takes as a link, and other types.
        for (header, why) in [
            ("new file mode 120777", "symbolic link"),
            ("new file mode 120644", "symbolic link"),
            ("new file mode  120000", "symbolic link"),
            ("new file mode\t120000", "symbolic link"),
            ("  new mode 120000", "symbolic link"),
            ("old mode 0120000", "symbolic link"),
            ("index 0000000..1111111 120000", "symbolic link"),
            ("new file mode 160000", "not a regular file"),
            ("new file mode 040755", "not a regular file"),
            ("new file mode 12x000", "not an octal number"),
        ] {
            let text = link.replace(
                "new file mode 120000\nindex 0000000..1111111",
                &format!("{header}\nindex 0000000..1111111"),
            );
            let d = cut_diffs(&text).unwrap();
            let e = format!("{:#}", check_diff(&d[0]).unwrap_err());
            assert!(e.contains(why), "{header:?}: {e}");
        }
        for header in ["new file mode 100644", "new file mode 100755", "index 0000000..1111111 100644"] {
            let text = link.replace("new file mode 120000\nindex 0000000..1111111", header);
            check_diff(&cut_diffs(&text).unwrap()[0]).unwrap();
        }
        let out = "--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n";
        let d = cut_diffs(out).unwrap();
        assert!(format!("{:#}", check_diff(&d[0]).unwrap_err()).contains("outside the kernel tree"));
        for d in cut_diffs(MBOX).unwrap() {
            check_diff(&d).unwrap();
            assert!(diff_paths(&d).iter().all(|p| p.starts_with("mm/")), "{:?}", diff_paths(&d));
        }
        // A link already in the tree that leads out of it.
        let tree = tempfile::tempdir().unwrap().keep();
        let outside = tempfile::tempdir().unwrap().keep();
        std::os::unix::fs::symlink(&outside, tree.join("mm")).unwrap();
        let d = &cut_diffs(MBOX).unwrap()[0];
        assert!(format!("{:#}", check_paths_in_tree(&tree, d).unwrap_err()).contains("outside the tree"));
        let _ = fs::remove_dir_all(&tree);
        let _ = fs::remove_dir_all(&outside);
    }

    /// A shared tree goes from one kernel's diffs to the next one's: the
    /// first taken back (last first), the next applied; only the files
    /// either touches change.
    #[test]
    fn repatch_takes_a_tree_from_one_series_to_the_next() {
        let tree = tempfile::tempdir().unwrap().keep();
        fs::create_dir_all(tree.join("mm")).unwrap();
        fs::write(tree.join("mm/a.c"), "one\ntwo\nthree\n").unwrap();
        fs::write(tree.join("mm/b.h"), "x\n").unwrap();
        let diff = |text: &str| Diff { subject: String::new(), text: text.to_string() };
        let first = [
            diff("--- a/mm/a.c\n+++ b/mm/a.c\n@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\n"),
            diff("--- a/mm/a.c\n+++ b/mm/a.c\n@@ -1,3 +1,3 @@\n one\n TWO\n-three\n+THREE\n"),
        ];
        let next = [diff("--- a/mm/b.h\n+++ b/mm/b.h\n@@ -1 +1,2 @@\n x\n+y\n")];
        let patches = tempfile::tempdir().unwrap().keep();
        apply_patches(&tree, &first, &patches, "test").unwrap();
        assert_eq!(fs::read_to_string(tree.join("mm/a.c")).unwrap(), "one\nTWO\nTHREE\n");
        repatch(&tree, &first, &next, &patches, "test").unwrap();
        assert_eq!(fs::read_to_string(tree.join("mm/a.c")).unwrap(), "one\ntwo\nthree\n");
        assert_eq!(fs::read_to_string(tree.join("mm/b.h")).unwrap(), "x\ny\n");
        // Taking back what is not applied fails, naming the diff.
        let e = repatch(&tree, &first, &[], &patches, "test").unwrap_err();
        assert!(format!("{e:#}").contains("taking back"), "{e:#}");
        assert_eq!(fs::read_to_string(tree.join("mm/a.c")).unwrap(), "one\ntwo\nthree\n");
        let _ = fs::remove_dir_all(&tree);
        let _ = fs::remove_dir_all(&patches);
    }

    #[test]
    fn an_mbox_gives_one_diff_per_message_in_order() {
        let d = cut_diffs(MBOX).unwrap();
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0].subject, "[PATCH 1/2] mm: one");
        assert!(d[0].text.starts_with("diff --git a/mm/a.c b/mm/a.c\n"), "{}", d[0].text);
        assert!(d[0].text.contains("diff --git a/mm/b.c"), "both files are one message's diff");
        assert!(d[0].text.ends_with(" x\n+y\n"), "{:?}", d[0].text);
        assert_eq!(d[1].subject, "[PATCH 2/2] mm: two");
        // The blank context line is the hunk's; the signature is not.
        assert!(d[1].text.ends_with("+D\n\n\\ No newline at end of file\n"), "{:?}", d[1].text);
        // Selecting by subject.
        let f = std::env::temp_dir().join(format!("xtask-kbuild-test-{}.mbox", std::process::id()));
        fs::write(&f, MBOX).unwrap();
        let only = read_series(std::slice::from_ref(&f), Some("2/2")).unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0], d[1]);
        let e = read_series(std::slice::from_ref(&f), Some("v3")).unwrap_err().to_string();
        assert!(e.contains("none of its 2 diffs"), "{e}");
        fs::remove_file(&f).unwrap();
    }

    #[test]
    fn a_rendered_thread_and_a_plain_diff() {
        let thread = "[PATCH v2 1/2] mm: x\n\n[Someone]\n\ntext\n---\n diffstat\n\n\
                      diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n-a\n+b\n-- \n2.43.0\n\n\
                      Re: [PATCH v2 1/2] mm: x\n\n> diff --git a/f b/f\n> @@ -1 +1 @@\nlooks fine\n";
        let d = cut_diffs(thread).unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].subject, "[PATCH v2 1/2] mm: x");
        assert_eq!(d[0].text, "diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,1 +1,1 @@\n-a\n+b\n");
        let plain = "--- f.orig\n+++ f\n@@ -1 +1 @@\n-a\n+b\n";
        let d = cut_diffs(plain).unwrap();
        assert_eq!(d, [Diff { subject: String::new(), text: plain.to_string() }]);
    }

    #[test]
    fn a_truncated_or_mangled_diff_is_an_error() {
        let e = cut_diffs("diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n").unwrap_err();
        assert!(e.to_string().contains("ends before its"), "{e}");
        let e = cut_diffs("diff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\nwrapped line\n")
            .unwrap_err();
        assert!(e.to_string().contains("inside the hunk"), "{e}");
    }

    #[test]
    fn hunk_headers() {
        assert_eq!(hunk_counts("@@ -4355,6 +4355,71 @@ static bool f(struct folio *folio,"), Some((6, 71)));
        assert_eq!(hunk_counts("@@ -1 +1,2 @@"), Some((1, 2)));
        assert_eq!(hunk_counts("@@ -0,0 +1 @@"), Some((0, 1)));
        assert_eq!(hunk_counts("@@ bad"), None);
    }

    #[test]
    fn the_config_check_names_what_is_missing() {
        let c = "CONFIG_KPROBES=y\nCONFIG_BPF=m\n# CONFIG_DRM is not set\nCONFIG_SOUND=y\n";
        assert!(check_config(c, ["KPROBES"].into_iter(), ["DRM"].into_iter()).is_ok());
        let e =
            check_config(c, ["KPROBES", "BPF", "DEBUG_INFO_BTF"].into_iter(), ["DRM", "SOUND"].into_iter())
                .unwrap_err()
                .to_string();
        assert!(e.contains("CONFIG_BPF=m (want y)"), "{e}");
        assert!(e.contains("CONFIG_DEBUG_INFO_BTF is not set (want y)"), "{e}");
        assert!(e.contains("CONFIG_SOUND=y (want it unset"), "{e}");
        assert!(!e.contains("KPROBES") && !e.contains("DRM"), "{e}");
    }

    #[test]
    fn the_key_follows_each_input() {
        let d = |t: &str| Diff { subject: "s".into(), text: t.into() };
        let k = key("7.3.4-1~bpo13+1", &[d("a"), d("b")], "r");
        assert!(k.starts_with("7.3.4-"), "{k}");
        assert_eq!(k, key("7.3.4-1~bpo13+1", &[d("a"), d("b")], "r"));
        for other in [
            key("7.3.4-1~bpo13+2", &[d("a"), d("b")], "r"),
            key("7.3.4-1~bpo13+1", &[d("b"), d("a")], "r"),
            key("7.3.4-1~bpo13+1", &[d("a")], "r"),
            key("7.3.4-1~bpo13+1", &[d("a"), d("b")], "r2"),
        ] {
            assert_ne!(k, other);
        }
        assert_ne!(AMD64.describe("-x"), ARM64.describe("-x"));
        assert_ne!(AMD64.describe("-x"), AMD64.describe("-y"));
        assert!(localversion("folio-reuse").is_ok());
        assert!(localversion("a b").is_err() && localversion("").is_err() && localversion("../x").is_err());
    }

    /// The matrix's series, cut from its fixture: the v2 thread holds v1
    /// too, and replies; only v2's two diffs are kept, in order.
    #[test]
    fn the_folio_reuse_fixture_gives_its_two_v2_diffs() {
        let Source::Built(p) = crate::kernels::by_name("7.3-folio-reuse-amd64").unwrap().source else {
            panic!("not a built kernel")
        };
        let file = match p.series.unwrap().path() {
            Ok(f) => f,
            Err(why) => {
                eprintln!("SKIPPED: the folio-reuse series' cut: {why}");
                return;
            }
        };
        let all = read_series(std::slice::from_ref(&file), None).unwrap();
        let d = read_series(&[file], Some(p.series.unwrap().subject)).unwrap();
        assert!(all.len() > d.len(), "{all:?}");
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].subject.starts_with("[PATCH v2 1/2] "), "{}", d[0].subject);
        assert!(d[1].subject.starts_with("[PATCH v2 2/2] "), "{}", d[1].subject);
        for x in &d {
            assert!(x.text.starts_with("diff --git a/mm/memory.c b/mm/memory.c\n"), "{}", x.text);
            assert!(!x.text.contains("\n-- \n"), "the signature is not the diff's: {}", x.text);
        }
    }
}
