//! The body of a POST of events, checked whole before anything is
//! appended: one JSON value a line, each within the topic's size limit,
//! with the partitioning field's value found in the same pass. Used by the
//! HTTP API and `weir produce --kafka`; fuzzed by `fuzz/`.

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Why a POST body was refused; `line` counts from 1.
#[derive(Debug, PartialEq, Eq)]
pub enum BodyError {
    TooLong { line: usize, bytes: usize },
    NotUtf8 { line: usize },
    NotJson { line: usize, why: String },
}

/// One event of a body: its partitioning key's JSON text (when the field
/// is there) and its line.
pub type BodyEvent<'b> = (Option<String>, &'b [u8]);

/// A POST body's events: one JSON value a line (blank lines skipped, `\r\n`
/// accepted), each with its partitioning key's JSON text when `key` names a
/// top-level field it has. The whole body is checked before anything is
/// appended; the first bad line refuses it.
pub fn parse_body<'b>(
    body: &'b [u8],
    key: Option<&str>,
    max_event_bytes: usize,
) -> Result<Vec<BodyEvent<'b>>, BodyError> {
    let mut events = Vec::new();
    for (i, line) in body.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let n = i + 1;
        if line.len() > max_event_bytes {
            return Err(BodyError::TooLong { line: n, bytes: line.len() });
        }
        if std::str::from_utf8(line).is_err() {
            return Err(BodyError::NotUtf8 { line: n });
        }
        let k = key_of(line, key).map_err(|e| BodyError::NotJson { line: n, why: e.to_string() })?;
        events.push((k, line));
    }
    Ok(events)
}

/// Checks that `line` is one JSON value, and finds the partitioning field's
/// value (its JSON text) when `field` is set and the value is an object.
pub fn key_of(line: &[u8], field: Option<&str>) -> Result<Option<String>, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(line);
    let key = KeySeed(field).deserialize(&mut de)?;
    de.end()?;
    Ok(key)
}

struct KeySeed<'f>(Option<&'f str>);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Option<String>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Option<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(name) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if Some(name.as_ref()) == self.0 && found.is_none() {
                found = Some(map.next_value::<serde_json::Value>()?.to_string());
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_refused_at_its_first_bad_line_and_keys_are_found() {
        let body = b"{\"account_id\":\"a1\",\"n\":1}\r\n\n  \n[1,2]\n{\"account_id\":7}\n";
        let events = parse_body(body, Some("account_id"), 100).unwrap();
        let keys: Vec<Option<String>> = events.iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(keys, [Some("\"a1\"".to_owned()), None, Some("7".to_owned())]);
        assert_eq!(events[0].1, b"{\"account_id\":\"a1\",\"n\":1}");
        assert_eq!(
            parse_body(b"{}\n{\"a\":\n", None, 100),
            Err(BodyError::NotJson { line: 2, why: "EOF while parsing a value at line 1 column 5".into() })
        );
        assert_eq!(parse_body(b"{}\n\xff\n", None, 100), Err(BodyError::NotUtf8 { line: 2 }));
        assert_eq!(parse_body(b"{}\n\n{\"a\":\"long\"}\n", None, 5), Err(BodyError::TooLong { line: 3, bytes: 12 }));
        assert_eq!(
            parse_body(b"{} {}\n", None, 100).map_err(|e| matches!(e, BodyError::NotJson { line: 1, .. })),
            Err(true)
        );
        assert_eq!(parse_body(b"\n\n", None, 100), Ok(Vec::new()));
    }
}
