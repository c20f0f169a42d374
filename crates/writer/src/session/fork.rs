//! The pthread_atfork handlers: no start, advance or stop is half done at
//! a fork, and the child turns tracing off, closes its copy of the
//! parent's trace descriptor and forgets the parent's session (session/mod.rs,
//! corner case "fork"). Relies on invariant 4 (the lifecycle
//! calls hold `CONTROL`, which prepare takes) of session/mod.rs.

use core::sync::atomic::Ordering;

use crate::session::{Control, CONTROL, IN_CONTROL, SESSION};
use crate::shared::SHARED;
use crate::thread;

/// [`CONTROL`]'s guard, held by the forking thread from the atfork prepare
/// handler to the parent or child handler. A static rather than a
/// thread-local: a thread-local holding a guard needs a destructor, whose
/// registration would allocate inside fork.
struct ForkGuard(core::cell::UnsafeCell<Option<std::sync::MutexGuard<'static, Control>>>);

// SAFETY: only the thread that holds CONTROL touches the cell: prepare
// stores the guard after locking, parent/child take it before unlocking,
// all on the forking thread, and no other thread can hold CONTROL then.
unsafe impl Sync for ForkGuard {}

static FORK_GUARD: ForkGuard = ForkGuard(core::cell::UnsafeCell::new(None));

/// The guard of stacks/capture's refresh lock, held like [`FORK_GUARD`] (taken
/// after CONTROL, the order set-up takes them in): the writer thread holds
/// that lock while it builds unwind tables, and a child forked then would
/// find it locked for good (its next session's set-up would wait forever).
struct RefreshGuard(core::cell::UnsafeCell<Option<std::sync::MutexGuard<'static, ()>>>);

// SAFETY: as ForkGuard: only the forking thread, between prepare and the
// parent or child handler, touches the cell.
unsafe impl Sync for RefreshGuard {}

static REFRESH_GUARD: RefreshGuard = RefreshGuard(core::cell::UnsafeCell::new(None));

/// Registers the fork handlers, once per process.
pub(crate) fn install_fork_handlers() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // SAFETY: the handlers are extern "C" functions with no arguments.
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    });
}

extern "C" fn fork_prepare() {
    if IN_CONTROL.with(|c| c.get()) {
        // fork() from the snapshot callback: CONTROL is ours already.
        return;
    }
    let guard = CONTROL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // SAFETY: we hold CONTROL (see ForkGuard).
    unsafe { *FORK_GUARD.0.get() = Some(guard) };
    let refresh = crate::stacks::capture::lock_refresh();
    // SAFETY: we hold CONTROL and the refresh lock (see RefreshGuard).
    unsafe { *REFRESH_GUARD.0.get() = Some(refresh) };
}

/// Takes the guard stored by fork_prepare, if this thread stored one.
fn take_fork_guard() -> Option<std::sync::MutexGuard<'static, Control>> {
    if IN_CONTROL.with(|c| c.get()) {
        // fork() from the snapshot callback: prepare stored nothing.
        return None;
    }
    // SAFETY: we hold the refresh lock (see RefreshGuard).
    drop(unsafe { (*REFRESH_GUARD.0.get()).take() });
    // SAFETY: we hold CONTROL (see ForkGuard).
    unsafe { (*FORK_GUARD.0.get()).take() }
}

extern "C" fn fork_parent() {
    drop(take_fork_guard());
}

extern "C" fn fork_child() {
    SHARED.generation.store(0, Ordering::SeqCst);
    SESSION.store(core::ptr::null_mut(), Ordering::SeqCst);
    thread::reset_after_fork();
    crate::writer::late::disarm_in_child();
    // The parent's listening socket, if it is in the program's table: the
    // child answers nothing on it (session/channel.rs, corner case fork).
    crate::session::channel::forked_child();
    let listener = crate::session::channel::SHARED_LISTENER.swap(-1, Ordering::Relaxed);
    if listener >= 0 {
        // SAFETY: the tracer's descriptor, this process's copy of it.
        unsafe { libc::close(listener) };
    }
    let mut guard = take_fork_guard();
    if let Some(control) = guard.as_mut() {
        // The parent's trace is not the child's to write or hold open.
        if let Some(session) = control.session.as_ref() {
            session.writer.output.close_in_forked_child();
        }
        // The parent's session and tracer threads are not ours: forget them
        // without running their destructors (no unmapping of buffers, no
        // join of a thread that does not exist here).
        core::mem::forget(control.session.take());
        #[allow(clippy::forget_non_drop)] // forgetting is the point; harmless if they gain Drop
        {
            core::mem::forget(control.writer.take());
            core::mem::forget(control.advancer.take());
            core::mem::forget(control.channel.take());
        }
    }
    drop(guard);
}
