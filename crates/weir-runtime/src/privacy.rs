//! What of a raw event may leave weir, and to whom (SECURITY.md).
//!
//! A contract's `[privacy] personal` fields never reach a row (the contract
//! is refused if its key, event time or an aggregated field is personal).
//! Ledger entries carry the raw event (`payload`) and a `detail` that can
//! quote its values: a raw-reader sees them whole; everyone else gets
//! [`published`] entries; the Kafka ledger sink gets [`for_sink`] entries,
//! whose payload has its personal fields masked.

use serde_json::Value;
use weir_contract::Contract;

pub use weir_store::privacy::{mask_event, MASK};

fn event_id_is_personal(contract: &Contract) -> bool {
    let id = contract.source.event_id.as_ref();
    id.is_some_and(|id| contract.personal.iter().any(|p| weir_contract::overlaps(p, id)))
}

fn mask_event_id(entry: &mut serde_json::Map<String, Value>, contract: &Contract) {
    if event_id_is_personal(contract) && entry.contains_key("event_id") {
        entry.insert("event_id".into(), MASK.into());
    }
}

/// A ledger entry for readers who are not raw-readers: no payload, no
/// detail (it quotes the raw value), the event id masked when personal.
pub fn published(mut entry: Value, contract: &Contract) -> Value {
    if let Some(m) = entry.as_object_mut() {
        m.remove("payload");
        m.remove("detail");
        mask_event_id(m, contract);
    }
    entry
}

/// A ledger entry for `[sink] ledger_topic`: the payload with its personal
/// fields masked (withheld whole when it is not JSON, since it cannot be
/// masked), the detail dropped when the contract names personal fields.
pub fn for_sink(mut entry: Value, contract: &Contract) -> Value {
    if contract.personal.is_empty() {
        return entry;
    }
    if let Some(m) = entry.as_object_mut() {
        m.remove("detail");
        mask_event_id(m, contract);
        if let Some(payload) = m.get("payload").and_then(Value::as_str) {
            let masked = mask_event(payload, &contract.personal);
            m.insert("payload".into(), masked.map_or(Value::Null, Value::String));
        }
    }
    entry
}
