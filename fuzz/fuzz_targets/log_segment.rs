//! The log's segment reader: any bytes as the last segment of a partition
//! are recovered (a torn tail cut), read, or refused with an error; never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("weir-fuzz-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let partition = dir.join("t").join("0");
    if std::fs::create_dir_all(&partition).is_err() {
        return;
    }
    if std::fs::write(partition.join("00000000000000000000.seg"), data).is_err() {
        return;
    }
    if let Ok((log, _)) = weir_log::Log::open(&dir, weir_log::LogOptions::default()) {
        let mut from = 0;
        while let Ok(records) = log.read("t", 0, from, 100, 1 << 20) {
            let Some(last) = records.last() else { break };
            from = last.offset + 1;
        }
    }
});
