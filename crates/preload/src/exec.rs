//! execve, execv, execvp, execvpe, fexecve, execl, execlp, execle,
//! posix_spawn, posix_spawnp, _exit and _Exit.
//!
//! The exec functions end the session before the process image is
//! replaced (exec discards the writer thread and every buffer, so the trace
//! would be cut short), carry the run into the new program, and resume
//! tracing into a new file if the exec fails. posix_spawn and posix_spawnp
//! (glibc's exec their child with its internal execve, which no wrapper
//! sees) carry the run into the child; the parent's session goes on.
//!
//! ## The rule: the run follows every exec and spawn
//!
//! The shim and the run's configuration are kept through every exec and
//! spawn, whatever environment the program gives its new program (the user
//! configured the run, not the program). The new environment is the given
//! one ([`with_run_env`]) with:
//!
//! - `LD_PRELOAD`: added (the run's value) when missing; when present but
//!   not naming the shim (`env -u`, a program's own preload list), the shim
//!   is put first and the program's entries are kept;
//! - every other variable of [`config::CARRIED`]: the run's value replaces
//!   the program's; one the run did not set is removed (the new program
//!   gets the run's defaults);
//! - `ALLOCTRACE_OVERWRITE` removed: only the run's first process may
//!   replace an existing trace file;
//! - except: an environment that sets `ALLOCTRACE_DISABLE` (to anything
//!   but `0` or empty) is passed unchanged, and that program is not traced.
//!   That is how a program (or a user, with `env ALLOCTRACE_DISABLE=1`)
//!   opts one program out.
//!
//! The new environment is built in fixed arrays on the stack, so this also
//! works in a vfork child, where nothing may be allocated: an environment
//! of more than [`MAX_ENV`] entries is passed unchanged, and an
//! `LD_PRELOAD` too long for [`MAX_PRELOAD`] bytes with the shim in front
//! is replaced by the run's.
//!
//! execl, execlp and execle are variadic, which Rust cannot define: they
//! are C (execl.c), which collects the arguments in an array on the stack
//! of exactly their number (at most 65536; more is E2BIG) and calls
//! [`execl_target`], that is, the
//! execv, execvp and execve wrappers below. Rust exports them as naked
//! functions that jump to the C ones, leaving the variadic call's
//! registers and stack as they are.

use core::ffi::{c_char, c_int, CStr};
use core::sync::atomic::{AtomicPtr, Ordering};
use std::ffi::CString;

use crate::{config, guard, real, session};

/// Largest environment the wrappers extend.
pub const MAX_ENV: usize = 1000;

/// Longest `LD_PRELOAD=...` entry built with the shim put first.
pub const MAX_PRELOAD: usize = 4096;

/// What the constructor captured of the run, leaked once.
struct Run {
    /// `NAME=value` for each variable of CARRIED the run has.
    vars: Vec<CString>,
    /// The shim's path, as ld.so loaded it (dladdr).
    shim: CString,
}

static RUN: AtomicPtr<Run> = AtomicPtr::new(core::ptr::null_mut());

extern "C" {
    static environ: *const *const c_char;
}

/// Records the run's carried variables and the shim's path as they are now
/// (called by the constructor, as the shim's own code).
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
    // SAFETY: Dl_info is plain C data; all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr with an address inside this library and a valid out
    // pointer; dli_fname, if set, is a NUL-terminated string ld.so keeps.
    let shim = unsafe {
        if libc::dladdr(capture_environment as *const libc::c_void, &mut info) != 0
            && !info.dli_fname.is_null()
        {
            CStr::from_ptr(info.dli_fname).to_owned()
        } else {
            CString::default()
        }
    };
    let old = RUN.swap(
        Box::into_raw(Box::new(Run { vars, shim })),
        Ordering::AcqRel,
    );
    debug_assert!(old.is_null());
}

/// The `NAME` of a `NAME=value` entry (all of it if there is no `=`).
fn name_of(var: &[u8]) -> &[u8] {
    &var[..var.iter().position(|&c| c == b'=').unwrap_or(var.len())]
}

/// The value of a `NAME=value` entry.
fn value_of(var: &[u8]) -> &[u8] {
    var.iter()
        .position(|&c| c == b'=')
        .map_or(&[], |i| &var[i + 1..])
}

/// The last path component.
fn file_name(path: &[u8]) -> &[u8] {
    path.rsplit(|&c| c == b'/').next().unwrap_or(path)
}

