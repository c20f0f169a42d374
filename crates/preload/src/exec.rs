//! execve, execv, execvp, execvpe, fexecve, execl, execlp, execle,
//! posix_spawn, posix_spawnp, _exit and _Exit.
//!
//! The exec functions end the session before the process image is
//! replaced (exec discards the writer thread and every buffer, so the trace
//! would be cut short), carry the run into the new program, and resume
//! tracing into a new file if the exec fails. posix_spawn and posix_spawnp
//! (glibc's exec their child with its internal execve, which no wrapper
//! sees) carry the run into the child; the parent's session goes on.
//! What the new program's environment is (the run follows every exec and
//! spawn) is run_env.rs's rule.
//!
//! Each wrapper then calls the next definition (real.rs), so an interposer
//! preloaded after the shim sees one call for each of the program's:
//! execve, execvpe, fexecve, posix_spawn, posix_spawnp, _exit and _Exit as
//! themselves; execv and execl as execve, execvp and execlp as execvpe,
//! execle as execve, as glibc builds them. The new program's environment is
//! an argument only of the `e` variants, and setting `environ` instead
//! would change the parent's in a vfork child.
//!
//! execl, execlp and execle are variadic, which Rust cannot define: they
//! are C (execl.c), which collects the arguments in an array on the stack
//! of exactly their number (at most 65536; more is E2BIG) and calls
//! [`execl_target`], that is, the
//! execv, execvp and execve wrappers below. Rust exports them as naked
//! functions that jump to the C ones, leaving the variadic call's
//! registers and stack as they are.

use core::ffi::{c_char, c_int};

use core::cell::Cell;

use crate::run_env::with_run_env;
use crate::{boundary, real, reentrancy, session};

extern "C" {
    static environ: *const *const c_char;
}

/// The common part of every exec wrapper.
///
/// # Safety
/// `envp` is null or a valid environment array; `call` execs.
unsafe fn exec_with(
    envp: *const *const c_char,
    call: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    if reentrancy::get() == reentrancy::OWN {
        return call(envp);
    }
    // The panic boundary: a panic before the exec makes it with the
    // caller's environment; one after a failed exec returns its answer.
    let call = Cell::new(Some(call));
    let answer: Cell<Option<(c_int, c_int)>> = Cell::new(None);
    boundary::shielded(
        || {
            // SAFETY: as the caller's envp.
            unsafe {
                with_run_env(envp, |env| {
                    let stopped = session::stop_if_ours(false);
                    let r = call.take().map_or(-1, |call| call(env));
                    let saved = real::errno();
                    answer.set(Some((r, saved)));
                    if stopped {
                        session::after_failed_exec();
                    }
                    real::set_errno(saved);
                    r
                })
            }
        },
        || match (answer.get(), call.take()) {
            (Some((r, saved)), _) => {
                real::set_errno(saved);
                r
            }
            (None, Some(call)) => call(envp),
            (None, None) => -1,
        },
    )
}

/// Interposed execve(2).
///
/// # Safety
/// As execve(2).
#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { exec_with(envp, |env| real::execve(path, argv, env)) }
}

/// Interposed execv(3).
///
/// # Safety
/// As execv(3).
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: forwarded, with the process environment.
    unsafe { exec_with(environ, |env| real::execve(path, argv, env)) }
}

/// Interposed execvp(3).
///
/// # Safety
/// As execvp(3).
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: forwarded, with the process environment.
    unsafe { execvpe(file, argv, environ) }
}

/// Interposed execvpe(3).
///
/// # Safety
/// As execvpe(3).
#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let Some(real_execvpe) = real::execvpe() else {
        real::set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwarded.
    unsafe { exec_with(envp, |env| real_execvpe(file, argv, env)) }
}

/// Interposed fexecve(3).
///
/// # Safety
/// As fexecve(3).
#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    let Some(real_fexecve) = real::fexecve() else {
        real::set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwarded.
    unsafe { exec_with(envp, |env| real_fexecve(fd, argv, env)) }
}

