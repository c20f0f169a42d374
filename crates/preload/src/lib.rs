//! `liballoctrace_preload.so`: the alloctrace LD_PRELOAD shim.
//!
//! Loaded with `LD_PRELOAD` (`alloctrace record -- CMD` does it), it traces
//! a dynamically linked program without changing it: every call of the
//! malloc family, of mmap/munmap/mremap, and every thread's stack. The
//! configuration is read from environment variables (config.rs, docs/PRELOAD.md).
//!
//! ## Design
//!
//! - **Interposition.** The library defines malloc, calloc, realloc, free,
//!   posix_memalign, aligned_alloc, memalign, valloc, pvalloc,
//!   reallocarray, mmap, mmap64, munmap, mremap, pthread_create, execve,
//!   execv, execvp, execvpe, fexecve, execl, execlp, execle, posix_spawn,
//!   posix_spawnp, _exit and _Exit, sigaction, __sigaction, signal,
//!   bsd_signal, ssignal, sysv_signal, __sysv_signal, sigset, dlopen,
//!   dlmopen and dlclose (modules.rs: dlopen's naked stub keeps glibc's
//!   view of its caller), and
//!   exports nothing else (a Rust cdylib exports only `#[no_mangle]`
//!   items; execl.c's functions are hidden and reached through exec.rs's
//!   naked exports; `make preload-test` checks the list with `nm -D`).
//!   Exporting a `trace_*` function would hijack any
//!   same-named symbol of the traced program, so the shim links the core
//!   (alloctrace-writer, which has no C symbols), not the C API.
//! - **Real functions** without recursion (real.rs): every interposed
//!   function calls the *next* definition in the lookup order
//!   (`dlsym(RTLD_NEXT)`: glibc's, or the jemalloc, tcmalloc or mimalloc
//!   the program links or preloads, or another interposer preloaded after
//!   the shim), resolved once, before tracing starts; the allocator and the
//!   mmap family through cached pointers. The raw system call is only the
//!   fallback while resolving. The shim's own mappings are system calls,
//!   and its own threads and signal handlers go to glibc's own
//!   pthread_create and sigaction, so the next interposer sees exactly the
//!   program's calls; the library is linked with -Bsymbolic-functions, so
//!   its calls of names it defines never reach an interposer before it.
//! - **Reentrancy** (reentrancy.rs): a const-initialised thread-local state,
//!   OWN while the shim runs its own code (configuration, start, stop,
//!   dlsym, pthread_getattr_np) and on the tracer's own threads, so their
//!   calls pass through untraced; IN_EVENT while the shim records a
//!   mapping change or a stack, so a signal handler's mappings made then
//!   pass through. (The core maps its buffers with raw system calls, which
//!   no wrapper sees.)
//! - **The shim's private heap** (private_heap.rs): allocations made in
//!   state OWN come from a private lock-free heap, recognised by address when freed, so a
//!   block glibc frees later on the shim's behalf (a thread-local destructor
//!   registration, a TLS block) is never traced either.
//! - **Events** (heap.rs, maps.rs, stacks.rs): exactly one entry-tagged
//!   event per interposed call (FORMAT.md section 3), so the trace's
//!   `entry_points` count the program's calls, `free(NULL)` and failed
//!   calls included.
//! - **Call stacks** (heap.rs's and maps.rs's `call_stack`, the writer's
//!   stacks/capture/): each allocation's and each mapped span's native stack,
//!   captured by the writer from inside the wrapper (ALLOCTRACE_STACKS: full, by DWARF CFI, by default; fast,
//!   by frame pointers; none). The writer needs each thread's stack
//!   bounds, which the thread trampoline (stacks.rs) reads at thread start
//!   and session start reads for the starting thread.
//! - **Lifecycle** (session.rs): a session starts in the constructor and
//!   stops in an exit handler that runs after every library's destructor
//!   (whichever thread calls exit), before exec,
//!   and restarts in a forked child and after a failed exec, each time into
//!   a file of its own.
//! - **Shared state** (state.rs): the lifecycle state, the families the
//!   run records, the live-set filter, the session epoch and pid, the page
//!   size: atomics session.rs writes and the wrappers read (the module
//!   documents each one's writer and orderings).
//! - **The run follows every exec and spawn** (exec.rs's wrappers,
//!   run_env.rs's rule and environment builder): the new program's
//!   environment gets the shim in LD_PRELOAD and the run's configuration,
//!   whatever environment the program built, unless it sets
//!   ALLOCTRACE_DISABLE.
//! - **Fatal signals** (signals.rs): where the program's disposition of a
//!   signal that kills (SIGSEGV, SIGABRT, SIGTERM, SIGPIPE, ...) is SIG_DFL,
//!   the kernel holds the shim's handler, which saves the trace (the
//!   crashing thread's buffers, then the whole session, every wait bounded:
//!   the core's crash.rs) and lets the signal kill the process as it would
//!   have. sigaction, signal and their relatives are interposed so the
//!   program sees, and the kernel applies, exactly its own dispositions
//!   otherwise. quick_exit ends the session through an at_quick_exit
//!   handler.
//!
//! ## Module layers
//!
//! Each module uses only modules of the layers above it (no cycle;
//! tests/module_graph.rs checks it):
//!
//! | layer | modules | uses |
//! |---|---|---|
//! | leaves | state.rs (shared atomics), reentrancy.rs (per-thread state), config.rs (the environment's settings) | nothing of the crate |
//! | system | real.rs (the next functions, raw system calls); run_env.rs (the run's environment); boundary.rs (the panic boundaries, the panic hook) | reentrancy; config; reentrancy |
//! | memory | private_heap.rs, spans.rs (the span table), liveset.rs; early.rs (the log before the constructor) | real; reentrancy, state |
//! | events | heap.rs, maps.rs, stacks.rs (the wrappers that record) | the layers above |
//! | lifecycle | session.rs (start, stop, fork, the index) | the layers above |
//! | control | exec.rs (exec, spawn, _exit), signals.rs (dispositions, the fatal-signal flush) | session and the layers above |
//! | root | lib.rs (the constructor) | all |
//!
//! Lower layers never call up: what session.rs decides, the wrappers read
//! from state.rs; what a new session needs of the wrappers' modules (the
//! early log, the span table, the starting thread's stack) session.rs
//! calls down for.
//!
//! ## Invariants
//!
//! 1. A wrapper MUST call the real function through real.rs, never through
//!    an exported name. Otherwise it would call itself.
//! 2. Anything the shim itself runs that may allocate, map or create a
//!    thread MUST run in state OWN. Otherwise the shim's own allocations
//!    would be traced as the program's, or recurse into the tracer.
//! 3. Each interposed call MUST produce exactly one tagged event while
//!    tracing is on and the calling thread is in state NORMAL or IN_EVENT.
//!    Otherwise the entry-point counts would not count calls.
//! 4. A heap free MUST be recorded before the block goes back to the
//!    allocator, and a span change under the span table lock together with
//!    its system call. Otherwise another thread could record the reuse of the address
//!    before its release, and the trace would show a double allocation.
//! 5. A span free MUST name a span in the span table, and a heap free in a
//!    session with an inherited heap an object of the live set. Otherwise
//!    the trace would hold unknown frees.
//! 6. An allocator call MUST go to the next allocator with its arguments
//!    unchanged, and its answer (result, errno, return code) MUST reach the
//!    program unchanged; a block of the shim's private heap MUST never reach
//!    it. Otherwise a program that links or preloads its own allocator
//!    would get blocks from two allocators (and crash freeing one with the
//!    other), or behave differently under the shim.
//! 7. A wrapper MUST make the program's call exactly once, through the next
//!    definition (of its own name, or of the `e` variant exec.rs names),
//!    and the shim's own work (mappings, threads, signal dispositions) MUST
//!    NOT go through a next definition. Otherwise an interposer preloaded
//!    after the shim (a sandbox, fake time, another tracer) would miss the
//!    program's calls or see the shim's.
//! 8. An export's own code MUST run inside a panic boundary (boundary.rs):
//!    `event` around the recording of a call, `shielded` or `quietly`
//!    around the shim's own work. Otherwise a panic in the tracer would
//!    unwind into the program's frames, which aborts the process.
//!
//! ## Corner cases
//!
//! - Calls before the constructor (ld.so, other constructors) and after the
//!   exit handler pass through untraced: the core's events are off. After
//!   the exit handler (state EXITED: threads still running, exit handlers
//!   registered without a DSO handle before the constructor) each call of
//!   a recorded family is counted, as a lost event of the trace (late.rs).
//!   The
//!   first heap call made before the constructor resolves the next
//!   allocator's entry points (as the shim's own code: dlsym's allocations
//!   come from the shim's private heap); otherwise the constructor does.
//! - glibc's reallocarray calls realloc through the PLT, which would reach
//!   the shim's realloc: when the next reallocarray is glibc's, the shim
//!   does what it does (overflow check, next realloc), so the call is one
//!   reallocarray event. Another allocator whose entry points call each
//!   other through the PLT would show both calls.
//! - Heap calls before the constructor (other libraries' constructors) are
//!   logged in a fixed table and replayed as "exists" events by the first
//!   session (early.rs), so their later frees pair up. Only memory
//!   allocated before the shim was loaded at all (ld.so's) is unknown.
//! - A signal handler that allocates while its thread is inside an event:
//!   the core counts that event as lost and never corrupts a buffer.
//! - fork: the prepare handler holds the span table; the child starts a new
//!   session (new file, the span table's spans as "exists", the forking
//!   thread's stack as "exists", frees filtered through the live set).
//! - vfork and posix_spawn children run no fork handlers: their events (if
//!   any) go to the parent's session, and the exec wrappers leave the
//!   parent's session alone (the pid differs). The exec wrappers build the
//!   new environment on the stack (no allocation in a vfork child).
//! - exec: the session stops first (complete trace); the new program starts
//!   its own (same pid: the file name gets a `.N` suffix).
//! - `_exit` and `_Exit` run no atexit handler: their wrappers stop the
//!   session first when the thread is in the program's code (not inside the
//!   shim, e.g. a signal handler that interrupted an event) and the session
//!   is this process's (not a vfork child's parent's). A process killed by
//!   a catchable signal it left at SIG_DFL gets a complete trace from the
//!   fatal-signal handler (signals.rs); so does quick_exit. A process that
//!   ends otherwise (SIGKILL, a raw exit_group, _exit from inside the shim,
//!   a stack overflow without an alternate signal stack) leaves a trace cut
//!   at the last batch the writer wrote: readable, and reported truncated.
//! - Bad configuration: one message on stderr, the program runs untraced,
//!   and ALLOCTRACE_DISABLE=1 is set so its children stay quiet.
//! - A panic in the shim (boundary.rs): one line on stderr for the
//!   process, the program's call made all the same. In the recording of a
//!   call it turns the thread's tracing off for good (state DISABLED), its
//!   later calls counted as lost events; a DISABLED thread is otherwise
//!   the program's (it stops the session at `_exit`, forks holding the
//!   span table), and a child it forks inherits the state.
#![warn(unsafe_op_in_unsafe_fn)]
// Unit tests build only the pure modules; the interposers are left out.
#![cfg_attr(test, allow(dead_code))]

