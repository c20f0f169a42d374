//! Building a module's compact table: its FDEs, in the header's order, each
//! CIE parsed once, the call frame instructions evaluated into rows (set-up
//! only: allocates).

use std::num::Wrapping;

use gimli::{CfaRule, EhFrameOffset, LittleEndian, RegisterRule, UnwindSection, X86_64};

use super::*;

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
    pub(super) unsafe fn build_from(
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
    pub(super) unsafe fn build_reference(m: &ModuleInfo) -> ModuleTable {
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
