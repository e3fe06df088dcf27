//! What the store's tests share: the payments contract and its events.

/// The payments contract: per account, a 1-minute tumbling sum, early rows, late events revise.
pub const CONTRACT: &str = r#"
[pipeline]
name = "paid"
version = 1
owner = "billing-ops"
steward = "data-platform"
decision = "Unlock paid features"

[source]
topic = "payments"
event_time = "t"
key = ["acct"]
event_id = "id"
max_delay = "0s"

[window]
type = "tumbling"
size = "1m"
allowed_lateness = "10m"
late = "revise"
early = true

[[aggregate]]
name = "total"
fn = "sum"
field = "amount"
"#;

/// A payment `id` of account `acct` at `t_s` seconds past 2025-11-29T00:00Z.
pub fn event(id: u32, acct: u32, t_s: i64, amount: &str) -> String {
    let t = weir_engine::time::format_rfc3339_ms(1_764_374_400_000 + t_s * 1_000);
    format!(r#"{{"id":"p{id}","acct":"a{acct}","t":"{t}","amount":{amount}}}"#)
}
