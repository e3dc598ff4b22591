//! Counts this process's heap allocations, for the rows' `client_allocs_*`.
//!
//! Each thread counts in a slot of its own (a cache line each), so the count costs an allocation a
//! plain add on a line no other thread writes: a shared atomic counter, hit by every thread of every
//! library, would itself cost the rows more than the allocations it counts. A thread takes its
//! slot on its first allocation; threads past [`SLOTS`] share the last one, atomically all the same.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Threads with a slot of their own: the runtime's workers, blocking threads and the peers' own.
const SLOTS: usize = 512;

#[repr(align(64))]
struct Slot(AtomicU64);

static COUNTS: [Slot; SLOTS] = [const { Slot(AtomicU64::new(0)) }; SLOTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MINE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The global allocator: the system's, counting.
pub struct Counting;

fn count() {
    // `try_with`: a thread's allocations after its thread-locals are gone still count.
    let slot = MINE
        .try_with(|mine| {
            if mine.get() == usize::MAX {
                mine.set(NEXT.fetch_add(1, Relaxed).min(SLOTS - 1));
            }
            mine.get()
        })
        .unwrap_or(SLOTS - 1);
    COUNTS[slot].0.fetch_add(1, Relaxed);
}

// SAFETY: every call is passed to the system allocator unchanged; counting allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc(layout)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc_zeroed(layout)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        System.realloc(ptr, layout, new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

/// Allocations (and reallocations) so far, over every thread.
pub fn allocations() -> u64 {
    COUNTS.iter().map(|slot| slot.0.load(Relaxed)).sum()
}
