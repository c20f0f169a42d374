//! The live table: what the traced program has live now, kept by the
//! writer thread from the batches it moves anyway, so that a snapshot
//! (writer/snapshot.rs) is read from memory instead of from the trace.
//!
//! ## Design
//!
//! The writer thread decodes every events batch it takes from the queue,
//! before it writes it (with the format crate's `decode_event` and
//! `IdDeltas`, and the addresses restored with the generation's info
//! batch), and keeps, per live allocation, its address, size, type and
//! call-stack ID: the three kinds of memory the analysis pass keeps apart
//! (heap objects, spans, thread stacks), exists events included and marked
//! so. Call-stack IDs are stable for the process (call_stack_table.rs), so
//! the table holds no frames: a snapshot lists the nodes its objects use.
//!
//! In sampling mode the trace holds exactly the sampled allocations and
//! the frees of sampled addresses, so the table is the sampled set, with
//! sizes and stacks. In flight-recorder mode there is no table.
//!
//! The table is open-addressed (linear probing) in memory of the tracer's
//! own (reserved.rs: anonymous mappings, never the program's malloc), 40
//! bytes a slot, at most half used: past that it is rebuilt, with four
//! times as many slots as it keeps, so at most a quarter full after. Only the writer
//! thread touches it; nothing on the program's threads knows it exists.
//!
//! ## Order
//!
//! The queue holds each thread's batches in order, but not the threads'
//! batches in time order: a free on one thread may be moved before the
//! allocation it ends, on another thread whose buffer was not full yet.
//! The analysis pass reads a generation's events merged into time order
//! (generation, then ticks). So each slot keeps the (generation, tick) of
//! the last event applied at its address, and an event older than that is
//! dropped: the newest event at an address decides, in any arrival order.
//!
//! A free leaves a *tomb* with its key, so that an older allocation
//! arriving later stays dead: whether or not it found an allocation, since
//! another thread's allocation between the one it found and itself may
//! still be on its way. A tomb of generation `g` is kept until the writer
//! has passed the end of `g` (then every event of `g` and before is in),
//! then reused by the next address that needs a slot on its probe, or
//! dropped by a rebuild. So the table holds the live objects and one tomb
//! per address freed in the open generations (a program's allocator
//! reuses its addresses, so these are far fewer than its frees).
//!
//! ## Invariants
//!
//! 1. Only the writer thread reads or writes the table (no lock, no atomic).
//!    Otherwise a snapshot could see a half-applied batch.
//! 2. A slot goes from EMPTY to LIVE or TOMB and never back to EMPTY while
//!    the table is in use (a rebuild makes a fresh table). Otherwise a
//!    probe could stop before the slot of its address.
//! 3. An event applies only if its (generation, tick) is not older than
//!    its slot's. Otherwise arrival order would decide what is live.
//!
//! ## Corner case
//!
//! An allocation at a live address (a missed free) replaces it, as in the
//! analysis pass, when it is the newer; an older one arriving later is
//! dropped.
//!
//! ## Cost
//!
//! One decode per event on the writer thread, one probe per allocation and
//! free; 80 to 160 bytes of the tracer's memory per live object (its
//! 40-byte slot, the table a quarter to half used), more while a rebuild
//! copies it.
//! Kept by default in sampling mode only, where the writer sees few
//! events: in full mode it costs the writer thread some 25-30 ns per
//! event, which on two cores made the writer set the pace of the whole
//! program (bench/README.md, P3: full stacks 2.5x became 5-17x).
//! `ALLOCTRACE_LIVE_TABLE=on` keeps it in full mode too (and with it
//! `snapshot`), `off` in none.

use alloctrace_format::{
    decode_event, get_uvarint, restore_address, AddressClass, BatchKind, EventKind, IdDeltas,
    BATCH_PREFIX_LEN,
};

use crate::reserved::{map_reserved, unmap};

/// Which table of live memory (the analysis pass's `Memory`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Memory {
    Heap = 0,
    Span = 1,
    Stack = 2,
}

