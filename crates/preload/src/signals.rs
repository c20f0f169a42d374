//! Fatal signals: a program killed by a signal leaves a complete trace, and
//! its signal dispositions stay exactly its own.
//!
//! ## Design
//!
//! - **Which signals**: [`HANDLED`], every standard signal whose default
//!   action ends the process (with or without a core dump), except SIGKILL
//!   and SIGSTOP, which cannot be caught. Real-time signals are left alone
//!   (glibc uses the first ones internally).
//! - **The kernel holds the program's disposition**, except where the
//!   program's disposition is SIG_DFL: there the kernel holds [`on_fatal`]
//!   instead. SIG_IGN stays really ignored (a write to a closed pipe still
//!   fails with EPIPE; an exec'd program inherits it), and a handler the
//!   program installs is installed as it is, so it runs exactly as without
//!   the shim and nothing is flushed when it returns (garbage collectors and
//!   Rust's std take SIGSEGV and go on).
//! - **What the program sees**: sigaction, signal, bsd_signal, ssignal,
//!   sysv_signal, __sysv_signal and sigset are interposed. Each calls the
//!   real function, the next definition of its own name (`dlsym(RTLD_NEXT)`,
//!   resolved by the constructor: glibc sets up its own signal-return
//!   trampoline, SA_RESTORER, which a raw rt_sigaction would have to copy),
//!   once, so an interposer after the shim sees exactly the program's
//!   calls; then, through glibc's own sigaction (the shim's reads and
//!   installs are not the program's calls), reads the kernel's disposition
//!   back, and where it is now SIG_DFL keeps that answer (flags, mask and
//!   restorer as glibc reports them) as the program's view and installs
//!   [`on_fatal`]. Wherever the kernel holds one of the shim's handlers, a
//!   query answers with the kept view; anywhere else with the kernel's, so
//!   a change made behind the wrappers (glibc's internal calls: sigignore,
//!   siginterrupt, system, abort) is what the program sees, and only costs
//!   that signal its flush.
//! - **SA_RESETHAND**: the kernel would reset the program's handler to
//!   SIG_DFL behind the shim's back, and the second delivery (a crash
//!   reporter that prints, then lets the fault repeat or raises again)
//!   would kill the process without a flush. So such a handler is installed
//!   through [`on_reset`], with the program's mask and flags less
//!   SA_RESETHAND: it performs the reset itself (the view becomes SIG_DFL,
//!   the kernel gets [`on_fatal`]) and calls the program's handler.
//! - **The fatal path** ([`on_fatal`], SA_SIGINFO, SA_ONSTACK for SIGSEGV
//!   and SIGBUS so a thread with an alternate stack survives a stack
//!   overflow long enough): as the shim's own code, flush
//!   (`alloctrace_writer::flush_for_fatal_signal`: the crashing thread's
//!   buffers, then the whole session with bounded waits, see crash.rs),
//!   restore SIG_DFL, and let the signal act as it would have: a hardware
//!   fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL sent by the kernel) returns
//!   into the faulting instruction, which faults again under SIG_DFL, so
//!   the core dump shows the original state; any other signal is queued
//!   again to the same thread with its original siginfo
//!   (rt_tgsigqueueinfo; tgkill where the kernel refuses) and is delivered
//!   as the handler returns. The exit status and the core dump are those of
//!   the untraced program.
//!
//! - **The snapshot signal** (`ALLOCTRACE_SNAPSHOT_SIGNAL`, SIGUSR2 by
//!   default): where the program's view of it is SIG_DFL, [`on_fatal`]
//!   asks the control thread for a snapshot of the live heap
//!   (`alloctrace_writer::request_snapshot_from_signal`, two atomics) and
//!   returns, instead of ending the process. Where the program has a
//!   handler or SIG_IGN, that acts, as always; with no control thread to
//!   write it (`ALLOCTRACE_CONTROL=off`) the signal ends the process as it
//!   would untraced.
//!
//! ## Invariants
//!
//! 1. The kernel MUST hold a shim handler for a handled signal only while
//!    the program's view of it is SIG_DFL ([`on_fatal`]) or a handler with
//!    SA_RESETHAND ([`on_reset`]). Otherwise the program's SIG_IGN or
//!    handler would not act as it does untraced.
//! 2. Every change of a disposition and of its kept view MUST happen under
//!    [`lock`], with every signal blocked. Otherwise two threads' sigaction
//!    calls could leave the view and the kernel disagreeing, or a handler
//!    calling sigaction on the same thread would spin forever.
//! 3. The handlers MUST NOT allocate or block without bound. Otherwise a
//!    crash inside malloc would deadlock instead of dying.
//!
//! ## Corner cases
//!
//! - Tracing off (disabled, bad settings, a failed start): nothing is
//!   installed; the wrappers only pass calls through.
//! - A vfork child (or a clone child that ran no fork handlers) shares the
//!   parent's memory, view table included: its wrappers pass calls through
//!   and change no view, and its [`on_fatal`] flushes nothing (the session
//!   is the parent's). posix_spawn's child resets the shim's handlers to
//!   SIG_DFL itself, as it does every handler.
//! - The fault does not repeat after all (another thread fixed the
//!   mapping): the program goes on, untraced once the session has ended, its
//!   disposition SIG_DFL as it set it.
//! - A signal that interrupted an event of the tracer on this very thread:
//!   the event is counted lost, and the signal is queued again rather than
//!   returned into (the interrupted code must not resume).
//! - A stack overflow on a thread without an alternate signal stack: the
//!   kernel cannot run the handler and kills the process at once; the trace
//!   is cut at the last batch written.
//! - A runtime that sets dispositions with the raw system call (Go) sees the
//!   shim's handler where the program's is SIG_DFL, as if another library
//!   had installed one; Go forwards such signals to it.
//! - The process dies a little later than untraced (a few milliseconds; at
//!   most the bounded waits of crash.rs), its other threads running on
//!   meanwhile; `/proc/PID/status` lists the handled signals as caught.

