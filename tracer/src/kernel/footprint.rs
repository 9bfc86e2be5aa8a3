//! The kernel memory faultscope's maps take, and its bounds. A per-CPU map
//! preallocates every entry on every possible CPU, so the stats map's size
//! is chosen for the machine: by default the largest that fits in
//! [`STATS_AUTO_BYTES`] (at most the command's default entries), and a
//! `--max-stats` whose map would pass [`STATS_LIMIT_BYTES`] is refused
//! before anything is loaded.

use std::mem::size_of;

use faultscope_common::{
    attrib::{ClassCounts, LastVma, MappingKey, SiteKey, StackKey, VmaInfo, VmaKey, VMAS_ENTRIES},
    fault::{WpPage, WP_PAGE_BUCKETS},
    maps::{ClassSetKey, FltCount, OpenFault, TargetInfo, UntracedNote},
    pending::{PendingMapping, PendingStat, FLUSH_COUNTERS, PENDING_SLOTS},
    Stat,
};

use crate::error::Refusal;

/// What the default stats map may take.
pub const STATS_AUTO_BYTES: u64 = 128 << 20;
/// What an asked-for stats map may take at most.
pub const STATS_LIMIT_BYTES: u64 = 1 << 30;

/// Possible CPUs: the count per-CPU maps allocate for.
pub fn cpus() -> u64 {
    aya::util::nr_cpus().map(|n| n as u64).unwrap_or(1).max(1)
}

/// One map's bound and what it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSize {
    pub name: &'static str,
    pub entries: u64,
    /// Bytes, keys and values of every entry, on every CPU for a per-CPU map
    /// (the kernel's own overhead per entry is left out).
    pub bytes: u64,
}

fn map(name: &'static str, entries: u64, key: usize, value: usize, per_cpu: bool, cpus: u64) -> MapSize {
    let v = value as u64 * if per_cpu { cpus } else { 1 };
    MapSize { name, entries, bytes: entries * (key as u64 + v) }
}

/// Bytes of one stats entry on `cpus` CPUs.
pub fn stats_entry_bytes(cpus: u64) -> u64 {
    size_of::<ClassSetKey>() as u64 + size_of::<Stat>() as u64 * cpus
}

/// An asked-for map size: `asked` entries of `per` bytes (`what`: how
/// they are counted), refused at 0 and past `limit` bytes with the figure.
fn bounded(flag: &str, map: &str, asked: u32, per: u64, what: &str, limit: u64) -> Result<u32, Refusal> {
    if asked == 0 {
        return Err(Refusal::new(format!("{flag} 0: the {map} map needs at least 1 entry")));
    }
    if asked as u64 * per > limit {
        return Err(Refusal::new(format!(
            "{flag} {asked}: the {map} map would take {} of kernel memory{what} ({per} bytes an entry); at most {} entries fit in {}",
            crate::units::bytes(asked as u64 * per),
            limit / per,
            crate::units::bytes(limit)
        )));
    }
    Ok(asked)
}

/// The stats map's entries: `asked`, refused past the limit, or the
/// largest under the default budget, at most `default`.
pub fn stats_entries(asked: Option<u32>, default: u32, cpus: u64) -> Result<u32, Refusal> {
    let per = stats_entry_bytes(cpus);
    match asked {
        Some(n) => bounded(
            "--max-stats",
            "stats",
            n,
            per,
            &format!(" on this machine's {cpus} CPUs"),
            STATS_LIMIT_BYTES,
        ),
        None => Ok((STATS_AUTO_BYTES / per).clamp(1, default as u64) as u32),
    }
}

/// Frames a stack map entry holds (the kernel's `PERF_MAX_STACK_DEPTH`).
pub const STACK_DEPTH: usize = 127;
/// The stack map's entries under `--stacks` by default.
pub const STACK_ENTRIES: u32 = 65536;
/// What an asked-for stack map may take at most.
pub const STACKS_LIMIT_BYTES: u64 = 1 << 30;

/// Bytes of one stack map entry: its frames and their count.
pub fn stack_entry_bytes() -> u64 {
    4 + 8 * STACK_DEPTH as u64
}

