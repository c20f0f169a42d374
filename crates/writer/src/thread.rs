//! Per-thread writer state: the thread slots, how a thread finds its slot,
//! and what happens when it exits.
//!
//! ## Design
//!
//! Slots live in one static table, so a slot's address stays valid for the
//! life of the process: a thread-local pointer to it can never dangle, even
//! across trace_stop and a later trace_start. A thread claims a free slot on
//! its first event and keeps it, with its one trace thread ID, until it is
//! gone:
//!
//! - *free* -> *owned*: the thread's first event (or `trace_writer_get`,
//!   `trace_thread_id`) claims the slot, records the thread's kernel thread
//!   ID and registers a pthread key whose destructor runs at its exit.
//! - *owned* -> *exiting*: the key destructor flushes the thread's buffers
//!   but leaves it the slot (and its thread-local pointer to it): glibc
//!   still runs code on the thread afterwards (other keys' destructors,
//!   `__libc_thread_freeres`, which calls `free(NULL)` twice), and those
//!   events land in the same slot, under the same thread ID. Advance and
//!   stop take them as any idle thread's.
//! - *exiting* -> *free*: once the thread no longer exists
//!   (`tgkill(pid, tid, 0)` fails with ESRCH), a thread that claims a slot
//!   reclaims it: it flushes what the dead thread left, as the slot's owner
//!   now, and takes the slot with a new thread ID. A claim checks a few
//!   exiting slots before it takes a free one, so the slot of a thread that
//!   just ended is the next one used and memory stays flat however many
//!   threads come and go.
//! - `trace_thread_destroy` (explicit): flushes and frees the slot at once;
//!   the thread's next event claims a new one, with a new thread ID.
//!
//! ## Invariants
//!
//! 1. Only a slot's owner writes its seqlock, its buffers of the parity it
//!    read, `last_ticks` and `lost`; a reclaimer becomes the owner only
//!    after it has seen the previous owner's thread gone and moved the slot
//!    to *reclaiming* by compare-exchange (so two claimers never both own
//!    it). Otherwise two threads would write one buffer.
//! 2. A reclaim never reads the dead thread's memory (its stack and TLS may
//!    be reused): only the slot, and the kernel's answer for its thread ID.
//! 3. A live thread never loses its slot: a thread ID that the kernel
//!    reused for a new thread of this process only delays the reclaim, and
//!    a process whose PID is not the one tracing started in (a vfork child,
//!    which shares this table with its parent) reclaims nothing.
//!
//! ## Corner cases
//!
//! - A thread whose first event comes after its key destructors ran (a
//!   thread that never allocated until glibc's `free(NULL)` at its exit)
//!   registers a key nobody will run: its slot stays *owned* after it is
//!   gone. Such slots are reclaimed (by the same check) when a claim finds
//!   no free or exiting slot; such a claim checks 32 slots, taking turns
//!   over the table, so a thread without a slot (whose every event claims
//!   again, and is counted lost) makes at most 32 syscalls per event.
//! - fork: the child keeps only the forking thread's slot, with the
//!   child's thread ID; a slot mid-reclaim in another thread is freed.
//! - A signal handler's first event while its thread is inside `claim`
//!   claims a slot of its own; the interrupted claim then overwrites the
//!   thread-local pointer, and the handler's slot is reclaimed as above
//!   once the thread is gone.

use core::cell::Cell;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicUsize};

use crate::buffer::Buffer;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::handshake::SeqLock;
use crate::tls::{self, Word};

/// The thread table's dimensions (limits.rs: the buffer pool sizes by
/// them, and this module holds buffers).
pub(crate) use crate::limits::{MAX_THREADS, STREAMS};

/// Per-thread streams, each with its own batch buffer per generation parity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    /// Heap object, span and stack events.
    Events = 0,
    /// Page tracer words.
    Pages = 1,
}

