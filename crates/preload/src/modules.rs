//! Libraries coming and going: the module table and the unwinder of native
//! call stacks (alloctrace_writer::capture) follow `dlopen`, `dlmopen` and
//! `dlclose`.
//!
//! ## dlopen and dlmopen
//!
//! After a successful load the writer re-reads the loaded objects
//! (`capture::modules_changed`), so the new library's frames are unwound by
//! its own tables from its first allocation on (without this, a capture
//! stops at the library's first frame until the writer thread notices, up
//! to 100 ms later).
//!
//! glibc resolves the name against its *caller* (the return address of
//! dlopen): the caller's namespace, its `DT_RUNPATH`, its and its loaders'
//! `DT_RPATH`, `$ORIGIN` and the other dynamic string tokens. A wrapper
//! that called the real dlopen itself would make the shim the caller. So
//! the exported dlopen and dlmopen are naked stubs that hand the arguments
//! and the return address to a router ([`dlopen_route`],
//! [`dlmopen_route`]), which answers where to jump with the arguments
//! untouched:
//!
//! - to the traced wrapper ([`dlopen_traced`]: the real call, then the
//!   refresh) when the shim as the caller finds exactly what the program's
//!   caller would: a caller in the base namespace (dlopen), and a name that
//!   is NULL or holds a `/` and no `$`, or a bare name where no search path
//!   depends on the caller (the caller has no `DT_RUNPATH`, and no loaded
//!   object but the executable, whose `DT_RPATH` glibc searches for every
//!   caller, has a `DT_RPATH`);
//! - otherwise to the real function itself, which then sees the program's
//!   return address: the load is noticed by the writer thread as before
//!   (a capture that stops in code outside every known module).
//!
//! Calls made in the shim's own state, before a session records, inside a
//! mapping event (a signal handler), and `RTLD_NOLOAD` probes go straight
//! to the real function too. The router runs as the shim's own code
//! (dladdr1 and dlinfo take the loader's lock; nothing they do is traced)
//! and keeps the program's errno.
//!
//! ## dlclose
//!
//! Before the real call, `capture::unloading_begin` lists any object
//! loaded since the last look (while it is still loaded) and swaps in an
//! unwinder that knows only the objects loaded with the program, waiting
//! until no capture uses the old one; after it, `capture::unloading_end`
//! notes the unload and restores a complete unwinder. A capture racing the
//! dlclose on another thread therefore never reads the unwind tables of an
//! object the call unmaps (the handle's, its dependencies', or an object
//! it bound at run time), whatever return address it meets.

use core::ffi::{c_char, c_int, c_void, CStr};

use crate::{boundary, real, reentrancy};

/// Interposed dlclose(3): the unwinder made safe for the unload, the real
/// call, the module table and unwinder refreshed (as the shim's own code:
/// a refresh allocates and takes the loader's lock, which neither call
/// holds around it).
///
/// # Safety
/// As dlclose(3).
#[no_mangle]
pub unsafe extern "C" fn dlclose(handle: *mut c_void) -> c_int {
    let Some(real_dlclose) = real::dlclose() else {
        return -1;
    };
    let traced = reentrancy::get() != reentrancy::OWN;
    if traced {
        own_quietly(alloctrace_writer::capture::unloading_begin);
    }
    // SAFETY: the caller's handle, unchanged.
    let rc = unsafe { real_dlclose(handle) };
    if traced {
        own_quietly(alloctrace_writer::capture::unloading_end);
    }
    rc
}

/// Runs `f` (a refresh of the writer's module table) as the shim's own
/// code, keeping the program's errno; a panic in it is caught (the
/// program's call goes on untraced).
fn own_quietly(f: fn()) {
    let errno = real::errno();
    reentrancy::own(|| boundary::quietly(f));
    real::set_errno(errno);
}

/// The traced dlopen: the real call (the shim as its caller: the router
/// checked that this finds what the program's caller would), then the
/// module table refreshed.
unsafe extern "C" fn dlopen_traced(file: *const c_char, mode: c_int) -> *mut c_void {
    let Some(real_dlopen) = real::dlopen() else {
        return core::ptr::null_mut();
    };
    // SAFETY: the caller's arguments, unchanged.
    let handle = unsafe { real_dlopen(file, mode) };
    if !handle.is_null() {
        own_quietly(loaded);
    }
    handle
}

