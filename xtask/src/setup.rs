//! `cargo xtask setup`: installs everything the build and the guest tests
//! need on a fresh Debian bookworm machine; `setup --build` only what the
//! build and `cargo xtask dist` need (no QEMU, Redis, Prometheus, kernel
//! build dependencies). Idempotent: a second run checks and returns in
//! seconds.

use std::{fs, path::Path, process::Command};

use anyhow::{bail, Context as _, Result};

use crate::util::{root, run, tools_bin};

/// What building faultscope needs (`setup --build`), from the machine's own
/// suites: Debian's Rust (rustc-web) with a prebuilt BPF `core`, LLVM 22 and
/// the libraries bpf-linker links, the C toolchain with static glibc (the
/// static x86-64 build), and the arm64 cross build `dist` ships (the cross C
/// compiler as linker, its static libc, Debian's prebuilt Rust std for
/// aarch64: Multi-Arch: same, matching rustc-web's version). The arm64 part
/// is small and a release has both arches, so it is not left out.
const BUILD_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    "gcc",
    "libc6-dev",
    "gcc-aarch64-linux-gnu",
    "libc6-dev-arm64-cross",
    "libstd-rust-web-dev:arm64",
    // `cargo xtask dist`: the container image (from scratch, no daemon).
    "buildah",
];

/// The rest of what the tests need, on top of [`BUILD_PACKAGES`].
const PACKAGES: &[&str] = &[
    // The guests' initramfs (and the oracle, built with the C toolchain
    // above: cross-built static for arm64).
    "busybox-static",
    "cpio",
    "xz-utils",
    "zstd",
    // The dist stage of `test`: `man -l` renders the packaged man pages,
    // `systemd-analyze verify` the packaged unit.
    "man-db",
    "systemd",
    // ... and podman runs the image, with runc (crun refuses a host with
    // both cgroup versions mounted).
    "podman",
    "runc",
    // `cargo xtask kernel` (the patched 7.3 guest kernels): the kernel's
    // build dependencies, pahole (dwarves) for BTF, patch for the series.
    "build-essential",
    "flex",
    "bison",
    "bc",
    "libelf-dev",
    "libssl-dev",
    "dwarves",
    "patch",
    // `cargo xtask qemu` (the stale-TLB model, `--tlb stale`): QEMU's build
    // dependencies (meson and pycotap come from PyPI: see xtask/src/qemu.rs;
    // zlib1g-dev is in BUILD_PACKAGES).
    "ninja-build",
    "libglib2.0-dev",
    "libpixman-1-dev",
    "libfdt-dev",
    "python3-venv",
    // `cargo xtask redis`: the guest runs the host's redis-server over 9p
    // (its service is never started here: see `NoServiceStart`).
    "redis-server",
    "redis-tools",
    // `cargo xtask daemon`: the guest runs the host's Prometheus (its
    // service is never started here either), queried with curl, and the
    // plot's PNG is rendered with these fonts.
    "prometheus",
    "curl",
    "fonts-dejavu-core",
    // `cargo xtask overhead`: bpftrace beside faultscope, bpftool for the
    // kernel's per-program run time, mke2fs for the guests' bpftrace image.
    "bpftrace",
    "bpftool",
    "e2fsprogs",
    // Host tests: a run's own opens of /proc/kallsyms, counted; `go tool
    // pprof` reads a --pprof profile.
    "strace",
    "golang-go",
];

/// From bookworm-backports: QEMU 10 (the bookworm 7.2 build conflicts with
/// the backported qemu-utils such machines have, and is 3x slower on arm64).
const BACKPORTS: &[&str] = &["qemu-system-x86", "qemu-system-arm"];

const BPF_LINKER_VERSION: &str = "0.13.0";

/// Everything: the build, the guests and every test's tools.
pub fn setup() -> Result<()> {
    let all: Vec<&str> = BUILD_PACKAGES.iter().chain(PACKAGES).copied().collect();
    install(&all, BACKPORTS)?;
    bpf_linker()?;
    eprintln!("xtask setup: toolchain ready (rustc-web, bpf-linker {BPF_LINKER_VERSION}, qemu, arm64 cross)");
    Ok(())
}

/// `setup --build`: only what `cargo build` and `cargo xtask dist` need.
pub fn setup_build() -> Result<()> {
    install(BUILD_PACKAGES, &[])?;
    bpf_linker()?;
    eprintln!("xtask setup: build toolchain ready (rustc-web, bpf-linker {BPF_LINKER_VERSION}, arm64 cross)");
    Ok(())
}

/// Installs what of `packages` (the machine's suites) and `backports` is
/// missing, with arm64 as a foreign architecture (both package lists hold
/// `:arm64` packages).
fn install(packages: &[&str], backports: &[&str]) -> Result<()> {
    let new_arch = foreign_arch("arm64")?;
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
    let bp_missing: Vec<&str> = backports.iter().copied().filter(|p| !installed(p)).collect();
    if new_arch || !missing.is_empty() || !bp_missing.is_empty() {
        // The backports source goes in before the update fetches its list.
        let suite = if backports.is_empty() { None } else { Some(backports_source()?) };
        run(Command::new("apt-get").arg("update"))?;
        if !missing.is_empty() {
            apt_install(&missing, None)?;
        }
        if !bp_missing.is_empty() {
            apt_install(&bp_missing, suite.as_deref())?;
        }
    }
    Ok(())
}

