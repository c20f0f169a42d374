//! Checksums: the CRC32C trailer after every batch (version 2 on) and in
//! the file header (FORMAT.md section 2).

/// Size of the checksum trailer after every batch of a version-2 or 3 file
/// (FORMAT.md section 2): the batch's CRC32C, u32 LE. Batches inside a
/// compressed batch have none.
pub const TRAILER_LEN: usize = 4;

/// Whether the batches of a file of `version` carry trailers.
pub const fn has_trailers(version: u16) -> bool {
    version >= 2
}

/// The CRC32C (Castagnoli) of `parts`, one after the other: a batch's
/// checksum is that of its kind byte, payload length and payload
/// (FORMAT.md section 2), a version-2 header's that of its first 12 bytes.
/// Hardware-accelerated where the CPU has it (SSE 4.2, ARMv8 CRC).
pub fn batch_checksum(parts: &[&[u8]]) -> u32 {
    parts
        .iter()
        .fold(0, |crc, part| crc32c::crc32c_append(crc, part))
}
