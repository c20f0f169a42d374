//! The page tracer's packed 8-byte words (batch kind [`BatchKind::Pages`](crate::BatchKind::Pages)),
//! after the Go runtime's page tracer, with the bit split derived from the
//! page shift instead of fixed for 8 KiB pages. docs/FORMAT.md section 7.
//!
//! An event word, for page shift `s`:
//! `[16 time delta][48 - s base >> s][s - 3 npages][1 large][2 kind]`.
//! The low `s` bits of a page-aligned base are zero, which is what makes
//! room for kind, large and npages. A sync word (kind 0) is
//! `[60 payload][2 subtype][2 kind = 0]`.

/// Word kinds (the low two bits).
pub const KIND_SYNC: u64 = 0;
/// Pages allocated.
pub const KIND_ALLOC: u64 = 1;
/// Pages freed.
pub const KIND_FREE: u64 = 2;
/// Pages scavenged (returned to the OS).
pub const KIND_SCAV: u64 = 3;

/// Sync subtype: payload is the new time base in units (ticks >> lost bits).
pub const SYNC_TIME: u64 = 0;
/// Sync subtype: payload is the trace thread ID of the writer.
pub const SYNC_THREAD: u64 = 1;
/// Sync subtype: payload is the layout: `page_shift | lost_bits << 6`.
pub const SYNC_LAYOUT: u64 = 2;
/// Sync subtype: a long-form event: payload is `kind | delta << 2`, and
/// two more words follow: the full base address and the full npages.
pub const SYNC_LONG_EVENT: u64 = 3;

/// Bits of address space a short event word covers (user space on
/// x86-64 and arm64); bases at or above 2^48 take the long form.
pub const ADDRESS_BITS: u32 = 48;
/// Bits of the time delta in an event word.
pub const DELTA_BITS: u32 = 16;
/// Low tick bits dropped from page-event times, as in the Go tracer.
pub const TIME_LOST_BITS: u32 = 7;
/// Smallest page shift with room for kind, large and one npages bit.
pub const MIN_PAGE_SHIFT: u32 = 4;
/// Largest page shift accepted.
pub const MAX_PAGE_SHIFT: u32 = 40;

/// How a pages batch packs its words; written in its first word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// log2 of the page size.
    pub page_shift: u32,
    /// Low tick bits dropped from times.
    pub lost_bits: u32,
}

impl Layout {
    /// Bits of the npages field.
    pub const fn npages_bits(self) -> u32 {
        self.page_shift - 3
    }

    /// Whether an event fits a short word: base page-aligned and below
    /// 2^48. npages that do not fit go in a second word ("large").
    pub const fn fits(self, base: u64) -> bool {
        base & ((1u64 << self.page_shift) - 1) == 0 && base >> ADDRESS_BITS == 0
    }

    /// Whether npages needs the large form.
    pub const fn is_large(self, npages: u64) -> bool {
        npages >> self.npages_bits() != 0
    }

    /// The layout sync word.
    pub const fn word(self) -> u64 {
        sync_word(
            SYNC_LAYOUT,
            self.page_shift as u64 | (self.lost_bits as u64) << 6,
        )
    }

    /// Parses a layout payload, or `None` if out of range.
    pub const fn from_payload(payload: u64) -> Option<Layout> {
        let page_shift = (payload & 0x3f) as u32;
        let lost_bits = ((payload >> 6) & 0x3f) as u32;
        if payload >> 12 != 0
            || page_shift < MIN_PAGE_SHIFT
            || page_shift > MAX_PAGE_SHIFT
            || lost_bits > 32
        {
            return None;
        }
        Some(Layout {
            page_shift,
            lost_bits,
        })
    }

    /// A short event word. The caller checked [`Layout::fits`] and that
    /// `delta < 2^DELTA_BITS`; for a large event it writes npages in the
    /// next word and this word's npages field is 0.
    pub const fn event_word(self, kind: u64, base: u64, npages: u64, delta: u64) -> u64 {
        let (large, np) = if self.is_large(npages) {
            (1, 0)
        } else {
            (0, npages)
        };
        base | kind | large << 2 | np << 3 | delta << (64 - DELTA_BITS)
    }
}

/// A sync word.
pub const fn sync_word(subtype: u64, payload: u64) -> u64 {
    payload << 4 | subtype << 2 | KIND_SYNC
}

/// One decoded word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Word {
    /// A sync word: subtype and 60-bit payload.
    Sync { subtype: u64, payload: u64 },
    /// A short event word. With `large`, npages is in the next word.
    Event {
        kind: u64,
        base: u64,
        npages: u64,
        large: bool,
        delta: u64,
    },
}

/// Decodes a word under `layout`.
pub const fn decode(layout: Layout, w: u64) -> Word {
    let kind = w & 3;
    if kind == KIND_SYNC {
        return Word::Sync {
            subtype: (w >> 2) & 3,
            payload: w >> 4,
        };
    }
    let address_mask = ((1u64 << ADDRESS_BITS) - 1) & !((1u64 << layout.page_shift) - 1);
    Word::Event {
        kind,
        base: w & address_mask,
        npages: (w >> 3) & ((1u64 << layout.npages_bits()) - 1),
        large: (w >> 2) & 1 == 1,
        delta: w >> (64 - DELTA_BITS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_split_for_8k_pages() {
        // Go's layout: 35 address bits, 10 npages bits for 8 KiB pages.
        let l = Layout {
            page_shift: 13,
            lost_bits: TIME_LOST_BITS,
        };
        assert_eq!(l.npages_bits(), 10);
        assert_eq!(ADDRESS_BITS - l.page_shift, 35);
        let w = l.event_word(KIND_ALLOC, 0x7f00_1234_e000, 1023, 0xffff);
        assert_eq!(
            decode(l, w),
            Word::Event {
                kind: KIND_ALLOC,
                base: 0x7f00_1234_e000,
                npages: 1023,
                large: false,
                delta: 0xffff
            }
        );
        assert!(l.is_large(1024));
    }

    #[test]
    fn layout_word_round_trip_and_limits() {
        let l = Layout {
            page_shift: 12,
            lost_bits: 7,
        };
        match decode(l, l.word()) {
            Word::Sync {
                subtype: SYNC_LAYOUT,
                payload,
            } => assert_eq!(Layout::from_payload(payload), Some(l)),
            other => panic!("{other:?}"),
        }
        assert_eq!(Layout::from_payload(3), None);
        assert_eq!(Layout::from_payload(41), None);
        assert!(!l.fits(0x1001));
        assert!(!l.fits(1 << 48));
        assert!(l.fits((1 << 48) - 4096));
    }
}
