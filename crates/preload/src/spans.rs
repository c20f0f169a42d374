//! The span table: every mapping the trace believes is live, so munmap,
//! mremap and MAP_FIXED can be recorded exactly.
//!
//! The trace models a mapping as a span (base, npages, class) and knows only
//! whole-span frees, while the kernel lets a program unmap any page range,
//! and glibc's own mmap calls (malloc's large chunks, thread stacks, ld.so)
//! never reach the shim. So the shim keeps the spans it recorded in a table
//! sorted by base, and turns every change of address space it sees into
//! span events against that table:
//!
//! - a range that is unmapped (munmap, the old range of mremap, or the
//!   range a new mapping lands on, which the kernel unmaps implicitly)
//!   frees every span that overlaps it and re-allocates the pieces of those
//!   spans that lie outside it (a partial munmap becomes free + alloc of the
//!   rest);
//! - a range the shim never recorded produces no free at all: the call is
//!   recorded as a call event. So a span free always names a live span and
//!   `alloctrace check` stays clean whatever the program unmaps.
//!
//! The table lives in memory mapped with raw system calls and is guarded by
//! a futex lock held across the system call and its events, so that the
//! trace's order of span events matches the kernel's order of mappings.
//! Threads in state IN_EVENT or OWN never take it (see reentrancy.rs).

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicU32, Ordering};

/// Span class bits (the `kind_class` of span events).
pub const CLASS_SHARED: u64 = 1;
/// A file mapping (not MAP_ANONYMOUS).
pub const CLASS_FILE: u64 = 2;
/// An mremap of a mapping the shim never saw: its origin is unknown.
pub const CLASS_UNKNOWN: u64 = 4;

/// One live span: `[base, end)`, page-aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Span {
    pub base: usize,
    pub end: usize,
    pub class: u64,
}

/// A span event, before the one-tag-per-call rule is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanEvent {
    Free { base: usize },
    Alloc { base: usize, len: usize, class: u64 },
}

/// Where span events go.
pub trait Sink {
    fn event(&mut self, ev: SpanEvent);
}

/// The spans, sorted by base, non-overlapping, in raw mapped memory (never
/// malloc: the table is used inside mmap, which may run inside malloc).
pub struct Table {
    ptr: *mut Span,
    len: usize,
    cap: usize,
}

const INITIAL_CAP: usize = 4096;

