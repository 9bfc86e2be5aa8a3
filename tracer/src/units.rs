//! Units: sizes as the command line takes them and as the tables write
//! them, and the page sizes the fault path works in.

/// The base page (x86-64, and arm64 as Debian builds it).
pub const PAGE: u64 = 4096;
/// A PMD-mapped THP.
pub const PMD_SIZE: u64 = 2 << 20;

/// `64K`, `2M`, `1G`, `4096`: a positive number of bytes with an optional
/// binary suffix (K, M, G; `KiB`, `MB` and the like too).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        None => (s, 1u64),
        Some((i, _)) => {
            let m = match s[i..].to_ascii_uppercase().trim_end_matches(['B', 'I']) {
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "" => 1,
                other => return Err(format!("unknown size suffix {other:?} in {s:?}")),
            };
            (&s[..i], m)
        }
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    n.checked_mul(mult).filter(|v| *v > 0).ok_or_else(|| format!("bad size {s:?}"))
}

/// `64K`, `2M`, `1G`: the largest unit that divides `bytes` (KiB otherwise,
/// rounded down), as folio and mapping sizes are written.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b.is_multiple_of(1 << 30) => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b.is_multiple_of(1 << 20) => format!("{}M", b >> 20),
        b => format!("{}K", b >> 10),
    }
}

/// [`size`], or `?` for a size not known (0).
pub fn size_or_unknown(bytes: u64) -> String {
    if bytes == 0 {
        "?".into()
    } else {
        size(bytes)
    }
}

/// `1.5 MiB`: an amount of memory, with one decimal.
pub fn bytes(b: u64) -> String {
    match b {
        0..=1023 => format!("{b} B"),
        1024..=1_048_575 => format!("{:.1} KiB", b as f64 / 1024.0),
        1_048_576..=1_073_741_823 => format!("{:.1} MiB", b as f64 / 1_048_576.0),
        _ => format!("{:.2} GiB", b as f64 / 1_073_741_824.0),
    }
}

/// A bad number of seconds (negative, NaN, infinite, too large for a
/// Duration) is refused before anything is attached.
/// A count with thousands separators: `4,173`.
pub fn count(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::with_capacity(d.len() + d.len() / 3);
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A time in the unit that fits, three significant digits: `730ns`,
/// `4.60us`, `7.44ms`, `1.20s`.
pub fn ns(ns: u64) -> String {
    let (v, unit) = match ns {
        0..=999 => return format!("{ns}ns"),
        1_000..=999_999 => (ns as f64 / 1e3, "us"),
        1_000_000..=999_999_999 => (ns as f64 / 1e6, "ms"),
        _ => (ns as f64 / 1e9, "s"),
    };
    match v {
        v if v < 10.0 => format!("{v:.2}{unit}"),
        v if v < 100.0 => format!("{v:.1}{unit}"),
        v => format!("{v:.0}{unit}"),
    }
}

/// The shortest `--interval`: one interval line per process per 10 ms is
/// already more than a terminal shows, and shorter ones are only the
/// collector's own cost.
pub const MIN_INTERVAL_S: f64 = 0.01;

/// A time in seconds from a flag: from `min` (above 0, so that a value
/// such as 1e-300 never rounds to no time at all) to 1e9.
pub fn seconds(
    flag: &str,
    v: Option<f64>,
    min: f64,
) -> Result<Option<std::time::Duration>, crate::error::Refusal> {
    debug_assert!(min > 0.0);
    match v {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= min && s <= 1e9 => Ok(Some(std::time::Duration::from_secs_f64(s))),
        Some(s) => {
            Err(crate::error::Refusal::new(format!("{flag} {s}: give a number of seconds from {min} to 1e9")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_times_read_as_people_write_them() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(4173), "4,173");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(ns(730), "730ns");
        assert_eq!(ns(4600), "4.60us");
        assert_eq!(ns(7_437_900), "7.44ms");
        assert_eq!(ns(123_456), "123us");
        assert_eq!(ns(60_000_000_000), "60.0s");
    }

    #[test]
    fn sizes_read_and_write_back() {
        for (s, v) in [("4K", 4096), ("64k", 65536), ("2M", 2 << 20), ("1GiB", 1 << 30), ("4096", 4096)] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        for bad in ["0", "", "K", "12Q", "-1", "99999999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(
            (size(4096), size(64 << 10), size(2 << 20), size(2 << 30)),
            ("4K".into(), "64K".into(), "2M".into(), "2G".into())
        );
        assert_eq!(size_or_unknown(0), "?");
        assert_eq!(bytes(1536 << 10), "1.5 MiB");
    }
}
