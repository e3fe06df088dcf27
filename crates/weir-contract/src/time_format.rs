//! How a contract's event time is written (`event_time_format`,
//! `event_time_zone`, SPEC.md section 2), and reading one value in that
//! form. Patterns are chrono's strftime syntax, compiled once when the
//! contract is read; zones come from the IANA database that `chrono-tz`
//! ships.
//!
//! Invariant: a [`Pattern`] that exists can yield a date and a time of day
//! (checked by formatting a known instant with it and reading it back), so
//! a value that does not match is the event's fault, never the contract's.

use std::fmt::Write as _;
use std::sync::Arc;

use chrono::format::{Item, Parsed, StrftimeItems};
use chrono::{DateTime, Datelike, MappedLocalTime, NaiveDateTime, Offset, TimeZone};

/// `event_time_format`.
#[derive(Debug, Clone)]
pub enum TimeFormat {
    /// RFC 3339 text, or an integer of epoch milliseconds.
    Auto,
    /// An integer, or a string of digits with an optional leading minus,
    /// in this unit; rounded down to the millisecond.
    Epoch(EpochUnit),
    Pattern(Pattern),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EpochUnit {
    Seconds,
    Millis,
    Micros,
    Nanos,
}

impl EpochUnit {
    fn name(self) -> &'static str {
        match self {
            EpochUnit::Seconds => "epoch_s",
            EpochUnit::Millis => "epoch_ms",
            EpochUnit::Micros => "epoch_us",
            EpochUnit::Nanos => "epoch_ns",
        }
    }

    /// Milliseconds from a whole number of this unit, rounded down.
    pub fn to_millis(self, n: i128) -> Option<i64> {
        let ms = match self {
            EpochUnit::Seconds => n.checked_mul(1000)?,
            EpochUnit::Millis => n,
            EpochUnit::Micros => n.div_euclid(1000),
            EpochUnit::Nanos => n.div_euclid(1_000_000),
        };
        i64::try_from(ms).ok()
    }
}

/// Days since 1970-01-01 of a date of the proleptic Gregorian calendar
/// (month 1 to 12; any day, counted on from the month's first).
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The number written in `width` (2, 3 or 4) digits at `at` of `text`.
fn digits(text: &[u8], at: usize, width: usize) -> i64 {
    let d = |i: usize| i64::from(text[at + i].wrapping_sub(b'0'));
    match width {
        2 => d(0) * 10 + d(1),
        3 => d(0) * 100 + d(1) * 10 + d(2),
        _ => d(0) * 1000 + d(1) * 100 + d(2) * 10 + d(3),
    }
}

/// The days of a month (1 to 12) of a year of the Gregorian calendar.
pub fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        _ => 28,
    }
}

/// A strftime pattern, compiled.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub text: String,
    items: Arc<[Item<'static>]>,
    /// For a pattern of fixed-width numbers and literal bytes only, where
    /// each is in the text: read directly, and by chrono only when a text
    /// does not fit it (so every text reads as chrono reads it).
    layout: Option<Arc<Layout>>,
}

/// A pattern of `%Y` (4 digits), `%m %d %H %M %S` (2 digits), `%.3f` (a dot
/// and 3 digits) and literal bytes, at fixed places.
#[derive(Debug)]
struct Layout {
    len: usize,
    literals: Vec<(usize, u8)>,
    /// Each field's place and width, in the order of [`Layout::FIELDS`].
    fields: [Option<(usize, usize)>; 7],
    /// For a layout of at most 32 bytes: the same, by 8-byte words, so
    /// that a text is checked a word at a time, not a byte at a time.
    words: Option<[Word; 4]>,
}

/// Eight bytes of a [`Layout`]: the literal bytes expected, where literals
/// are and where digits are (`0xff` in each byte that is one).
#[derive(Debug, Clone, Copy, Default)]
struct Word {
    literal: u64,
    literal_mask: u64,
    digit_mask: u64,
}