/// One live allocation, as a snapshot writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LiveObject {
    pub(crate) memory: Memory,
    pub(crate) addr: u64,
    /// Heap objects and thread stacks: bytes; spans: pages.
    pub(crate) size: u64,
    /// Heap objects: the type ID; spans: the kind class; else 0.
    pub(crate) type_id: u64,
    /// 0: no call stack.
    pub(crate) stack: u32,
    /// An exists event: live before tracing started.
    pub(crate) exists: bool,
}

/// A slot: five words. `meta` packs the state (bits 0-1), the memory
/// (bits 2-3), exists (bit 4), the generation of the last event applied
/// (bits 6-31) and the stack ID (bits 32-63); `tick` is that event's.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct Slot {
    addr: u64,
    size: u64,
    tick: u64,
    type_id: u64,
    meta: u64,
}

const SLOT_LEN: usize = core::mem::size_of::<Slot>();
const _: () = assert!(SLOT_LEN == 40);

const EMPTY: u64 = 0;
const LIVE: u64 = 1;
/// Freed: kept until the writer has passed the end of its generation (an
/// older event at the address may still arrive until then).
const TOMB: u64 = 2;
const EXISTS: u64 = 1 << 4;
/// Bits 6-31 of `meta`: the generation of the last event, modulo 2^26
/// (compared as a difference, so wrapping is harmless).
const GEN_SHIFT: u32 = 6;
const GEN_MASK: u64 = (1 << 26) - 1;
const GEN_HALF: u64 = 1 << 25;

/// The most a table is filled (used slots over slots) before a rebuild.
const MAX_LOAD: (usize, usize) = (1, 2);
/// The first table's slots.
const FIRST_SLOTS: usize = 1 << 16;
/// The most slots a table may have (4 GiB of address space); past it,
/// allocations are counted in [`LiveTable::overflow`] instead.
const MAX_SLOTS: usize = 1 << 27;

/// What the writer thread knows of one generation parity: its info
/// batch's address bases.
#[derive(Clone, Copy, Default)]
struct Bases {
    min_heap_addr: u64,
    page_shift: u32,
    heap_shift: u32,
    stack_shift: u32,
}

/// Events decoded ahead of their application (`apply_events`).
const CHUNK: usize = 32;

/// One decoded event waiting in a chunk.
#[derive(Clone, Copy)]
struct Pending {
    free: bool,
    object: LiveObject,
    ticks: u64,
}

impl Default for Pending {
    fn default() -> Pending {
        Pending {
            free: false,
            object: LiveObject {
                memory: Memory::Heap,
                addr: 0,
                size: 0,
                type_id: 0,
                stack: 0,
                exists: false,
            },
            ticks: 0,
        }
    }
}

/// The writer thread's live table (module docs).
pub(crate) struct LiveTable {
    slots: *mut Slot,
    cap: usize,
    /// Slots not EMPTY (live and tombs).
    used: usize,
    live: usize,
    /// The last generation whose end the writer has passed: tombs of it
    /// and before may go.
    ended: u64,
    bases: [Bases; 2],
    /// Allocations the table had no room for (they are missing from
    /// snapshots).
    pub(crate) overflow: u64,
    /// The body of the last info batch, and of the last process batch, as
    /// a snapshot repeats them.
    pub(crate) info: Vec<u8>,
    pub(crate) process: Vec<u8>,
}

// SAFETY: the table is owned by the writer thread (invariant 1); it is
// made before the thread starts and moved into it.
unsafe impl Send for LiveTable {}

impl Drop for LiveTable {
    fn drop(&mut self) {
        if !self.slots.is_null() {
            unmap(self.slots.cast(), self.cap * SLOT_LEN);
        }
    }
}

/// Whether the writer keeps a live table: `ALLOCTRACE_LIVE_TABLE=on` (or
/// `1`) always, `off` (or `0`) never, else in sampling mode only (module
/// docs, "Cost").
pub(crate) fn wanted(sampling: bool) -> bool {
    match std::env::var_os("ALLOCTRACE_LIVE_TABLE") {
        Some(v) if v == "on" || v == "1" => true,
        Some(v) if v == "off" || v == "0" => false,
        _ => sampling,
    }
}

