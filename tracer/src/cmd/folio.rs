//! Folio sizes for `bench`: the THP/mTHP sysfs knobs (set for the run,
//! restored after), and the check that memory really is backed by folios of
//! the size asked for (pagemap + kpageflags), mapped by PTEs or by a PMD.

use std::{
    fs,
    io::{Read as _, Seek as _, SeekFrom},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::{
    error::Refusal,
    units::{PAGE, PMD_SIZE},
};

pub const THP: &str = "/sys/kernel/mm/transparent_hugepage";

/// Parses a folio size: 4K, 16K ... 2M.
pub fn parse_folio(s: &str) -> Result<u64, String> {
    let v = crate::units::parse_size(s)?;
    if v < PAGE || !v.is_power_of_two() || v > PMD_SIZE {
        return Err(format!("--folio takes a power of two from 4K to 2M, not {s}"));
    }
    Ok(v)
}

/// While a bench has the THP settings changed, the values it found are
/// kept here (root-only, cleared at boot), written before the first change.
/// A bench killed before it could restore them (SIGKILL, the OOM killer)
/// leaves the file, and the next faultscope run as root restores them from
/// it; a bench never takes settings it finds changed by another bench for
/// the originals.
pub const STATE_FILE: &str = "/run/faultscope/bench-thp.state";
const STATE_MAGIC: &str = "faultscope-bench-thp 1";

/// Saved sysfs values, written back on drop (also on error paths); the
/// state file is removed once they are.
pub struct Knobs {
    saved: Vec<(PathBuf, String)>,
    state: Option<PathBuf>,
}

impl Knobs {
    /// Makes new anonymous memory get folios of `size`: that size's mTHP
    /// knob to `always` and every other size to `never`, and khugepaged
    /// paused, so that it cannot collapse the memory into PMD-mapped THPs
    /// during the run. 4K needs no knob (the region is madvised
    /// NOHUGEPAGE).
    pub fn set_for(size: u64) -> Result<Knobs> {
        Knobs::set_for_in(size, Path::new(STATE_FILE))
    }

    fn set_for_in(size: u64, state: &Path) -> Result<Knobs> {
        let plan = plan_for(size, Path::new(THP))?;
        if plan.is_empty() {
            return Ok(Knobs { saved: Vec::new(), state: None });
        }
        Knobs::apply(&plan, state)
    }

    /// Saves the current values of the knobs of `plan` (in the state file
    /// first, after restoring what a dead bench left), then sets them.
    fn apply(plan: &[(PathBuf, &str)], state: &Path) -> Result<Knobs> {
        if let Some(msg) = recover_stale_in(state)? {
            crate::term::say(&format!("faultscope: {msg}"));
        }
        let mut saved = Vec::new();
        for (f, _) in plan {
            let old = fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            saved.push((f.clone(), selected(&old).to_string()));
        }
        write_state(state, &saved)?;
        let k = Knobs { saved, state: Some(state.to_path_buf()) };
        for (f, v) in plan {
            fs::write(f, v).with_context(|| format!("writing {v} to {}", f.display()))?;
        }
        Ok(k)
    }
}

/// Refuses, before anything is attached, a folio size this kernel cannot
/// give anonymous memory: sizes between 4K and the PMD's need multi-size
/// THP (Linux 6.8 or later, a `hugepages-<size>kB` knob each), 2M needs
/// THP. The knobs themselves are set later ([`Knobs::set_for`]).
pub fn require(size: u64) -> Result<()> {
    plan_for(size, Path::new(THP)).map(drop)
}

/// The knobs to set (file, value) for new anonymous memory to get folios
/// of `size`, under the THP sysfs directory `thp`: that size's mTHP knob to
/// `always` and every other size's to `never`, and khugepaged paused, so
/// that it cannot collapse the memory into PMD-mapped THPs during the run.
/// Before multi-size THP (6.8) there is no per-size knob: 2M is the
/// top-level `enabled` (to `always`, what `hugepages-2048kB` would be), and
/// other sizes are refused. 4K needs no knob (the region is madvised
/// NOHUGEPAGE).
fn plan_for(size: u64, thp: &Path) -> Result<Vec<(PathBuf, &'static str)>> {
    if size == PAGE {
        return Ok(Vec::new());
    }
    let rd =
        fs::read_dir(thp).map_err(|e| Refusal::new(format!("{}: {e}: no THP support", thp.display())))?;
    let mut dirs: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    dirs.sort();
    let sizes: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| d.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("hugepages-")))
        .filter(|d| d.join("enabled").exists())
        .collect();
    let want = thp.join(format!("hugepages-{}kB", size >> 10));
    let what = crate::units::size(size);
    let mut plan = Vec::new();
    let sleep = thp.join("khugepaged/scan_sleep_millisecs");
    if sleep.exists() {
        plan.push((sleep, "3600000"));
    }
    if sizes.is_empty() && size == PMD_SIZE && thp.join("enabled").exists() {
        plan.push((thp.join("enabled"), "always"));
        return Ok(plan);
    }
    if !want.join("enabled").exists() {
        let why = if sizes.is_empty() && size != PMD_SIZE {
            format!("--folio {what} needs multi-size THP (Linux 6.8 or later): {} is missing", want.display())
        } else {
            format!(
                "this kernel has no {what} anonymous folios ({} is missing)",
                want.join("enabled").display()
            )
        };
        return Err(Refusal::new(why).into());
    }
    for d in sizes {
        plan.push((d.join("enabled"), if *d == want { "always" } else { "never" }));
    }
    Ok(plan)
}

