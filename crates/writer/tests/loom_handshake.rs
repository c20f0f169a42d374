//! Model-checks the generation-advance handshake (src/handshake.rs) with
//! loom: after an advance has stored the new generation and waited for a
//! writer's seqlock, that writer never again writes a buffer of the old
//! generation, whatever the interleaving. And the flush of a thread's slot
//! by the thread that reclaims it once its owner is gone (thread.rs),
//! racing an advance, never pushes a batch of the old generation after its
//! end batch (it fails when the flush takes both parities, as the exit
//! flush once did).
//!
//! Under loom both sides of the handshake use real SeqCst fences (loom has
//! no membarrier). That is also what the real code does when membarrier
//! fails at run time: `heavy_barrier` retries until a call succeeds, which
//! is a barrier on every thread as modelled here, or aborts the process
//! (handshake.rs, "When membarrier fails at run time"). It never continues
//! with a fence on the advancer's side only; the last model below shows
//! that this would be wrong.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test --release -p alloctrace-writer --test loom_handshake`
//! (`make loom`).
#![cfg(loom)]

use alloctrace_writer::SeqLock;
use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
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
        alloctrace_writer::heavy_barrier();
        shared.seq.wait_quiescent();
        shared.old_taken.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        assert!(
            !shared.wrote_after_take.load(Ordering::SeqCst),
            "a writer used the old generation after the advance took it"
        );
    });
}

/// The buffers of one slot, one per generation parity, as flags: set while
/// the slot holds a batch of that parity.
struct Slot {
    generation: AtomicU64,
    seq: SeqLock,
    bufs: [AtomicBool; 2],
    /// Set by the advancer once it has written generation 1's end batch.
    generation_end: AtomicBool,
    /// Set when a batch of generation 1 was pushed after its end batch: the
    /// bug (invariant 3 of session.rs).
    pushed_after_end: AtomicBool,
}

/// The flush of an exiting thread, or of the thread that reclaims the slot
/// of one that is gone (emit.rs flush_exiting_thread): inside the
/// seqlock, it takes the buffer of the parity it read only.
fn flush_current_parity(s: &Slot) {
    assert!(s.seq.try_begin());
    let generation = s.generation.load(Ordering::Acquire);
    let parity = (generation & 1) as usize;
    if s.bufs[parity].swap(false, Ordering::AcqRel)
        && generation == 1
        && s.generation_end.load(Ordering::SeqCst)
    {
        s.pushed_after_end.store(true, Ordering::SeqCst);
    }
    s.seq.end();
}

/// A thread records an event and exits; a second thread, seeing it gone
/// (the join stands for tgkill's ESRCH), reclaims its slot and flushes it
/// as its owner, while an advance from generation 1 to 2 runs. Whatever the
/// interleaving, no batch of generation 1 is pushed after generation 1's
/// end batch, and every batch of generation 1 is pushed exactly once.
#[test]
fn reclaim_of_a_dead_threads_slot_keeps_generation_order() {
    loom::model(|| {
        let slot = Arc::new(Slot {
            generation: AtomicU64::new(1),
            seq: SeqLock::new(),
            bufs: [AtomicBool::new(false), AtomicBool::new(false)],
            generation_end: AtomicBool::new(false),
            pushed_after_end: AtomicBool::new(false),
        });
        let reclaimer = {
            let s = Arc::clone(&slot);
            loom::thread::spawn(move || {
                let owner = {
                    let s = Arc::clone(&s);
                    loom::thread::spawn(move || {
                        // One event into the generation it reads.
                        assert!(s.seq.try_begin());
                        let generation = s.generation.load(Ordering::Acquire);
                        s.bufs[(generation & 1) as usize].store(true, Ordering::Relaxed);
                        s.seq.end();
                    })
                };
                owner.join().unwrap();
                flush_current_parity(&s);
            })
        };
        // The advance: new generation, handshake, take the old parity.
        slot.generation.store(2, Ordering::SeqCst);
        alloctrace_writer::heavy_barrier();
        slot.seq.wait_quiescent();
        slot.bufs[1].swap(false, Ordering::AcqRel);
        slot.generation_end.store(true, Ordering::SeqCst);
        reclaimer.join().unwrap();
        assert!(
            !slot.pushed_after_end.load(Ordering::SeqCst),
            "a reclaim pushed a batch of generation 1 after its end batch"
        );
        assert!(
            !slot.bufs[1].load(Ordering::SeqCst),
            "a batch of generation 1 was never pushed"
        );
    });
}

/// Why a failed membarrier must not fall back to a fence on the advancer's
/// side only: a writer that registered for asymmetric fences brackets its
/// event with compiler fences, which order nothing between threads, so
/// its counter store and generation load may pass the advancer's store and
/// loads in both directions; loom finds the interleaving in which the
/// writer reads the old generation and the advancer still sees it idle.
#[test]
#[should_panic(expected = "a writer used the old generation after the advance took it")]
fn a_lone_advancer_fence_does_not_pair_with_a_compiler_fence() {
    loom::model(|| {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(1),
            seq: SeqLock::new(),
            old_taken: AtomicBool::new(false),
            wrote_after_take: AtomicBool::new(false),
        });
        // The writer's counter, written as try_begin_asymmetric does: no
        // hardware fence between the store and the generation load.
        let counter = Arc::new(AtomicU64::new(0));
        let writer = {
            let s = Arc::clone(&shared);
            let counter = Arc::clone(&counter);
            loom::thread::spawn(move || {
                counter.store(1, Ordering::Relaxed);
                let generation = s.generation.load(Ordering::Relaxed);
                if generation == 1 && s.old_taken.load(Ordering::SeqCst) {
                    s.wrote_after_take.store(true, Ordering::SeqCst);
                }
                counter.store(2, Ordering::Release);
            })
        };
        shared.generation.store(2, Ordering::SeqCst);
        // The old fallback: a fence here alone.
        fence(Ordering::SeqCst);
        let seen = counter.load(Ordering::Acquire);
        if seen & 1 != 0 {
            while counter.load(Ordering::Acquire) == seen {
                loom::thread::yield_now();
            }
        }
        shared.old_taken.store(true, Ordering::SeqCst);
        writer.join().unwrap();
        assert!(
            !shared.wrote_after_take.load(Ordering::SeqCst),
            "a writer used the old generation after the advance took it"
        );
    });
}