mod config;
mod liveset;
mod private_heap;
mod spans;
mod state;

#[cfg(not(test))]
mod boundary;
#[cfg(not(test))]
mod early;
#[cfg(not(test))]
mod exec;
#[cfg(not(test))]
mod heap;
#[cfg(not(test))]
mod late;
#[cfg(not(test))]
mod libc_symbols;
#[cfg(not(test))]
mod maps;
#[cfg(not(test))]
mod modules;
#[cfg(not(test))]
mod next_symbol;
#[cfg(not(test))]
mod real;
#[cfg(not(test))]
mod real_mappings;
#[cfg(not(test))]
mod reentrancy;
#[cfg(not(test))]
mod run_env;
#[cfg(not(test))]
mod session;
#[cfg(not(test))]
mod signals;
#[cfg(not(test))]
mod stacks;

#[cfg(test)]
mod real {
    //! What the pure modules need of real.rs in unit tests.
    pub use libc::mmap as sys_mmap;
    /// # Safety
    /// As mremap(2).
    pub unsafe fn sys_mremap(
        old: *mut core::ffi::c_void,
        old_len: usize,
        new_len: usize,
        flags: core::ffi::c_int,
        _new: *mut core::ffi::c_void,
    ) -> *mut core::ffi::c_void {
        // SAFETY: as the caller's.
        unsafe { libc::mremap(old, old_len, new_len, flags) }
    }
    /// # Safety
    /// As memalign(3).
    pub unsafe fn memalign(align: usize, size: usize) -> *mut core::ffi::c_void {
        // SAFETY: as the caller's.
        unsafe { libc::memalign(align, size) }
    }
}

/// The constructor: ld.so runs it when it loads the library, before the
/// program's own constructors and main.
#[cfg(not(test))]
extern "C" fn init(_argc: core::ffi::c_int, _argv: *const *const u8, _envp: *const *const u8) {
    // SAFETY: getauxval has no preconditions.
    let page = unsafe { libc::getauxval(libc::AT_PAGESZ) } as usize;
    if page.is_power_of_two() {
        state::PAGE_SIZE.store(page, core::sync::atomic::Ordering::Relaxed);
    }
    // Rust's panic message would allocate and print several lines inside
    // the program's calls: one line instead (boundary.rs).
    boundary::install_hook();
    #[cfg(feature = "panic-test")]
    boundary::test_panic::init();
    exec::init_execl();
    // A panic must not unwind into ld.so (nor leave the thread in state
    // OWN): the program runs on, untraced if the session had not started.
    boundary::quietly(|| {
        session::init();
        signals::init();
    });
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn(core::ffi::c_int, *const *const u8, *const *const u8) = init;
