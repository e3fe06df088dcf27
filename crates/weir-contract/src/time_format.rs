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

/// A strftime pattern, compiled.
#[derive(Debug, Clone)]
pub struct Pattern {
    pub text: String,
    items: Arc<[Item<'static>]>,
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
        let pattern = Pattern { text: text.to_owned(), items: items.into() };
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
