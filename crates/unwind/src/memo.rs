//! Memoized captures: a walk that stops at the first frame the previous
//! capture of the same thread is proven to share with it, and copies the
//! rest of that capture instead of unwinding it again.

use core::cell::Cell;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use framehop::{FrameAddress, UnwindRegsNative};

use crate::bounds::{Fence, StackBounds};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use crate::dwarf::{cfi_step, registers_here, Step, UC_GREGS};
use crate::dwarf::{DwarfCache, DwarfUnwinder};

/// The most frames a [`WalkMemo`] remembers: a memoized capture with a
/// longer `out` (a depth limit above this) walks without the memo and
/// clears it. Callers cap their depth limit at this.
///
/// 268: the writer's largest walk, its depth limit (256) and up to 12 of
/// the tracer's own frames and spare addresses (crates/writer, capture.rs).
pub const MEMO_DEPTH: usize = 268;

/// Entries per bank: `MEMO_DEPTH` kept frames and the one beyond the depth
/// limit that proves a walk truncated.
const CAP: usize = MEMO_DEPTH + 1;

// What an entry's step read (the low 3 bits of `Entry::tag`).
/// A CFI step that read nothing but the return address at `sp - 8`
/// (rbp was passed through or computed from registers).
const K_CFI: u64 = 0;
/// A CFI step that read the return address at `sp - 8` and rbp at
/// `tag & !KIND` (8-byte aligned: reads through the fence are).
const K_CFI_BP: u64 = 1;
/// A frame-record step (`capture_mixed` after its first frame): the saved
/// rbp at `sp - 16` and the return address at `sp - 8`.
const K_FP: u64 = 2;
/// The signal frame step: rbp, rsp and rip read from the `ucontext_t` at
/// the previous entry's stack pointer; the frame is an instruction pointer.
const K_SIGNAL: u64 = 3;
/// A CFI step that read something else (a DWARF expression, a failed read
/// framehop ignored): it cannot be checked again, so no memo is used across it.
const K_OPAQUE: u64 = 4;
const KIND: u64 = 7;

// What is known of how the step that produced an entry used the incoming
// rbp (the high bits of `Entry::tag`; stack addresses never have them),
// learnt by comparing two walks that took the step from the same pc and
// rsp with different rbp values (see `verdict`). Neither bit: unknown, or
// the step depends on it.
/// The step passes rbp through and nothing else it does depends on it: the
/// new rbp is the incoming one, the return address, the new rsp and the
/// addresses read are the same whatever the incoming rbp.
const PASS_BP: u64 = 1 << 63;
/// The step ignores the incoming rbp: the new rbp is a stack word read at
/// an address that does not depend on it (`K_CFI_BP`), and so are the
/// return address and rsp.
const DROP_BP: u64 = 1 << 62;
const BP_USE: u64 = PASS_BP | DROP_BP;
/// The address a `K_CFI_BP` step read rbp from.
const ADDR: u64 = !(KIND | BP_USE);

/// One kept frame of a walk: the return address, the unwinding state after
/// the step that produced it (stack pointer, frame pointer, frame kind),
/// and what that step read from the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    ra: u64,
    sp: u64,
    bp: u64,
    tag: u64,
}

const NO_ENTRY: Entry = Entry {
    ra: 0,
    sp: 0,
    bp: 0,
    tag: K_OPAQUE,
};

impl Entry {
    /// How a walk goes on from this entry: by CFI from a return address
    /// (0), by CFI from an interrupted pc (1), by frame record (2).
    fn class(self) -> u64 {
        match self.tag & KIND {
            K_SIGNAL => 1,
            K_FP => 2,
            _ => 0,
        }
    }

    /// The same unwinding state but perhaps rbp: a walk continues from
    /// both identically as long as it reads the same stack words and no
    /// step uses the incoming rbp before one replaces it (`PASS_BP`,
    /// `DROP_BP`).
    fn same_but_bp(self, other: Entry) -> bool {
        self.ra == other.ra && self.sp == other.sp && self.class() == other.class()
    }

