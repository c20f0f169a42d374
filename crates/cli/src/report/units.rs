//! Numbers for people, as the report prints them.

/// "0 B", "512 B", "1.5 KiB", "12.0 MiB".
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A power of two as a short size: "1", "512", "4K", "64M".
pub fn size_short(n: u64) -> String {
    const UNITS: [&str; 7] = ["", "K", "M", "G", "T", "P", "E"];
    let mut v = n;
    let mut unit = 0;
    while v >= 1024 && v.is_multiple_of(1024) {
        v /= 1024;
        unit += 1;
    }
    format!("{v}{}", UNITS[unit])
}

/// "1,234,567".
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An axis value: at most 3 decimals, trailing zeros dropped.
pub fn number(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// "1.25 s", "830 ms", "12 µs", "450 ns".
pub fn duration(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// A power-of-two duration, short: "1ns", "512ns", "1.0µs", "4.3s".
pub fn duration_short(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.1}s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.1}ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1}µs", ns as f64 / 1e3)
    } else {
        format!("{ns}ns")
    }
}

/// The time unit of a chart's axis spanning `ns`: (name, ns per unit).
pub fn time_unit(ns: u64) -> (&'static str, f64) {
    if ns >= 10_000_000_000 {
        ("s", 1e9)
    } else if ns >= 10_000_000 {
        ("ms", 1e6)
    } else if ns >= 10_000 {
        ("µs", 1e3)
    } else {
        ("ns", 1.0)
    }
}

/// Percent with one decimal ("12.5%"); "0%" when `total` is 0.
pub fn percent(part: u64, total: u64) -> String {
    if total == 0 {
        return "0%".to_string();
    }
    format!("{:.1}%", part as f64 * 100.0 / total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_as_people_write_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(300 << 20), "300 MiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(size_short(1), "1");
        assert_eq!(size_short(512), "512");
        assert_eq!(size_short(4096), "4K");
        assert_eq!(size_short(1 << 26), "64M");
        assert_eq!(count(0), "0");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.0001), "0");
        assert_eq!(duration(1_250_000_000), "1.25 s");
        assert_eq!(duration(450), "450 ns");
        assert_eq!(duration_short(1024), "1.0µs");
        assert_eq!(time_unit(5_000_000_000).0, "ms");
        assert_eq!(percent(1, 8), "12.5%");
        assert_eq!(percent(1, 0), "0%");
    }
}
