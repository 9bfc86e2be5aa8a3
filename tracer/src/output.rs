//! Output files (reports, folded stacks, SVG and PNG pictures): written
//! whole or not at all, never through a path another user controls, and
//! never over something that is not a regular file.
//!
//! - `-` is standard output.
//! - A FIFO or a character device (`/dev/null`, a terminal, `/dev/stdout`
//!   through its links) is written in place: it has no file to replace.
//! - A regular file, or a name that does not exist yet, gets a new file in
//!   the same directory (an unpredictable name, created exclusively,
//!   never through a link) that is renamed over it when complete.
//! - Anything else (a directory, a block device, a socket) is refused, and
//!   so is a parent directory reached through a link that another user
//!   owns. A link that another user owns at the target is replaced, not
//!   followed.
//!
//! A leaf module: every command that writes a file goes through it.

use std::{
    fs,
    io::Write as _,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::error::Refusal;

/// How a path is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Stdout,
    /// A FIFO or character device, opened and written as it is.
    InPlace(PathBuf),
    /// A regular file (or none yet): a complete new file renamed over it.
    Replace(PathBuf),
}

/// Root, or the user faultscope runs as: the owners whose links it
/// follows.
fn trusted(uid: u32) -> bool {
    // SAFETY: geteuid cannot fail.
    uid == 0 || uid == unsafe { libc::geteuid() }
}

fn refuse(p: &Path, why: impl std::fmt::Display) -> Refusal {
    Refusal::new(format!("cannot write {}: {why}", p.display()))
}

/// How `p` would be written, or why it cannot be: decided before a run, so
/// that nothing is attached for a report that cannot be written.
pub fn plan(p: &Path) -> Result<Output, Refusal> {
    if p.as_os_str() == "-" {
        return Ok(Output::Stdout);
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(m) = fs::symlink_metadata(dir) {
        if m.file_type().is_symlink() && !trusted(m.uid()) {
            return Err(refuse(
                p,
                format!(
                    "its directory {} is a symbolic link owned by uid {}: not followed",
                    dir.display(),
                    m.uid()
                ),
            ));
        }
    }
    let dm = fs::metadata(dir).map_err(|e| refuse(p, e))?;
    if !dm.is_dir() {
        return Err(refuse(p, format!("{} is not a directory", dir.display())));
    }
    let m = match fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Output::Replace(p.to_path_buf())),
        Err(e) => return Err(refuse(p, e)),
    };
    if m.file_type().is_symlink() {
        if !trusted(m.uid()) {
            return Ok(Output::Replace(p.to_path_buf()));
        }
        return match fs::metadata(p) {
            Ok(t) => by_type(p, &t),
            // A dangling link of our own: replaced.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Output::Replace(p.to_path_buf())),
            Err(e) => Err(refuse(p, e)),
        };
    }
    by_type(p, &m)
}

fn by_type(p: &Path, m: &fs::Metadata) -> Result<Output, Refusal> {
    let t = m.file_type();
    if t.is_file() {
        Ok(Output::Replace(p.to_path_buf()))
    } else if t.is_fifo() || t.is_char_device() {
        Ok(Output::InPlace(p.to_path_buf()))
    } else if t.is_dir() {
        Err(refuse(p, "it is a directory"))
    } else if t.is_block_device() {
        Err(refuse(
            p,
            "it is a block device (faultscope writes only regular files, FIFOs and character devices)",
        ))
    } else {
        Err(refuse(p, "it is not a regular file, a FIFO or a character device"))
    }
}

/// Refuses, before a run, an output that cannot be written.
pub fn check(p: &Path) -> Result<(), Refusal> {
    plan(p).map(drop)
}

/// Refuses two outputs of one run that name the same file (or both
/// standard output): one would overwrite the other. `outs`: (option, path).
pub fn check_distinct(outs: &[(&str, &Path)]) -> Result<(), Refusal> {
    let id = |p: &Path| -> Option<(u64, u64)> { fs::metadata(p).ok().map(|m| (m.dev(), m.ino())) };
    // A device or FIFO takes what each output writes: /dev/null twice is fine.
    let in_place = |p: &Path| matches!(plan(p), Ok(Output::InPlace(_)));
    for (i, (fa, a)) in outs.iter().enumerate() {
        for (fb, b) in &outs[i + 1..] {
            if in_place(a) && in_place(b) {
                continue;
            }
            let same_file = matches!((id(a), id(b)), (Some(x), Some(y)) if x == y);
            if a == b || same_file {
                return Err(Refusal::new(format!(
                    "{fa} {} and {fb} {} are the same file: give each its own",
                    a.display(),
                    b.display()
                )));
            }
        }
    }
    Ok(())
}