/// Whether an LD_PRELOAD value (entries separated by `:` or spaces, as
/// ld.so reads it) names the shim: its path, or a file of the same name.
fn names_shim(preload: &[u8], shim: &[u8]) -> bool {
    !shim.is_empty()
        && preload.split(|&c| c == b':' || c == b' ').any(|entry| {
            entry == shim || (!entry.is_empty() && file_name(entry) == file_name(shim))
        })
}

/// Whether an `ALLOCTRACE_DISABLE` value opts out (config.rs's rule).
fn disables(value: &[u8]) -> bool {
    !value.is_empty() && value != b"0"
}

/// Calls `f` with `envp` turned into the run's environment (the rule
/// above). Must not allocate: runs in vfork children.
///
/// # Safety
/// `envp` is null or a valid NULL-terminated environment array.
unsafe fn with_run_env(
    envp: *const *const c_char,
    f: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    // SAFETY: RUN holds null or a leaked box.
    let Some(run) = (unsafe { RUN.load(Ordering::Acquire).as_ref() }) else {
        return f(envp);
    };
    let entry = |i: usize| -> &[u8] {
        // SAFETY: i is below the entry count, and every entry is a
        // NUL-terminated string.
        unsafe { CStr::from_ptr(*envp.add(i)) }.to_bytes()
    };
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
    if (0..n)
        .any(|i| name_of(entry(i)) == config::DISABLE.as_bytes() && disables(value_of(entry(i))))
    {
        return f(envp);
    }
    const SLOTS: usize = MAX_ENV + config::CARRIED.len() + 1;
    let mut array: [*const c_char; SLOTS] = [core::ptr::null(); SLOTS];
    let mut preload = [0u8; MAX_PRELOAD];
    let mut len = 0;
    let mut has_preload = false;
    let run_var = |name: &[u8]| run.vars.iter().find(|v| name_of(v.as_bytes()) == name);
    for i in 0..n {
        let var = entry(i);
        let name = name_of(var);
        if name == b"LD_PRELOAD" {
            has_preload = true;
            let value = value_of(var);
            let shim = run.shim.as_bytes();
            if !shim.is_empty() && !names_shim(value, shim) {
                // LD_PRELOAD=<shim>:<value>\0
                let parts: [&[u8]; 4] = [
                    b"LD_PRELOAD=",
                    shim,
                    if value.is_empty() { b"" } else { b":" },
                    value,
                ];
                let total: usize = parts.iter().map(|p| p.len()).sum();
                if total < MAX_PRELOAD {
                    let mut at = 0;
                    for part in parts {
                        preload[at..at + part.len()].copy_from_slice(part);
                        at += part.len();
                    }
                    preload[at] = 0;
                    array[len] = preload.as_ptr().cast();
                } else if let Some(v) = run_var(b"LD_PRELOAD") {
                    array[len] = v.as_ptr();
                } else {
                    // SAFETY: i < n.
                    array[len] = unsafe { *envp.add(i) };
                }
                len += 1;
                continue;
            }
        } else if name == config::OVERWRITE.as_bytes()
            || config::CARRIED.iter().any(|c| c.as_bytes() == name)
        {
            // The run's value (if any) is added below.
            continue;
        }
        // SAFETY: i < n.
        array[len] = unsafe { *envp.add(i) };
        len += 1;
    }
    for var in &run.vars {
        if name_of(var.as_bytes()) == b"LD_PRELOAD" && has_preload {
            continue;
        }
        array[len] = var.as_ptr();
        len += 1;
    }
    array[len] = core::ptr::null();
    f(array.as_ptr())
}

/// The common part of every exec wrapper.
///
/// # Safety
/// `envp` is null or a valid environment array; `call` execs.
unsafe fn exec_with(
    envp: *const *const c_char,
    call: impl FnOnce(*const *const c_char) -> c_int,
) -> c_int {
    if guard::get() == guard::OWN {
        return call(envp);
    }
    // SAFETY: as the caller's envp.
    unsafe {
        with_run_env(envp, |env| {
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
    if guard::get() == guard::OWN {
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { next(pid, path, actions, attr, argv, envp) };
    }
    // SAFETY: as the caller's envp; the array lives until the call returns.
    unsafe {
        with_run_env(envp.cast(), |env| {
            next(pid, path, actions, attr, argv, env.cast())
        })
    }
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