    /// Whether the step that produced this entry from `prev`'s state (whose
    /// stack pointer is `prev_sp`) would
    /// produce it again now: every stack word it read, read through
    /// `fence` as the walk would, still holds what it held.
    // Runs inside malloc: reads only through the fence.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[inline(always)]
    fn holds(self, prev_sp: u64, fence: &Fence) -> bool {
        let at = |addr: u64, value: u64| fence.read(addr) == Some(value);
        let kind = self.tag & KIND;
        if kind <= K_FP {
            // The common kinds, without branching on the kind (it changes
            // from frame to frame): the return address, then rbp where it
            // was read (K_CFI_BP, K_FP) or nothing (K_CFI).
            let bp_at = if kind == K_FP {
                self.sp.wrapping_sub(16)
            } else {
                self.tag & ADDR
            };
            return at(self.sp.wrapping_sub(8), self.ra) & ((kind == K_CFI) | at(bp_at, self.bp));
        }
        if kind == K_SIGNAL {
            let gregs = prev_sp.wrapping_add(UC_GREGS);
            let reg = |i: i32| gregs.wrapping_add(8 * i as u64);
            return at(reg(libc::REG_RBP), self.bp)
                && at(reg(libc::REG_RSP), self.sp)
                && at(reg(libc::REG_RIP), self.ra);
        }
        false
    }
}

/// The stack reads of one step: the first two (address, value or failure)
/// and how many there were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reads {
    n: u8,
    /// Bit k: read k failed (outside the fence or misaligned).
    failed: u8,
    addr: [u64; 2],
    value: [u64; 2],
}

impl Reads {
    const NONE: Reads = Reads {
        n: 0,
        failed: 0,
        addr: [0; 2],
        value: [0; 2],
    };

    fn push(&mut self, addr: u64, value: Option<u64>) {
        let k = self.n as usize;
        if let (Some(a), Some(v)) = (self.addr.get_mut(k), self.value.get_mut(k)) {
            *a = addr;
            *v = value.unwrap_or(0);
            if value.is_none() {
                self.failed |= 1 << k;
            }
        }
        self.n = self.n.saturating_add(1);
    }

    /// Whether each read gives the same result now (false when there were
    /// more reads than were kept).
    // Runs inside malloc: reads only through the fence.
    fn hold(&self, fence: &Fence) -> bool {
        let n = self.n as usize;
        n <= self.addr.len()
            && (0..n).all(|k| {
                let want = (self.failed >> k & 1 == 0).then_some(self.value[k]);
                fence.read(self.addr[k]) == want
            })
    }
}

/// How a walk ended after its last kept entry, when it did not stop at the
/// depth limit: `END` (untruncated) or `FAIL` (truncated), decided by the
/// step's `reads`; `UNKNOWN` when it cannot be checked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Terminal {
    end: u8,
    reads: Reads,
}

const UNKNOWN: u8 = 0;
const END: u8 = 1;
const FAIL: u8 = 2;

const NO_TERMINAL: Terminal = Terminal {
    end: UNKNOWN,
    reads: Reads::NONE,
};

/// Which capture made a memo.
const DWARF: u8 = 1;
const MIXED: u8 = 2;

/// One thread's memory of its previous memoized capture: for each kept
/// frame its return address, the unwinding state after it (the stack
/// address its return address was read from, rsp and rbp) and the other
/// stack words its step read; whether and how the walk ended; the
/// unwinder and the capture kind it was made with.
///
/// Fixed size (about 17 KiB, two banks of [`MEMO_DEPTH`] + 1 frames: a
/// walk writes the new frames into one while it still reads the previous
/// walk's from the other), no heap. Owned by one thread (its writer state)
/// and passed `&mut` to [`capture_dwarf_memo`] or [`capture_mixed_memo`].
/// A memo moved to another thread is not unsound (every reuse is checked
/// against the current stack) but is useless.
#[derive(Clone)]
pub struct WalkMemo {
    banks: [[Entry; CAP]; 2],
    /// The bank that holds the previous walk.
    cur: usize,
    /// Kept frames of the previous walk (its `len`).
    len: usize,
    /// `banks[cur][len]` holds the frame beyond the depth limit.
    extra: bool,
    /// The previous walk's `truncated`.
    truncated: bool,
    /// How it ended, when not at the depth limit.
    term: Terminal,
    valid: bool,
    mode: u8,
    /// `DwarfUnwinder::id` of the unwinder it was made with.
    unwinder: u64,
    /// Unwinding steps the last capture took (CFI or frame record).
    steps: u32,
    /// The state the previous walk started in (rip, rsp and rbp of the
    /// capture function, as an interrupted pc) when it was a DWARF walk
    /// without skipped frames: its first step made `banks[cur][0]`. Else
    /// `NO_ENTRY` (which no state matches: its rsp is 0).
    init: Entry,
}

