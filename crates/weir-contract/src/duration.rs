//! Durations as contracts write them: a whole number and a unit (`ms`, `s`,
//! `m`, `h`, `d`), optionally several (`1h30m`). Always milliseconds inside.

/// Parses a contract duration into milliseconds.
///
/// Returns a sentence a person can act on when the text is not a duration.
pub fn parse_duration_ms(text: &str) -> Result<i64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration; write a number and a unit, e.g. \"30s\" or \"1h30m\"".into());
    }
    let bytes = text.as_bytes();
    let mut total: i64 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let digits_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == digits_start {
            return Err(format!(
                "`{text}` is not a duration: expected a whole number at position {}; write e.g. \"30s\", \"5m\" or \"1h30m\"",
                digits_start + 1
            ));
        }
        let number: i64 = text[digits_start..i].parse().map_err(|_| format!("`{text}` is too large a duration"))?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit_ms: i64 = match &text[unit_start..i] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(format!(
                    "`{text}` has a number without a unit; add one of ms, s, m, h, d (e.g. \"{number}s\")"
                ))
            }
            other => return Err(format!("`{text}` has the unknown unit `{other}`; use ms, s, m, h or d")),
        };
        let part = number.checked_mul(unit_ms).ok_or_else(|| format!("`{text}` is too large a duration"))?;
        total = total.checked_add(part).ok_or_else(|| format!("`{text}` is too large a duration"))?;
    }
    // Keep every duration far from i64's edges so window arithmetic cannot overflow.
    const MAX_MS: i64 = 1 << 52;
    if total > MAX_MS {
        return Err(format!("`{text}` is too large a duration (at most about 142 years)"));
    }
    Ok(total)
}

/// Formats milliseconds the way a contract would write them (`1h30m`, `250ms`).
pub fn format_duration_ms(ms: i64) -> String {
    if ms == 0 {
        return "0s".into();
    }
    let mut rest = ms;
    let mut out = String::new();
    for (unit, size) in [("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if rest >= size {
            out.push_str(&format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expect: Result<i64, ()>) {
        assert_eq!(parse_duration_ms(text).map_err(|_| ()), expect, "{text}");
    }

    #[test]
    fn durations() {
        check("0s", Ok(0));
        check("250ms", Ok(250));
        check("30s", Ok(30_000));
        check("5m", Ok(300_000));
        check("1h30m", Ok(5_400_000));
        check("2d", Ok(172_800_000));
        check("1m30s500ms", Ok(90_500));
        check("", Err(()));
        check("5", Err(()));
        check("5x", Err(()));
        check("s", Err(()));
        check("-5s", Err(()));
        check("1.5s", Err(()));
        check("99999999999999999999d", Err(()));
    }

    #[test]
    fn format_round_trips() {
        for ms in [0, 1, 999, 1_000, 90_500, 5_400_000, 172_800_000] {
            assert_eq!(parse_duration_ms(&format_duration_ms(ms)), Ok(ms));
        }
    }
}
