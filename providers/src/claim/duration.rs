//! Go-style durations as CapacityClaims write them (`90s`, `15m`, `1h30m`, `1.5h`, `250ms`),
//! parsed into `std::time::Duration` for `maxProvisioningLatency` and `minLifetime`.

use std::time::Duration;

/// Parses a duration written to `apis::common::DURATION_PATTERN`; `None` when malformed.
pub fn parse(text: &str) -> Option<Duration> {
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let (number, tail) = rest.split_at(number_len);
        let value: f64 = number.parse().ok()?;
        let (unit, tail) = if let Some(t) = tail.strip_prefix("ms") {
            (0.001, t)
        } else if let Some(t) = tail.strip_prefix('s') {
            (1.0, t)
        } else if let Some(t) = tail.strip_prefix('m') {
            (60.0, t)
        } else if let Some(t) = tail.strip_prefix('h') {
            (3600.0, t)
        } else {
            return None;
        };
        total += value * unit;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("15m"), Some(Duration::from_secs(900)));
        assert_eq!(parse("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse("1.5h"), Some(Duration::from_secs(5400)));
        assert_eq!(parse(""), None);
        assert_eq!(parse("15"), None);
        assert_eq!(parse("15d"), None);
    }
}
