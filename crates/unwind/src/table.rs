//! Compact unwind tables: each module's `.eh_frame` turned, off the event
//! path, into sorted rows `{pc offset, rule}` that a capture looks up by
//! binary search (behind a per-thread direct-mapped cache, [`RuleCache`]).
//!
//! A rule is one of the few shapes compilers emit at call sites on x86_64
//! (CFA = rsp + 8k with rbp unchanged or saved at a non-negative offset
//! from rsp; CFA = rbp + 16 with rbp saved at CFA - 16; end of stack).
//! Everything else (a DWARF expression: PLT entries, the signal
//! trampoline; odd offsets; a pc no FDE covers) is marked so that the step
//! falls back to framehop, which then gives exactly what it always gave.

use std::sync::Arc;

use gimli::{CfaRule, RegisterRule, UnwindSection, X86_64};

use crate::modules::{ModuleInfo, Modules};

// Rule kinds (the low 3 bits of a rule).
/// No FDE covers the pc (or no table): framehop decides (frame pointer).
pub(crate) const R_NONE: u32 = 0;
/// A rule the compact step does not model: framehop evaluates it.
pub(crate) const R_UNSUP: u32 = 1;
/// The return address is undefined: the outermost frame.
pub(crate) const R_END: u32 = 2;
/// CFA = rsp + 8 * `sp_by_8`; rbp unchanged, or read at rsp + 8 * `bp_by_8`.
pub(crate) const R_RSP: u32 = 3;
/// CFA = rbp + 16, rbp saved at CFA - 16 (a frame record).
pub(crate) const R_FP: u32 = 4;
/// The signal trampoline (only in [`RuleCache`], never in a table).
pub(crate) const R_SIGNAL: u32 = 5;
pub(crate) const R_KIND: u32 = 7;
/// `R_RSP`: rbp is restored from the stack.
pub(crate) const R_BP_SAVED: u32 = 1 << 19;

/// `R_RSP`'s CFA offset from rsp, in 8-byte words (1..=65535).
#[inline(always)]
pub(crate) fn sp_by_8(rule: u32) -> u64 {
    u64::from(rule >> 3 & 0xffff)
}

/// `R_RSP` with `R_BP_SAVED`: where rbp was saved, in 8-byte words above rsp.
#[inline(always)]
pub(crate) fn bp_by_8(rule: u32) -> u64 {
    u64::from(rule >> 20)
}

/// One row: the rule from `off` (bytes from the module's start) up to the
/// next row's `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) off: u32,
    pub(crate) rule: u32,
}

/// One module's rows, sorted by `off`, and what they were built from (to
/// reuse them in a later unwinder when the module did not change).
#[derive(Debug)]
pub(crate) struct ModuleTable {
    pub(crate) start: u64,
    pub(crate) end: u64,
    key: (u64, u64, u64, u64),
    pub(crate) rows: Vec<Row>,
    /// `index[k]`: the number of rows whose `off` is at most `k <<
    /// INDEX_SHIFT` (so the row for an offset in bucket `k` lies in
    /// `rows[index[k] - 1..index[k + 1]]`): a lookup searches a few rows,
    /// not the whole table.
    index: Vec<u32>,
}

/// Bytes of code per index bucket (a few rows each): 4 bytes of index
/// per 256 bytes of code.
const INDEX_SHIFT: u32 = 8;

impl ModuleTable {
    fn key_of(m: &ModuleInfo) -> (u64, u64, u64, u64) {
        (m.start, m.end, m.eh_frame_hdr, m.eh_frame)
    }