const SLOT_FREE: u32 = 0;
const SLOT_OWNED: u32 = 1;
/// The owner's exit flush ran; it may still record events until it is gone.
const SLOT_EXITING: u32 = 2;
/// A claiming thread found the owner gone and is taking the slot over.
const SLOT_RECLAIMING: u32 = 3;

/// Exiting slots a claim checks (one tgkill each) before it takes a free
/// slot: enough to find the slots of the threads that just ended.
const EXIT_CHECKS_PER_CLAIM: usize = 8;

/// Slots a claim that found none free checks, from [`FULL_CURSOR`] on.
const FULL_CHECKS_PER_CLAIM: usize = 32;

/// Where the next full-table check starts (modulo MAX_THREADS).
static FULL_CURSOR: AtomicUsize = AtomicUsize::new(0);

/// One thread's writer state.
///
/// `repr(C)`: the header's inline event path (include/alloctrace_inline.h,
/// `struct trace_writer`) reads and writes the fields up to `bufs` exactly
/// as the Rust event path does; the offsets are asserted below.
#[repr(C, align(128))]
pub(crate) struct ThreadSlot {
    /// Seqlock, odd while the owner is inside the event path (between
    /// reading the generation and finishing its writes). Written only by the
    /// owner; read by advance and stop, which wait for it to move on. Odd on
    /// entry also tells a signal handler that its thread is mid-event.
    pub(crate) seq: SeqLock,
    /// The owner's last timestamp, to keep its timestamps strictly
    /// increasing across buffers (precise clock; the coarse clock's
    /// published time needs no clamp and updates it only out of line).
    /// Owner only.
    pub(crate) last_ticks: AtomicU64,
    /// Unused, always 0: keeps the layout the header mirrors (it was the
    /// coarse clock's countdown to its next real clock read).
    reserved: AtomicU32,
    /// SLOT_FREE, SLOT_OWNED, SLOT_EXITING or SLOT_RECLAIMING (see the
    /// module doc). Claimed by compare-exchange from free, or from exiting
    /// or owned once the owner is gone; released by the owner.
    state: AtomicU32,
    /// The owner's thread pointer (`%fs:0` on x86-64, 0 elsewhere) while
    /// owned, else 0. The inline path checks it against its own, so a
    /// handle used on another thread or after its thread let the slot go
    /// falls back to the out-of-line path instead of racing the owner.
    pub(crate) owner: AtomicUsize,
    /// Batch buffers indexed `[generation % 2][stream]`, null when none.
    /// The owner loads and stores the current generation's pointers; advance
    /// and stop take (swap to null) the previous generation's pointers after
    /// the handshake; a thread's exit takes all of them.
    pub(crate) bufs: [[AtomicPtr<Buffer>; STREAMS]; 2],
    /// The trace thread ID (at least 1), new at every claim.
    pub(crate) id: AtomicU64,
    /// Events the owner could not record, per generation parity. The owner
    /// adds; advance takes the previous generation's count.
    pub(crate) lost: [AtomicU64; 2],
    /// The owner's kernel thread ID (gettid), set at claim; 0 when free.
    tid: AtomicI32,
    /// Odd while the owner captures a native stack (stacks/capture, invariant
    /// 2): a swap of the unwinder waits for it as an advance waits for
    /// `seq`. Written only by the owner.
    pub(crate) capture_seq: SeqLock,
    /// The owner's capture state (stacks/capture), null until its first
    /// capture; kept from owner to owner, never freed.
    pub(crate) capture: AtomicPtr<()>,
}

// The layout the header's `struct trace_writer` mirrors.
static_assertions::const_assert_eq!(core::mem::offset_of!(ThreadSlot, seq), 0);
static_assertions::const_assert_eq!(core::mem::offset_of!(ThreadSlot, last_ticks), 8);
static_assertions::const_assert_eq!(core::mem::offset_of!(ThreadSlot, reserved), 16);
static_assertions::const_assert_eq!(core::mem::offset_of!(ThreadSlot, owner), 24);
static_assertions::const_assert_eq!(core::mem::offset_of!(ThreadSlot, bufs), 32);
static_assertions::const_assert_eq!(STREAMS, 2);
// One cache-line pair per slot: the table's size in MAX_THREADS's doc.
static_assertions::const_assert!(core::mem::size_of::<ThreadSlot>() <= 128);

