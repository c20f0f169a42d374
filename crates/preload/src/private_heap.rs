//! The shim's private heap: every allocation made in state OWN (the shim's own
//! code and the tracer's threads, including what glibc allocates on their
//! behalf) comes from here, never from glibc's heap.
//!
//! Why: memory allocated as the shim's own code is sometimes freed by
//! somebody else, later, in the program's state. Rust's `thread::spawn`
//! (the core's start) registers a thread-local destructor, and glibc frees
//! that registration in `__call_tls_dtors` when the thread exits; glibc's
//! atfork and exit-handler lists and the TLS blocks of the tracer's threads
//! are other examples. If such a block came from glibc, its free would reach
//! the trace as the free of an object it never saw. Blocks of this heap are
//! recognised by address (one range check in free and realloc), whoever
//! frees them and whenever, and never traced.
//!
//! Design: one reservation of [`RESERVE`] bytes (MAP_NORESERVE, touched only
//! where used), a bump cursor, and power-of-two size classes with lock-free
//! free lists (Treiber stacks whose head carries a counter against ABA).
//! Lock-free, so neither fork (a lock held by a thread the child does not
//! have) nor a signal handler can deadlock it. Memory is reused, never
//! returned to the system. When the reservation is used up, allocations
//! fall back to the next allocator (real.rs).
//!
//! Each block starts with a 16-byte header: size class (u32), offset of the
//! user pointer from the block start (u32), requested size (u64); the user
//! pointer is 16-aligned (or more, for memalign).

use core::ffi::c_void;
use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Bytes reserved for the shim's private heap.
pub const RESERVE: usize = 1 << 30;
const HEADER: usize = 16;
const MIN_SHIFT: u32 = 5;
/// Classes: blocks of 32 B (1 << MIN_SHIFT) up to the whole reservation.
const CLASSES: usize = (RESERVE.trailing_zeros() - MIN_SHIFT + 1) as usize;

/// Start of the reservation. Until it is made, the top RESERVE bytes of the
/// address space (kernel space, never a user pointer), so that [`contains`]
/// is false for every pointer, null included.
static BASE: AtomicUsize = AtomicUsize::new(usize::MAX - RESERVE + 1);
/// 0 none yet, 1 being made, 2 made, 3 failed.
static STATE: AtomicUsize = AtomicUsize::new(0);
/// Next unused byte, as an offset from BASE.
static CURSOR: AtomicUsize = AtomicUsize::new(0);

/// Free list heads: low 32 bits the block's offset / 16 + 1 (0: empty),
/// high 32 bits a counter bumped at every change (ABA).
static FREE: [AtomicU64; CLASSES] = [const { AtomicU64::new(0) }; CLASSES];

/// Whether `p` is a block of the shim's private heap.
///
/// Must not allocate or lock: runs in free.
#[inline(always)]
pub fn contains(p: *mut c_void) -> bool {
    let base = BASE.load(Ordering::Relaxed);
    (p as usize).wrapping_sub(base) < RESERVE
}

fn base() -> Option<usize> {
    loop {
        match STATE.load(Ordering::Acquire) {
            2 => return Some(BASE.load(Ordering::Relaxed)),
            3 => return None,
            0 if STATE
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok() =>
            {
                // SAFETY: a fresh anonymous reservation.
                let p = unsafe {
                    crate::real::sys_mmap(
                        core::ptr::null_mut(),
                        RESERVE,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    STATE.store(3, Ordering::Release);
                    return None;
                }
                BASE.store(p as usize, Ordering::Relaxed);
                STATE.store(2, Ordering::Release);
                return Some(p as usize);
            }
            _ => core::hint::spin_loop(),
        }
    }
}

fn class_size(class: usize) -> usize {
    1 << (class as u32 + MIN_SHIFT)
}

/// A block of class `class`: from its free list, else fresh from the
/// cursor. Returns its offset from BASE.
fn take_block(base: usize, class: usize) -> Option<usize> {
    let head = &FREE[class];
    let mut h = head.load(Ordering::Acquire);
    while h as u32 != 0 {
        let offset = ((h as u32 - 1) as usize) * 16;
        // The next link lives in the free block's first word. The block is
        // never unmapped, so reading it is safe even if another thread has
        // popped it meanwhile; the counter then makes the exchange fail.
        // SAFETY: offset is within the reservation.
        let next =
            unsafe { (*((base + offset) as *const AtomicU64)).load(Ordering::Relaxed) } as u32;
        let new = ((h >> 32).wrapping_add(1) << 32) | next as u64;
        match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(offset),
            Err(current) => h = current,
        }
    }
    let size = class_size(class);
    // Blocks of a class are aligned to their size up to a page.
    let align = size.min(4096);
    let mut cur = CURSOR.load(Ordering::Relaxed);
    loop {
        let start = (cur + align - 1) & !(align - 1);
        let end = start.checked_add(size)?;
        if end > RESERVE {
            return None;
        }
        match CURSOR.compare_exchange_weak(cur, end, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some(start),
            Err(c) => cur = c,
        }
    }
}

fn give_block(base: usize, class: usize, offset: usize) {
    let head = &FREE[class];
    let link = (offset / 16 + 1) as u32;
    let mut h = head.load(Ordering::Relaxed);
    loop {
        // SAFETY: the block is ours until the exchange publishes it.
        unsafe {
            (*((base + offset) as *const AtomicU64)).store(h as u32 as u64, Ordering::Relaxed)
        };
        let new = ((h >> 32).wrapping_add(1) << 32) | link as u64;
        match head.compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Relaxed) {
            Ok(_) => return,
            Err(current) => h = current,
        }
    }
}