/// The slot a probe starts from (any bits: the caller masks them). The
/// 16 granules of 16 bytes (malloc's) of each 256-byte block of addresses
/// get 16 neighbouring slots, so neighbouring small objects, which a
/// program tends to allocate and free together, share cache lines of the
/// table; the blocks themselves (and the kinds of memory) are spread by a
/// multiplicative hash, so runs of used slots stay short.
fn hash(memory: u64, addr: u64) -> usize {
    let block = (addr >> 8) ^ (memory << 58);
    (((block.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 24) << 4) | ((addr >> 4) & 15)) as usize
}

fn shift_of(v: u64) -> u32 {
    alloctrace_format::exact_log2(v).unwrap_or(0)
}

impl LiveTable {
    /// An empty table; its memory is mapped at the first allocation.
    pub(crate) fn new() -> LiveTable {
        LiveTable {
            slots: core::ptr::null_mut(),
            cap: 0,
            used: 0,
            live: 0,
            ended: 0,
            bases: [Bases::default(); 2],
            overflow: 0,
            info: Vec::new(),
            process: Vec::new(),
        }
    }

    /// Live allocations now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Slot `i` (modulo the capacity), copied out.
    fn slot(&self, i: usize) -> Slot {
        // SAFETY: reduced modulo cap: inside the mapping, zeroed (a zero
        // Slot is EMPTY); only the writer thread touches it (invariant 1).
        unsafe { *self.slots.add(i & (self.cap - 1)) }
    }

    fn set(&mut self, i: usize, slot: Slot) {
        // SAFETY: as in `slot`.
        unsafe { *self.slots.add(i & (self.cap - 1)) = slot };
    }

    /// Calls `f` for every live allocation, in no particular order.
    pub(crate) fn for_each(&self, mut f: impl FnMut(LiveObject)) {
        for i in 0..self.cap {
            let s = self.slot(i);
            if s.meta & 3 == LIVE {
                f(LiveObject {
                    memory: match (s.meta >> 2) & 3 {
                        0 => Memory::Heap,
                        1 => Memory::Span,
                        _ => Memory::Stack,
                    },
                    addr: s.addr,
                    size: s.size,
                    type_id: s.type_id,
                    stack: (s.meta >> 32) as u32,
                    exists: s.meta & EXISTS != 0,
                });
            }
        }
    }

    /// The writer has passed the end of `generation`.
    pub(crate) fn generation_ended(&mut self, generation: u64) {
        self.ended = self.ended.max(generation);
    }

    /// Whether a tomb of generation `gen` (modulo 2^27) may go.
    fn expired(&self, meta: u64) -> bool {
        let gen = (meta >> GEN_SHIFT) & GEN_MASK;
        let ended = self.ended & GEN_MASK;
        // gen <= ended, on the wrapping 27-bit circle.
        (ended.wrapping_sub(gen) & GEN_MASK) < GEN_HALF
    }

    /// Takes in the batches laid back to back in `bytes` (one full
    /// buffer's): info batches for their bases, process batches to repeat
    /// them, events batches applied.
    pub(crate) fn take(&mut self, mut bytes: &[u8]) {
        while let Some(l) = bytes.get(1..BATCH_PREFIX_LEN) {
            let len = BATCH_PREFIX_LEN + u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
            let (batch, rest) = bytes.split_at(len.min(bytes.len()));
            self.take_batch(batch);
            bytes = rest;
        }
    }