use core::cell::UnsafeCell;
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};

use crate::{boundary, reentrancy, session, state};

/// The signals whose SIG_DFL action the shim takes over.
pub const HANDLED: [c_int; 22] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGILL,
    libc::SIGTRAP,
    libc::SIGABRT,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGUSR1,
    libc::SIGSEGV,
    libc::SIGUSR2,
    libc::SIGPIPE,
    libc::SIGALRM,
    libc::SIGTERM,
    libc::SIGSTKFLT,
    libc::SIGXCPU,
    libc::SIGXFSZ,
    libc::SIGVTALRM,
    libc::SIGPROF,
    libc::SIGIO,
    libc::SIGPWR,
    libc::SIGSYS,
];

const NSIG: usize = 32;

/// si_code of a SIGBUS for memory found corrupt in the background, not at
/// an access (not in the libc crate).
const BUS_MCEERR_AO: c_int = 5;

/// The kernel flag glibc sets with its own restorer (not in the libc
/// crate); glibc sets it again on every sigaction.
const SA_RESTORER: c_int = 0x0400_0000;

fn is_handled(sig: c_int) -> bool {
    HANDLED.contains(&sig)
}

/// Whether the shim takes SIG_DFL dispositions over: set by the constructor
/// once a session runs.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The process whose view table this is: a vfork child has another pid.
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// The program's view of each signal whose kernel disposition is a shim
/// handler (indexed by signal number), as the real sigaction reported it.
struct Views(UnsafeCell<[libc::sigaction; NSIG]>);

// SAFETY: read and written only under LOCK (invariant 2).
unsafe impl Sync for Views {}

// SAFETY: an all-zero sigaction is a valid value (SIG_DFL, no flags).
static VIEWS: Views = Views(UnsafeCell::new(unsafe { core::mem::zeroed() }));

static LOCK: AtomicBool = AtomicBool::new(false);

/// Holds LOCK with every signal blocked; dropping restores both.
struct Locked(libc::sigset_t);

/// Takes LOCK (invariant 2). The holder only makes a few system calls, so
/// others spin.
fn lock() -> Locked {
    // SAFETY: sigset_t is plain data, filled by sigfillset; pthread_sigmask
    // is async-signal-safe.
    let old = unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    };
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        core::hint::spin_loop();
    }
    Locked(old)
}