/// posix_spawn and posix_spawnp once the next one is known: the child gets
/// the run's environment; the parent's session goes on (no stop needed:
/// the parent keeps running, and glibc's child runs no handler of ours).
///
/// # Safety
/// As posix_spawn(3).
unsafe fn spawn_with(
    next: Option<real::PosixSpawn>,
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    let Some(next) = next else {
        return libc::ENOSYS;
    };
    if reentrancy::get() == reentrancy::OWN {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { next(pid, path, actions, attr, argv, envp) };
    }
    // The panic boundary: a panic before the spawn makes it with the
    // caller's environment.
    let called: Cell<Option<c_int>> = Cell::new(None);
    boundary::shielded(
        || {
            // SAFETY: as the caller's envp; the array lives until the call
            // returns.
            unsafe {
                with_run_env(envp.cast(), |env| {
                    let r = next(pid, path, actions, attr, argv, env.cast());
                    called.set(Some(r));
                    r
                })
            }
        },
        || {
            called.get().unwrap_or_else(|| {
                // SAFETY: the caller's arguments, unchanged.
                unsafe { next(pid, path, actions, attr, argv, envp) }
            })
        },
    )
}

/// Interposed posix_spawn(3).
///
/// # Safety
/// As posix_spawn(3).
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { spawn_with(real::posix_spawn(), pid, path, actions, attr, argv, envp) }
}

/// Interposed posix_spawnp(3).
///
/// # Safety
/// As posix_spawnp(3).
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: forwarded.
    unsafe { spawn_with(real::posix_spawnp(), pid, file, actions, attr, argv, envp) }
}

/// What execl.c calls once it has the arguments in an array: `how` 0 is
/// execl (execv), 1 execlp (execvp), 2 execle (execve with `envp`).
unsafe extern "C" fn execl_target(
    how: c_int,
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the caller's arguments, collected by execl.c.
    unsafe {
        match how {
            0 => execv(file, argv),
            1 => execvp(file, argv),
            _ => execve(file, argv, envp),
        }
    }
}

type ExeclTarget =
    unsafe extern "C" fn(c_int, *const c_char, *const *const c_char, *const *const c_char) -> c_int;

extern "C" {
    // execl.c (hidden: not exported).
    fn alloctrace_execl_init(target: ExeclTarget);
    fn alloctrace_execl(path: *const c_char, arg: *const c_char, ...) -> c_int;
    fn alloctrace_execlp(file: *const c_char, arg: *const c_char, ...) -> c_int;
    fn alloctrace_execle(path: *const c_char, arg: *const c_char, ...) -> c_int;
}

/// Points execl.c at the exec wrappers (the constructor calls it first).
pub fn init_execl() {
    // SAFETY: stores a function pointer.
    unsafe { alloctrace_execl_init(execl_target) };
}

/// Interposed execl(3): a jump to execl.c's, which sees the caller's
/// variadic arguments as they were passed.
///
/// # Safety
/// As execl(3).
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn execl() {
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!("jmp {}", sym alloctrace_execl);
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!("b {}", sym alloctrace_execl);
}

/// Interposed execlp(3), as execl.
///
/// # Safety
/// As execlp(3).
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn execlp() {
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!("jmp {}", sym alloctrace_execlp);
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!("b {}", sym alloctrace_execlp);
}

/// Interposed execle(3), as execl.
///
/// # Safety
/// As execle(3).
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn execle() {
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!("jmp {}", sym alloctrace_execle);
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!("b {}", sym alloctrace_execle);
}

/// Ends the session before `_exit`/`_Exit`, which run no atexit handler
/// (dash, for one, always leaves through `_exit`), when that is safe: the
/// calling thread runs the program's code (not the shim's, not an event a
/// signal handler interrupted) and the session is this process's (not the
/// parent's, seen from a vfork child). Otherwise the trace is cut at the
/// last batch the writer wrote, and readers report it truncated.
fn stop_before_exit() {
    if reentrancy::in_program() {
        boundary::quietly(|| {
            let _ = session::stop_if_ours(true);
        });
    }
}

/// Interposed _exit(2).
#[no_mangle]
pub extern "C" fn _exit(status: c_int) -> ! {
    stop_before_exit();
    real::exit(false, status)
}

/// Interposed _Exit(3) (the same function as _exit in glibc).
#[no_mangle]
pub extern "C" fn _Exit(status: c_int) -> ! {
    stop_before_exit();
    real::exit(true, status)
}
