//! The one unwinding step every walk takes: a compact-table row where one
//! applies, framehop (with its frame-pointer fallback) where none does, and
//! the kernel's signal frame.
//!
//! Invariants 3, 5 and 7 hold here for every walk: every read is 8-byte
//! aligned and inside the fence; a step that returns a frame strictly
//! raised the stack pointer; no panic, allocation, system call or lock (the
//! framehop fallback claims one of the unwinder's caches with a single
//! compare-exchange, never waiting).

#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use core::sync::atomic::{AtomicU64, Ordering};
use framehop::{FrameAddress, UnwindRegsNative, Unwinder};

use crate::bounds::Fence;
use crate::dwarf::{DwarfCache, DwarfUnwinder, UC_GREGS};
use crate::table::{bp_by_8, sp_by_8, RuleCache, R_BP_SAVED, R_END, R_FP, R_KIND, R_RSP, R_SIGNAL};

/// The unwinding state of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Regs {
    /// The frame's address: a return address, or (`ip`) the exact pc of a
    /// frame that was interrupted (or the capture's own first frame).
    pub(crate) pc: u64,
    pub(crate) sp: u64,
    pub(crate) bp: u64,
    /// `pc` is an instruction pointer, not a return address.
    pub(crate) ip: bool,
}

/// One step's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// `regs` now describe the caller (its `pc` is the new address).
    Ret,
    /// The end of the stack.
    End,
    /// No rule applied, a read failed, or the stack pointer did not go up.
    Fail,
}

// What a step read, for the memo (`Rec::kind`).
/// A compact rsp-based step that read only the return address
/// (`new sp - 8`): rbp passed through, unused.
pub(crate) const S_PASS: u8 = 0;
/// A compact rsp-based step that also read rbp at `Rec::slot` (at or
/// above sp): the incoming rbp is unused.
pub(crate) const S_SLOT: u8 = 1;
/// A compact frame-record step: read rbp at `Rec::slot` (= the incoming
/// rbp, at or above sp) and the return address after it: it uses rbp.
pub(crate) const S_FP: u8 = 2;
/// framehop or the signal frame: not re-checked by the memo.
pub(crate) const S_OPAQUE: u8 = 3;
/// `End` by an end-of-stack rule (nothing read).
pub(crate) const S_END_RULE: u8 = 4;
/// `End` by a frame-record rule with rbp 0 (nothing read; uses rbp).
pub(crate) const S_END_BP0: u8 = 5;

/// What one step read (for the memo): its kind and the address rbp was read
/// from; for an `End` by a zero return address, `ra_at` is where it was.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Rec {
    pub(crate) kind: u8,
    pub(crate) slot: u64,
    pub(crate) ra_at: u64,
}

/// Which steps a walk may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Compact rows, framehop where they do not apply.
    Compact,
    /// framehop for every frame (the reference walk).
    Framehop,
}

/// One step from `r`, by `mode`. On `Ret`, `r` is the caller's state.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[inline(always)]
pub(crate) fn step(
    mode: Mode,
    unwinder: &DwarfUnwinder,
    cache: &mut DwarfCache,
    r: &mut Regs,
    fence: &Fence,
    rec: &mut Rec,
) -> Step {
    *rec = Rec {
        kind: S_OPAQUE,
        slot: 0,
        ra_at: 0,
    };
    if mode == Mode::Framehop {
        if !r.ip && unwinder.is_sigreturn(r.pc) {
            return signal_step(r, fence);
        }
        return framehop_step(unwinder, r, fence);
    }
    let rule = rule_for(unwinder, &mut cache.rules, r);
    if r.sp & 7 == 0 && r.sp >= fence.lo && r.sp <= fence.hi {
        // SAFETY: just checked.
        if let Some((next, kind, slot)) = unsafe { compact_step(rule, r, fence.hi) } {
            rec.kind = kind;
            rec.slot = slot;
            *r = next;
            return Step::Ret;
        }
    }
    // Everything else: the other rules, a read outside the fence, the
    // ends of the stack (recorded for the memo) and rbp below sp.
    let kind = rule & R_KIND;
    if kind == R_RSP {
        let sp = r.sp;
        let Some(new_sp) = sp.checked_add(8 * sp_by_8(rule)) else {
            return Step::Fail;
        };
        let mut bp = r.bp;
        rec.kind = S_PASS;
        if rule & R_BP_SAVED != 0 {
            let Some(at) = sp.checked_add(8 * bp_by_8(rule)) else {
                return Step::Fail;
            };
            let Some(v) = fence.read(at) else {
                return Step::Fail;
            };
            bp = v;
            rec.kind = S_SLOT;
            rec.slot = at;
        }
        let Some(ra) = fence.read(new_sp.wrapping_sub(8)) else {
            return Step::Fail;
        };
        if ra == 0 {
            rec.ra_at = new_sp.wrapping_sub(8);
            return Step::End;
        }
        // sp_by_8 >= 1: new_sp > sp.
        *r = Regs {
            pc: ra,
            sp: new_sp,
            bp,
            ip: false,
        };
        return Step::Ret;
    }
    if kind == R_FP {
        let (sp, bp) = (r.sp, r.bp);
        if bp == 0 {
            rec.kind = S_END_BP0;
            return Step::End;
        }
        let Some(new_sp) = bp.checked_add(16) else {
            return Step::Fail;
        };
        if new_sp <= sp {
            return Step::Fail;
        }
        if bp >= sp {
            let (Some(next), Some(ra)) = (fence.read(bp), fence.read(bp.wrapping_add(8))) else {
                return Step::Fail;
            };
            rec.kind = S_FP;
            rec.slot = bp;
            if ra == 0 {
                rec.ra_at = bp.wrapping_add(8);
                return Step::End;
            }
            *r = Regs {
                pc: ra,
                sp: new_sp,
                bp: next,
                ip: false,
            };
            return Step::Ret;
        }
        // A record just below sp: framehop's step (it may read there).
        return framehop_step(unwinder, r, fence);
    }
    if kind == R_END {
        rec.kind = S_END_RULE;
        return Step::End;
    }
    if kind == R_SIGNAL {
        return signal_step(r, fence);
    }
    framehop_step(unwinder, r, fence)
}

