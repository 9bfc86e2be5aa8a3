//! Targets chosen by name or cgroup, for record and serve alike:
//! `--comm NAME`, matched by the kernel at each exec (a program exec'd
//! under that comm joins the traced set there, so one that lives less than
//! a tick is counted from its exec), and by a scan of `/proc` at start and
//! each second for those already running (a child of a traced process, such
//! as Redis' BGSAVE child, is not: it is the parent's phase); `--cgroup
//! PATH`, filtered in the kernel by cgroup id (the cgroup v2 directory's
//! inode number): a process of that cgroup joins the traced set at its
//! first fault, fork or exec, so that one that faults and exits within a
//! tick is counted too; the processes already in the cgroup's
//! `cgroup.procs` are added at start (and each second, for one that has
//! not had an event yet). A cgroup directory removed and created again (a
//! service restart) is a new id: it is noticed at the next tick.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use clap::Args;
use faultscope_common::maps::ADOPT_BY_COMM;

use super::{
    engine::{Filters, Recorder},
    target,
};
use crate::{
    error::Refusal,
    term::{safe, say},
};

#[derive(Args, Clone, Debug, Default)]
pub struct SelectOpts {
    /// Trace every process on the host (as `perf stat -a`), from the
    /// attach: one table of the processes that faulted most (--sort,
    /// --top), the others summed; no fork or exec phases (marks only), no
    /// per-mapping counts, sites or stacks.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Trace every process with this comm (at most 15 bytes, as the kernel
    /// keeps it): those running, and each program exec'd under it, from
    /// its exec (repeatable).
    #[arg(long)]
    pub comm: Vec<String>,
    /// Trace the processes of this cgroup v2 directory (repeatable),
    /// filtered in the kernel by cgroup id: from their first event.
    #[arg(long)]
    pub cgroup: Vec<PathBuf>,
}

impl SelectOpts {
    pub fn is_empty(&self) -> bool {
        !self.all && self.comm.is_empty() && self.cgroup.is_empty()
    }

    /// The kernel's filters for these, or why one can never match.
    pub fn filters(&self) -> Result<Filters> {
        let mut f = Filters { all: self.all, ..Filters::default() };
        for dir in &self.cgroup {
            f.cgroups.push(cgroup_id(dir)?);
        }
        for c in &self.comm {
            f.comms.push(comm_key(c)?);
        }
        Ok(f)
    }
}

/// Which processes a run over every process lists (the report, its
/// intervals), and by what: the first `top` by `sort`, most first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    pub sort: crate::kernel::classes::ReportClass,
    pub top: usize,
}

/// What `-a` lists without `--sort` and `--top`.
pub const DEFAULT_BOUND: Bound = Bound { sort: crate::kernel::classes::ReportClass::Faults, top: 20 };

/// How often running processes are looked for (a `/proc` scan).
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// The selection while a run goes on.
pub struct Selection {
    opts: SelectOpts,
    /// Each `--cgroup` directory's id in the kernel's filter (None while
    /// the directory is gone).
    ids: Vec<Option<u64>>,
    /// Each traced pid's `--cgroup` directory.
    pub cgroup_of: BTreeMap<u32, String>,
    next_scan: Instant,
}

