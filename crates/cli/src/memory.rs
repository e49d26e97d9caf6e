//! The process's heap: mimalloc, as datafusion-cli ships, and giving freed memory back to
//! the operating system when the server is idle.
//!
//! With glibc's malloc the same scan in the same binary ran 9-18 % faster or slower from
//! one process to the next: glibc moves its mmap threshold with what the process freed
//! before, so one process served a batch's buffers from its heap while the next mapped and
//! faulted them in anew (50,000 page faults for a 5M-row scan; benches/RESULTS.md). mimalloc
//! reuses freed pages per thread whatever came before.
//!
//! Built without transparent huge pages (`no_thp`): a fresh `clearice -c` on a host whose
//! memory other processes had fragmented stalled on the kernel's compaction for a huge page
//! (a 0.26 s query took 0.42 s).

/// Every Rust allocation of the `clearice` binary (and of the tests that link this crate).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Gives freed heap memory back to the operating system: the calling thread's and the
/// shared arenas' free pages of mimalloc (pages other threads still hold go back by
/// mimalloc's own purge, 1 s after they are freed, when those threads next allocate), and
/// glibc's free lists (C libraries such as zstd allocate there). Blocking (it walks free
/// lists): call it on a blocking thread, when no query runs.
pub fn release_free_memory() {
    // SAFETY: mi_collect takes no pointers; it frees only memory mimalloc owns and no
    // live allocation refers to, and it is thread-safe.
    #[expect(unsafe_code, reason = "mimalloc's collection has no safe binding")]
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    clearice_engine::Engine::release_free_memory();
}
