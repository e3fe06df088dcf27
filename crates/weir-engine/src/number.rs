//! Exact decimals from JSON number text or numeric strings (`"12.50"`).

use rust_decimal::Decimal;

/// Reads JSON-number text (`12.50`, `-3`, `1e3`) as an exact decimal;
/// `None` when it is not a number or needs more than 28 significant digits.
pub(crate) fn parse_decimal(text: &str) -> Option<Decimal> {
    let b = text.as_bytes();
    if let Some(d) = plain_decimal(b) {
        return Some(d);
    }
    let digits_only = b.iter().all(|&c| c.is_ascii_digit() || c == b'.' || c == b'-');
    if b.is_empty() || !is_json_number(b) {
        return None;
    }
    if digits_only {
        Decimal::from_str_exact(text).ok()
    } else {
        let d = Decimal::from_scientific(text).ok()?;
        // from_scientific may round; keep only exact readings.
        let back = d.normalize().to_string();
        let mut want = Vec::new();
        let mut got = Vec::new();
        crate::json::canonical_number(text, &mut want);
        crate::json::canonical_number(&back, &mut got);
        (want == got).then_some(d)
    }
}

/// The decimal digits of `v`, written at the end of `buf`, without the
/// formatting machinery (the hot path writes many numbers).
pub(crate) fn decimal_digits(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// `-?(0|[1-9][0-9]*)(.[0-9]+)?` with at most 28 digits, read directly.
fn plain_decimal(b: &[u8]) -> Option<Decimal> {
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 29 || (digits[0] == b'0' && digits.get(1).is_some_and(u8::is_ascii_digit)) {
        return None;
    }
    let mut mantissa: i128 = 0;
    let mut scale: Option<u32> = None;
    for (i, &c) in digits.iter().enumerate() {
        match c {
            b'0'..=b'9' => {
                mantissa = mantissa * 10 + i128::from(c - b'0');
                if let Some(s) = scale.as_mut() {
                    *s += 1;
                }
            }
            b'.' if scale.is_none() && i > 0 && i + 1 < digits.len() => scale = Some(0),
            _ => return None,
        }
    }
    let mantissa = if negative { -mantissa } else { mantissa };
    Decimal::try_from_i128_with_scale(mantissa, scale.unwrap_or(0)).ok()
}

fn is_json_number(b: &[u8]) -> bool {
    let mut i = 0;
    if b.first() == Some(&b'-') {
        i += 1;
    }
    let int_start = i;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i == int_start || (b[int_start] == b'0' && i - int_start > 1) {
        return false;
    }
    if i < b.len() && b[i] == b'.' {
        i += 1;
        let frac = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == frac {
            return false;
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        let exp = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == exp {
            return false;
        }
    }
    i == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_decimals() {
        let d = |t: &str| parse_decimal(t).map(|d| d.to_string());
        assert_eq!(d("12.50").as_deref(), Some("12.50"));
        assert_eq!(d("-3").as_deref(), Some("-3"));
        assert_eq!(d("1e3").map(|s| s.parse::<Decimal>().unwrap()), Some(Decimal::from(1000)));
        assert_eq!(d("1.5E-2").map(|s| s.parse::<Decimal>().unwrap()), "0.015".parse().ok());
        assert_eq!(parse_decimal("0.1").unwrap() + parse_decimal("0.2").unwrap(), parse_decimal("0.3").unwrap());
        for bad in [
            "",
            "n/a",
            "12.",
            ".5",
            "+1",
            "01",
            "1e",
            "NaN",
            "Infinity",
            " 1",
            "1e400",
            "123456789012345678901234567890123",
        ] {
            assert_eq!(parse_decimal(bad), None, "{bad}");
        }
    }
}
