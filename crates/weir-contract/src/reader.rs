//! Reading a TOML contract or `weir.toml`: the [`Reader`] that collects
//! every error with its file, line and key ([`ContractError`]), and the
//! typed reads every section shares (a value, a string, a duration, the
//! keys and name of an `[[aggregate]]` or `[[check]]`).
//!
//! In more detail: the `Reader` every section of a contract and of `weir.toml`
//! is read through: each error kept with its file, line and key
//! (`ContractError`), and the typed reads the sections share (a value, a
//! string, a duration, an `[[aggregate]]`'s or `[[check]]`'s keys and name).
//! `checks` reads through it and is given the row's shape (`RowShape`: key
//! fields, aggregate names), so it does not import `contract`.

use std::fmt;
use std::ops::Range;

use toml_edit::{Item, Table, Value};

use crate::duration::parse_duration_ms;

/// One reason a contract cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractError {
    pub file: String,
    pub line: Option<usize>,
    pub key: String,
    pub message: String,
}

impl fmt::Display for ContractError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: `{}`: {}", self.file, line, self.key, self.message),
            None => write!(f, "{}: `{}`: {}", self.file, self.key, self.message),
        }
    }
}

pub(crate) struct Reader<'a> {
    pub file: &'a str,
    pub text: &'a str,
    pub errors: Vec<ContractError>,
}

impl Reader<'_> {
    pub(crate) fn error(&mut self, span: Option<Range<usize>>, key: &str, message: impl Into<String>) {
        self.errors.push(ContractError {
            file: self.file.into(),
            line: span.map(|s| line_of(self.text, s.start)),
            key: key.into(),
            message: message.into(),
        });
    }

    pub(crate) fn value<'t>(
        &mut self,
        table: &'t Table,
        section: &str,
        key: &str,
        required: bool,
    ) -> Option<&'t Value> {
        match table.get(key) {
            Some(Item::Value(value)) => Some(value),
            Some(other) => {
                self.error(other.span(), &format!("{section}.{key}"), "must be a plain value, not a table");
                None
            }
            None => {
                if required {
                    let line_span = table.span();
                    self.error(
                        line_span,
                        &format!("{section}.{key}"),
                        format!("missing required key; add {key} = ... to [{section}]"),
                    );
                }
                None
            }
        }
    }

    pub(crate) fn string(&mut self, table: &Table, section: &str, key: &str, required: bool) -> Option<String> {
        let value = self.value(table, section, key, required)?;
        match value.as_str() {
            Some(text) => Some(text.to_owned()),
            None => {
                self.error(value.span(), &format!("{section}.{key}"), "must be a string in quotes");
                None
            }
        }
    }

    pub(crate) fn duration(&mut self, table: &Table, section: &str, key: &str) -> Option<Option<i64>> {
        let Some(text) = self.string(table, section, key, false) else {
            return if table.contains_key(key) { None } else { Some(None) };
        };
        match parse_duration_ms(&text) {
            Ok(ms) => Some(Some(ms)),
            Err(message) => {
                let span = table.get(key).and_then(Item::span);
                self.error(span, &format!("{section}.{key}"), message);
                None
            }
        }
    }

    /// An `[[aggregate]]` or `[[check]]` table's keys: one not in `allowed` is refused.
    pub(crate) fn item_keys(&mut self, t: &Table, section: &str, what: &str, allowed: &[&str]) {
        self.keys_in(t, section, &format!("[[{what}]]"), allowed);
    }

    /// A table's keys: one not in `allowed` is refused, naming what the
    /// table (`shown`, such as `[source]`) takes.
    pub(crate) fn keys_in(&mut self, t: &Table, section: &str, shown: &str, allowed: &[&str]) {
        for (name, item) in t.iter() {
            if !allowed.contains(&name) {
                let span = t.key(name).and_then(|k| k.span()).or_else(|| item.span());
                self.error(
                    span,
                    &format!("{section}.{name}"),
                    format!("unknown key; {shown} takes {}", allowed.join(", ")),
                );
            }
        }
    }

    /// The `name` of an `[[aggregate]]` or `[[check]]` (`what`): 1 to 64 of a-z, 0-9 and _.
    pub(crate) fn item_name(&mut self, t: &Table, section: &str, what: &str) -> Option<String> {
        let name = self.string(t, section, "name", true);
        if let Some(name) = &name {
            if name.is_empty()
                || name.len() > 64
                || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                self.error(
                    t.get("name").and_then(Item::span),
                    &format!("{section}.name"),
                    format!("`{name}` is not {what} name: use 1 to 64 of a-z, 0-9 and _"),
                );
            }
        }
        name
    }
}

pub(crate) fn line_of(text: &str, byte: usize) -> usize {
    text.as_bytes()[..byte.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}