impl Word {
    /// Whether the word `x` of a text has each literal byte and a digit
    /// (`0` to `9`) in each digit byte.
    fn fits(&self, x: u64) -> bool {
        const HIGH: u64 = 0xf0f0_f0f0_f0f0_f0f0;
        const THREES: u64 = 0x3030_3030_3030_3030;
        const SIXES: u64 = 0x0606_0606_0606_0606;
        let (high, threes) = (HIGH & self.digit_mask, THREES & self.digit_mask);
        let digits = x & self.digit_mask;
        // A digit byte is 0x30 to 0x3f (its high half 3), and no more than
        // 0x39 (adding 6 leaves its high half 3: no carry leaves a byte).
        (x ^ self.literal) & self.literal_mask == 0
            && digits & high == threes
            && (digits + (SIXES & self.digit_mask)) & high == threes
    }
}

impl Layout {
    /// Year, month, day, hour, minute, second, millisecond.
    const FIELDS: [&'static str; 7] = ["%Y", "%m", "%d", "%H", "%M", "%S", "%.3f"];

    /// The layout of `pattern`, when it has one with a date, hours and minutes.
    fn of(pattern: &str) -> Option<Layout> {
        let (mut at, mut literals, mut fields) = (0, Vec::new(), [None; 7]);
        let mut rest = pattern.as_bytes();
        while let Some(&b) = rest.first() {
            if b != b'%' {
                literals.push((at, b));
                at += 1;
                rest = &rest[1..];
            } else if rest.starts_with(b"%%") {
                literals.push((at, b'%'));
                at += 1;
                rest = &rest[2..];
            } else {
                let field = Self::FIELDS.iter().position(|f| rest.starts_with(f.as_bytes()))?;
                if fields[field].is_some() {
                    return None;
                }
                let width = match field {
                    0 => 4,
                    6 => {
                        literals.push((at, b'.'));
                        at += 1;
                        3
                    }
                    _ => 2,
                };
                fields[field] = Some((at, width));
                at += width;
                rest = &rest[Self::FIELDS[field].len()..];
            }
        }
        if !fields[..5].iter().all(Option::is_some) {
            return None;
        }
        let words = (at <= 32).then(|| {
            let mut words = [Word::default(); 4];
            for &(at, b) in &literals {
                words[at / 8].literal |= u64::from(b) << (at % 8 * 8);
                words[at / 8].literal_mask |= 0xff << (at % 8 * 8);
            }
            for &(at, width) in fields.iter().flatten() {
                for at in at..at + width {
                    words[at / 8].digit_mask |= 0xff << (at % 8 * 8);
                }
            }
            words
        });
        Some(Layout { len: at, literals, fields, words })
    }

    /// Whether `text` is as long as the layout, with each literal byte and
    /// a digit in each field's bytes.
    fn fits(&self, text: &[u8]) -> bool {
        if text.len() != self.len {
            return false;
        }
        match &self.words {
            Some(words) => {
                let mut padded = [0u8; 32];
                padded[..text.len()].copy_from_slice(text);
                let (chunks, _) = padded.as_chunks::<8>();
                chunks.iter().zip(words).all(|(chunk, word)| word.fits(u64::from_le_bytes(*chunk)))
            }
            None => {
                self.literals.iter().all(|&(at, b)| text[at] == b)
                    && self
                        .fields
                        .iter()
                        .flatten()
                        .all(|&(at, width)| text[at..at + width].iter().all(u8::is_ascii_digit))
            }
        }
    }

    /// Year, month, day, hour, minute, second and millisecond of `text`,
    /// when it fits the layout exactly and names a valid local time of the
    /// years 1 to 9999 (a leap second is left to chrono).
    fn fields(&self, text: &[u8]) -> Option<[i64; 7]> {
        if !self.fits(text) {
            return None;
        }
        let mut value = [0i64; 7];
        for (v, field) in value.iter_mut().zip(&self.fields) {
            if let Some((at, width)) = *field {
                *v = digits(text, at, width);
            }
        }
        let [year, month, day, hour, minute, second, _] = value;
        let valid = (1..=9999).contains(&year)
            && (1..=12).contains(&month)
            && (1..=days_in_month(year, month)).contains(&day)
            && hour < 24
            && minute < 60
            && second < 60;
        valid.then_some(value)
    }

    /// The instant `text` names in milliseconds, read as local time in `zone`.
    fn read(&self, text: &[u8], zone: Zone) -> Option<i64> {
        let [year, month, day, hour, minute, second, milli] = self.fields(text)?;
        match zone {
            Zone::Utc => {
                let minutes = (days_from_civil(year, month, day) * 24 + hour) * 60 + minute;
                Some(minutes * 60_000 + second * 1000 + milli)
            }
            Zone::Iana(_) => {
                let u = |v: i64| u32::try_from(v).ok();
                let date = chrono::NaiveDate::from_ymd_opt(i32::try_from(year).ok()?, u(month)?, u(day)?)?;
                let local = date.and_hms_milli_opt(u(hour)?, u(minute)?, u(second)?, u(milli)?)?;
                Some(zone.instant(local)?.timestamp_millis())
            }
        }
    }
}

/// `event_time_zone`: where a pattern without an offset reads its local time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zone {
    Utc,
    Iana(chrono_tz::Tz),
}

