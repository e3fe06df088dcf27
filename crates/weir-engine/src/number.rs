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
        canonical_number(text, &mut want);
        canonical_number(&back, &mut got);
        (want == got).then_some(d)
    }
}

/// Writes `d` as its `Display` does (`-0.50`, `12`, `0.007`: the scale's
/// digits after the point, `-` whenever the sign is negative), without the
/// formatting machinery: rows write a decimal for each sum.
pub(crate) fn write_decimal(d: &Decimal, out: &mut String) {
    let scale = d.scale() as usize;
    // 96 bits are at most 29 digits; at most 28 after the point, and one before.
    let mut buf = [b'0'; 40];
    let mut at = buf.len();
    let mantissa = d.mantissa().unsigned_abs();
    if let Ok(v) = u64::try_from(mantissa) {
        let mut word = [0u8; 20];
        let digits = decimal_digits(v, &mut word);
        at -= digits.len();
        buf[at..].copy_from_slice(digits);
    } else {
        let mut v = mantissa;
        while v != 0 {
            at -= 1;
            buf[at] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    }
    // At least one digit before the point: the zeros are there already.
    at = at.min(buf.len() - scale - 1);
    if d.is_sign_negative() {
        out.push('-');
    }
    let digits = &buf[at..];
    let whole = digits.len() - scale;
    // ASCII digits pushed as they are: checking them as UTF-8 first cost
    // more than the push (BENCHMARKS.md, "A close's arrays kept").
    out.extend(digits[..whole].iter().map(|&d| char::from(d)));
    if scale > 0 {
        out.push('.');
        out.extend(digits[whole..].iter().map(|&d| char::from(d)));
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

/// Writes a JSON number's value in one spelling: significant digits without
/// leading or trailing zeros, then the power of ten (`12.50` -> `125e-1`).
pub(crate) fn canonical_number(text: &str, out: &mut Vec<u8>) {
    let b = text.as_bytes();
    // Fast path: a plain decimal with a non-zero last fractional digit and a
    // non-zero integer part (`86.24`, `-3.5`) is `8624e-2`, read off directly.
    if let Some(dot) = b.iter().position(|&c| c == b'.') {
        let frac = &b[dot + 1..];
        let (negative, int) = match b[..dot].split_first() {
            Some((b'-', rest)) => (true, rest),
            _ => (false, &b[..dot]),
        };
        if frac.last().is_some_and(|&c| c != b'0' && c.is_ascii_digit())
            && frac.iter().all(u8::is_ascii_digit)
            && int.first().is_some_and(|&c| c != b'0')
        {
            if negative {
                out.push(b'-');
            }
            out.extend_from_slice(int);
            out.extend_from_slice(frac);
            out.push(b'e');
            push_i64(-(frac.len() as i64), out);
            return;
        }
    }
    canonical_number_slow(text, out);
}

fn canonical_number_slow(text: &str, out: &mut Vec<u8>) {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(at) => (&body[..at], body[at + 1..].parse::<i64>().unwrap_or(0)),
        None => (body, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mark = out.len();
    if negative {
        out.push(b'-');
    }
    let digits_at = out.len();
    for d in int_part.bytes().chain(frac_part.bytes()) {
        if d != b'0' || out.len() > digits_at {
            out.push(d);
        }
    }
    let mut exp = exponent - frac_part.len() as i64;
    while out.len() > digits_at && out.last() == Some(&b'0') {
        out.pop();
        exp += 1;
    }
    if out.len() == digits_at {
        out.truncate(mark);
        out.push(b'0');
        return;
    }
    out.push(b'e');
    push_i64(exp, out);
}

/// Appends an integer in decimal without the formatting machinery.
fn push_i64(n: i64, out: &mut Vec<u8>) {
    if n < 0 {
        out.push(b'-');
    }
    let mut buf = [0u8; 20];
    out.extend_from_slice(decimal_digits(n.unsigned_abs(), &mut buf));
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
    if digits.len() <= 19 {
        return short_decimal(negative, digits);
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

/// [`plain_decimal`] for at most 19 characters: at most 19 digits, below
/// 10^19, so they add up in a `u64` without a check.
fn short_decimal(negative: bool, digits: &[u8]) -> Option<Decimal> {
    let mut mantissa: u64 = 0;
    let mut point = None;
    for (i, &c) in digits.iter().enumerate() {
        let digit = c.wrapping_sub(b'0');
        if digit <= 9 {
            mantissa = mantissa * 10 + u64::from(digit);
        } else if c == b'.' && point.is_none() && i > 0 && i + 1 < digits.len() {
            point = Some(i);
        } else {
            return None;
        }
    }
    let scale = point.map_or(0, |at| digits.len() - at - 1) as u32;
    // A zero is positive, as the wide reading leaves it.
    let (lo, mid) = (mantissa as u32, (mantissa >> 32) as u32);
    Some(Decimal::from_parts(lo, mid, 0, negative && mantissa != 0, scale))
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
    use proptest::prelude::*;

    #[test]
    fn decimals_are_written_with_their_scale_and_sign() {
        for (lo, negative, scale, want) in [
            (0, false, 0, "0"),
            (0, false, 2, "0.00"),
            (1, true, 2, "-0.01"),
            (5, false, 3, "0.005"),
            (12345, true, 2, "-123.45"),
            (7, false, 0, "7"),
        ] {
            let d = Decimal::from_parts(lo, 0, 0, negative, scale);
            let mut got = String::new();
            write_decimal(&d, &mut got);
            assert_eq!((got.as_str(), d.to_string().as_str()), (want, want));
        }
        // A zero that kept a negative sign (as arithmetic can leave one).
        let mut zero = Decimal::from_parts(0, 0, 0, false, 2);
        zero.set_sign_negative(true);
        let mut got = String::new();
        write_decimal(&zero, &mut got);
        assert_eq!(got, zero.to_string());
    }

    proptest! {
        #[test]
        fn decimals_are_written_as_display_writes_them(
            lo in any::<u32>(), mid in any::<u32>(), hi in any::<u32>(),
            small in any::<bool>(), negative in any::<bool>(), scale in 0u32..=28,
        ) {
            // Small mantissas (one word) as often as wide ones; zeros and negative zero too.
            let (mid, hi) = if small { (0, 0) } else { (mid, hi) };
            let d = Decimal::from_parts(lo % if small && lo % 3 == 0 { 10 } else { u32::MAX }, mid, hi, negative, scale);
            let mut got = String::new();
            write_decimal(&d, &mut got);
            prop_assert_eq!(got, d.to_string());
        }
    }

    proptest! {
        #[test]
        fn short_decimals_read_as_the_exact_reading_does(
            digits in "[0-9]{1,19}", point in 0usize..20, negative in any::<bool>(),
        ) {
            let mut text = String::new();
            if negative {
                text.push('-');
            }
            // A point inside the digits, or none.
            for (i, c) in digits.chars().enumerate() {
                if i == point && i > 0 {
                    text.push('.');
                }
                text.push(c);
            }
            let want = Decimal::from_str_exact(&text).ok().filter(|_| !digits.starts_with('0') || digits.len() == 1 || point == 1);
            let got = parse_decimal(&text);
            prop_assert_eq!(got.map(|d| (d, d.to_string())), want.map(|d| (d, d.to_string())), "{}", text);
        }
    }

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
