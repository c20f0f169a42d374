//! The DWARF CFI walk (framehop over the in-memory `.eh_frame_hdr` and
//! `.eh_frame` of every loaded object).

use core::ops::Deref;
use core::sync::atomic::{AtomicU64, Ordering};

use core::cell::UnsafeCell;
use core::sync::atomic::AtomicBool;

use framehop::{
    CacheNative, ExplicitModuleSectionInfo, Module, MustNotAllocateDuringUnwind, Unwinder as _,
    UnwinderNative,
};

use crate::modules::Modules;
use crate::table::{RuleCache, SharedRules, Tables};

/// A range of a loaded object's memory (an unwind section), read in place.
#[derive(Clone, Copy, Debug)]
pub struct MappedBytes {
    ptr: *const u8,
    len: usize,
}

// SAFETY: MappedBytes is a read-only view of a loaded object's unwind
// section; reading it from any thread is as safe as from the one that made
// it (DwarfUnwinder::from_modules' contract keeps it mapped).
unsafe impl Send for MappedBytes {}
// SAFETY: as for Send: shared read-only memory.
unsafe impl Sync for MappedBytes {}

impl Default for MappedBytes {
    /// An empty view.
    fn default() -> Self {
        MappedBytes {
            ptr: core::ptr::NonNull::<u8>::dangling().as_ptr(),
            len: 0,
        }
    }
}

impl Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr/len describe a section of a loaded object, mapped
        // readable while the unwinder that owns this view is in use
        // (DwarfUnwinder::from_modules' contract).
        unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The unwind tables of a [`Modules`] snapshot, ready for the captures:
/// each module's compact table (built here from its `.eh_frame`) and
/// framehop's view of the same sections (the fallback), with a small set of
/// framehop caches the fallback steps claim.
///
/// Built at set-up from a snapshot (it allocates); shared read-only by
/// every thread's captures (`&DwarfUnwinder`). Rebuilt with the snapshot
/// after each `dlopen`/`dlclose` ([`DwarfUnwinder::from_modules_reusing`]
/// keeps the tables of the modules that did not change).
pub struct DwarfUnwinder {
    pub(crate) inner: UnwinderNative<MappedBytes, MustNotAllocateDuringUnwind>,
    /// Unique per unwinder built in this process: a [`WalkMemo`](crate::WalkMemo)
    /// or a [`DwarfCache`] filled with another unwinder is not reused.
    pub(crate) id: u64,
    modules: usize,
    /// Readable, executable segments `[start, end)` of every module, sorted:
    /// where a return address may be checked for the signal trampoline.
    code: Vec<(u64, u64)>,
    /// The compact tables.
    pub(crate) tables: Tables,
    /// Whether `tables` were built (else empty: every step is framehop's).
    with_tables: bool,
    /// The rules the threads' caches missed, for all of them (empty
    /// without `tables`).
    pub(crate) shared_rules: SharedRules,
    /// framehop caches for the fallback steps.
    pub(crate) fallback: Pool,
}

/// framehop caches shared by all threads: a fallback step claims a free one
/// with one compare-exchange and gives it back after the step; it never
/// waits (when all are in use the step fails and the walk ends truncated).
pub(crate) struct Pool {
    slots: Box<[PoolSlot]>,
}

struct PoolSlot {
    busy: AtomicBool,
    cache: UnsafeCell<CacheNative<MustNotAllocateDuringUnwind>>,
}

// SAFETY: `cache` is only touched by the thread that set `busy` from false
// to true (Acquire) until it stores false (Release): one user at a time.
unsafe impl Sync for PoolSlot {}

/// How many framehop caches an unwinder holds (each 10-20 KiB, estimated).
pub const FALLBACK_CACHES: usize = 16;

/// A claimed framehop cache; released on drop.
pub(crate) struct Claim<'a> {
    slot: &'a PoolSlot,
}

impl Claim<'_> {
    pub(crate) fn cache(&mut self) -> &mut CacheNative<MustNotAllocateDuringUnwind> {
        // SAFETY: this claim holds the slot's busy flag (see PoolSlot).
        unsafe { &mut *self.slot.cache.get() }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.slot
            .busy
            .store(false, core::sync::atomic::Ordering::Release);
    }
}

impl Pool {
    fn new(n: usize) -> Pool {
        Pool {
            slots: (0..n)
                .map(|_| PoolSlot {
                    busy: AtomicBool::new(false),
                    cache: UnsafeCell::new(CacheNative::new_in()),
                })
                .collect(),
        }
    }