impl WalkMemo {
    /// An empty memo: the next capture with it walks every frame.
    pub const fn new() -> WalkMemo {
        WalkMemo {
            banks: [[NO_ENTRY; CAP]; 2],
            cur: 0,
            len: 0,
            extra: false,
            truncated: false,
            term: NO_TERMINAL,
            valid: false,
            mode: 0,
            unwinder: 0,
            steps: 0,
            init: NO_ENTRY,
        }
    }

    /// Forgets the previous capture (the next one walks every frame and
    /// reports `shared == 0`).
    pub fn clear(&mut self) {
        self.valid = false;
        self.len = 0;
        self.extra = false;
        self.truncated = false;
        self.term = NO_TERMINAL;
        self.init = NO_ENTRY;
    }

    /// How many unwinding steps (CFI or frame record, the skipped frames'
    /// included) the last memoized capture with this memo took: the frames
    /// it did not copy. For tests and benchmarks.
    #[doc(hidden)]
    pub fn steps_walked(&self) -> u32 {
        self.steps
    }
}

impl Default for WalkMemo {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Debug for WalkMemo {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WalkMemo")
            .field("valid", &self.valid)
            .field("len", &self.len)
            .field("truncated", &self.truncated)
            .finish_non_exhaustive()
    }
}

/// The result of a memoized capture: `len` and `truncated` as [`Walk`](crate::Walk)
/// (exactly what the plain capture gives), and `shared`: the outermost
/// `shared` addresses of `out[..len]` are the previous capture's outermost
/// `shared` addresses, of the same frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoWalk {
    /// Addresses written, innermost first.
    pub len: usize,
    /// The stack goes on beyond the last address (or could not be followed).
    pub truncated: bool,
    /// How many outermost addresses are proven to be the previous
    /// capture's outermost ones (0 when nothing is proven: first capture,
    /// a cleared memo, another unwinder, no match). When nonzero,
    /// `truncated` equals the previous capture's: a caller that interned
    /// the previous stack outermost-first reuses the IDs of its `shared`
    /// outermost nodes and interns `out[..len - shared]`.
    pub shared: usize,
}

/// [`capture_dwarf`](crate::capture_dwarf), memoized: the same `out[..len]`
/// and `truncated` as `capture_dwarf(skip, bounds, unwinder, cache, out)`
/// called at this point, plus `shared` (see [`MemoWalk`]); `memo` then
/// describes this walk.
///
/// The walk goes from the innermost frame as `capture_dwarf` does; after
/// each kept frame it looks in `memo` for a frame of the previous walk in
/// the same unwinding state (return address, stack pointer, frame kind;
/// frame pointer aside). From such a frame on the previous walk is a
/// deterministic function of the stack words it read and of that frame's
/// rbp, so each of them is read again (through the same bounds checks):
/// while they hold, the previous walk's frames are copied instead of
/// unwound; where one does not, the walk resumes from the last frame that
/// held. When the frame's rbp differs from the previous walk's, a frame
/// is copied only while every step up to it is known (learnt from two
/// earlier walks, see the crate docs) to pass rbp through or to replace
/// it by a stack word, so that no copied step used it. With `skip == 0`
/// the walk's starting state (this function's rip, rsp and rbp) is
/// matched the same way, before the first step. `out.len()` above
/// [`MEMO_DEPTH`] walks without the memo (and clears it).
///
/// Must not allocate, lock, make a system call, panic or fault: it runs
/// inside the host's malloc. On targets other than x86_64 Linux it returns
/// an empty, truncated walk.
#[inline(never)]
pub fn capture_dwarf_memo(
    skip: usize,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    memo_capture(
        DWARF,
        crate::capture_dwarf,
        skip,
        bounds,
        unwinder,
        cache,
        memo,
        out,
    )
}

