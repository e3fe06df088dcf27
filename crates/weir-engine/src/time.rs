//! Event time: RFC 3339 text or integer epoch milliseconds in, RFC 3339 UTC
//! with milliseconds out. Times live as `i64` milliseconds since the Unix epoch.

/// 0001-01-01T00:00:00.000Z
pub const TIME_MIN_MS: i64 = -62_135_596_800_000;
/// 9999-12-31T23:59:59.999Z
pub const TIME_MAX_MS: i64 = 253_402_300_799_999;

use weir_contract::{days_from_civil, days_in_month};

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

fn number(b: &[u8], at: usize, len: usize) -> Option<i64> {
    let digits = b.get(at..at + len)?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
}

thread_local! {
    /// The last `YYYY-MM-DDTHH:MM` read on this thread and its minutes since
    /// the epoch (before any offset): a stream's times mostly share their
    /// minute with the time before, so most reads skip the calendar.
    static LAST_MINUTE: std::cell::Cell<(u128, i64)> = const { std::cell::Cell::new((u128::MAX, 0)) };
}

/// Minutes since the epoch of `YYYY-MM-DDTHH:MM` (the first 16 bytes of
/// `b`, at least 16 long), `None` when they are not a valid date and time.
fn date_minutes(b: &[u8]) -> Option<i64> {
    let mut prefix = [0u8; 16];
    prefix.copy_from_slice(b.get(..16)?);
    let prefix = u128::from_le_bytes(prefix);
    let (last, minutes) = LAST_MINUTE.get();
    if last == prefix {
        return Some(minutes);
    }
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' {
        return None;
    }
    let (year, month, day) = (number(b, 0, 4)?, number(b, 5, 2)?, number(b, 8, 2)?);
    let (hour, minute) = (number(b, 11, 2)?, number(b, 14, 2)?);
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) || hour > 23 || minute > 59 {
        return None;
    }
    let minutes = (days_from_civil(year, month, day) * 24 + hour) * 60 + minute;
    // The cache starts at sixteen 0xff bytes, which no text holds.
    LAST_MINUTE.set((prefix, minutes));
    Some(minutes)
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`; fractions finer than a
/// millisecond are truncated toward the past.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[16] != b':' {
        return None;
    }
    let minutes = date_minutes(b)?;
    let second = number(b, 17, 2)?;
    if second > 59 {
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
    let ms = (minutes - offset_min) * 60_000 + second * 1000 + millis;
    (TIME_MIN_MS..=TIME_MAX_MS).contains(&ms).then_some(ms)
}

/// Formats milliseconds as `2026-11-29T14:00:00.000Z`.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let mut out = String::with_capacity(24);
    write_rfc3339_ms(ms, &mut out);
    out
}

thread_local! {
    /// The two minutes last written on this thread with their
    /// `YYYY-MM-DDTHH:MM`, the latest first: rows of one window come
    /// together, each with its start and end, so most writes skip the calendar.
    static LAST_WRITTEN: std::cell::Cell<[(i64, u128); 2]> = const { std::cell::Cell::new([(i64::MIN, 0); 2]) };
}

pub fn write_rfc3339_ms(ms: i64, out: &mut String) {
    let ms = ms.clamp(TIME_MIN_MS, TIME_MAX_MS);
    LAST_TEXTS.with_borrow_mut(|texts| {
        if let Some((_, text)) = texts.iter().find(|(at, _)| *at == ms) {
            out.push_str(text);
            return;
        }
        texts.rotate_right(1);
        let (at, text) = &mut texts[0];
        *at = ms;
        text.clear();
        format_into(ms, text);
        out.push_str(text);
    });
}

thread_local! {
    /// The last four times written on this thread, as text: the rows of a
    /// close share their windows' start and end and the watermark, so most
    /// are copied from here (a check that the text is UTF-8 cost as much as
    /// the formatting).
    static LAST_TEXTS: std::cell::RefCell<[(i64, String); 4]> = const {
        std::cell::RefCell::new([(i64::MIN, String::new()), (i64::MIN, String::new()), (i64::MIN, String::new()), (i64::MIN, String::new())])
    };
}

/// Formats `ms`, within the times' range, through the minute cache.
fn format_into(ms: i64, out: &mut String) {
    let minute = ms.div_euclid(60_000);
    let [latest, before] = LAST_WRITTEN.get();
    let prefix = if latest.0 == minute {
        latest.1
    } else {
        let prefix = if before.0 == minute { before.1 } else { minute_text(minute) };
        LAST_WRITTEN.set([(minute, prefix), latest]);
        prefix
    };
    let in_minute = ms.rem_euclid(60_000);
    let mut b = *b"0000-00-00T00:00:00.000Z";
    b[..16].copy_from_slice(&prefix.to_le_bytes());
    let (s, milli) = (in_minute / 1000, in_minute % 1000);
    b[17] = b'0' + (s / 10) as u8;
    b[18] = b'0' + (s % 10) as u8;
    b[20] = b'0' + (milli / 100) as u8;
    b[21] = b'0' + (milli / 10 % 10) as u8;
    b[22] = b'0' + (milli % 10) as u8;
    out.push_str(std::str::from_utf8(&b).unwrap_or("0000-00-00T00:00:00.000Z"));
}

/// `YYYY-MM-DDTHH:MM` of a minute since the epoch, its bytes in a word.
fn minute_text(minute: i64) -> u128 {
    let days = minute.div_euclid(1440);
    let in_day = minute.rem_euclid(1440);
    let (year, month, day) = civil_from_days(days);
    let (h, m) = (in_day / 60, in_day % 60);
    let mut b = *b"0000-00-00T00:00";
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
    u128::from_le_bytes(b)
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

    /// Times read in a row, sharing their minute or not, with invalid
    /// ones between that share a valid one's minute: each reads as the
    /// calendar says, whatever was read before it.
    #[test]
    fn the_minute_cache_reads_as_the_calendar_does() {
        let seed: u64 = 0x2545_f491;
        println!("seed {seed:#x}");
        let mut state = seed;
        let mut ms: i64 = 1_700_000_000_000;
        for i in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Mostly a few milliseconds on, sometimes a jump of days either way.
            ms += if state.is_multiple_of(50) {
                (state % 400_000_000_000) as i64 - 200_000_000_000
            } else {
                (state % 3_000) as i64
            };
            let text = format_rfc3339_ms(ms);
            assert_eq!(parse_rfc3339_ms(&text), Some(ms), "{i}: {text}");
            let offset = format!("{}+01:30", &text[..23]);
            assert_eq!(parse_rfc3339_ms(&offset), Some(ms - 90 * 60_000), "{i}: {offset}");
            let bad_second = format!("{}60.000Z", &text[..17]);
            assert_eq!(parse_rfc3339_ms(&bad_second), None, "{i}: {bad_second}");
            let bad_zone = format!("{}Q", &text[..23]);
            assert_eq!(parse_rfc3339_ms(&bad_zone), None, "{i}: {bad_zone}");
        }
        assert_eq!(
            parse_rfc3339_ms("2025-02-28T23:59:00Z"),
            parse_rfc3339_ms("2025-03-01T00:00:00Z").map(|t| t - 60_000)
        );
        assert_eq!(parse_rfc3339_ms("2025-02-29T23:59:00Z"), None);
        assert_eq!(parse_rfc3339_ms("\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0:00Z"), None);
    }

    /// Times written again and again among others, more of them than the
    /// text cache holds, read back as themselves and always as the same text.
    #[test]
    fn the_text_cache_gives_each_time_its_own_text() {
        let times = [0, 59_999, 60_000, 1_795_910_428_900, 1_795_910_428_901, -86_400_000, TIME_MAX_MS];
        let mut first: Vec<Option<String>> = vec![None; times.len()];
        let mut state: u64 = 0x9e37_79b9;
        for i in 0..5_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let k = (state % times.len() as u64) as usize;
            let mut text = String::from("row:");
            write_rfc3339_ms(times[k], &mut text);
            let text = &text[4..];
            assert_eq!(parse_rfc3339_ms(text), Some(times[k]), "{i}: {text}");
            let seen = first[k].get_or_insert_with(|| text.to_owned());
            assert_eq!(seen, text, "{i}: {}", times[k]);
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