/// The calling thread's thread pointer, which identifies it while it runs.
#[inline(always)]
pub(crate) fn thread_pointer() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let tp: usize;
        // SAFETY: %fs:0 holds the thread control block's own address on
        // x86-64 Linux (glibc and musl); reading it has no side effects.
        unsafe {
            core::arch::asm!("mov {tp}, qword ptr fs:[0]", tp = out(reg) tp, options(nostack, preserves_flags, readonly));
        }
        tp
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        0
    }
}

impl ThreadSlot {
    #[allow(clippy::declare_interior_mutable_const)]
    const NEW: ThreadSlot = ThreadSlot {
        seq: SeqLock::new(),
        last_ticks: AtomicU64::new(0),
        reserved: AtomicU32::new(0),
        state: AtomicU32::new(SLOT_FREE),
        owner: AtomicUsize::new(0),
        bufs: [const { [const { AtomicPtr::new(ptr::null_mut()) }; STREAMS] }; 2],
        id: AtomicU64::new(0),
        lost: [AtomicU64::new(0), AtomicU64::new(0)],
        tid: AtomicI32::new(0),
        capture_seq: SeqLock::new(),
        capture: AtomicPtr::new(ptr::null_mut()),
    };

    /// Takes the buffer of one parity and stream, leaving null.
    pub(crate) fn take_buffer(&self, parity: usize, stream: usize) -> Option<NonNull<Buffer>> {
        NonNull::new(self.bufs[parity][stream].swap(ptr::null_mut(), Ordering::AcqRel))
    }
}

static SLOTS: [ThreadSlot; MAX_THREADS] = [ThreadSlot::NEW; MAX_THREADS];

/// One past the highest slot index ever claimed: advance and stop look at
/// slots below it only.
static SLOTS_USED: AtomicUsize = AtomicUsize::new(0);

/// Source of trace thread IDs.
static NEXT_THREAD_ID: AtomicU64 = AtomicU64::new(1);

/// The process ID the slots' thread IDs belong to (set by trace_start and
/// in a fork child), 0 before: reclaims happen only in this process.
static PID: AtomicI32 = AtomicI32::new(0);

/// The pthread key whose destructor flushes a thread's buffers at exit;
/// `KEY_STATE` is 0 (not created), 1 (being created), 2 (ready), 3 (failed).
static EXIT_KEY: AtomicU32 = AtomicU32::new(0);

/// What flushes a slot's buffers when its thread exits, gives it back or is
/// found gone: installed by the session layer ([`set_exit_flush`]), which
/// is above this module and owns the session the buffers go to. Unset until
/// a session starts, when no slot holds a buffer.
static EXIT_FLUSH: std::sync::OnceLock<fn(&ThreadSlot)> = std::sync::OnceLock::new();

/// Installs the exit flush (see [`EXIT_FLUSH`]). Called by trace_start,
/// before any thread can claim a slot in the session; the same function
/// every time, so only the first call stores it.
pub(crate) fn set_exit_flush(flush: fn(&ThreadSlot)) {
    let _ = EXIT_FLUSH.set(flush);
}

