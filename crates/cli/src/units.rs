//! Numbers for people, for every command that prints them: bytes in
//! KiB/MiB/GiB, counts, durations, and the report's chart axes. Each
//! command keeps its own precision (`stats` prints `1.50 KiB`, the report
//! `1.5 KiB`); the JSON outputs keep exact numbers.

/// How many decimals a scaled number (`1.5`, `12.3`, `850`) shows.
#[derive(Clone, Copy, Debug)]
pub enum Decimals {
    /// Always this many: `1.50`, `85.83`, `300.00` with 2 (`stats`);
    /// `300.0` with 1 (`record`'s summary).
    Fixed(usize),
    /// Three significant digits (at least the integer part): `1.50`,
    /// `12.3`, `123` (`top`, `leaks`, `diff`).
    Three,
    /// One decimal below 100, none above: `1.5`, `12.3`, `123` (the
    /// report).
    OneBelow100,
}

/// `value` written with `decimals`.
fn scaled(value: f64, decimals: Decimals) -> String {
    match decimals {
        Decimals::Fixed(places) => format!("{value:.places$}"),
        Decimals::Three if value < 10.0 => format!("{value:.2}"),
        Decimals::Three | Decimals::OneBelow100 if value < 100.0 => format!("{value:.1}"),
        Decimals::Three | Decimals::OneBelow100 => format!("{value:.0}"),
    }
}

/// Bytes with binary prefixes: `512 B`, then `1.50 KiB`, `1.5 KiB`,
/// `12.0 MiB`... as `decimals` says.
pub fn bytes(n: u64, decimals: Decimals) -> String {
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
    format!("{} {}", scaled(value, decimals), UNITS[unit])
}

/// Three significant digits of `value` (at least 1): `1.23`, `12.3`, `123`.
fn three_digits(value: f64) -> String {
    scaled(value, Decimals::Three)
}

/// Exact below 10,000; above, three significant digits and k, M, G or T:
/// `9999`, `12.3 k`, `40.0 M` (`stats`).
pub fn count(n: u64) -> String {
    if n < 10_000 {
        return n.to_string();
    }
    let mut value = n as f64;
    for unit in ["k", "M", "G", "T"] {
        value /= 1000.0;
        // Rounding may carry to 1000: then the next unit.
        if three_digits(value).parse::<f64>().unwrap_or(value) < 1000.0 {
            return format!("{} {unit}", three_digits(value));
        }
    }
    format!("{} P", three_digits(value / 1000.0))
}

/// Exact below 10,000; above, k, M or G without a space: `999`, `12.3k`,
/// `40.0M`, `123M` (`top`, `leaks`, `diff`).
pub fn count_compact(n: u64) -> String {
    if n < 10_000 {
        return n.to_string();
    }
    let (value, unit) = if n < 1_000_000 {
        (n as f64 / 1e3, "k")
    } else if n < 1_000_000_000 {
        (n as f64 / 1e6, "M")
    } else {
        (n as f64 / 1e9, "G")
    };
    format!("{}{unit}", scaled(value, Decimals::OneBelow100))
}

/// Every digit, in groups of three: `1,234,567`.
pub fn thousands(n: u64) -> String {
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

/// `850 ns`, `12.3 µs`, `5.00 ms`, `1.23 s`, `2 min 3 s`, `1 h 2 min`
/// (`stats`).
pub fn duration(ns: u64) -> String {
    if ns < 1000 {
        return format!("{ns} ns");
    }
    if ns < 60_000_000_000 {
        for (scale, unit) in [(1e3, "µs"), (1e6, "ms"), (1e9, "s")] {
            let text = three_digits(ns as f64 / scale);
            // Rounding may carry to 1000 (999.9 µs): then the next unit.
            if unit == "s" || text.parse::<f64>().unwrap_or(0.0) < 1000.0 {
                return format!("{text} {unit}");
            }
        }
    }
    let s = ns / 1_000_000_000;
    if s < 3600 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{} h {} min", s / 3600, s % 3600 / 60)
    }
}

