//! Blocking wrappers around the async API (work in progress).