impl Zone {
    /// `UTC` or an IANA zone name (`Europe/Berlin`).
    pub fn parse(text: &str) -> Result<Zone, String> {
        if text == "UTC" {
            return Ok(Zone::Utc);
        }
        text.parse::<chrono_tz::Tz>().map(Zone::Iana).map_err(|_| {
            format!("`{text}` is not a time zone; use \"UTC\" or an IANA zone name such as \"Europe/Berlin\"")
        })
    }

    pub fn name(&self) -> &str {
        match self {
            Zone::Utc => "UTC",
            Zone::Iana(tz) => tz.name(),
        }
    }

    /// The instant of a local time here. A local time the zone repeats (a
    /// daylight saving change) takes the earlier instant; one it skips takes
    /// the earlier of the instants the offsets on either side give. `None`
    /// outside the years 1 to 9999, the event times weir reads.
    fn instant(&self, local: NaiveDateTime) -> Option<DateTime<chrono::Utc>> {
        if !(1..=9999).contains(&local.year()) {
            return None;
        }
        let tz = match self {
            Zone::Utc => return Some(local.and_utc()),
            Zone::Iana(tz) => tz,
        };
        Some(match tz.from_local_datetime(&local) {
            MappedLocalTime::Single(t) => t.to_utc(),
            MappedLocalTime::Ambiguous(a, b) => a.to_utc().min(b.to_utc()),
            MappedLocalTime::None => {
                let day = chrono::TimeDelta::days(1);
                let offset_at = |utc: NaiveDateTime| tz.offset_from_utc_datetime(&utc).fix().local_minus_utc();
                let before = offset_at(local.checked_sub_signed(day)?);
                let after = offset_at(local.checked_add_signed(day)?);
                local.checked_sub_signed(chrono::TimeDelta::seconds(i64::from(before.max(after))))?.and_utc()
            }
        })
    }
}

impl TimeFormat {
    /// Reads `auto`, `epoch_s`, `epoch_ms`, `epoch_us`, `epoch_ns` or a
    /// strftime pattern (any text with a `%`).
    pub fn parse(text: &str) -> Result<TimeFormat, String> {
        Ok(match text {
            "auto" => TimeFormat::Auto,
            "epoch_s" => TimeFormat::Epoch(EpochUnit::Seconds),
            "epoch_ms" => TimeFormat::Epoch(EpochUnit::Millis),
            "epoch_us" => TimeFormat::Epoch(EpochUnit::Micros),
            "epoch_ns" => TimeFormat::Epoch(EpochUnit::Nanos),
            pattern if pattern.contains('%') => TimeFormat::Pattern(Pattern::compile(pattern)?),
            other => {
                return Err(format!(
                    "`{other}` is not an event time format; use auto, epoch_s, epoch_ms, epoch_us, epoch_ns or a strftime pattern such as \"%Y-%m-%d %H:%M:%S%.3f\""
                ))
            }
        })
    }

    /// What a value must look like, for ledger details.
    pub fn describe(&self) -> String {
        match self {
            TimeFormat::Auto => "RFC 3339 text (2026-11-29T14:00:00.000Z) or integer epoch milliseconds".into(),
            TimeFormat::Epoch(unit) => format!("an integer of {} ({})", unit.name(), unit_words(*unit)),
            TimeFormat::Pattern(p) => format!("text matching event_time_format \"{}\"", p.text),
        }
    }
}

fn unit_words(unit: EpochUnit) -> &'static str {
    match unit {
        EpochUnit::Seconds => "seconds since 1970-01-01 UTC",
        EpochUnit::Millis => "milliseconds since 1970-01-01 UTC",
        EpochUnit::Micros => "microseconds since 1970-01-01 UTC",
        EpochUnit::Nanos => "nanoseconds since 1970-01-01 UTC",
    }
}

