//! The run's environment: what every exec and spawn carries into the new
//! program (exec.rs's wrappers call [`with_run_env`]). The constructor
//! captures it ([`capture_environment`], from session.rs) before it decides
//! whether this image is traced, so an untraced image still carries the run.
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

use core::ffi::{c_char, c_int, CStr};
use core::sync::atomic::{AtomicPtr, Ordering};
use std::ffi::CString;

use crate::config;

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
pub unsafe fn with_run_env(
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