impl Drop for Knobs {
    fn drop(&mut self) {
        let ok = restore(&self.saved).is_ok();
        if let (true, Some(state)) = (ok, &self.state) {
            let _ = fs::remove_file(state);
        }
    }
}

/// Writes the saved values back; all are tried, the first error returned.
fn restore(saved: &[(PathBuf, String)]) -> std::io::Result<()> {
    let mut res = Ok(());
    for (f, v) in saved.iter().rev() {
        if let Err(e) = fs::write(f, v) {
            if res.is_ok() {
                res = Err(std::io::Error::new(e.kind(), format!("{}: {e}", f.display())));
            }
        }
    }
    res
}

/// A process by pid and start time (so that a reused pid is not it).
fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The state file, written whole (a new file renamed into place): the
/// owner (pid, start time), then one `PATH<TAB>VALUE` line per knob.
fn write_state(state: &Path, saved: &[(PathBuf, String)]) -> Result<()> {
    use std::{io::Write as _, os::unix::fs::DirBuilderExt as _};
    let dir = state.parent().unwrap_or(Path::new("/"));
    fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let pid = std::process::id();
    let mut text = format!("{STATE_MAGIC}\nowner {pid} {}\n", start_time(pid).unwrap_or(0));
    for (f, v) in saved {
        text.push_str(&format!("{}\t{v}\n", f.display()));
    }
    let tmp = state.with_extension(format!("{pid}.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(text.as_bytes()).and_then(|()| f.sync_all())?;
    fs::rename(&tmp, state).with_context(|| format!("writing {}", state.display()))?;
    Ok(())
}

/// A state file: its owner and the values it saved.
struct State {
    pid: u32,
    start: u64,
    saved: Vec<(PathBuf, String)>,
}

fn parse_state(text: &str) -> Option<State> {
    let mut lines = text.lines();
    if lines.next()? != STATE_MAGIC {
        return None;
    }
    let owner: Vec<&str> = lines.next()?.strip_prefix("owner ")?.split(' ').collect();
    let (pid, start) = match owner.as_slice() {
        [p, s] => (p.parse().ok()?, s.parse().ok()?),
        _ => return None,
    };
    let saved = lines
        .map(|l| l.split_once('\t').map(|(f, v)| (PathBuf::from(f), v.to_string())))
        .collect::<Option<Vec<_>>>()?;
    // Only THP knobs are ever written back.
    if saved.iter().any(|(f, _)| !f.starts_with(THP) || f.components().any(|c| c.as_os_str() == "..")) {
        return None;
    }
    Some(State { pid, start, saved })
}

/// Restores the THP settings of a bench that died with them changed, from
/// its state file; says what it did. Refuses while that bench still runs.
/// `None` when there is nothing to do.
pub fn recover_stale() -> Option<String> {
    match recover_stale_in(Path::new(STATE_FILE)) {
        Ok(msg) => msg,
        // The bench that changed them is still running.
        Err(e) if e.is::<Refusal>() => None,
        Err(e) => Some(format!("{e:#}")),
    }
}

fn recover_stale_in(state: &Path) -> Result<Option<String>> {
    let text = match fs::read_to_string(state) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", state.display())),
    };
    let Some(st) = parse_state(&text) else {
        let _ = fs::remove_file(state);
        return Ok(Some(format!(
            "removed {}: not a faultscope bench state file; check the THP settings under {THP}",
            state.display()
        )));
    };
    if st.start != 0 && start_time(st.pid) == Some(st.start) {
        return Err(Refusal::new(format!(
            "faultscope bench (pid {}) has the THP settings changed (see {}); wait for it to end",
            st.pid,
            state.display()
        ))
        .into());
    }
    let what: Vec<String> =
        st.saved.iter().map(|(f, v)| format!("{}={v}", f.strip_prefix(THP).unwrap_or(f).display())).collect();
    match restore(&st.saved) {
        Ok(()) => {
            let _ = fs::remove_file(state);
            Ok(Some(format!(
                "restored the THP settings that faultscope bench (pid {}) left changed when it died: {}",
                st.pid,
                what.join(" ")
            )))
        }
        Err(e) => Ok(Some(format!(
            "could not restore the THP settings that faultscope bench (pid {}) left changed ({e}); \
             the originals are in {}: {}",
            st.pid,
            state.display(),
            what.join(" ")
        ))),
    }
}

/// The bracketed choice of a sysfs enum file: "always [madvise] never".
pub fn selected(s: &str) -> &str {
    s.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(['[', ']']))
        .unwrap_or_else(|| s.trim())
}