/// [`capture_mixed`](crate::capture_mixed), memoized: the same
/// `out[..len]` and `truncated` as `capture_mixed(skip, bounds, unwinder,
/// cache, out)` called at this point, plus `shared` (see [`MemoWalk`]).
/// As [`capture_dwarf_memo`]; the frame-record frames are checked by
/// reading their two words again (saved rbp and return address). A memo
/// made by the other capture kind is not used (and is replaced).
#[inline(never)]
pub fn capture_mixed_memo(
    skip: usize,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    memo_capture(
        MIXED,
        crate::capture_mixed,
        skip,
        bounds,
        unwinder,
        cache,
        memo,
        out,
    )
}

/// The body of both memoized captures, inlined into each, so that the
/// registers it reads and the frame `plain` skips are the public
/// function's: `kind` is the walk, `plain` the same capture without the
/// memo (for an `out` longer than [`MEMO_DEPTH`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn memo_capture(
    kind: u8,
    plain: fn(usize, &StackBounds, &DwarfUnwinder, &mut DwarfCache, &mut [u64]) -> crate::Walk,
    skip: usize,
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        if out.len() > MEMO_DEPTH {
            memo.clear();
            // One more skipped: the public function's own frame.
            let w = plain(skip.saturating_add(1), bounds, unwinder, cache, out);
            return MemoWalk {
                len: w.len,
                truncated: w.truncated,
                shared: 0,
            };
        }
        let regs = registers_here!();
        memo_walk(kind, skip, regs, bounds, unwinder, cache, memo, out)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        let _ = (kind, plain, skip, bounds, unwinder, cache, out);
        memo.clear();
        MemoWalk {
            len: 0,
            truncated: true,
            shared: 0,
        }
    }
}

/// One step's outcome, with the new entry.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
enum Stepped {
    Ret(Entry),
    End,
    Fail,
}

/// How a walk ended: what the memo keeps of it, and `shared`.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
struct Fin {
    len: usize,
    extra: bool,
    truncated: bool,
    term: Terminal,
    shared: usize,
}

/// The kind tag of a CFI step's entry from the reads it made: each read
/// must be the return address at `sp - 8` or the new rbp (from one
/// address); anything else (more reads, a failed read, another value)
/// makes it opaque.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn classify(ra: u64, sp: u64, bp: u64, reads: Reads) -> u64 {
    let n = reads.n as usize;
    if n > reads.addr.len() || reads.failed != 0 {
        return K_OPAQUE;
    }
    let mut tag = K_CFI;
    for k in 0..n {
        let (addr, value) = (reads.addr[k], reads.value[k]);
        if addr == sp.wrapping_sub(8) && value == ra {
            continue;
        }
        if value == bp && addr & !ADDR == 0 && (tag == K_CFI || tag == addr | K_CFI_BP) {
            tag = addr | K_CFI_BP;
            continue;
        }
        return K_OPAQUE;
    }
    tag
}

/// What the step from `last` to `e` (a new walk) and the step from `p` to
/// `o` (the previous walk), from the same pc and rsp, show of how that
/// step uses the incoming rbp (`PASS_BP`, `DROP_BP` or 0).
///
/// From the same rbp: the same step, so `o`'s verdict when it gave the
/// same entry. From two different rbp values: the step gave the same
/// return address and rsp and read the same addresses, and rbp either
/// stayed the incoming one both times (`PASS_BP`, a CFI step that read
/// only the return address) or was read from the same address (`DROP_BP`,
/// not the incoming one both times). framehop's x86_64 rules use rbp in
/// one of three ways: not at all, passed through, or as the base of an
/// address (CFA = rbp + c, a frame record at rbp: the new rsp or an
/// address read moves with rbp), so two rbp values tell them apart. A step
/// through a frame record (`K_FP`), a signal frame or an opaque step gets 0.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn verdict(p: Entry, o: Entry, last: Entry, e: Entry) -> u64 {
    let kind = e.tag & KIND;
    if !p.same_but_bp(last) || !o.same_but_bp(e) || o.tag & !BP_USE != e.tag & !BP_USE {
        return 0;
    }
    if p.bp == last.bp {
        return if o.bp == e.bp { o.tag & BP_USE } else { 0 };
    }
    let passed = e.bp == last.bp && o.bp == p.bp;
    match kind {
        K_CFI if passed => PASS_BP,
        K_CFI_BP if !passed => DROP_BP,
        _ => 0,
    }
}

