//! Log-linear latency histogram: each power of two is split in four, so a
//! percentile read from it is within 19% of the true value, at 8 bytes a
//! bucket (plain log2 buckets would be off by up to 2x, too coarse to tell
//! a 420 ns reuse fault from a 730 ns one).

/// Sub-buckets per power of two.
pub const SUB: u64 = 4;
const SUB_BITS: u32 = 2;
/// Values up to 2^40 ns (18 minutes) get their own bucket; larger go to the
/// last one (its upper bound is reported as the max, which is exact).
pub const MAX_POW: u32 = 40;
pub const NBUCKETS: usize = ((MAX_POW as u64 - 1) * SUB + SUB) as usize;

/// Index of the most significant set bit (v > 0), without a loop or a
/// `ctlz` instruction, which BPF lacks.
#[inline(always)]
pub fn msb(mut v: u64) -> u32 {
    let mut r = 0;
    if v >> 32 != 0 {
        v >>= 32;
        r += 32;
    }
    if v >> 16 != 0 {
        v >>= 16;
        r += 16;
    }
    if v >> 8 != 0 {
        v >>= 8;
        r += 8;
    }
    if v >> 4 != 0 {
        v >>= 4;
        r += 4;
    }
    if v >> 2 != 0 {
        v >>= 2;
        r += 2;
    }
    if v >> 1 != 0 {
        r += 1;
    }
    r
}

/// Bucket of a value: values below 4 have a bucket each; above, bucket
/// `4*(msb-1) + next two bits`.
#[inline(always)]
pub fn bucket_of(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let m = msb(v);
    let idx = ((m - 1) as u64 * SUB + ((v >> (m - SUB_BITS)) & (SUB - 1))) as usize;
    if idx >= NBUCKETS {
        NBUCKETS - 1
    } else {
        idx
    }
}

/// The values `[lo, hi)` that fall in bucket `idx` (user space).
pub fn bucket_range(idx: usize) -> (u64, u64) {
    let idx = idx as u64;
    if idx < SUB {
        return (idx, idx + 1);
    }
    let m = idx / SUB + 1;
    let sub = idx % SUB;
    let width = 1u64 << (m - SUB_BITS as u64);
    let lo = (1u64 << m) + sub * width;
    (lo, lo + width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 39, (1 << 40) - 1, 1 << 40, u64::MAX]) {
            let b = bucket_of(v);
            assert!(b >= last || v == 0, "monotonic at {v}");
            last = b;
            let (lo, hi) = bucket_range(b);
            if b < NBUCKETS - 1 {
                assert!(lo <= v && v < hi, "{v} in bucket {b} = [{lo}, {hi})");
                // Quarter-octave buckets: width at most a quarter of lo.
                assert!(v < 4 || (hi - lo) * 4 <= lo, "bucket {b} too wide");
            }
        }
        assert_eq!(bucket_of(u64::MAX), NBUCKETS - 1);
    }

    #[test]
    fn msb_matches_leading_zeros() {
        for v in [1u64, 2, 3, 4, 255, 256, 1 << 33, u64::MAX] {
            assert_eq!(msb(v), 63 - v.leading_zeros());
        }
    }
}
