//! Mapping resolution: which mapping of a process a fault happened in.
//!
//! The kernel side counts faults per VMA start address; this module turns
//! such a start back into a name (`[heap]`, a file, `[anon:NAME]`, ...) from
//! `/proc/PID/maps` snapshots, and from the kernel's own descriptions of
//! the VMAs it counted in (`VmaInfo`), which outlive a process that exits
//! between two reads of its maps. Snapshots are kept over time (attach,
//! every phase change, end) because mappings come and go while a process
//! runs, and the process may be gone by the time the report is written.

use std::{collections::BTreeMap, fmt, io};

use anyhow::{anyhow, bail, Context as _, Result};
use faultscope_common::attrib::VmaInfo;

/// Escapes C0 controls, DEL and C1 controls as `\xNN`, so that a name taken
/// from the traced process (a file name may hold `\n` or ESC) cannot break a
/// report line or drive the terminal.
pub fn display_safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let v = c as u32;
        if v < 0x20 || (0x7f..=0x9f).contains(&v) {
            out.push_str(&format!("\\x{v:02x}"));
        } else {
            out.push(c);
        }
    }
    out
}

/// Access bits of a mapping, as the `rwxp`/`rwxs` column shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Perms {
    pub read: bool,
    pub write: bool,
    pub exec: bool,
    /// `s` (MAP_SHARED) rather than `p` (private, copy-on-write).
    pub shared: bool,
}

impl Perms {
    fn parse(s: &str) -> Result<Self> {
        let b = s.as_bytes();
        if b.len() != 4 {
            bail!("permissions {s:?}: expected 4 characters");
        }
        let flag = |i: usize, set: u8| match b[i] {
            c if c == set => Ok(true),
            b'-' => Ok(false),
            _ => Err(anyhow!("permissions {s:?}: unexpected {:?} at {i}", b[i] as char)),
        };
        let shared = match b[3] {
            b's' => true,
            b'p' => false,
            _ => bail!("permissions {s:?}: last character must be p or s"),
        };
        Ok(Perms { read: flag(0, b'r')?, write: flag(1, b'w')?, exec: flag(2, b'x')?, shared })
    }
}

impl fmt::Display for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = |on: bool, ch: char| if on { ch } else { '-' };
        write!(
            f,
            "{}{}{}{}",
            c(self.read, 'r'),
            c(self.write, 'w'),
            c(self.exec, 'x'),
            if self.shared { 's' } else { 'p' }
        )
    }
}

/// What a mapping is, from the last column of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MappingName {
    /// Unnamed anonymous memory; the range is part of the name because it
    /// is all that tells two such mappings apart in a report.
    Anon {
        start: u64,
        end: u64,
    },
    Heap,
    /// The main thread's stack.
    Stack,
    /// A name set with `prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME)`.
    AnonNamed(String),
    /// Named shared anonymous memory (`[anon_shmem:NAME]`).
    AnonShmem(String),
    /// Any other kernel pseudo name, brackets included: `[vdso]`, `[vvar]`,
    /// `[vsyscall]`, `[uprobes]`, ...
    Pseudo(String),
    /// A file mapping. `deleted` is the kernel's ` (deleted)` suffix
    /// (unlinked file, memfd, shared anonymous memory as `/dev/zero`).
    /// Non-UTF-8 bytes in the path were replaced (lossy).
    File {
        path: String,
        deleted: bool,
    },
    /// A file mapping known only from the kernel's VMA (its process was
    /// gone before its maps were read, and no other process's maps had the
    /// file): the file's own name, without its directory.
    FileName(String),
}

