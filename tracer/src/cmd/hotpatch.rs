//! `bench hotpatch` and `bench hotpatch-mem`: a private executable file
//! mapping backed by file THPs, written as a hot patcher (`mprotect` to
//! writable, then stores) or a debugger (writes through `/proc/self/mem`,
//! the mapping left read-only and executable). Each write is a COW of a
//! private file page: a stock kernel splits the PMD and copies one 4K page;
//! the exec THP COW series copies the whole THP into an anonymous one, but
//! only where the mapping is not writable (`is_exec_mapping`) and has
//! `MADV_HUGEPAGE`.

use std::{
    fs,
    io::Write,
    os::{
        fd::AsRawFd,
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::Path,
};

use anyhow::{bail, Context, Result};

use crate::{error::Refusal, report::schema::ExecMapping, units::PMD_SIZE};

/// The file's bytes: x86 `ret` and padding, as text would hold.
const FILL: u8 = 0xc3;

/// Creates a file of `len` bytes in `dir`, maps it private, read-only and
/// executable at a 2M-aligned address with `MADV_HUGEPAGE`, and removes its
/// name (the mapping keeps it). The page cache is dropped first where the
/// file system can, so that the first reads allocate it in PMD-sized
/// folios (readahead of a `VM_HUGEPAGE` mapping); tmpfs keeps the huge
/// pages its writes allocated (`huge=always`).
pub fn map_exec_file(dir: &Path, len: usize) -> Result<(*mut u8, String)> {
    let meta = fs::symlink_metadata(dir).with_context(|| format!("--file-dir {}", dir.display()))?;
    if !meta.is_dir() {
        return Err(Refusal::new(format!(
            "--file-dir {}: not a directory; give one on tmpfs mounted huge=always, or a file system with large folios (ext4, xfs)",
            crate::term::safe(&dir.display().to_string())
        ))
        .into());
    }
    let path = dir.join(format!("faultscope-hotpatch.{}", std::process::id()));
    let mut w = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let made = w.metadata()?;
    let file = (|| -> Result<fs::File> {
        let chunk = vec![FILL; PMD_SIZE as usize];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            w.write_all(&chunk[..n])?;
            left -= n;
        }
        w.sync_all()?;
        drop(w);
        let r =
            fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path)?;
        let m = r.metadata()?;
        if !m.is_file() || m.ino() != made.ino() || m.dev() != made.dev() {
            bail!("{} was replaced while it was written", path.display());
        }
        Ok(r)
    })();
    // The name goes whatever happened: the mapping holds the file.
    let _ = fs::remove_file(&path);
    let file = file?;
    // SAFETY: advice on our own descriptor.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, len as i64, libc::POSIX_FADV_DONTNEED) };
    let fs_name = file_system(&file);
    let align = PMD_SIZE as usize;
    // SAFETY: a reservation, checked; the file is mapped over its aligned
    // part with MAP_FIXED, inside it.
    unsafe {
        let raw = libc::mmap(
            std::ptr::null_mut(),
            len + align,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if raw == libc::MAP_FAILED {
            bail!("mmap of {} bytes: {}", len + align, std::io::Error::last_os_error());
        }
        let base = ((raw as usize + align - 1) & !(align - 1)) as *mut libc::c_void;
        let p = libc::mmap(
            base,
            len,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            file.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            bail!("mmap of the file, executable: {}", std::io::Error::last_os_error());
        }
        if libc::madvise(base, len, libc::MADV_HUGEPAGE) != 0 {
            bail!("madvise(MADV_HUGEPAGE): {}", std::io::Error::last_os_error());
        }
        Ok((base.cast(), fs_name))
    }
}

/// The name of the file system holding `f`, by its magic number.
fn file_system(f: &fs::File) -> String {
    // SAFETY: a zeroed plain struct the call fills.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: our own descriptor and buffer.
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut st) } != 0 {
        return "unknown".into();
    }
    match st.f_type as i64 {
        0x0102_1994 => "tmpfs".into(),
        0xef53 => "ext2/3/4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683e => "btrfs".into(),
        0xe0f5_e1e2 => "erofs".into(),
        m => format!("{m:#x}"),
    }
}

/// How the patch is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poke {
    /// `mprotect(PROT_READ | PROT_WRITE | PROT_EXEC)`, then stores.
    Mprotect,
    /// `pwrite` to `/proc/self/mem` (`FOLL_FORCE`): the mapping stays
    /// read-only.
    ProcMem,
}

impl Poke {
    pub fn name(self) -> &'static str {
        match self {
            Poke::Mprotect => "mprotect",
            Poke::ProcMem => "proc-mem",
        }
    }
}

/// Writes one byte (`0xcc`, int3) at each of `addrs` inside the mapping at
/// `base..base + len`. A write the kernel refuses (`/proc/self/mem`
/// answers EIO where its `get_user_pages` cannot fault the page in
/// writable) is a result, not a failure of the bench: the writes refused
/// and the first error come back, and the rest are still made.
pub fn poke(how: Poke, base: *mut u8, len: usize, addrs: &[usize]) -> Result<Refused> {
    let mut refused = Refused::default();
    match how {
        Poke::Mprotect => {
            let prot = libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC;
            // SAFETY: our own mapping.
            if unsafe { libc::mprotect(base.cast(), len, prot) } != 0 {
                bail!("mprotect: {}", std::io::Error::last_os_error());
            }
            for &a in addrs {
                // SAFETY: inside the mapping, now writable.
                unsafe { std::ptr::write_volatile(a as *mut u8, 0xcc) };
            }
        }
        Poke::ProcMem => {
            let mem = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open("/proc/self/mem")
                .context("opening /proc/self/mem")?;
            for &a in addrs {
                if let Err(e) = std::os::unix::fs::FileExt::write_at(&mem, &[0xcc], a as u64) {
                    refused.writes += 1;
                    let why = if e.raw_os_error() == Some(libc::EIO) {
                        " (where the kernel has PROC_MEM_FORCE_PTRACE or proc_mem.force_override=ptrace|never, only a ptracer may write read-only memory there)"
                    } else {
                        ""
                    };
                    refused
                        .first
                        .get_or_insert_with(|| format!("writing /proc/self/mem at {a:#x}: {e}{why}"));
                }
            }
        }
    }
    Ok(refused)
}

/// The writes the kernel refused, and the first one's error.
#[derive(Debug, Default)]
pub struct Refused {
    pub writes: u64,
    pub first: Option<String>,
}

/// The mapping's memory as `/proc/self/smaps` counts it: what the fourth
/// seed's "Exec mmap Rss" measures, and the copies' anonymous bytes, made
/// another way than the tracer's count.
pub fn exec_mapping(addr: usize) -> Result<ExecMapping> {
    let f = super::folio::smaps_fields(addr)?;
    let get = |k: &str| f.get(k).copied().unwrap_or(0);
    Ok(ExecMapping {
        rss: get("Rss"),
        anonymous: get("Anonymous"),
        anon_huge: get("AnonHugePages"),
        file_pmd_mapped: get("FilePmdMapped") + get("ShmemPmdMapped"),
    })
}
