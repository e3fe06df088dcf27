//! JSON string literals, written without the formatting machinery; a leaf
//! that `key` and `output` both use.

/// Writes `text` as a JSON string literal.
pub fn write_str(text: &str, out: &mut String) {
    out.push('"');
    if !text.bytes().any(|b| b < 0x20 || b == b'"' || b == b'\\') {
        out.push_str(text);
        out.push('"');
        return;
    }
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}
