//! The heap model both sides of the transform keep (the module doc's
//! Design): the ring of recent allocations, the IDs freed per size class
//! and the ring of recent frees, and the predictions made from them.

use alloc::boxed::Box;
use alloc::vec;

use crate::varint::{unzigzag, zigzag};

/// log2 of the number of allocations the ring remembers.
pub const RING_BITS: u32 = 16;
/// log2 of the number of slots of the hash table from ID to allocation.
pub const HASH_BITS: u32 = 17;
/// IDs remembered per size class, most recently freed first.
pub const FREED_PER_CLASS: usize = 8;
/// log2 of the number of frees the free ring remembers.
pub const FREE_RING_BITS: u32 = 12;
/// log2 of the number of slots of the encoder's hash table from ID to
/// free ring index.
pub const FREE_HASH_BITS: u32 = 14;
/// Size classes: 16-byte steps up to 1 KiB (0 to 64), then four per power
/// of two (65 to 280).
pub const SIZE_CLASSES: usize = 281;

/// The size class of an allocation size.
#[inline]
pub const fn size_class(size: u64) -> usize {
    if size <= 1024 {
        return size.div_ceil(16) as usize;
    }
    let log = 63 - (size - 1).leading_zeros();
    let quarter = ((size - 1) >> (log - 2)) & 3;
    65 + (log as usize - 10) * 4 + quarter as usize
}

/// The heap model both sides keep (see Design). Reset at every stream.
pub(super) struct Model {
    /// `ring_ids[a % RING]`, `ring_classes[a % RING]`: the ID and size
    /// class of allocation number `a` of the stream.
    pub(super) ring_ids: Box<[u64]>,
    pub(super) ring_classes: Box<[u16]>,
    /// Allocations seen in this stream.
    pub(super) allocations: u64,
    /// Encoder only: `hash[slot(id)]`, the ring index of the latest
    /// allocation whose ID hashed there. Colliding IDs overwrite each
    /// other, and an entry may be stale (0 after a reset, or overwritten in
    /// the ring since): the ring confirms a hit. The decoder needs no hash:
    /// a free's code names a ring index.
    pub(super) hash: Box<[u16]>,
    /// Per size class, the IDs freed most recently, newest first, and how
    /// many are valid.
    pub(super) freed: Box<[[u64; FREED_PER_CLASS]]>,
    pub(super) freed_len: Box<[u8]>,
    /// The age of the last free the ring confirmed.
    pub(super) last_age: u64,
    /// The ID of the last escaped allocation.
    pub(super) last_escaped_alloc: u64,
    /// The previous entry tag of each kind byte without its tag bit.
    pub(super) last_tag: [u64; 256],
    /// `free_ring[f % FREE_RING]`: the ID of short-form free number `f`
    /// of the stream, whatever its size class (an allocator splits and
    /// merges free blocks: a block often comes back in another class).
    pub(super) free_ring: Box<[u64]>,
    /// Short-form frees seen in this stream.
    pub(super) frees: u64,
    /// Encoder only: `free_hash[free_slot(id)]`, the free ring index of
    /// the latest free whose ID hashed there (confirmed by the ring).
    pub(super) free_hash: Box<[u16]>,
}

pub(super) const FREE_RING: usize = 1 << FREE_RING_BITS;

pub(super) const RING: usize = 1 << RING_BITS;

/// What a free's or an allocation's ID costs to tell the other side.
pub(super) enum Prediction {
    /// The model knew it: this code (never 0) in the IDS column.
    Code(u64),
    /// The model did not: 0 in IDS and this value in ESCAPES.
    Escape(u64),
}