/// Writes `bytes` to `p` as [`plan`] says.
pub fn write(p: &Path, bytes: &[u8]) -> Result<()> {
    match plan(p)? {
        Output::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes).and_then(|()| out.flush()).context("writing to standard output")
        }
        Output::InPlace(p) => in_place(&p, bytes),
        Output::Replace(p) => replace(&p, bytes),
    }
}

/// A FIFO without a reader is said at once, not waited for.
fn in_place(p: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    let mut f = match fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(p) {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            anyhow::bail!("writing {}: no process has the FIFO open for reading", p.display())
        }
        Err(e) => return Err(e).with_context(|| format!("writing {}", p.display())),
    };
    // Blocking from here on: a slow reader is waited for.
    // SAFETY: fcntl on our own descriptor.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
    }
    f.write_all(bytes).with_context(|| format!("writing {}", p.display()))
}

/// A new file in `dir` under a name nobody can guess (`name` of 64 random
/// bits), created exclusively with `mode` and never through a link: a
/// directory others can write to cannot have it planted or pre-created.
pub fn create_unguessable(
    dir: &Path,
    name: impl Fn(u64) -> String,
    mode: u32,
) -> Result<(PathBuf, fs::File)> {
    let mut last = None;
    for _ in 0..16 {
        let path = dir.join(name(fastrand::u64(..)));
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e).with_context(|| format!("creating {}", path.display())),
        }
    }
    Err(last.expect("a failed attempt")).with_context(|| format!("no free name in {}", dir.display()))
}

/// A new file beside `p` ([`create_unguessable`]), renamed over `p` once
/// complete.
fn replace(p: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let base = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    let (tmp, mut f) = create_unguessable(dir, |r| format!(".{base}.{r:016x}.tmp"), 0o644)
        .with_context(|| format!("writing {}", p.display()))?;
    let res = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = res.and_then(|()| fs::rename(&tmp, p)) {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", p.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_fifos_are_written_in_place_and_others_refused() {
        assert_eq!(plan(Path::new("-")).unwrap(), Output::Stdout);
        assert_eq!(plan(Path::new("/dev/null")).unwrap(), Output::InPlace("/dev/null".into()));
        write(Path::new("/dev/null"), b"x").unwrap();
        assert!(fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        let d = tempfile::tempdir().unwrap();
        assert!(plan(d.path()).unwrap_err().0.contains("it is a directory"));
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(plan(&fifo).unwrap(), Output::InPlace(fifo.clone()));
        // No reader: said at once, and the FIFO stays a FIFO.
        assert!(format!("{:#}", write(&fifo, b"x").unwrap_err()).contains("no process has the FIFO open"));
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || fs::read(&fifo).unwrap())
        };
        // The reader opens first (a writer without one is refused).
        let mut sent = false;
        for _ in 0..100 {
            if write(&fifo, b"report").is_ok() {
                sent = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(sent);
        assert_eq!(reader.join().unwrap(), b"report");
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(plan(&d.path().join("none/x")).is_err());
    }

    #[test]
    fn regular_files_are_replaced_whole_under_an_unguessable_name() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.json");
        write(&p, b"one").unwrap();
        write(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let left: Vec<_> = fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, [std::ffi::OsString::from("r.json")]);
    }

    #[test]
    fn the_same_file_twice_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        check_distinct(&[("--json", &a), ("--folded", &b)]).unwrap();
        assert!(check_distinct(&[("--json", &a), ("--folded", &a)]).unwrap_err().0.contains("same file"));
        fs::write(&a, "x").unwrap();
        fs::hard_link(&a, &b).unwrap();
        assert!(check_distinct(&[("--json", &a), ("--folded", &b)]).is_err());
        assert!(check_distinct(&[("--json", Path::new("-")), ("--folded", Path::new("-"))]).is_err());
        // Two outputs to /dev/null are fine.
        check_distinct(&[("--json", Path::new("/dev/null")), ("--folded", Path::new("/dev/null"))]).unwrap();
    }
}
