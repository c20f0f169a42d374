//! The walks: the shim's ([`capture_from_in_section`], from the program's
//! registers, ending at the thread-start trampoline) and the C API's
//! ([`capture_in_section`], its own frames dropped), each inside its
//! slot's capture section, and the interning of what they found (the
//! module docs' "Walking less" and "The same walk again").

use core::sync::atomic::{AtomicU64, Ordering};

use alloctrace_unwind::{
    capture_dwarf, capture_dwarf_memo, StackBounds, StartRegs, WalkMemo, MEMO_DEPTH,
};

use super::state::{state_of, CaptureState, LastStack, TAIL_CAPI, TAIL_NONE, WALK_NONE};
use super::unwinder::{note_unknown, Unwinding, STALE, TABLES_WANTED, UNWINDER};
use super::{check, DEPTH, LOST_STACK, MAX_DEPTH, THREAD_START, THREAD_START_LEN};
use crate::thread::ThreadSlot;
/// The tracer's own module, `[start, end)`: frames in it are dropped.
pub(super) static OWN_START: AtomicU64 = AtomicU64::new(0);
pub(super) static OWN_END: AtomicU64 = AtomicU64::new(0);
/// [`capture_stack_from`](super::capture_stack_from) inside the capture section: the stack ID, or
/// [`LOST_STACK`].
#[inline(always)]
pub(super) fn capture_from_in_section(slot: &ThreadSlot, start: StartRegs) -> u64 {
    let Some(state) = state_of(slot) else {
        return LOST_STACK;
    };
    // SAFETY: loaded inside the capture section: not freed before it ends
    // (invariant 2).
    let Some(unwinding) = (unsafe { UNWINDER.load(Ordering::Acquire).as_ref() }) else {
        return LOST_STACK;
    };
    // SAFETY: the bounds are this thread's stack (the host's word for it,
    // or the mapping holding its stack pointer), readable while it runs;
    // empty (lo == hi) when unknown, where the walk reads nothing.
    let bounds = unsafe { StackBounds::from_raw(state.lo, state.hi) };
    let depth = DEPTH.load(Ordering::Relaxed);
    // Room for the trampoline's frame and its two callers beyond the
    // limit: a stack of exactly `depth` frames is seen to end there.
    let out = &mut state.frames[..depth + 4];
    let walk = if check::ENABLED.load(Ordering::Relaxed) {
        // ALLOCTRACE_CHECK_STACKS (a testing aid): the same walk, compared
        // with the reference walks.
        check::walk_and_compare(
            start,
            &bounds,
            &unwinding.unwinder,
            &mut state.cache,
            &mut state.memo,
            out,
        )
    } else {
        // The addresses it takes from the memo are written only when the
        // interning needs them (`stack_of_walk`).
        alloctrace_unwind::capture_from_lazy(
            start,
            &bounds,
            &unwinding.unwinder,
            &mut state.cache,
            &mut state.memo,
            out,
        )
    };
    let n = walk.len.min(out.len());
    // The walk proved every frame the previous one's (the memo's common
    // case: a loop allocating from one place): the same stack, and the
    // same ID, with nothing to look at (`LastStack::walk`).
    let walk_key = LastStack::walk_key(n, walk.truncated, depth);
    // `shared` > 0: the memo is valid, for this unwinder and so this
    // session (a new session, in a forked child too, has a new unwinder
    // and may have a new call-stack table: an empty walk proves nothing).
    if walk.shared >= n.max(1) && walk_key == state.last.walk {
        // Not 0: `walk` is set only with a stack.
        return u64::from(state.last.id);
    }
    // An earlier walk again (a branch of the memo: a loop allocating from
    // two or three places in turn): its stack, by the tag `intern_walk`
    // gave that walk, when it was cut the same way.
    if state.memo.took_alt() {
        let tag = state.memo.tag();
        if tag >> 32 == walk_key && tag as u32 != 0 {
            let last = &mut state.last;
            // The previous stack's nodes are this walk's only for the
            // frames the two share (`shared` of the next walk counts this
            // one's frames): the rest are forgotten. Same ending, same
            // truncation: the same tail.
            if last.tail == TAIL_NONE || last.tail == TAIL_CAPI {
                last.tail = TAIL_NONE;
            } else {
                last.len = last.len.min(walk.shared.saturating_sub(last.tail));
            }
            last.walk = walk_key;
            last.id = tag as u32;
            return u64::from(last.id);
        }
    }
    intern_walk(state, n, walk.shared, walk_key)
}

