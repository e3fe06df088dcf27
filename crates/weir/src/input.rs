//! Reading JSON-lines input with a bound on memory: a line longer than the
//! limit is measured and skipped, keeping only its first bytes.

use std::io::{self, BufRead};

pub struct Lines<R> {
    reader: R,
    buf: Vec<u8>,
    limit: usize,
    line_no: u64,
    /// Bytes of the reader's buffer handed out by the last call, consumed on the next.
    pending: usize,
}

/// One line: its 1-based number and its bytes, without the newline and a
/// trailing `\r` (cut past the limit, so a line over the limit still shows as
/// over it).
pub struct Line<'a> {
    pub number: u64,
    pub bytes: &'a [u8],
}

impl<R: BufRead> Lines<R> {
    pub fn new(reader: R, limit: usize) -> Lines<R> {
        Lines { reader, buf: Vec::new(), limit, line_no: 0, pending: 0 }
    }

    pub fn next_line(&mut self) -> io::Result<Option<Line<'_>>> {
        if self.pending > 0 {
            self.reader.consume(self.pending);
            self.pending = 0;
        }
        // Fast path: the whole line is in the reader's buffer; hand it out without a copy.
        let whole = {
            let chunk = self.reader.fill_buf()?;
            memchr::memchr(b'\n', chunk).filter(|&at| at <= self.limit + 1)
        };
        if let Some(at) = whole {
            let chunk = self.reader.fill_buf()?;
            let mut bytes = &chunk[..at];
            if let Some(stripped) = bytes.strip_suffix(b"\r") {
                bytes = stripped;
            }
            self.pending = at + 1;
            self.line_no += 1;
            return Ok(Some(Line { number: self.line_no, bytes }));
        }
        self.buf.clear();
        let mut any = false;
        let mut len = 0usize;
        loop {
            let chunk = self.reader.fill_buf()?;
            if chunk.is_empty() {
                break;
            }
            any = true;
            let (take, done) = match memchr::memchr(b'\n', chunk) {
                Some(at) => (at, true),
                None => (chunk.len(), false),
            };
            // Keep up to two bytes past the limit: a line over it still shows
            // as over it after a trailing `\r` is dropped.
            let room = (self.limit + 2).saturating_sub(self.buf.len());
            self.buf.extend_from_slice(&chunk[..take.min(room)]);
            len += take;
            self.reader.consume(if done { take + 1 } else { take });
            if done {
                break;
            }
        }
        if !any {
            return Ok(None);
        }
        if len == self.buf.len() && self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        self.line_no += 1;
        Ok(Some(Line { number: self.line_no, bytes: &self.buf }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_measures_and_bounds() {
        let text = b"{\"a\":1}\r\n\nxxxxxxxxxx\nlast";
        let mut lines = Lines::new(io::BufReader::with_capacity(3, &text[..]), 8);
        let mut got = Vec::new();
        while let Some(line) = lines.next_line().unwrap() {
            got.push((line.number, line.bytes.to_vec()));
        }
        assert_eq!(got[0], (1, b"{\"a\":1}".to_vec()));
        assert_eq!(got[1], (2, b"".to_vec()));
        assert!(got[2].0 == 3 && got[2].1.len() > 8 && got[2].1.iter().all(|&b| b == b'x'));
        assert_eq!(got[3], (4, b"last".to_vec()));
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn a_carriage_return_does_not_count_toward_the_limit() {
        for capacity in [2, 64] {
            let text = b"12345678\r\n123456789\r\n";
            let mut lines = Lines::new(io::BufReader::with_capacity(capacity, &text[..]), 8);
            assert_eq!(lines.next_line().unwrap().unwrap().bytes, b"12345678");
            assert!(lines.next_line().unwrap().unwrap().bytes.len() > 8);
            assert!(lines.next_line().unwrap().is_none());
        }
    }
}