impl MappingName {
    fn parse(name: &str, start: u64, end: u64) -> Self {
        if name.is_empty() {
            return MappingName::Anon { start, end };
        }
        if name.starts_with('[') && name.ends_with(']') {
            let inner = &name[1..name.len() - 1];
            if inner == "heap" {
                return MappingName::Heap;
            }
            if inner == "stack" {
                return MappingName::Stack;
            }
            if let Some(n) = inner.strip_prefix("anon:") {
                return MappingName::AnonNamed(n.to_string());
            }
            if let Some(n) = inner.strip_prefix("anon_shmem:") {
                return MappingName::AnonShmem(n.to_string());
            }
            return MappingName::Pseudo(name.to_string());
        }
        match name.strip_suffix(" (deleted)") {
            Some(path) => MappingName::File { path: path.to_string(), deleted: true },
            None => MappingName::File { path: name.to_string(), deleted: false },
        }
    }

    /// The file path of a file mapping (without ` (deleted)`).
    pub fn path(&self) -> Option<&str> {
        match self {
            MappingName::File { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Anonymous memory of any kind (named or not, private or shared).
    pub fn is_anon(&self) -> bool {
        matches!(self, MappingName::Anon { .. } | MappingName::AnonNamed(_) | MappingName::AnonShmem(_))
    }
}

impl fmt::Display for MappingName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MappingName::Anon { start, end } => write!(f, "anon {start:#x}-{end:#x}"),
            MappingName::Heap => f.write_str("[heap]"),
            MappingName::Stack => f.write_str("[stack]"),
            MappingName::AnonNamed(n) => write!(f, "[anon:{}]", display_safe(n)),
            MappingName::AnonShmem(n) => write!(f, "[anon_shmem:{}]", display_safe(n)),
            MappingName::Pseudo(n) => f.write_str(&display_safe(n)),
            MappingName::FileName(n) => write!(f, "…/{}", display_safe(n)),
            MappingName::File { path, deleted } => {
                f.write_str(&display_safe(path))?;
                if *deleted {
                    f.write_str(" (deleted)")?;
                }
                Ok(())
            }
        }
    }
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mapping {
    pub start: u64,
    /// Exclusive.
    pub end: u64,
    pub perms: Perms,
    /// File offset of `start` (page offset for anonymous memory).
    pub offset: u64,
    /// `major:minor` in hex, as the kernel prints it.
    pub dev: String,
    pub inode: u64,
    pub name: MappingName,
}

impl Mapping {
    pub fn size(&self) -> u64 {
        self.end - self.start
    }

    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    /// The offset in the mapped file of `addr` (for code sites: what the
    /// symbolizer needs once the process is gone).
    pub fn file_offset(&self, addr: u64) -> Option<u64> {
        self.contains(addr).then(|| addr - self.start + self.offset)
    }
}

/// `vm_flags` bits (include/linux/mm.h).
const VM_READ: u64 = 0x1;
const VM_WRITE: u64 = 0x2;
const VM_EXEC: u64 = 0x4;
const VM_SHARED: u64 = 0x8;
const VM_GROWSDOWN: u64 = 0x100;

/// A device number as `/proc/PID/maps` prints it, from the kernel's
/// `dev_t` (major in the top 12 bits, minor in the low 20).
pub fn dev_string(dev: u32) -> String {
    format!("{:02x}:{:02x}", dev >> 20, dev & 0xf_ffff)
}

impl Mapping {
    /// The mapping the kernel described at `start` (see `VmaInfo`). `path`:
    /// the file's path where another source had it (a maps line of the
    /// same device and inode); else the file's own name stands.
    pub fn from_vma(start: u64, v: &VmaInfo, path: Option<String>) -> Mapping {
        let name = if v.file == 0 && v.flags & VM_GROWSDOWN != 0 {
            MappingName::Stack
        } else if v.file == 0 {
            MappingName::Anon { start, end: v.end }
        } else if let Some(p) = path {
            MappingName::File { path: p, deleted: false }
        } else {
            let n = v.name.iter().position(|&b| b == 0).unwrap_or(v.name.len());
            MappingName::FileName(String::from_utf8_lossy(&v.name[..n]).into_owned())
        };
        Mapping {
            start,
            end: v.end.max(start + 1),
            perms: Perms {
                read: v.flags & VM_READ != 0,
                write: v.flags & VM_WRITE != 0,
                exec: v.flags & VM_EXEC != 0,
                shared: v.flags & VM_SHARED != 0,
            },
            offset: v.pgoff * page_size(),
            dev: dev_string(v.dev),
            inode: v.ino,
            name,
        }
    }
}

/// The page size (a VMA's `vm_pgoff` is in pages).
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    }
}

