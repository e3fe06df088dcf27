//! `[[check]]`: the contract's named checks (issue 18), modelled on dbt
//! tests. Each turns one material assumption into something weir evaluates
//! and keeps: a row expression, the watermark's freshness, a window's volume
//! against the same window a day or a week before, or the last
//! reconciliation.

use toml_edit::{Item, Table};

use crate::reader::Reader;
use crate::rule::{parse_rule, Expr, FieldPath};

/// What a failing check does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Recorded only.
    Warn,
    /// Recorded, opens an incident and notifies the owner.
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warn => "warn",
            Severity::Error => "error",
        }
    }
}

/// The band a window's `events` must stay within against the same window
/// one period before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumePeriod {
    Day,
    Week,
}

impl VolumePeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumePeriod::Day => "day",
            VolumePeriod::Week => "week",
        }
    }

    pub fn ms(self) -> i64 {
        match self {
            VolumePeriod::Day => 86_400_000,
            VolumePeriod::Week => 7 * 86_400_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum CheckKind {
    /// `row = "values.revenue >= 0"`: CEL over each published row's
    /// `values`, `events`, `late_events` and `key`; true passes.
    Row { text: String, expr: Expr },
    /// `freshness = "10m"`: the watermark no older than this.
    Freshness { max_age_ms: i64 },
    /// `volume = "day"` (or `"week"`) with `band = "50%"`: a settled
    /// window's `events` within the band of the same key's window one
    /// period before.
    Volume { period: VolumePeriod, band_percent: f64 },
    /// `reconcile = true`: the last reconciliation within its tolerance.
    Reconcile,
}

impl CheckKind {
    pub fn name(&self) -> &'static str {
        match self {
            CheckKind::Row { .. } => "row",
            CheckKind::Freshness { .. } => "freshness",
            CheckKind::Volume { .. } => "volume",
            CheckKind::Reconcile => "reconcile",
        }
    }

    /// The definition as written, for listings.
    pub fn definition(&self) -> String {
        match self {
            CheckKind::Row { text, .. } => text.clone(),
            CheckKind::Freshness { max_age_ms } => {
                format!("watermark no older than {}", crate::format_duration_ms(*max_age_ms))
            }
            CheckKind::Volume { period, band_percent } => {
                format!("events within {band_percent}% of the same window one {} before", period.as_str())
            }
            CheckKind::Reconcile => "the last reconciliation within its tolerance".into(),
        }
    }
}

/// One `[[check]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub name: String,
    pub severity: Severity,
    /// What the owner is asked when it fails.
    pub question: String,
    pub kind: CheckKind,
}

/// What a row carries, for checking a row expression against it: the
/// contract's key fields and its aggregates' names.
pub(crate) struct RowShape<'a> {
    pub key: &'a [FieldPath],
    pub aggregates: Vec<&'a str>,
}

const CHECK_KEYS: &[&str] = &["name", "severity", "question", "row", "freshness", "volume", "band", "reconcile"];
const KINDS: &[&str] = &["row", "freshness", "volume", "reconcile"];