impl Pattern {
    /// Compiles `text`; refuses a specifier chrono does not know and a
    /// pattern that cannot yield both a date and a time of day.
    pub fn compile(text: &str) -> Result<Pattern, String> {
        let items = StrftimeItems::new(text).parse_to_owned().map_err(|_| {
            format!("\"{text}\" has a specifier chrono does not know; see chrono's strftime list (%Y %m %d %H %M %S %.3f %z %s ...)")
        })?;
        let layout = Layout::of(text).map(Arc::new);
        let pattern = Pattern { text: text.to_owned(), items: items.into(), layout };
        // Write a known instant with the pattern, then read it back.
        let sample = DateTime::parse_from_rfc3339("2026-11-29T14:05:09.123+01:00").map_err(|e| e.to_string())?;
        let mut written = String::new();
        let cannot = || {
            format!(
                "\"{text}\" cannot yield a date and a time of day; a pattern needs a date (%Y-%m-%d, ...) and hours and minutes (%H:%M), or a Unix time (%s)"
            )
        };
        write!(written, "{}", sample.format_with_items(pattern.items.iter())).map_err(|_| cannot())?;
        match pattern.read(&written, Zone::Utc) {
            Some(_) => Ok(pattern),
            None => Err(cannot()),
        }
    }

    /// The instant `text` names, in milliseconds since the epoch (rounded
    /// down); a time without an offset is read in `zone`.
    pub fn read(&self, text: &str, zone: Zone) -> Option<i64> {
        if let Some(ms) = self.layout.as_ref().and_then(|l| l.read(text.as_bytes(), zone)) {
            return Some(ms);
        }
        let mut parsed = Parsed::new();
        chrono::format::parse(&mut parsed, text, self.items.iter()).ok()?;
        let instant = if parsed.offset().is_some() || parsed.timestamp().is_some() {
            parsed.to_datetime().ok()?.to_utc()
        } else {
            zone.instant(parsed.to_naive_datetime_with_offset(0).ok()?)?
        };
        Some(instant.timestamp_millis())
    }

