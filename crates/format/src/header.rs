//! The 16-byte file header: magic, version, flags and its checksum
//! (FORMAT.md section 1).

use crate::checksum::{batch_checksum, has_trailers};

/// The first eight bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"ALCTRACE";

/// The format version this crate writes: 6, version 5 with the sampling
/// fields (FORMAT.md section 9): `sample_bytes` at the end of the info
/// body, the exact totals and the sampled set's overflow at the end of the
/// generation-end body. A change that earlier readers would call malformed (a new
/// batch kind, a rule relaxed) bumps the version, so they refuse the file
/// by its version ("unsupported format version"), not as a damaged file.
pub const VERSION: u16 = 6;

/// The version with the stack tables listed as the generation goes
/// (call-stack nodes in any ID order, a module listed again with its
/// unload tick) and without the sampling fields: still read.
pub const VERSION_5: u16 = 5;

/// The version with the process batch and stack tables listed as a
/// generation ends: still read.
pub const VERSION_4: u16 = 4;

/// The first version, without trailers: still read.
pub const VERSION_1: u16 = 1;

/// The version with checksum trailers and without call stacks: still read.
pub const VERSION_2: u16 = 2;

/// The version with call stacks and without the process batch: still read.
pub const VERSION_3: u16 = 3;

/// The versions readers accept, oldest first.
pub const READABLE_VERSIONS: [u16; 6] = [
    VERSION_1, VERSION_2, VERSION_3, VERSION_4, VERSION_5, VERSION,
];

/// Header flag bit 0, **flight-recorder window**: the trace is a dump of
/// a flight recorder's ring (FORMAT.md section 1): its generations are the
/// last ones the tracer kept, not the whole run, so frees of objects
/// allocated before its first generation are expected, and what is live at
/// its end is what was allocated in the window and not freed. Readers that
/// do not know the flag ignore it (every version's readers ignore flags).
pub const FLAG_FLIGHT_WINDOW: u16 = 1;

/// Size of the file header in bytes: magic, version u16 LE, flags u16 LE,
/// then a u32: zero in version 1, the header's CRC32C from version 2 on.
pub const FILE_HEADER_LEN: usize = 16;

/// The fields of the file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// Format version.
    pub version: u16,
    /// Flags: [`FLAG_FLIGHT_WINDOW`], or 0; readers ignore bits they do
    /// not know.
    pub flags: u16,
}

impl FileHeader {
    /// The header bytes for this version: in version 2 its last four bytes
    /// are the CRC32C of the first twelve, in version 1 zero.
    pub fn encode(self) -> [u8; FILE_HEADER_LEN] {
        let v = self.version.to_le_bytes();
        let f = self.flags.to_le_bytes();
        let m = MAGIC;
        let mut h = [
            m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], v[0], v[1], f[0], f[1], 0, 0, 0, 0,
        ];
        if has_trailers(self.version) {
            let crc = batch_checksum(&[&h[..12]]);
            h[12..].copy_from_slice(&crc.to_le_bytes());
        }
        h
    }

    /// Parses a header, saying what is wrong with a bad one.
    pub fn decode(bytes: &[u8; FILE_HEADER_LEN]) -> Result<FileHeader, HeaderError> {
        if bytes[..8] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if !READABLE_VERSIONS.contains(&version) {
            return Err(HeaderError::UnsupportedVersion(version));
        }
        let stored = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        // Version 1 writers left the last four bytes zero: refusing
        // anything else catches the one bit flip that turns version 3
        // into 1 (and so would skip every checksum).
        let expected = if has_trailers(version) {
            batch_checksum(&[&bytes[..12]])
        } else {
            0
        };
        if stored != expected {
            return Err(HeaderError::BadChecksum);
        }
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        Ok(FileHeader { version, flags })
    }
}

/// What is wrong with a file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// The file does not start with [`MAGIC`]: not an alloctrace trace.
    BadMagic,
    /// A version this reader does not know.
    UnsupportedVersion(u16),
    /// A version-2 or 3 header whose checksum does not match its first 12
    /// bytes, or a version-1 header whose reserved last four bytes are not
    /// zero.
    BadChecksum,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::batch_checksum;

    #[test]
    fn header_round_trip_and_errors() {
        let h = FileHeader {
            version: VERSION,
            flags: 0,
        };
        let bytes = h.encode();
        assert_eq!(FileHeader::decode(&bytes), Ok(h));
        let mut bad = bytes;
        bad[0] = b'X';
        assert_eq!(FileHeader::decode(&bad), Err(HeaderError::BadMagic));
        let mut v7 = bytes;
        v7[8] = 7;
        assert_eq!(
            FileHeader::decode(&v7),
            Err(HeaderError::UnsupportedVersion(7))
        );
        let v5 = FileHeader {
            version: VERSION_5,
            flags: 0,
        };
        assert_eq!(FileHeader::decode(&v5.encode()), Ok(v5));
        let window = FileHeader {
            version: VERSION,
            flags: FLAG_FLIGHT_WINDOW,
        };
        assert_eq!(FileHeader::decode(&window.encode()), Ok(window));
        let v4 = FileHeader {
            version: VERSION_4,
            flags: 0,
        };
        assert_eq!(FileHeader::decode(&v4.encode()), Ok(v4));
        let v3 = FileHeader {
            version: VERSION_3,
            flags: 0,
        };
        assert_eq!(FileHeader::decode(&v3.encode()), Ok(v3));
        let v2 = FileHeader {
            version: VERSION_2,
            flags: 0,
        };
        assert_eq!(FileHeader::decode(&v2.encode()), Ok(v2));
        let v1 = FileHeader {
            version: VERSION_1,
            flags: 0,
        };
        assert_eq!(
            &v1.encode()[12..],
            &[0; 4],
            "version 1 keeps its reserved bytes zero"
        );
        assert_eq!(FileHeader::decode(&v1.encode()), Ok(v1));
        for bit in 0..FILE_HEADER_LEN * 8 {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                FileHeader::decode(&flipped).is_err(),
                "bit {bit} of a version-4 header"
            );
        }
    }

    #[test]
    fn checksum_is_crc32c() {
        // The check value of CRC-32C (RFC 3720, B.4): "123456789".
        assert_eq!(batch_checksum(&[b"123456789"]), 0xe306_9283);
        assert_eq!(batch_checksum(&[b"1234", b"", b"56789"]), 0xe306_9283);
        assert_eq!(batch_checksum(&[]), 0);
        // FORMAT.md's examples.
        let header = FileHeader {
            version: 2,
            flags: 0,
        }
        .encode();
        assert_eq!(&header[8..], &[2, 0, 0, 0, 0xcb, 0xe9, 0x46, 0x9c]);
        let header = FileHeader {
            version: 3,
            flags: 0,
        }
        .encode();
        assert_eq!(&header[8..], &[3, 0, 0, 0, 0x73, 0x43, 0x03, 0x41]);
        let header = FileHeader {
            version: 4,
            flags: 0,
        }
        .encode();
        assert_eq!(&header[8..], &[4, 0, 0, 0, 0xb9, 0xfb, 0x03, 0x58]);
        assert_eq!(batch_checksum(&[&[5, 3, 0, 0, 0, 1, 0, 0]]), 0xf94d_aae6);
        // The process batch of section 11: `ls -l`.
        let process = [13, 11, 0, 0, 0, 1, 0, 0, 0, 2, 2, b'l', b's', 2, b'-', b'l'];
        assert_eq!(batch_checksum(&[&process]), 0xdbf5_a04c);
    }
}