fn parse_line(line: &str) -> Result<Mapping> {
    fn field<'a>(rest: &mut &'a str, what: &str) -> Result<&'a str> {
        let s = rest.trim_start_matches(' ');
        let (f, r) = s.split_once(' ').ok_or_else(|| anyhow!("missing {what}"))?;
        *rest = r;
        Ok(f)
    }
    let hex = |s: &str, what: &str| {
        u64::from_str_radix(s, 16).map_err(|_| anyhow!("{what} {s:?} is not a hex number"))
    };
    let mut rest = line;
    let range = field(&mut rest, "address range")?;
    let (start, end) = range.split_once('-').ok_or_else(|| anyhow!("address range {range:?} has no '-'"))?;
    let (start, end) = (hex(start, "start")?, hex(end, "end")?);
    if start >= end {
        bail!("address range {range:?} is empty or reversed");
    }
    let perms = Perms::parse(field(&mut rest, "permissions")?)?;
    let offset = hex(field(&mut rest, "offset")?, "offset")?;
    let dev = field(&mut rest, "device")?;
    match dev.split_once(':') {
        Some((a, b)) if hex(a, "device").is_ok() && hex(b, "device").is_ok() => {}
        _ => bail!("device {dev:?} is not major:minor"),
    }
    // The inode may end the line (no name, no trailing space).
    let tail = rest.trim_start_matches(' ');
    let (inode, name) = tail.split_once(' ').unwrap_or((tail, ""));
    let inode = inode.parse::<u64>().map_err(|_| anyhow!("inode {inode:?} is not a number"))?;
    // Column padding only; a path keeps any spaces of its own.
    let name = name.trim_start_matches(' ');
    Ok(Mapping {
        start,
        end,
        perms,
        offset,
        dev: dev.to_string(),
        inode,
        name: MappingName::parse(name, start, end),
    })
}

/// Parses the text of `/proc/PID/maps`. A bad line is an error naming its
/// (1-based) line number; empty lines are skipped. The result is sorted by
/// start address.
pub fn parse_maps(text: &str) -> Result<Vec<Mapping>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(parse_line(line).with_context(|| format!("maps line {}: {:?}", i + 1, display_safe(line)))?);
    }
    out.sort_by_key(|m| m.start);
    Ok(out)
}

/// Reads and parses `/proc/PID/maps`. A process that has exited (or never
/// existed) is an error, not a panic; non-UTF-8 bytes in paths are replaced.
pub fn snapshot_pid(pid: u32) -> Result<Vec<Mapping>> {
    let path = format!("/proc/{pid}/maps");
    let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => anyhow!("process {pid} is gone ({path}: {e})"),
        // ESRCH: the process exited while the file was read.
        _ if e.raw_os_error() == Some(libc::ESRCH) => anyhow!("process {pid} exited while {path} was read"),
        _ => anyhow!("{path}: {e}"),
    })?;
    parse_maps(&String::from_utf8_lossy(&bytes)).with_context(|| path.clone())
}

/// The label of a snapshot of one VMA the kernel described (see
/// `Mapping::from_vma`).
pub const KERNEL: &str = "kernel";

/// The mappings of a process at one moment.
#[derive(Clone, Debug)]
pub struct MapsSnapshot {
    /// Order of recording within the history (ties in `at` are broken by it).
    pub seq: u64,
    /// When it was taken, on the clock the queries use (CLOCK_MONOTONIC ns,
    /// as bpf_ktime_get_ns, is the natural one).
    pub at: u64,
    /// Why it was taken: "attach", "phase 2", "end", ...
    pub label: String,
    /// Sorted by start.
    pub mappings: Vec<Mapping>,
}

