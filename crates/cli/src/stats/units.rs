//! Human units for the `stats` table: bytes in KiB/MiB/GiB (indicatif's
//! binary prefixes), counts with k/M/G, durations from ns to hours. The
//! JSON keeps exact numbers.

use indicatif::HumanBytes;

/// `104 B`, `1.50 KiB`, `85.80 MiB`.
pub fn bytes(n: u64) -> String {
    HumanBytes(n).to_string()
}

/// Three significant digits of `value` (at least 1): `1.23`, `12.3`, `123`.
fn three_digits(value: f64) -> String {
    if value < 10.0 {
        format!("{value:.2}")
    } else if value < 100.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    }
}

/// Exact below 10,000; above, three significant digits and k, M, G or T:
/// `9999`, `12.3 k`, `40.0 M`.
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

/// `850 ns`, `12.3 µs`, `5.00 ms`, `1.23 s`, `2 min 3 s`, `1 h 2 min`.
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
    }

    #[test]
    fn byte_units() {
        assert_eq!(bytes(104), "104 B");
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(90_000_000), "85.83 MiB");
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
    }
}
