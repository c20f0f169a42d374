//! Thread stacks: pthread_create runs every new thread through a trampoline
//! that records its stack (stack alloc, from pthread_getattr_np) when it
//! starts and frees it (stack free) when it ends, by returning, by
//! pthread_exit or by cancellation (both unwind through the trampoline,
//! whose guard records the free). The thread that starts a session records
//! its own stack as "exists".
//!
//! The trampoline calls the thread's routine through `call_routine`, whose
//! one return address, `alloctrace_call_routine_ret`, marks the outer end
//! of every stack captured on the thread
//! (alloctrace_writer::capture::set_thread_start): a walk ends there,
//! complete, without the trampoline, `start_thread` and `clone3`. The
//! trampoline also gives the thread its capture state before the routine
//! runs (`prepare_thread`), so that no thread depends on the writer's
//! pool of spare states.
//!
//! Threads created by the shim's own code (the core's writer and advancer)
//! go through the trampoline too, which puts them in state OWN for life:
//! nothing they do is ever traced.

use core::cell::Cell;
use core::ffi::{c_int, c_void};
use core::sync::atomic::Ordering;

use alloctrace_writer::events;

use crate::{boundary, real, reentrancy, state};

thread_local! {
    /// This thread's stack as recorded: (base, session epoch), or (0, 0).
    static STACK: Cell<(usize, u64)> = const { Cell::new((0, 0)) };
}

/// A thread's start routine. "C-unwind": pthread_exit and cancellation
/// unwind through it (a plain "C" frame would abort).
type Routine = unsafe extern "C-unwind" fn(*mut c_void) -> *mut c_void;

/// What the trampoline needs, in a block from glibc's allocator (untraced).
struct Start {
    routine: Routine,
    arg: *mut c_void,
    internal: bool,
}

/// The calling thread's stack: (lowest address, size in bytes).
fn current_stack() -> Option<(usize, usize)> {
    reentrancy::own(|| {
        // SAFETY: attr is initialised by pthread_getattr_np before use and
        // destroyed after; the out-pointers are valid.
        unsafe {
            let mut attr: libc::pthread_attr_t = core::mem::zeroed();
            if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
                return None;
            }
            let mut addr: *mut c_void = core::ptr::null_mut();
            let mut size: usize = 0;
            let rc = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
            libc::pthread_attr_destroy(&mut attr);
            (rc == 0 && !addr.is_null()).then_some((addr as usize, size))
        }
    })
}

// call_routine(routine, arg): calls routine(arg) from one call site, whose
// return address (alloctrace_call_routine_ret) says "the thread's routine
// returns into the trampoline" to the stack captures. Its CFI describes
// its frame (rbp saved, for the 16-byte alignment of the call), so that
// pthread_exit's and cancellation's forced unwinds pass through it to the
// trampoline's guard.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
core::arch::global_asm!(
    ".pushsection .text.alloctrace_call_routine,\"ax\",@progbits",
    ".globl alloctrace_call_routine",
    ".hidden alloctrace_call_routine",
    ".type alloctrace_call_routine,@function",
    ".globl alloctrace_call_routine_ret",
    ".hidden alloctrace_call_routine_ret",
    "alloctrace_call_routine:",
    ".cfi_startproc",
    "push rbp",
    ".cfi_def_cfa_offset 16",
    ".cfi_offset rbp, -16",
    "mov rax, rdi",
    "mov rdi, rsi",
    "call rax",
    "alloctrace_call_routine_ret:",
    "pop rbp",
    ".cfi_def_cfa_offset 8",
    "ret",
    ".cfi_endproc",
    ".size alloctrace_call_routine, . - alloctrace_call_routine",
    ".popsection",
);

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
extern "C-unwind" {
    fn alloctrace_call_routine(routine: Routine, arg: *mut c_void) -> *mut c_void;
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
extern "C" {
    static alloctrace_call_routine_ret: u8;
}

/// Runs the thread's routine, from the one call site captures stop at.
///
/// # Safety
/// As calling `routine(arg)`.
unsafe fn call_routine(routine: Routine, arg: *mut c_void) -> *mut c_void {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    // SAFETY: the stub calls routine(arg) and returns its result.
    return unsafe { alloctrace_call_routine(routine, arg) };
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    // SAFETY: the caller's routine and argument.
    return unsafe { routine(arg) };
}

/// Tells the captures where threads' stacks end (see the module docs).
fn note_thread_start() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        // Only the label's address is taken.
        let ret = core::ptr::addr_of!(alloctrace_call_routine_ret) as u64;
        alloctrace_writer::capture::set_thread_start(ret, ret + 1);
    }
}

/// Gives the writer the calling thread's stack bounds for its native call
/// stack captures (alloctrace_writer::capture), when they are on: known
/// here at thread start, where calling pthread_getattr_np is safe.
pub fn note_bounds() {
    note_thread_start();
    if alloctrace_writer::capture::mode() == alloctrace_writer::capture::StackMode::None {
        return;
    }
    if let Some((lo, size)) = current_stack() {
        alloctrace_writer::capture::set_thread_stack(lo as u64, (lo + size) as u64);
    }
}