/// `1.25 s`, `830.0 ms`, `12.0 µs`, `450 ns` (the report).
pub fn duration_decimal(ns: u64) -> String {
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

/// `1.25 s`, `830 ms` (`record`'s summary).
pub fn duration_ms(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else {
        format!("{} ms", ns / 1_000_000)
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
    fn counts() {
        assert_eq!(count(0), "0");
        assert_eq!(count(9_999), "9999");
        assert_eq!(count(12_345), "12.3 k");
        assert_eq!(count(123_456), "123 k");
        assert_eq!(count(999_999), "1.00 M");
        assert_eq!(count(40_000_000), "40.0 M");
        assert_eq!(count(1_230_000_000), "1.23 G");
        assert_eq!(count_compact(9999), "9999");
        assert_eq!(count_compact(12_345), "12.3k");
        assert_eq!(count_compact(40_000_000), "40.0M");
        assert_eq!(count_compact(123_000_000), "123M");
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn byte_units() {
        // stats: indicatif's HumanBytes wrote these before.
        assert_eq!(bytes(104, Decimals::Fixed(2)), "104 B");
        assert_eq!(bytes(1536, Decimals::Fixed(2)), "1.50 KiB");
        assert_eq!(bytes(90_000_000, Decimals::Fixed(2)), "85.83 MiB");
        assert_eq!(bytes(500 << 30, Decimals::Fixed(2)), "500.00 GiB");
        assert_eq!(bytes(1_500_000_000_000, Decimals::Fixed(2)), "1.36 TiB");
        // top, leaks, diff.
        assert_eq!(bytes(0, Decimals::Three), "0 B");
        assert_eq!(bytes(1023, Decimals::Three), "1023 B");
        assert_eq!(bytes(1536, Decimals::Three), "1.50 KiB");
        assert_eq!(bytes(1310720, Decimals::Three), "1.25 MiB");
        assert_eq!(bytes(50 << 20, Decimals::Three), "50.0 MiB");
        assert_eq!(bytes(500 << 30, Decimals::Three), "500 GiB");
        // the report.
        assert_eq!(bytes(0, Decimals::OneBelow100), "0 B");
        assert_eq!(bytes(1023, Decimals::OneBelow100), "1023 B");
        assert_eq!(bytes(1536, Decimals::OneBelow100), "1.5 KiB");
        assert_eq!(bytes(300 << 20, Decimals::OneBelow100), "300 MiB");
        assert_eq!(bytes(u64::MAX, Decimals::OneBelow100), "16.0 EiB");
        // record.
        assert_eq!(bytes(1536, Decimals::Fixed(1)), "1.5 KiB");
        assert_eq!(bytes(12 << 20, Decimals::Fixed(1)), "12.0 MiB");
        assert_eq!(bytes(300 << 20, Decimals::Fixed(1)), "300.0 MiB");
    }

    #[test]
    fn durations() {
        assert_eq!(duration(0), "0 ns");
        assert_eq!(duration(850), "850 ns");
        assert_eq!(duration(12_345), "12.3 µs");
        assert_eq!(duration(5_000_000), "5.00 ms");
        assert_eq!(duration(999_999), "1.00 ms");
        assert_eq!(duration(1_234_000_000), "1.23 s");
        assert_eq!(duration(123_000_000_000), "2 min 3 s");
        assert_eq!(duration(3_720_000_000_000), "1 h 2 min");
        assert_eq!(duration_decimal(1_250_000_000), "1.25 s");
        assert_eq!(duration_decimal(830_000_000), "830.0 ms");
        assert_eq!(duration_decimal(450), "450 ns");
        assert_eq!(duration_ms(1_250_000_000), "1.25 s");
        assert_eq!(duration_ms(830_400_000), "830 ms");
        assert_eq!(duration_short(1024), "1.0µs");
    }

    #[test]
    fn report_axes() {
        assert_eq!(size_short(1), "1");
        assert_eq!(size_short(512), "512");
        assert_eq!(size_short(4096), "4K");
        assert_eq!(size_short(1 << 26), "64M");
        assert_eq!(number(2.5), "2.5");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.0001), "0");
        assert_eq!(time_unit(5_000_000_000).0, "ms");
        assert_eq!(percent(1, 8), "12.5%");
        assert_eq!(percent(1, 0), "0%");
    }
}
