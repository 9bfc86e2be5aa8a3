//! Code sites: user instruction pointers to `func+0x3c (module)`.
//!
//! The kernel side counts the costly fault classes per user ip. This module
//! names those ips with blazesym. It must work after the traced process has
//! exited, so it never looks at /proc/PID: each ip is translated with the
//! maps snapshots (`ip - start + offset`) into a file offset in the mapped
//! file, and that file is symbolized by file offset (ELF symbols, DWARF with
//! file:line where present). What cannot be named keeps the file offset and
//! the build id, enough to symbolize it elsewhere later.

use std::{collections::HashMap, fmt, os::unix::fs::MetadataExt as _, path::Path};

use blazesym::symbolize::{source, Input, Symbolized, Symbolizer};

use super::mapping::{display_safe, MappingName, MapsHistory};

/// A source position (DWARF line info).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceLine {
    pub file: String,
    pub line: Option<u32>,
}

/// What is known about one instruction pointer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SiteLocation {
    /// Named by the file's symbols.
    Symbol {
        /// Demangled.
        name: String,
        /// Bytes from the start of the symbol.
        offset: u64,
        /// Where the ip is in the source, innermost inlined call included.
        source: Option<SourceLine>,
        /// Functions inlined at the ip, outermost first (DWARF only).
        inlined: Vec<String>,
    },
    /// A file mapping whose file cannot name the ip (stripped, no symbol
    /// there, deleted or replaced since, unreadable).
    FileOffset {
        file_offset: u64,
        /// GNU build id, lower-case hex, when the file is still the mapped one.
        build_id: Option<String>,
        /// Why no symbol (for a verbose report).
        reason: String,
    },
    /// Not backed by a file (JIT code in anonymous memory, `[vdso]`, ...):
    /// the offset from the mapping's start.
    NotFile { offset: u64 },
    /// No snapshot has a mapping that contains the ip.
    Unmapped,
}

/// A symbolized code site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub ip: u64,
    /// The mapping the ip was in (None when unmapped).
    pub mapping: Option<MappingName>,
    pub location: SiteLocation,
}

impl Site {
    /// The file name of the mapped file, as the report shows the module.
    pub fn module(&self) -> Option<String> {
        let path = self.mapping.as_ref()?.path()?;
        let base = Path::new(path).file_name().map(|b| b.to_string_lossy().into_owned());
        Some(display_safe(&base.unwrap_or_else(|| path.to_string())))
    }
}

/// `func+0x3c (redis-server)`, `redis-server+0x1a2b (build id 3f..)`,
/// `anon+0x40`, `[vdso]+0x9a0`, `[unknown] 0x...`. The alternate form
/// (`{:#}`) adds ` at file:line` when DWARF gave one.
impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let module = self.module().unwrap_or_else(|| "?".into());
        match &self.location {
            SiteLocation::Symbol { name, offset, source, .. } => {
                write!(f, "{}+{offset:#x} ({module})", display_safe(name))?;
                if let (true, Some(src)) = (f.alternate(), source) {
                    let base = Path::new(&src.file).file_name().map(|b| b.to_string_lossy());
                    write!(f, " at {}", display_safe(&base.unwrap_or_default()))?;
                    if let Some(line) = src.line {
                        write!(f, ":{line}")?;
                    }
                }
                Ok(())
            }
            SiteLocation::FileOffset { file_offset, build_id, .. } => {
                write!(f, "{module}+{file_offset:#x}")?;
                match build_id {
                    Some(id) => write!(f, " (build id {id})"),
                    None => Ok(()),
                }
            }
            SiteLocation::NotFile { offset } => match &self.mapping {
                Some(MappingName::Anon { .. }) | None => write!(f, "anon+{offset:#x}"),
                Some(name) => write!(f, "{name}+{offset:#x}"),
            },
            SiteLocation::Unmapped => write!(f, "[unknown] {:#x}", self.ip),
        }
    }
}

/// Symbolizes ips of processes that may have exited. Keeps blazesym's
/// parsed files and the build ids between calls: reuse one for a report.
pub struct SiteSymbolizer {
    inner: Symbolizer,
    build_ids: HashMap<String, Option<String>>,
}

