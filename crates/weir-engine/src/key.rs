//! Group keys as bytes: one encoding that hashes, sorts and decodes back to
//! the key's JSON. Each field is a tag (`s` string, `i` integer, `b` boolean),
//! a 4-byte big-endian length, and the text.
//!
//! A window's identity hashes the group key with the window start as the
//! seed (`Engine::win_id`).

use crate::text::write_str;

pub(crate) fn push_field(tag: u8, text: &str, out: &mut Vec<u8>) {
    out.push(tag);
    out.extend_from_slice(&(text.len() as u32).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

/// Decodes the fields of a key; stops quietly at anything malformed.
pub(crate) fn fields(key: &[u8]) -> impl Iterator<Item = (u8, &str)> {
    let mut rest = key;
    std::iter::from_fn(move || {
        if rest.len() < 5 {
            return None;
        }
        let tag = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let text = rest.get(5..5 + len).and_then(|b| std::str::from_utf8(b).ok())?;
        rest = &rest[5 + len..];
        Some((tag, text))
    })
}

/// One key field's value as a row's `key` object holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyValue<'a> {
    Str(&'a str),
    /// An integer's text.
    Int(&'a str),
    Bool(bool),
}

/// A group key's bytes from its fields' values, in the contract's key
/// order: what [`write_json`] reads back.
pub fn encode<'a>(values: impl IntoIterator<Item = KeyValue<'a>>) -> crate::KeyBytes {
    let mut out = Vec::new();
    for v in values {
        match v {
            KeyValue::Str(text) => push_field(b's', text, &mut out),
            KeyValue::Int(text) => push_field(b'i', text, &mut out),
            KeyValue::Bool(b) => push_field(b'b', if b { "1" } else { "0" }, &mut out),
        }
    }
    crate::KeyBytes::from_vec(out)
}

/// Writes the key as a JSON object named by the contract's key paths.
pub fn write_json(key: &[u8], names: &[String], out: &mut String) {
    out.push('{');
    for (i, (name, (tag, text))) in names.iter().zip(fields(key)).enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(name, out);
        out.push(':');
        write_field(tag, text, out);
    }
    out.push('}');
}

/// [`write_json`] with each field's `"name":` written already (after a
/// comma but for the first).
pub(crate) fn write_json_with(key: &[u8], heads: &[String], out: &mut String) {
    out.push('{');
    for (head, (tag, text)) in heads.iter().zip(fields(key)) {
        out.push_str(head);
        write_field(tag, text, out);
    }
    out.push('}');
}

fn write_field(tag: u8, text: &str, out: &mut String) {
    match tag {
        b's' => write_str(text, out),
        b'b' => out.push_str(if text == "1" { "true" } else { "false" }),
        _ => out.push_str(text),
    }
}
