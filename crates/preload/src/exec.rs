//! execve, execv, execvp, execvpe, fexecve, _exit and _Exit.
//!
//! The exec functions end the session before the
//! process image is replaced (exec discards the writer thread and every
//! buffer, so the trace would be cut short), carry the configuration into
//! the new program, and resume tracing into a new file if the exec fails.
//!
//! Carrying the configuration: the variables in [`config::CARRIED`] that
//! were set when the shim started are added to the new program's
//! environment when it lacks them (a program that builds a clean
//! environment for its child still has the child traced). Variables the
//! environment has are left as they are. The new environment is built in
//! a fixed array on the stack, so this also works in a vfork child, where
//! nothing may be allocated; an environment of more than
//! [`MAX_ENV`] entries is passed through unchanged.
//!
//! execl, execlp and execle are variadic, which Rust cannot define; they
//! are not interposed (glibc implements them without calling execve), so a
//! program that uses them leaves a trace cut short at the exec, and its
//! new program is traced only if the environment still names the shim.

use core::ffi::{c_char, c_int};
use core::sync::atomic::{AtomicPtr, Ordering};
use std::ffi::CString;

use crate::{config, guard, real, session};

/// Largest environment the wrappers extend.
pub const MAX_ENV: usize = 1000;

/// The `NAME=value` strings to carry, leaked once by the constructor.
static CARRY: AtomicPtr<Vec<CString>> = AtomicPtr::new(core::ptr::null_mut());

extern "C" {
    static environ: *const *const c_char;
}

/// Records the carried variables as they are now (called by the
/// constructor, as the shim's own code).
pub fn capture_environment() {
    let mut vars = Vec::new();
    for name in config::CARRIED {
        if let Some(value) = std::env::var_os(name) {
            let mut s = format!("{name}=").into_bytes();
            s.extend_from_slice(std::os::unix::ffi::OsStrExt::as_bytes(value.as_os_str()));
            if let Ok(c) = CString::new(s) {
                vars.push(c);
            }
        }
    }
    let old = CARRY.swap(Box::into_raw(Box::new(vars)), Ordering::AcqRel);
    debug_assert!(old.is_null());
}

/// The length of the `NAME=` prefix of `var`.
fn name_len(var: &[u8]) -> usize {
    var.iter().position(|&c| c == b'=').map_or(var.len(), |i| i + 1)
}

/// Calls `f` with `envp` extended by the carried variables it lacks.
///
/// # Safety
/// `envp` is null or a valid NULL-terminated environment array.
unsafe fn with_carried_env(envp: *const *const c_char, f: impl FnOnce(*const *const c_char) -> c_int) -> c_int {
    // SAFETY: CARRY holds null or a leaked box.
    let Some(carry) = (unsafe { CARRY.load(Ordering::Acquire).as_ref() }) else { return f(envp) };
    let mut n = 0;
    if !envp.is_null() {
        // SAFETY: envp is NULL-terminated.
        while unsafe { !(*envp.add(n)).is_null() } {
            n += 1;
            if n > MAX_ENV {
                return f(envp);
            }
        }
    }
    let mut array: [*const c_char; MAX_ENV + config::CARRIED.len() + 1] = [core::ptr::null(); MAX_ENV + config::CARRIED.len() + 1];
    for (i, slot) in array.iter_mut().enumerate().take(n) {
        // SAFETY: i < n, within the array.
        *slot = unsafe { *envp.add(i) };
    }
    let mut len = n;
    for var in carry {
        let prefix = &var.as_bytes()[..name_len(var.as_bytes())];
        let present = array[..n].iter().any(|&e| {
            // SAFETY: every entry is a NUL-terminated string.
            unsafe { core::ffi::CStr::from_ptr(e) }.to_bytes().starts_with(prefix)
        });
        if !present {
            array[len] = var.as_ptr();
            len += 1;
        }
    }
    if len == n {
        return f(envp);
    }
    array[len] = core::ptr::null();
    f(array.as_ptr())
}

/// The common part of every exec wrapper.
///
/// # Safety
/// `envp` is null or a valid environment array; `call` execs.
unsafe fn exec_with(envp: *const *const c_char, call: impl FnOnce(*const *const c_char) -> c_int) -> c_int {
    if guard::get() == guard::OWN {
        return call(envp);
    }
    // SAFETY: as the caller's envp.
    unsafe {
        with_carried_env(envp, |env| {
            let stopped = session::stop_if_ours();
            let r = call(env);
            let saved = real::errno();
            if stopped {
                session::after_failed_exec();
            }
            real::set_errno(saved);
            r
        })
    }
}

/// Interposed execve(2).
///
/// # Safety
/// As execve(2).
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
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
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
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
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let Some(real_fexecve) = real::fexecve() else {
        real::set_errno(libc::ENOSYS);
        return -1;
    };
    // SAFETY: forwarded.
    unsafe { exec_with(envp, |env| real_fexecve(fd, argv, env)) }
}

/// Ends the session before `_exit`/`_Exit`, which run no atexit handler
/// (dash, for one, always leaves through `_exit`), when that is safe: the
/// calling thread runs the program's code (not the shim's, not an event a
/// signal handler interrupted) and the session is this process's (not the
/// parent's, seen from a vfork child). Otherwise the trace is cut at the
/// last batch the writer wrote, and readers report it truncated.
fn stop_before_exit() {
    if guard::get() == guard::NORMAL {
        let _ = session::stop_if_ours();
    }
}

/// Interposed _exit(2).
#[no_mangle]
pub extern "C" fn _exit(status: c_int) -> ! {
    stop_before_exit();
    real::exit_group(status)
}

/// Interposed _Exit(3) (the same function as _exit in glibc).
#[no_mangle]
pub extern "C" fn _Exit(status: c_int) -> ! {
    stop_before_exit();
    real::exit_group(status)
}
