//! Model-checks the generation-advance handshake (src/handshake.rs) with
//! loom: after an advance has stored the new generation and waited for a
//! writer's seqlock, that writer never again writes a buffer of the old
//! generation, whatever the interleaving.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p alloctrace-core --test loom_handshake`
//! (`make loom`).
#![cfg(loom)]

use alloctrace_core::SeqLock;
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use loom::sync::Arc;

struct Shared {
    generation: AtomicU64,
    seq: SeqLock,
    /// Set by the advancer once it has taken the old generation's buffer.
    old_taken: AtomicBool,
    /// Set by the writer when it wrote into the old generation's buffer
    /// after it was taken: the bug the handshake must prevent.
    wrote_after_take: AtomicBool,
}

/// One event, as the tracer's event path does it.
fn write_event(s: &Shared) {
    assert!(s.seq.try_begin());
    let generation = s.generation.load(Ordering::Acquire);
    if generation == 1 && s.old_taken.load(Ordering::SeqCst) {
        s.wrote_after_take.store(true, Ordering::SeqCst);
    }
    s.seq.end();
}

#[test]
fn advance_never_takes_a_buffer_in_use() {
    loom::model(|| {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(1),
            seq: SeqLock::new(),
            old_taken: AtomicBool::new(false),
            wrote_after_take: AtomicBool::new(false),
        });
        let writer = {
            let s = Arc::clone(&shared);
            loom::thread::spawn(move || {
                write_event(&s);
                write_event(&s);
            })
        };
        shared.generation.store(2, Ordering::SeqCst);
        alloctrace_core::heavy_barrier();
        shared.seq.wait_quiescent();
        shared.old_taken.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        assert!(!shared.wrote_after_take.load(Ordering::SeqCst), "a writer used the old generation after the advance took it");
    });
}