impl Reader<'_> {
    pub(crate) fn checks(&mut self, root: &Table, row: &RowShape<'_>) -> Option<Vec<Check>> {
        let tables: Vec<&Table> = match root.get("check") {
            None => return Some(Vec::new()),
            Some(Item::ArrayOfTables(array)) => array.iter().collect(),
            Some(other) => {
                self.error(other.span(), "check", "write each check as its own [[check]] table");
                return None;
            }
        };
        let mut out: Vec<Check> = Vec::new();
        let mut ok = true;
        for (i, t) in tables.into_iter().enumerate() {
            let section = format!("check[{}]", i + 1);
            match self.check(t, &section, row) {
                Some(check) => {
                    if out.iter().any(|c| c.name == check.name) {
                        self.error(
                            t.get("name").and_then(Item::span),
                            &format!("{section}.name"),
                            format!("`{}` names two checks; give each a unique name", check.name),
                        );
                        ok = false;
                    }
                    out.push(check);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn check(&mut self, t: &Table, section: &str, row: &RowShape<'_>) -> Option<Check> {
        self.item_keys(t, section, "check", CHECK_KEYS);
        let name = self.item_name(t, section, "a check");
        let severity = match self.string(t, section, "severity", true).as_deref() {
            Some("warn") => Some(Severity::Warn),
            Some("error") => Some(Severity::Error),
            Some(other) => {
                self.error(
                    t.get("severity").and_then(Item::span),
                    &format!("{section}.severity"),
                    format!("`{other}` is not a severity; use \"warn\" (recorded) or \"error\" (recorded, opens an incident and notifies the owner)"),
                );
                None
            }
            None => None,
        };
        let question = self.string(t, section, "question", true);
        if question.as_deref().is_some_and(|q| q.trim().is_empty()) {
            self.error(
                t.get("question").and_then(Item::span),
                &format!("{section}.question"),
                "must not be empty: ask the owner what a failure means",
            );
        }
        let given: Vec<&str> = KINDS.iter().copied().filter(|k| t.contains_key(k)).collect();
        let kind = match given.as_slice() {
            [one] => self.kind(t, section, one, row),
            [] => {
                self.error(
                    t.span(),
                    section,
                    "a check needs one of row = \"<CEL>\", freshness = \"<duration>\", volume = \"day\" or \"week\" with band = \"<N>%\", reconcile = true",
                );
                None
            }
            many => {
                self.error(
                    t.get(many[1]).and_then(Item::span),
                    &format!("{section}.{}", many[1]),
                    format!(
                        "a check is of one kind, and this one has {}; split it into one [[check]] each",
                        many.join(" and ")
                    ),
                );
                None
            }
        };
        if t.contains_key("band") && !matches!(kind, Some(CheckKind::Volume { .. })) && given.len() == 1 {
            self.error(
                t.get("band").and_then(Item::span),
                &format!("{section}.band"),
                "band belongs to a volume check; remove it or add volume = \"day\"",
            );
            return None;
        }
        Some(Check { name: name?, severity: severity?, question: question?, kind: kind? })
    }

    fn kind(&mut self, t: &Table, section: &str, kind: &str, row: &RowShape<'_>) -> Option<CheckKind> {
        let key = format!("{section}.{kind}");
        let span = t.get(kind).and_then(Item::span);
        match kind {
            "row" => {
                let text = self.string(t, section, "row", true)?;
                let expr = match parse_rule(&text) {
                    Ok(expr) => expr,
                    Err(message) => {
                        self.error(span, &key, format!("expression does not parse: {message}"));
                        return None;
                    }
                };
                let mut fields = Vec::new();
                fields_of(&expr, &mut fields);
                for field in fields {
                    if let Err(message) = row_field(field, row) {
                        self.error(span.clone(), &key, message);
                        return None;
                    }
                }
                Some(CheckKind::Row { text, expr })
            }
            "freshness" => {
                let max_age_ms = self.duration(t, section, "freshness")??;
                if max_age_ms <= 0 {
                    self.error(span, &key, "must be above zero, for example \"10m\"");
                    return None;
                }
                Some(CheckKind::Freshness { max_age_ms })
            }
            "volume" => {
                let period = match self.string(t, section, "volume", true)?.as_str() {
                    "day" => VolumePeriod::Day,
                    "week" => VolumePeriod::Week,
                    other => {
                        self.error(span, &key, format!("`{other}` is not a period; use \"day\" or \"week\""));
                        return None;
                    }
                };
                let band = self.string(t, section, "band", true)?;
                let band_percent = band
                    .strip_suffix('%')
                    .and_then(|n| n.trim().parse::<f64>().ok())
                    .filter(|n| n.is_finite() && *n >= 0.0);
                let Some(band_percent) = band_percent else {
                    self.error(
                        t.get("band").and_then(Item::span),
                        &format!("{section}.band"),
                        format!("`{band}` is not a band; write a percentage such as \"50%\""),
                    );
                    return None;
                };
                Some(CheckKind::Volume { period, band_percent })
            }
            _ => match t.get("reconcile").and_then(Item::as_bool) {
                Some(true) => Some(CheckKind::Reconcile),
                _ => {
                    self.error(span, &key, "must be true; remove the check to not check reconciliations");
                    None
                }
            },
        }
    }
}

/// Every field path an expression reads.
pub fn fields_of<'e>(expr: &'e Expr, out: &mut Vec<&'e FieldPath>) {
    match expr {
        Expr::Field(p) | Expr::Has(p) => out.push(p),
        Expr::Not(e) => fields_of(e, out),
        Expr::Cmp(_, a, b) | Expr::In(a, b) | Expr::And(a, b) | Expr::Or(a, b) => {
            fields_of(a, out);
            fields_of(b, out);
        }
        Expr::List(items) => items.iter().for_each(|i| fields_of(i, out)),
        Expr::Null | Expr::Bool(_) | Expr::Number(_) | Expr::Str(_) => {}
    }
}

/// A row expression reads `values.AGGREGATE`, `events`, `late_events` or
/// `key.FIELD`, and nothing else a row does not carry.
fn row_field(field: &FieldPath, row: &RowShape<'_>) -> Result<(), String> {
    let (key, aggregates) = (row.key, &row.aggregates);
    let segments = field.segments();
    let rest = segments[1..].join(".");
    let aggregates_named = || aggregates.join(", ");
    match segments[0].as_str() {
        "events" | "late_events" if segments.len() == 1 => Ok(()),
        "values" if segments.len() == 2 && aggregates.iter().any(|a| *a == segments[1]) => Ok(()),
        "values" => Err(format!(
            "`{field}` is not an aggregate of this contract; a row's values are {}",
            match aggregates_named() {
                names if names.is_empty() => "none (the contract has no [[aggregate]])".to_owned(),
                names => format!("values.{}", names.replace(", ", ", values.")),
            }
        )),
        "key" if key.iter().any(|k| k.to_string() == rest) => Ok(()),
        "key" => Err(format!(
            "`{field}` is not a key field of this contract; its key is {}",
            key.iter().map(|k| format!("key.{k}")).collect::<Vec<_>>().join(", ")
        )),
        _ => Err(format!(
            "`{field}` is not part of a row; a row expression reads values.<aggregate>, events, late_events and key.<field>"
        )),
    }
}