/// Re-reads the words of the previous walk's steps from `first` (a state
/// the new walk is in, rbp aside: `live` when its rbp differs) through
/// `run`: how many of `run` hold (their return addresses written to
/// `outs`), how many of those passed rbp through (their rbp is then the
/// new walk's), and whether rbp still differs after the last that held.
// Runs inside malloc: reads only through the fence.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn reread(
    first: Entry,
    run: &[Entry],
    mut live: bool,
    fence: &Fence,
    outs: &mut [u64],
) -> (usize, usize, bool) {
    let (mut v, mut passed) = (0usize, 0usize);
    let mut prev_sp = first.sp;
    if live {
        // While the new walk's rbp differs: each step must be known to
        // pass it through or to drop it; a step that may use it is walked.
        for next in run {
            if next.tag & BP_USE == 0 || !next.holds(prev_sp, fence) {
                return (v, passed, true);
            }
            if let Some(o) = outs.get_mut(v) {
                *o = next.ra;
            }
            v += 1;
            prev_sp = next.sp;
            if next.tag & PASS_BP == 0 {
                live = false;
                break;
            }
            passed = v;
        }
        if live {
            return (v, passed, true);
        }
    }
    // The common case: rbp the same (from here on), the plain re-read.
    for next in run.get(v..).unwrap_or_default() {
        if !next.holds(prev_sp, fence) {
            break;
        }
        if let Some(o) = outs.get_mut(v) {
            *o = next.ra;
        }
        v += 1;
        prev_sp = next.sp;
    }
    (v, passed, live)
}

/// One frame-record step from `last` (the walk of
/// [`crate::fp`]'s `walk`, one record at a time): the non-increasing check
/// of the previous record, then the record at `last.bp`.
// Runs inside malloc: reads only through the fence.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn fp_step(last: Entry, fence: &Fence, rec: &Cell<Reads>) -> Stepped {
    if last.tag & KIND == K_FP && last.bp != 0 && last.bp <= last.sp.wrapping_sub(16) {
        // Records must be strictly increasing (fp::walk's check, made
        // after the previous record's address was kept).
        return Stepped::Fail;
    }
    let fp = last.bp;
    if fp == 0 {
        return Stepped::End;
    }
    let (next, ret) = (fence.read(fp), fence.read(fp.wrapping_add(8)));
    let mut reads = Reads::NONE;
    reads.push(fp, next);
    reads.push(fp.wrapping_add(8), ret);
    rec.set(reads);
    let (Some(next), Some(ret)) = (next, ret) else {
        return Stepped::Fail;
    };
    if ret == 0 {
        return Stepped::End;
    }
    Stepped::Ret(Entry {
        ra: ret,
        sp: fp.wrapping_add(16),
        bp: next,
        tag: K_FP,
    })
}