/// The refresh after a load (and the test hook's panic point).
fn loaded() {
    boundary::test_point(boundary::TEST_DLOPEN);
    alloctrace_writer::capture::modules_changed();
}

/// The traced dlmopen, as [`dlopen_traced`].
unsafe extern "C" fn dlmopen_traced(
    lmid: libc::Lmid_t,
    file: *const c_char,
    mode: c_int,
) -> *mut c_void {
    let Some(real_dlmopen) = real::dlmopen() else {
        return core::ptr::null_mut();
    };
    // SAFETY: the caller's arguments, unchanged.
    let handle = unsafe { real_dlmopen(lmid, file, mode) };
    if !handle.is_null() {
        own_quietly(loaded);
    }
    handle
}

/// What a call with no next definition gets: NULL (dlerror has nothing to
/// say; glibc always defines both).
extern "C" fn no_dlopen() -> *mut c_void {
    core::ptr::null_mut()
}

/// Where the dlopen stub jumps, the caller's arguments untouched: the
/// traced wrapper or the real dlopen (see the module docs).
extern "C" fn dlopen_route(file: usize, mode: usize, _unused: usize, caller: usize) -> usize {
    let Some(real_dlopen) = real::dlopen() else {
        return no_dlopen as *const () as usize;
    };
    let wrap = wrappable(mode as c_int)
        && routed(|| {
            // SAFETY: `file` is the program's dlopen argument: NULL or a
            // NUL-terminated name.
            unsafe { same_as_caller(file as *const c_char, caller, true) }
        });
    if wrap {
        dlopen_traced as *const () as usize
    } else {
        real_dlopen as usize
    }
}

/// Where the dlmopen stub jumps, as [`dlopen_route`] (the namespace is
/// explicit).
extern "C" fn dlmopen_route(_lmid: usize, file: usize, mode: usize, caller: usize) -> usize {
    let Some(real_dlmopen) = real::dlmopen() else {
        return no_dlopen as *const () as usize;
    };
    let wrap = wrappable(mode as c_int)
        && routed(|| {
            // SAFETY: as in dlopen_route.
            unsafe { same_as_caller(file as *const c_char, caller, false) }
        });
    if wrap {
        dlmopen_traced as *const () as usize
    } else {
        real_dlmopen as usize
    }
}

/// Whether a call in `mode` may be traced at all: the thread runs the
/// program's code, a session records, and the call may load something.
fn wrappable(mode: c_int) -> bool {
    reentrancy::in_program() && alloctrace_writer::enabled() && mode & libc::RTLD_NOLOAD == 0
}

/// Runs the router's check as the shim's own code, keeping errno; false
/// if it panics.
fn routed(check: impl FnOnce() -> bool) -> bool {
    let errno = real::errno();
    let ok = reentrancy::own(|| boundary::shielded(check, || false));
    real::set_errno(errno);
    ok
}

/// glibc's `struct link_map`, its public head (<link.h>).
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *const Dyn,
}

/// An entry of a dynamic section (`ElfW(Dyn)`).
#[repr(C)]
struct Dyn {
    d_tag: isize,
    d_val: usize,
}

const DT_NULL: isize = 0;
const DT_RPATH: isize = 15;
const DT_RUNPATH: isize = 29;
/// dladdr1's request for the object's link map.
const RTLD_DL_LINKMAP: c_int = 2;

/// Whether the object of `map` has a dynamic entry of tag `tag`.
///
/// # Safety
/// `map` is a loaded object's link map.
unsafe fn has_tag(map: *const LinkMap, tag: isize) -> bool {
    // SAFETY: a loaded object's link map and dynamic section, which end
    // with DT_NULL.
    unsafe {
        let mut d = (*map).l_ld;
        if d.is_null() {
            return false;
        }
        while (*d).d_tag != DT_NULL {
            if (*d).d_tag == tag {
                return true;
            }
            d = d.add(1);
        }
    }
    false
}