impl Model {
    /// Allocates the model, reset: about 0.7 MiB, and 0.28 MiB more for
    /// the encoder's hash tables.
    pub(super) fn new(hash: bool) -> Model {
        let hash_len = if hash { 1 << HASH_BITS } else { 0 };
        Model {
            ring_ids: vec![0u64; RING].into_boxed_slice(),
            ring_classes: vec![0u16; RING].into_boxed_slice(),
            allocations: 0,
            hash: vec![0u16; hash_len].into_boxed_slice(),
            freed: vec![[0u64; FREED_PER_CLASS]; SIZE_CLASSES].into_boxed_slice(),
            freed_len: vec![0u8; SIZE_CLASSES].into_boxed_slice(),
            last_age: 0,
            last_escaped_alloc: 0,
            last_tag: [0; 256],
            free_ring: vec![0u64; FREE_RING].into_boxed_slice(),
            frees: 0,
            free_hash: vec![0u16; if hash { 1 << FREE_HASH_BITS } else { 0 }].into_boxed_slice(),
        }
    }

    /// Forgets everything: the start of a stream.
    pub fn reset(&mut self) {
        self.allocations = 0;
        self.hash.fill(0);
        self.freed_len.fill(0);
        self.last_age = 0;
        self.last_escaped_alloc = 0;
        self.last_tag = [0; 256];
        self.frees = 0;
        self.free_hash.fill(0);
    }