/// Adds `arch` as a dpkg foreign architecture (for `libstd-rust-web-dev:arm64`
/// and arm64 downloads); true when it was new, so the lists need an update.
fn foreign_arch(arch: &str) -> Result<bool> {
    let out = Command::new("dpkg").arg("--print-foreign-architectures").output().context("dpkg")?;
    if String::from_utf8_lossy(&out.stdout).split_whitespace().any(|a| a == arch) {
        return Ok(false);
    }
    run(Command::new("dpkg").args(["--add-architecture", arch]))?;
    Ok(true)
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn apt_install(pkgs: &[&str], suite: Option<&str>) -> Result<()> {
    let _guard = NoServiceStart::new()?;
    let mut c = Command::new("apt-get");
    c.env("DEBIAN_FRONTEND", "noninteractive").args(["install", "-y", "--no-install-recommends"]);
    if let Some(s) = suite {
        c.args(["-t", s]);
    }
    c.args(pkgs);
    run(&mut c)
}

/// Keeps dpkg from starting the services of what it installs (redis-server's
/// would otherwise start on the host): Debian's invoke-rc.d and
/// deb-systemd-invoke ask /usr/sbin/policy-rc.d, whose exit code 101 means
/// "action forbidden". Written only where the machine has none (containers
/// often do), and removed again on drop.
struct NoServiceStart(bool);

const POLICY_RC_D: &str = "/usr/sbin/policy-rc.d";

impl NoServiceStart {
    fn new() -> Result<Self> {
        let p = Path::new(POLICY_RC_D);
        if p.exists() {
            return Ok(Self(false));
        }
        fs::write(p, "#!/bin/sh\n# Written by faultscope's `cargo xtask setup` while it installs packages.\nexit 101\n")
            .with_context(|| format!("writing {POLICY_RC_D}"))?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(p, fs::Permissions::from_mode(0o755))?;
        Ok(Self(true))
    }
}

impl Drop for NoServiceStart {
    fn drop(&mut self) {
        if self.0 {
            let _ = fs::remove_file(POLICY_RC_D);
        }
    }
}

/// The codename's backports suite, added as a source derived from the
/// machine's own Debian source (same mirror, same keyring); never a host
/// written into the project.
fn backports_source() -> Result<String> {
    let codename = codename()?;
    let suite = format!("{codename}-backports");
    let (uri, keyring) = debian_mirror(&codename)?;
    let dst = Path::new("/etc/apt/sources.list.d/faultscope-backports.sources");
    let body = format!(
        "# Added by faultscope's `cargo xtask setup` (QEMU from backports).\nTypes: deb\nURIs: {uri}\nSuites: {suite}\nComponents: main\n{}",
        keyring.map(|k| format!("Signed-By: {k}\n")).unwrap_or_default()
    );
    if fs::read_to_string(dst).ok().as_deref() != Some(body.as_str()) {
        fs::write(dst, body).with_context(|| format!("writing {}", dst.display()))?;
    }
    Ok(suite)
}

/// The machine's Debian codename (bookworm).
pub fn codename() -> Result<String> {
    let os = fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    os.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|s| s.trim_matches('"').to_string())
        .context("no VERSION_CODENAME in /etc/os-release")
}

/// The mirror URI (and keyring) that serves `codename` in the machine's apt
/// configuration: deb822 `.sources` files or one-line `sources.list`.
pub fn debian_mirror(codename: &str) -> Result<(String, Option<String>)> {
    let mut files = vec![Path::new("/etc/apt/sources.list").to_path_buf()];
    if let Ok(rd) = fs::read_dir("/etc/apt/sources.list.d") {
        for e in rd.flatten() {
            files.push(e.path());
        }
    }
    for f in files {
        let Ok(text) = fs::read_to_string(&f) else {
            continue;
        };
        if f.extension().is_some_and(|e| e == "sources") {
            for stanza in text.split("\n\n") {
                let field =
                    |k: &str| stanza.lines().find_map(|l| l.strip_prefix(k)).map(|v| v.trim().to_string());
                let suites = field("Suites:").unwrap_or_default();
                if suites.split_whitespace().any(|s| s == codename) {
                    if let Some(uri) = field("URIs:") {
                        let uri = uri.split_whitespace().next().unwrap_or_default().to_string();
                        return Ok((uri, field("Signed-By:")));
                    }
                }
            }
        } else if f.extension().is_some_and(|e| e == "list") || f.ends_with("sources.list") {
            for l in text.lines() {
                let w: Vec<&str> = l.split_whitespace().collect();
                if w.first() == Some(&"deb") {
                    let rest: Vec<&str> = w[1..].iter().copied().filter(|x| !x.starts_with('[')).collect();
                    if rest.len() >= 2 && rest[1] == codename {
                        return Ok((rest[0].to_string(), None));
                    }
                }
            }
        }
    }
    bail!("no apt source for {codename} found in /etc/apt; cannot derive an apt source from it")
}

fn bpf_linker() -> Result<()> {
    let bin = tools_bin().join("bpf-linker");
    if bin.exists() {
        return Ok(());
    }
    let root = root().join("target/tools");
    let path = format!("/usr/lib/llvm-22/bin:{}", std::env::var("PATH").unwrap_or_default());
    run(Command::new("cargo").env("PATH", path).arg("install").arg("--root").arg(&root).args([
        "bpf-linker",
        "--version",
        BPF_LINKER_VERSION,
        "--no-default-features",
        "--features",
        "llvm-22",
    ]))
}