    fn take_batch(&mut self, batch: &[u8]) {
        let Some(kind) = batch.first().and_then(|&k| BatchKind::from_u8(k)) else {
            return;
        };
        if !matches!(
            kind,
            BatchKind::Info | BatchKind::Process | BatchKind::Events | BatchKind::CompactEvents
        ) {
            return;
        }
        let mut pos = BATCH_PREFIX_LEN;
        let mut header = [0u64; 3];
        for h in &mut header {
            match get_uvarint(batch, &mut pos) {
                Ok(v) => *h = v,
                Err(_) => return,
            }
        }
        let [generation, _thread, base_ticks] = header;
        let body = &batch[pos..];
        match kind {
            BatchKind::Info => {
                let mut at = 0;
                let mut field = || get_uvarint(body, &mut at).unwrap_or(0);
                let min_heap_addr = field();
                let (page, heap, stack) = (field(), field(), field());
                self.bases[(generation & 1) as usize] = Bases {
                    min_heap_addr,
                    page_shift: shift_of(page),
                    heap_shift: shift_of(heap),
                    stack_shift: shift_of(stack),
                };
                self.info.clear();
                self.info.extend_from_slice(body);
            }
            BatchKind::Process => {
                self.process.clear();
                self.process.extend_from_slice(body);
            }
            _ => self.apply_events(
                generation,
                base_ticks,
                body,
                kind == BatchKind::CompactEvents,
            ),
        }
    }

    /// Applies an events batch's body (module docs, "Order").
    fn apply_events(&mut self, generation: u64, base_ticks: u64, body: &[u8], compact: bool) {
        let bases = self.bases[(generation & 1) as usize];
        let mut deltas = IdDeltas::default();
        let mut ticks = base_ticks;
        let mut pos = 0;
        // Decoded a chunk at a time, their slots prefetched, then applied
        // in order: the table's cache misses overlap instead of queueing.
        let mut chunk = [Pending::default(); CHUNK];
        loop {
            let mut n = 0;
            while n < CHUNK && pos < body.len() {
                let Ok(e) = decode_event(body, &mut pos) else {
                    pos = body.len();
                    break;
                };
                ticks = ticks.wrapping_add(e.time_delta);
                // The kind's row, read once (each property method reads it).
                let spec = e.kind.spec();
                let class = spec.class;
                let shift = match class {
                    AddressClass::Span => bases.page_shift,
                    AddressClass::HeapObject => bases.heap_shift,
                    AddressClass::Stack => bases.stack_shift,
                    AddressClass::Raw => continue,
                };
                let addr = if e.long_form() {
                    e.args[0]
                } else {
                    let id = if compact {
                        deltas.decode(class, e.args[0])
                    } else {
                        e.args[0]
                    };
                    restore_address(id, bases.min_heap_addr, shift)
                };
                let memory = match class {
                    AddressClass::Span => Memory::Span,
                    AddressClass::Stack => Memory::Stack,
                    _ => Memory::Heap,
                };
                let free = matches!(
                    e.kind,
                    EventKind::HeapObjectFree | EventKind::SpanFree | EventKind::StackFree
                );
                let size = if spec.size_as_log2 && !e.long_form() {
                    1u64.checked_shl(e.args[1] as u32).unwrap_or(0)
                } else {
                    e.args[1]
                };
                chunk[n] = Pending {
                    free,
                    object: LiveObject {
                        memory,
                        addr,
                        size: if free { 0 } else { size },
                        type_id: if spec.args.len() >= 3 { e.args[2] } else { 0 },
                        stack: if spec.stack { e.args[3] as u32 } else { 0 },
                        exists: matches!(
                            e.kind,
                            EventKind::HeapObjectExists
                                | EventKind::SpanExists
                                | EventKind::StackExists
                        ),
                    },
                    ticks,
                };
                self.prefetch(memory, addr);
                n += 1;
            }
            for p in &chunk[..n] {
                let key = (generation, p.ticks);
                if p.free {
                    self.free(p.object.memory, p.object.addr, key);
                } else {
                    self.alloc(p.object, key);
                }
            }
            if pos >= body.len() {
                return;
            }
        }
    }