    /// Builds the rows of `m` from its in-memory `.eh_frame_hdr` table and
    /// `.eh_frame` (set-up only: allocates).
    ///
    /// # Safety
    /// `m` describes an object loaded in this process (its unwind sections
    /// are mapped and readable).
    pub(crate) unsafe fn build(m: &ModuleInfo) -> ModuleTable {
        let mut t = ModuleTable {
            start: m.start,
            end: m.end,
            key: Self::key_of(m),
            rows: Vec::new(),
            index: Vec::new(),
        };
        if m.eh_frame_hdr == 0
            || m.eh_frame == 0
            || m.end.saturating_sub(m.start) > u64::from(u32::MAX)
        {
            return t;
        }
        // SAFETY: the caller's contract: both ranges are mapped (the
        // header's PT_GNU_EH_FRAME segment; .eh_frame to the end of its
        // PT_LOAD segment).
        let (hdr, eh) = unsafe {
            (
                core::slice::from_raw_parts(
                    m.eh_frame_hdr as *const u8,
                    m.eh_frame_hdr_len as usize,
                ),
                core::slice::from_raw_parts(m.eh_frame as *const u8, m.eh_frame_len as usize),
            )
        };
        let bases = gimli::BaseAddresses::default()
            .set_eh_frame_hdr(m.eh_frame_hdr)
            .set_eh_frame(m.eh_frame);
        let Ok(parsed) = gimli::EhFrameHdr::new(hdr, gimli::LittleEndian).parse(&bases, 8) else {
            return t;
        };
        let Some(table) = parsed.table() else {
            return t;
        };
        let mut eh_frame = gimli::EhFrame::new(eh, gimli::LittleEndian);
        eh_frame.set_address_size(8);
        let mut ctx = gimli::UnwindContext::new();
        // (start, end, rows) per FDE, in the header's order (sorted by
        // initial location).
        let mut iter = table.iter(&bases);
        let mut fdes: Vec<(u64, u64, Vec<Row>)> = Vec::new();
        while let Ok(Some((_, ptr))) = iter.next() {
            let Ok(offset) = table.pointer_to_offset(ptr) else {
                continue;
            };
            let Ok(fde) = eh_frame.fde_from_offset(&bases, offset, gimli::EhFrame::cie_from_offset)
            else {
                continue;
            };
            let (lo, hi) = (fde.initial_address(), fde.end_address());
            if lo < m.start || hi > m.end || lo >= hi {
                continue;
            }
            let mut rows = Vec::new();
            let ok = (|| -> gimli::Result<()> {
                let mut table = fde.rows(&eh_frame, &bases, &mut ctx)?;
                while let Some(row) = table.next_row()? {
                    if row.start_address() >= row.end_address() {
                        continue;
                    }
                    let off = (row.start_address().max(lo) - m.start) as u32;
                    let rule = translate(
                        row.cfa(),
                        row.register(X86_64::RBP),
                        row.register(X86_64::RA),
                    );
                    rows.push(Row { off, rule });
                }
                Ok(())
            })();
            if ok.is_err() {
                // framehop sees the same error: its fallback decides.
                rows.clear();
                rows.push(Row {
                    off: (lo - m.start) as u32,
                    rule: R_NONE,
                });
            }
            fdes.push((lo, hi, rows));
        }
        fdes.sort_by_key(|f| f.0);
        // Merge: a later FDE cuts an earlier one short (framehop picks the
        // FDE with the greatest start at or below the pc); gaps are R_NONE.
        for (k, (lo, hi, rows)) in fdes.iter().enumerate() {
            let next_lo = fdes.get(k + 1).map_or(u64::MAX, |f| f.0);
            let end = (*hi).min(next_lo);
            let end_off = (end - m.start) as u32;
            let lo_off = (lo - m.start) as u32;
            // Drop rows a previous FDE left at or after this one's start.
            while t.rows.last().is_some_and(|r| r.off >= lo_off) {
                t.rows.pop();
            }
            for r in rows {
                if r.off < end_off {
                    if t.rows
                        .last()
                        .is_some_and(|l| l.rule == r.rule && l.off < r.off)
                    {
                        continue;
                    }
                    t.rows.push(*r);
                }
            }
            if end < next_lo && end < m.end {
                t.rows.push(Row {
                    off: end_off,
                    rule: R_NONE,
                });
            }
        }
        t.rows.dedup_by(|b, a| {
            a.off == b.off && {
                a.rule = b.rule;
                true
            }
        });
        t.rows.shrink_to_fit();
        t.index_rows();
        t
    }

    /// Fills `index` from `rows`.
    fn index_rows(&mut self) {
        let Some(last) = self.rows.last() else {
            return;
        };
        let buckets = (last.off >> INDEX_SHIFT) as usize + 2;
        let mut index = Vec::with_capacity(buckets);
        let mut i = 0usize;
        for k in 0..buckets {
            let at = (k as u64) << INDEX_SHIFT;
            while self.rows.get(i).is_some_and(|r| u64::from(r.off) <= at) {
                i += 1;
            }
            index.push(i as u32);
        }
        self.index = index;
    }

    /// The rule for `addr` (inside `[start, end)`).
    // Runs inside malloc: no allocation, no panic.
    #[inline(always)]
    pub(crate) fn lookup(&self, addr: u64) -> u32 {
        let off = addr.wrapping_sub(self.start) as u32;
        // The rows from the one at or below the bucket's start up to the
        // first beyond its end; past the last bucket, up to the last row.
        let k = (off >> INDEX_SHIFT) as usize;
        let lo = self.index.get(k).map_or(self.rows.len(), |&i| i as usize);
        let hi = self
            .index
            .get(k + 1)
            .map_or(self.rows.len(), |&i| i as usize);
        let base = lo.saturating_sub(1);
        let span = self.rows.get(base..hi.max(base)).unwrap_or_default();
        let i = base + span.partition_point(|r| r.off <= off);
        match i.checked_sub(1).and_then(|i| self.rows.get(i)) {
            Some(r) => r.rule,
            None => R_NONE,
        }
    }
}

