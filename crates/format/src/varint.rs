//! LEB128 varints and zigzag deltas, the integers of every payload.

/// Most bytes a LEB128 varint of a u64 takes.
pub const MAX_VARINT_LEN: usize = 10;

/// Writes `v` as a LEB128 varint at `buf[pos..]` and returns the position
/// after it.
///
/// The caller guarantees `buf.len() - pos >= MAX_VARINT_LEN`; the writer
/// reserves room for a whole event before encoding it. Out-of-room writes
/// are cut short rather than panicking.
#[inline(always)]
pub fn put_uvarint(buf: &mut [u8], mut pos: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        if let Some(b) = buf.get_mut(pos) {
            *b = (v as u8) | 0x80;
        }
        v >>= 7;
        pos += 1;
    }
    if let Some(b) = buf.get_mut(pos) {
        *b = v as u8;
    }
    pos + 1
}

/// Appends `v` to `out` as a LEB128 varint (for bodies built in a `Vec`:
/// the writer thread's tables and snapshots, tests).
pub fn push_uvarint(out: &mut alloc::vec::Vec<u8>, v: u64) {
    let mut tmp = [0u8; MAX_VARINT_LEN];
    let n = put_uvarint(&mut tmp, 0, v);
    out.extend_from_slice(&tmp[..n]);
}

/// Number of bytes `v` takes as a varint.
#[inline]
pub const fn uvarint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Why a varint could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VarintError {
    /// The input ended inside the varint.
    Truncated,
    /// More than ten bytes, or a tenth byte above 1: not a u64.
    Overflow,
}

/// Reads a LEB128 varint from `buf[*pos..]`, advancing `*pos` past it.
#[inline]
pub fn get_uvarint(buf: &[u8], pos: &mut usize) -> Result<u64, VarintError> {
    let mut v: u64 = 0;
    let mut shift = 0u32;
    let mut i = *pos;
    loop {
        let Some(&b) = buf.get(i) else {
            return Err(VarintError::Truncated);
        };
        i += 1;
        if shift == 63 && b > 1 {
            return Err(VarintError::Overflow);
        }
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            *pos = i;
            return Ok(v);
        }
        shift += 7;
        if shift > 63 {
            return Err(VarintError::Overflow);
        }
    }
}

/// Zigzag-encodes a signed delta so small magnitudes of either sign give
/// small varints.
#[inline(always)]
pub const fn zigzag(delta: i64) -> u64 {
    ((delta << 1) ^ (delta >> 63)) as u64
}

/// Inverse of [`zigzag`].
#[inline(always)]
pub const fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip_at_boundaries() {
        let values = [
            0u64,
            1,
            127,
            128,
            255,
            16383,
            16384,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &v in &values {
            let mut buf = [0u8; MAX_VARINT_LEN];
            let end = put_uvarint(&mut buf, 0, v);
            assert_eq!(end, uvarint_len(v), "length of {v}");
            let mut pos = 0;
            assert_eq!(get_uvarint(&buf[..end], &mut pos), Ok(v));
            assert_eq!(pos, end);
        }
    }

    #[test]
    fn varint_rejects_truncation_and_overflow() {
        let mut pos = 0;
        assert_eq!(
            get_uvarint(&[0x80, 0x80], &mut pos),
            Err(VarintError::Truncated)
        );
        let eleven = [0xffu8; 11];
        let mut pos = 0;
        assert_eq!(get_uvarint(&eleven, &mut pos), Err(VarintError::Overflow));
        let tenth_too_big = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
        let mut pos = 0;
        assert_eq!(
            get_uvarint(&tenth_too_big, &mut pos),
            Err(VarintError::Overflow)
        );
        assert_eq!(pos, 0, "position must not move on error");
    }

    #[test]
    fn short_buffer_write_does_not_panic() {
        let mut buf = [0u8; 2];
        assert_eq!(put_uvarint(&mut buf, 1, u64::MAX), 11);
    }
}