impl Selection {
    /// `filters`: what `opts.filters()` gave the recorder.
    pub fn new(opts: SelectOpts, filters: &Filters) -> Selection {
        Selection {
            ids: filters.cgroups.iter().map(|&id| Some(id)).collect(),
            opts,
            cgroup_of: BTreeMap::new(),
            next_scan: Instant::now(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.opts.is_empty()
    }

    /// The processes the kernel added since the last call (said on
    /// stderr), the cgroups' new ids, and once a second the running
    /// processes not yet traced.
    pub fn tick(&mut self, rec: &mut Recorder) -> Result<()> {
        for (pid, idx) in std::mem::take(&mut rec.adopted) {
            if let Some(dir) = self.opts.cgroup.get(idx as usize).filter(|_| idx != ADOPT_BY_COMM) {
                self.cgroup_of.insert(pid, dir.display().to_string());
            }
            let comm = rec.comms.get(&pid).cloned().unwrap_or_default();
            say(&format!("faultscope: tracing pid {pid} ({})", safe(&comm)));
        }
        // A stat per cgroup: every tick, so that a restart is followed at once.
        self.follow_cgroups(rec)?;
        if self.is_empty() || Instant::now() < self.next_scan {
            return Ok(());
        }
        self.next_scan = Instant::now() + SCAN_EVERY;
        self.discover(rec);
        Ok(())
    }

    pub fn forget(&mut self, pid: u32) {
        self.cgroup_of.remove(&pid);
    }

    /// A `--cgroup` directory removed and created again has a new id: the
    /// kernel's filter follows it (the old id can have no process left).
    fn follow_cgroups(&mut self, rec: &mut Recorder) -> Result<()> {
        for (i, dir) in self.opts.cgroup.iter().enumerate() {
            let now = cgroup_id(dir).ok();
            let was = self.ids[i];
            if now == was {
                continue;
            }
            if let Some(old) = was {
                let _ = rec.session.remove_cgroup(old);
            }
            let d = safe(&dir.display().to_string());
            match now {
                Some(id) => {
                    rec.session.add_cgroup(id, i as u32)?;
                    let what = if was.is_some() { "was created again" } else { "is back" };
                    say(&format!("faultscope: cgroup {d} {what} (id {id}): following it"));
                }
                None => say(&format!("faultscope: cgroup {d} is gone; waiting for it to come back")),
            }
            self.ids[i] = now;
        }
        Ok(())
    }

    /// New processes of `--comm` and `--cgroup`: only a process that can
    /// still fault is adopted (not a thread id, a kernel thread, a zombie
    /// or a process in its exit): a traced process that lingers as a
    /// zombie is not taken again, so the kernel does not count as it the
    /// next process given its pid.
    fn discover(&mut self, rec: &mut Recorder) {
        let mut new: Vec<(u32, Option<String>)> = Vec::new();
        if !self.opts.comm.is_empty() {
            for pid in all_pids() {
                if rec.live.contains(&pid) {
                    continue;
                }
                if target::comm_bytes(pid).is_some_and(|c| comm_matches(&self.opts.comm, &c))
                    && !parent_of(pid).is_some_and(|pp| rec.live.contains(&pp))
                {
                    new.push((pid, None));
                }
            }
        }
        for dir in &self.opts.cgroup {
            let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if !rec.live.contains(&pid) && !new.iter().any(|(p, _)| *p == pid) {
                    new.push((pid, Some(dir.display().to_string())));
                }
            }
        }
        for (pid, cg) in new {
            let Ok(comm) = target::check_pid(pid) else { continue };
            if rec.add(pid, 0, comm.clone()).is_ok() {
                say(&format!("faultscope: tracing pid {pid} ({})", safe(&comm)));
                if let Some(cg) = cg {
                    self.cgroup_of.insert(pid, cg);
                }
            }
        }
    }
}

/// Whether a comm (the kernel's bytes) is one of `--comm`: byte for byte,
/// as the kernel's filter at exec compares it (no trimming: " x " is not
/// "x").
fn comm_matches(wanted: &[String], comm: &[u8]) -> bool {
    wanted.iter().any(|w| w.as_bytes() == comm)
}

/// A cgroup v2 directory's id: its inode number (what
/// `bpf_get_current_cgroup_id` returns for a task in it).
pub fn cgroup_id(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let v2 = fs::metadata(dir.join("cgroup.procs")).is_ok_and(|m| m.is_file()) && is_cgroup2(dir);
    if !v2 {
        return Err(
            Refusal::new(format!("{}: not a cgroup v2 directory", safe(&dir.display().to_string()))).into()
        );
    }
    Ok(fs::metadata(dir).with_context(|| dir.display().to_string())?.ino())
}

/// Whether `dir` lies on a cgroup2 file system (a v1 hierarchy has
/// `cgroup.procs` too, and other ids).
fn is_cgroup2(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs fills `st`; `c` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == CGROUP2_SUPER_MAGIC }
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Read as bytes: the comm in /proc/PID/stat need not be UTF-8.
fn parent_of(pid: u32) -> Option<u32> {
    target::stat_of(pid).map(|s| s.ppid)
}

/// The kernel keeps a comm in 16 bytes, NUL included.
const COMM_LEN: usize = 16;

/// `--comm NAME` as the kernel's filter holds it, or why it can never
/// match.
pub fn comm_key(name: &str) -> Result<[u8; COMM_LEN]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= COMM_LEN || b.contains(&0) {
        return Err(Refusal::new(format!(
            "--comm {}: a comm is 1 to {} bytes without NUL (the kernel cuts longer names to that, so this one could never match)",
            safe(name),
            COMM_LEN - 1
        ))
        .into());
    }
    let mut k = [0u8; COMM_LEN];
    k[..b.len()].copy_from_slice(b);
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_is_matched_byte_for_byte() {
        let wanted = vec!["x".to_string(), " y ".to_string()];
        assert!(comm_matches(&wanted, b"x"));
        assert!(comm_matches(&wanted, b" y "));
        for other in [&b" x  "[..], b"x\t", b"x\n", b"y", b" y", b"", b"x\xff"] {
            assert!(!comm_matches(&wanted, other), "{other:?}");
        }
    }
}
