//! mmap, mmap64, munmap and mremap: the next definition's call (real.rs:
//! the next interposer's, or glibc's), then span events against the span
//! table (spans.rs), all under the table's lock.
//!
//! Every call is recorded by exactly one tagged event (FORMAT.md section 3):
//! the last span event the call produced, or a call event when it produced
//! none (a failed call, an munmap of memory the trace never saw). The span
//! events before the last (the frees and re-allocations of what a mapping
//! replaced or an munmap cut into) are untagged.
//!
//! The recording (and the call stack's capture) runs inside boundary.rs's
//! `event`: after a panic in it the thread's calls are made unrecorded,
//! each counted as a lost event ([`not_recorded`]).
//!
//! Span classes: bit 0 (1) MAP_SHARED, bit 1 (2) a file mapping, bit 2 (4)
//! an mremap of a mapping the shim never saw. npages is the length in
//! pages, rounded up.
//!
//! Call stacks: when the session captures native stacks, the span a
//! successful mmap or mremap maps is recorded with the call stack of that
//! call (a span-alloc-with-stack event, FORMAT.md section 3), captured in
//! the exported wrapper's body before the system call, outside the span
//! table's lock (the capture neither allocates, locks nor maps). The pieces
//! of older spans that a call re-allocates carry no stack.

use core::ffi::{c_int, c_void};
use core::sync::atomic::Ordering;

use alloctrace_writer::capture::{self, StackMode};
use alloctrace_writer::events::{self, tagged, EntryPoint};

use crate::spans::{SpanEvent, Table, CLASS_FILE, CLASS_SHARED, CLASS_UNKNOWN, SPANS};
use crate::state::{self, page_size};
use crate::{boundary, real, reentrancy};

#[inline(always)]
fn pages(len: usize) -> usize {
    len.div_ceil(page_size())
}

#[inline(always)]
fn round_up(len: usize) -> usize {
    pages(len).saturating_mul(page_size())
}

/// Applies the one-tag-per-call rule: holds back the latest event, emits
/// the ones before it untagged, and tags the last; the call's own new span
/// (at `stack_base`) gets the call's stack.
struct Tagger {
    pending: Option<SpanEvent>,
    /// The call stack of the mapping call (0: none).
    stack: u64,
    /// Where the call's own new span starts (the one `stack` belongs to).
    stack_base: usize,
}

impl Tagger {
    fn new(stack: u64) -> Tagger {
        Tagger {
            pending: None,
            stack,
            stack_base: usize::MAX,
        }
    }

    fn finish(self, entry: EntryPoint) {
        match self.pending {
            Some(SpanEvent::Free { base }) => tagged::span_free(entry, base),
            Some(SpanEvent::Alloc { base, len, class })
                if self.stack != 0 && base == self.stack_base =>
            {
                tagged::span_alloc_stack(entry, base, pages(len), class, self.stack)
            }
            Some(SpanEvent::Alloc { base, len, class }) => {
                tagged::span_alloc(entry, base, pages(len), class)
            }
            None => tagged::call(entry),
        }
    }
}

impl crate::spans::Sink for Tagger {
    fn event(&mut self, ev: SpanEvent) {
        match self.pending.replace(ev) {
            Some(SpanEvent::Free { base }) => events::span_free(base),
            Some(SpanEvent::Alloc { base, len, class }) => {
                events::span_alloc(base, pages(len), class)
            }
            None => {}
        }
    }
}

/// Emits a span-exists event for every span in the table: the snapshot of a
/// session that starts with mappings recorded by an earlier one (a forked
/// child's inheritance). Called with the table locked, tracing on.
pub fn snapshot(table: &mut Table) {
    let prev = reentrancy::replace(reentrancy::IN_EVENT);
    for s in table.spans() {
        events::span_exists(s.base, pages(s.end - s.base), s.class);
    }
    reentrancy::replace(prev);
}

/// Whether a call should be recorded: tracing on, mmap family wanted, and
/// the thread runs the program's code (not the core's buffer mapping, not
/// the shim's own code, not a signal handler inside either).
#[inline(always)]
fn recording() -> bool {
    alloctrace_writer::enabled()
        && state::MMAP.load(Ordering::Relaxed)
        && reentrancy::get() == reentrancy::NORMAL
}

/// A call that is not recorded ([`recording`] is false): when the session
/// records mappings but a panic turned the thread's tracing off
/// (boundary.rs), or the session ended at exit (late.rs), its event is
/// counted as lost.
#[inline(always)]
fn not_recorded() {
    crate::late::note(&state::MMAP);
    if reentrancy::get() == reentrancy::DISABLED
        && alloctrace_writer::enabled()
        && state::MMAP.load(Ordering::Relaxed)
    {
        events::lost();
    }
}

/// The call stack of the mapping call being made (which the caller
/// checked is recorded), when the session captures native stacks, else 0.
/// Must be called from the body of the exported wrapper itself (this
/// function is `#[inline(always)]`): skip 1 drops exactly the wrapper's
/// frame. A panic in the capture turns the thread's tracing off and
/// counts the call's event as lost ([`traced`] then records nothing).
#[inline(always)]
fn call_stack() -> u64 {
    if capture::mode() != StackMode::None {
        boundary::event_or(|| capture::capture_stack_or_lost(1), 0)
    } else {
        0
    }
}

