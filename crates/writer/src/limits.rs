//! The thread table's dimensions and the smallest buffer: a leaf, since
//! the buffer pool sizes by them (buffer.rs `MAX_SMALL_BUFFERS`), the
//! thread table (thread.rs) holds buffers, and the session checks its
//! configuration against them.

/// Most threads that can hold a slot at once. A thread that finds none has
/// its events counted as lost (never silently dropped).
///
/// The table is static (`MAX_THREADS * 128` bytes, 2 MiB of bss): a slot
/// costs memory only once a thread has claimed it (claims take the lowest
/// free slot), and advance and stop look only at the slots below the
/// highest ever claimed (thread.rs `used_slots`). What a thread holds
/// besides its slot is a one-page buffer per stream it records on
/// (buffer.rs `SMALL_BUFFER_CAP`; full-size ones only once it fills that)
/// and its capture state (stacks/capture).
pub(crate) const MAX_THREADS: usize = 16384;

/// Number of per-thread streams (thread.rs `Stream`).
pub(crate) const STREAMS: usize = 2;

/// The smallest buffer size a session accepts.
pub const MIN_BUFFER_SIZE: usize = 4096;