impl MapsSnapshot {
    fn by_start(&self, start: u64) -> Option<&Mapping> {
        self.mappings.binary_search_by_key(&start, |m| m.start).ok().map(|i| &self.mappings[i])
    }

    fn containing(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        i.checked_sub(1).map(|i| &self.mappings[i]).filter(|m| m.contains(addr))
    }
}

/// The answer to "which mapping was this?".
#[derive(Clone, Copy, Debug)]
pub struct Resolved<'a> {
    pub mapping: &'a Mapping,
    pub snapshot: &'a MapsSnapshot,
    /// False when no snapshot had a mapping starting exactly at the address
    /// and one that contains it was taken instead (a stack that grew down,
    /// an mremap, a split by mprotect between the fault and the snapshots).
    pub exact: bool,
}

/// All snapshots of one process's maps, in time order.
#[derive(Clone, Debug, Default)]
pub struct MapsHistory {
    pub pid: u32,
    snapshots: Vec<MapsSnapshot>,
    next_seq: u64,
}

impl MapsHistory {
    pub fn new(pid: u32) -> Self {
        MapsHistory { pid, snapshots: Vec::new(), next_seq: 0 }
    }

    /// Records a snapshot taken at `at`; returns its sequence number.
    pub fn push(&mut self, at: u64, label: impl Into<String>, mut mappings: Vec<Mapping>) -> u64 {
        mappings.sort_by_key(|m| m.start);
        let seq = self.next_seq;
        self.next_seq += 1;
        let snap = MapsSnapshot { seq, at, label: label.into(), mappings };
        let i = self.snapshots.partition_point(|s| (s.at, s.seq) <= (at, seq));
        self.snapshots.insert(i, snap);
        seq
    }

    /// Reads `/proc/PID/maps` now and records it.
    pub fn snapshot(&mut self, at: u64, label: impl Into<String>) -> Result<u64> {
        let maps = snapshot_pid(self.pid)?;
        Ok(self.push(at, label, maps))
    }

    pub fn snapshots(&self) -> &[MapsSnapshot] {
        &self.snapshots
    }

    /// The mappings of the snapshots labelled `label`, to rename in place.
    pub fn mappings_mut<'a>(&'a mut self, label: &'a str) -> impl Iterator<Item = &'a mut Mapping> + 'a {
        self.snapshots.iter_mut().filter(move |s| s.label == label).flat_map(|s| s.mappings.iter_mut())
    }

    /// Snapshots in order of preference for a query at `at`: the latest at
    /// or before it first (going back), then the later ones (going forward).
    fn by_preference(&self, at: u64) -> impl Iterator<Item = &MapsSnapshot> {
        let split = self.snapshots.partition_point(|s| s.at <= at);
        self.snapshots[..split].iter().rev().chain(self.snapshots[split..].iter())
    }

    /// The mapping that started at `vma_start` at time `at`: from the latest
    /// snapshot at or before `at` that has it, else the nearest later one (so
    /// a mapping unmapped mid-run still gets its name and two mappings at the
    /// same start over time resolve by time). Without any exact match, a
    /// mapping that contains `vma_start` is taken, in the same order, with
    /// `exact: false`.
    pub fn resolve(&self, vma_start: u64, at: u64) -> Option<Resolved<'_>> {
        self.by_source(at)
            .find_map(|s| s.by_start(vma_start).map(|m| Resolved { mapping: m, snapshot: s, exact: true }))
            .or_else(|| self.containing(vma_start, at).map(|r| Resolved { exact: false, ..r }))
    }

    /// The mapping that contains `addr` at time `at` (for instruction
    /// pointers), in the order `resolve` uses. `exact` is true.
    pub fn containing(&self, addr: u64, at: u64) -> Option<Resolved<'_>> {
        self.by_source(at)
            .find_map(|s| s.containing(addr).map(|m| Resolved { mapping: m, snapshot: s, exact: true }))
    }

    /// The maps snapshots in `by_preference` order, then the kernel's
    /// descriptions (`KERNEL`) in that order: a description is one VMA as
    /// it was at its first fault (a heap or stack grows after it), so it
    /// names only what no snapshot has.
    fn by_source(&self, at: u64) -> impl Iterator<Item = &MapsSnapshot> {
        let maps = self.by_preference(at).filter(|s| s.label != KERNEL);
        maps.chain(self.by_preference(at).filter(|s| s.label == KERNEL))
    }
}

