//! Cache prefetch hints: the crate's only unsafe code.
//!
//! `read(&x)` asks the CPU to start loading the cache line holding `x`; it
//! never faults and changes nothing the program can observe. The duplicate
//! check on a table of a million ids uses it to overlap the table's cache
//! miss with parsing (BENCHMARKS.md, "prefetching the id's slot").
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
fn read_at(at: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: SSE is part of the x86_64 baseline, and a prefetch of any
    // address, valid or not, has no effect but on the caches: it never
    // faults and reads nothing the program sees.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(at.cast::<i8>()) }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_at(_at: *const u8) {}

pub(crate) fn read<T>(value: &T) {
    read_at((value as *const T).cast::<u8>());
}

/// `read` for every cache line `value` spans: a window's aggregates lie
/// past its first line.
pub(crate) fn read_whole<T>(value: &T) {
    const LINE: usize = 64;
    let start = (value as *const T).cast::<u8>();
    let size = std::mem::size_of::<T>().max(1);
    // The first byte, then the first byte of each later line the value reaches.
    read_at(start);
    let mut next = (start as usize & !(LINE - 1)) + LINE;
    while next < start as usize + size {
        read_at(start.wrapping_add(next - start as usize));
        next += LINE;
    }
}