    /// A free cache, tried from a slot picked by `hint` (the stack pointer:
    /// threads start at different slots); `None` when all are in use.
    // Runs inside malloc: no waiting, no allocation.
    pub(crate) fn claim(&self, hint: u64) -> Option<Claim<'_>> {
        let n = self.slots.len();
        if n == 0 {
            return None;
        }
        let first = (hint >> 12) as usize % n;
        (0..n).find_map(|k| {
            let slot = self.slots.get((first + k) % n)?;
            slot.busy
                .compare_exchange(
                    false,
                    true,
                    core::sync::atomic::Ordering::Acquire,
                    core::sync::atomic::Ordering::Relaxed,
                )
                .ok()
                .map(|_| Claim { slot })
        })
    }
}

impl DwarfUnwinder {
    /// Registers every module of `modules` that has an `.eh_frame_hdr` and
    /// `.eh_frame`, and builds its compact table; a module without them is
    /// unwound by frame pointer.
    ///
    /// # Safety
    /// Every object in `modules` stays loaded (its unwind sections mapped)
    /// for as long as this unwinder is used: a dlclose wrapper must swap in
    /// an unwinder built without the object before any capture can run
    /// after the object is unmapped (in practice: rebuild after dlclose,
    /// and keep captures from using the old one once a new library can be
    /// mapped at the old one's address).
    pub unsafe fn from_modules(modules: &Modules) -> DwarfUnwinder {
        // SAFETY: the caller's contract.
        unsafe { Self::from_modules_reusing(modules, None) }
    }

    /// As [`from_modules`](Self::from_modules), taking the compact tables
    /// of the modules `prev` already had (same address range and unwind
    /// sections) instead of building them again: after a `dlopen`, only the
    /// new objects are read.
    ///
    /// # Safety
    /// As [`from_modules`](Self::from_modules).
    pub unsafe fn from_modules_reusing(
        modules: &Modules,
        prev: Option<&DwarfUnwinder>,
    ) -> DwarfUnwinder {
        // SAFETY: the caller's contract.
        unsafe { Self::build(modules, prev, true) }
    }

    /// As [`from_modules`](Self::from_modules) without the compact tables:
    /// cheap to build (no `.eh_frame` is parsed), every step is framehop's.
    /// For a session's start, while the tables are built off the program's
    /// path (alloctrace-writer builds them on its writer thread).
    ///
    /// # Safety
    /// As [`from_modules`](Self::from_modules).
    pub unsafe fn from_modules_without_tables(modules: &Modules) -> DwarfUnwinder {
        // SAFETY: the caller's contract.
        unsafe { Self::build(modules, None, false) }
    }

    /// Whether this unwinder has compact tables (else every step is
    /// framehop's).
    pub fn has_tables(&self) -> bool {
        self.with_tables
    }

    /// # Safety
    /// As [`from_modules`](Self::from_modules).
    unsafe fn build(
        modules: &Modules,
        prev: Option<&DwarfUnwinder>,
        with_tables: bool,
    ) -> DwarfUnwinder {
        let mut inner = UnwinderNative::new();
        let mut count = 0;
        let mut code: Vec<(u64, u64)> = modules
            .modules()
            .iter()
            .flat_map(|m| m.segments.iter())
            .filter(|s| s.flags & PF_RX == PF_RX && s.start < s.end)
            .map(|s| (s.start, s.end))
            .collect();
        code.sort_unstable();
        for m in modules.modules() {
            if m.eh_frame_hdr == 0 || m.eh_frame == 0 {
                continue;
            }
            let hdr = MappedBytes {
                ptr: m.eh_frame_hdr as *const u8,
                len: m.eh_frame_hdr_len as usize,
            };
            let eh = MappedBytes {
                ptr: m.eh_frame as *const u8,
                len: m.eh_frame_len as usize,
            };
            // Section addresses as the object states them (the load bias
            // taken off): framehop resolves the header's pc- and
            // data-relative pointers against them.
            let hdr_svma = m.eh_frame_hdr.wrapping_sub(m.bias);
            let eh_svma = m.eh_frame.wrapping_sub(m.bias);
            let info = ExplicitModuleSectionInfo {
                base_svma: 0,
                eh_frame_hdr_svma: Some(hdr_svma..hdr_svma.wrapping_add(m.eh_frame_hdr_len)),
                eh_frame_hdr: Some(hdr),
                eh_frame_svma: Some(eh_svma..eh_svma.wrapping_add(m.eh_frame_len)),
                eh_frame: Some(eh),
                ..Default::default()
            };
            let module = Module::new(m.path_lossy(), m.start..m.end, m.bias, info);
            inner.add_module(module);
            count += 1;
        }
        let tables = if with_tables {
            // SAFETY: the caller's contract (every module is loaded).
            unsafe { Tables::build(modules, prev.map(|p| &p.tables)) }
        } else {
            Tables::default()
        };
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        DwarfUnwinder {
            inner,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            modules: count,
            code,
            tables,
            with_tables,
            shared_rules: SharedRules::new(with_tables),
            fallback: Pool::new(FALLBACK_CACHES),
        }
    }