/// The rule framehop's x86_64 translation would cache for this row, when
/// the compact step reproduces it exactly and reads only at or above the
/// frame's stack pointer; `R_UNSUP` otherwise.
fn translate(
    cfa: &CfaRule<usize>,
    bp: Option<RegisterRule<usize>>,
    ra: Option<RegisterRule<usize>>,
) -> u32 {
    match ra {
        None | Some(RegisterRule::Undefined) => return R_END,
        Some(RegisterRule::Offset(-8)) => {}
        _ => return R_UNSUP,
    }
    let bp_off = match bp {
        None | Some(RegisterRule::Undefined) | Some(RegisterRule::SameValue) => None,
        Some(RegisterRule::Offset(o)) => Some(o),
        _ => return R_UNSUP,
    };
    match *cfa {
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RSP => {
            if offset < 8 || offset % 8 != 0 || offset / 8 > 0xffff {
                return R_UNSUP;
            }
            let mut rule = R_RSP | ((offset / 8) as u32) << 3;
            if let Some(o) = bp_off {
                let at = offset + o;
                if at < 0 || at % 8 != 0 || at / 8 >= 1 << 12 {
                    return R_UNSUP;
                }
                rule |= R_BP_SAVED | ((at / 8) as u32) << 20;
            }
            rule
        }
        CfaRule::RegisterAndOffset { register, offset } if register == X86_64::RBP => {
            if offset == 16 && bp_off == Some(-16) {
                R_FP
            } else {
                R_UNSUP
            }
        }
        _ => R_UNSUP,
    }
}

/// The compact tables of a module snapshot, sorted by start address.
#[derive(Debug, Default)]
pub(crate) struct Tables {
    pub(crate) modules: Vec<Arc<ModuleTable>>,
}

impl Tables {
    /// Builds (or takes from `prev`, when the module is the same) the table
    /// of every module of `modules`.
    ///
    /// # Safety
    /// As [`ModuleTable::build`], for every module.
    pub(crate) unsafe fn build(modules: &Modules, prev: Option<&Tables>) -> Tables {
        let mut out: Vec<Arc<ModuleTable>> = modules
            .modules()
            .iter()
            .map(|m| {
                let key = ModuleTable::key_of(m);
                prev.and_then(|p| p.modules.iter().find(|t| t.key == key))
                    .cloned()
                    // SAFETY: the caller's contract.
                    .unwrap_or_else(|| Arc::new(unsafe { ModuleTable::build(m) }))
            })
            .collect();
        out.sort_by_key(|t| t.start);
        Tables { modules: out }
    }

    /// The rule for `addr`: `R_NONE` outside every module.
    // Runs inside malloc: no allocation, no panic.
    #[inline(always)]
    pub(crate) fn lookup(&self, addr: u64) -> u32 {
        let i = self.modules.partition_point(|t| t.start <= addr);
        match i.checked_sub(1).and_then(|i| self.modules.get(i)) {
            Some(t) if addr < t.end => t.lookup(addr),
            _ => R_NONE,
        }
    }

    /// Rows over all modules, and their bytes.
    pub(crate) fn rows(&self) -> usize {
        self.modules.iter().map(|t| t.rows.len()).sum()
    }
}

/// Entries of a thread's rule cache.
pub(crate) const CACHE_SLOTS: usize = 256;

/// A thread's direct-mapped cache of rules, keyed by lookup address (the
/// return address minus 1, or an interrupted pc with bit 63 set), valid
/// for one unwinder (`id`).
#[derive(Clone)]
pub(crate) struct RuleCache {
    pub(crate) id: u64,
    pub(crate) keys: [u64; CACHE_SLOTS],
    pub(crate) rules: [u32; CACHE_SLOTS],
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl RuleCache {
    pub(crate) const fn new() -> RuleCache {
        RuleCache {
            id: 0,
            keys: [0; CACHE_SLOTS],
            rules: [0; CACHE_SLOTS],
            hits: 0,
            misses: 0,
        }
    }

    /// The slot of `key`.
    #[inline(always)]
    pub(crate) fn slot(key: u64) -> usize {
        ((key ^ key >> 8 ^ key >> 16) as usize) % CACHE_SLOTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The indexed lookup gives the rule of the last row at or below the
    /// offset, exactly as a search of the whole table does.
    #[test]
    fn indexed_lookup_equals_a_full_search() {
        // Rows at irregular offsets: several per bucket, empty buckets,
        // rows exactly on bucket boundaries.
        let offs = [
            0x10u32, 0x20, 0x100, 0x101, 0x1ff, 0x200, 0x2f0, 0x900, 0x901, 0x1000, 0x1100,
        ];
        let rows: Vec<Row> = offs
            .iter()
            .enumerate()
            .map(|(i, &off)| Row {
                off,
                rule: i as u32 + 1,
            })
            .collect();
        let mut t = ModuleTable {
            start: 0x40_0000,
            end: 0x40_2000,
            key: (0, 0, 0, 0),
            rows: rows.clone(),
            index: Vec::new(),
        };
        t.index_rows();
        for off in 0..0x1400u32 {
            let want = rows
                .iter()
                .rev()
                .find(|r| r.off <= off)
                .map_or(R_NONE, |r| r.rule);
            assert_eq!(
                t.lookup(0x40_0000 + u64::from(off)),
                want,
                "offset {off:#x}"
            );
        }
        // No rows: every lookup is R_NONE.
        let mut empty = ModuleTable {
            rows: Vec::new(),
            index: Vec::new(),
            ..t
        };
        empty.index_rows();
        assert_eq!(empty.lookup(0x40_0100), R_NONE);
    }
}