/// The memoized walk of both captures, from the registers `(ip, sp, bp)`
/// of the capture function.
///
/// The new walk's frames are written into the bank that holds the previous
/// walk, over its frames that can no longer match (those below the current
/// frame's stack pointer), so that the common case (the previous walk's
/// frames copied to the same indices) moves nothing. When the new walk has
/// more frames below a stack pointer than the previous one had, what it
/// wrote so far moves to the other bank, which it then fills.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
// Every stack read goes through `fence` (or `fence_fp`, inside it).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn memo_walk(
    mode: u8,
    skip: usize,
    (ip, sp, bp): (u64, u64, u64),
    bounds: &StackBounds,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    memo: &mut WalkMemo,
    out: &mut [u64],
) -> MemoWalk {
    let Some(fence) = bounds.fence(sp) else {
        memo.clear();
        return MemoWalk {
            len: 0,
            truncated: true,
            shared: 0,
        };
    };
    // The callers walk without the memo when out.len() > MEMO_DEPTH, so a
    // bank (MEMO_DEPTH + 1 entries) holds every kept frame and the one
    // beyond the limit.
    let d = out.len().min(MEMO_DEPTH);
    let usable = memo.valid && memo.mode == mode && memo.unwinder == unwinder.id;
    let old_len = if usable { memo.len.min(MEMO_DEPTH) } else { 0 };
    let old_extra = usable && memo.extra;
    // Old entries i + 1 .. old_end may be taken (the extra one included).
    let old_end = old_len + usize::from(old_extra);
    let old_term = memo.term;
    let old_truncated = memo.truncated;
    // The walk's starting state, which a DWARF walk without skipped frames
    // can match as it matches a frame: its first step (the capture
    // function's own frame) is then checked like any other.
    let from_start = mode == DWARF && skip == 0;
    let init_now = Entry {
        ra: ip,
        sp,
        bp,
        tag: K_SIGNAL,
    };
    let old_init = if usable && from_start {
        memo.init
    } else {
        NO_ENTRY
    };
    let init_pairs = old_init.same_but_bp(init_now);
    let cur = memo.cur & 1;
    // The bank written: `cur` (in place) until the new walk outgrows the
    // dead part of the previous one.
    let mut w = cur;
    let [bank0, bank1] = &mut memo.banks;

    let rec = Cell::new(Reads::NONE);
    let mut read_stack = |addr: u64| {
        let r = fence.read(addr);
        let mut reads = rec.get();
        reads.push(addr, r);
        rec.set(reads);
        r.ok_or(())
    };
    let mut regs = UnwindRegsNative::new(ip, sp, bp);
    let mut frame = FrameAddress::from_instruction_pointer(ip);
    // The frame-record walk's fence (capture_mixed): from the first kept
    // frame's stack pointer up.
    let mut fence_fp = fence;
    let mut skip = skip;
    let mut n = 0usize;
    // The first entry of the previous walk not below the current frame
    // (stack pointers strictly increase along both walks): entries below
    // it can no longer match, nor be needed to check a match.
    let mut c = 0usize;
    // The latest new frames (`paired` of them, up to the current one) sit
    // where the previous walk's frames `paired_end - paired .. paired_end` sat, with
    // the same return addresses: when a match below them is followed to
    // the previous walk's end, they are shared too (their callers are
    // proven the same; an rbp that differed there is why the match came
    // later).
    let (mut paired, mut paired_end) = (0usize, usize::MAX);
    // The previous walk's frame that the current one (`last`) sits where,
    // when `paired_end == c` (read before the new frame overwrote it).
    let mut last_old = old_init;
    let mut last = init_now;
    let mut steps = 0u32;
    let fail = |n: usize| Fin {
        len: n,
        extra: false,
        truncated: true,
        term: NO_TERMINAL,
        shared: 0,
    };
    // Tried once, before the first step.
    let mut try_start = init_pairs && old_end > 0;
    let fin = loop {
        if try_start {
            try_start = false;
            // The previous walk from the same starting state: its steps from
            // there, checked as after a matched frame.
            let want = old_end.min(d + 1);
            let (old, _) = banks(bank0, bank1, cur);
            let Some(run) = old.get(..want) else {
                break fail(0);
            };
            let (v, passed, live) = reread(old_init, run, bp != old_init.bp, &fence, out);
            if let Some(&o) = run.get(v.wrapping_sub(1)) {
                last_old = o;
            }
            // The v entries that held are in place (bank `cur`, from 0).
            if let Some(run) = old.get_mut(..passed) {
                for f in run {
                    f.bp = bp;
                }
            }
            n = v.min(d);
            if v > d {
                break Fin {
                    len: n,
                    extra: true,
                    truncated: true,
                    term: NO_TERMINAL,
                    shared: if d == old_len { n } else { 0 },
                };
            }
            if v == old_len
                && !live
                && !old_extra
                && old_term.end != UNKNOWN
                && old_term.reads.hold(&fence)
            {
                break Fin {
                    len: n,
                    extra: false,
                    truncated: old_term.end == FAIL,
                    term: old_term,
                    shared: n,
                };
            }
            // Resume from the last frame that held.
            c = v;
            if let Some(&l) = old.get(v.wrapping_sub(1)) {
                (paired, paired_end) = (v, v);
                last = l;
                regs = UnwindRegsNative::new(l.ra, l.sp, l.bp);
                frame = if l.tag & KIND == K_SIGNAL {
                    FrameAddress::from_instruction_pointer(l.ra)
                } else {
                    match FrameAddress::from_return_address(l.ra) {
                        Some(f) => f,
                        // Not reached: a kept return address is never 0.
                        None => break fail(n),
                    }
                };
            }
        }
        rec.set(Reads::NONE);
        steps = steps.wrapping_add(1);
        let stepped = if mode == MIXED && n > 0 {
            fp_step(last, &fence_fp, &rec)
        } else {
            match cfi_step(unwinder, cache, &mut regs, &mut frame, &mut read_stack) {
                Step::Ret(ra) => {
                    let (sp, bp) = (regs.sp(), regs.bp());
                    let tag = if matches!(frame, FrameAddress::InstructionPointer(_)) {
                        K_SIGNAL
                    } else {
                        classify(ra, sp, bp, rec.get())
                    };
                    Stepped::Ret(Entry { ra, sp, bp, tag })
                }
                Step::End => Stepped::End,
                Step::Fail => Stepped::Fail,
            }
        };
        let mut e = match stepped {
            Stepped::Ret(e) => e,
            Stepped::End | Stepped::Fail => {
                let fail = matches!(stepped, Stepped::Fail);
                break Fin {
                    len: n,
                    extra: false,
                    truncated: fail,
                    term: Terminal {
                        end: if fail { FAIL } else { END },
                        reads: rec.get(),
                    },
                    shared: 0,
                };
            }
        };
        if skip > 0 {
            skip -= 1;
            continue;
        }
        let (old, _) = banks(bank0, bank1, cur);

        // The previous walk: a frame in the same state?
        while old.get(c).is_some_and(|o| c < old_len && o.sp < e.sp) {
            c += 1;
        }
        let at_c = old.get(c).filter(|_| c < old_len).copied();
        let matched = at_c.is_some_and(|o| o.same_but_bp(e));
        let pairs = at_c.is_some_and(|o| o.ra == e.ra && o.sp == e.sp);
        // Frames before this one that are shared if it matches.
        let before = if paired_end == c { paired } else { 0 };
        let old_c = at_c.unwrap_or(NO_ENTRY);
        let adjacent = if n == 0 {
            init_pairs && c == 0
        } else {
            before > 0
        };
        if adjacent && pairs {
            // The same step in both walks (from `last_old` there): what it
            // shows of its use of rbp.
            e.tag |= verdict(last_old, old_c, last, e);
        }
        (paired, paired_end) = if pairs {
            (before + 1, c + 1)
        } else {
            (0, usize::MAX)
        };
        last_old = old_c;
        // Where `e` goes: in place while index n is dead (below the cursor,
        // or the cursor's entry, which no later frame can match).
        let dead = n < c || c >= old_len || (n == c && old.get(c).is_some_and(|o| o.sp == e.sp));
        if w == cur && !dead {
            let (from, to) = banks(bank0, bank1, cur);
            let (Some(src), Some(dst)) = (from.get(..n), to.get_mut(..n)) else {
                break fail(n);
            };
            dst.copy_from_slice(src);
            w = cur ^ 1;
        }
        let (new, _) = banks(bank0, bank1, w);
        let Some(slot) = new.get_mut(n) else {
            break fail(n);
        };
        *slot = e;
        let Some(o) = out.get_mut(n).filter(|_| n < d) else {
            // The depth limit, with this frame beyond it.
            break Fin {
                len: n,
                extra: true,
                truncated: true,
                term: NO_TERMINAL,
                shared: 0,
            };
        };
        *o = e.ra;
        n += 1;
        last = e;
        if mode == MIXED && n == 1 {
            fence_fp = Fence {
                lo: e.sp.max(fence.lo),
                hi: fence.hi,
            };
        }
        if !matched {
            continue;
        }

        // From here the previous walk is a function of the stack words it
        // read: check them, up to one frame beyond the depth limit.
        let (i, k) = (c, n - 1);
        let vfence = if mode == MIXED { fence_fp } else { fence };
        let room = d - n;
        let want = old_end.saturating_sub(i + 1).min(room + 1);
        let (old, _) = banks(bank0, bank1, cur);
        let Some(run) = old.get(i..=i + want) else {
            break fail(n);
        };
        // The return addresses go to `out` as they are checked (one pass).
        let outs = out.get_mut(n..).unwrap_or_default();
        // rbp differs from `e` on when only rbp differed at the match.
        let (first, rest) = run.split_first().unwrap_or((&NO_ENTRY, &[]));
        let (v, passed, live) = reread(*first, rest, e.bp != old_c.bp, &vfence, outs);
        if let Some(&o) = run.get(v).filter(|_| v > 0) {
            last_old = o;
        }
        // Place the v entries that held at n.. (in place: moved down from
        // i + 1.., nothing to move when k == i; else copied over).
        if w == cur {
            let (bank, _) = banks(bank0, bank1, w);
            if i != k {
                if i + 1 + v > bank.len() || n + v > bank.len() {
                    break fail(n);
                }
                bank.copy_within(i + 1..i + 1 + v, n);
            }
        } else {
            let (from, to) = banks(bank0, bank1, cur);
            let (Some(src), Some(dst)) = (from.get(i + 1..i + 1 + v), to.get_mut(n..n + v)) else {
                break fail(n);
            };
            dst.copy_from_slice(src);
        }
        let (new, _) = banks(bank0, bank1, w);
        if let Some(run) = new.get_mut(n..n + passed) {
            for f in run {
                f.bp = e.bp;
            }
        }
        let kept = v.min(room);
        n += kept;
        if let Some(&e) = new.get(n - 1) {
            last = e;
        }
        if v > room {
            // A frame that held beyond the depth limit. The end lines up
            // with the previous walk's only when that was its frame beyond
            // the limit too.
            let shared = if i + 1 + room == old_len {
                n - k + before
            } else {
                0
            };
            break Fin {
                len: n,
                extra: true,
                truncated: true,
                term: NO_TERMINAL,
                shared,
            };
        }
        let j = i + 1 + v;
        if j == old_len
            && !live
            && !old_extra
            && old_term.end != UNKNOWN
            && old_term.reads.hold(&vfence)
        {
            // The previous walk's last step ends this one the same way.
            break Fin {
                len: n,
                extra: false,
                truncated: old_term.end == FAIL,
                term: old_term,
                shared: n - k + before,
            };
        }
        // Resume the walk from `last`, the last frame that held.
        c = j;
        (paired, paired_end) = (before + 1 + v, j);
        if mode == DWARF {
            regs = UnwindRegsNative::new(last.ra, last.sp, last.bp);
            frame = if last.tag & KIND == K_SIGNAL {
                FrameAddress::from_instruction_pointer(last.ra)
            } else {
                match FrameAddress::from_return_address(last.ra) {
                    Some(f) => f,
                    // Not reached: a kept return address is never 0.
                    None => break fail(n),
                }
            };
        }
    };
    let shared = if fin.truncated == old_truncated {
        fin.shared
    } else {
        0
    };
    memo.cur = w;
    memo.len = fin.len;
    memo.extra = fin.extra;
    memo.truncated = fin.truncated;
    memo.term = fin.term;
    memo.valid = true;
    memo.mode = mode;
    memo.unwinder = unwinder.id;
    memo.steps = steps;
    memo.init = if from_start { init_now } else { NO_ENTRY };
    MemoWalk {
        len: fin.len,
        truncated: fin.truncated,
        shared,
    }
}

/// Bank `a` and the other one, of the two.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[inline(always)]
fn banks<'a>(
    bank0: &'a mut [Entry; CAP],
    bank1: &'a mut [Entry; CAP],
    a: usize,
) -> (&'a mut [Entry; CAP], &'a mut [Entry; CAP]) {
    if a == 0 {
        (bank0, bank1)
    } else {
        (bank1, bank0)
    }
}
