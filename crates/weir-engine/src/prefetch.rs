//! Cache prefetch hints: the crate's only unsafe code.
//!
//! `read(&x)` asks the CPU to start loading the cache line holding `x`; it
//! never faults and changes nothing the program can observe. The duplicate
//! check on a table of a million ids uses it to overlap the table's cache
//! miss with parsing (BENCHMARKS.md, "prefetching the id's slot").
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
pub(crate) fn read<T>(value: &T) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // SAFETY: SSE is part of the x86_64 baseline, and a prefetch of any
    // address (here a valid reference) has no effect but on the caches.
    unsafe { _mm_prefetch::<_MM_HINT_T0>((value as *const T).cast::<i8>()) }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn read<T>(_value: &T) {}