/// What `top_n` folded into the `other` bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    /// How many distinct keys were folded.
    pub entries: usize,
    /// Their summed count.
    pub count: u64,
}

/// The `n` keys with the highest counts (ties by key, so the result is
/// deterministic) and what the rest adds up to, so a report can say
/// "other (N entries)" rather than drop them. Duplicate keys are summed
/// first; sums are preserved (saturating at u64::MAX).
pub fn top_n<K: Ord>(counts: impl IntoIterator<Item = (K, u64)>, n: usize) -> (Vec<(K, u64)>, Folded) {
    let mut merged: BTreeMap<K, u64> = BTreeMap::new();
    for (k, c) in counts {
        let e = merged.entry(k).or_insert(0);
        *e = e.saturating_add(c);
    }
    let mut all: Vec<(K, u64)> = merged.into_iter().collect();
    // Stable sort keeps key order among equal counts.
    all.sort_by_key(|e| std::cmp::Reverse(e.1));
    let rest = all.split_off(n.min(all.len()));
    let folded =
        Folded { entries: rest.len(), count: rest.iter().fold(0u64, |acc, (_, c)| acc.saturating_add(*c)) };
    (all, folded)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
555d0e784000-555d0e786000 r--p 00000000 fe:00 247030                     /usr/bin/cat
555d0e786000-555d0e78b000 r-xp 00002000 fe:00 247030                     /usr/bin/cat
555d3e04e000-555d3e06f000 rw-p 00000000 00:00 0                          [heap]
7fe671b14000-7fe671b36000 rw-p 00000000 00:00 0 
7fe671b36000-7fe671b8d000 r--p 00000000 fe:00 316534                     /tmp/my dir/lib x.so (deleted)
7fe671b8d000-7fe671b8e000 rw-p 00000000 00:00 0                          [anon:jemalloc pages]
7fe671b8e000-7fe671b8f000 rw-s 00000000 00:01 1234                       [anon_shmem:ring]
7fe671b8f000-7fe671b90000 rw-s 00000000 00:01 1235                       /dev/zero (deleted)
7ffd1c7b9000-7ffd1c7da000 rw-p 00000000 00:00 0                          [stack]
7ffd1c7fc000-7ffd1c7fe000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
7fe671b90000-7fe671b91000 rw-p 00000000 00:00 0";

    /// A kernel description is one VMA at its first fault: a snapshot
    /// that has the same start names it (a heap grown since), at any time;
    /// the description names only what no snapshot has.
    #[test]
    fn snapshots_name_before_kernel_descriptions() {
        let heap = |end: u64| Mapping {
            start: 0x1000,
            end,
            perms: Perms::default(),
            offset: 0,
            dev: "00:00".into(),
            inode: 0,
            name: MappingName::Heap,
        };
        let mut h = MapsHistory::new(1);
        h.push(10, KERNEL, vec![heap(0x2000)]);
        h.push(30, "phase 2", vec![heap(0x9000)]);
        assert_eq!(h.resolve(0x1000, 20).unwrap().mapping.end, 0x9000);
        let v = VmaInfo {
            at: 5,
            end: 0x5000,
            pgoff: 0,
            flags: 0x3,
            ino: 7,
            dev: 0x80_0001,
            file: 1,
            name: [0; 64],
        };
        let mut named = v;
        named.name[..4].copy_from_slice(b"data");
        h.push(5, KERNEL, vec![Mapping::from_vma(0x4000, &named, None)]);
        let r = h.resolve(0x4000, 40).unwrap();
        assert_eq!(
            (r.mapping.name.to_string(), r.mapping.dev.as_str(), r.exact),
            ("…/data".into(), "08:01", true)
        );
        assert_eq!(dev_string(v.dev), "08:01");
    }

    #[test]
    fn parses_every_kind_of_name() {
        let maps = parse_maps(MAPS).unwrap();
        assert_eq!(maps.len(), 12);
        assert!(maps.windows(2).all(|w| w[0].start < w[1].start), "sorted");
        let names: Vec<String> = maps.iter().map(|m| m.name.to_string()).collect();
        assert_eq!(
            names,
            [
                "/usr/bin/cat",
                "/usr/bin/cat",
                "[heap]",
                "anon 0x7fe671b14000-0x7fe671b36000",
                "/tmp/my dir/lib x.so (deleted)",
                "[anon:jemalloc pages]",
                "[anon_shmem:ring]",
                "/dev/zero (deleted)",
                "anon 0x7fe671b90000-0x7fe671b91000",
                "[stack]",
                "[vdso]",
                "[vsyscall]",
            ]
        );
        let exe = &maps[1];
        assert_eq!((exe.offset, exe.inode, exe.dev.as_str()), (0x2000, 247030, "fe:00"));
        assert_eq!(exe.perms, Perms { read: true, write: false, exec: true, shared: false });
        assert_eq!(exe.perms.to_string(), "r-xp");
        assert_eq!(exe.size(), 0x5000);
        assert_eq!(exe.file_offset(0x555d0e786010), Some(0x2010));
        assert_eq!(maps[4].name, MappingName::File { path: "/tmp/my dir/lib x.so".into(), deleted: true });
        assert_eq!(maps[4].name.path(), Some("/tmp/my dir/lib x.so"));
        assert!(maps[6].perms.shared && maps[6].name.is_anon());
    }

    #[test]
    fn bad_lines_are_errors_with_line_numbers() {
        for (text, line) in [
            ("garbage", 1),
            ("1000-2000 r-xp 0 fe:00 1 /a\n2000-1000 r-xp 0 fe:00 1 /a", 2),
            ("1000-2000 rwzp 00000000 fe:00 1 /a", 1),
            ("1000-2000 r-xp 0000zz00 fe:00 1 /a", 1),
            ("1000-2000 r-xp 00000000 fe00 1 /a", 1),
            ("\n\n1000-2000 r-xp 00000000 fe:00 x /a", 3),
            ("1000-2000 r-xp", 1),
            ("1000-2000 r-xp 00000000 fe:00", 1),
            ("\u{1b}[2J", 1),
        ] {
            let err = format!("{:#}", parse_maps(text).unwrap_err());
            assert!(err.starts_with(&format!("maps line {line}:")), "{text:?}: {err}");
            assert!(!err.contains('\u{1b}'), "escaped: {err}");
        }
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(display_safe("a\nb\u{1b}[31m\u{7f}\u{85}é"), "a\\x0ab\\x1b[31m\\x7f\\x85é");
        let m = parse_maps("1000-2000 r-xp 00000000 fe:00 1 /tmp/evil\u{1b}]0;x\u{7}").unwrap();
        assert_eq!(m[0].name.to_string(), "/tmp/evil\\x1b]0;x\\x07");
        assert_eq!(
            MappingName::AnonNamed("a\tb".into()).to_string(),
            "[anon:a\\x09b]",
            "names set by the process are escaped too"
        );
    }

    fn map(start: u64, end: u64, name: &str) -> Mapping {
        parse_maps(&format!("{start:x}-{end:x} rw-p 00000000 00:00 0 {name}")).unwrap().remove(0)
    }

    #[test]
    fn resolve_prefers_time_and_keeps_unmapped_names() {
        let mut h = MapsHistory::new(1);
        h.push(100, "phase 1", vec![map(0x1000, 0x2000, "[anon:a]"), map(0x8000, 0x9000, "/lib/x.so")]);
        // At 200, 0x1000 is reused by another mapping and x.so is gone.
        h.push(200, "phase 2", vec![map(0x1000, 0x3000, "[anon:b]")]);
        // Pushed out of order: kept in time order.
        h.push(10, "attach", vec![map(0x5000, 0x6000, "[anon:early]")]);
        assert_eq!(h.snapshots().iter().map(|s| s.at).collect::<Vec<_>>(), [10, 100, 200]);

        let name = |start, at| h.resolve(start, at).map(|r| (r.mapping.name.to_string(), r.exact));
        assert_eq!(name(0x1000, 150), Some(("[anon:a]".into(), true)));
        assert_eq!(name(0x1000, 250), Some(("[anon:b]".into(), true)));
        // Before any snapshot had it: the nearest later one.
        assert_eq!(name(0x1000, 50), Some(("[anon:a]".into(), true)));
        // Unmapped at 200, still named at the end.
        assert_eq!(name(0x8000, 1000), Some(("/lib/x.so".into(), true)));
        assert_eq!(name(0x5000, 1000), Some(("[anon:early]".into(), true)));
        // No exact start: a containing mapping, flagged.
        assert_eq!(name(0x2800, 250), Some(("[anon:b]".into(), false)));
        assert_eq!(name(0x8800, 0), Some(("/lib/x.so".into(), false)));
        assert!(h.resolve(0x100000, 0).is_none());
        let r = h.resolve(0x1000, 250).unwrap();
        assert_eq!((r.snapshot.label.as_str(), r.snapshot.at), ("phase 2", 200));
        let ip = h.containing(0x1234, 150).unwrap();
        assert_eq!(ip.mapping.name.to_string(), "[anon:a]");
    }

    #[test]
    fn resolve_a_grown_stack() {
        let mut h = MapsHistory::new(1);
        h.push(0, "attach", vec![map(0x7000, 0x8000, "[stack]")]);
        h.push(10, "end", vec![map(0x5000, 0x8000, "[stack]")]);
        // The fault saw the stack VMA at 0x6000 (in between snapshots).
        let r = h.resolve(0x6000, 5).unwrap();
        assert_eq!((r.mapping.name.to_string(), r.exact, r.snapshot.at), ("[stack]".into(), false, 10));
    }

    #[test]
    fn snapshot_self_and_vanished_pid() {
        let maps = snapshot_pid(std::process::id()).unwrap();
        assert!(maps.iter().any(|m| m.name == MappingName::Stack));
        let exe = std::env::current_exe().unwrap();
        assert!(maps.iter().any(|m| m.name.path() == exe.to_str()));
        // Above pid_max (4194304 at most), so never a live process.
        let err = snapshot_pid(u32::MAX - 1).unwrap_err().to_string();
        assert!(err.contains("is gone"), "{err}");
    }

    #[test]
    fn top_n_folds_the_rest_and_keeps_sums() {
        let input = vec![("a", 5u64), ("b", 50), ("c", 7), ("d", 7), ("e", 1), ("b", 3), ("f", 0)];
        let sum: u64 = input.iter().map(|(_, c)| c).sum();
        let (top, other) = top_n(input.clone(), 3);
        assert_eq!(top, [("b", 53), ("c", 7), ("d", 7)]);
        assert_eq!(other, Folded { entries: 3, count: 6 });
        assert_eq!(top.iter().map(|(_, c)| c).sum::<u64>() + other.count, sum);
        let (all, none) = top_n(input.clone(), 100);
        assert_eq!((all.len(), none), (6, Folded::default()));
        let (zero, rest) = top_n(input, 0);
        assert!(zero.is_empty());
        assert_eq!(rest, Folded { entries: 6, count: sum });
    }
}
