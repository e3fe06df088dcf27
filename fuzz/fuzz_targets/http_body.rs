//! The body of `POST /v1/topics/{topic}/events`: any bytes are events or a
//! refusal naming the line. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

use weir_engine::intake::{parse_body, Limits};

fuzz_target!(|data: &[u8]| {
    let _ = parse_body(data, Some("account_id"), &Limits::size(1 << 16));
    let tight = Limits { max_event_bytes: 64, max_depth: 3, max_fields: 8, max_key_bytes: 4, max_events: 16 };
    let _ = parse_body(data, Some("k"), &tight);
});