impl Locked {
    /// The kept view of `sig` (a handled signal).
    fn view(&self, sig: c_int) -> libc::sigaction {
        // SAFETY: LOCK is held (self exists) and sig is a handled signal,
        // below NSIG.
        unsafe { (*VIEWS.0.get())[sig as usize] }
    }

    fn set_view(&mut self, sig: c_int, view: libc::sigaction) {
        // SAFETY: as in view.
        unsafe { (*VIEWS.0.get())[sig as usize] = view };
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        LOCK.store(false, Ordering::Release);
        // SAFETY: restores the mask saved by lock().
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, core::ptr::null_mut()) };
    }
}

// ---------------------------------------------------------------------------
// The real functions.

type Sigaction = unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
type Signal = unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t;

static REAL_SIGACTION: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL___SIGACTION: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
/// glibc's own sigaction: the shim's own dispositions (its handlers, its
/// reads of the kernel's) are not the program's calls, and must not reach
/// the next interposer.
static OWN_SIGACTION: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL_SIGNAL: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL_BSD_SIGNAL: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL_SSIGNAL: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL_SYSV_SIGNAL: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL___SYSV_SIGNAL: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());
static REAL_SIGSET: AtomicPtr<c_void> = AtomicPtr::new(core::ptr::null_mut());

/// The next definition of `name` (NUL-terminated) after this library,
/// cached. dlsym runs as the shim's own code (its calloc is untraced);
/// the constructor resolves every name, so the program's calls never do.
fn next(cache: &AtomicPtr<c_void>, name: &[u8]) -> *mut c_void {
    let cached = cache.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    // SAFETY: RTLD_NEXT with a NUL-terminated name.
    let p = reentrancy::own(|| unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) });
    cache.store(p, Ordering::Release);
    p
}

/// The next sigaction: the program's calls.
fn real_sigaction() -> Option<Sigaction> {
    let p = next(&REAL_SIGACTION, b"sigaction\0");
    // SAFETY: the symbol is libc's sigaction, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Sigaction>(p) })
}

/// The next __sigaction: the program's calls of that name.
fn real_underscore_sigaction() -> Option<Sigaction> {
    let p = next(&REAL___SIGACTION, b"__sigaction\0");
    // SAFETY: the symbol is libc's __sigaction, of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Sigaction>(p) })
}

/// glibc's sigaction (the next one if it cannot be found): the shim's own
/// calls.
fn own_sigaction() -> Option<Sigaction> {
    let p = crate::real::libc_own(&OWN_SIGACTION, b"sigaction\0");
    if p.is_null() {
        return real_sigaction();
    }
    // SAFETY: the symbol is glibc's sigaction, of this signature.
    Some(unsafe { core::mem::transmute::<*mut c_void, Sigaction>(p) })
}

fn real_signal(cache: &AtomicPtr<c_void>, name: &[u8]) -> Option<Signal> {
    let p = next(cache, name);
    // SAFETY: every name here is a libc function of this signature.
    (!p.is_null()).then(|| unsafe { core::mem::transmute::<*mut c_void, Signal>(p) })
}

fn errno() -> c_int {
    crate::real::errno()
}

fn set_errno(e: c_int) {
    crate::real::set_errno(e)
}

/// The kernel's disposition of `sig`, through the real sigaction.
fn kernel(real: Sigaction, sig: c_int) -> libc::sigaction {
    // SAFETY: a zeroed sigaction is valid; real fills it.
    let mut k: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: a valid out-pointer; no new action.
    unsafe { real(sig, core::ptr::null(), &mut k) };
    k
}

fn is_ours(handler: libc::sighandler_t) -> bool {
    handler == on_fatal as *const () as usize || handler == on_reset as *const () as usize
}

/// What the program sees for `sig`, given the kernel's disposition `k`.
fn view_of(l: &Locked, sig: c_int, k: &libc::sigaction) -> libc::sigaction {
    if is_ours(k.sa_sigaction) {
        l.view(sig)
    } else {
        *k
    }
}

/// Whether this process owns the view table (not a vfork child).
fn owner() -> bool {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() == OWNER_PID.load(Ordering::Relaxed) }
}