/// Runs the installed exit flush on `slot`, whose owner the caller is. No
/// lock, no allocation: a load of the installed pointer.
fn flush_exiting(slot: &ThreadSlot) {
    if let Some(flush) = EXIT_FLUSH.get() {
        flush(slot);
    }
}
static KEY_STATE: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// Set on the tracer's own threads (the writer), which are never traced.
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// Sets this thread's slot (the TLS word of [`current`]) and, beside it,
/// its entry of thread_counts.rs's table (`Word::Counts`). The counts word is
/// cleared first and set last: a signal handler that finds it set finds
/// the slot set too, and one that finds it 0 takes the path through the
/// slot (a handler's own claim in between leaves the two words on two
/// slots of the thread's, both counted in the sums).
fn set_current(slot: *const ThreadSlot) {
    tls::set(Word::Counts, 0);
    tls::set(Word::Slot, slot as usize);
    // SAFETY: a non-null slot is one of the table's.
    if let Some(slot) = unsafe { slot.as_ref() } {
        if let Some(c) = crate::thread_counts::counts_at(index_of(slot)) {
            tls::set(Word::Counts, c as *const _ as usize);
        }
    }
}

/// Every slot that has ever been claimed (some may be free now).
pub(crate) fn used_slots() -> &'static [ThreadSlot] {
    let n = SLOTS_USED.load(Ordering::Acquire).min(MAX_THREADS);
    &SLOTS[..n]
}

/// The index of `slot` in the thread table, for tables kept beside it
/// (sampling.rs). Below MAX_THREADS: every slot is one of the table's.
#[inline(always)]
pub(crate) fn index_of(slot: &ThreadSlot) -> usize {
    (slot as *const ThreadSlot as usize).wrapping_sub(SLOTS.as_ptr() as usize)
        / core::mem::size_of::<ThreadSlot>()
}

/// Marks the calling thread as the tracer's own: its events are ignored.
pub(crate) fn mark_internal() {
    INTERNAL.with(|f| f.set(true));
}

/// Whether the calling thread is one of the tracer's own. Inline: a
/// global allocator in another crate asks on every call.
#[inline]
pub(crate) fn is_internal() -> bool {
    INTERNAL.with(|f| f.get())
}

/// This thread's slot if it has one, without claiming.
#[inline(always)]
pub(crate) fn current() -> Option<&'static ThreadSlot> {
    let p = tls::get(Word::Slot) as *const ThreadSlot;
    // SAFETY: the slot word only ever holds 0 or a pointer into SLOTS.
    unsafe { p.as_ref() }
}

/// This thread's slot, claiming one on first use. `None` on the tracer's own
/// threads and when every slot is taken.
///
/// Must not allocate: runs on the event path. The first call on a thread
/// calls pthread_setspecific, which glibc serves from a static block for the
/// first 32 keys; TLS is set before that, so a malloc it makes finds the
/// slot ready instead of recursing into registration.
#[inline(always)]
pub(crate) fn current_or_claim() -> Option<&'static ThreadSlot> {
    match current() {
        Some(slot) => Some(slot),
        None => claim(),
    }
}

#[cold]
#[inline(never)]
fn claim() -> Option<&'static ThreadSlot> {
    if INTERNAL.with(|f| f.get()) {
        return None;
    }
    // tgkill sets errno when the thread is gone; the program's errno must
    // come out of an event call as it went in.
    // SAFETY: __errno_location always returns this thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    let slot = claim_slot();
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
    slot
}

fn claim_slot() -> Option<&'static ThreadSlot> {
    // SAFETY: getpid has no preconditions.
    let reclaim = PID.load(Ordering::Relaxed) == unsafe { libc::getpid() };
    let mut checks = 0;
    for (index, slot) in SLOTS.iter().enumerate() {
        match slot.state.load(Ordering::Relaxed) {
            SLOT_FREE
                if slot
                    .state
                    .compare_exchange(SLOT_FREE, SLOT_OWNED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok() =>
            {
                return Some(take(index, slot));
            }
            SLOT_EXITING if reclaim && checks < EXIT_CHECKS_PER_CLAIM => {
                checks += 1;
                if try_reclaim(slot, SLOT_EXITING) {
                    return Some(take(index, slot));
                }
            }
            _ => {}
        }
    }
    // No free slot: reclaim one whose thread is gone, owned ones too (see
    // the corner cases). A few slots per claim, taking turns: a thread
    // without a slot claims again at every event, and must not make
    // thousands of syscalls each time.
    if reclaim {
        let start = FULL_CURSOR.fetch_add(FULL_CHECKS_PER_CLAIM, Ordering::Relaxed);
        for k in 0..FULL_CHECKS_PER_CLAIM {
            let index = start.wrapping_add(k) % MAX_THREADS;
            let slot = &SLOTS[index];
            let state = slot.state.load(Ordering::Relaxed);
            if (state == SLOT_EXITING || state == SLOT_OWNED) && try_reclaim(slot, state) {
                return Some(take(index, slot));
            }
        }
    }
    None
}