const KPF_COMPOUND_HEAD: u64 = 1 << 15;
const KPF_COMPOUND_TAIL: u64 = 1 << 16;

/// What backs a range (how many folio-sized blocks are exactly one folio
/// of that size): the report's type.
pub use crate::report::schema::{FolioCheck, Folios};

/// Reads /proc/self/pagemap and /proc/kpageflags (root only) for the range.
pub fn check(base: usize, len: u64, folio: u64) -> Result<FolioCheck> {
    let pages = len / PAGE;
    let mut pagemap = fs::File::open("/proc/self/pagemap").context("opening /proc/self/pagemap")?;
    let mut buf = vec![0u8; (pages * 8) as usize];
    pagemap.seek(SeekFrom::Start(base as u64 / PAGE * 8))?;
    pagemap.read_exact(&mut buf).context("reading /proc/self/pagemap")?;
    let pfns: Vec<u64> = buf
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .map(|e| if e >> 63 & 1 == 1 { e & ((1 << 55) - 1) } else { 0 })
        .collect();
    let mut kflags = fs::File::open("/proc/kpageflags").context("opening /proc/kpageflags")?;
    let flags_of = |pfn: u64, f: &mut fs::File| -> Result<u64> {
        let mut b = [0u8; 8];
        f.seek(SeekFrom::Start(pfn * 8))?;
        f.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    };
    let per = (folio / PAGE) as usize;
    let mut whole = 0;
    for block in pfns.chunks(per) {
        let head = block[0];
        if head == 0 || block.iter().enumerate().any(|(i, &p)| p != head + i as u64) {
            continue;
        }
        let ok = if per == 1 {
            flags_of(head, &mut kflags)? & (KPF_COMPOUND_HEAD | KPF_COMPOUND_TAIL) == 0
        } else {
            // The head starts a folio, every other page is a tail, and the
            // page after the block is not a tail of the same folio.
            let mut ok = flags_of(head, &mut kflags)? & KPF_COMPOUND_HEAD != 0;
            for &p in &block[1..] {
                ok &= flags_of(p, &mut kflags)? & KPF_COMPOUND_TAIL != 0;
            }
            ok && flags_of(head + per as u64, &mut kflags).map(|f| f & KPF_COMPOUND_TAIL == 0).unwrap_or(true)
        };
        whole += ok as u64;
    }
    Ok(FolioCheck {
        blocks: pages / per as u64,
        whole_folios: whole,
        pmd_mapped_bytes: pmd_mapped_bytes(base)?,
        mapped: mapped_folios(&pfns, |p| flags_of(p, &mut kflags))?,
    })
}

