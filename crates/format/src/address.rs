//! Addresses as compressed IDs, `(addr - min) / align` by address class,
//! and the per-batch deltas between them (FORMAT.md section 3).

use crate::varint::{unzigzag, zigzag};

/// What an event's first argument identifies, and so which alignment its ID
/// is compressed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddressClass {
    /// IDs are `(base - min_heap_addr) / page_size`.
    Span,
    /// IDs are `(addr - min_heap_addr) / min_heap_align`.
    HeapObject,
    /// IDs are `(base - min_heap_addr) / min_stack_align`.
    Stack,
    /// Not an address.
    Raw,
}

impl AddressClass {
    /// The class's index in a batch's previous IDs ([`IdDeltas`]: span 0,
    /// heap object 1, stack 2), or `None` for [`AddressClass::Raw`], whose
    /// arguments are not deltas.
    pub const fn delta_index(self) -> Option<usize> {
        match self {
            AddressClass::Span => Some(0),
            AddressClass::HeapObject => Some(1),
            AddressClass::Stack => Some(2),
            AddressClass::Raw => None,
        }
    }
}

/// The previous short-form ID of each address class within one compact
/// events batch: the base its next ID is a delta from. Starts at 0 in every
/// batch; long-form events neither use nor change it.
/// One `[u64; 3]` in memory, indexed span, heap object, stack (the C
/// header's inline event path writes it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct IdDeltas {
    prev: [u64; 3],
}

impl IdDeltas {
    #[inline(always)]
    const fn index(class: AddressClass) -> Option<usize> {
        class.delta_index()
    }

    /// Writer: the argument to write for `id`, remembering it.
    #[inline(always)]
    pub fn encode(&mut self, class: AddressClass, id: u64) -> u64 {
        match Self::index(class) {
            Some(i) => {
                let delta = id.wrapping_sub(self.prev[i]) as i64;
                self.prev[i] = id;
                zigzag(delta)
            }
            None => id,
        }
    }

    /// Reader: the ID for a written argument, remembering it.
    #[inline(always)]
    pub fn decode(&mut self, class: AddressClass, arg: u64) -> u64 {
        match Self::index(class) {
            Some(i) => {
                let id = self.prev[i].wrapping_add(unzigzag(arg) as u64);
                self.prev[i] = id;
                id
            }
            None => arg,
        }
    }
}

/// log2 of a power of two; `None` for anything else.
#[inline]
pub const fn exact_log2(v: u64) -> Option<u32> {
    if v != 0 && v & (v - 1) == 0 {
        Some(v.trailing_zeros())
    } else {
        None
    }
}

/// Compresses an address into an ID: `(addr - min) / align`, or `None` when
/// that would not be exact (address below `min`, or off the alignment). The
/// caller then writes the event in [`LONG_FORM`](crate::LONG_FORM). `align_shift` is log2 of
/// the alignment.
#[inline(always)]
pub const fn compress_address(addr: u64, min: u64, align_shift: u32) -> Option<u64> {
    if addr < min {
        return None;
    }
    let off = addr - min;
    if off & ((1u64 << align_shift) - 1) != 0 {
        return None;
    }
    Some(off >> align_shift)
}

/// Restores an address from an ID. Wraps instead of overflowing, so a
/// corrupt ID gives a wrong address, never a panic.
#[inline]
pub const fn restore_address(id: u64, min: u64, align_shift: u32) -> u64 {
    min.wrapping_add(id.wrapping_shl(align_shift))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::varint::{unzigzag, zigzag};

    #[test]
    fn zigzag_and_id_deltas_round_trip() {
        for d in [0i64, 1, -1, 63, -64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(d)), d);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
        let ids = [
            (AddressClass::HeapObject, 1000u64),
            (AddressClass::Span, 5),
            (AddressClass::HeapObject, 998),
            (AddressClass::HeapObject, u64::MAX),
            (AddressClass::Raw, 77),
            (AddressClass::HeapObject, 0),
        ];
        let (mut w, mut r) = (IdDeltas::default(), IdDeltas::default());
        for (class, id) in ids {
            let arg = w.encode(class, id);
            assert_eq!(r.decode(class, arg), id);
        }
        let mut w = IdDeltas::default();
        w.encode(AddressClass::HeapObject, 1000);
        assert_eq!(
            w.encode(AddressClass::HeapObject, 998),
            3,
            "-2 zigzags to 3"
        );
    }

    #[test]
    fn address_compression() {
        assert_eq!(compress_address(0x1010, 0x1000, 4), Some(1));
        assert_eq!(compress_address(0x1008, 0x1000, 4), None, "off alignment");
        assert_eq!(compress_address(0x0ff0, 0x1000, 4), None, "below min");
        assert_eq!(restore_address(1, 0x1000, 4), 0x1010);
        assert_eq!(exact_log2(4096), Some(12));
        assert_eq!(exact_log2(3), None);
        assert_eq!(exact_log2(0), None);
    }
}