    /// Whether `ra` is the start of the x86_64 signal trampoline
    /// (`__restore_rt`: `mov $15, %rax; syscall`, the rt_sigreturn call the
    /// kernel makes a handler return to).
    // Must not allocate, lock or fault: runs inside malloc.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    pub(crate) fn is_sigreturn(&self, ra: u64) -> bool {
        const CODE: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];
        let i = self.code.partition_point(|&(start, _)| start <= ra);
        let Some(&(_, end)) = i.checked_sub(1).and_then(|i| self.code.get(i)) else {
            return false;
        };
        if ra >= end || end - ra < CODE.len() as u64 {
            return false;
        }
        // SAFETY: [ra, ra + 9) lies inside a readable segment of a loaded
        // module (from_modules' contract keeps it mapped).
        let bytes = unsafe { core::ptr::read_unaligned(ra as *const [u8; 9]) };
        bytes == CODE
    }

    /// How many modules have unwind tables registered.
    pub fn module_count(&self) -> usize {
        self.modules
    }

    /// The compact rule for lookup address `addr` (tests and debugging).
    #[doc(hidden)]
    pub fn compact_rule(&self, addr: u64) -> u32 {
        self.tables.lookup(addr)
    }

    /// Bytes of the rule cache the threads share (512 KiB with tables,
    /// else none).
    pub fn shared_cache_bytes(&self) -> usize {
        self.shared_rules.bytes()
    }

    /// Compact-table statistics: (rows, bytes of rows) over all modules,
    /// and per module `(path start address, rows)`.
    pub fn table_stats(&self) -> (usize, usize, Vec<(u64, usize)>) {
        let rows = self.tables.rows();
        (
            rows,
            rows * core::mem::size_of::<crate::table::Row>(),
            self.tables
                .modules
                .iter()
                .map(|t| (t.start, t.rows.len()))
                .collect(),
        )
    }
}

/// One thread's unwind cache: a direct-mapped cache of compact rules (256
/// slots keyed by address, about 3 KiB, no heap), tied to the unwinder it
/// was filled with. Owned by the thread,
/// passed `&mut` to each capture. (framehop's own rule cache, about 16
/// KiB, is no longer per thread: the rare fallback steps claim one of the
/// unwinder's.)
#[derive(Clone)]
pub struct DwarfCache {
    pub(crate) rules: RuleCache,
}

impl DwarfCache {
    /// A new, empty cache (no heap).
    pub const fn new() -> DwarfCache {
        DwarfCache {
            rules: RuleCache::new(),
        }
    }

    /// Rule-cache statistics: (hits, misses).
    pub fn hits_and_misses(&self) -> (u64, u64) {
        (self.rules.hits, self.rules.misses)
    }
}

impl Default for DwarfCache {
    fn default() -> Self {
        Self::new()
    }
}

/// rip (the next instruction's address, in the calling function), rsp and
/// rbp, read where the macro is expanded.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
macro_rules! registers_here {
    () => {{
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: copies rip, rsp and rbp into registers; touches no memory.
        unsafe {
            core::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
                options(nomem, nostack, preserves_flags),
            );
        }
        (ip, sp, bp)
    }};
}
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use registers_here;

/// `PF_R | PF_X`.
const PF_RX: u32 = 4 | 1;

/// Offset of `uc_mcontext.gregs` in the x86_64 `ucontext_t`: uc_flags (8),
/// uc_link (8), uc_stack (24); then the registers (`REG_RBP` = 10,
/// `REG_RSP` = 15, `REG_RIP` = 16), 8 bytes each.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) const UC_GREGS: u64 = 40;