/// Whether the thread with kernel ID `tid` no longer exists in this
/// process. Asks the kernel only: never touches the thread's memory.
fn thread_gone(tid: i32) -> bool {
    if tid <= 0 {
        return false;
    }
    // SAFETY: tgkill with signal 0 sends nothing; it only checks that the
    // thread exists in the thread group.
    let rc = unsafe { libc::syscall(libc::SYS_tgkill, PID.load(Ordering::Relaxed), tid, 0) };
    // SAFETY: __errno_location always returns this thread's errno.
    rc == -1 && unsafe { *libc::__errno_location() } == libc::ESRCH
}

/// Takes over a slot in state `from` (exiting, or owned) whose thread is
/// gone: flushes what it left and leaves it SLOT_RECLAIMING for [`take`].
/// False, changing nothing, if its thread may still run.
fn try_reclaim(slot: &ThreadSlot, from: u32) -> bool {
    let tid = slot.tid.load(Ordering::Relaxed);
    if !thread_gone(tid) {
        return false;
    }
    if slot
        .state
        .compare_exchange(from, SLOT_RECLAIMING, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return false;
    }
    // Between the check and the exchange another claimer may have
    // reclaimed the slot and its new owner reached the same state: check
    // the owner we now hold.
    let now = slot.tid.load(Ordering::Relaxed);
    if now != tid && !thread_gone(now) {
        slot.state.store(from, Ordering::Release);
        return false;
    }
    // We are the slot's owner now (invariant 1): flush the dead thread's
    // current-generation buffers as it would have.
    flush_exiting(slot);
    true
}