/// `size` bytes aligned to `align` (a power of two), or null.
pub fn alloc(size: usize, align: usize) -> *mut c_void {
    let align = align.max(HEADER);
    // Room for the header and, past 16, the alignment padding.
    let extra = if align == HEADER {
        HEADER
    } else {
        HEADER + align
    };
    let Some(need) = size.checked_add(extra) else {
        return core::ptr::null_mut();
    };
    let class = (need
        .max(1 << MIN_SHIFT)
        .next_power_of_two()
        .trailing_zeros()
        - MIN_SHIFT) as usize;
    if class >= CLASSES {
        return core::ptr::null_mut();
    }
    let Some(base) = base() else {
        return fallback(size, align);
    };
    let Some(offset) = take_block(base, class) else {
        return fallback(size, align);
    };
    let block = base + offset;
    let user = (block + HEADER + align - 1) & !(align - 1);
    // SAFETY: the header lies within the block, before the user pointer.
    unsafe {
        let header = (user - HEADER) as *mut u32;
        header.write(class as u32);
        header.add(1).write((user - block) as u32);
        (user as *mut u64).sub(1).write(size as u64);
    }
    user as *mut c_void
}

/// When the reservation is used up: the next allocator's heap (real.rs;
/// such a block is then an ordinary untraced block, freed there).
fn fallback(size: usize, align: usize) -> *mut c_void {
    // SAFETY: plain allocation.
    unsafe { crate::real::memalign(align, size) }
}

/// (class, offset of the user pointer in its block, requested size).
///
/// # Safety
/// `p` is a live block of this heap.
unsafe fn header(p: *mut c_void) -> (usize, usize, usize) {
    // SAFETY: the caller's block has a header right before it.
    unsafe {
        let h = (p as usize - HEADER) as *const u32;
        (
            h.read() as usize,
            h.add(1).read() as usize,
            (p as *const u64).sub(1).read() as usize,
        )
    }
}

/// Frees a block of this heap.
///
/// # Safety
/// `p` is a live block of this heap ([`contains`] is true).
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: as the caller's.
    let (class, user_offset, _) = unsafe { header(p) };
    let base = BASE.load(Ordering::Relaxed);
    give_block(base, class, p as usize - user_offset - base);
}

/// Bytes usable at `p`.
///
/// # Safety
/// As [`free`].
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    // SAFETY: as the caller's.
    let (class, user_offset, _) = unsafe { header(p) };
    class_size(class) - user_offset
}

/// realloc of a block of this heap (`p` non-null).
///
/// # Safety
/// As [`free`].
pub unsafe fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: as the caller's.
    let (_, _, old_size) = unsafe { header(p) };
    // SAFETY: as the caller's.
    if size <= unsafe { usable_size(p) } {
        // SAFETY: the header is ours.
        unsafe { (p as *mut u64).sub(1).write(size as u64) };
        return p;
    }
    let q = alloc(size, HEADER);
    if !q.is_null() {
        // SAFETY: both blocks hold at least min(old, new) bytes.
        unsafe {
            core::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old_size.min(size));
            free(p);
        }
    }
    q
}

/// calloc: zeroed memory (recycled blocks are not zero).
pub fn calloc(n: usize, size: usize) -> *mut c_void {
    let Some(bytes) = n.checked_mul(size) else {
        return core::ptr::null_mut();
    };
    let p = alloc(bytes, HEADER);
    if !p.is_null() {
        // Recycled blocks (and the glibc fallback) are not zero.
        // SAFETY: p holds `bytes` bytes.
        unsafe { core::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_reuse_realloc_align() {
        let a = alloc(10, 16);
        assert!(contains(a) && (a as usize).is_multiple_of(16));
        // SAFETY: a is ours.
        unsafe {
            a.cast::<u8>().write_bytes(7, 10);
            assert!(usable_size(a) >= 10);
            let b = realloc(a, 5000);
            assert!(contains(b));
            assert_eq!(*b.cast::<u8>().add(9), 7);
            free(b);
        }
        // A freed block of a class is handed out again.
        let c = alloc(4000, 16);
        // SAFETY: c is ours.
        unsafe { free(c) };
        let d = alloc(4000, 16);
        assert_eq!(c, d);
        for align in [32, 64, 4096, 1 << 16] {
            let p = alloc(100, align);
            assert!(contains(p) && (p as usize).is_multiple_of(align), "{align}");
            // SAFETY: p is ours.
            unsafe { free(p) };
        }
        let z = calloc(100, 10);
        // SAFETY: z holds 1000 bytes.
        assert!(unsafe { core::slice::from_raw_parts(z.cast::<u8>(), 1000) }
            .iter()
            .all(|&b| b == 0));
        assert!(!contains(core::ptr::null_mut()));
        assert!(!contains(&CURSOR as *const AtomicUsize as *mut c_void));
    }

    #[test]
    fn threads() {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..20_000usize {
                        let p = alloc((i * 7 + t) % 300 + 1, 16) as usize;
                        // SAFETY: p is ours, with at least one byte.
                        unsafe { *(p as *mut u8) = t as u8 };
                        live.push(p);
                        if i % 3 == 0 {
                            let q = live.swap_remove(i % live.len());
                            // SAFETY: q is a live block of ours.
                            unsafe {
                                assert_eq!(*(q as *const u8), t as u8);
                                free(q as *mut c_void);
                            }
                        }
                    }
                    for q in live {
                        // SAFETY: as above.
                        unsafe { free(q as *mut c_void) };
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
