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

mod build;
mod cache;

pub(crate) use cache::{RuleCache, SharedRules};

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