/// Makes the calling thread the owner of `slot`, claimed from free or
/// reclaimed, with a new trace thread ID.
fn take(index: usize, slot: &'static ThreadSlot) -> &'static ThreadSlot {
    slot.id.store(
        NEXT_THREAD_ID.fetch_add(1, Ordering::Relaxed),
        Ordering::Relaxed,
    );
    // SAFETY: gettid has no preconditions and never fails.
    slot.tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
    SLOTS_USED.fetch_max(index + 1, Ordering::AcqRel);
    slot.owner.store(thread_pointer(), Ordering::Relaxed);
    slot.state.store(SLOT_OWNED, Ordering::Release);
    set_current(slot);
    if KEY_STATE.load(Ordering::Acquire) == 2 {
        // SAFETY: the key was created by ensure_exit_key; the value is a
        // pointer into the static SLOTS table.
        unsafe {
            libc::pthread_setspecific(
                EXIT_KEY.load(Ordering::Relaxed),
                (slot as *const ThreadSlot).cast(),
            );
        }
    }
    slot
}

/// Records the process the slots' thread IDs belong to. Called by
/// trace_start.
pub(crate) fn note_process() {
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// Creates the pthread key whose destructor flushes an exiting thread.
/// Called by trace_start, before any thread can claim a slot in the session.
pub(crate) fn ensure_exit_key() {
    if KEY_STATE
        .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        while KEY_STATE.load(Ordering::Acquire) == 1 {
            std::thread::yield_now();
        }
        return;
    }
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: key is a valid out-pointer and on_thread_exit has the
    // destructor signature.
    let rc = unsafe { libc::pthread_key_create(&mut key, Some(on_thread_exit)) };
    if rc == 0 {
        EXIT_KEY.store(key, Ordering::Relaxed);
        KEY_STATE.store(2, Ordering::Release);
    } else {
        KEY_STATE.store(3, Ordering::Release);
    }
}

/// pthread key destructor: the thread is exiting. Flushes its buffers and
/// marks its slot exiting; the thread keeps the slot (and its thread-local
/// pointer to it) for whatever it records until it is gone.
unsafe extern "C" fn on_thread_exit(value: *mut libc::c_void) {
    let slot = value.cast::<ThreadSlot>().cast_const();
    let Some(current) = current() else { return };
    if !ptr::eq(current, slot) {
        return;
    }
    flush_exiting(current);
    current.state.store(SLOT_EXITING, Ordering::Release);
}

/// Flushes the calling thread's buffers and gives its slot back at once
/// (`trace_thread_destroy`); its next event claims a new slot with a new
/// thread ID.
pub(crate) fn release_current() {
    let Some(slot) = current() else { return };
    flush_exiting(slot);
    set_current(ptr::null());
    slot.owner.store(0, Ordering::Relaxed);
    slot.tid.store(0, Ordering::Relaxed);
    if KEY_STATE.load(Ordering::Acquire) == 2 {
        // SAFETY: the key exists; clearing it stops the destructor from
        // running for a slot we no longer own.
        unsafe { libc::pthread_setspecific(EXIT_KEY.load(Ordering::Relaxed), ptr::null()) };
    }
    slot.state.store(SLOT_FREE, Ordering::Release);
}

/// In a forked child: every slot's owner but the forking thread is gone and
/// the parent's buffers belong to the parent's trace. Frees every other
/// slot (exiting and mid-reclaim ones too), and forgets every slot's buffers (left mapped, never written
/// again) and counts. The forking thread keeps its slot, so a
/// `trace_writer` handle it holds stays its own in the child.
/// Called only by the fork child handler, with one thread running.
pub(crate) fn reset_after_fork() {
    let mine = current().map_or(ptr::null(), |s| s as *const ThreadSlot);
    for slot in used_slots() {
        slot.seq.reset_after_fork();
        slot.capture_seq.reset_after_fork();
        for parity in &slot.bufs {
            for buf in parity {
                buf.store(ptr::null_mut(), Ordering::Relaxed);
            }
        }
        for lost in &slot.lost {
            lost.store(0, Ordering::Relaxed);
        }
        if ptr::eq(slot, mine) {
            // SAFETY: gettid has no preconditions and never fails.
            slot.tid.store(unsafe { libc::gettid() }, Ordering::Relaxed);
        } else {
            slot.owner.store(0, Ordering::Relaxed);
            slot.tid.store(0, Ordering::Relaxed);
            slot.state.store(SLOT_FREE, Ordering::Relaxed);
        }
    }
    note_process();
}

/// One of the tracer's own threads.
pub(crate) struct InternalThread(libc::pthread_t);

impl InternalThread {
    /// Waits for the thread to end.
    pub(crate) fn join(self) {
        // SAFETY: the thread was created joinable and is joined once.
        unsafe { libc::pthread_join(self.0, core::ptr::null_mut()) };
    }
}

/// Spawns one of the tracer's own threads with pthread_create, with every
/// signal blocked.
///
/// - Signals: process-directed signals (SIGALRM, SIGCHLD, ...) must reach
///   the program's threads, since the tracer's would ignore any event a
///   handler emits. The mask is set around the create, which the new thread
///   inherits, so there is no window in which it could take one.
/// - pthread_create, not std::thread: std leaves thread-local state with a
///   destructor on the thread that spawns, which would free memory when the
///   program's thread exits, possibly while tracing and through a traced
///   allocator.
pub(crate) fn spawn_internal(
    name: &core::ffi::CStr,
    body: impl FnOnce() + Send + 'static,
) -> std::io::Result<InternalThread> {
    type Body = Box<dyn FnOnce() + Send>;
    extern "C" fn start(arg: *mut libc::c_void) -> *mut libc::c_void {
        // SAFETY: arg is the Box<Body> that spawn_internal leaked for us.
        let body = unsafe { Box::from_raw(arg.cast::<Body>()) };
        mark_internal();
        // A panic must not unwind into pthread's frames.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        core::ptr::null_mut()
    }
    let arg = Box::into_raw(Box::new(Box::new(body) as Body));
    // SAFETY: sigset_t values are plain data initialised by sigfillset and
    // pthread_sigmask; `start` takes ownership of `arg` only if the create
    // succeeds, and we reclaim it otherwise.
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let mut id: libc::pthread_t = 0;
        let rc = libc::pthread_create(&mut id, core::ptr::null(), start, arg.cast());
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        if rc != 0 {
            drop(Box::from_raw(arg));
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        libc::pthread_setname_np(id, name.as_ptr());
        Ok(InternalThread(id))
    }
}

/// One of the tracer's own threads as its session sees it: the thread's
/// handle, published by the thread once it is ready (so others can wake
/// it), and whether it has finished its work. Both only ever go from unset
/// to set.
pub(crate) struct ThreadSignals {
    thread: std::sync::OnceLock<std::thread::Thread>,
    done: core::sync::atomic::AtomicBool,
}

impl ThreadSignals {
    pub(crate) const fn new() -> ThreadSignals {
        ThreadSignals {
            thread: std::sync::OnceLock::new(),
            done: core::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether the thread was started (and is, or was, ready).
    pub(crate) fn started(&self) -> bool {
        self.thread.get().is_some()
    }

    /// Wakes the thread if it was started and parks. A syscall.
    pub(crate) fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// Whether the thread has finished its work and is returning: waiting
    /// for this, not joining, frees nothing on the waiting thread.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
}

/// Spawns one of the tracer's own threads ([`spawn_internal`]) and returns
/// once it is ready: it runs `setup`, publishes its handle in the
/// [`ThreadSignals`] that `signals` finds in `owner`, then runs `run` with
/// what `setup` made, and marks itself done when `run` returns.
///
/// Called while tracing is still off, so what the thread allocates before
/// it is ready (inside std, and in `setup`) is never traced as the host's.
/// The wait is on the published handle, not a channel: the thread must not
/// allocate or free anything once tracing is on (a custom allocator that
/// traces itself would see calls that are not the host's).
pub(crate) fn spawn_ready<T, S>(
    name: &core::ffi::CStr,
    owner: &std::sync::Arc<T>,
    signals: fn(&T) -> &ThreadSignals,
    setup: impl FnOnce(&T) -> S + Send + 'static,
    run: impl FnOnce(&T, S) + Send + 'static,
) -> std::io::Result<InternalThread>
where
    T: Send + Sync + 'static,
{
    let theirs = std::sync::Arc::clone(owner);
    let handle = spawn_internal(name, move || {
        let made = setup(&theirs);
        let _ = signals(&theirs).thread.set(std::thread::current());
        run(&theirs, made);
        signals(&theirs).done.store(true, Ordering::Release);
    })?;
    while !signals(owner).started() {
        std::thread::yield_now();
    }
    Ok(handle)
}

/// Runs `f` with every signal blocked on this thread, so a signal handler
/// (the fatal-signal flush of crash.rs) never sees a batch that `f` has
/// taken out of its slot but not yet pushed on the full queue. Slow path
/// only: two rt_sigprocmask calls. The caller keeps errno (emit.rs `KeepErrno`).
pub(crate) fn without_signals(f: impl FnOnce()) {
    // SAFETY: an all-zero sigset_t is valid storage; sigfillset fills it.
    let mut all: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    // SAFETY: valid sigset pointers; pthread_sigmask only reads `all` and
    // writes `old` (glibc leaves its internal signals alone).
    let blocked = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0
    };
    f();
    if blocked {
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
    }
}
