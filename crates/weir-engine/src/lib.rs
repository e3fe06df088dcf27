//! weir's engine: windows, watermarks, lateness, dedup, aggregates and
//! emission (SPEC.md section 3), and snapshots of all of it.
//!
//! No I/O, no async runtime, no wall clock: a caller feeds [`EventIn`]s to an
//! [`Engine`] and drains [`Output`]. The command line, the server, replay and
//! tests all drive this same type.

mod agg;
mod engine;
pub mod intake;
mod json;
mod key;
pub mod lateness;
mod number;
mod order;
mod output;
mod plan;
mod prefetch;
mod recall;
mod rule;
mod snapshot;
mod table;
mod text;
pub mod time;
mod timers;

pub use agg::OutValue;
pub use engine::{
    Counters, Engine, EventIn, EventReader, Mode, PlanError, ReadEvent, SpareMade, SpareWanted, WM_MAX, WM_MIN,
};
pub use key::{encode as encode_key, write_json as key_json, KeyValue};
pub use output::{KeyBytes, LedgerEntry, Output, Reason, Row, RowFormat, Source, Sources, Status, Values};
pub use recall::Recall;
pub use rule::Condition;
pub use snapshot::{Delta, SnapshotError, SNAPSHOT_FORMAT};
pub use text::write_str;

/// A seeded xorshift for the unit tests' generated inputs: `next(n)` is a
/// number below `n`. The seed is printed, so a failure names its inputs.
#[cfg(test)]
pub(crate) fn numbers(seed: u64) -> impl FnMut(usize) -> usize {
    println!("seed {seed:#x}");
    let mut state = seed;
    move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    }
}
