//! arm64 guest binaries, built on this x86-64 host. rustup here has no
//! aarch64 std and cannot download one, so faultscope is cross-built with
//! Debian's rustc 1.96 and its prebuilt `libstd-rust-web-dev:arm64`, linked
//! static by `aarch64-linux-gnu-gcc` so the initramfs needs no libraries.
//! tracer/build.rs then builds the eBPF object with bpf_target_arch="aarch64"
//! (aya-build takes it from CARGO_CFG_TARGET_ARCH), so kprobe arguments are
//! read from arm64 `pt_regs`.

use std::{path::PathBuf, process::Command};

use anyhow::Result;

use crate::util::{root, run};

pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// The C cross compiler (gcc-aarch64-linux-gnu): linker and oracle builds.
pub const CC: &str = "aarch64-linux-gnu-gcc";

/// `cargo SUBCOMMAND --profile PROFILE --target aarch64 --target-dir
/// target/DIR` with Debian's toolchain, linked static, for this one
/// invocation only.
pub fn cargo(subcommand: &str, dir: &str, profile: &str) -> Command {
    let mut c = crate::util::cargo("/usr/bin/cargo");
    c.env("RUSTC", "/usr/bin/rustc")
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", CC)
        // RUSTFLAGS would override the target's flags (and drop crt-static).
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS", "-C target-feature=+crt-static")
        .args([subcommand, "--profile", profile, "--target", TARGET])
        .arg("--target-dir")
        .arg(root().join("target").join(dir));
    c
}

/// Builds the static aarch64 faultscope into target/cross (its own target
/// folder, so it never invalidates the host build).
pub fn build_faultscope() -> Result<PathBuf> {
    run(cargo("build", "cross", "release").args(["-p", "faultscope", "-p", "faultscope-workload"]))?;
    Ok(root().join("target/cross").join(TARGET).join("release/faultscope"))
}

/// Debian's busybox-static for arm64, downloaded (never installed) and
/// unpacked under target/cross once. The host lists have arm64 since
/// `cargo xtask setup` added that architecture.
pub fn busybox() -> Result<PathBuf> {
    let dir = root().join("target/cross/debs/busybox-static-arm64");
    let bin = dir.join("bin/busybox");
    if !bin.exists() {
        let mut apt = Command::new("apt-get");
        // The checkout may not be readable by apt's `_apt` user.
        apt.args(["-o", "APT::Sandbox::User=root"]);
        crate::apt::download_unpack(apt, "busybox-static:arm64", &dir)?;
    }
    Ok(bin)
}
