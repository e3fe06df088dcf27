//! What of a ledger entry is stored for everyone, and what only for
//! raw-readers (SECURITY.md, "Personal data").
//!
//! When a contract names `[privacy] personal` fields, each ledger entry is
//! stored twice in the checkpoint's transaction: masked in `ledger` (the
//! payload with each personal value replaced by [`MASK`], withheld when it
//! is not JSON; no `detail`, which can quote a raw value; the event id
//! masked when it is personal), which every reader, report and sink reads;
//! and whole in `ledger_raw`, which only a raw-reader's ledger read joins.
//! Without personal fields the entry is stored once, in `ledger`.

use serde_json::Value;
use weir_contract::{Contract, FieldPath};

/// What stands where a personal value was.
pub const MASK: &str = "(personal)";

/// A contract's personal fields, as the store needs them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Privacy {
    pub personal: Vec<FieldPath>,
    /// Whether the event id is (or lies in) a personal field.
    pub event_id: bool,
}

impl Privacy {
    pub fn of(contract: &Contract) -> Privacy {
        let id = contract.source.event_id.as_ref();
        let event_id = id.is_some_and(|id| contract.personal.iter().any(|p| weir_contract::overlaps(p, id)));
        Privacy { personal: contract.personal.clone(), event_id }
    }

    /// The personal fields as text, to tell whether a ledger was masked for these.
    pub fn fields_text(&self) -> String {
        self.personal.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
    }

    /// Whether entries are stored masked, with the raw entry beside them.
    pub fn masks(&self) -> bool {
        !self.personal.is_empty()
    }

    /// The entry (one JSON object) as stored for everyone: see the module.
    /// A line that is not a JSON object is withheld whole (`{}`).
    pub fn masked_entry(&self, line: &str) -> String {
        let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(line) else { return "{}".into() };
        m.remove("detail");
        if self.event_id && m.contains_key("event_id") {
            m.insert("event_id".into(), MASK.into());
        }
        if let Some(payload) = m.get("payload").and_then(Value::as_str) {
            let masked = mask_event(payload, &self.personal);
            m.insert("payload".into(), masked.map_or(Value::Null, Value::String));
        }
        Value::Object(m).to_string()
    }
}

/// The event with every personal field's value replaced by [`MASK`];
/// `None` when it is not JSON.
pub fn mask_event(payload: &str, personal: &[FieldPath]) -> Option<String> {
    let mut v: Value = serde_json::from_str(payload).ok()?;
    for path in personal {
        mask_path(&mut v, path.segments());
    }
    Some(v.to_string())
}

fn mask_path(v: &mut Value, segments: &[String]) {
    let Some((first, rest)) = segments.split_first() else { return };
    let Some(child) = v.as_object_mut().and_then(|m| m.get_mut(first)) else { return };
    if rest.is_empty() {
        *child = MASK.into();
    } else {
        mask_path(child, rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn personal_fields_are_masked_at_any_depth_and_only_they() {
        let personal = [FieldPath::parse("email").unwrap(), FieldPath::parse("card.last4").unwrap()];
        let masked = mask_event(r#"{"email":"a@b.c","card":{"last4":"4242","brand":"visa"},"amount":3}"#, &personal);
        let v: Value = serde_json::from_str(&masked.unwrap()).unwrap();
        assert_eq!(v["email"], MASK);
        assert_eq!(v["card"]["last4"], MASK);
        assert_eq!(v["card"]["brand"], "visa");
        assert_eq!(v["amount"], 3);
        assert_eq!(mask_event("{not json", &personal), None);
    }

    #[test]
    fn a_stored_entry_keeps_no_personal_value_no_detail_and_no_unmaskable_payload() {
        let p = Privacy { personal: vec![FieldPath::parse("email").unwrap()], event_id: true };
        let line = r#"{"seq":3,"reason":"bad_type","event_id":"a@b.c","detail":"amount of a@b.c","payload":"{\"email\":\"a@b.c\",\"amount\":\"x\"}"}"#;
        let v: Value = serde_json::from_str(&p.masked_entry(line)).unwrap();
        assert_eq!((v["seq"].as_i64(), v["event_id"].as_str(), v.get("detail")), (Some(3), Some(MASK), None));
        assert_eq!(v["payload"], r#"{"amount":"x","email":"(personal)"}"#);
        let cut = r#"{"seq":4,"payload":"{\"email\":\"a@b.c\",\"amo"}"#;
        assert_eq!(serde_json::from_str::<Value>(&p.masked_entry(cut)).unwrap()["payload"], Value::Null);
        assert!(!p.masked_entry(line).contains("a@b.c"));
    }
}
