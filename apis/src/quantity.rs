//! Resource quantities (`80Gi`, `1.5`, `500m`, `1e3`) checked the way Kubernetes'
//! `resource.Quantity` can hold them, before any reaches the CEL evaluator: a value must be a
//! whole number of nano-units (Kubernetes' finest scale) no larger than 2^63-1 units. Where
//! Kubernetes silently caps a larger value at 2^63-1 or rounds a finer one up, Flotilla refuses
//! it instead: a capped `1e400` would compare wrongly in a selector, and kube-cel's quantity
//! arithmetic overflows on such values.

/// The largest magnitude accepted, in units (Kubernetes' cap, `math.MaxInt64`).
pub const MAX_UNITS: i128 = i64::MAX as i128;

/// Why a quantity is refused, as a sentence to put after the field name.
pub fn check(text: &str) -> Result<(), String> {
    let q = parse(text)?;
    // nanos = digits * 10^(scale + 9) * 2^binary, which must be a whole number.
    let shift = q.scale + 9;
    let too_large =
        || format!("{text:?} is out of range: a quantity's magnitude must be at most {MAX_UNITS} (2^63-1) units");
    if q.digits == 0 {
        return Ok(());
    }
    let mut nanos = q.digits.checked_mul(1i128 << q.binary).ok_or_else(too_large)?;
    if shift >= 0 {
        let factor = u32::try_from(shift).ok().and_then(|s| 10i128.checked_pow(s)).ok_or_else(too_large)?;
        nanos = nanos.checked_mul(factor).ok_or_else(too_large)?;
    } else {
        let divisor = u32::try_from(-shift).ok().and_then(|s| 10i128.checked_pow(s));
        match divisor {
            Some(d) if nanos % d == 0 => nanos /= d,
            _ => {
                return Err(format!("{text:?} is more precise than a quantity can be: the finest step is 1n (10^-9)"));
            }
        }
    }
    if nanos > MAX_UNITS * 1_000_000_000 {
        return Err(too_large());
    }
    Ok(())
}

/// [`check`], and refuses a minus sign (device capacities, sizes): `-0` included, since it
/// says something no capacity means.
pub fn check_non_negative(text: &str) -> Result<(), String> {
    check(text)?;
    if text.trim_start().starts_with('-') {
        return Err(format!("{text:?} is negative: a capacity is zero or more"));
    }
    Ok(())
}

/// A quantity as `digits * 10^scale * 2^binary`, sign dropped (ranges are symmetric).
struct Parsed {
    digits: i128,
    scale: i64,
    binary: u32,
}

fn parse(text: &str) -> Result<Parsed, String> {
    let bad = || format!("{text:?} is not a quantity: write a number with an optional suffix (80Gi, 16G, 500m, 1e3)");
    let s = text.strip_prefix(['+', '-']).unwrap_or(text);
    let end = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(bad());
    }
    let (mut scale, binary): (i64, u32) = match suffix {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = exp[1..].strip_prefix(['+', '-']).unwrap_or(&exp[1..]);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            // Anything past 10^±1000 is out of range whatever the digits are.
            let e: i64 = exp[1..].parse().unwrap_or(if exp[1..].starts_with('-') { -1000 } else { 1000 });
            (e.clamp(-1000, 1000), 0)
        }
        _ => return Err(bad()),
    };
    // Significant digits only: leading zeros of the whole part, trailing zeros of the fraction.
    let frac = frac.trim_end_matches('0');
    let all = format!("{int}{frac}");
    let trimmed = all.trim_start_matches('0');
    scale -= frac.len() as i64;
    let significant = trimmed.trim_end_matches('0');
    scale += (trimmed.len() - significant.len()) as i64;
    if significant.is_empty() {
        return Ok(Parsed { digits: 0, scale: 0, binary: 0 });
    }
    if significant.len() > 30 {
        return Err(format!(
            "{text:?} has {} significant digits; a quantity holds at most 2^63-1 units in steps of 1n",
            significant.len()
        ));
    }
    let digits: i128 = significant.parse().map_err(|_| bad())?;
    Ok(Parsed { digits, scale, binary })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_quantities_pass() {
        for q in ["80Gi", "141Gi", "1", "0", "-0", "1.5", "500m", "1e3", "1E3", "16G", "2Ei", "7Ei", "1n", "0.5Ki"] {
            assert_eq!(check(q), Ok(()), "{q}");
        }
        assert_eq!(check("9223372036854775807"), Ok(()));
        assert_eq!(check("-9223372036854775807"), Ok(()));
    }

    #[test]
    fn what_overflows_or_is_too_fine_is_refused() {
        for q in ["1e400", "1e50", "8Ei", "9223372036854775808", "123456789012345678901234567890123", "1e19"] {
            let e = check(q).err().unwrap_or_default();
            assert!(e.contains("out of range") || e.contains("significant digits"), "{q}: {e:?}");
        }
        assert!(check("0.1n").is_err_and(|e| e.contains("more precise")));
        assert!(check("1e-10").is_err_and(|e| e.contains("more precise")));
        assert_eq!(check("1e-9"), Ok(()));
        assert_eq!(
            check("1e-400"),
            Err("\"1e-400\" is more precise than a quantity can be: the finest step is 1n (10^-9)".into())
        );
        assert_eq!(check("0e400"), Ok(()), "zero is zero at any scale");
    }

    #[test]
    fn syntax_errors_and_signs() {
        for q in ["", "Gi", "1.2.3", "1x", "1e", "1e+", "--1", "1 Gi", "."] {
            assert!(check(q).is_err_and(|e| e.contains("not a quantity")), "{q}");
        }
        assert!(check_non_negative("-1Gi").is_err_and(|e| e.contains("negative")));
        assert!(check_non_negative("-0").is_err_and(|e| e.contains("negative")));
        assert_eq!(check_non_negative("+1Gi"), Ok(()));
        assert_eq!(check_non_negative("0"), Ok(()));
    }
}
