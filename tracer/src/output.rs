//! Output files (reports, folded stacks, SVG and PNG pictures): written
//! whole or not at all, by descriptor rather than by name, never through a
//! path another user controls, and never over something that is not a
//! regular file.
//!
//! - `-` is standard output; `/dev/stdout`, `/dev/stderr`, `/dev/fd/N` and
//!   `/proc/self/fd/N` are this process's own descriptor N, written in
//!   place (whatever it is: a terminal, a pipe, a file a shell opened).
//! - A FIFO or a character device is opened without following a link and
//!   written in place; the descriptor is checked (`fstat`) to be what was
//!   planned. A FIFO owned by another user is refused (it would take the
//!   report and could hold the run), and a reader that takes nothing for
//!   [`STALL`] ends the write with an error.
//! - A regular file, or a name that does not exist yet, gets a new file in
//!   the same directory (opened once, every step relative to it) that is
//!   swapped in atomically when complete; if what it swapped out is not a
//!   regular file (someone put a link or a FIFO there meanwhile), it is
//!   swapped back and the report is left in the new file, whose name the
//!   error gives.
//! - A symbolic link of root's or this user's is followed to what it names
//!   (so `latest.json -> runs/run1.json` rewrites `runs/run1.json`, and the
//!   link stays); one owned by another user is refused, as is a parent
//!   directory reached through such a link.
//! - Anything else (a directory, a block device, a socket) is refused.
//!
//! [`check`] does every check that can fail (the directory writable, its
//! mount not read-only, the name not too long) before a run attaches.
//!
//! A leaf module: every command that writes a file goes through it.

use std::{
    ffi::{CString, OsStr, OsString},
    fs,
    io::Write as _,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Component, Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};

use crate::error::Refusal;

/// The longest a FIFO's or device's reader may take nothing.
pub const STALL: Duration = Duration::from_secs(30);

/// Links followed from one output path, at most (as the kernel's 40).
const MAX_LINKS: usize = 40;

/// How a path is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Stdout,
    /// This process's own open descriptor, written in place.
    Fd(RawFd),
    /// A FIFO or character device, written in place.
    InPlace(PathBuf),
    /// A regular file, or none yet: `name` in `dir`, replaced whole.
    Replace {
        dir: PathBuf,
        name: OsString,
    },
}

/// Root, or the user faultscope runs as: the owners whose links it
/// follows and whose FIFOs it writes.
fn trusted(uid: u32) -> bool {
    // SAFETY: geteuid cannot fail.
    uid == 0 || uid == unsafe { libc::geteuid() }
}

fn refuse(p: &Path, why: impl std::fmt::Display) -> Refusal {
    Refusal::new(format!("cannot write {}: {why}", p.display()))
}

fn cstr(s: &OsStr) -> std::io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
}

fn last_os_error<T>() -> std::io::Result<T> {
    Err(std::io::Error::last_os_error())
}

/// `openat(dir, name, flags)` as an owned descriptor.
fn openat(dir: RawFd, name: &OsStr, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    let c = cstr(name)?;
    // SAFETY: a valid C string; the descriptor returned is ours.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        return last_os_error();
    }
    // SAFETY: just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstatat(dir, name)` without following a link at `name` (empty `name`:
/// the descriptor itself).
fn stat_at(dir: RawFd, name: &OsStr) -> std::io::Result<libc::stat> {
    let c = cstr(name)?;
    let flags = libc::AT_SYMLINK_NOFOLLOW | if name.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
    // SAFETY: `st` is written by the kernel before it is read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatat(dir, c.as_ptr(), &mut st, flags) } != 0 {
        return last_os_error();
    }
    Ok(st)
}

fn fstat(fd: RawFd) -> std::io::Result<libc::stat> {
    stat_at(fd, OsStr::new(""))
}

fn is(st: &libc::stat, fmt: libc::mode_t) -> bool {
    st.st_mode & libc::S_IFMT == fmt
}

/// What `st` is, in words.
fn what(st: &libc::stat) -> &'static str {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        _ => "of an unknown type",
    }
}

