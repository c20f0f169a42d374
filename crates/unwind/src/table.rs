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

use std::num::Wrapping;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use gimli::{CfaRule, EhFrameOffset, LittleEndian, RegisterRule, UnwindSection, X86_64};

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

/// `m`'s `.eh_frame_hdr` and `.eh_frame` bytes and their base addresses;
/// `None` for a module without them, or larger than 4 GiB (rows hold
/// 32-bit offsets).
///
/// # Safety
/// `m` describes an object loaded in this process (its unwind sections
/// are mapped and readable while the slices are used).
unsafe fn sections<'a>(m: &ModuleInfo) -> Option<(&'a [u8], &'a [u8], gimli::BaseAddresses)> {
    if m.eh_frame_hdr == 0 || m.eh_frame == 0 || m.end.saturating_sub(m.start) > u64::from(u32::MAX)
    {
        return None;
    }
    // SAFETY: the caller's contract: both ranges are mapped (the header's
    // PT_GNU_EH_FRAME segment; .eh_frame to the end of its PT_LOAD
    // segment).
    let (hdr, eh) = unsafe {
        (
            core::slice::from_raw_parts(m.eh_frame_hdr as *const u8, m.eh_frame_hdr_len as usize),
            core::slice::from_raw_parts(m.eh_frame as *const u8, m.eh_frame_len as usize),
        )
    };
    let bases = gimli::BaseAddresses::default()
        .set_eh_frame_hdr(m.eh_frame_hdr)
        .set_eh_frame(m.eh_frame);
    Some((hdr, eh, bases))
}

impl ModuleTable {
    fn key_of(m: &ModuleInfo) -> (u64, u64, u64, u64) {
        (m.start, m.end, m.eh_frame_hdr, m.eh_frame)
    }

    /// Builds the rows of `m` from its in-memory `.eh_frame_hdr` table and
    /// `.eh_frame` (set-up only: allocates).
    ///
    /// One pass over the header's table, which lists the FDEs sorted by
    /// initial location: each FDE's rows go straight into the output, and
    /// a later FDE cuts the rows an earlier one left at or after its start
    /// (see [`Builder::add`]); the CIEs are parsed once each. Should the
    /// table not be sorted, the FDEs are sorted (stably) and the pass runs
    /// again.
    ///
    /// # Safety
    /// `m` describes an object loaded in this process (its unwind sections
    /// are mapped and readable).
    pub(crate) unsafe fn build(m: &ModuleInfo) -> ModuleTable {
        // SAFETY: the caller's contract.
        unsafe { Self::build_from(m, |offsets| offsets) }
    }

    /// [`ModuleTable::build`] over the header's FDEs in the order `order`
    /// gives them (the header's own order, except in tests of the sort).
    ///
    /// # Safety
    /// As [`ModuleTable::build`].
    unsafe fn build_from(
        m: &ModuleInfo,
        order: impl Fn(Vec<EhFrameOffset>) -> Vec<EhFrameOffset>,
    ) -> ModuleTable {
        let mut t = ModuleTable {
            start: m.start,
            end: m.end,
            key: Self::key_of(m),
            rows: Vec::new(),
            index: Vec::new(),
        };
        // SAFETY: the caller's contract.
        let Some((hdr, eh, bases)) = (unsafe { sections(m) }) else {
            return t;
        };
        let Ok(parsed) = gimli::EhFrameHdr::new(hdr, LittleEndian).parse(&bases, 8) else {
            return t;
        };
        let Some(table) = parsed.table() else {
            return t;
        };
        // The FDEs' offsets, in the header's order, up to its first bad
        // entry.
        let mut iter = table.iter(&bases);
        let mut offsets = Vec::with_capacity(iter.size_hint().0);
        while let Ok(Some((_, ptr))) = iter.next() {
            if let Ok(offset) = table.pointer_to_offset(ptr) {
                offsets.push(offset);
            }
        }
        let offsets = order(offsets);
        let mut eh_frame = gimli::EhFrame::new(eh, LittleEndian);
        eh_frame.set_address_size(8);
        let mut b = Builder {
            eh_frame,
            bases,
            start: m.start,
            end: m.end,
            ctx: None,
            cies: Vec::new(),
            last_cie: 0,
            // 4 to 7 rows per FDE (gaps included) in Debian's libc, ld.so
            // and libgcc_s.
            rows: Vec::with_capacity(offsets.len() * 8),
        };
        let mut last_lo = 0;
        let mut sorted = true;
        for &offset in &offsets {
            let Some(fde) = b.fde(offset) else {
                continue;
            };
            let lo = fde.initial_address();
            if lo < last_lo {
                sorted = false;
                break;
            }
            last_lo = lo;
            b.add(&fde);
        }
        if !sorted {
            // Not sorted: the FDEs in order of start (stable, so FDEs with
            // the same start keep the header's order), and the pass again.
            let mut fdes: Vec<(u64, EhFrameOffset)> = offsets
                .iter()
                .filter_map(|&o| Some((b.fde(o)?.initial_address(), o)))
                .collect();
            fdes.sort_by_key(|f| f.0);
            b.rows.clear();
            for (_, offset) in fdes {
                if let Some(fde) = b.fde(offset) {
                    b.add(&fde);
                }
            }
        }
        t.rows = b.rows;
        t.rows.shrink_to_fit();
        t.index_rows();
        t
    }

