//! Evaluating `where` rules against an event (SPEC.md sections 3.1 and 5).
//!
//! Semantics follow CEL: `==` across types is false, ordering across types is
//! an error, a missing field is an error, `has()` guards, and `&&` / `||`
//! absorb an error when the other side decides (`false && error` is false).

use std::borrow::Cow;
use std::cmp::Ordering;

use rust_decimal::Decimal;
use weir_contract::{CmpOp, Expr};

use crate::json::{Event, FieldRef, Names, Tag, Val};
use crate::number::parse_decimal;

#[derive(Debug, Clone)]
pub(crate) enum Rule {
    Lit(Lit),
    List(Vec<Rule>),
    Field(FieldRef, String),
    /// `field == "text"` (or `!=` when `negate`): the common case, without
    /// building values.
    FieldIsStr {
        field: FieldRef,
        name: String,
        text: String,
        negate: bool,
    },
    /// `field == number` (`!=` when `negate`): compared by value, without
    /// building values; a number spelled as the rule spells it (`spelled`)
    /// is equal without being parsed.
    FieldIsNum {
        field: FieldRef,
        name: String,
        value: Decimal,
        spelled: String,
        negate: bool,
    },
    Has(FieldRef),
    Not(Box<Rule>),
    Cmp(CmpOp, Box<Rule>, Box<Rule>),
    In(Box<Rule>, Box<Rule>),
    And(Box<Rule>, Box<Rule>),
    Or(Box<Rule>, Box<Rule>),
}

#[derive(Debug, Clone)]
pub(crate) enum Lit {
    Null,
    Bool(bool),
    Num(Decimal),
    Str(String),
}

