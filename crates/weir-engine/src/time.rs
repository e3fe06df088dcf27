//! Event time: RFC 3339 text or integer epoch milliseconds in, RFC 3339 UTC
//! with milliseconds out. Times live as `i64` milliseconds since the Unix epoch.

/// 0001-01-01T00:00:00.000Z
pub const TIME_MIN_MS: i64 = -62_135_596_800_000;
/// 9999-12-31T23:59:59.999Z
pub const TIME_MAX_MS: i64 = 253_402_300_799_999;

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        _ => 28,
    }
}

fn number(b: &[u8], at: usize, len: usize) -> Option<i64> {
    let digits = b.get(at..at + len)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`; fractions finer than a
/// millisecond are truncated toward the past.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (number(b, 0, 4)?, number(b, 5, 2)?, number(b, 8, 2)?);
    let (hour, minute, second) = (number(b, 11, 2)?, number(b, 14, 2)?, number(b, 17, 2)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    let mut i = 19;
    let mut millis = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 3 {
                millis = millis * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let digits = i - start;
        if digits == 0 {
            return None;
        }
        for _ in digits..3 {
            millis *= 10;
        }
    }
    let offset_min = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (h, m) = (number(b, i + 1, 2)?, number(b, i + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let total = h * 60 + m;
            if *sign == b'-' {
                -total
            } else {
                total
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let ms = ((days * 24 + hour) * 60 + minute - offset_min) * 60_000 + second * 1000 + millis;
    (TIME_MIN_MS..=TIME_MAX_MS).contains(&ms).then_some(ms)
}

/// Formats milliseconds as `2026-11-29T14:00:00.000Z`.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let mut out = String::with_capacity(24);
    write_rfc3339_ms(ms, &mut out);
    out
}

pub fn write_rfc3339_ms(ms: i64, out: &mut String) {
    let ms = ms.clamp(TIME_MIN_MS, TIME_MAX_MS);
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s, milli) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
    let mut b = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut v: i64| {
        for i in (at..at + width).rev() {
            b[i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, h);
    put(14, 2, m);
    put(17, 2, s);
    put(20, 3, milli);
    out.push_str(std::str::from_utf8(&b).unwrap_or("0000-00-00T00:00:00.000Z"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("2026-11-29T00:00:28.900Z"), Some(1_795_910_428_900));
        assert_eq!(parse_rfc3339_ms("2026-11-29T01:00:23.250+01:00"), parse_rfc3339_ms("2026-11-29T00:00:23.250Z"));
        assert_eq!(parse_rfc3339_ms("2026-11-28T23:00:00-01:30"), parse_rfc3339_ms("2026-11-29T00:30:00Z"));
        assert_eq!(parse_rfc3339_ms("2026-11-29T00:00:00.1234567Z"), Some(1_795_910_400_123));
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59.999Z"), Some(-1));
        assert_eq!(format_rfc3339_ms(1_795_910_428_900), "2026-11-29T00:00:28.900Z");
        assert_eq!(format_rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00Z").map(format_rfc3339_ms).as_deref(),
            Some("2024-02-29T00:00:00.000Z")
        );
    }

    #[test]
    fn refuses_what_is_not_a_time() {
        for text in [
            "yesterday",
            "2026-11-29",
            "2026-11-29T00:00:00",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T00:00:00.Z",
            "2026-11-29T00:00:00+0100",
            "2026-11-29T00:00:00Zjunk",
            "2026-11-29T00:00:60Z",
            "２０２６-11-29T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339_ms(text), None, "{text}");
        }
    }

    #[test]
    fn civil_round_trip() {
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }
}
