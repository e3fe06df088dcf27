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

/// Checkpoint `i`'s changed windows, over 300 window ids: 40 written (each
/// with bytes naming the checkpoint) and 5 dropped, so a window changes in
/// many checkpoints and some are dropped and written again; the first 20
/// checkpoints also write a window of their own that none changes again.
pub fn window_changes(i: u64) -> Vec<(u128, Option<Vec<u8>>)> {
    let id = |j: u64| u128::from((i * 37 + j * 61) % 300) << 64 | 7;
    let put = (0..40).map(|j| (id(j), Some(format!("checkpoint {i} window {j}").into_bytes())));
    let dropped = (40..45).map(|j| (id(j), None));
    let settled = (i <= 20).then(|| (u128::from(1_000 + i) << 64 | 7, Some(format!("settled at {i}").into_bytes())));
    put.chain(dropped).chain(settled).collect()
}

/// The windows `window_changes(1..=n)` leave, in the order of their ids.
pub fn windows_after(n: u64) -> Vec<(u128, Vec<u8>)> {
    windows_last_changed_through(n, n)
}

/// Of the windows `window_changes(1..=n)` leave, those no checkpoint after
/// `k` changed, in the order of their ids.
pub fn windows_last_changed_through(k: u64, n: u64) -> Vec<(u128, Vec<u8>)> {
    let mut state = std::collections::BTreeMap::new();
    for i in 1..=n {
        for (id, data) in window_changes(i) {
            state.insert(id, data.map(|d| (i, d)));
        }
    }
    state.into_iter().filter_map(|(id, last)| last.filter(|(i, _)| *i <= k).map(|(_, d)| (id, d))).collect()
}
