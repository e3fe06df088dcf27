//! One record on disk, and reading a segment's records back.
//!
//! A record is a 24-byte header and the payload:
//!
//! ```text
//! len u32 LE | crc32c u32 LE | offset u64 LE | append_ms i64 LE | payload (len bytes)
//! ```
//!
//! The checksum covers `offset`, `append_ms` and the payload, so a record
//! that was torn, overwritten or moved is caught, and so is a record whose
//! offset is not the one its place in the partition says.

pub(crate) const HEADER: usize = 24;

/// A record no larger than this is accepted (the server's per-event limit is
/// far lower); a larger length in a header is damage, not a record.
pub const RECORD_MAX: usize = 64 << 20;

/// A record read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub partition: u32,
    pub offset: u64,
    /// When the log appended it (milliseconds since the Unix epoch).
    pub append_ms: i64,
    pub payload: Vec<u8>,
}

pub(crate) fn encode(offset: u64, append_ms: i64, payload: &[u8], out: &mut Vec<u8>) {
    let crc = checksum(offset, append_ms, payload);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&append_ms.to_le_bytes());
    out.extend_from_slice(payload);
}

fn checksum(offset: u64, append_ms: i64, payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&offset.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &append_ms.to_le_bytes());
    crc32c::crc32c_append(crc, payload)
}

/// What is at one position of a segment's bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed<'a> {
    /// A whole, valid record and its length on disk.
    Record { offset: u64, append_ms: i64, payload: &'a [u8], size: usize },
    /// The bytes end before the record does.
    Short,
    /// A header or checksum that does not hold.
    Bad(&'static str),
}

/// Parses the record at the start of `bytes`.
pub(crate) fn parse(bytes: &[u8]) -> Parsed<'_> {
    if bytes.len() < HEADER {
        return Parsed::Short;
    }
    let len = u32::from_le_bytes(bytes[0..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default());
    let offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
    let append_ms = i64::from_le_bytes(bytes[16..24].try_into().unwrap_or_default());
    if len > RECORD_MAX {
        return Parsed::Bad("a length larger than any record");
    }
    let Some(payload) = bytes.get(HEADER..HEADER + len) else { return Parsed::Short };
    if checksum(offset, append_ms, payload) != crc {
        return Parsed::Bad("a checksum that does not match");
    }
    Parsed::Record { offset, append_ms, payload, size: HEADER + len }
}

/// Whether a valid record with an offset of at least `from` starts anywhere
/// in `bytes` after its first byte: tells damage followed by good data
/// (corruption) from a torn tail.
pub(crate) fn any_record_from(bytes: &[u8], from: u64) -> bool {
    (1..bytes.len()).any(|at| {
        let rest = &bytes[at..];
        // Cheap filter first: the offset field must be a plausible offset.
        rest.len() >= HEADER
            && u64::from_le_bytes(rest[8..16].try_into().unwrap_or_default())
                .checked_sub(from)
                .is_some_and(|d| d <= bytes.len() as u64)
            && matches!(parse(rest), Parsed::Record { offset, .. } if offset >= from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let mut bytes = Vec::new();
        encode(7, 1_000, b"{\"a\":1}", &mut bytes);
        encode(8, 1_001, b"", &mut bytes);
        let Parsed::Record { offset, append_ms, payload, size } = parse(&bytes) else { panic!("not a record") };
        assert_eq!((offset, append_ms, payload, size), (7, 1_000, &b"{\"a\":1}"[..], 31));
        assert!(matches!(parse(&bytes[31..]), Parsed::Record { offset: 8, size: 24, .. }));
        assert_eq!(parse(&bytes[..30]), Parsed::Short);
        let mut flipped = bytes.clone();
        flipped[26] ^= 1;
        assert_eq!(parse(&flipped), Parsed::Bad("a checksum that does not match"));
        assert!(any_record_from(&flipped, 8));
        assert!(!any_record_from(&flipped, 9));
        assert!(!any_record_from(&bytes[..40], 8));
    }
}