impl Table {
    pub const fn new() -> Table {
        Table {
            ptr: core::ptr::null_mut(),
            len: 0,
            cap: 0,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn spans(&self) -> &[Span] {
        if self.ptr.is_null() {
            return &[];
        }
        // SAFETY: ptr holds cap >= len initialised spans.
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Index of the first span that ends after `addr`.
    fn first_ending_after(&self, addr: usize) -> usize {
        self.spans().partition_point(|s| s.end <= addr)
    }

    /// The class of the span holding `addr`, if any.
    pub fn class_at(&self, addr: usize) -> Option<u64> {
        let i = self.first_ending_after(addr);
        self.spans()
            .get(i)
            .filter(|s| s.base <= addr)
            .map(|s| s.class)
    }

    /// Makes room for one more span. False when memory cannot be had.
    fn reserve_one(&mut self) -> bool {
        if self.len < self.cap {
            return true;
        }
        let new_cap = if self.cap == 0 {
            INITIAL_CAP
        } else {
            self.cap * 2
        };
        let new_bytes = new_cap * core::mem::size_of::<Span>();
        // SAFETY: raw system calls on memory this table owns.
        let p = unsafe {
            if self.ptr.is_null() {
                crate::real::sys_mmap(
                    core::ptr::null_mut(),
                    new_bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            } else {
                crate::real::sys_mremap(
                    self.ptr.cast(),
                    self.cap * core::mem::size_of::<Span>(),
                    new_bytes,
                    libc::MREMAP_MAYMOVE,
                    core::ptr::null_mut(),
                )
            }
        };
        if p == libc::MAP_FAILED {
            return false;
        }
        self.ptr = p.cast();
        self.cap = new_cap;
        true
    }

    /// Inserts `span` at index `i`, shifting the rest. False when full.
    fn insert_at(&mut self, i: usize, span: Span) -> bool {
        if !self.reserve_one() {
            return false;
        }
        // SAFETY: i <= len < cap; the copy stays within the allocation.
        unsafe {
            core::ptr::copy(self.ptr.add(i), self.ptr.add(i + 1), self.len - i);
            self.ptr.add(i).write(span);
        }
        self.len += 1;
        true
    }

    fn remove_at(&mut self, i: usize) {
        // SAFETY: i < len; the copy stays within the allocation.
        unsafe { core::ptr::copy(self.ptr.add(i + 1), self.ptr.add(i), self.len - i - 1) };
        self.len -= 1;
    }

    fn set(&mut self, i: usize, span: Span) {
        debug_assert!(i < self.len);
        // SAFETY: i < len.
        unsafe { self.ptr.add(i).write(span) };
    }

    /// `[start, end)` is no longer mapped: frees every span overlapping it
    /// and re-allocates the parts of those spans outside it.
    pub fn unmap(&mut self, start: usize, end: usize, sink: &mut impl Sink) {
        if start >= end {
            return;
        }
        let mut i = self.first_ending_after(start);
        while i < self.len {
            let s = self.spans()[i];
            if s.base >= end {
                break;
            }
            sink.event(SpanEvent::Free { base: s.base });
            let left = (s.base < start).then_some(Span {
                base: s.base,
                end: start,
                class: s.class,
            });
            let right = (s.end > end).then_some(Span {
                base: end,
                end: s.end,
                class: s.class,
            });
            match (left, right) {
                (None, None) => self.remove_at(i),
                (Some(piece), None) | (None, Some(piece)) => {
                    self.set(i, piece);
                    sink.event(SpanEvent::Alloc {
                        base: piece.base,
                        len: piece.end - piece.base,
                        class: piece.class,
                    });
                    i += 1;
                }
                (Some(l), Some(r)) => {
                    self.set(i, l);
                    sink.event(SpanEvent::Alloc {
                        base: l.base,
                        len: l.end - l.base,
                        class: l.class,
                    });
                    // No room for the right piece: it is forgotten, and so
                    // never freed in the trace (a leak, not an anomaly).
                    if self.insert_at(i + 1, r) {
                        sink.event(SpanEvent::Alloc {
                            base: r.base,
                            len: r.end - r.base,
                            class: r.class,
                        });
                    }
                    i += 2;
                }
            }
        }
    }

    /// `[start, end)` is a new mapping of `class`: unmaps what it covers
    /// (the kernel replaced it) and records it. Returns false, recording
    /// nothing new, when the table cannot grow.
    pub fn map(&mut self, start: usize, end: usize, class: u64, sink: &mut impl Sink) -> bool {
        self.unmap(start, end, sink);
        let i = self.first_ending_after(start);
        if !self.insert_at(
            i,
            Span {
                base: start,
                end,
                class,
            },
        ) {
            return false;
        }
        sink.event(SpanEvent::Alloc {
            base: start,
            len: end - start,
            class,
        });
        true
    }
}

impl Default for Table {
    fn default() -> Table {
        Table::new()
    }
}

/// The process's table and its lock.
pub struct Shared {
    /// 0 free, 1 locked, 2 locked with waiters (futex word).
    lock: AtomicU32,
    table: UnsafeCell<Table>,
}

// SAFETY: the table is only touched with the lock held.
unsafe impl Sync for Shared {}

pub static SPANS: Shared = Shared {
    lock: AtomicU32::new(0),
    table: UnsafeCell::new(Table::new()),
};

/// The span table, locked. Unlocks on drop.
pub struct Locked(());

impl Shared {
    /// Takes the lock (a futex mutex: no allocation, sleeps in the kernel
    /// when contended).
    pub fn lock(&self) -> Locked {
        if self
            .lock
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.lock.swap(2, Ordering::Acquire) != 0 {
                // SAFETY: futex wait on our own word; spurious wakeups loop.
                unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        self.lock.as_ptr(),
                        libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                        2u32,
                        core::ptr::null::<libc::timespec>(),
                    )
                };
            }
        }
        Locked(())
    }

    fn unlock(&self) {
        if self.lock.swap(0, Ordering::Release) == 2 {
            // SAFETY: futex wake on our own word.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.lock.as_ptr(),
                    libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                    1u32,
                )
            };
        }
    }

    /// In a forked child: the lock's holder, if any, was another thread of
    /// the parent (the atfork prepare handler takes the lock, so the table
    /// itself is whole). Called with one thread running.
    pub fn reset_after_fork(&self) {
        self.lock.store(0, Ordering::Relaxed);
    }

    /// Releases a lock taken by [`Shared::lock`] whose guard was forgotten
    /// (the atfork prepare handler keeps it across fork).
    pub fn force_unlock(&self) {
        self.unlock();
    }
}