/// This process's descriptor that `p` names as a path, without a look at
/// the file system: `/dev/std{in,out,err}`, `/dev/fd/N`,
/// `/proc/self/fd/N`, `/proc/thread-self/fd/N`.
fn own_fd(p: &Path) -> Option<RawFd> {
    let s = p.to_str()?;
    match s {
        "/dev/stdin" => return Some(0),
        "/dev/stdout" => return Some(1),
        "/dev/stderr" => return Some(2),
        _ => {}
    }
    let n =
        ["/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/"].iter().find_map(|pre| s.strip_prefix(pre))?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.len() > 9 {
        return None;
    }
    n.parse().ok()
}

/// Whether `p` is written to standard output (`-`, `/dev/stdout`, fd 1):
/// what else a command prints then goes to standard error.
pub fn is_stdout(p: &Path) -> bool {
    p.as_os_str() == "-" || own_fd(p) == Some(1)
}

/// `p`'s directory and last component; `.`, `..` or none is a directory.
fn split(p: &Path) -> Result<(PathBuf, OsString), Refusal> {
    match p.components().next_back() {
        Some(Component::Normal(name)) => {
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
                _ => PathBuf::from("."),
            };
            Ok((dir, name.to_os_string()))
        }
        _ => Err(refuse(p, "it names a directory")),
    }
}

/// Opens `p`'s directory (`O_PATH`), refusing one reached through a link
/// that another user owns.
fn open_dir(p: &Path, dir: &Path) -> Result<OwnedFd, Refusal> {
    if let Ok(m) = fs::symlink_metadata(dir) {
        use std::os::unix::fs::MetadataExt as _;
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
    openat(libc::AT_FDCWD, dir.as_os_str(), libc::O_PATH | libc::O_DIRECTORY, 0).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOTDIR) {
            refuse(p, format!("{} is not a directory", dir.display()))
        } else {
            refuse(p, format!("{}: {e}", dir.display()))
        }
    })
}

/// A new file in the directory `dir` under a name nobody can guess (64
/// random bits), created exclusively, never through a link: a directory
/// others can write to cannot have it planted or pre-created. Short, so
/// that any name the file system takes has room for it.
fn create_temp(dir: RawFd) -> std::io::Result<(OsString, fs::File)> {
    let mut last = None;
    for _ in 0..16 {
        let name = OsString::from(format!(".faultscope-{:016x}.tmp", fastrand::u64(..)));
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        match openat(dir, &name, flags, 0o644) {
            Ok(fd) => return Ok((name, fs::File::from(fd))),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("a failed attempt"))
}

fn unlink_at(dir: RawFd, name: &OsStr) {
    if let Ok(c) = cstr(name) {
        // SAFETY: a valid C string.
        unsafe { libc::unlinkat(dir, c.as_ptr(), 0) };
    }
}

/// How `p` would be written, or why it cannot be: decided before a run, so
/// that nothing is attached for a report that cannot be written. A file
/// to replace has its directory tried (a file created there and removed).
pub fn plan(p: &Path) -> Result<Output, Refusal> {
    plan_at(p, p, 0)
}

fn plan_at(asked: &Path, p: &Path, links: usize) -> Result<Output, Refusal> {
    if p.as_os_str() == "-" {
        return Ok(Output::Stdout);
    }
    if let Some(fd) = own_fd(p) {
        // SAFETY: F_GETFL only reads the descriptor's flags.
        let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if fl < 0 {
            return Err(refuse(asked, format!("this process has no descriptor {fd}")));
        }
        if fl & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(refuse(asked, format!("descriptor {fd} is open for reading only")));
        }
        return Ok(Output::Fd(fd));
    }
    let (dir, name) = split(p)?;
    let dfd = open_dir(asked, &dir)?;
    let st = match stat_at(dfd.as_raw_fd(), &name) {
        Ok(st) => st,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return replaceable(asked, dfd, dir, name),
        Err(e) => return Err(refuse(asked, e)),
    };
    if is(&st, libc::S_IFLNK) {
        if !trusted(st.st_uid) {
            return Err(refuse(
                asked,
                format!("{} is a symbolic link owned by uid {}: not followed", p.display(), st.st_uid),
            ));
        }
        if links >= MAX_LINKS {
            return Err(refuse(asked, "too many levels of symbolic links"));
        }
        let target = read_link_at(dfd.as_raw_fd(), &name).map_err(|e| refuse(asked, e))?;
        return plan_at(asked, &dir.join(target), links + 1);
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => replaceable(asked, dfd, dir, name),
        libc::S_IFIFO if !trusted(st.st_uid) => Err(refuse(
            asked,
            format!("it is a FIFO owned by uid {}: another user's FIFO would take the report", st.st_uid),
        )),
        libc::S_IFIFO | libc::S_IFCHR => Ok(Output::InPlace(dir.join(name))),
        libc::S_IFBLK => Err(refuse(
            asked,
            "it is a block device (faultscope writes only regular files, FIFOs and character devices)",
        )),
        _ => Err(refuse(
            asked,
            format!("it is {}, not a regular file, a FIFO or a character device", what(&st)),
        )),
    }
}