    /// `ms` written with the pattern, as local time in `zone` (what a
    /// drill's events carry); `None` outside chrono's range.
    pub fn write(&self, ms: i64, zone: Zone) -> Option<String> {
        let mut out = String::new();
        let utc = DateTime::from_timestamp_millis(ms)?;
        let written = match zone {
            Zone::Utc => write!(out, "{}", utc.format_with_items(self.items.iter())),
            Zone::Iana(tz) => write!(out, "{}", utc.with_timezone(&tz).format_with_items(self.items.iter())),
        };
        written.ok().map(|()| out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(rfc3339: &str) -> i64 {
        DateTime::parse_from_rfc3339(rfc3339).unwrap().timestamp_millis()
    }

    /// Patterns read directly read every text as chrono does: well-formed
    /// times, and the same texts with a byte changed, cut or added.
    #[test]
    fn fixed_layouts_read_as_chrono_does() {
        let seed: u64 = 0x51_7cc1_b727_220a;
        println!("seed {seed:#x}");
        let mut state = seed;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        for text in [
            "%Y-%m-%d %H:%M:%S%.3f",
            "%d/%m/%Y %H:%M",
            "%Y%m%dT%H%M%S",
            "%H:%M:%S %Y-%m-%d %%",
            "%Y-%m-%dT%H:%M:%S%.3fZ",
            // Longer than 32 bytes: checked a byte at a time.
            "on %d/%m/%Y at %H:%M:%S%.3f, local time",
        ] {
            let fast = Pattern::compile(text).unwrap();
            assert!(fast.layout.is_some(), "{text} has a fixed layout");
            let slow = Pattern { layout: None, ..fast.clone() };
            for _ in 0..3_000 {
                let ms = next(8_000_000_000_000) as i64 - 1_000_000_000_000;
                let mut written = fast.write(ms, Zone::Utc).unwrap().into_bytes();
                let (what, at, byte) = (next(6), next(written.len() as u64) as usize, next(18) as usize);
                match what {
                    0 => written[at] = b"0123456789: -./T%x"[byte],
                    1 => written.truncate(at),
                    2 => written.insert(at, b"0 "[byte % 2]),
                    _ => {}
                }
                let Ok(written) = String::from_utf8(written) else { continue };
                for zone in [Zone::Utc, berlin] {
                    assert_eq!(fast.read(&written, zone), slow.read(&written, zone), "{text}: {written:?}");
                }
            }
            for odd in [
                "2024-02-30 00:00:00.000",
                "2023-02-29 00:00:00.000",
                "2024-01-01 24:00:00.000",
                "2024-12-31 23:59:60.000",
            ] {
                assert_eq!(fast.read(odd, Zone::Utc), slow.read(odd, Zone::Utc), "{text}: {odd}");
            }
        }
        for text in ["%Y-%m-%d %H:%M:%S%.f", "%s", "%Y-%m-%d %H:%M:%S %z", "%e/%m/%Y %H:%M"] {
            assert!(Pattern::compile(text).unwrap().layout.is_none(), "{text} is read by chrono");
        }
    }

    #[test]
    fn patterns_read_with_and_without_offsets() {
        let p = Pattern::compile("%d/%m/%Y %H:%M:%S%.3f %z").unwrap();
        assert_eq!(p.read("29/11/2026 01:00:14.512 +0100", Zone::Utc), Some(ms("2026-11-29T00:00:14.512Z")));
        let sql = Pattern::compile("%Y-%m-%d %H:%M:%S%.3f").unwrap();
        assert_eq!(sql.read("2024-01-01 00:00:00.250", Zone::Utc), Some(ms("2024-01-01T00:00:00.250Z")));
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        assert_eq!(sql.read("2024-01-01 01:00:00.000", berlin), Some(ms("2024-01-01T00:00:00Z")));
        assert_eq!(sql.read("2024-01-01", Zone::Utc), None);
        // Years a time zone's arithmetic cannot reach are not event times.
        let far = Pattern::compile("%Y-%m-%d %H:%M").unwrap();
        assert_eq!(far.read("262142-12-31 23:59", berlin), None);
        assert_eq!(far.read("-262143-01-01 00:00", berlin), None);
        let unix = Pattern::compile("%s").unwrap();
        assert_eq!(unix.read("1700000000", berlin), Some(1_700_000_000_000));
    }

    #[test]
    fn daylight_saving_changes_take_the_earlier_instant() {
        let p = Pattern::compile("%Y-%m-%d %H:%M").unwrap();
        let berlin = Zone::parse("Europe/Berlin").unwrap();
        // 02:30 on 2026-10-25 happens twice (CEST, then CET): the first.
        assert_eq!(p.read("2026-10-25 02:30", berlin), Some(ms("2026-10-25T02:30:00+02:00")));
        // 02:30 on 2026-03-29 does not happen: the earlier of 02:30 CET and 02:30 CEST.
        assert_eq!(p.read("2026-03-29 02:30", berlin), Some(ms("2026-03-29T02:30:00+02:00")));
    }

    #[test]
    fn a_pattern_writes_what_it_reads() {
        let at = ms("2026-03-29T00:30:00.250Z");
        for (text, zone) in [("%Y-%m-%d %H:%M:%S%.3f", "Europe/Berlin"), ("%d/%m/%Y %H:%M:%S%.3f %z", "UTC")] {
            let (p, z) = (Pattern::compile(text).unwrap(), Zone::parse(zone).unwrap());
            let written = p.write(at, z).unwrap();
            assert_eq!(p.read(&written, z), Some(at), "{text} in {zone}: {written}");
        }
    }

    #[test]
    fn refuses_what_cannot_run() {
        assert!(TimeFormat::parse("iso").unwrap_err().contains("not an event time format"));
        assert!(Pattern::compile("%Y-%m-%d").unwrap_err().contains("cannot yield"));
        assert!(Pattern::compile("%H:%M:%S").unwrap_err().contains("cannot yield"));
        assert!(Pattern::compile("%Y-%m-%d %Q").unwrap_err().contains("does not know"));
        assert!(Zone::parse("Mars/Olympus").unwrap_err().contains("not a time zone"));
        assert!(Zone::parse("Europe/Berlin").is_ok());
    }

    #[test]
    fn epochs_round_down_to_the_millisecond() {
        assert_eq!(EpochUnit::Micros.to_millis(-1), Some(-1));
        assert_eq!(EpochUnit::Nanos.to_millis(1_999_999), Some(1));
        assert_eq!(EpochUnit::Seconds.to_millis(i128::from(i64::MAX)), None);
    }
}
