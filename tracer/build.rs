//! Build script of the `faultscope` package: builds the eBPF object
//! (package and binary `faultscope-ebpf`, in tracer-ebpf) for this target's
//! architecture, into `$OUT_DIR/faultscope-ebpf`.
//!
//! The BPF build uses Debian's rustc 1.96 (`rustc-web`), which ships a
//! prebuilt `core` for bpfel-unknown-none, so no nightly or rust-src is
//! needed; bpf-linker is the one `cargo xtask setup` installs under
//! target/tools. aya-build runs `cargo`/`rustc` from PATH when rustup is not
//! on it, so PATH is narrowed to those tools for this one build.

use std::{env, path::PathBuf};

use anyhow::{bail, Context as _};

fn main() -> anyhow::Result<()> {
    // Without the `ebpf` feature (xtask reading reports before the BPF
    // toolchain is installed) there is no object to build.
    if env::var_os("CARGO_FEATURE_EBPF").is_none() {
        return Ok(());
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.parent().context("workspace root")?.to_path_buf();
    println!("cargo:rerun-if-env-changed=FAULTSCOPE_BPF_TOOLCHAIN");
    println!("cargo:rerun-if-env-changed=FAULTSCOPE_BPF_LINKER_DIR");
    let toolchain = PathBuf::from(env::var("FAULTSCOPE_BPF_TOOLCHAIN").unwrap_or_else(|_| "/usr/bin".into()));
    let linker_dir = env::var("FAULTSCOPE_BPF_LINKER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target/tools/bin"));
    if !toolchain.join("cargo").exists() || !PathBuf::from("/usr/lib/rustlib/bpfel-unknown-none").exists() {
        bail!(
            "the BPF toolchain is missing (Debian's rustc-web, cargo-web and libstd-rust-web-dev-bpf): run `cargo xtask setup`"
        );
    }
    if !linker_dir.join("bpf-linker").exists() {
        bail!("bpf-linker is missing from {}: run `cargo xtask setup`", linker_dir.display());
    }
    let path = format!("{}:{}:/usr/bin:/bin", linker_dir.display(), toolchain.display());
    // SAFETY: the build script is single-threaded here.
    unsafe {
        env::set_var("PATH", path);
        // aya-ebpf and our atomic add need unstable asm on BPF; allow it for
        // those crates only (the eBPF binary crate is `faultscope_ebpf`; a
        // list, not the package name alone, also keeps aya-build from asking
        // for -Zbuild-std).
        env::set_var(
            "RUSTC_BOOTSTRAP",
            "aya_ebpf,aya_ebpf_bindings,aya_ebpf_cty,aya_log_ebpf,faultscope_ebpf",
        );
        env::remove_var("CARGO_ENCODED_RUSTFLAGS");
        env::remove_var("RUSTFLAGS");
        // Keep the BPF build's own Cargo.lock and cargo config.
        env::remove_var("CARGO_TARGET_DIR");
        env::remove_var("CARGO_BUILD_TARGET");
    }
    println!("cargo:rerun-if-changed={}", root.join("tracer-common/src").display());
    let ebpf = root.join("tracer-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "faultscope-ebpf",
            root_dir: ebpf.to_str().context("utf-8 path")?,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