impl Default for SiteSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

/// A file ready for symbolization, or why not.
enum FileState {
    Usable,
    Refused(String),
}

impl SiteSymbolizer {
    pub fn new() -> Self {
        let inner = Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            .build();
        SiteSymbolizer { inner, build_ids: HashMap::new() }
    }

    fn build_id(&mut self, path: &str) -> Option<String> {
        self.build_ids
            .entry(path.to_string())
            .or_insert_with(|| {
                let id = blazesym::helper::read_elf_build_id(Path::new(path)).ok().flatten()?;
                Some(id.iter().map(|b| format!("{b:02x}")).collect())
            })
            .clone()
    }

    /// Names `ips` as they were at time `at` (the clock of the history's
    /// snapshots), one `Site` per ip, in order. Never fails: what cannot be
    /// named says so in its `SiteLocation`.
    pub fn symbolize(&mut self, history: &MapsHistory, at: u64, ips: &[u64]) -> Vec<Site> {
        let mut sites: Vec<Site> = Vec::with_capacity(ips.len());
        // Per mapped file (path, deleted): the ips in it.
        let mut by_file: HashMap<(String, bool), Vec<Pending>> = HashMap::new();
        for (i, &ip) in ips.iter().enumerate() {
            let Some(r) = history.containing(ip, at) else {
                sites.push(Site { ip, mapping: None, location: SiteLocation::Unmapped });
                continue;
            };
            let m = r.mapping;
            let location = match &m.name {
                MappingName::File { path, deleted } => {
                    let off = ip - m.start + m.offset;
                    by_file.entry((path.clone(), *deleted)).or_default().push(Pending {
                        idx: i,
                        off,
                        inode: m.inode,
                    });
                    // Placeholder, filled in below.
                    SiteLocation::FileOffset { file_offset: off, build_id: None, reason: String::new() }
                }
                // Known by its name only: the offset in the file.
                MappingName::FileName(_) => SiteLocation::NotFile { offset: ip - m.start + m.offset },
                _ => SiteLocation::NotFile { offset: ip - m.start },
            };
            sites.push(Site { ip, mapping: Some(m.name.clone()), location });
        }

        let mut files: Vec<_> = by_file.into_iter().collect();
        files.sort_by(|a, b| a.0.cmp(&b.0));
        for ((path, deleted), entries) in files {
            for (inode, group) in group_by_inode(&entries) {
                let state = if deleted {
                    // The path now names another file, or none.
                    FileState::Refused("file deleted after it was mapped".into())
                } else {
                    match std::fs::metadata(&path) {
                        Err(e) => FileState::Refused(format!("{path}: {e}")),
                        Ok(md) if inode != 0 && md.ino() != inode => FileState::Refused(format!(
                            "file replaced since it was mapped (inode {inode}, now {})",
                            md.ino()
                        )),
                        Ok(_) => FileState::Usable,
                    }
                };
                let offsets: Vec<u64> = group.iter().map(|&(_, off)| off).collect();
                let results = match state {
                    FileState::Refused(why) => Err(why),
                    FileState::Usable => self
                        .inner
                        .symbolize(&source::Source::Elf(source::Elf::new(&path)), Input::FileOffset(&offsets))
                        .map(|v| v.into_iter().map(owned).collect::<Vec<_>>())
                        .map_err(|e| format!("{path}: {e}")),
                };
                let build_id = match &results {
                    Ok(_) => self.build_id(&path),
                    Err(_) => None,
                };
                for (k, &(idx, off)) in group.iter().enumerate() {
                    let result = match &results {
                        Ok(v) => v.get(k).cloned().unwrap_or(Err("no result".into())),
                        Err(why) => Err(why.clone()),
                    };
                    sites[idx].location = match result {
                        Ok(loc) => loc,
                        Err(reason) => {
                            SiteLocation::FileOffset { file_offset: off, build_id: build_id.clone(), reason }
                        }
                    };
                }
            }
        }
        sites
    }
}