    #[inline]
    pub(super) fn slot(id: u64) -> usize {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - HASH_BITS)) as usize
    }

    #[inline]
    pub(super) fn free_slot(id: u64) -> usize {
        (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FREE_HASH_BITS)) as usize
    }

    /// Records a short-form free of `id` (predicted or escaped).
    #[inline]
    pub(super) fn freed_any(&mut self, id: u64) {
        let i = (self.frees as usize) & (FREE_RING - 1);
        if let Some(slot) = self.free_ring.get_mut(i) {
            *slot = id;
        }
        if let Some(h) = self.free_hash.get_mut(Self::free_slot(id)) {
            *h = i as u16;
        }
        self.frees += 1;
    }

    /// Encoder: how many frees back (1 is the newest) `id` was freed, if
    /// the free ring holds it.
    #[inline]
    pub(super) fn find_free(&self, id: u64) -> Option<u64> {
        let i = usize::from(*self.free_hash.get(Self::free_slot(id))?);
        let newest = self.frees.checked_sub(1)?;
        let age = 1 + (newest.wrapping_sub(i as u64) & (FREE_RING as u64 - 1));
        (age <= self.frees && self.free_ring.get(i) == Some(&id)).then_some(age)
    }

    /// The age of the latest allocation of `id` (allocations since it,
    /// counting it: 1 to RING) and its ring index, if the ring still holds
    /// it.
    #[inline]
    pub(super) fn find_allocation(&self, id: u64) -> Option<(u64, usize)> {
        let i = usize::from(*self.hash.get(Self::slot(id))?);
        let newest = self.allocations.checked_sub(1)?;
        let age = 1 + (newest.wrapping_sub(i as u64) & (RING as u64 - 1));
        (age <= self.allocations && self.ring_ids.get(i) == Some(&id)).then_some((age, i))
    }

    /// Records an allocation (or exists event) of `id` and `size`.
    #[inline]
    pub(super) fn allocated(&mut self, id: u64, size: u64) {
        let i = (self.allocations as usize) & (RING - 1);
        if let (Some(r), Some(c)) = (self.ring_ids.get_mut(i), self.ring_classes.get_mut(i)) {
            *r = id;
            *c = size_class(size) as u16;
        }
        if let Some(h) = self.hash.get_mut(Self::slot(id)) {
            *h = i as u16;
        }
        self.allocations += 1;
    }

    /// The ring index of the allocation `age` allocations back (1 is the
    /// newest), if the ring holds it.
    #[inline]
    pub(super) fn ring_index(&self, age: u64) -> Option<usize> {
        (age >= 1 && age <= RING as u64 && age <= self.allocations)
            .then(|| ((self.allocations - age) as usize) & (RING - 1))
    }

    /// Encoder: the prediction for freeing `id`, updating the model. The
    /// free's age is first guessed to be the last one's, a read of the ring
    /// next to the last; the hash table is asked only when that fails.
    #[inline]
    pub(super) fn encode_free(&mut self, id: u64) -> Prediction {
        let guess = self
            .ring_index(self.last_age)
            .filter(|&i| self.ring_ids.get(i) == Some(&id));
        let found = match guess {
            Some(i) => Some((self.last_age, i)),
            None => self.find_allocation(id),
        };
        match found {
            Some((age, i)) => {
                let code = zigzag(age.wrapping_sub(self.last_age) as i64) + 1;
                self.last_age = age;
                self.push_freed(id, i);
                Prediction::Code(code)
            }
            None => Prediction::Escape(0),
        }
    }

    /// Decoder: the ID a free's code names, updating the model; `None`
    /// for a code the model cannot resolve (malformed).
    #[inline]
    pub(super) fn decode_free(&mut self, code: u64) -> Option<u64> {
        let age = self.last_age.wrapping_add(unzigzag(code - 1) as u64);
        let i = self.ring_index(age)?;
        let id = *self.ring_ids.get(i)?;
        self.last_age = age;
        self.push_freed(id, i);
        Some(id)
    }

    /// Remembers `id`, the allocation at ring index `i`, as freed.
    #[inline]
    pub(super) fn push_freed(&mut self, id: u64, i: usize) {
        let class = usize::from(self.ring_classes.get(i).copied().unwrap_or(0));
        let (Some(ids), Some(len)) = (self.freed.get_mut(class), self.freed_len.get_mut(class))
        else {
            return;
        };
        ids.copy_within(0..FREED_PER_CLASS - 1, 1);
        ids[0] = id;
        *len = (*len + 1).min(FREED_PER_CLASS as u8);
    }

    /// Encoder: the prediction for allocating `id` of `size`, updating the
    /// model.
    #[inline]
    pub(super) fn encode_alloc(&mut self, id: u64, size: u64) -> Prediction {
        let class = size_class(size);
        let found = match (self.freed.get(class), self.freed_len.get(class)) {
            (Some(ids), Some(&len)) => ids.iter().take(len as usize).position(|&f| f == id),
            _ => None,
        };
        let prediction = match found {
            Some(i) => {
                self.take_freed(class, i);
                Prediction::Code(i as u64 + 1)
            }
            None => match self.find_free(id) {
                Some(age) => Prediction::Code(FREED_PER_CLASS as u64 + age),
                None => {
                    let raw = zigzag(id.wrapping_sub(self.last_escaped_alloc) as i64);
                    self.last_escaped_alloc = id;
                    Prediction::Escape(raw)
                }
            },
        };
        self.allocated(id, size);
        prediction
    }

    /// Decoder: the ID of an allocation of `size` from its code, or from
    /// its escape value when the code is 0; updates the model.
    #[inline]
    pub(super) fn decode_alloc(&mut self, code: u64, escape: u64, size: u64) -> Option<u64> {
        let id = if code == 0 {
            let id = self
                .last_escaped_alloc
                .wrapping_add(unzigzag(escape) as u64);
            self.last_escaped_alloc = id;
            id
        } else if code > FREED_PER_CLASS as u64 {
            let age = code - FREED_PER_CLASS as u64;
            if age > FREE_RING as u64 || age > self.frees {
                return None;
            }
            *self
                .free_ring
                .get(((self.frees - age) as usize) & (FREE_RING - 1))?
        } else {
            let class = size_class(size);
            let i = (code - 1) as usize;
            if i >= usize::from(*self.freed_len.get(class)?) {
                return None;
            }
            let id = *self.freed.get(class)?.get(i)?;
            self.take_freed(class, i);
            id
        };
        self.allocated(id, size);
        Some(id)
    }

    #[inline]
    pub(super) fn take_freed(&mut self, class: usize, i: usize) {
        if let (Some(ids), Some(len)) = (self.freed.get_mut(class), self.freed_len.get_mut(class)) {
            if i < FREED_PER_CLASS {
                ids.copy_within(i + 1.., i);
            }
            *len = len.saturating_sub(1);
        }
    }
}