/// The stack map's entries: `asked`, refused past the limit, or
/// [`STACK_ENTRIES`]. A stack whose hash bucket holds another is lost, so
/// the map is made much larger than the stacks it is expected to hold.
pub fn stack_entries(asked: Option<u32>) -> Result<u32, Refusal> {
    match asked {
        Some(n) => bounded("--max-stacks", "stack", n, stack_entry_bytes(), "", STACKS_LIMIT_BYTES),
        None => Ok(STACK_ENTRIES),
    }
}

/// How large the kernel maps are made at load.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sizes {
    /// `STATS` entries (process x phase x class).
    pub stats: u32,
    /// `STACK_TRACES` entries: 0 when no stacks are asked for (the map
    /// preallocates every entry).
    pub stacks: u32,
    /// `CGROUPS` entries: 0 turns the kernel's cgroup filter off.
    pub cgroups: u32,
    /// `COMMS` entries: 0 turns the kernel's comm filter off.
    pub comms: u32,
    /// An exec in a traced process starts a phase (serve).
    pub exec_phase: bool,
    /// Every process on the host is counted (`-a`).
    pub system_wide: bool,
    /// Which attribution maps are used (the others get one entry: a per-CPU
    /// map preallocates every entry on every CPU).
    pub mappings: bool,
    pub sites: bool,
    pub stacks_counted: bool,
}

/// Entries of an attribution map in use.
pub const ATTRIBUTION_ENTRIES: u32 = 4096;