/// After the program (or the constructor) set `sig`: where the kernel now
/// holds SIG_DFL or a handler with SA_RESETHAND, keep that as the view and
/// install the shim's handler (invariant 1).
fn adopt(l: &mut Locked, real: Sigaction, sig: c_int) {
    if !ACTIVE.load(Ordering::Acquire) || !owner() {
        return;
    }
    let k = kernel(real, sig);
    if is_ours(k.sa_sigaction) {
        return;
    }
    // SAFETY: a zeroed sigaction is valid.
    let mut ours: libc::sigaction = unsafe { core::mem::zeroed() };
    if k.sa_sigaction == libc::SIG_DFL {
        ours.sa_sigaction = on_fatal as *const () as usize;
        // Another fatal signal waits until this one is handled.
        // SAFETY: sa_mask is a valid sigset_t.
        unsafe {
            libc::sigemptyset(&mut ours.sa_mask);
            for s in HANDLED {
                libc::sigaddset(&mut ours.sa_mask, s);
            }
        }
        ours.sa_flags = libc::SA_SIGINFO;
        if sig == libc::SIGSEGV || sig == libc::SIGBUS {
            ours.sa_flags |= libc::SA_ONSTACK;
        }
    } else if k.sa_sigaction != libc::SIG_IGN && k.sa_flags & libc::SA_RESETHAND != 0 {
        ours.sa_sigaction = on_reset as *const () as usize;
        ours.sa_mask = k.sa_mask;
        ours.sa_flags = (k.sa_flags & !libc::SA_RESETHAND & !SA_RESTORER) | libc::SA_SIGINFO;
    } else {
        return;
    }
    l.set_view(sig, k);
    // SAFETY: a valid action for a catchable signal.
    unsafe { real(sig, &ours, core::ptr::null_mut()) };
}

// ---------------------------------------------------------------------------
// Start.

/// Resolves the real functions and, when a session runs, takes over the
/// SIG_DFL dispositions and registers the quick_exit handler. Called by
/// the constructor after the session started.
pub fn init() {
    reentrancy::own(|| {
        let _ = real_sigaction();
        let _ = real_underscore_sigaction();
        let real = own_sigaction();
        for (cache, name) in signal_functions() {
            let _ = real_signal(cache, name);
        }
        // SAFETY: getpid has no preconditions.
        OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
        let Some(real) = real else { return };
        if state::LIFECYCLE.load(Ordering::Acquire) != state::RUNNING {
            return;
        }
        // SAFETY: the handlers are extern "C" functions without arguments.
        unsafe {
            libc::pthread_atfork(None, None, Some(fork_child));
            at_quick_exit(on_quick_exit);
        }
        ACTIVE.store(true, Ordering::Release);
        for sig in HANDLED {
            let mut l = lock();
            adopt(&mut l, real, sig);
        }
    });
}

extern "C" {
    /// glibc's (in libc_nonshared.a, like atexit).
    fn at_quick_exit(f: extern "C" fn()) -> c_int;
}

