//! What a run lost, typed: the kernel side's counters (`DROPS`, indexed by
//! `faultscope_common::maps::DropKind`) and user space's own, under one enum whose
//! key is the report's `drops` key and the metric's `reason` label.

use std::{collections::BTreeMap, fmt};

pub use faultscope_common::maps::DropKind;
use schemars::JsonSchema;
use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// Keys reasons had in older reports, still read.
const FORMER_KEYS: [(&str, DropReason); 1] =
    [("threads_map_full", DropReason::Kernel(DropKind::ThreadStateFailed))];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    /// A counter of the kernel side.
    Kernel(DropKind),
    /// A `/proc` read failed and the process was not taken for exited.
    ProcErrors,
    /// serve's `accept` failed (no descriptor left).
    AcceptErrors,
    /// Runs of faultscope's programs the kernel skipped, as it counts them
    /// (`bpf_prog_info.recursion_misses`): a kprobe or tracepoint program
    /// while the CPU's BPF guard (`bpf_prog_active`) was held, by another
    /// program or by a BPF map system call of any process preempted on that
    /// CPU; an fentry, fexit or BTF tracepoint program while a run of the
    /// same program was preempted on that CPU. The kernel decides; a
    /// preemptible kernel (every 7.x) makes it possible. Not summed: the
    /// kernel-mode exception programs, whose skipped runs are faultscope's
    /// own nested faults (see `Session::skipped_runs`).
    SkippedRuns,
}

impl DropReason {
    pub fn all() -> impl Iterator<Item = DropReason> {
        DropKind::ALL.into_iter().map(DropReason::Kernel).chain([
            DropReason::ProcErrors,
            DropReason::AcceptErrors,
            DropReason::SkippedRuns,
        ])
    }

    /// The key in the report's `drops` object and the metric's label.
    pub fn key(self) -> &'static str {
        match self {
            DropReason::Kernel(d) => d.key(),
            DropReason::ProcErrors => "proc_errors",
            DropReason::AcceptErrors => "accept_errors",
            DropReason::SkippedRuns => "program_runs_skipped",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            DropReason::Kernel(d) => d.describe(),
            DropReason::ProcErrors => "/proc reads that failed (the process was not taken for exited)",
            DropReason::AcceptErrors => "connections not accepted (no descriptor left)",
            DropReason::SkippedRuns => {
                "program runs the kernel skipped (its BPF recursion guard was held on that CPU: see the man page's OVERHEAD)"
            }
        }
    }

    /// The reason of a key, former keys of older reports included.
    pub fn from_key(key: &str) -> Option<DropReason> {
        let former = FORMER_KEYS.iter().find(|(k, _)| *k == key).map(|(_, d)| *d);
        former.or_else(|| DropReason::all().find(|d| d.key() == key))
    }

    /// Whether a drop of this reason can change a count the kernel check
    /// compares: faultscope's (an event not counted, or counted as
    /// completed without its return) or the kernel's (an exiting thread's
    /// final count not kept). The attribution maps' drops only cost names
    /// (the counts are in `STATS`); `targets_map_full` and
    /// `events_ring_full` cost a process or an event, which leaves that
    /// process without a check rather than with a wrong one; `/proc` and
    /// `accept` errors are user space's. A skipped run may have been a
    /// fault's.
    pub fn loses_counts(self) -> bool {
        matches!(
            self,
            DropReason::Kernel(
                DropKind::StatsFull
                    | DropKind::ThreadStateFailed
                    | DropKind::LostReturn
                    | DropKind::ReadFailed
                    | DropKind::ExitedFull
            ) | DropReason::SkippedRuns
        )
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// Counts by reason; in JSON an object of `key: count`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Drops(pub BTreeMap<DropReason, u64>);

impl Drops {
    pub fn get(&self, d: DropReason) -> u64 {
        self.0.get(&d).copied().unwrap_or(0)
    }

    pub fn set(&mut self, d: DropReason, n: u64) {
        self.0.insert(d, n);
    }

    pub fn total(&self) -> u64 {
        self.0.values().sum()
    }

    /// The reasons that lost something.
    pub fn nonzero(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        self.0.iter().filter(|(_, n)| **n > 0).map(|(d, n)| (*d, *n))
    }

    /// The drops that can change a count of the kernel check
    /// ([`DropReason::loses_counts`]), as `key N, key N`; `None` when there
    /// were none. The counters are the run's, not a process's: a drop may
    /// have cost any traced process.
    pub fn of_counts(&self) -> Option<String> {
        let v: Vec<String> = self
            .nonzero()
            .filter(|(d, _)| d.loses_counts())
            .map(|(d, n)| format!("{} {n}", d.key()))
            .collect();
        (!v.is_empty()).then(|| v.join(", "))
    }
}

impl Serialize for Drops {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(d, n)| (d.key(), n)))
    }
}

impl<'de> Deserialize<'de> for Drops {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = BTreeMap::<String, u64>::deserialize(d)?;
        let mut out = Drops::default();
        for (k, n) in raw {
            let reason = DropReason::from_key(&k).ok_or_else(|| {
                let known: Vec<_> = DropReason::all().map(DropReason::key).collect();
                de::Error::custom(format!("unknown drop reason `{k}` (known: {})", known.join(", ")))
            })?;
            out.set(reason, n);
        }
        Ok(out)
    }
}

impl JsonSchema for Drops {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Drops".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let props: serde_json::Map<String, serde_json::Value> =
            DropReason::all().map(|d| (d.key().to_string(), g.subschema_for::<u64>().to_value())).collect();
        schemars::json_schema!({
            "description": "What was lost, by reason (never silently): each key's count.",
            "type": "object",
            "properties": props,
            "additionalProperties": false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_round_trip() {
        let keys: std::collections::BTreeSet<_> = DropReason::all().map(DropReason::key).collect();
        assert_eq!(keys.len(), DropReason::all().count());
        let mut d = Drops::default();
        for (i, r) in DropReason::all().enumerate() {
            d.set(r, i as u64);
        }
        let j = serde_json::to_string(&d).unwrap();
        assert_eq!(serde_json::from_str::<Drops>(&j).unwrap(), d);
        assert!(serde_json::from_str::<Drops>(r#"{"nonsense": 1}"#)
            .unwrap_err()
            .to_string()
            .contains("unknown drop reason"));
        // An older report's keys.
        for (key, reason) in FORMER_KEYS {
            let old: Drops = serde_json::from_str(&format!("{{\"{key}\": 3}}")).unwrap();
            assert_eq!(old.get(reason), 3);
        }
    }

    #[test]
    fn drops_that_lose_counts() {
        let mut d = Drops::default();
        d.set(DropReason::Kernel(DropKind::SitesFull), 9);
        d.set(DropReason::ProcErrors, 1);
        d.set(DropReason::Kernel(DropKind::StatsFull), 0);
        assert_eq!(d.of_counts(), None, "names and /proc errors change no count");
        d.set(DropReason::Kernel(DropKind::StatsFull), 436);
        d.set(DropReason::Kernel(DropKind::ExitedFull), 2);
        assert_eq!(d.of_counts().as_deref(), Some("stats_map_full 436, exited_map_full 2"));
    }
}
