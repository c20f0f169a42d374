//! The atomics the tracer's concurrency protocol is built on, switched to
//! loom's under `--cfg loom` so the generation-advance handshake can be
//! model-checked (tests/loom_handshake.rs).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::thread::yield_now as spin_yield;

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) fn spin_yield() {
    std::thread::yield_now();
}