fn read_link_at(dir: RawFd, name: &OsStr) -> std::io::Result<PathBuf> {
    let c = cstr(name)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: the kernel writes at most buf.len() bytes.
    let n = unsafe { libc::readlinkat(dir, c.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if n < 0 {
        return last_os_error();
    }
    buf.truncate(n as usize);
    use std::os::unix::ffi::OsStringExt as _;
    Ok(PathBuf::from(OsString::from_vec(buf)))
}

/// A regular file (or none yet) in `dir`: tried by making a file there.
fn replaceable(asked: &Path, dfd: OwnedFd, dir: PathBuf, name: OsString) -> Result<Output, Refusal> {
    // The directory itself must be one to write in: not read-only, ours
    // to create in, with room for the name (a too-long name fails here).
    match openat(dfd.as_raw_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0) {
        Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => return Err(refuse(asked, e)),
        _ => {}
    }
    // O_PATH cannot create: the directory opened for real.
    let d = openat(dfd.as_raw_fd(), OsStr::new("."), libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .map_err(|e| refuse(asked, format!("{}: {e}", dir.display())))?;
    let (tmp, _f) =
        create_temp(d.as_raw_fd()).map_err(|e| refuse(asked, format!("{}: {e}", dir.display())))?;
    unlink_at(d.as_raw_fd(), &tmp);
    Ok(Output::Replace { dir, name })
}

/// Refuses, before a run, an output that cannot be written.
pub fn check(p: &Path) -> Result<(), Refusal> {
    plan(p).map(drop)
}

/// What an output is, to tell two of them apart: the (device, inode) of
/// what is written in place, or of the directory and the name of a file
/// replaced (which need not exist yet).
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    /// A FIFO or a device: any number of outputs may share it.
    Shared,
    Node(u64, u64),
    Entry(u64, u64, OsString),
}

fn identity(o: &Output) -> Option<Identity> {
    let node = |st: libc::stat| {
        if is(&st, libc::S_IFIFO) || is(&st, libc::S_IFCHR) {
            Identity::Shared
        } else {
            Identity::Node(st.st_dev, st.st_ino)
        }
    };
    match o {
        Output::Stdout => fstat(1).ok().map(node),
        Output::Fd(fd) => fstat(*fd).ok().map(node),
        Output::InPlace(p) => fs::metadata(p).ok().map(|_| Identity::Shared),
        Output::Replace { dir, name } => {
            let d = openat(libc::AT_FDCWD, dir.as_os_str(), libc::O_PATH | libc::O_DIRECTORY, 0).ok()?;
            let st = fstat(d.as_raw_fd()).ok()?;
            Some(Identity::Entry(st.st_dev, st.st_ino, name.clone()))
        }
    }
}

/// Refuses two outputs of one run that name the same file, however spelled
/// (`./of/x.json` and `of/x.json`, a link and its target, a hard link, `-`
/// and `/dev/stdout` into one file): one would overwrite the other.
/// `outs`: (option, path).
pub fn check_distinct(outs: &[(&str, &Path)]) -> Result<(), Refusal> {
    let planned: Vec<(&str, &Path, Output)> =
        outs.iter().map(|(f, p)| plan(p).map(|o| (*f, *p, o))).collect::<Result<_, _>>()?;
    let ids: Vec<Option<Identity>> = planned.iter().map(|(_, _, o)| identity(o)).collect();
    let node_of = |o: &Output| -> Option<(u64, u64)> {
        let Output::Replace { dir, name } = o else { return None };
        fs::metadata(dir.join(name)).ok().map(|m| {
            use std::os::unix::fs::MetadataExt as _;
            (m.dev(), m.ino())
        })
    };
    for i in 0..planned.len() {
        for j in i + 1..planned.len() {
            let (fa, a, oa) = &planned[i];
            let (fb, b, ob) = &planned[j];
            let same = match (&ids[i], &ids[j]) {
                (Some(Identity::Shared), Some(Identity::Shared)) => false,
                (Some(x), Some(y)) if x == y => true,
                _ => false,
            } || matches!((node_of(oa), node_of(ob)), (Some(x), Some(y)) if x == y)
                || (*oa == Output::Stdout && *ob == Output::Stdout);
            if same {
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

/// Writes `bytes` to `p` as [`plan`] says, planned again now.
pub fn write(p: &Path, bytes: &[u8]) -> Result<()> {
    match plan(p)? {
        Output::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes).and_then(|()| out.flush()).context("writing to standard output")
        }
        Output::Fd(fd) => {
            std::io::stdout().flush().ok();
            // SAFETY: dup of a descriptor checked open; the copy is ours.
            let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if d < 0 {
                return Err(std::io::Error::last_os_error())
                    .with_context(|| format!("writing {}", p.display()));
            }
            // SAFETY: just duplicated, owned here.
            let mut f = unsafe { fs::File::from_raw_fd(d) };
            f.write_all(bytes).with_context(|| format!("writing {}", p.display()))
        }
        Output::InPlace(q) => in_place(p, &q, bytes).with_context(|| format!("writing {}", p.display())),
        Output::Replace { dir, name } => replace(p, &dir, &name, bytes),
    }
}

/// Opens the FIFO or device `q` without following a link, checks that the
/// descriptor is one (of a trusted owner, for a FIFO), and writes without
/// waiting forever: a FIFO without a reader is said at once.
fn in_place(p: &Path, q: &Path, bytes: &[u8]) -> Result<()> {
    let flags = libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY;
    let fd = match openat(libc::AT_FDCWD, q.as_os_str(), flags, 0) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => bail!("no process has the FIFO open for reading"),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            bail!("{} became a symbolic link after it was checked: not followed", q.display())
        }
        Err(e) => return Err(e.into()),
    };
    let st = fstat(fd.as_raw_fd())?;
    let ok = is(&st, libc::S_IFCHR) || (is(&st, libc::S_IFIFO) && trusted(st.st_uid));
    if !ok {
        bail!(
            "{} changed after it was checked: it is now {} of uid {}; nothing written",
            p.display(),
            what(&st),
            st.st_uid
        );
    }
    write_all_polled(fd.as_raw_fd(), bytes)
}

/// Writes all of `bytes` to a non-blocking descriptor, waiting at most
/// [`STALL`] for the reader each time it takes nothing.
fn write_all_polled(fd: RawFd, mut bytes: &[u8]) -> Result<()> {
    while !bytes.is_empty() {
        // SAFETY: writes from a live slice.
        let n = unsafe { libc::write(fd, bytes.as_ptr() as *const libc::c_void, bytes.len()) };
        if n >= 0 {
            bytes = &bytes[n as usize..];
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => {
                let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                // SAFETY: one pollfd.
                let r = unsafe { libc::poll(&mut pfd, 1, STALL.as_millis() as i32) };
                if r == 0 {
                    bail!(
                        "the reader took nothing for {} s ({} bytes not written)",
                        STALL.as_secs(),
                        bytes.len()
                    );
                }
            }
            _ => return Err(e.into()),
        }
    }
    Ok(())
}

/// `renameat2(from, to, flags)` within `dir`.
fn rename_at(dir: RawFd, from: &OsStr, to: &OsStr, flags: u32) -> std::io::Result<()> {
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: valid C strings; renameat2 is a plain system call.
    let r = unsafe { libc::syscall(libc::SYS_renameat2, dir, f.as_ptr(), dir, t.as_ptr(), flags) };
    if r != 0 {
        return last_os_error();
    }
    Ok(())
}

/// A new file in `dir`, swapped in for `name` once complete. The swap is
/// atomic (`RENAME_EXCHANGE`), and what it took out is looked at: anything
/// but a regular file is swapped back, so a link or FIFO put there while
/// faultscope ran is never replaced; the report then stays in the new file.
fn replace(p: &Path, dir: &Path, name: &OsStr, bytes: &[u8]) -> Result<()> {
    let ctx = || format!("writing {}", p.display());
    let d =
        openat(libc::AT_FDCWD, dir.as_os_str(), libc::O_RDONLY | libc::O_DIRECTORY, 0).with_context(ctx)?;
    let d = d.as_raw_fd();
    let (tmp, mut f) = create_temp(d).with_context(ctx)?;
    if let Err(e) = f.write_all(bytes).and_then(|()| f.sync_all()) {
        unlink_at(d, &tmp);
        return Err(e).with_context(ctx);
    }
    let kept = || dir.join(&tmp).display().to_string();
    match rename_at(d, &tmp, name, libc::RENAME_NOREPLACE) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        // A file system without renameat2's flags: a plain rename, after
        // a last look.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            match stat_at(d, name) {
                Ok(st) if !is(&st, libc::S_IFREG) => {
                    bail!(
                        "{} became {} while faultscope ran: not replaced; the report is in {}",
                        p.display(),
                        what(&st),
                        kept()
                    )
                }
                _ => {}
            }
            return fs::rename(dir.join(&tmp), dir.join(name)).with_context(ctx);
        }
        Err(e) => {
            unlink_at(d, &tmp);
            return Err(e).with_context(ctx);
        }
    }
    rename_at(d, &tmp, name, libc::RENAME_EXCHANGE)
        .with_context(|| format!("{}; the report is in {}", ctx(), kept()))?;
    // `tmp` now names what was at `name`.
    match stat_at(d, &tmp) {
        Ok(st) if is(&st, libc::S_IFREG) => {
            unlink_at(d, &tmp);
            Ok(())
        }
        Ok(st) => {
            let back = rename_at(d, &tmp, name, libc::RENAME_EXCHANGE);
            bail!(
                "{} became {} while faultscope ran: not replaced{}; the report is in {}",
                p.display(),
                what(&st),
                if back.is_ok() { "" } else { " (and could not be put back)" },
                kept()
            )
        }
        Err(e) => Err(e).with_context(ctx),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt as _;

    fn mkfifo(p: &Path) {
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    #[test]
    fn devices_and_fifos_are_written_in_place_and_others_refused() {
        assert_eq!(plan(Path::new("-")).unwrap(), Output::Stdout);
        assert_eq!(plan(Path::new("/dev/null")).unwrap(), Output::InPlace("/dev/null".into()));
        write(Path::new("/dev/null"), b"x").unwrap();
        assert!(fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        let d = tempfile::tempdir().unwrap();
        assert!(plan(d.path()).unwrap_err().0.contains("a directory"));
        let fifo = d.path().join("fifo");
        mkfifo(&fifo);
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
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(sent);
        assert_eq!(reader.join().unwrap(), b"report");
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        assert!(plan(&d.path().join("none/x")).is_err());
    }

    #[test]
    fn regular_files_are_replaced_whole_and_nothing_is_left_beside() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.json");
        write(&p, b"one").unwrap();
        write(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let left: Vec<_> = fs::read_dir(d.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, [OsString::from("r.json")]);
        // A name as long as the file system takes has room for the new file.
        let long = d.path().join("x".repeat(255));
        write(&long, b"long").unwrap();
        assert_eq!(fs::read(&long).unwrap(), b"long");
        assert!(plan(&d.path().join("x".repeat(256))).unwrap_err().0.contains("too long"));
    }

    #[test]
    fn a_link_of_ours_is_followed_and_stays_a_link() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir(d.path().join("runs")).unwrap();
        let link = d.path().join("latest.json");
        std::os::unix::fs::symlink("runs/run1.json", &link).unwrap();
        // Dangling: the target is created.
        write(&link, b"one").unwrap();
        write(&link, b"two").unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(fs::read(d.path().join("runs/run1.json")).unwrap(), b"two");
    }

    #[test]
    fn own_descriptors_are_written_in_place_never_replaced() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("out");
        let f = fs::File::create(&out).unwrap();
        let fd = f.as_raw_fd();
        // What a shell's `> out` makes of /dev/stdout: a link (ours) to a
        // descriptor of a regular file.
        let link = d.path().join("stdout");
        std::os::unix::fs::symlink(format!("/proc/self/fd/{fd}"), &link).unwrap();
        assert_eq!(plan(&link).unwrap(), Output::Fd(fd));
        write(&link, b"report").unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(fs::read(&out).unwrap(), b"report");
        write(Path::new(&format!("/dev/fd/{fd}")), b"+").unwrap();
        assert_eq!(fs::read(&out).unwrap(), b"report+");
        assert!(plan(Path::new("/proc/self/fd/999999")).unwrap_err().0.contains("no descriptor"));
        drop(f);
    }

    #[test]
    fn another_users_link_and_fifo_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("l");
        std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
        let fifo = d.path().join("f");
        mkfifo(&fifo);
        let chown = |p: &Path| {
            let c = CString::new(p.as_os_str().as_bytes()).unwrap();
            unsafe { libc::lchown(c.as_ptr(), 65534, 65534) == 0 }
        };
        if !(chown(&link) && chown(&fifo)) {
            return; // not root: no other user's files to make
        }
        assert!(plan(&link).unwrap_err().0.contains("owned by uid 65534"));
        assert!(plan(&fifo).unwrap_err().0.contains("FIFO owned by uid 65534"));
    }

    #[test]
    fn a_link_swapped_in_while_running_is_put_back_and_the_report_kept() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.json");
        fs::write(&p, "old").unwrap();
        let (dir, name) = match plan(&p).unwrap() {
            Output::Replace { dir, name } => (dir, name),
            o => panic!("{o:?}"),
        };
        // After the plan, the name becomes a link to a file to protect.
        let secret = d.path().join("secret");
        fs::write(&secret, "keep").unwrap();
        fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink(&secret, &p).unwrap();
        let e = format!("{:#}", replace(&p, &dir, &name, b"report").unwrap_err());
        assert!(e.contains("became a symbolic link") && e.contains("the report is in"), "{e}");
        assert!(fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
        assert_eq!(fs::read(&secret).unwrap(), b"keep");
        let kept: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".faultscope-"))
            .collect();
        assert_eq!(kept.len(), 1);
        assert_eq!(fs::read(kept[0].path()).unwrap(), b"report");
    }

    #[test]
    fn the_same_file_twice_is_refused_however_spelled() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        check_distinct(&[("--json", &a), ("--folded", &b)]).unwrap();
        assert!(check_distinct(&[("--json", &a), ("--folded", &a)]).unwrap_err().0.contains("same file"));
        let dotted = d.path().join(".").join("a");
        assert!(check_distinct(&[("--json", &a), ("--folded", &dotted)]).is_err());
        fs::write(&a, "x").unwrap();
        fs::hard_link(&a, &b).unwrap();
        assert!(check_distinct(&[("--json", &a), ("--folded", &b)]).is_err());
        assert!(check_distinct(&[("--json", Path::new("-")), ("--folded", Path::new("-"))]).is_err());
        // Two outputs to /dev/null are fine.
        check_distinct(&[("--json", Path::new("/dev/null")), ("--folded", Path::new("/dev/null"))]).unwrap();
    }
}