/// The stack of the shim's walk in `state.frames[..n]` (innermost first;
/// `shared` outermost frames proven the previous walk's; `walk_key` its
/// [`LastStack::walk_key`]) under the depth limit: leaves out the return
/// into the thread-start trampoline, interns it, remembers it in
/// `state.last`; its stack ID, [`LOST_STACK`] none. Out of line, so that
/// the walk's caller keeps few registers across the walk for the common
/// case, a walk the same as the previous one.
#[inline(never)]
pub(super) fn intern_walk(state: &mut CaptureState, n: usize, shared: usize, walk_key: u64) -> u64 {
    let last = &mut state.last;
    let (depth, walk_truncated) = LastStack::walk_parts(walk_key);
    let out = state.frames.get_mut(..n).unwrap_or_default();
    let id = stack_of_walk(last, out, &mut state.memo, shared, walk_truncated, depth);
    last.walk = if id != 0 { walk_key } else { WALK_NONE };
    last.id = id;
    // The memo's walk and its key give this stack: the memo keeps the tag
    // with the walk's inner frames when the next walk displaces them.
    if id != 0 && walk_key >> 32 == 0 {
        state.memo.set_tag(walk_key << 32 | u64::from(id));
    }
    match id {
        0 => LOST_STACK,
        id => u64::from(id),
    }
}

/// [`intern_walk`]'s stack, from the walk's addresses `out` (of which
/// the lazy walk may have left the outermost `memo.unfilled()` unwritten:
/// they are filled in here when the interning reads them).
#[inline(always)]
pub(super) fn stack_of_walk(
    last: &mut LastStack,
    out: &mut [u64],
    memo: &mut WalkMemo,
    shared: usize,
    walk_truncated: bool,
    depth: usize,
) -> u32 {
    let n = out.len();
    let unfilled = memo.unfilled().min(n);
    // The walk ends at the return into the thread-start trampoline (an
    // end-of-stack rule: `set_thread_start`), which it keeps as its
    // outermost address: the program's frames are the ones before it.
    let (tramp, tramp_len) = (
        THREAD_START.load(Ordering::Relaxed),
        THREAD_START_LEN.load(Ordering::Relaxed),
    );
    let outermost = match unfilled {
        0 => out.last().copied(),
        _ => memo.outermost(),
    };
    let at_start = outermost.is_some_and(|ra| ra.wrapping_sub(tramp) < tramp_len);
    // (A walk that ended there is complete.)
    let truncated = walk_truncated && !at_start;
    let tail = usize::from(at_start);
    let end = n - tail;
    // The common case: a complete stack within the limit.
    if !truncated && end <= depth && end > 0 {
        let reuse = last.reusable(shared, tail, false);
        // Interning reads the frames before the reused ones, out[..end -
        // reuse]; the unwritten ones are out[n - unfilled..].
        if end - reuse.min(end) > n - unfilled {
            memo.fill(out, n);
        }
        let kept = out.get(..end).unwrap_or_default();
        return last.intern(kept, false, reuse, tail);
    }
    memo.fill(out, n);
    stack_of_odd_walk(last, out, shared, truncated, depth, end)
}

/// [`stack_of_walk`] for a walk that was `truncated`, is cut by the depth
/// limit, or is empty (`end`: its frames before the trampoline's). Out of
/// line: the common case keeps fewer registers.
#[inline(never)]
pub(super) fn stack_of_odd_walk(
    last: &mut LastStack,
    out: &[u64],
    shared: usize,
    truncated: bool,
    depth: usize,
    end: usize,
) -> u32 {
    let n = out.len();
    if truncated && n < depth + 4 {
        // Neither cut by the limit nor ended: maybe in code no known
        // module holds.
        note_unknown(out);
    }
    let kept = out.get(..end.min(depth)).unwrap_or_default();
    let truncated = truncated || end > depth;
    if kept.is_empty() && !truncated {
        last.tail = TAIL_NONE;
        return 0;
    }
    // A stack cut by the limit keeps its innermost frames: the walked ones
    // beyond them are its tail, so that the next walk cut at the same
    // length reuses the nodes of the frames the two share.
    let tail = n - kept.len();
    let reuse = last.reusable(shared, tail, truncated);
    last.intern(kept, truncated, reuse, tail)
}