/// The compact step by `rule` (`R_RSP` or `R_FP`) from `r`, when it
/// returns a caller: its state, the step's kind (`S_PASS`, `S_SLOT`,
/// `S_FP`) and where it read rbp. `None` for any other rule, a read that
/// would reach `hi`, a zero return address, or a frame record at 0 or below
/// the stack pointer: [`step`] then decides (the ends of the stack,
/// framehop). Every walk's common step: `step` and the memo's lean loop
/// (`walk_to_match`) both take it.
///
/// # Safety
/// `r.sp` is 8-byte aligned and inside the walk's fence: `lo <= r.sp <=
/// hi` (then every read here is aligned, at or above `r.sp` and below
/// `hi`, and the state returned keeps this true).
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[inline(always)]
pub(crate) unsafe fn compact_step(rule: u32, r: &Regs, hi: u64) -> Option<(Regs, u8, u64)> {
    let sp = r.sp;
    match rule & R_KIND {
        R_RSP => {
            // At most 8 * 65535 above sp <= hi: no overflow.
            let new_sp = sp + 8 * sp_by_8(rule);
            if new_sp > hi {
                return None;
            }
            // SAFETY: sp <= new_sp - 8 and new_sp <= hi (the contract).
            let ra = unsafe { read_stack(new_sp - 8) };
            let (bp, kind, slot) = if rule & R_BP_SAVED != 0 {
                let at = sp + 8 * bp_by_8(rule);
                if at > hi || hi - at < 8 {
                    return None;
                }
                // SAFETY: sp <= at and at + 8 <= hi (the contract).
                (unsafe { read_stack(at) }, S_SLOT, at)
            } else {
                (r.bp, S_PASS, 0)
            };
            if ra == 0 {
                return None;
            }
            Some((
                Regs {
                    pc: ra,
                    sp: new_sp,
                    bp,
                    ip: false,
                },
                kind,
                slot,
            ))
        }
        R_FP => {
            let bp = r.bp;
            if bp < sp || bp & 7 != 0 || bp >= hi || hi - bp < 16 {
                return None;
            }
            // SAFETY: sp <= bp, bp + 16 <= hi, aligned (the contract).
            let (next_bp, ra) = unsafe { (read_stack(bp), read_stack(bp + 8)) };
            if ra == 0 {
                return None;
            }
            Some((
                Regs {
                    pc: ra,
                    sp: bp + 16,
                    bp: next_bp,
                    ip: false,
                },
                S_FP,
                bp,
            ))
        }
        _ => None,
    }
}

/// The word at `addr` of the walking thread's stack.
///
/// # Safety
/// `addr` is 8-byte aligned, at or above the current stack pointer and
/// below the stack's top (mapped and readable: StackBounds' guarantee).
#[inline(always)]
unsafe fn read_stack(addr: u64) -> u64 {
    // SAFETY: the caller's contract. Stack words change under us only by
    // our own callers' frames, which are suspended; a volatile read keeps
    // the compiler honest.
    unsafe { core::ptr::read_volatile(addr as *const u64) }
}

/// Return addresses `[lo, lo + len)` that end every compact walk, as an
/// end-of-stack rule does: the frame is kept, its callers are not
/// ([`set_walk_end`]).
static WALK_END_LO: AtomicU64 = AtomicU64::new(0);
static WALK_END_LEN: AtomicU64 = AtomicU64::new(0);

/// Makes a return address into `[start, end)` end every walk that steps
/// by the compact tables (`capture_from`, `capture_here`,
/// `capture_from_compact`), as an end-of-stack rule would: that frame is
/// the stack's outermost. A host that starts threads through a routine of
/// its own (the LD_PRELOAD shim's thread trampoline) sets it once, before
/// its first capture, so that no walk goes on into the trampoline and the
/// C library's thread start. A rule cache filled before the call may keep
/// the old answer for an address.
pub fn set_walk_end(start: u64, end: u64) {
    WALK_END_LO.store(start, Ordering::Relaxed);
    WALK_END_LEN.store(end.saturating_sub(start), Ordering::Relaxed);
}