impl Locked {
    #[allow(clippy::mut_from_ref)]
    pub fn table(&mut self) -> &mut Table {
        // SAFETY: we hold the lock, and `&mut self` keeps the borrow unique.
        unsafe { &mut *SPANS.table.get() }
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        SPANS.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Events(Vec<SpanEvent>);
    impl Sink for Events {
        fn event(&mut self, ev: SpanEvent) {
            self.0.push(ev);
        }
    }

    const P: usize = 4096;

    fn free(base: usize) -> SpanEvent {
        SpanEvent::Free { base }
    }
    fn alloc(base: usize, len: usize) -> SpanEvent {
        SpanEvent::Alloc {
            base,
            len,
            class: 0,
        }
    }

    #[test]
    fn whole_partial_and_unknown_unmaps() {
        let mut t = Table::new();
        let mut ev = Events::default();
        assert!(t.map(10 * P, 20 * P, 0, &mut ev));
        assert!(t.map(30 * P, 40 * P, 0, &mut ev));
        assert_eq!(ev.0, [alloc(10 * P, 10 * P), alloc(30 * P, 10 * P)]);
        ev.0.clear();

        // Nothing recorded there: no event.
        t.unmap(0, 10 * P, &mut ev);
        t.unmap(20 * P, 30 * P, &mut ev);
        assert!(ev.0.is_empty());

        // Head, tail and middle of a span.
        t.unmap(10 * P, 12 * P, &mut ev);
        assert_eq!(ev.0, [free(10 * P), alloc(12 * P, 8 * P)]);
        ev.0.clear();
        t.unmap(18 * P, 25 * P, &mut ev);
        assert_eq!(ev.0, [free(12 * P), alloc(12 * P, 6 * P)]);
        ev.0.clear();
        t.unmap(14 * P, 15 * P, &mut ev);
        assert_eq!(
            ev.0,
            [free(12 * P), alloc(12 * P, 2 * P), alloc(15 * P, 3 * P)]
        );
        ev.0.clear();
        assert_eq!(t.len(), 3);

        // One range across several spans.
        t.unmap(13 * P, 35 * P, &mut ev);
        assert_eq!(
            ev.0,
            [
                free(12 * P),
                alloc(12 * P, P),
                free(15 * P),
                free(30 * P),
                alloc(35 * P, 5 * P)
            ]
        );
        assert_eq!(
            t.spans(),
            [
                Span {
                    base: 12 * P,
                    end: 13 * P,
                    class: 0
                },
                Span {
                    base: 35 * P,
                    end: 40 * P,
                    class: 0
                }
            ]
        );
        assert_eq!(t.class_at(36 * P), Some(0));
        assert_eq!(t.class_at(20 * P), None);
    }

    #[test]
    fn a_new_mapping_replaces_what_it_covers() {
        let mut t = Table::new();
        let mut ev = Events::default();
        t.map(0, 10 * P, 0, &mut ev);
        ev.0.clear();
        t.map(5 * P, 15 * P, CLASS_FILE, &mut ev);
        assert_eq!(
            ev.0,
            [
                free(0),
                alloc(0, 5 * P),
                SpanEvent::Alloc {
                    base: 5 * P,
                    len: 10 * P,
                    class: CLASS_FILE
                }
            ]
        );
        assert_eq!(t.class_at(12 * P), Some(CLASS_FILE));
    }

    #[test]
    fn grows_and_stays_sorted() {
        let mut t = Table::new();
        let mut ev = Events::default();
        let n = 3 * INITIAL_CAP;
        for k in (0..n).rev() {
            assert!(t.map(2 * k * P, (2 * k + 1) * P, 0, &mut ev));
        }
        assert_eq!(t.len(), n);
        assert!(t.spans().windows(2).all(|w| w[0].end <= w[1].base));
        ev.0.clear();
        t.unmap(0, 2 * n * P, &mut ev);
        assert_eq!(ev.0.len(), n);
        assert_eq!(t.len(), 0);
    }
}
