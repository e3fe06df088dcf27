//! Reading JSON-lines input with a bound on memory: a line longer than the
//! limit is measured and skipped, keeping only its first bytes.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Seek, SeekFrom};
use std::path::Path;

use weir_engine::Recall;

pub struct Lines<R> {
    reader: R,
    buf: Vec<u8>,
    limit: usize,
    line_no: u64,
    /// Bytes of the reader's buffer handed out by the last call, consumed on the next.
    pending: usize,
    /// Where the next line starts, in bytes from where the reader started.
    pos: u64,
}

/// One line: its 1-based number and its bytes, without the newline and a
/// trailing `\r` (cut past the limit, so a line over the limit still shows as
/// over it).
pub struct Line<'a> {
    pub number: u64,
    pub bytes: &'a [u8],
    /// Where the line starts, in bytes from where the reader started.
    pub at: u64,
}

impl<R: BufRead> Lines<R> {
    pub fn new(reader: R, limit: usize) -> Lines<R> {
        Lines::from_line(reader, limit, 1, 0)
    }

    /// Lines of a reader placed at byte `at` of its input, where line `number` starts.
    pub fn from_line(reader: R, limit: usize, number: u64, at: u64) -> Lines<R> {
        Lines { reader, buf: Vec::new(), limit, line_no: number.saturating_sub(1), pending: 0, pos: at }
    }

    pub fn next_line(&mut self) -> io::Result<Option<Line<'_>>> {
        if self.pending > 0 {
            self.reader.consume(self.pending);
            self.pending = 0;
        }
        let at = self.pos;
        // Fast path: the whole line is in the reader's buffer; hand it out without a copy.
        let whole = {
            let chunk = self.reader.fill_buf()?;
            memchr::memchr(b'\n', chunk).filter(|&at| at <= self.limit + 1)
        };
        if let Some(end) = whole {
            let chunk = self.reader.fill_buf()?;
            let mut bytes = &chunk[..end];
            if let Some(stripped) = bytes.strip_suffix(b"\r") {
                bytes = stripped;
            }
            self.pending = end + 1;
            self.pos += end as u64 + 1;
            self.line_no += 1;
            return Ok(Some(Line { number: self.line_no, bytes, at }));
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
            let used = if done { take + 1 } else { take };
            self.reader.consume(used);
            self.pos += used as u64;
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
        Ok(Some(Line { number: self.line_no, bytes: &self.buf, at }))
    }
}

/// Reads a line of an input file back by its number: the engine's
/// [`Recall`] in `weir run` and `weir batch` (partition 0, the offset is the
/// line's number). It reads the file through its own handle, and finds a
/// line from where every [`MARK_EVERY`]th line starts, found as the file is
/// first read back that far: reading a line back reads at most that many
/// lines, and the file is scanned once over the whole run.
pub struct FileRecall {
    file: File,
    limit: usize,
    /// `marks[i]`: where line `i * MARK_EVERY + 1` starts.
    marks: Vec<u64>,
}

const MARK_EVERY: u64 = 64;

impl FileRecall {
    /// For a regular file only: another kind (a pipe, a terminal) cannot be
    /// read twice, and `None` says so.
    pub fn open(path: &Path, limit: usize) -> Option<FileRecall> {
        let file = File::open(path).ok()?;
        file.metadata().ok()?.is_file().then(|| FileRecall { file, limit, marks: vec![0] })
    }

    /// Lines from line `number`, which starts at byte `at`.
    fn lines_from(&self, number: u64, at: u64, buffer: usize) -> io::Result<Lines<BufReader<&File>>> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(at))?;
        Ok(Lines::from_line(BufReader::with_capacity(buffer, file), self.limit, number, at))
    }

    fn line(&mut self, number: u64) -> io::Result<Option<Vec<u8>>> {
        let Some(mark) = number.checked_sub(1).map(|n| (n / MARK_EVERY) as usize) else { return Ok(None) };
        if mark >= self.marks.len() {
            let from = (self.marks.len() as u64 - 1) * MARK_EVERY + 1;
            let last = self.marks[self.marks.len() - 1];
            let mut found = Vec::new();
            let mut lines = self.lines_from(from, last, 1 << 20)?;
            while found.len() + self.marks.len() <= mark {
                let Some(line) = lines.next_line()? else { break };
                if (line.number - 1) % MARK_EVERY == 0 && line.number > from {
                    found.push(line.at);
                }
            }
            drop(lines);
            self.marks.extend(found);
        }
        let Some(&at) = self.marks.get(mark) else { return Ok(None) };
        let mut lines = self.lines_from(mark as u64 * MARK_EVERY + 1, at, 1 << 14)?;
        while let Some(line) = lines.next_line()? {
            if line.number == number {
                return Ok(Some(line.bytes.to_vec()));
            }
        }
        Ok(None)
    }
}

impl Recall for FileRecall {
    fn recall(&mut self, partition: u32, offset: u64) -> Result<String, String> {
        if partition != 0 {
            return Err(format!("a file has no partition {partition}"));
        }
        match self.line(offset) {
            Ok(Some(bytes)) => String::from_utf8(bytes).map_err(|_| format!("line {offset} is not UTF-8 text")),
            Ok(None) => Err(format!("the input has no line {offset}")),
            Err(e) => Err(format!("cannot read line {offset} of the input: {e}")),
        }
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
    fn a_file_gives_back_each_line_by_its_number_in_any_order() {
        let mut text = Vec::new();
        for i in 0..300u64 {
            match i % 7 {
                0 => text.extend_from_slice(format!("{{\"i\":{i}}}\r\n").as_bytes()),
                1 => text.extend_from_slice(b"\n"),
                2 => text.extend_from_slice(format!("{}\n", "x".repeat(40 + i as usize)).as_bytes()),
                _ => text.extend_from_slice(format!("line {i} \u{e9}\n").as_bytes()),
            }
        }
        text.extend_from_slice(b"last, without a newline");
        let path = std::env::temp_dir().join(format!("weir-recall-{}.jsonl", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let limit = 200;
        let mut all = Vec::new();
        let mut lines = Lines::new(io::BufReader::with_capacity(16, &text[..]), limit);
        while let Some(line) = lines.next_line().unwrap() {
            assert_eq!(
                &text[line.at as usize..line.at as usize + line.bytes.len()],
                line.bytes,
                "line {}",
                line.number
            );
            all.push(String::from_utf8(line.bytes.to_vec()).unwrap());
        }
        assert_eq!(all.len(), 301);
        let mut recall = FileRecall::open(&path, limit).unwrap();
        // Far ahead first, then back, then each in an order that jumps about.
        let order = [301u64, 1, 65, 64, 129].into_iter().chain((1..=301).map(|n| (n * 97) % 301 + 1));
        for n in order {
            assert_eq!(recall.recall(0, n).as_deref(), Ok(all[n as usize - 1].as_str()), "line {n}");
        }
        assert!(recall.recall(0, 302).unwrap_err().contains("no line 302"));
        assert!(recall.recall(0, 0).is_err() && recall.recall(1, 1).is_err());
        std::fs::remove_file(&path).unwrap();
        // What cannot be read twice has no recall.
        assert!(FileRecall::open(Path::new("/dev/null"), limit).is_none());
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
