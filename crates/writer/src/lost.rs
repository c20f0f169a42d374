//! The counters of what a generation lost, by generation parity: a leaf,
//! so that the event path, the capture and the session's end of a
//! generation share them without importing each other.

use core::sync::atomic::AtomicU64;

/// Events lost by threads without a slot, per generation parity.
pub(crate) static LOST_WITHOUT_SLOT: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Allocations recorded without their stack, by generation parity (the
/// generation-end batch's `lost_stacks`): a stack ID the caller passed that
/// names no stack, or a capture that found no state. Counted inside the
/// event's seqlock section, so the generation's end (after the handshake)
/// sees every count of it.
pub(crate) static LOST_STACKS: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];
