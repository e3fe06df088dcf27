//! What a contract or a command says about reconciling against a system
//! of record: which columns are the key fields, the window start and the
//! aggregates ([`Mapping`]), and how far amounts may be apart ([`Tolerance`]).
//!
//! In more detail: what a contract or a command says about reconciling:
//! `Mapping` (key fields, window start, aggregates to columns; each key field,
//! the window start and one aggregate required) and `Tolerance` (an amount, or
//! a percentage of the system of record's), parsed for
//! `[reconcile.system_of_record]` (refused with line and key) and for `weir
//! reconcile --map --tolerance`.

use std::collections::BTreeMap;

use rust_decimal::Decimal;

/// Which column gives each key field, the window start and each aggregate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// (key field as rows name it, column), in the contract's key order.
    pub key: Vec<(String, String)>,
    pub window_start: String,
    /// (aggregate, column).
    pub values: Vec<(String, String)>,
}

impl Mapping {
    /// `key.account_id=account,window_start=day,revenue=total`: every key
    /// field of the rows and the window start must be mapped, and at least
    /// one aggregate.
    pub fn parse(text: &str, key_names: &[String], aggregates: &[String]) -> Result<Mapping, String> {
        let example = format!(
            "map each key field, the window start and the aggregates to compare to a column, e.g. --map {}window_start=day,{}=amount",
            key_names.iter().map(|k| format!("key.{k}={k},")).collect::<String>(),
            aggregates.first().map_or("revenue", String::as_str)
        );
        let mut key = BTreeMap::new();
        let (mut window_start, mut values) = (None, Vec::new());
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((target, column)) = pair.split_once('=') else {
                return Err(format!("`{pair}` is not target=column; {example}"));
            };
            let (target, column) = (target.trim(), column.trim().to_owned());
            if let Some(field) = target.strip_prefix("key.") {
                if !key_names.iter().any(|k| k == field) {
                    return Err(format!(
                        "`{field}` is not a key field of the pipeline ({}); {example}",
                        key_names.join(", ")
                    ));
                }
                key.insert(field.to_owned(), column);
            } else if target == "window_start" {
                window_start = Some(column);
            } else if aggregates.iter().any(|a| a == target) {
                values.push((target.to_owned(), column));
            } else {
                return Err(format!(
                    "`{target}` is neither key.FIELD, window_start nor an aggregate of the pipeline ({}); {example}",
                    aggregates.join(", ")
                ));
            }
        }
        let mut ordered = Vec::new();
        for k in key_names {
            let Some(column) = key.remove(k) else { return Err(format!("key field `{k}` is not mapped; {example}")) };
            ordered.push((k.clone(), column));
        }
        let Some(window_start) = window_start else { return Err(format!("window_start is not mapped; {example}")) };
        if values.is_empty() {
            return Err(format!("no aggregate is mapped; {example}"));
        }
        Ok(Mapping { key: ordered, window_start, values })
    }

    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.key
            .iter()
            .map(|(_, c)| c.as_str())
            .chain([self.window_start.as_str()])
            .chain(self.values.iter().map(|(_, c)| c.as_str()))
    }
}

/// How far apart two amounts may be and still match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tolerance {
    Absolute(Decimal),
    /// A fraction of the system of record's amount.
    Relative(Decimal),
}

impl Tolerance {
    /// `0.01` (absolute) or `1%` (relative).
    pub fn parse(text: &str) -> Result<Tolerance, String> {
        let t = text.trim();
        let bad = || format!("tolerance {text:?} is neither an amount (0.01) nor a percentage (1%)");
        let tolerance = match t.strip_suffix('%') {
            Some(p) => Tolerance::Relative(p.trim().parse::<Decimal>().map_err(|_| bad())? / Decimal::ONE_HUNDRED),
            None => Tolerance::Absolute(t.parse::<Decimal>().map_err(|_| bad())?),
        };
        match tolerance {
            Tolerance::Absolute(d) | Tolerance::Relative(d) if d.is_sign_negative() => Err(bad()),
            ok => Ok(ok),
        }
    }

    /// Whether `difference` is within the tolerance of `reference`.
    pub fn allows(&self, difference: Decimal, reference: Decimal) -> bool {
        match self {
            Tolerance::Absolute(t) => difference.abs() <= *t,
            Tolerance::Relative(f) => difference.abs() <= reference.abs() * *f,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Tolerance::Absolute(t) => t.normalize().to_string(),
            Tolerance::Relative(f) => format!("{}%", (*f * Decimal::ONE_HUNDRED).normalize()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping() -> Mapping {
        Mapping::parse(
            "key.account_id=account,window_start=day,revenue=total",
            &["account_id".into()],
            &["revenue".into(), "payments".into()],
        )
        .unwrap()
    }

    #[test]
    fn a_mapping_names_every_key_field_the_window_and_an_aggregate() {
        let m = mapping();
        assert_eq!(m.key, [("account_id".to_owned(), "account".to_owned())]);
        assert_eq!((m.window_start.as_str(), m.values.len()), ("day", 1));
        let names = (["account_id".to_owned()], ["revenue".to_owned()]);
        for (text, words) in [
            ("window_start=day,revenue=total", "key field `account_id` is not mapped"),
            ("key.account_id=a,revenue=total", "window_start is not mapped"),
            ("key.account_id=a,window_start=d", "no aggregate is mapped"),
            ("key.acct=a,window_start=d,revenue=t", "`acct` is not a key field"),
            ("key.account_id=a,window_start=d,refunds=t", "`refunds` is neither"),
            ("key.account_id", "is not target=column"),
        ] {
            let e = Mapping::parse(text, &names.0, &names.1).unwrap_err();
            assert!(e.contains(words), "{text}: {e}");
        }
    }

    #[test]
    fn tolerances_absolute_and_relative() {
        assert_eq!(Tolerance::parse("0.01"), Ok(Tolerance::Absolute(Decimal::new(1, 2))));
        assert_eq!(Tolerance::parse("1%"), Ok(Tolerance::Relative(Decimal::new(1, 2))));
        assert!(Tolerance::parse("-1").is_err() && Tolerance::parse("a lot").is_err());
        let t = Tolerance::parse("1%").unwrap();
        assert!(t.allows(Decimal::new(99, 2), Decimal::new(100, 0)));
        assert!(!t.allows(Decimal::new(101, 2), Decimal::new(100, 0)));
    }
}