    /// The old two-pass build ([`ModuleTable::build`] before it streamed
    /// its rows): the reference its rows and index are checked against.
    ///
    /// # Safety
    /// As [`ModuleTable::build`].
    #[cfg(test)]
    unsafe fn build_reference(m: &ModuleInfo) -> ModuleTable {
        let mut t = ModuleTable {
            start: m.start,
            end: m.end,
            key: Self::key_of(m),
            rows: Vec::new(),
            index: Vec::new(),
        };
        // SAFETY: the caller's contract.
        let Some((hdr, eh, bases)) = (unsafe { sections(m) }) else {
            return t;
        };
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

type Reader<'a> = gimli::EndianSlice<'a, LittleEndian>;
type Rule = RegisterRule<usize>;
type Cie<'a> = gimli::CommonInformationEntry<Reader<'a>>;
type Fde<'a> = gimli::FrameDescriptionEntry<Reader<'a>>;

/// The state of one [`ModuleTable::build`]: the sections, the CIEs parsed
/// so far, and the rows so far.
struct Builder<'a> {
    /// `.eh_frame`, as gimli reads it.
    eh_frame: gimli::EhFrame<Reader<'a>>,
    bases: gimli::BaseAddresses,
    start: u64,
    end: u64,
    /// gimli's evaluator, for the FDEs [`eval_fde`] leaves to it.
    ctx: Option<gimli::UnwindContext<usize>>,
    /// The CIEs parsed so far, by offset, with their initial state (a
    /// module has a few: one per compiler and personality, in practice).
    cies: Vec<(EhFrameOffset, Cie<'a>, Option<Init>)>,
    /// The index in `cies` of the last FDE's CIE.
    last_cie: usize,
    /// Sorted by `off`; no two rows at the same `off`.
    rows: Vec<Row>,
}

impl<'a> Builder<'a> {
    /// The FDE at `offset`, when it parses and covers a non-empty range
    /// inside the module.
    fn fde(&mut self, offset: EhFrameOffset) -> Option<Fde<'a>> {
        let (cies, last) = (&mut self.cies, &mut self.last_cie);
        let fde = self
            .eh_frame
            .fde_from_offset(&self.bases, offset, |section, bases, at| {
                if let Some(i) = cies.iter().position(|c| c.0 == at) {
                    *last = i;
                    return Ok(cies[i].1.clone());
                }
                let cie = section.cie_from_offset(bases, at)?;
                let init = eval_cie(&cie, section, bases);
                *last = cies.len();
                cies.push((at, cie.clone(), init));
                Ok(cie)
            })
            .ok()?;
        let (lo, hi) = (fde.initial_address(), fde.end_address());
        (lo >= self.start && hi <= self.end && lo < hi).then_some(fde)
    }

    /// Appends the rows of `fde` (just returned by [`Builder::fde`]), which
    /// starts at or after every FDE added so far. framehop picks the FDE
    /// with the greatest start at or below the pc, so this one cuts the
    /// rows the previous ones left at or after its start short; up to its
    /// end it gives its own rows (a row equal to the one before it is
    /// dropped), and from its end, R_NONE (a gap, until a later FDE cuts
    /// it in turn). An FDE whose instructions fail to evaluate gives one
    /// R_NONE row at its start: framehop sees the same error, and its
    /// fallback decides.
    fn add(&mut self, fde: &Fde<'a>) {
        let (lo, hi) = (fde.initial_address(), fde.end_address());
        let lo_off = (lo - self.start) as u32;
        let hi_off = (hi - self.start) as u32;
        while self.rows.last().is_some_and(|r| r.off >= lo_off) {
            self.rows.pop();
        }
        let mark = self.rows.len();
        let (eh_frame, bases) = (&self.eh_frame, &self.bases);
        let init = self.cies.get(self.last_cie).and_then(|c| c.2.as_ref());
        let done = init.is_some_and(|init| {
            eval_fde(fde, init, eh_frame, bases, self.start, &mut self.rows).is_some()
        });
        if !done {
            // An instruction the fast evaluator leaves to gimli (or an
            // error, which gimli reports as the reference build saw it).
            self.rows.truncate(mark);
            let ctx = self.ctx.get_or_insert_with(gimli::UnwindContext::new);
            let ok = (|| -> gimli::Result<()> {
                let mut table = fde.rows(eh_frame, bases, ctx)?;
                while let Some(row) = table.next_row()? {
                    if row.start_address() >= row.end_address() {
                        continue;
                    }
                    let rule = translate(
                        row.cfa(),
                        row.register(X86_64::RBP),
                        row.register(X86_64::RA),
                    );
                    emit(&mut self.rows, self.start, hi, row.start_address(), rule);
                }
                Ok(())
            })();
            if ok.is_err() {
                self.rows.truncate(mark);
                push(
                    &mut self.rows,
                    Row {
                        off: lo_off,
                        rule: R_NONE,
                    },
                );
            }
        }
        if hi < self.end {
            self.rows.push(Row {
                off: hi_off,
                rule: R_NONE,
            });
        }
    }
}

/// Appends the row gimli gives from `at` (at or after the FDE's start) of
/// an FDE that ends at `hi`, unless it starts at or beyond `hi`.
///
/// (The two-pass build kept a row that started 4 GiB or more past the
/// module's start, its offset truncated to 32 bits: only a corrupt FDE
/// has one, and its rows would have left the table unsorted.)
#[inline(always)]
fn emit(rows: &mut Vec<Row>, start: u64, hi: u64, at: u64, rule: u32) {
    if at < hi {
        push(
            rows,
            Row {
                off: (at - start) as u32,
                rule,
            },
        );
    }
}

/// The part of gimli's unwind row that [`translate`] reads.
#[derive(Clone)]
struct State {
    cfa: CfaRule<usize>,
    bp: Option<Rule>,
    ra: Option<Rule>,
}

/// A CIE's initial state, as gimli's `UnwindContext::initialize` leaves it.
#[derive(Clone)]
struct Init {
    state: State,
    /// The depth of gimli's row stack after initialization (1, or 2 when
    /// the CIE sets several rules and gimli keeps a copy of its row under
    /// the current one), which `DW_CFA_restore_state` cannot pop.
    depth: usize,
    code_align: u64,
    data_align: i64,
}

/// The depth of gimli's row stack (`MAX_UNWIND_STACK_DEPTH`).
const STACK: usize = 4;

/// Registers whose rules the fast evaluator tracks only as far as to be
/// sure gimli's 192-entry rule map cannot overflow: any number below it.
const MAX_REGISTER: u16 = 192;

/// `state` after the register rule `reg` = `rule`.
#[inline(always)]
fn set_rule(state: &mut State, reg: gimli::Register, rule: Option<Rule>) -> Option<()> {
    if reg == X86_64::RBP {
        state.bp = rule;
    } else if reg == X86_64::RA {
        state.ra = rule;
    } else if reg.0 >= MAX_REGISTER {
        return None;
    }
    Some(())
}

/// The CFI instructions that only set a rule, as gimli evaluates them:
/// `Some(true)` when `ins` was one of them, `Some(false)` when it is not,
/// `None` for what the fast evaluator leaves to gimli.
#[inline(always)]
fn eval_rule(
    state: &mut State,
    ins: &gimli::CallFrameInstruction<usize>,
    data_align: i64,
) -> Option<bool> {
    use gimli::CallFrameInstruction as I;
    use std::num::Wrapping as W;
    let da = W(data_align);
    match *ins {
        I::DefCfa { register, offset } => {
            state.cfa = CfaRule::RegisterAndOffset {
                register,
                offset: offset as i64,
            }
        }
        I::DefCfaSf {
            register,
            factored_offset,
        } => {
            state.cfa = CfaRule::RegisterAndOffset {
                register,
                offset: (W(factored_offset) * da).0,
            }
        }
        I::DefCfaRegister { register } => match &mut state.cfa {
            CfaRule::RegisterAndOffset { register: r, .. } => *r = register,
            _ => return None,
        },
        I::DefCfaOffset { offset } => match &mut state.cfa {
            CfaRule::RegisterAndOffset { offset: o, .. } => *o = offset as i64,
            _ => return None,
        },
        I::DefCfaOffsetSf { factored_offset } => match &mut state.cfa {
            CfaRule::RegisterAndOffset { offset: o, .. } => *o = (W(factored_offset) * da).0,
            _ => return None,
        },
        I::Undefined { register } => set_rule(state, register, Some(RegisterRule::Undefined))?,
        I::SameValue { register } => set_rule(state, register, Some(RegisterRule::SameValue))?,
        I::Offset {
            register,
            factored_offset,
        } => set_rule(
            state,
            register,
            Some(RegisterRule::Offset((W(factored_offset as i64) * da).0)),
        )?,
        I::OffsetExtendedSf {
            register,
            factored_offset,
        } => set_rule(
            state,
            register,
            Some(RegisterRule::Offset((W(factored_offset) * da).0)),
        )?,
        I::ValOffset {
            register,
            factored_offset,
        } => set_rule(
            state,
            register,
            Some(RegisterRule::ValOffset((W(factored_offset as i64) * da).0)),
        )?,
        I::ValOffsetSf {
            register,
            factored_offset,
        } => set_rule(
            state,
            register,
            Some(RegisterRule::ValOffset((W(factored_offset) * da).0)),
        )?,
        I::Register {
            dest_register,
            src_register,
        } => set_rule(
            state,
            dest_register,
            Some(RegisterRule::Register(src_register)),
        )?,
        I::ArgsSize { .. } | I::Nop => {}
        _ => return Some(false),
    }
    Some(true)
}

/// The state gimli's `UnwindContext::initialize` leaves after `cie`'s
/// initial instructions; `None` when they hold anything but rules (those
/// CIEs' FDEs go to gimli).
fn eval_cie(
    cie: &Cie<'_>,
    section: &gimli::EhFrame<Reader<'_>>,
    bases: &gimli::BaseAddresses,
) -> Option<Init> {
    if cie.address_size() != 8 {
        return None;
    }
    let mut state = State {
        cfa: CfaRule::default(),
        bp: None,
        ra: None,
    };
    // The registers given a rule (gimli keeps one entry for each).
    let mut set = [0u64; MAX_REGISTER as usize / 64];
    let mut iter = cie.instructions(section, bases);
    let data_align = cie.data_alignment_factor();
    while let Some(ins) = iter.next().ok()? {
        if !eval_rule(&mut state, &ins, data_align)? {
            return None;
        }
        use gimli::CallFrameInstruction as I;
        if let I::Undefined { register }
        | I::SameValue { register }
        | I::Offset { register, .. }
        | I::OffsetExtendedSf { register, .. }
        | I::ValOffset { register, .. }
        | I::ValOffsetSf { register, .. }
        | I::Register {
            dest_register: register,
            ..
        } = ins
        {
            let r = usize::from(register.0);
            set[r / 64] |= 1 << (r % 64);
        }
    }
    let rules: u32 = set.iter().map(|w| w.count_ones()).sum();
    Some(Init {
        state,
        depth: if rules <= 1 { 1 } else { 2 },
        code_align: cie.code_alignment_factor(),
        data_align,
    })
}

/// Appends the rows of `fde` (with [`emit`]) as gimli's `UnwindTable`
/// gives them; `None` (having appended some rows, perhaps) at the first
/// instruction it leaves to gimli, or where gimli would fail.
fn eval_fde<'a>(
    fde: &Fde<'a>,
    init: &Init,
    section: &gimli::EhFrame<Reader<'a>>,
    bases: &gimli::BaseAddresses,
    start: u64,
    rows: &mut Vec<Row>,
) -> Option<()> {
    use gimli::CallFrameInstruction as I;
    let (lo, hi) = (fde.initial_address(), fde.end_address());
    let mut code = fde.instructions(section, bases);
    // gimli's row stack: `stack[..depth - 1]` under the current `state`.
    let mut stack: [Option<State>; STACK] = [None, None, None, None];
    let mut depth = init.depth;
    let mut state = init.state.clone();
    let mut at = lo;
    while let Some(ins) = code.next().ok()? {
        if eval_rule(&mut state, &ins, init.data_align)? {
            continue;
        }
        match ins {
            I::AdvanceLoc { delta } => {
                let next =
                    at.checked_add((Wrapping(u64::from(delta)) * Wrapping(init.code_align)).0)?;
                if at < next {
                    emit(
                        rows,
                        start,
                        hi,
                        at,
                        translate(&state.cfa, state.bp.clone(), state.ra.clone()),
                    );
                }
                at = next;
            }
            I::Restore { register } => {
                let rule = if register == X86_64::RBP {
                    init.state.bp.clone()
                } else if register == X86_64::RA {
                    init.state.ra.clone()
                } else {
                    None
                };
                set_rule(&mut state, register, rule)?;
            }
            I::RememberState => {
                if depth == STACK {
                    return None;
                }
                *stack.get_mut(depth - 1)? = Some(state.clone());
                depth += 1;
            }
            I::RestoreState => {
                if depth <= init.depth {
                    return None;
                }
                depth -= 1;
                state = stack.get_mut(depth - 1)?.take()?;
            }
            _ => return None,
        }
    }
    emit(
        rows,
        start,
        hi,
        at,
        translate(&state.cfa, state.bp, state.ra),
    );
    Some(())
}

