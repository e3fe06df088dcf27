//! One record on disk, and reading a segment's records back.
//!
//! A record is a 24-byte header and its body:
//!
//! ```text
//! len u32 LE | crc32c u32 LE | offset u64 LE | append_ms i64 LE | body (len & 0x7fff_ffff bytes)
//! ```
//!
//! The body is the payload, or, when the length's top bit is set (a
//! *tagged* record), a 16-byte tag and then the payload. A tag says which
//! request appended the record (the server tags the records of a POST that
//! carries an `Idempotency-Key`), so that after a crash the records of a
//! request cut short are found by their tag, not by their bytes. Records
//! written before tags existed have the top bit clear and read as before.
//!
//! The checksum covers `offset`, `append_ms` and the body (and, for a
//! tagged record, the length word too, so that a flipped tag bit is
//! caught), so a record that was torn, overwritten or moved is caught, and
//! so is a record whose offset is not the one its place in the partition
//! says.

pub(crate) const HEADER: usize = 24;

/// The length of a record's tag.
pub const TAG: usize = 16;

/// The length word's bit that marks a tagged record.
const TAGGED: u32 = 1 << 31;

/// The body's length that a record's length word gives.
pub(crate) fn body_len(word: [u8; 4]) -> usize {
    (u32::from_le_bytes(word) & !TAGGED) as usize
}

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
    /// The tag of the request that appended it, if it had one.
    pub tag: Option<[u8; TAG]>,
}

pub(crate) fn encode(offset: u64, append_ms: i64, payload: &[u8], tag: Option<&[u8; TAG]>, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER]);
    if let Some(tag) = tag {
        out.extend_from_slice(tag);
    }
    out.extend_from_slice(payload);
    let body = out.len() - start - HEADER;
    let word = body as u32 | if tag.is_some() { TAGGED } else { 0 };
    let crc = checksum(word, offset, append_ms, &out[start + HEADER..]);
    out[start..start + 4].copy_from_slice(&word.to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    out[start + 8..start + 16].copy_from_slice(&offset.to_le_bytes());
    out[start + 16..start + HEADER].copy_from_slice(&append_ms.to_le_bytes());
}

fn checksum(word: u32, offset: u64, append_ms: i64, body: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&offset.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &append_ms.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, body);
    if word & TAGGED != 0 {
        crc32c::crc32c_append(crc, &word.to_le_bytes())
    } else {
        crc
    }
}

/// What is at one position of a segment's bytes.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed<'a> {
    /// A whole, valid record and its length on disk.
    Record { offset: u64, append_ms: i64, payload: &'a [u8], tag: Option<&'a [u8; TAG]>, size: usize },
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
    let word = u32::from_le_bytes(bytes[0..4].try_into().unwrap_or_default());
    let len = (word & !TAGGED) as usize;
    let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default());
    let offset = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default());
    let append_ms = i64::from_le_bytes(bytes[16..24].try_into().unwrap_or_default());
    if len > RECORD_MAX {
        return Parsed::Bad("a length larger than any record");
    }
    let Some(body) = bytes.get(HEADER..HEADER + len) else { return Parsed::Short };
    if checksum(word, offset, append_ms, body) != crc {
        return Parsed::Bad("a checksum that does not match");
    }
    let (tag, payload) = if word & TAGGED == 0 {
        (None, body)
    } else {
        match body.split_first_chunk::<TAG>() {
            Some((tag, payload)) => (Some(tag), payload),
            None => return Parsed::Bad("a tagged record shorter than its tag"),
        }
    };
    Parsed::Record { offset, append_ms, payload, tag, size: HEADER + len }
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
        encode(7, 1_000, b"{\"a\":1}", None, &mut bytes);
        encode(8, 1_001, b"", None, &mut bytes);
        let Parsed::Record { offset, append_ms, payload, tag, size } = parse(&bytes) else { panic!("not a record") };
        assert_eq!((offset, append_ms, payload, tag, size), (7, 1_000, &b"{\"a\":1}"[..], None, 31));
        assert!(matches!(parse(&bytes[31..]), Parsed::Record { offset: 8, size: 24, .. }));
        assert_eq!(parse(&bytes[..30]), Parsed::Short);
        let mut flipped = bytes.clone();
        flipped[26] ^= 1;
        assert_eq!(parse(&flipped), Parsed::Bad("a checksum that does not match"));
        assert!(any_record_from(&flipped, 8));
        assert!(!any_record_from(&flipped, 9));
        assert!(!any_record_from(&bytes[..40], 8));
    }

    #[test]
    fn a_tagged_record_reads_back_its_tag_and_a_flipped_tag_bit_is_caught() {
        let tag = [9u8; TAG];
        let mut bytes = Vec::new();
        encode(3, 5, b"{}", Some(&tag), &mut bytes);
        encode(4, 6, b"{}", None, &mut bytes);
        let Parsed::Record { offset, payload, tag: read, size, .. } = parse(&bytes) else { panic!("not a record") };
        assert_eq!((offset, payload, read, size), (3, &b"{}"[..], Some(&tag), HEADER + TAG + 2));
        assert!(matches!(parse(&bytes[size..]), Parsed::Record { offset: 4, tag: None, .. }));
        let mut flipped = bytes.clone();
        flipped[3] ^= 0x80;
        assert_eq!(parse(&flipped), Parsed::Bad("a checksum that does not match"));
        let mut untagged = bytes[size..].to_vec();
        untagged[3] ^= 0x80;
        assert!(matches!(parse(&untagged), Parsed::Bad(_)));
    }
}
