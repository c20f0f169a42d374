//! The session as the writer thread's host: what writer/mod.rs, below the
//! session layer, needs of a session, passed down ([`WriterHost`]). Apart
//! from session/mod.rs so that the session's state imports none of the layer's
//! other modules.

use core::sync::atomic::Ordering;

use crate::buffer::BufferPool;
use crate::session::Session;
use crate::writer::{Writer, WriterHost};

/// The writer thread's view of the session (writer/mod.rs is below this
/// module: it gets these passed down).
impl WriterHost for Session {
    fn writer(&self) -> &Writer {
        &self.writer
    }

    fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// Counts bytes out, and asks the advancer to end the generation once
    /// it is over budget.
    fn count_written(&self, n: usize) {
        let bytes = &self.bytes;
        let total = bytes.written.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
        let start = bytes.generation_start.load(Ordering::Relaxed);
        if bytes.generation_bytes > 0
            && total.saturating_sub(start) >= bytes.generation_bytes
            && !self.advancer.wanted.swap(true, Ordering::AcqRel)
        {
            self.advancer.thread.wake();
        }
    }

    fn lists_modules(&self) -> bool {
        crate::session::meta::lists_modules()
    }

    fn generation_span(&self, generation: u64) -> (u64, Option<u64>) {
        crate::session::meta::generation_span(generation)
    }

    /// Capture states for threads' first native stacks, and the unwinder
    /// refreshed when a capture found code outside every known module
    /// (stacks/capture): built here, where allocating is safe.
    fn idle(&self) {
        crate::stacks::capture::refill_pool();
        crate::stacks::capture::refresh_if_stale();
    }

    /// The flight recorder's RSS trigger: the advancer ends the generation
    /// (the writer thread never waits for an advance).
    fn want_advance(&self) {
        self.advancer.wanted.store(true, Ordering::Release);
        self.advancer.thread.wake();
    }

    /// Modules unloaded before the next generation started are listed by
    /// no later one.
    fn generation_written(&self, generation: u64) {
        crate::stacks::module_table::forget_unloaded_before(
            crate::session::meta::generation_start(generation + 1),
        );
    }
}
