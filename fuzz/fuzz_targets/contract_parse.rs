//! Contract and weir.toml parsing: any text is a contract or a list of
//! refusals with file, line and key. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(c) = weir_contract::Contract::parse("fuzz.toml", text) {
        let _ = c.summary();
    }
    let _ = weir_contract::ServerConfig::parse("weir.toml", text);
});