/// An ip in a file mapping, waiting for its file to be symbolized.
struct Pending {
    /// Index into the result.
    idx: usize,
    /// Offset in the file.
    off: u64,
    /// The file's inode when the snapshot was taken.
    inode: u64,
}

/// Entries of one path split by the inode the snapshot saw (a path mapped,
/// replaced and mapped again has two): inode -> (index, file offset).
fn group_by_inode(entries: &[Pending]) -> Vec<(u64, Vec<(usize, u64)>)> {
    let mut groups: Vec<(u64, Vec<_>)> = Vec::new();
    for &Pending { idx, off, inode } in entries {
        match groups.iter_mut().find(|g| g.0 == inode) {
            Some(g) => g.1.push((idx, off)),
            None => groups.push((inode, vec![(idx, off)])),
        }
    }
    groups
}

fn owned(s: Symbolized<'_>) -> Result<SiteLocation, String> {
    match s {
        Symbolized::Sym(sym) => {
            let code = sym.inlined.last().and_then(|f| f.code_info.as_ref()).or(sym.code_info.as_deref());
            let source =
                code.map(|c| SourceLine { file: c.to_path().to_string_lossy().into_owned(), line: c.line });
            Ok(SiteLocation::Symbol {
                name: sym.name.into_owned(),
                offset: sym.offset as u64,
                source,
                inlined: sym.inlined.iter().map(|f| f.name.to_string()).collect(),
            })
        }
        Symbolized::Unknown(reason) => Err(reason.to_string()),
    }
}