/// Appends `r` to `rows`, unless the last row has its rule already; a row
/// at the last row's `off` replaces its rule.
#[inline(always)]
fn push(rows: &mut Vec<Row>, r: Row) {
    if let Some(l) = rows.last_mut() {
        if l.rule == r.rule && l.off < r.off {
            return;
        }
        if l.off == r.off {
            l.rule = r.rule;
            return;
        }
    }
    rows.push(r);
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

/// Entries of an unwinder's shared rule cache (512 KiB).
const SHARED_SLOTS: usize = 1 << 16;

/// The second level of the threads' rule caches: one per unwinder, shared
/// by every thread, direct-mapped, filled by the threads' misses. A
/// thread's own cache ([`RuleCache`]) holds 256 rules, fewer than a deep
/// program steps through (python's deep-stack loop missed it on one
/// lookup in nine, each miss some 220 instructions in the tables); a miss
/// there that this cache holds costs one load.
///
/// Each entry is one word, written and read whole (relaxed: the rule is
/// in the word itself, and every rule of an unwinder is fixed): the key's
/// upper 32 bits (of the 48 a key packs into: the address, below 2^47,
/// and the instruction-pointer flag) above the rule, at a slot the key's
/// bits name. Slot and upper bits give the key back, so a hit is exact.
/// Zero is empty (an upper part of zero is never stored).
pub(crate) struct SharedRules {
    slots: Box<[AtomicU64]>,
}

impl SharedRules {
    /// A cache with room (`on`), or none (an unwinder without tables).
    pub(crate) fn new(on: bool) -> SharedRules {
        let n = if on { SHARED_SLOTS } else { 0 };
        SharedRules {
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The slot of `key` and the upper half its entry has; `None` for a
    /// key this cache does not hold.
    #[inline(always)]
    fn place(key: u64) -> Option<(usize, u64)> {
        let addr = key & !(1 << 63);
        if addr >> 47 != 0 {
            return None;
        }
        let packed = addr | (key >> 63) << 47;
        let upper = packed >> 16;
        if upper == 0 {
            return None;
        }
        let slot = ((packed ^ packed >> 16 ^ packed >> 32) & 0xffff) as usize;
        Some((slot, upper << 32))
    }

    /// The rule this cache holds for `key`.
    // Runs inside malloc: no allocation, no lock, no panic.
    #[inline(always)]
    pub(crate) fn get(&self, key: u64) -> Option<u32> {
        let (slot, upper) = Self::place(key)?;
        let e = self.slots.get(slot)?.load(Ordering::Relaxed);
        (e & !0xffff_ffff == upper).then_some(e as u32)
    }

    /// Holds `rule` for `key` (replacing the slot's entry).
    // Runs inside malloc: no allocation, no lock, no panic.
    #[inline(always)]
    pub(crate) fn put(&self, key: u64, rule: u32) {
        if let Some((slot, upper)) = Self::place(key) {
            if let Some(s) = self.slots.get(slot) {
                s.store(upper | u64::from(rule), Ordering::Relaxed);
            }
        }
    }

    /// Its bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.slots.len() * 8
    }
}

impl core::fmt::Debug for SharedRules {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SharedRules")
            .field("slots", &self.slots.len())
            .finish()
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

    /// The shared cache gives back exactly the rule put for a key, never
    /// another key's: two keys at one slot replace each other, and keys it
    /// cannot pack (kernel addresses, the first 64 KiB) are not held.
    #[test]
    fn the_shared_rule_cache_answers_only_for_the_key_it_holds() {
        let c = SharedRules::new(true);
        let keys = [
            0x7f12_3456_7890u64,
            0x7f12_3456_7890 | 1 << 63,
            0x5555_0000_1234,
            0x1_0000,
            0x7fff_ffff_ffff,
        ];
        for (i, &k) in keys.iter().enumerate() {
            c.put(k, i as u32 + 7);
        }
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(c.get(k), Some(i as u32 + 7), "{k:#x}");
        }
        let a = 0x7f12_3456_7890u64;
        let b = a ^ 1 << 16 ^ 1;
        assert_eq!(
            SharedRules::place(a).map(|p| p.0),
            SharedRules::place(b).map(|p| p.0)
        );
        c.put(b, 2);
        assert_eq!((c.get(a), c.get(b)), (None, Some(2)));
        for k in [0xffff_ffff_ff60_0000u64, 0x1234] {
            c.put(k, 3);
            assert_eq!(c.get(k), None, "{k:#x}");
        }
        let off = SharedRules::new(false);
        off.put(a, 1);
        assert_eq!((off.get(a), off.bytes()), (None, 0));
        assert_eq!(c.bytes(), 512 * 1024);
    }

    /// Both builds of one module: the rows and the index agree.
    fn assert_same(m: &ModuleInfo, new: &ModuleTable, old: &ModuleTable) {
        let name = m.path_lossy();
        assert_eq!((new.start, new.end), (old.start, old.end), "{name}");
        assert_eq!(new.key, old.key, "{name}");
        if let Some(i) =
            (0..new.rows.len().min(old.rows.len())).find(|&i| new.rows[i] != old.rows[i])
        {
            panic!(
                "{name}: row {i} is {:?}, the reference's {:?}",
                new.rows[i], old.rows[i]
            );
        }
        assert_eq!(new.rows.len(), old.rows.len(), "{name}: rows");
        assert_eq!(new.index, old.index, "{name}: index");
    }

    /// The one-pass build gives exactly the two-pass build's rows and
    /// index, for every object loaded in the test process (the test
    /// binary, libc, ld.so, libgcc_s, the vDSO).
    #[test]
    fn build_equals_the_reference_for_every_loaded_module() {
        let modules = Modules::snapshot();
        let mut with_rows = 0;
        for m in modules.modules() {
            // SAFETY: a snapshot of this process's loaded objects, none of
            // which this test unloads.
            let (new, old) = unsafe { (ModuleTable::build(m), ModuleTable::build_reference(m)) };
            assert_same(m, &new, &old);
            if old.rows.len() > 100 {
                with_rows += 1;
            }
        }
        // At least the test binary and libc.
        assert!(with_rows >= 2, "{with_rows} modules with rows");
    }

    /// A header whose table is not sorted by start (here: reversed) gives
    /// the same rows: the FDEs are sorted and the pass runs again.
    #[test]
    fn an_unsorted_header_gives_the_same_rows() {
        let modules = Modules::snapshot();
        let mut checked = 0;
        for m in modules.modules() {
            // SAFETY: as above.
            let (new, old) = unsafe {
                (
                    ModuleTable::build_from(m, |mut o| {
                        o.reverse();
                        o
                    }),
                    ModuleTable::build_reference(m),
                )
            };
            assert_same(m, &new, &old);
            checked += usize::from(old.rows.len() > 100);
        }
        assert!(checked >= 2, "{checked} modules with rows");
    }

    /// An `.eh_frame_hdr` and `.eh_frame` written by hand, in one buffer:
    /// FDEs that use every instruction the fast evaluator reads and some it
    /// leaves to gimli, gimli's errors (a full or empty row stack, an
    /// unknown opcode, a truncated operand), overlapping FDEs, two with the
    /// same start, gaps, one outside the module, and CIEs with one and two
    /// initial rules (a row stack one or two deep) and 8- and 4-byte
    /// addresses.
    struct Synthetic {
        buf: Vec<u8>,
        module: ModuleInfo,
    }

    impl Synthetic {
        /// `fdes`: (CIE number, start offset in the module, size,
        /// instructions).
        fn new(fdes: &[(usize, u64, u64, Vec<u8>)]) -> Synthetic {
            const HDR: usize = 0;
            const EH: usize = 0x1000;
            const CODE: u64 = 0x10_0000;
            let mut buf = vec![0u8; 0x8000];
            let base = buf.as_ptr() as u64;
            let start = base + CODE;
            let mut eh = Vec::new();
            // CIEs: (augmentation data, initial instructions).
            let cies: [(u8, Vec<u8>); 3] = [
                // absptr; CFA = rsp + 8, ra at CFA - 8.
                (0x00, vec![0x0c, 7, 8, 0x90, 1]),
                // pcrel|sdata4; and rbp at CFA - 16: two rules.
                (0x1b, vec![0x0c, 7, 8, 0x90, 1, 0x86, 2]),
                // An advance in the initial instructions: left to gimli.
                (0x00, vec![0x0c, 7, 8, 0x41, 0x90, 1]),
            ];
            let mut cie_at = Vec::new();
            for (enc, ins) in &cies {
                let mut body = vec![0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 16, 1, *enc];
                body.extend(ins);
                while (body.len() + 4) % 8 != 0 {
                    body.push(0);
                }
                cie_at.push(eh.len());
                eh.extend((body.len() as u32).to_le_bytes());
                eh.extend(body);
            }
            let mut table = Vec::new();
            for (cie, lo, size, ins) in fdes {
                let at = eh.len();
                let mut body = Vec::new();
                body.extend(((at + 4 - cie_at[*cie]) as u32).to_le_bytes());
                let lo_addr = start.wrapping_add(*lo);
                if cies[*cie].0 == 0x1b {
                    let field = base + (EH + at + 8) as u64;
                    body.extend((lo_addr.wrapping_sub(field) as i32).to_le_bytes());
                    body.extend((*size as u32).to_le_bytes());
                } else {
                    body.extend(lo_addr.to_le_bytes());
                    body.extend(size.to_le_bytes());
                }
                body.push(0);
                body.extend(ins);
                while (body.len() + 4) % 8 != 0 {
                    body.push(0);
                }
                eh.extend((body.len() as u32).to_le_bytes());
                eh.extend(body);
                table.push((lo_addr, at));
            }
            eh.extend([0, 0, 0, 0]);
            buf[EH..EH + eh.len()].copy_from_slice(&eh);
            // The header: version, eh_frame_ptr pcrel|sdata4, count
            // udata4, table datarel|sdata4.
            let mut hdr = vec![1u8, 0x1b, 0x03, 0x3b];
            hdr.extend(((EH - (HDR + 4)) as i32).to_le_bytes());
            hdr.extend((table.len() as u32).to_le_bytes());
            for (lo_addr, at) in &table {
                hdr.extend((lo_addr.wrapping_sub(base) as i32).to_le_bytes());
                hdr.extend(((EH + at) as i32).to_le_bytes());
            }
            buf[HDR..HDR + hdr.len()].copy_from_slice(&hdr);
            let module = ModuleInfo {
                path: b"synthetic".to_vec(),
                build_id: Vec::new(),
                bias: 0,
                start,
                end: start + 0x10000,
                segments: Vec::new(),
                eh_frame_hdr: base + HDR as u64,
                eh_frame_hdr_len: hdr.len() as u64,
                eh_frame: base + EH as u64,
                eh_frame_len: eh.len() as u64,
            };
            Synthetic { buf, module }
        }
    }

    /// The one-pass build gives the two-pass build's rows on hand-written
    /// unwind tables that hold what compilers rarely emit (see
    /// [`Synthetic`]), with the header sorted and not.
    #[test]
    fn build_equals_the_reference_on_unusual_tables() {
        let adv = |n: u8| 0x40 | n;
        #[rustfmt::skip]
        let prologue = vec![adv(1), 0x0e, 16, 0x86, 2, adv(3), 0x0d, 6, adv(20), 0x0c, 7, 8];
        let mut set_loc = vec![0x0e, 16, 0x01];
        set_loc.extend(0u64.to_le_bytes());
        // (CIE, start, size, instructions)
        #[rustfmt::skip]
        let mut fdes = vec![
            (0, 0x000, 0x40, prologue.clone()),
            // Remember and restore; restore rbp to the CIE's rule.
            (0, 0x040, 0x40, vec![adv(1), 0x0e, 16, 0x86, 2, 0x0a, adv(2), 0x0e, 32, 0x0b, adv(2), 0xc6, adv(1)]),
            // The row stack full (1 + 4 rows), rows before the error.
            (0, 0x080, 0x40, vec![adv(1), 0x0a, adv(1), 0x0a, adv(1), 0x0a, adv(1), 0x0a, adv(1)]),
            // Three remembered rows: the most that fit.
            (0, 0x0c0, 0x40, vec![0x0a, adv(1), 0x0e, 16, 0x0a, adv(1), 0x0e, 24, 0x0a, adv(1),
                                  0x0b, adv(1), 0x0b, adv(1), 0x0b, adv(1)]),
            // Restore the state with nothing remembered.
            (0, 0x100, 0x40, vec![adv(1), 0x0e, 16, 0x0b, adv(1)]),
            // Two initial rules: two remembered rows fit, three do not;
            // and popping the CIE's copy fails.
            (1, 0x140, 0x40, vec![0x0a, adv(1), 0x0a, adv(1), 0x0b, 0x0b, adv(1)]),
            (1, 0x180, 0x40, vec![0x0a, adv(1), 0x0a, adv(1), 0x0a, adv(1)]),
            (1, 0x1c0, 0x40, vec![adv(1), 0x0b, adv(1)]),
            (1, 0x200, 0x20, prologue.clone()),
            // Restore rbp and ra to the CIE's rules (there: rbp at CFA - 16).
            (1, 0x220, 0x20, vec![adv(1), 0x0e, 16, 0x86, 4, 0x90, 2, adv(1), 0xc6, adv(1), 0xd0, adv(1)]),
            // A CFA expression (as in PLT entries): gimli's.
            (0, 0x240, 0x40, vec![adv(1), 0x0f, 3, 0x77, 8, 0x06, adv(2), 0x0c, 7, 8]),
            // An unknown opcode; a truncated operand.
            (0, 0x280, 0x40, vec![adv(1), 0x0e, 16, adv(1), 0x3f, adv(1)]),
            (0, 0x2c0, 0x40, vec![adv(1), 0x0e, 16, adv(1), 0x0e, 0x80]),
            // The other rule-setting instructions and the long advances.
            (0, 0x300, 0x80, vec![
                0x02, 1, 0x11, 6, 0x7e, 0x03, 1, 0, 0x12, 7, 0x7e, 0x04, 1, 0, 0, 0,
                0x13, 0x7c, adv(1), 0x2e, 8, 0x00, 0x05, 16, 1, adv(1), 0x06, 16,
                adv(1), 0x07, 16, adv(1), 0x08, 6, adv(1), 0x09, 6, 3, adv(1),
                0x14, 6, 2, adv(1), 0x15, 6, 0x7e, adv(1), 0xc6, adv(1),
            ]),
            // A register beyond the tracked ones: gimli's.
            (0, 0x380, 0x40, vec![adv(1), 0x05, 0xc8, 1, 2, adv(1), 0x0e, 16]),
            // DW_CFA_set_loc: gimli's.
            (0, 0x3c0, 0x40, set_loc),
            // Odd CFA offsets, rbp saved below the CFA's range, ra undefined.
            (0, 0x400, 0x40, vec![adv(1), 0x0e, 12, adv(1), 0x0e, 16, 0x86, 0x7f, adv(1), 0x07, 16, adv(1)]),
            // An advance far beyond the FDE's end.
            (0, 0x440, 0x40, vec![adv(1), 0x0e, 16, 0x04, 0, 0, 0, 0x40, 0x0e, 24, adv(1)]),
            // Overlapping FDEs; two with the same start; a gap.
            (0, 0x480, 0x80, prologue.clone()),
            (0, 0x4a0, 0x20, vec![adv(4), 0x0e, 16]),
            (0, 0x4a0, 0x10, vec![adv(2), 0x0e, 24]),
            (0, 0x600, 0x10, prologue.clone()),
            // Starting at the previous one's end, with the same first rule.
            (0, 0x610, 0x10, prologue.clone()),
            // A CIE the fast evaluator leaves to gimli.
            (2, 0x640, 0x40, prologue.clone()),
            (0, 0x680, 0x40, vec![adv(1), 0x0e, 16, adv(1), 0xc6, 0xd0, adv(1)]),
            // Long ULEB128 operands (padded with 0x80s): 10 bytes and 8.
            (0, 0x6c0, 0x40, vec![adv(1), 0x0e, 0x90, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, adv(1)]),
            (0, 0x700, 0x40, vec![adv(1), 0x0e, 0x90, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, adv(1)]),
            // Ends at the module's end.
            (0, 0xffc0, 0x40, prologue.clone()),
        ];
        // Outside the module: dropped.
        fdes.insert(0, (0, u64::MAX - 0x3f, 0x40, prologue.clone()));
        let s = Synthetic::new(&fdes);
        let m = &s.module;
        // SAFETY: the header and .eh_frame are in `s.buf`, alive here; no
        // code is read.
        let (new, old) = unsafe { (ModuleTable::build(m), ModuleTable::build_reference(m)) };
        assert!(old.rows.len() > 40, "{:?}", old.rows);
        assert_same(m, &new, &old);
        // The header not sorted: the first and last FDEs swapped.
        // SAFETY: as above.
        let swapped = unsafe {
            ModuleTable::build_from(m, |mut o| {
                let n = o.len();
                o.swap(0, n - 1);
                o
            })
        };
        assert_same(m, &swapped, &old);
        drop(s.buf);
    }

    /// Builds the tables of every loaded module, with the one-pass build
    /// and with the reference, for callgrind: `valgrind --tool=callgrind
    /// TEST_BINARY --ignored --exact table::tests::build_cost`, then
    /// `callgrind_annotate --inclusive=yes` gives each build's
    /// instructions; this prints the rows.
    #[test]
    #[ignore = "a measurement, run by hand under callgrind"]
    fn build_cost() {
        let modules = Modules::snapshot();
        // SAFETY: as above.
        let tables = unsafe { Tables::build(&modules, None) };
        let reference: usize = modules
            .modules()
            .iter()
            // SAFETY: as above.
            .map(|m| unsafe { ModuleTable::build_reference(m) }.rows.len())
            .sum();
        eprintln!(
            "modules {} rows {} (reference {reference})",
            tables.modules.len(),
            tables.rows()
        );
    }

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
