//! Reads the kernel's per-CPU aggregates into one snapshot: per (process,
//! phase, class), the sum over CPUs. Snapshots subtract, for interval tables.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use aya::{maps::PerCpuHashMap, Ebpf};
use faultscope_common::{hist, Class, Stat, StatKey};

#[derive(Clone, Default)]
pub struct Snapshot {
    pub stats: BTreeMap<StatKey, Stat>,
}

impl Snapshot {
    pub fn read(bpf: &Ebpf) -> Result<Snapshot> {
        let m = bpf.map("STATS").ok_or_else(|| anyhow!("no STATS map"))?;
        let map: PerCpuHashMap<_, StatKey, Stat> = PerCpuHashMap::try_from(m)?;
        let mut stats = BTreeMap::new();
        for item in map.iter() {
            let (key, values) = item?;
            let mut sum = Stat::ZERO;
            for v in values.iter() {
                sum.merge(v);
            }
            stats.insert(key, sum);
        }
        Ok(Snapshot { stats })
    }

    pub fn pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.stats.keys().map(|k| k.tgid).collect();
        v.dedup();
        v
    }

    /// One class of one process, summed over phases (`phase == None`) or in
    /// one phase.
    pub fn get_in(&self, tgid: u32, phase: Option<u32>, class: Class) -> Option<Stat> {
        let mut out: Option<Stat> = None;
        for (k, v) in self.of(tgid) {
            if k.class == class as u16 && phase.is_none_or(|p| p == u32::from(k.phase)) {
                out.get_or_insert(Stat::ZERO).merge(v);
            }
        }
        out
    }

    pub fn get(&self, tgid: u32, class: Class) -> Option<Stat> {
        self.get_in(tgid, None, class)
    }

    /// The entries of one process (the map is ordered by tgid first).
    fn of(&self, tgid: u32) -> impl Iterator<Item = (&StatKey, &Stat)> {
        let lo = StatKey { tgid, ..StatKey::default() };
        self.stats.range(lo..).take_while(move |(k, _)| k.tgid == tgid)
    }

    /// Phase keys in which the process has any count.
    pub fn phases_of(&self, tgid: u32) -> Vec<u32> {
        let mut v: Vec<u32> = self.of(tgid).map(|(k, _)| u32::from(k.phase)).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The snapshot without one phase of one process.
    pub fn without_phase(mut self, tgid: u32, phase: u32) -> Snapshot {
        self.stats.retain(|k, _| !(k.tgid == tgid && u32::from(k.phase) == phase));
        self
    }

    /// `self - earlier`: what happened between two snapshots.
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let mut stats = BTreeMap::new();
        for (k, v) in &self.stats {
            let mut d = *v;
            if let Some(e) = earlier.stats.get(k) {
                d.count -= e.count.min(d.count);
                d.sum_ns -= e.sum_ns.min(d.sum_ns);
                for (a, b) in d.hist.iter_mut().zip(e.hist.iter()) {
                    *a -= (*b).min(*a);
                }
                // The max of an interval is not recoverable from two maxima;
                // keep it only when it grew.
                if e.max_ns >= d.max_ns {
                    d.max_ns = 0;
                }
            }
            if d.count > 0 {
                stats.insert(*k, d);
            }
        }
        Snapshot { stats }
    }
}

/// Latency summary of a timed class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Latency {
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub mean_ns: u64,
}

pub fn latency(s: &Stat) -> Option<Latency> {
    let n = s.timed();
    if n == 0 {
        return None;
    }
    Some(Latency {
        p50_ns: percentile(&s.hist, 0.50, s.max_ns),
        p99_ns: percentile(&s.hist, 0.99, s.max_ns),
        max_ns: s.max_ns,
        mean_ns: s.sum_ns / n,
    })
}

/// The q-quantile of a log-linear histogram, interpolated inside its bucket
/// and never above the exact maximum (when known).
pub fn percentile(h: &[u64], q: f64, max_ns: u64) -> u64 {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut cum = 0u64;
    for (i, &c) in h.iter().enumerate() {
        if c == 0 {
            continue;
        }
        if cum + c >= rank {
            let (lo, hi) = hist::bucket_range(i);
            let frac = (rank - cum) as f64 / c as f64;
            let v = lo as f64 + frac * (hi - lo) as f64;
            let v = v.floor() as u64;
            return if max_ns > 0 { v.min(max_ns) } else { v };
        }
        cum += c;
    }
    max_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_of(vals: &[u64]) -> Stat {
        let mut s = Stat::ZERO;
        for v in vals {
            s.record(Some(*v));
        }
        s
    }

    #[test]
    fn percentiles_within_bucket_error() {
        // 1000 values 1..=1000 ns: p50 = 500, p99 = 990.
        let vals: Vec<u64> = (1..=1000).collect();
        let s = stat_of(&vals);
        let l = latency(&s).unwrap();
        assert!((l.p50_ns as f64 - 500.0).abs() / 500.0 < 0.2, "{l:?}");
        assert!((l.p99_ns as f64 - 990.0).abs() / 990.0 < 0.2, "{l:?}");
        assert_eq!(l.max_ns, 1000);
        assert_eq!(l.mean_ns, 500);
    }

    #[test]
    fn percentile_never_exceeds_max() {
        let s = stat_of(&[420; 100]);
        let l = latency(&s).unwrap();
        assert!(l.p50_ns <= 420 && l.p50_ns >= 384, "{l:?}");
        assert_eq!(l.p99_ns.min(420), l.p99_ns);
    }

    #[test]
    fn untimed_class_has_no_latency() {
        let mut s = Stat::ZERO;
        s.record(None);
        s.record(None);
        assert_eq!(s.count, 2);
        assert!(latency(&s).is_none());
    }

    #[test]
    fn per_cpu_merge_and_since() {
        let a = stat_of(&[100, 200]);
        let b = stat_of(&[300]);
        let mut m = Stat::ZERO;
        m.merge(&a);
        m.merge(&b);
        assert_eq!(m.count, 3);
        assert_eq!(m.max_ns, 300);
        assert_eq!(m.sum_ns, 600);

        let key = StatKey { tgid: 7, phase: 0, class: Class::Faults as u16 };
        let early = Snapshot { stats: [(key, a)].into() };
        let late = Snapshot { stats: [(key, m)].into() };
        let d = late.since(&early);
        let ds = d.stats[&key];
        assert_eq!(ds.count, 1);
        assert_eq!(ds.sum_ns, 300);
        assert_eq!(ds.max_ns, 300);
        assert_eq!(late.get(7, Class::Faults).unwrap().count, 3);
        assert!(late.get(7, Class::Copy).is_none());
        assert!(late.get(8, Class::Faults).is_none());
    }
}