/// The rule for the frame `r`, through the thread's cache.
#[inline(always)]
fn rule_for(unwinder: &DwarfUnwinder, cache: &mut RuleCache, r: &Regs) -> u32 {
    if cache.id != unwinder.id {
        *cache = RuleCache {
            id: unwinder.id,
            hits: cache.hits,
            misses: cache.misses,
            ..RuleCache::new()
        };
    }
    let key = rule_key(r.pc, r.ip);
    let i = RuleCache::slot(key);
    if let (Some(&k), Some(&rule)) = (cache.keys.get(i), cache.rules.get(i)) {
        if k == key && k != 0 {
            cache.hits = cache.hits.wrapping_add(1);
            return rule;
        }
    }
    rule_miss(unwinder, cache, key)
}

/// The rule cache's key for a frame: its return address minus 1 (inside
/// the call), or an interrupted pc with bit 63 set.
#[inline(always)]
pub(crate) fn rule_key(pc: u64, ip: bool) -> u64 {
    if ip {
        pc | 1 << 63
    } else {
        pc.wrapping_sub(1)
    }
}

/// The rule for `key` (see [`rule_key`]) when the cache (of this
/// unwinder) does not hold it: the walk's end, the signal trampoline or
/// the compact tables' row; it then holds it.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[inline(never)]
pub(crate) fn rule_miss(unwinder: &DwarfUnwinder, cache: &mut RuleCache, key: u64) -> u32 {
    cache.misses = cache.misses.wrapping_add(1);
    let ip = key & 1 << 63 != 0;
    let pc = if ip {
        key & !(1 << 63)
    } else {
        key.wrapping_add(1)
    };
    let (end_lo, end_len) = (
        WALK_END_LO.load(Ordering::Relaxed),
        WALK_END_LEN.load(Ordering::Relaxed),
    );
    let rule = if !ip && pc.wrapping_sub(end_lo) < end_len {
        R_END
    } else if let Some(rule) = unwinder.shared_rules.get(key) {
        rule
    } else {
        let rule = if !ip && unwinder.is_sigreturn(pc) {
            R_SIGNAL
        } else {
            unwinder.tables.lookup(key & !(1 << 63))
        };
        unwinder.shared_rules.put(key, rule);
        rule
    };
    let i = RuleCache::slot(key);
    if let (Some(k), Some(v)) = (cache.keys.get_mut(i), cache.rules.get_mut(i)) {
        *k = key;
        *v = rule;
    }
    rule
}

/// A framehop step (its cached DWARF rule, its generic evaluation, its
/// frame-pointer fallback), with one of the unwinder's framehop caches,
/// claimed without waiting: when all are in use, the step fails.
// Must not allocate, lock, make a system call or panic: runs inside malloc.
#[inline(never)]
pub(crate) fn framehop_step(unwinder: &DwarfUnwinder, r: &mut Regs, fence: &Fence) -> Step {
    let Some(frame) = (if r.ip {
        Some(FrameAddress::from_instruction_pointer(r.pc))
    } else {
        FrameAddress::from_return_address(r.pc)
    }) else {
        return Step::End;
    };
    let Some(mut slot) = unwinder.fallback.claim(r.sp) else {
        return Step::Fail;
    };
    let mut regs = UnwindRegsNative::new(r.pc, r.sp, r.bp);
    let mut read_stack = |addr: u64| fence.read(addr).ok_or(());
    let prev_sp = r.sp;
    let res = unwinder
        .inner
        .unwind_frame(frame, &mut regs, slot.cache(), &mut read_stack);
    drop(slot);
    match res {
        Ok(Some(ret)) => {
            if ret == 0 {
                return Step::End;
            }
            if regs.sp() <= prev_sp {
                return Step::Fail;
            }
            *r = Regs {
                pc: ret,
                sp: regs.sp(),
                bp: regs.bp(),
                ip: false,
            };
            Step::Ret
        }
        Ok(None) => Step::End,
        Err(_) => Step::Fail,
    }
}

/// Unwinds a signal frame: `r.pc` is the signal trampoline a handler
/// returned to, `r.sp` points at the `ucontext_t` the kernel saved. The
/// interrupted code's rip, rsp and rbp come from its `uc_mcontext.gregs`;
/// rip is an instruction pointer (unwound as a walk's first frame is).
// Must not allocate, lock or panic: runs inside malloc (reads via the fence).
#[inline(never)]
pub(crate) fn signal_step(r: &mut Regs, fence: &Fence) -> Step {
    let uc = r.sp;
    let reg = |i: i32| fence.read(uc.wrapping_add(UC_GREGS + 8 * i as u64));
    let (Some(bp), Some(sp), Some(ip)) =
        (reg(libc::REG_RBP), reg(libc::REG_RSP), reg(libc::REG_RIP))
    else {
        return Step::Fail;
    };
    if sp <= uc || ip == 0 {
        return Step::Fail;
    }
    *r = Regs {
        pc: ip,
        sp,
        bp,
        ip: true,
    };
    Step::Ret
}