/// Runs the system call `call` and records it with `record`, under the span
/// table lock and in state IN_EVENT, keeping the call's errno; the last
/// event is tagged with `entry`. `stack` is the call's stack, for the span
/// it maps. The caller checked that the call is recorded ([`recording`]):
/// only a panic in its stack capture can have turned the thread's
/// tracing off since.
#[inline]
fn traced<R: Copy>(
    entry: EntryPoint,
    stack: u64,
    call: impl FnOnce() -> R,
    record: impl FnOnce(R, &mut Table, &mut Tagger),
) -> R {
    if reentrancy::get() != reentrancy::NORMAL {
        return call();
    }
    let prev = reentrancy::replace(reentrancy::IN_EVENT);
    let mut table = SPANS.lock();
    let r = call();
    let saved = real::errno();
    // The panic boundary: the program gets the call's answer whatever the
    // recording does.
    boundary::event(|| {
        boundary::test_point(entry as u8);
        let mut tagger = Tagger::new(stack);
        record(r, table.table(), &mut tagger);
        tagger.finish(entry);
    });
    drop(table);
    real::set_errno(saved);
    if reentrancy::get() == reentrancy::IN_EVENT {
        // (A panic above left the thread DISABLED, for good.)
        reentrancy::replace(prev);
    }
    r
}

fn class_of(flags: c_int) -> u64 {
    let mut class = 0;
    let kind = flags & 0x0f; // MAP_TYPE
    if kind == libc::MAP_SHARED || kind == libc::MAP_SHARED_VALIDATE {
        class |= CLASS_SHARED;
    }
    if flags & libc::MAP_ANONYMOUS == 0 {
        class |= CLASS_FILE;
    }
    class
}

/// Records an mmap or mmap64 of `len` bytes with `flags`, made by `call`
/// (the next definition, with the caller's arguments).
fn do_mmap(
    stack: u64,
    len: usize,
    flags: c_int,
    call: impl FnOnce() -> *mut c_void,
) -> *mut c_void {
    traced(EntryPoint::Mmap, stack, call, |r, table, tagger| {
        if r != libc::MAP_FAILED {
            let base = r as usize;
            tagger.stack_base = base;
            table.map(
                base,
                base.saturating_add(round_up(len)),
                class_of(flags),
                tagger,
            );
        }
    })
}

/// Interposed mmap(2).
///
/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    if !recording() {
        not_recorded();
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::next_mmap(addr, len, prot, flags, fd, off) };
    }
    let stack = call_stack();
    // SAFETY: the caller's arguments, unchanged.
    do_mmap(stack, len, flags, || unsafe {
        real::next_mmap(addr, len, prot, flags, fd, off)
    })
}

/// Interposed mmap64 (the same function on 64-bit glibc; programs built
/// with _FILE_OFFSET_BITS=64 call it by this name). Counted as `mmap`.
///
/// # Safety
/// As mmap(2).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off64_t,
) -> *mut c_void {
    if !recording() {
        not_recorded();
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::next_mmap64(addr, len, prot, flags, fd, off) };
    }
    let stack = call_stack();
    // SAFETY: the caller's arguments, unchanged.
    do_mmap(stack, len, flags, || unsafe {
        real::next_mmap64(addr, len, prot, flags, fd, off)
    })
}

/// Interposed munmap(2).
///
/// # Safety
/// As munmap(2).
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> c_int {
    if !recording() {
        not_recorded();
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::next_munmap(addr, len) };
    }
    traced(
        EntryPoint::Munmap,
        0,
        // SAFETY: the caller's arguments, unchanged.
        || unsafe { real::next_munmap(addr, len) },
        |r, table, tagger| {
            if r == 0 {
                let base = addr as usize;
                table.unmap(base, base.saturating_add(round_up(len)), tagger);
            }
        },
    )
}

/// Interposed mremap(2). C declares it variadic, with `new_address` as the
/// optional fifth argument: on the x86-64 and AArch64 Linux ABIs a variadic
/// pointer argument travels exactly like a fixed one, and it is read only
/// when MREMAP_FIXED says the caller passed it.
///
/// # Safety
/// As mremap(2).
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let new_addr = if flags & libc::MREMAP_FIXED != 0 {
        new_addr
    } else {
        core::ptr::null_mut()
    };
    if !recording() {
        not_recorded();
        // SAFETY: the caller's arguments, unchanged.
        return unsafe { real::next_mremap(old, old_len, new_len, flags, new_addr) };
    }
    let stack = call_stack();
    traced(
        EntryPoint::Mremap,
        stack,
        // SAFETY: the caller's arguments, unchanged.
        || unsafe { real::next_mremap(old, old_len, new_len, flags, new_addr) },
        |r, table, tagger| {
            if r != libc::MAP_FAILED {
                let old_base = old as usize;
                let class = table.class_at(old_base).unwrap_or(CLASS_UNKNOWN);
                // old_len 0 duplicates a shared mapping, and
                // MREMAP_DONTUNMAP keeps the old range mapped.
                if old_len != 0 && flags & libc::MREMAP_DONTUNMAP == 0 {
                    table.unmap(old_base, old_base.saturating_add(round_up(old_len)), tagger);
                }
                let base = r as usize;
                tagger.stack_base = base;
                table.map(base, base.saturating_add(round_up(new_len)), class, tagger);
            }
        },
    )
}