/// A forked child owns its copy of the view table.
extern "C" fn fork_child() {
    // SAFETY: getpid has no preconditions.
    OWNER_PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// quick_exit runs the at_quick_exit handlers and then glibc's internal
/// `_exit`, which the `_exit` wrapper never sees: this handler, registered
/// first and so run last, ends the session as the atexit handler does.
extern "C" fn on_quick_exit() {
    if reentrancy::in_program() {
        boundary::quietly(|| {
            let _ = session::stop_if_ours(true);
        });
    }
}

fn signal_functions() -> [(&'static AtomicPtr<c_void>, &'static [u8]); 6] {
    [
        (&REAL_SIGNAL, b"signal\0"),
        (&REAL_BSD_SIGNAL, b"bsd_signal\0"),
        (&REAL_SSIGNAL, b"ssignal\0"),
        (&REAL_SYSV_SIGNAL, b"sysv_signal\0"),
        (&REAL___SYSV_SIGNAL, b"__sysv_signal\0"),
        (&REAL_SIGSET, b"sigset\0"),
    ]
}

// ---------------------------------------------------------------------------
// The handlers.

/// The shim's handler where the program's disposition is SIG_DFL: flush,
/// then the default action (see the module docs).
extern "C" fn on_fatal(sig: c_int, info: *mut libc::siginfo_t, _ctx: *mut c_void) {
    let saved_errno = errno();
    if sig == state::SNAPSHOT_SIGNAL.load(Ordering::Relaxed)
        && state::LIFECYCLE.load(Ordering::Acquire) == state::RUNNING
        // SAFETY: getpid has no preconditions.
        && unsafe { libc::getpid() } == state::SESSION_PID.load(Ordering::Acquire)
        && alloctrace_writer::request_snapshot_from_signal()
    {
        set_errno(saved_errno);
        return;
    }
    let prev = reentrancy::replace(reentrancy::OWN);
    let mut may_resume = true;
    if state::LIFECYCLE.load(Ordering::Acquire) == state::RUNNING
        // SAFETY: getpid has no preconditions.
        && unsafe { libc::getpid() } == state::SESSION_PID.load(Ordering::Acquire)
    {
        boundary::quietly(|| {
            let flushed = alloctrace_writer::flush_for_fatal_signal();
            if flushed.ended {
                let _ = state::LIFECYCLE.compare_exchange(
                    state::RUNNING,
                    state::STOPPED,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
            }
            may_resume = !flushed.mid_event;
        });
    }
    if let Some(real) = own_sigaction() {
        let l = lock();
        // SIG_DFL, with the flags and mask the program set with it.
        let mut dfl = l.view(sig);
        dfl.sa_sigaction = libc::SIG_DFL;
        // SAFETY: a valid action.
        unsafe { real(sig, &dfl, core::ptr::null_mut()) };
        drop(l);
    }
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    // A hardware fault repeats when its instruction runs again; a machine
    // check the kernel reports ahead of any access (BUS_MCEERR_AO) does not.
    let fault = matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL
    ) && code > 0
        && !(sig == libc::SIGBUS && code == BUS_MCEERR_AO);
    if !(fault && may_resume) {
        requeue(sig, info);
    }
    reentrancy::replace(prev);
    set_errno(saved_errno);
}

/// Sends `sig` again to the calling thread, with `info` where the kernel
/// allows it. It stays pending (blocked in the handler) until the handler
/// returns, then acts with SIG_DFL.
fn requeue(sig: c_int, info: *mut libc::siginfo_t) {
    // SAFETY: getpid, gettid, rt_tgsigqueueinfo and tgkill take integers
    // and a valid siginfo pointer.
    unsafe {
        let pid = libc::getpid();
        let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
        if libc::syscall(libc::SYS_rt_tgsigqueueinfo, pid, tid, sig, info) != 0 {
            libc::syscall(libc::SYS_tgkill, pid, tid, sig);
        }
    }
}

/// The kernel's handler for a program handler with SA_RESETHAND: resets the
/// program's view to SIG_DFL (the kernel gets [`on_fatal`]), then calls the
/// program's handler as the kernel would have.
extern "C" fn on_reset(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let saved_errno = errno();
    let Some(real) = own_sigaction() else { return };
    let program = {
        let mut l = lock();
        let k = kernel(real, sig);
        if k.sa_sigaction == on_reset as *const () as usize {
            let program = l.view(sig);
            let mut dfl = program;
            dfl.sa_sigaction = libc::SIG_DFL;
            // SAFETY: a valid action (SIG_DFL); adopt then installs on_fatal.
            unsafe { real(sig, &dfl, core::ptr::null_mut()) };
            adopt(&mut l, real, sig);
            Some(program)
        } else {
            // Another delivery reset it first: this one meets SIG_DFL.
            None
        }
    };
    let Some(program) = program else {
        set_errno(saved_errno);
        on_fatal(sig, info, ctx);
        return;
    };
    set_errno(saved_errno);
    let handler = program.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return;
    }
    // SAFETY: the program installed this handler for this signal, with
    // SA_SIGINFO saying which signature it has.
    unsafe {
        if program.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) =
                core::mem::transmute(handler);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(c_int) = core::mem::transmute(handler);
            f(sig);
        }
    }
}

// ---------------------------------------------------------------------------
// The interposed functions.