impl SiteSymbolizer {
    /// Names kernel addresses (stack frames) from /proc/kallsyms:
    /// `func+0x1c`, or the address in hex where kallsyms has nothing.
    /// kallsyms is parsed once per symbolizer (blazesym keeps it), so one
    /// symbolizer serves a whole run's stacks.
    pub fn kernel_frames(&self, addrs: &[u64]) -> Vec<String> {
        let kernel = source::Kernel {
            kallsyms: blazesym::MaybeDefault::Default,
            vmlinux: blazesym::MaybeDefault::None,
            ..Default::default()
        };
        match self.inner.symbolize(&source::Source::Kernel(kernel), Input::AbsAddr(addrs)) {
            Ok(v) => v
                .iter()
                .zip(addrs)
                .map(|(s, a)| match s {
                    Symbolized::Sym(sym) => format!("{}+{:#x}", display_safe(&sym.name), sym.offset),
                    Symbolized::Unknown(_) => format!("{a:#x}"),
                })
                .collect(),
            Err(_) => addrs.iter().map(|a| format!("{a:#x}")).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attrib::mapping::{parse_maps, snapshot_pid};

    #[inline(never)]
    fn faultscope_site_probe(x: u64) -> u64 {
        std::hint::black_box(x.wrapping_mul(31).rotate_left(7))
    }

    fn self_history() -> MapsHistory {
        let mut h = MapsHistory::new(std::process::id());
        h.push(0, "attach", snapshot_pid(std::process::id()).unwrap());
        h
    }

    fn probe_ip() -> u64 {
        assert_ne!(faultscope_site_probe(1), 0);
        faultscope_site_probe as *const () as u64 + 4
    }

    #[test]
    fn names_a_function_of_this_binary() {
        let h = self_history();
        let ip = probe_ip();
        let sites = SiteSymbolizer::new().symbolize(&h, 0, &[ip, 0x10]);
        let SiteLocation::Symbol { name, offset, .. } = &sites[0].location else {
            panic!("not symbolized: {:?}", sites[0]);
        };
        assert!(name.contains("faultscope_site_probe"), "{name}");
        assert_eq!(*offset, 4);
        let exe = std::env::current_exe().unwrap();
        let base = exe.file_name().unwrap().to_str().unwrap();
        let shown = sites[0].to_string();
        assert!(shown.ends_with(&format!("+0x4 ({base})")), "{shown}");
        // Test builds carry DWARF: a file:line.
        let long = format!("{:#}", sites[0]);
        assert!(long.contains(" at sites.rs:"), "{long}");
        assert_eq!(sites[1].location, SiteLocation::Unmapped);
        assert_eq!(sites[1].to_string(), "[unknown] 0x10");
    }

    #[test]
    fn anonymous_and_vdso_sites() {
        let mut h = MapsHistory::new(1);
        h.push(
            0,
            "attach",
            parse_maps(
                "7f0000000000-7f0000010000 rwxp 00000000 00:00 0 \n\
                 7f0000010000-7f0000011000 r-xp 00000000 00:00 0  [vdso]\n\
                 7f0000020000-7f0000021000 r-xp 00000000 00:00 0  [anon:v8 jit]",
            )
            .unwrap(),
        );
        let sites = SiteSymbolizer::new().symbolize(&h, 0, &[0x7f0000000040, 0x7f00000109a0, 0x7f0000020010]);
        let shown: Vec<String> = sites.iter().map(|s| s.to_string()).collect();
        assert_eq!(shown, ["anon+0x40", "[vdso]+0x9a0", "[anon:v8 jit]+0x10"]);
    }

    #[test]
    fn stripped_file_falls_back_to_offset_and_build_id() {
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let stripped = dir.path().join("stripped-copy");
        let ok = std::process::Command::new("objcopy")
            .arg("--strip-all")
            .arg(&exe)
            .arg(&stripped)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            println!("skipped: objcopy --strip-all is not available here");
            return;
        }
        let stripped_s = stripped.to_str().unwrap().to_string();
        // This process's maps, with the executable renamed to the stripped
        // copy (and its inode, so the replaced-file check passes).
        let exe_s = exe.to_str().unwrap();
        let ino = std::fs::metadata(&stripped).unwrap().ino();
        let mut maps = snapshot_pid(std::process::id()).unwrap();
        for m in maps.iter_mut().filter(|m| m.name.path() == Some(exe_s)) {
            m.name = MappingName::File { path: stripped_s.clone(), deleted: false };
            m.inode = ino;
        }
        let mut h = MapsHistory::new(1);
        h.push(0, "attach", maps);
        let ip = probe_ip();
        let expect_off = h.containing(ip, 0).unwrap().mapping.file_offset(ip).unwrap();
        let want_id = blazesym::helper::read_elf_build_id(&exe)
            .unwrap()
            .map(|id| id.iter().map(|b| format!("{b:02x}")).collect::<String>());
        let sites = SiteSymbolizer::new().symbolize(&h, 0, &[ip]);
        match &sites[0].location {
            SiteLocation::FileOffset { file_offset, build_id, reason } => {
                assert_eq!(*file_offset, expect_off);
                assert_eq!(build_id, &want_id, "{reason}");
                let shown = sites[0].to_string();
                assert!(shown.starts_with(&format!("stripped-copy+{expect_off:#x}")), "{shown}");
                if want_id.is_none() {
                    println!("note: this test binary has no build id");
                }
            }
            other => panic!("stripped copy still named the ip: {other:?}"),
        }
    }

    #[test]
    fn deleted_or_replaced_files_are_not_trusted() {
        let exe = std::env::current_exe().unwrap();
        let exe_s = exe.to_str().unwrap().to_string();
        let mut maps = snapshot_pid(std::process::id()).unwrap();
        maps.retain(|m| m.name.path() == Some(exe_s.as_str()));
        let mut deleted = maps.clone();
        for m in &mut deleted {
            m.name = MappingName::File { path: exe_s.clone(), deleted: true };
        }
        for m in &mut maps {
            m.inode += 1;
        }
        let ip = probe_ip();
        for (maps, why) in [(deleted, "deleted"), (maps, "replaced")] {
            let mut h = MapsHistory::new(1);
            h.push(0, "end", maps);
            let site = SiteSymbolizer::new().symbolize(&h, 0, &[ip]).remove(0);
            match site.location {
                SiteLocation::FileOffset { build_id: None, reason, .. } => {
                    assert!(reason.contains(why), "{reason}")
                }
                other => panic!("{why}: {other:?}"),
            }
        }
    }
}