impl Sizes {
    /// `MAPPINGS`, `SITES`, `STACK_COUNTS` and `VMAS` entries.
    pub fn attribution(&self) -> [(&'static str, u32); 4] {
        let n = |used: bool| if used { ATTRIBUTION_ENTRIES } else { 1 };
        [
            ("MAPPINGS", n(self.mappings)),
            ("SITES", n(self.sites)),
            ("STACK_COUNTS", n(self.stacks_counted)),
            ("VMAS", if self.mappings { VMAS_ENTRIES } else { 1 }),
        ]
    }
}

/// Every map of the object with its bound, for `s`, on `cpus` CPUs.
pub fn maps(s: &Sizes, cpus: u64) -> Vec<MapSize> {
    let Sizes { stats, stacks, cgroups, comms, .. } = *s;
    let [(_, mappings), (_, sites), (_, stack_counts), (_, vmas)] =
        s.attribution().map(|(n, e)| (n, e as u64));
    // The eBPF object's bounds (tracer-ebpf/src/maps.rs).
    const TRACKED: u64 = 4096;
    vec![
        map("STATS", stats as u64, size_of::<ClassSetKey>(), size_of::<Stat>(), true, cpus),
        map("MAPPINGS", mappings, size_of::<MappingKey>(), size_of::<ClassCounts>(), true, cpus),
        map("SITES", sites, size_of::<SiteKey>(), 8, true, cpus),
        map("STACK_COUNTS", stack_counts, size_of::<StackKey>(), 8, true, cpus),
        map("STACK_TRACES", stacks.max(1) as u64, 4, 8 * STACK_DEPTH, false, cpus),
        map("TARGETS", TRACKED, 4, size_of::<TargetInfo>(), false, cpus),
        map("CHILDREN", TRACKED, 4, 4, false, cpus),
        map("EXITED", TRACKED, 4, size_of::<FltCount>(), false, cpus),
        map("CGROUPS", cgroups.max(1) as u64, 8, 4, false, cpus),
        map("COMMS", comms.max(1) as u64, 16, 4, false, cpus),
        map("ZERO", 1, 4, size_of::<Stat>(), true, cpus),
        map("PENDING_STATS", PENDING_SLOTS as u64, 4, size_of::<PendingStat>(), true, cpus),
        map("PENDING_MAPPINGS", PENDING_SLOTS as u64, 4, size_of::<PendingMapping>(), true, cpus),
        map("FLUSHES", FLUSH_COUNTERS as u64, 4, 8, true, cpus),
        map("TARGETS_EPOCH", 1, 4, 8, false, cpus),
        map("UNTRACED", 1, 4, size_of::<UntracedNote>(), true, cpus),
        map("OPEN", 1, 4, size_of::<OpenFault>(), true, cpus),
        map("WP_PAGES", WP_PAGE_BUCKETS as u64, 4, size_of::<WpPage>(), false, cpus),
        map("EVENTS", 1, 0, 256 << 10, false, cpus),
        map("CGROUP_DIRS", 1, 0, 64 << 10, false, cpus),
        map("VMAS", vmas, size_of::<VmaKey>(), size_of::<VmaInfo>(), false, cpus),
        map("VMA_SCRATCH", 1, 4, size_of::<VmaInfo>(), true, cpus),
        map("LAST_VMA", 1, 4, size_of::<LastVma>(), true, cpus),
    ]
}

pub fn total(maps: &[MapSize]) -> u64 {
    maps.iter().map(|m| m.bytes).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stack map: the default under the limit, 0 and past the limit
    /// refused with the figure, its bytes as `maps` counts them.
    #[test]
    fn the_stack_map_is_bounded() {
        assert_eq!(stack_entries(None).ok(), Some(STACK_ENTRIES));
        assert!(STACK_ENTRIES as u64 * stack_entry_bytes() < STACKS_LIMIT_BYTES);
        assert_eq!(stack_entries(Some(100)).ok(), Some(100));
        assert!(stack_entries(Some(0)).unwrap_err().0.contains("--max-stacks 0"));
        let e = stack_entries(Some(2_000_000)).unwrap_err().0;
        assert!(e.contains("--max-stacks 2000000") && e.contains("GiB") && e.contains("1052688"), "{e}");
        let s = Sizes { stacks: 100, ..Sizes::default() };
        let m = maps(&s, 2).into_iter().find(|m| m.name == "STACK_TRACES").unwrap();
        assert_eq!(m.bytes, 100 * stack_entry_bytes());
    }

    #[test]
    fn the_default_fits_the_budget_on_any_machine() {
        let per2 = stats_entry_bytes(2);
        assert_eq!(per2, 12 + 2 * size_of::<Stat>() as u64);
        assert_eq!(stats_entries(None, 4096, 2).unwrap(), 4096);
        let big = stats_entries(None, 4096, 128).unwrap() as u64;
        assert!(big * stats_entry_bytes(128) <= STATS_AUTO_BYTES && big < 4096, "{big}");
        assert!((big + 1) * stats_entry_bytes(128) > STATS_AUTO_BYTES);
        assert_eq!(stats_entries(None, 4096, 1 << 20).unwrap(), 1);
    }

    #[test]
    fn an_absurd_size_is_refused_with_the_figure() {
        let e = stats_entries(Some(100_000_000), 2048, 2).unwrap_err();
        assert!(
            e.0.contains("--max-stats 100000000") && e.0.contains("GiB") && e.0.contains("2 CPUs"),
            "{e}"
        );
        assert!(stats_entries(Some(0), 2048, 2).is_err());
        assert_eq!(stats_entries(Some(100_000), 2048, 2).unwrap(), 100_000);
    }

    /// serve's defaults (no attribution) against record's (mappings and
    /// sites), on 2 and 128 CPUs: the figures docs/guide.md gives.
    #[test]
    fn serve_takes_no_attribution_memory() {
        let serve = |cpus| {
            let stats = stats_entries(None, 4096, cpus).unwrap();
            total(&maps(&Sizes { stats, ..Sizes::default() }, cpus))
        };
        let record = |cpus| {
            let stats = stats_entries(None, 2048, cpus).unwrap();
            total(&maps(&Sizes { stats, mappings: true, sites: true, ..Sizes::default() }, cpus))
        };
        for cpus in [2, 128] {
            eprintln!(
                "{cpus} CPUs: serve {} ({} stats entries), record {}",
                crate::units::bytes(serve(cpus)),
                stats_entries(None, 4096, cpus).unwrap(),
                crate::units::bytes(record(cpus))
            );
        }
        assert!(serve(128) <= STATS_AUTO_BYTES + (8 << 20), "{}", serve(128));
        // Two histograms per entry (the latency with and without
        // faultscope's own time): 4,096 entries on 2 CPUs are 21 MB.
        assert!(serve(2) < 24 << 20, "{}", serve(2));
        assert!(record(128) > serve(128));
    }

    #[test]
    fn the_footprint_adds_up() {
        let m = maps(&Sizes { stats: 4096, ..Sizes::default() }, 128);
        let stats = m.iter().find(|x| x.name == "STATS").unwrap();
        assert_eq!(stats.bytes, 4096 * stats_entry_bytes(128));
        assert_eq!(total(&m), m.iter().map(|x| x.bytes).sum::<u64>());
        assert!(total(&maps(&Sizes { stats: 4096, ..Sizes::default() }, 2)) < total(&m));
        assert_eq!(crate::units::bytes(1536), "1.5 KiB");
    }
}