/// A value during evaluation.
enum V<'a> {
    Null,
    Bool(bool),
    Num(Decimal),
    Str(Cow<'a, str>),
    List(Vec<V<'a>>),
    /// A JSON array or object from the event.
    Json(Val<'a>),
}

/// Why a rule could not be evaluated; becomes the ledger entry's detail.
pub(crate) type RuleError = String;

impl Rule {
    pub(crate) fn compile(expr: &Expr, names: &mut Names) -> Result<Rule, String> {
        Ok(match expr {
            Expr::Null => Rule::Lit(Lit::Null),
            Expr::Bool(b) => Rule::Lit(Lit::Bool(*b)),
            Expr::Number(text) => Rule::Lit(Lit::Num(
                parse_decimal(text).ok_or_else(|| format!("number {text} has more digits than weir keeps (28)"))?,
            )),
            Expr::Str(s) => Rule::Lit(Lit::Str(s.clone())),
            Expr::List(items) => Rule::List(items.iter().map(|i| Rule::compile(i, names)).collect::<Result<_, _>>()?),
            Expr::Field(p) => Rule::Field(names.field(p.segments()), p.to_string()),
            Expr::Has(p) => Rule::Has(names.field(p.segments())),
            Expr::Not(e) => Rule::Not(Box::new(Rule::compile(e, names)?)),
            Expr::Cmp(op @ (CmpOp::Eq | CmpOp::Ne), a, b) if field_and_str(a, b).is_some() => {
                let (path, text) = field_and_str(a, b).unwrap_or_else(|| unreachable!());
                Rule::FieldIsStr {
                    field: names.field(path.segments()),
                    name: path.to_string(),
                    text: text.to_owned(),
                    negate: *op == CmpOp::Ne,
                }
            }
            Expr::Cmp(op @ (CmpOp::Eq | CmpOp::Ne), a, b) if field_and_number(a, b).is_some() => {
                let (path, text) = field_and_number(a, b).unwrap_or_else(|| unreachable!());
                Rule::FieldIsNum {
                    field: names.field(path.segments()),
                    name: path.to_string(),
                    value: parse_decimal(text)
                        .ok_or_else(|| format!("number {text} has more digits than weir keeps (28)"))?,
                    spelled: text.to_owned(),
                    negate: *op == CmpOp::Ne,
                }
            }
            Expr::Cmp(op, a, b) => {
                Rule::Cmp(*op, Box::new(Rule::compile(a, names)?), Box::new(Rule::compile(b, names)?))
            }
            Expr::In(a, b) => Rule::In(Box::new(Rule::compile(a, names)?), Box::new(Rule::compile(b, names)?)),
            Expr::And(a, b) => Rule::And(Box::new(Rule::compile(a, names)?), Box::new(Rule::compile(b, names)?)),
            Expr::Or(a, b) => Rule::Or(Box::new(Rule::compile(a, names)?), Box::new(Rule::compile(b, names)?)),
        })
    }

    /// Evaluates the rule as a condition: `Ok(true)` includes the event.
    pub(crate) fn test(&self, event: Event<'_>) -> Result<bool, RuleError> {
        // The common rule (`status == "approved"`), without a value between.
        match self {
            Rule::FieldIsStr { field, name, text, negate } => return field_is_str(event, field, name, text, *negate),
            Rule::FieldIsNum { field, name, value, spelled, negate } => {
                return field_is_num(event, field, name, (value, spelled), *negate)
            }
            _ => {}
        }
        match self.eval(event)? {
            V::Bool(b) => Ok(b),
            _ => Err("the rule does not give true or false".into()),
        }
    }

    fn eval<'a>(&'a self, event: Event<'a>) -> Result<V<'a>, RuleError> {
        Ok(match self {
            Rule::Lit(Lit::Null) => V::Null,
            Rule::Lit(Lit::Bool(b)) => V::Bool(*b),
            Rule::Lit(Lit::Num(n)) => V::Num(*n),
            Rule::Lit(Lit::Str(s)) => V::Str(Cow::Borrowed(s)),
            Rule::List(items) => V::List(items.iter().map(|i| i.eval(event)).collect::<Result<_, _>>()?),
            Rule::Field(field, name) => match event.get(field) {
                Some(val) => from_json(val)?,
                None => return Err(format!("missing {name}")),
            },
            Rule::FieldIsStr { field, name, text, negate } => V::Bool(field_is_str(event, field, name, text, *negate)?),
            Rule::FieldIsNum { field, name, value, spelled, negate } => {
                V::Bool(field_is_num(event, field, name, (value, spelled), *negate)?)
            }
            Rule::Has(field) => V::Bool(event.get(field).is_some()),
            Rule::Not(inner) => match inner.eval(event)? {
                V::Bool(b) => V::Bool(!b),
                _ => return Err("`!` needs true or false".into()),
            },
            Rule::And(a, b) => logic(a.eval(event), || b.eval(event), false)?,
            Rule::Or(a, b) => logic(a.eval(event), || b.eval(event), true)?,
            Rule::Cmp(op, a, b) => {
                let (a, b) = (a.eval(event)?, b.eval(event)?);
                V::Bool(match op {
                    CmpOp::Eq => equal(&a, &b),
                    CmpOp::Ne => !equal(&a, &b),
                    _ => {
                        let ord = order(&a, &b).ok_or_else(|| "cannot order".to_owned())?;
                        match op {
                            CmpOp::Lt => ord == Ordering::Less,
                            CmpOp::Le => ord != Ordering::Greater,
                            CmpOp::Gt => ord == Ordering::Greater,
                            _ => ord != Ordering::Less,
                        }
                    }
                })
            }
            Rule::In(a, b) => {
                let (a, b) = (a.eval(event)?, b.eval(event)?);
                V::Bool(match b {
                    V::List(items) => items.iter().any(|item| equal(&a, item)),
                    V::Json(val) if val.tag() == Tag::Array => {
                        let mut found = false;
                        for child in val.children() {
                            if equal(&a, &from_json(child)?) {
                                found = true;
                                break;
                            }
                        }
                        found
                    }
                    _ => return Err("`in` needs a list on its right".into()),
                })
            }
        })
    }
}

/// A CEL condition over any JSON document, outside the hot path: a
/// contract's `[[check]] row` over a published row (issue 18), with the
/// same semantics as `where`.
#[derive(Debug, Clone)]
pub struct Condition {
    rule: Rule,
    names: Names,
}

impl Condition {
    pub fn compile(expr: &Expr) -> Result<Condition, String> {
        let mut names = Names::default();
        let rule = Rule::compile(expr, &mut names)?;
        Ok(Condition { rule, names })
    }

    /// `Ok(true)` passes; an error says why it could not be evaluated
    /// (a missing field, ordering a null).
    pub fn test(&self, json: &str) -> Result<bool, String> {
        let mut doc = crate::json::Doc::default();
        let mut slots = Vec::new();
        doc.parse_event(json, None, &self.names, &mut slots, crate::json::Bounds::MAX).map_err(|e| e.text())?;
        self.rule.test(Event::from_slots(doc.root(json), &slots))
    }
}

/// Whether a field is the string `text` (`!=` when `negate`); an error when it is missing.
fn field_is_str(event: Event<'_>, field: &FieldRef, name: &str, text: &str, negate: bool) -> Result<bool, RuleError> {
    match event.get(field) {
        Some(val) => Ok((val.tag() == Tag::String && val.str_is(text)) != negate),
        None => Err(format!("missing {name}")),
    }
}

/// Whether a field is a number equal to `value` (`!=` when `negate`): an
/// error when it is missing or a number past 28 digits, as the general
/// comparison gives. `value` comes with the rule's text of it: a number
/// written the same way parses to it, so it is equal unparsed.
fn field_is_num(
    event: Event<'_>,
    field: &FieldRef,
    name: &str,
    (value, spelled): (&Decimal, &str),
    negate: bool,
) -> Result<bool, RuleError> {
    let Some(val) = event.get(field) else { return Err(format!("missing {name}")) };
    let is = match val.tag() {
        Tag::Number if val.raw() == spelled => true,
        Tag::Number => {
            parse_decimal(val.raw()).ok_or_else(|| format!("number {} is out of range", val.raw()))? == *value
        }
        _ => false,
    };
    Ok(is != negate)
}

fn field_and_number<'e>(a: &'e Expr, b: &'e Expr) -> Option<(&'e weir_contract::FieldPath, &'e str)> {
    match (a, b) {
        (Expr::Field(p), Expr::Number(n)) | (Expr::Number(n), Expr::Field(p)) => Some((p, n)),
        _ => None,
    }
}

fn field_and_str<'e>(a: &'e Expr, b: &'e Expr) -> Option<(&'e weir_contract::FieldPath, &'e str)> {
    match (a, b) {
        (Expr::Field(p), Expr::Str(s)) | (Expr::Str(s), Expr::Field(p)) => Some((p, s)),
        _ => None,
    }
}