/// The C API's walk ([`capture_in_section`], [`walk_in_section`]): walks
/// the calling thread's stack into `state.frames`, then drops the `skip`
/// innermost frames and the tracer's own; `(first, len, truncated,
/// shared)`: the program's frames are `state.frames[first..len]`,
/// innermost first, and `shared` of the walk's outermost ones were proven
/// the previous walk's. `depth` is the limit the caller keeps (the walk
/// takes a few more, to see own frames dropped by address and still keep
/// `depth` of the program's). `None` when the thread's bounds are unknown.
#[inline(always)]
fn walk_program(
    state: &mut CaptureState,
    unwinding: &Unwinding,
    skip: usize,
    depth: usize,
) -> Option<(usize, usize, bool, usize)> {
    let unwinder = &unwinding.unwinder;
    if !unwinder.has_tables() {
        TABLES_WANTED.store(true, Ordering::Relaxed);
    }
    // This walk updates the memo: the shim's next walk has no previous
    // walk of its own to be the same as.
    state.last.walk = WALK_NONE;
    if state.lo >= state.hi {
        return None;
    }
    // SAFETY: the bounds are this thread's stack (the host's word for it,
    // or the mapping holding its stack pointer), readable while it runs.
    let bounds = unsafe { StackBounds::from_raw(state.lo, state.hi) };
    // The walk takes the tracer's own frames too (up to 8 of the `skip`)
    // and drops them here: its memo then matches from the first frame on,
    // so a repeated stack costs no CFI step at all. A few more addresses
    // than the limit, to see own frames dropped by address and still keep
    // `depth` of the program's.
    // As many as the memo's room allows: a walk longer than the memo
    // (the default depth, 64, plus 4, is its whole room) goes without it,
    // a full CFI walk every time.
    let walked_skip = skip.min(8).min(MEMO_DEPTH.saturating_sub(depth + 4));
    let out = &mut state.frames[..depth + 4 + walked_skip];
    let (len, walk_truncated, shared) = if out.len() <= MEMO_DEPTH {
        let w = capture_dwarf_memo(
            skip - walked_skip,
            &bounds,
            unwinder,
            &mut state.cache,
            &mut state.memo,
            out,
        );
        (w.len, w.truncated, w.shared)
    } else {
        let w = capture_dwarf(skip - walked_skip, &bounds, unwinder, &mut state.cache, out);
        (w.len, w.truncated, 0)
    };
    let len = len.min(out.len());
    let shared = shared.min(len);
    let first = walked_skip.min(len);
    let captured = &out[first..len];
    if walk_truncated && len < out.len() {
        if let Some(&last) = captured.last() {
            if !unwinding.knows(last) {
                STALE.store(true, Ordering::Relaxed);
            }
        }
    }
    let (own_start, own_end) = (
        OWN_START.load(Ordering::Relaxed),
        OWN_END.load(Ordering::Relaxed),
    );
    let own = captured
        .iter()
        .take_while(|&&ra| ra >= own_start && ra < own_end)
        .count();
    Some((first + own, len, walk_truncated, shared))
}

#[inline(always)]
pub(super) fn capture_in_section(slot: &ThreadSlot, skip: usize) -> u32 {
    let Some(state) = state_of(slot) else {
        return 0;
    };
    // SAFETY: loaded inside the capture section: not freed before it ends
    // (invariant 2).
    let Some(unwinding) = (unsafe { UNWINDER.load(Ordering::Acquire).as_ref() }) else {
        return 0;
    };
    let depth = DEPTH.load(Ordering::Relaxed).clamp(1, MAX_DEPTH);
    let Some((start, len, walk_truncated, shared)) = walk_program(state, unwinding, skip, depth)
    else {
        return 0;
    };
    let program = &state.frames[start..len];
    let fits = program.len() <= depth;
    let kept = &program[..program.len().min(depth)];
    let truncated = walk_truncated || !fits;
    let last = &mut state.last;
    if kept.is_empty() && !truncated {
        last.tail = TAIL_NONE;
        return 0;
    }
    let tail = if fits { TAIL_CAPI } else { TAIL_NONE };
    let reuse = last.reusable(shared, tail, truncated);
    last.intern(kept, truncated, reuse, tail)
}

/// [`walk_stack`](super::walk_stack) inside the capture section: the
/// program's return addresses, innermost first, copied into `out` (at most
/// the depth limit of them); how many.
#[inline(always)]
pub(super) fn walk_in_section(slot: &ThreadSlot, skip: usize, out: &mut [u64]) -> usize {
    let Some(state) = state_of(slot) else {
        return 0;
    };
    // SAFETY: loaded inside the capture section: not freed before it ends
    // (invariant 2).
    let Some(unwinding) = (unsafe { UNWINDER.load(Ordering::Acquire).as_ref() }) else {
        return 0;
    };
    let depth = DEPTH.load(Ordering::Relaxed).clamp(1, MAX_DEPTH);
    let result = walk_program(state, unwinding, skip, depth);
    // The memo now holds this walk, which nothing interned: the next
    // capture's stack shares no nodes with the previous one's.
    state.last.tail = TAIL_NONE;
    let Some((start, len, _, _)) = result else {
        return 0;
    };
    let program = &state.frames[start..len];
    let n = program.len().min(depth).min(out.len());
    out[..n].copy_from_slice(&program[..n]);
    n
}
