//! The process's allocator: mimalloc, told to return freed memory to the
//! system 10 ms after it is freed instead of mimalloc 3's default of one
//! second.
//!
//! The engine's id table doubles as a run remembers more ids, and frees the
//! table it leaves. Held for a second, the tables freed before the last
//! doubling were still counted when the last one held its old and new
//! tables at once: the 5M payments (`weir run bench/paid_revenue.toml`)
//! peaked at 254-280 MiB, over issue 41's 250 MiB; with 10 ms they peak at
//! 203-206 MiB (BENCHMARKS.md, "Peak memory: freed tables returned within
//! 10 ms").
//!
//! The one call that sets it is mimalloc's C interface, so this module is
//! the binary's only one that allows `unsafe` (STYLE.md: a benchmark
//! proved the need).
#![allow(unsafe_code)]

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_e` (mimalloc 2 and 3).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// How long freed memory stays with the allocator before it goes back to
/// the system, in milliseconds.
const PURGE_AFTER_MS: std::ffi::c_long = 10;

/// Sets the purge delay; call it first thing in `main`.
pub fn return_freed_memory_promptly() {
    // SAFETY: mi_option_set takes any option index and value, and only
    // stores the value; it may be called from any thread at any time.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_AFTER_MS) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_is_the_option_this_module_sets() {
        // SAFETY: mi_option_get only reads the option's value.
        let before = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        assert_eq!(before, 1000, "mimalloc 3's default purge delay: index {PURGE_DELAY} is another option");
        return_freed_memory_promptly();
        let after = unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
        assert_eq!(after, PURGE_AFTER_MS);
    }
}