/// The folios of the mapped pages `pfns`, by size: a page that is neither
/// head nor tail is a 4K folio; a head's folio runs over the tails that
/// follow it physically (at most a PMD's). A folio whose head is not among
/// `pfns` is not counted.
fn mapped_folios(pfns: &[u64], mut flags_of: impl FnMut(u64) -> Result<u64>) -> Result<Folios> {
    let mut by_order = std::collections::BTreeMap::<u32, u64>::new();
    for &pfn in pfns.iter().filter(|&&p| p != 0) {
        let f = flags_of(pfn)?;
        if f & KPF_COMPOUND_TAIL != 0 {
            continue;
        }
        let mut pages = 1u64;
        if f & KPF_COMPOUND_HEAD != 0 {
            while pages < PMD_SIZE / PAGE && flags_of(pfn + pages).is_ok_and(|t| t & KPF_COMPOUND_TAIL != 0) {
                pages += 1;
            }
        }
        *by_order.entry(pages.ilog2()).or_default() += 1;
    }
    Ok(Folios::from_orders(&by_order))
}

/// The bytes mapped by PMDs in the VMA holding `addr`: anon THPs
/// (`AnonHugePages`) and file or shmem THPs (`FilePmdMapped`,
/// `ShmemPmdMapped`); mTHP and PTE-mapped THPs are not counted there.
fn pmd_mapped_bytes(addr: usize) -> Result<u64> {
    let f = smaps_fields(addr)?;
    Ok(["AnonHugePages", "FilePmdMapped", "ShmemPmdMapped"].iter().filter_map(|k| f.get(*k)).sum())
}

