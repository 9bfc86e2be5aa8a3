//! Folio sizes for `bench`: the THP/mTHP sysfs knobs (set for the run,
//! restored after), and the check that memory really is backed by folios of
//! the size asked for (pagemap + kpageflags), mapped by PTEs or by a PMD.

use std::{
    fs,
    io::{Read as _, Seek as _, SeekFrom},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result};

use crate::error::Refusal;

pub const THP: &str = "/sys/kernel/mm/transparent_hugepage";
pub const PAGE: u64 = 4096;
pub const PMD_SIZE: u64 = 2 << 20;

/// Parses a folio size: 4K, 16K ... 2M.
pub fn parse_folio(s: &str) -> Result<u64, String> {
    let v = super::workload::parse_size(s)?;
    if v < PAGE || !v.is_power_of_two() || v > PMD_SIZE {
        return Err(format!("--folio takes a power of two from 4K to 2M, not {s}"));
    }
    Ok(v)
}

pub fn human(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else {
        format!("{}K", bytes >> 10)
    }
}

/// Saved sysfs values, written back on drop (also on error paths).
pub struct Knobs {
    saved: Vec<(PathBuf, String)>,
}

impl Knobs {
    /// Makes new anonymous memory get folios of `size`: that size's mTHP
    /// knob to `always` and every other size to `never`, and khugepaged
    /// paused, so that it cannot collapse the memory into PMD-mapped THPs
    /// during the run. 4K needs no knob (the region is madvised
    /// NOHUGEPAGE).
    pub fn set_for(size: u64) -> Result<Knobs> {
        let mut k = Knobs { saved: Vec::new() };
        if size == PAGE {
            return Ok(k);
        }
        let sleep = Path::new(THP).join("khugepaged/scan_sleep_millisecs");
        if sleep.exists() {
            k.set(&sleep, "3600000")?;
        }
        let want = Path::new(THP).join(format!("hugepages-{}kB", size >> 10));
        if !want.join("enabled").exists() {
            return Err(Refusal::new(format!(
                "this kernel has no {} anonymous folios ({} is missing)",
                human(size),
                want.join("enabled").display()
            ))
            .into());
        }
        let rd = fs::read_dir(THP).map_err(|e| Refusal::new(format!("{THP}: {e}: no THP support")))?;
        let mut dirs: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        dirs.sort();
        for d in dirs {
            let f = d.join("enabled");
            let is_size = d.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("hugepages-"));
            if is_size && f.exists() {
                k.set(&f, if d == want { "always" } else { "never" })?;
            }
        }
        Ok(k)
    }

    fn set(&mut self, f: &Path, v: &str) -> Result<()> {
        let old = fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let old = selected(&old).to_string();
        fs::write(f, v).with_context(|| format!("writing {v} to {}", f.display()))?;
        self.saved.push((f.to_path_buf(), old));
        Ok(())
    }
}

impl Drop for Knobs {
    fn drop(&mut self) {
        for (f, v) in self.saved.iter().rev() {
            let _ = fs::write(f, v);
        }
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
pub use crate::report::schema::FolioCheck;

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
        pmd_mapped_bytes: anon_huge_bytes(base)?,
    })
}

/// `AnonHugePages` of the VMA holding `addr`: memory mapped by PMDs (mTHP
/// and PTE-mapped THPs are not counted there).
fn anon_huge_bytes(addr: usize) -> Result<u64> {
    let smaps = fs::read_to_string("/proc/self/smaps").context("reading /proc/self/smaps")?;
    let mut inside = false;
    for l in smaps.lines() {
        if let Some((range, _)) = l.split_once(' ') {
            if let Some((a, b)) = range.split_once('-') {
                if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                    inside = a <= addr && addr < b;
                    continue;
                }
            }
        }
        if inside {
            if let Some(v) = l.strip_prefix("AnonHugePages:") {
                let kb: u64 = v.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                return Ok(kb * 1024);
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folio_sizes() {
        assert_eq!(parse_folio("64K"), Ok(64 << 10));
        assert_eq!(parse_folio("2M"), Ok(2 << 20));
        assert!(parse_folio("48K").is_err());
        assert!(parse_folio("4M").is_err());
        assert_eq!(human(64 << 10), "64K");
        assert_eq!(human(2 << 20), "2M");
    }

    #[test]
    fn sysfs_choice() {
        assert_eq!(selected("always [madvise] never\n"), "madvise");
        assert_eq!(selected("always inherit madvise [never]"), "never");
    }
}