/// Interposed sigaction(2).
///
/// # Safety
/// As sigaction(2).
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { sigaction_via(real_sigaction(), sig, act, old) }
}

/// Interposed __sigaction (glibc's other name for it).
///
/// # Safety
/// As sigaction(2).
#[no_mangle]
pub unsafe extern "C" fn __sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { sigaction_via(real_underscore_sigaction(), sig, act, old) }
}

/// sigaction and __sigaction: the program's call goes to `next` (its own
/// name's next definition), once; the shim's reads and installs go to
/// glibc's.
///
/// # Safety
/// As sigaction(2).
unsafe fn sigaction_via(
    next: Option<Sigaction>,
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    let Some(next) = next else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    let own = match own_sigaction() {
        Some(own) if is_handled(sig) && reentrancy::get() != reentrancy::OWN => own,
        // SAFETY: forwarded.
        _ => return unsafe { next(sig, act, old) },
    };
    let mut l = lock();
    // SAFETY: a zeroed sigaction is valid; next fills it.
    let mut k: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: forwarded, with a valid out-pointer.
    let rc = unsafe { next(sig, act, &mut k) };
    let e = errno();
    if rc == 0 {
        // The panic boundary: the call is made; at worst the program
        // reads the kernel's action.
        boundary::shielded(
            || {
                if !old.is_null() {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *old = view_of(&l, sig, &k) };
                }
                if !act.is_null() {
                    adopt(&mut l, own, sig);
                }
            },
            || {
                if !old.is_null() {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *old = k };
                }
            },
        );
    }
    drop(l);
    set_errno(e);
    rc
}

/// Runs `call` (a real signal-setting function for `sig`) and then keeps
/// the view: its result is translated where it names a shim handler. Two
/// threads setting the same signal at once through these may see each
/// other's result translated from the view just before: the kernel and
/// the view still agree afterwards (adopt reads the kernel).
fn via(sig: c_int, call: impl FnOnce() -> libc::sighandler_t) -> libc::sighandler_t {
    let Some(real) = own_sigaction() else {
        return call();
    };
    if !is_handled(sig) || reentrancy::get() == reentrancy::OWN {
        return call();
    }
    let before = boundary::shielded(
        || {
            let l = lock();
            Some(view_of(&l, sig, &kernel(real, sig)))
        },
        || None,
    );
    // Not under the lock: sigset changes the signal mask, which the lock
    // saves and restores.
    let r = call();
    let e = errno();
    let r = match before {
        Some(before) if is_ours(r) => before.sa_sigaction,
        _ => r,
    };
    if r != libc::SIG_ERR {
        boundary::quietly(|| {
            let mut l = lock();
            adopt(&mut l, real, sig);
        });
    }
    set_errno(e);
    r
}

fn call_signal(
    cache: &AtomicPtr<c_void>,
    name: &[u8],
    sig: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    let Some(f) = real_signal(cache, name) else {
        set_errno(libc::ENOSYS);
        return libc::SIG_ERR;
    };
    // SAFETY: forwarded to the real function.
    via(sig, || unsafe { f(sig, handler) })
}

/// Interposed signal(3).
#[no_mangle]
pub extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    call_signal(&REAL_SIGNAL, b"signal\0", sig, handler)
}

/// Interposed bsd_signal(3).
#[no_mangle]
pub extern "C" fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    call_signal(&REAL_BSD_SIGNAL, b"bsd_signal\0", sig, handler)
}

/// Interposed ssignal(3).
#[no_mangle]
pub extern "C" fn ssignal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    call_signal(&REAL_SSIGNAL, b"ssignal\0", sig, handler)
}

/// Interposed sysv_signal(3).
#[no_mangle]
pub extern "C" fn sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    call_signal(&REAL_SYSV_SIGNAL, b"sysv_signal\0", sig, handler)
}

/// Interposed __sysv_signal (what `signal` is in a strict ISO C program).
#[no_mangle]
pub extern "C" fn __sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    call_signal(&REAL___SYSV_SIGNAL, b"__sysv_signal\0", sig, handler)
}

/// Interposed sigset(3).
#[no_mangle]
pub extern "C" fn sigset(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    call_signal(&REAL_SIGSET, b"sigset\0", sig, handler)
}