/// `&&` (`decisive` = false) and `||` (`decisive` = true), commutative over errors.
fn logic<'a>(
    left: Result<V<'a>, RuleError>,
    right: impl FnOnce() -> Result<V<'a>, RuleError>,
    decisive: bool,
) -> Result<V<'a>, RuleError> {
    let op = if decisive { "||" } else { "&&" };
    let as_bool = |v: Result<V<'a>, RuleError>| match v {
        Ok(V::Bool(b)) => Ok(b),
        Ok(_) => Err(format!("`{op}` needs true or false")),
        Err(e) => Err(e),
    };
    let left = as_bool(left);
    if left == Ok(decisive) {
        return Ok(V::Bool(decisive));
    }
    let right = as_bool(right());
    match (left, right) {
        (_, Ok(b)) if b == decisive => Ok(V::Bool(decisive)),
        (Ok(_), Ok(_)) => Ok(V::Bool(!decisive)),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

fn from_json(val: Val<'_>) -> Result<V<'_>, RuleError> {
    Ok(match val.tag() {
        Tag::Null => V::Null,
        Tag::True => V::Bool(true),
        Tag::False => V::Bool(false),
        Tag::Number => V::Num(parse_decimal(val.raw()).ok_or_else(|| format!("number {} is out of range", val.raw()))?),
        Tag::String => V::Str(val.str().unwrap_or_default()),
        Tag::Array | Tag::Object => V::Json(val),
    })
}

fn equal(a: &V<'_>, b: &V<'_>) -> bool {
    match (a, b) {
        (V::Null, V::Null) => true,
        (V::Bool(x), V::Bool(y)) => x == y,
        (V::Num(x), V::Num(y)) => x == y,
        (V::Str(x), V::Str(y)) => x == y,
        (V::List(x), V::List(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| equal(p, q)),
        (V::Json(x), V::Json(y)) => x.canonical_hash() == y.canonical_hash(),
        _ => false,
    }
}

fn order(a: &V<'_>, b: &V<'_>) -> Option<Ordering> {
    match (a, b) {
        (V::Num(x), V::Num(y)) => Some(x.cmp(y)),
        (V::Str(x), V::Str(y)) => Some(x.cmp(y)),
        (V::Bool(x), V::Bool(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Doc;

    /// `check(rule, event, expect)`: `Some(b)` for a result, `None` for an error.
    fn check(rule: &str, event: &str, expect: Option<bool>) {
        let mut names = Names::default();
        let rule = Rule::compile(&weir_contract::parse_rule(rule).unwrap(), &mut names).unwrap();
        let mut doc = Doc::default();
        let mut slots = Vec::new();
        doc.parse_event(event, None, &names, &mut slots, crate::json::Bounds::MAX).unwrap();
        let ev = Event::from_slots(doc.root(event), &slots);
        assert_eq!(rule.test(ev).ok(), expect, "{rule:?} on {event}");
    }

    #[test]
    fn comparisons() {
        check(r#"status == "approved""#, r#"{"status":"approved"}"#, Some(true));
        check(r#"status == "approved""#, r#"{"status":"declined"}"#, Some(false));
        check(r#"status == "approved""#, r#"{}"#, None);
        check("amount >= 0", r#"{"amount":12.5}"#, Some(true));
        check("amount >= 0", r#"{"amount":"12.5"}"#, None);
        check("amount >= 0", r#"{"amount":null}"#, None);
        check("amount == 12.50", r#"{"amount":12.5}"#, Some(true));
        check("amount == 1", r#"{"amount":"1"}"#, Some(false));
        check("x == null", r#"{"x":null}"#, Some(true));
        check("a.b < 'm'", r#"{"a":{"b":"k"}}"#, Some(true));
    }

    #[test]
    fn a_condition_reads_a_whole_document() {
        let c = |rule: &str| Condition::compile(&weir_contract::parse_rule(rule).unwrap()).unwrap();
        let row = r#"{"values":{"revenue":-5.50,"n":2},"events":2,"key":{"acct":{"id":"a-1"}}}"#;
        assert_eq!(c("values.revenue >= 0").test(row), Ok(false));
        assert_eq!(c("values.n == events && key.acct.id == 'a-1'").test(row), Ok(true));
        assert!(c("values.missing > 0").test(row).unwrap_err().contains("missing values.missing"));
        assert!(c("values.revenue > 0").test("not json").is_err());
    }

    #[test]
    fn logic_absorbs_errors_like_cel() {
        check(r#"has(currency) && currency == "EUR""#, r#"{}"#, Some(false));
        check(r#"currency == "EUR" && has(currency)"#, r#"{}"#, Some(false));
        check(r#"currency == "EUR" || true"#, r#"{}"#, Some(true));
        check(r#"currency == "EUR" || false"#, r#"{}"#, None);
        check(r#"!(status == "declined") && amount >= 0"#, r#"{"status":"declined","amount":null}"#, Some(false));
        check(r#"!(status == "declined") && amount >= 0"#, r#"{"status":"approved","amount":null}"#, None);
        check("!amount", r#"{"amount":1}"#, None);
        check("amount", r#"{"amount":true}"#, Some(true));
    }

    fn result(rule: &str, event: &str) -> Option<bool> {
        let mut names = Names::default();
        let rule = Rule::compile(&weir_contract::parse_rule(rule).unwrap(), &mut names).unwrap();
        let mut doc = Doc::default();
        let mut slots = Vec::new();
        doc.parse_event(event, None, &names, &mut slots, crate::json::Bounds::MAX).unwrap();
        rule.test(Event::from_slots(doc.root(event), &slots)).ok()
    }

    #[test]
    fn a_field_equal_to_a_number_is_what_the_general_comparison_says() {
        let events = [
            r#"{"x":2}"#,
            r#"{"x":2.00}"#,
            r#"{"x":2.0}"#,
            r#"{"x":-2}"#,
            r#"{"x":20}"#,
            r#"{"x":2e0}"#,
            r#"{"x":"2"}"#,
            r#"{"x":null}"#,
            r#"{"x":true}"#,
            r#"{"x":[2]}"#,
            r#"{"x":{"y":2}}"#,
            r#"{"x":123456789012345678901234567890123}"#,
            r#"{}"#,
            r#"{"x":1,"x":2}"#,
        ];
        for event in events {
            for n in ["2", "2.0", "-2", "0"] {
                // Membership in a one-item list compares as `==` does, through values.
                let general = result(&format!("x in [{n}]"), event);
                assert_eq!(result(&format!("x == {n}"), event), general, "x == {n} on {event}");
                assert_eq!(result(&format!("{n} == x"), event), general, "{n} == x on {event}");
                assert_eq!(result(&format!("x != {n}"), event), general.map(|b| !b), "x != {n} on {event}");
            }
        }
    }

    #[test]
    fn membership() {
        check(r#"status in ["approved", "captured"]"#, r#"{"status":"captured"}"#, Some(true));
        check(r#"status in ["approved", "captured"]"#, r#"{"status":"declined"}"#, Some(false));
        check(r#"status in ["approved"]"#, r#"{}"#, None);
        check(r#""vip" in tags"#, r#"{"tags":["new","vip"]}"#, Some(true));
        check(r#""vip" in tags"#, r#"{"tags":"vip"}"#, None);
        check("has(a.b)", r#"{"a":{"b":null}}"#, Some(true));
        check("has(a.b)", r#"{"a":1}"#, Some(false));
    }
}