/// Whether a loaded object other than the executable has a DT_RPATH:
/// read from each object's PT_DYNAMIC under the loader's lock.
fn any_library_has_rpath() -> bool {
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info and our data
        // pointer (a usize counter) back.
        unsafe {
            let seen = &mut *(data as *mut usize);
            *seen += 1;
            if *seen == 1 {
                // The executable: glibc searches its DT_RPATH for every
                // caller.
                return 0;
            }
            let info = &*info;
            for i in 0..info.dlpi_phnum as usize {
                let ph = &*info.dlpi_phdr.add(i);
                if ph.p_type != libc::PT_DYNAMIC {
                    continue;
                }
                let mut d =
                    (info.dlpi_addr as usize).wrapping_add(ph.p_vaddr as usize) as *const Dyn;
                while (*d).d_tag != DT_NULL {
                    if (*d).d_tag == DT_RPATH {
                        return 1;
                    }
                    d = d.add(1);
                }
            }
            0
        }
    }
    let mut seen = 0usize;
    // SAFETY: `visit` matches the callback type and only reads the
    // objects' program headers and dynamic sections, mapped while the
    // loader's lock is held.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut seen as *mut usize).cast()) != 0 }
}

/// Whether the real dlopen (`namespace`: and the caller's namespace) or
/// dlmopen, called by the shim with `file`, finds what it finds called
/// from `caller` (see the module docs).
///
/// # Safety
/// `file` is NULL or a NUL-terminated string; called as the shim's own
/// code.
unsafe fn same_as_caller(file: *const c_char, caller: usize, namespace: bool) -> bool {
    // SAFETY: Dl_info is plain data; dladdr1 fills it and the map pointer.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let mut map: *mut c_void = core::ptr::null_mut();
    // SAFETY: valid out-pointers; any address may be asked about.
    let found = unsafe {
        libc::dladdr1(
            caller as *const c_void,
            &mut info,
            &mut map,
            RTLD_DL_LINKMAP,
        )
    } != 0
        && !map.is_null();
    let map = map as *const LinkMap;
    if namespace {
        if !found {
            // Code outside every object (generated code): glibc's caller
            // is then the main program, in the base namespace, as the
            // shim's.
        } else {
            let mut ns: libc::Lmid_t = -1;
            // SAFETY: a link map is a valid handle for dlinfo.
            let rc = unsafe {
                libc::dlinfo(
                    map as *mut c_void,
                    libc::RTLD_DI_LMID,
                    (&mut ns as *mut libc::Lmid_t).cast(),
                )
            };
            if rc != 0 || ns != libc::LM_ID_BASE {
                return false;
            }
        }
    }
    if file.is_null() {
        return true;
    }
    // SAFETY: the caller's NUL-terminated name.
    let name = unsafe { CStr::from_ptr(file) }.to_bytes();
    if name.contains(&b'$') {
        // $ORIGIN, $LIB, $PLATFORM: expanded against the caller.
        return false;
    }
    if name.contains(&b'/') {
        return true;
    }
    if !namespace || !found {
        // dlmopen's search in another namespace, or an unknown caller:
        // not worth the risk.
        return false;
    }
    // A bare name: searched in the caller's DT_RUNPATH, or else in the
    // DT_RPATH of the caller and of the objects that loaded it. The shim
    // has neither, and glibc searches the executable's DT_RPATH for every
    // caller: the same search when the caller has no DT_RUNPATH and no
    // loaded object but the executable has a DT_RPATH.
    // SAFETY: `map` is the caller's loaded object.
    if unsafe { has_tag(map, DT_RUNPATH) } {
        return false;
    }
    // Every loaded object but the executable (the first one listed),
    // under the loader's lock (dl_iterate_phdr's): no DT_RPATH.
    !any_library_has_rpath()
}

/// Interposed dlopen(3): a naked stub that asks [`dlopen_route`] where to
/// go (passing the return address) and jumps there with the caller's
/// arguments and return address as they were.
///
/// # Safety
/// As dlopen(3).
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlopen() {
    // x86-64: entered with rsp = 8 mod 16; three pushes align it for the
    // call; rcx = the return address at [rsp + 24].
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "mov rcx, [rsp + 24]",
        "call {route}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym dlopen_route,
    );
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "mov x3, x30",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        "br x16",
        route = sym dlopen_route,
    );
}

/// Interposed dlmopen(3), as dlopen (the router is [`dlmopen_route`]).
///
/// # Safety
/// As dlmopen(3).
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlmopen() {
    #[cfg(target_arch = "x86_64")]
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "mov rcx, [rsp + 24]",
        "call {route}",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        route = sym dlmopen_route,
    );
    #[cfg(target_arch = "aarch64")]
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-48]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "str x2, [sp, #32]",
        "mov x3, x30",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldr x2, [sp, #32]",
        "ldp x29, x30, [sp], #48",
        "br x16",
        route = sym dlmopen_route,
    );
}