/// The sizes `/proc/self/smaps` gives for the VMA holding `addr`, in
/// bytes, by field name (`Rss`, `Anonymous`, ...); empty if none holds it.
pub fn smaps_fields(addr: usize) -> Result<std::collections::BTreeMap<String, u64>> {
    let smaps = fs::read_to_string("/proc/self/smaps").context("reading /proc/self/smaps")?;
    let mut out = std::collections::BTreeMap::new();
    let mut inside = false;
    for l in smaps.lines() {
        if let Some((range, _)) = l.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                    if inside {
                        break;
                    }
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
        }
        if let (true, Some((k, v))) = (inside, l.split_once(':')) {
            if let Some(kb) = v.trim().strip_suffix("kB").and_then(|n| n.trim().parse::<u64>().ok()) {
                out.insert(k.to_string(), kb * 1024);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Folios counted at their heads, sized by the tails that follow; a
    /// tail whose head is not mapped is left out, unmapped pages too.
    #[test]
    fn mapped_folios_by_head_and_tails() {
        // pfn 10: a 4K folio; 20-23: a 16K folio; 31: a tail of a folio
        // whose head (30) is not mapped; 0: not present.
        let flags = |p: u64| -> Result<u64> {
            Ok(match p {
                20 | 30 => KPF_COMPOUND_HEAD,
                21..=23 | 31 => KPF_COMPOUND_TAIL,
                _ => 0,
            })
        };
        let f = mapped_folios(&[10, 20, 21, 22, 23, 31, 0], flags).unwrap();
        assert_eq!(f.sizes, [("16K".to_string(), 1), ("4K".to_string(), 1)].into());
        assert_eq!(f.bytes, 20 << 10);
    }

    #[test]
    fn folio_sizes() {
        assert_eq!(parse_folio("64K"), Ok(64 << 10));
        assert_eq!(parse_folio("2M"), Ok(2 << 20));
        assert!(parse_folio("48K").is_err());
        assert!(parse_folio("4M").is_err());
    }

    #[test]
    fn state_file_lines() {
        let ok = format!("{STATE_MAGIC}\nowner 12 345\n{THP}/hugepages-64kB/enabled\tnever\n");
        let st = parse_state(&ok).unwrap();
        assert_eq!((st.pid, st.start), (12, 345));
        assert_eq!(st.saved, vec![(PathBuf::from(format!("{THP}/hugepages-64kB/enabled")), "never".into())]);
        // Nothing outside the THP directory is ever written back.
        assert!(parse_state(&format!("{STATE_MAGIC}\nowner 1 2\n/etc/passwd\tx\n")).is_none());
        assert!(parse_state(&format!("{STATE_MAGIC}\nowner 1 2\n{THP}/../../x\tx\n")).is_none());
        assert!(parse_state("garbage\nowner 1 2\n").is_none());
        assert!(start_time(std::process::id()).is_some());
    }

    /// A THP sysfs directory with the given `hugepages-<size>kB` knobs.
    fn thp_dir(sizes: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("enabled"), "always [madvise] never\n").unwrap();
        fs::create_dir(d.path().join("khugepaged")).unwrap();
        fs::write(d.path().join("khugepaged/scan_sleep_millisecs"), "10000\n").unwrap();
        for s in sizes {
            let h = d.path().join(format!("hugepages-{s}kB"));
            fs::create_dir(&h).unwrap();
            fs::write(h.join("enabled"), "always inherit madvise [never]\n").unwrap();
        }
        d
    }

    fn refusal(size: u64, thp: &Path) -> String {
        let e = plan_for(size, thp).unwrap_err();
        assert!(e.is::<Refusal>(), "{e:#}");
        e.to_string()
    }

    #[test]
    fn folio_sizes_a_kernel_has() {
        let names = |plan: Vec<(PathBuf, &str)>, thp: &Path| -> Vec<String> {
            plan.iter().map(|(f, v)| format!("{}={v}", f.strip_prefix(thp).unwrap().display())).collect()
        };
        // Multi-size THP (6.8 on): the size's own knob, every other off.
        let m = thp_dir(&["16", "64", "2048"]);
        assert_eq!(
            names(plan_for(64 << 10, m.path()).unwrap(), m.path()),
            [
                "khugepaged/scan_sleep_millisecs=3600000",
                "hugepages-16kB/enabled=never",
                "hugepages-2048kB/enabled=never",
                "hugepages-64kB/enabled=always"
            ]
        );
        assert_eq!(
            names(plan_for(2 << 20, m.path()).unwrap()[2..3].to_vec(), m.path()),
            ["hugepages-2048kB/enabled=always"]
        );
        assert!(plan_for(PAGE, m.path()).unwrap().is_empty());
        // An mTHP kernel without this size.
        let r = refusal(32 << 10, m.path());
        assert_eq!(
            r,
            format!(
                "this kernel has no 32K anonymous folios ({}/hugepages-32kB/enabled is missing)",
                m.path().display()
            )
        );
        // Before multi-size THP (6.1): 2M is the top-level knob, other
        // sizes are refused with the reason.
        let old = thp_dir(&[]);
        assert_eq!(
            names(plan_for(2 << 20, old.path()).unwrap(), old.path()),
            ["khugepaged/scan_sleep_millisecs=3600000", "enabled=always"]
        );
        assert!(plan_for(PAGE, old.path()).unwrap().is_empty());
        for (size, kb) in [(64 << 10, "64K"), (16 << 10, "16K"), (1 << 20, "1M")] {
            assert_eq!(
                refusal(size, old.path()),
                format!(
                    "--folio {kb} needs multi-size THP (Linux 6.8 or later): {}/hugepages-{}kB is missing",
                    old.path().display(),
                    size >> 10
                )
            );
        }
        // No THP at all.
        let none = old.path().join("absent");
        assert!(refusal(2 << 20, &none).ends_with("no THP support"));
        assert!(plan_for(PAGE, &none).unwrap().is_empty());
    }

    #[test]
    fn sysfs_choice() {
        assert_eq!(selected("always [madvise] never\n"), "madvise");
        assert_eq!(selected("always inherit madvise [never]"), "never");
    }
}