    /// Asks the CPU for the first slot `(memory, addr)`'s probe reads.
    #[inline]
    fn prefetch(&self, memory: Memory, addr: u64) {
        if self.cap == 0 {
            return;
        }
        let i = hash(memory as u64, addr) & (self.cap - 1);
        let p = self.slots.wrapping_add(i);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: a prefetch is a hint: it never faults, whatever the
        // address (here one inside the table's mapping).
        unsafe {
            core::arch::x86_64::_mm_prefetch(p.cast::<i8>(), core::arch::x86_64::_MM_HINT_T0)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }

    /// The slot of `(memory, addr)` if the table has one, else where it
    /// would go (the first expired tomb of its probe, else the EMPTY slot
    /// that ends it); `None` without a table.
    fn find(&self, memory: Memory, addr: u64) -> Option<(usize, bool)> {
        if self.cap == 0 {
            return None;
        }
        let m = memory as u64;
        let mut reuse = None;
        let start = hash(m, addr) & (self.cap - 1);
        for i in start..start + self.cap {
            let s = self.slot(i);
            let state = s.meta & 3;
            if state == EMPTY {
                return Some((reuse.unwrap_or(i & (self.cap - 1)), false));
            }
            if s.addr == addr && (s.meta >> 2) & 3 == m {
                return Some((i & (self.cap - 1), true));
            }
            if reuse.is_none() && state == TOMB && self.expired(s.meta) {
                reuse = Some(i & (self.cap - 1));
            }
        }
        reuse.map(|r| (r, false))
    }

    /// Whether the event of `key` is older than what the slot holds
    /// (invariant 3).
    fn older(&self, s: &Slot, key: (u64, u64)) -> bool {
        let gen = (s.meta >> GEN_SHIFT) & GEN_MASK;
        let diff = (key.0 & GEN_MASK).wrapping_sub(gen) & GEN_MASK;
        if diff == 0 {
            key.1 < s.tick
        } else {
            // The event's generation is before the slot's.
            diff >= GEN_HALF
        }
    }

    fn meta(object: &LiveObject, state: u64, gen: u64) -> u64 {
        state
            | (object.memory as u64) << 2
            | if object.exists { EXISTS } else { 0 }
            | (gen & GEN_MASK) << GEN_SHIFT
            | u64::from(object.stack) << 32
    }

    /// The slot for `(memory, addr)`: its own if the table has one
    /// (`true`), else a free one, the table rebuilt first when it would
    /// pass [`MAX_LOAD`]; `None` when there is no room at all.
    fn slot_for(&mut self, memory: Memory, addr: u64) -> Option<(usize, bool)> {
        if let Some((i, found)) = self.find(memory, addr) {
            if found || self.slot(i).meta & 3 != EMPTY || !self.too_full() {
                return Some((i, found));
            }
        }
        if !self.rebuild() && self.used + 1 >= self.cap {
            return None;
        }
        self.find(memory, addr)
    }

    /// Whether one more used slot would pass the table's load bound.
    fn too_full(&self) -> bool {
        (self.used + 1) * MAX_LOAD.1 > self.cap * MAX_LOAD.0
    }

    fn alloc(&mut self, object: LiveObject, key: (u64, u64)) {
        let Some((i, found)) = self.slot_for(object.memory, object.addr) else {
            self.overflow += 1;
            return;
        };
        let s = self.slot(i);
        let before = s.meta & 3;
        if found && self.older(&s, key) {
            return;
        }
        if before == EMPTY {
            self.used += 1;
        }
        if !(found && before == LIVE) {
            self.live += 1;
        }
        self.set(
            i,
            Slot {
                addr: object.addr,
                size: object.size,
                tick: key.1,
                type_id: object.type_id,
                meta: Self::meta(&object, LIVE, key.0),
            },
        );
    }

    fn free(&mut self, memory: Memory, addr: u64, key: (u64, u64)) {
        let Some((i, found)) = self.slot_for(memory, addr) else {
            return;
        };
        let s = self.slot(i);
        let before = s.meta & 3;
        if found && self.older(&s, key) {
            return;
        }
        if found && before == LIVE {
            self.live -= 1;
        }
        if before == EMPTY {
            self.used += 1;
        }
        // A tomb, whether the free found its allocation or not: until the
        // generation's end, an older allocation at the address may still
        // arrive (another thread's, between the one it found and this
        // free), and must stay dead.
        let object = LiveObject {
            memory,
            addr,
            size: 0,
            type_id: 0,
            stack: 0,
            exists: false,
        };
        self.set(
            i,
            Slot {
                addr,
                size: 0,
                tick: key.1,
                type_id: 0,
                meta: Self::meta(&object, TOMB, key.0),
            },
        );
    }

    /// Makes a fresh table holding the live slots and the tombs not yet
    /// expired, with at least four times their number of slots (so it is
    /// at most a quarter full after); false when it could not (no memory,
    /// or past [`MAX_SLOTS`]): the old table stays.
    fn rebuild(&mut self) -> bool {
        let mut keep: usize = 0;
        for i in 0..self.cap {
            let s = self.slot(i);
            match s.meta & 3 {
                LIVE => keep += 1,
                TOMB if !self.expired(s.meta) => keep += 1,
                _ => {}
            }
        }
        let cap = (keep * 4).next_power_of_two().max(FIRST_SLOTS);
        if cap > MAX_SLOTS {
            return false;
        }
        let slots = map_reserved(cap * SLOT_LEN).cast::<Slot>();
        if slots.is_null() {
            return false;
        }
        let (info, process) = (
            core::mem::take(&mut self.info),
            core::mem::take(&mut self.process),
        );
        let old = core::mem::replace(
            self,
            LiveTable {
                slots,
                cap,
                used: 0,
                live: 0,
                ended: self.ended,
                bases: self.bases,
                overflow: self.overflow,
                info,
                process,
            },
        );
        for i in 0..old.cap {
            let s = old.slot(i);
            let state = s.meta & 3;
            if state == LIVE || (state == TOMB && !old.expired(s.meta)) {
                let m = match (s.meta >> 2) & 3 {
                    0 => Memory::Heap,
                    1 => Memory::Span,
                    _ => Memory::Stack,
                };
                if let Some((j, _)) = self.find(m, s.addr) {
                    self.set(j, s);
                    self.used += 1;
                    if state == LIVE {
                        self.live += 1;
                    }
                }
            }
        }
        // `old` is dropped here: its mapping goes.
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heap(addr: u64, size: u64, stack: u32) -> LiveObject {
        LiveObject {
            memory: Memory::Heap,
            addr,
            size,
            type_id: 0,
            stack,
            exists: false,
        }
    }

    fn live(t: &LiveTable) -> Vec<(u64, u64, u32)> {
        let mut v = Vec::new();
        t.for_each(|o| v.push((o.addr, o.size, o.stack)));
        v.sort();
        v
    }

    #[test]
    fn the_newest_event_at_an_address_decides_in_any_arrival_order() {
        let mut t = LiveTable::new();
        // A free arrives before the allocation it ends (another thread's
        // batch), then an older incarnation's alloc and free arrive.
        t.free(Memory::Heap, 0x1000, (1, 20));
        t.alloc(heap(0x1000, 8, 1), (1, 10));
        assert!(live(&t).is_empty());
        t.alloc(heap(0x1000, 16, 2), (1, 30));
        t.alloc(heap(0x1000, 4, 3), (1, 5));
        assert_eq!(live(&t), vec![(0x1000, 16, 2)]);
        // An alloc at a live address replaces it.
        t.alloc(heap(0x1000, 32, 4), (1, 40));
        assert_eq!(live(&t), vec![(0x1000, 32, 4)]);
        // The same address in another memory is another allocation.
        t.alloc(
            LiveObject {
                memory: Memory::Span,
                ..heap(0x1000, 2, 5)
            },
            (1, 41),
        );
        assert_eq!(t.len(), 2);
        // A later generation is newer whatever its ticks.
        t.free(Memory::Heap, 0x1000, (2, 1));
        assert_eq!(t.len(), 1);
    }

    /// Late allocations stay dead when their free, or a later one, came
    /// first; an address freed and reused over and over takes one slot.
    #[test]
    fn late_allocations_stay_dead_when_their_free_came_first() {
        let mut t = LiveTable::new();
        // Thread B frees a1's object, reuses the address and frees it
        // again, all before thread A's a1 arrives.
        t.free(Memory::Heap, 0x2000, (1, 20));
        t.alloc(heap(0x2000, 8, 1), (1, 30));
        t.free(Memory::Heap, 0x2000, (1, 40));
        t.alloc(heap(0x2000, 8, 1), (1, 10));
        assert!(live(&t).is_empty());
        // The older free arrives while the newer allocation is live.
        t.alloc(heap(0x3000, 8, 1), (1, 30));
        t.free(Memory::Heap, 0x3000, (1, 20));
        t.free(Memory::Heap, 0x3000, (1, 40));
        t.alloc(heap(0x3000, 8, 1), (1, 10));
        assert!(live(&t).is_empty());
        // In order, a free leaves no tomb: the slot is reused at once.
        t.generation_ended(1);
        let used = t.used;
        for i in 0..1000 {
            t.alloc(heap(0x4000, 8, 1), (2, 2 * i));
            t.free(Memory::Heap, 0x4000, (2, 2 * i + 1));
        }
        assert!(
            t.used <= used + 1,
            "{} slots for one address",
            t.used - used
        );
    }

    /// Threads alloc and free a few addresses (each free after its
    /// allocation, as a program's are), their batches arrive interleaved
    /// in any order, one thread's in order: the table ends as the events
    /// applied in time order do, generation after generation.
    #[test]
    fn any_arrival_order_gives_the_time_order_answer() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200 {
            let mut t = LiveTable::new();
            let mut truth: std::collections::BTreeMap<u64, u64> = Default::default();
            let mut tick = 0;
            for generation in 1..=3u64 {
                // Per thread: its events, in its order.
                let mut threads: Vec<Vec<(bool, u64, u64)>> = vec![Vec::new(); 3];
                for _ in 0..60 {
                    tick += 1;
                    let addr = 0x1000 + next(6) * 16;
                    let thread = next(3) as usize;
                    let free = truth.contains_key(&addr);
                    if free {
                        truth.remove(&addr);
                    } else {
                        truth.insert(addr, tick);
                    }
                    threads[thread].push((free, addr, tick));
                }
                // Batches of 1 to 8 events from a random thread at a time.
                while threads.iter().any(|q| !q.is_empty()) {
                    let q = &mut threads[next(3) as usize];
                    let n = (next(8) as usize + 1).min(q.len());
                    for (free, addr, tick) in q.drain(..n) {
                        if free {
                            t.free(Memory::Heap, addr, (generation, tick));
                        } else {
                            t.alloc(heap(addr, tick, 1), (generation, tick));
                        }
                    }
                }
                t.generation_ended(generation);
                let got: Vec<(u64, u64)> = live(&t).iter().map(|&(a, s, _)| (a, s)).collect();
                let want: Vec<(u64, u64)> = truth.iter().map(|(&a, &s)| (a, s)).collect();
                assert_eq!(got, want, "round {round}, generation {generation}");
            }
        }
    }

    #[test]
    fn tombs_go_once_their_generation_ended_and_the_table_grows() {
        let mut t = LiveTable::new();
        for g in 1..=4u64 {
            for i in 0..100_000u64 {
                let addr = 0x10_0000 + (g * 1_000_000 + i) * 16;
                t.alloc(heap(addr, i, 1), (g, i * 2));
                if i % 2 == 0 {
                    t.free(Memory::Heap, addr, (g, i * 2 + 1));
                }
            }
            t.generation_ended(g);
        }
        assert_eq!(t.len(), 200_000);
        assert_eq!(t.overflow, 0);
        assert!(t.cap <= 1 << 20, "{}", t.cap);
        let mut n = 0;
        t.for_each(|o| {
            assert_eq!(o.size % 2, 1);
            n += 1;
        });
        assert_eq!(n, 200_000);
    }
}
