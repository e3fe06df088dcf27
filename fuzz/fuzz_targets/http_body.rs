//! The body of `POST /v1/topics/{topic}/events`: any bytes are events or a
//! refusal naming the line. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = weir_engine::intake::parse_body(data, Some("account_id"), 1 << 16);
    let _ = weir_engine::intake::parse_body(data, None, 64);
});