fn recording() -> bool {
    alloctrace_writer::enabled() && state::STACKS.load(Ordering::Relaxed)
}

/// Records the calling thread's stack as allocated (`exists` false) or as
/// existing since before the session (`exists` true), in session `epoch`.
fn record_stack(exists: bool, epoch: u64) {
    let Some((base, size)) = current_stack() else {
        return;
    };
    let prev = reentrancy::replace(reentrancy::IN_EVENT);
    if exists {
        events::stack_exists(base, size);
    } else {
        events::stack_alloc(base, size);
    }
    reentrancy::replace(prev);
    STACK.with(|s| s.set((base, epoch)));
}

/// The snapshot of a new session: the starting thread's stack exists.
pub fn snapshot(epoch: u64) {
    record_stack(true, epoch);
}

/// Records the free of this thread's stack, if this session recorded it
/// (counted as lost if a panic turned the thread's tracing off since).
fn end_stack() {
    let (base, epoch) = STACK.with(|s| s.replace((0, 0)));
    if base == 0 || epoch != state::EPOCH.load(Ordering::Acquire) || !recording() {
        return;
    }
    let now = reentrancy::get();
    if now == reentrancy::DISABLED {
        events::lost();
    } else if now != reentrancy::OWN {
        // The panic boundary (also when this runs as pthread_exit or a
        // cancellation unwinds the thread).
        boundary::event(|| {
            let prev = reentrancy::replace(reentrancy::IN_EVENT);
            events::stack_free(base);
            reentrancy::replace(prev);
        });
    }
}

/// Frees the stack in the trace when the thread's start routine returns or
/// unwinds (pthread_exit, cancellation).
struct StackGuard;

impl Drop for StackGuard {
    fn drop(&mut self) {
        end_stack();
    }
}

unsafe extern "C-unwind" fn trampoline(block: *mut c_void) -> *mut c_void {
    // SAFETY: pthread_create below passed a Start written into this block,
    // which only this thread reads and frees.
    let start = unsafe { block.cast::<Start>().read() };
    // SAFETY: the block came from the shim's private heap (private_heap::alloc below).
    unsafe { crate::private_heap::free(block) };
    if start.internal {
        reentrancy::replace(reentrancy::OWN);
        // SAFETY: the creator's routine and argument.
        return unsafe { (start.routine)(start.arg) };
    }
    if alloctrace_writer::enabled() {
        // Claim the thread's slot as the shim's own code: the claim calls
        // pthread_setspecific, which callocs when the tracer's key is past
        // glibc's first 32; that block must not look like the program's.
        // So is the thread's capture state (it may be built here, from the
        // private heap).
        reentrancy::own(|| {
            boundary::quietly(|| {
                alloctrace_writer::events::thread_id();
                note_bounds();
                alloctrace_writer::capture::prepare_thread();
            })
        });
    }
    if recording() && reentrancy::get() == reentrancy::NORMAL {
        // The panic boundary: the thread's routine runs whatever the
        // recording does (a panic must not unwind into pthread's frames).
        boundary::event(|| {
            boundary::test_point(boundary::TEST_THREAD);
            record_stack(false, state::EPOCH.load(Ordering::Acquire));
        });
    }
    let _guard = StackGuard;
    // SAFETY: the creator's routine and argument.
    unsafe { call_routine(start.routine, start.arg) }
}

/// Interposed pthread_create: runs the thread through the trampoline.
///
/// # Safety
/// As pthread_create(3).
#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    routine: Routine,
    arg: *mut c_void,
) -> c_int {
    let internal = reentrancy::get() == reentrancy::OWN;
    // The shim's own threads go to glibc's pthread_create: they are not
    // the program's, and the next interposer must not see them.
    let real_create = if internal {
        real::own_pthread_create()
    } else {
        real::pthread_create()
    };
    let Some(real_create) = real_create else {
        return libc::EAGAIN;
    };
    // SAFETY: the routine types differ only in their unwind ABI.
    let real_create: unsafe extern "C" fn(
        *mut libc::pthread_t,
        *const libc::pthread_attr_t,
        Routine,
        *mut c_void,
    ) -> c_int = unsafe { core::mem::transmute(real_create) };
    if !internal && !state::wrap_threads() {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real_create(thread, attr, routine, arg) };
    }
    // The shim's private heap: never traced, and never the program's allocator
    // (which may be jemalloc or another interposer).
    let block = crate::private_heap::alloc(
        core::mem::size_of::<Start>(),
        core::mem::align_of::<Start>().max(16),
    )
    .cast::<Start>();
    if block.is_null() {
        // SAFETY: the caller's arguments, unchanged: the thread runs
        // without stack events.
        return unsafe { real_create(thread, attr, routine, arg) };
    }
    // SAFETY: block is fresh, suitably aligned memory for a Start.
    unsafe {
        block.write(Start {
            routine,
            arg,
            internal,
        })
    };
    // SAFETY: the trampoline takes ownership of the block if the thread starts.
    let rc = unsafe { real_create(thread, attr, trampoline, block.cast()) };
    if rc != 0 {
        // SAFETY: no thread was created, so the block is still ours.
        unsafe { crate::private_heap::free(block.cast()) };
    }
    rc
}
