//! Which faults are timed (`--latency`): every one, one in N, or none.
//! Counts are exact in every tier; a timed fault costs two clock reads at
//! its entry and return, two in each program nested in it, and its
//! histogram updates (docs/cost.md).

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The most N of `sample=N`.
pub const MAX_EVERY: u32 = 1 << 20;

/// A latency tier, as the report states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "tier", rename_all = "lowercase")]
pub enum LatencyTier {
    /// Every fault is timed.
    All,
    /// One fault in `every` of those opened on each CPU is timed: the
    /// latency figures are of that sample (each timed fault stands for
    /// `every`), the counts are of every fault.
    Sample { every: u32 },
    /// No fault is timed: counts only.
    Off,
}

/// Where a timed fault's time starts; it ends at `handle_mm_fault`'s
/// return.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LatencyWindow {
    /// At the page-fault exception (x86 with fexit, exit-only mode): the
    /// time the faulting access waits in the kernel, less the exception's
    /// own entry. A retried call is timed from the return that retried it;
    /// get_user_pages raises no exception, so its faults are counted and
    /// not timed.
    Exception,
    /// At `handle_mm_fault`'s entry (kprobes; fentry on arm64): every call.
    Entry,
}

impl LatencyTier {
    /// `Config::LatencyEvery` for the kernel side: 0 none, 1 all, N.
    pub fn every(self) -> u32 {
        match self {
            LatencyTier::All => 1,
            LatencyTier::Sample { every } => every,
            LatencyTier::Off => 0,
        }
    }
}

impl fmt::Display for LatencyTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LatencyTier::All => f.write_str("all"),
            LatencyTier::Sample { every } => write!(f, "sample={every}"),
            LatencyTier::Off => f.write_str("off"),
        }
    }
}

/// `--latency`'s value parser: `all`, `off` or `sample=N` (N from 2 to
/// 2^20).
pub fn parse(s: &str) -> Result<LatencyTier, String> {
    match s {
        "all" => Ok(LatencyTier::All),
        "off" => Ok(LatencyTier::Off),
        _ => {
            let n = s.strip_prefix("sample=").ok_or_else(|| {
                format!("{s:?}: give all (every fault timed), off (counts only) or sample=N (one fault in N timed)")
            })?;
            match n.parse::<u32>() {
                Ok(every) if (2..=MAX_EVERY).contains(&every) => Ok(LatencyTier::Sample { every }),
                _ => Err(format!("sample={n}: give N from 2 to {MAX_EVERY} (sample=1 is all)")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiers_parse_and_print_alike() {
        for (s, t) in [
            ("all", LatencyTier::All),
            ("off", LatencyTier::Off),
            ("sample=16", LatencyTier::Sample { every: 16 }),
        ] {
            assert_eq!(parse(s), Ok(t));
            assert_eq!(t.to_string(), s);
        }
        assert_eq!(LatencyTier::Sample { every: 16 }.every(), 16);
        assert_eq!((LatencyTier::All.every(), LatencyTier::Off.every()), (1, 0));
        for bad in ["sample=1", "sample=0", "sample=", "sample=-3", "sample=2000000", "some", ""] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let json = serde_json::to_string(&LatencyTier::Sample { every: 8 }).unwrap();
        assert_eq!(json, r#"{"tier":"sample","every":8}"#);
    }
}
