//! A small, strict JSON reader built for event intake.
//!
//! It validates a whole document (RFC 8259, nesting and number of values
//! bounded by [`Bounds`], never deeper than [`DEPTH_MAX`]) into
//! a flat arena of nodes that borrow the input: no allocation per event once
//! the arena has grown. Numbers keep their exact text, so decimals are never
//! rounded through binary floats. Invariant: every node's `start..end` is a
//! valid, complete JSON value inside the input.

use std::borrow::Cow;

/// No document is read deeper than this: the reader recurses once a level.
pub const DEPTH_MAX: usize = weir_contract::MAX_DEPTH;

/// How deep and how large a document may be (`[limits]` `max_depth` and
/// `max_fields`): past them the parse stops with [`ParseError::OverLimit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bounds {
    pub depth: usize,
    pub values: usize,
}

impl Bounds {
    pub(crate) const MAX: Bounds = Bounds { depth: DEPTH_MAX, values: usize::MAX };
}

/// Why a document was not read: not JSON, or JSON past a bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParseError {
    Malformed(String),
    OverLimit(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    Null,
    True,
    False,
    Number,
    String,
    Array,
    Object,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    tag: Tag,
    /// Strings: whether the text holds escapes.
    escaped: bool,
    key_escaped: bool,
    /// The value's raw text (strings: without the quotes).
    start: u32,
    end: u32,
    /// Object members: the key's raw text, without quotes.
    key_start: u32,
    key_end: u32,
    /// Nodes in this subtree, itself included.
    size: u32,
    /// Arrays and objects: direct children.
    count: u32,
}

impl Node {
    /// A node starting at byte `start`, an object member when `key` names one.
    fn new(tag: Tag, start: usize, (key_start, key_end, key_escaped): (u32, u32, bool)) -> Node {
        Node { tag, escaped: false, key_escaped, start: start as u32, end: 0, key_start, key_end, size: 1, count: 0 }
    }
}

/// A parsed document. Reuse one across events with [`Doc::parse`].
#[derive(Debug, Default)]
pub struct Doc {
    nodes: Vec<Node>,
}

/// A value inside a parsed document.
#[derive(Clone, Copy)]
pub struct Val<'d> {
    doc: &'d Doc,
    src: &'d str,
    index: usize,
}

impl Doc {
    /// Parses `src` as one JSON value; the error is a short sentence.
    #[cfg(test)]
    pub fn parse(&mut self, src: &str) -> Result<(), String> {
        self.parse_with(src, None, None, Bounds::MAX).map(|_| ()).map_err(ParseError::text)
    }

    /// Parses like [`Doc::parse`] and returns the document's
    /// [`Val::canonical_hash`], computed in the same pass.
    #[cfg(test)]
    pub fn parse_hashed(&mut self, src: &str, scratch: &mut Vec<u8>) -> Result<u64, String> {
        self.parse_with(src, Some(scratch), None, Bounds::MAX).map_err(ParseError::text)
    }

    /// Parses an event: with `scratch`, also its canonical hash (returned);
    /// and when the root is an object, where each of `names` is among its
    /// members (into `slots`), in the same pass.
    pub(crate) fn parse_event(
        &mut self,
        src: &str,
        scratch: Option<&mut Vec<u8>>,
        names: &Names,
        slots: &mut Vec<u32>,
        bounds: Bounds,
    ) -> Result<u64, ParseError> {
        slots.clear();
        slots.resize(names.len(), NO_NODE);
        self.parse_with(src, scratch, Some((names, slots.as_mut_slice())), bounds)
    }

    /// Parses `src` and returns its [`Val::canonical_hash`] (an event read
    /// back to compare with a later version of it).
    pub(crate) fn canonical_hash_of(
        &mut self,
        src: &str,
        scratch: &mut Vec<u8>,
        bounds: Bounds,
    ) -> Result<u64, ParseError> {
        self.parse_with(src, Some(scratch), None, bounds)
    }

    fn parse_with(
        &mut self,
        src: &str,
        scratch: Option<&mut Vec<u8>>,
        resolve: Option<(&Names, &mut [u32])>,
        bounds: Bounds,
    ) -> Result<u64, ParseError> {
        if src.len() >= u32::MAX as usize {
            return Err(ParseError::Malformed("document larger than 4 GiB".into()));
        }
        self.nodes.clear();
        let bounds = Bounds { depth: bounds.depth.min(DEPTH_MAX), values: bounds.values };
        let mut p =
            Parser { b: src.as_bytes(), src, i: 0, nodes: &mut self.nodes, scratch, bounds, skipped: 0, why: None };
        p.ws();
        // Members the plan does not read are validated and not recorded,
        // unless the parse hashes the whole document.
        let skip_unread = resolve.is_some() && p.scratch.is_none();
        let parsed = if p.b.get(p.i) == Some(&b'{') {
            p.object(0, (0, 0, false), resolve, skip_unread)
        } else {
            p.value(0, (0, 0, false), None, None, false)
        };
        let Ok(hash) = parsed else {
            return Err(p.why.take().unwrap_or_else(|| ParseError::Malformed("not JSON".into())));
        };
        p.ws();
        if p.i != p.b.len() {
            return Err(ParseError::Malformed(format!("unexpected text after the JSON value at byte {}", p.i + 1)));
        }
        Ok(hash)
    }

    pub fn root<'d>(&'d self, src: &'d str) -> Val<'d> {
        Val { doc: self, src, index: 0 }
    }
}

struct Parser<'a> {
    b: &'a [u8],
    src: &'a str,
    i: usize,
    nodes: &'a mut Vec<Node>,
    /// Present when the parse also computes the canonical hash.
    scratch: Option<&'a mut Vec<u8>>,
    bounds: Bounds,
    /// Values validated and not recorded ([`Parser::skip`]): they count
    /// against `bounds.values` as recorded ones do.
    skipped: usize,
    /// Why the parse stopped, set where it stopped: the parse's functions
    /// return [`Stop`], which fits in a register, rather than the message.
    why: Option<ParseError>,
}

/// A parse stopped; its [`Parser::why`] says why.
struct Stop;

impl ParseError {
    pub(crate) fn text(self) -> String {
        match self {
            ParseError::Malformed(s) | ParseError::OverLimit(s) => s,
        }
    }
}

impl Parser<'_> {
    #[inline]
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.i) {
            self.i += 1;
        }
    }

    /// Stops the parse at a bound.
    #[cold]
    #[inline(never)]
    fn over<T>(&mut self, why: String) -> Result<T, Stop> {
        self.why = Some(ParseError::OverLimit(why));
        Err(Stop)
    }

    #[cold]
    #[inline(never)]
    fn fail<T>(&mut self, what: &str) -> Result<T, Stop> {
        let why = if self.i >= self.b.len() {
            format!("{what}: the line ends too early")
        } else {
            format!("{what} at byte {}", self.i + 1)
        };
        self.why = Some(ParseError::Malformed(why));
        Err(Stop)
    }

    /// Parses one value into the arena. When hashing: a scalar feeds its
    /// canonical form into `member` (an object member's hash, already fed
    /// with the name) or returns its own hash; a container returns its hash,
    /// also fed into `member`. `skip_unread`: see [`Parser::object`].
    fn value(
        &mut self,
        depth: usize,
        key: (u32, u32, bool),
        member: Option<&mut Mix>,
        resolve: Option<(&Names, &mut [u32])>,
        skip_unread: bool,
    ) -> Result<u64, Stop> {
        match self.b.get(self.i) {
            Some(b'{') => {
                let hash = self.object(depth, key, resolve, skip_unread)?;
                if let Some(m) = member {
                    m.write_u64(hash);
                }
                Ok(hash)
            }
            Some(b'[') => {
                let hash = self.array(depth, key)?;
                if let Some(m) = member {
                    m.write_u64(hash);
                }
                Ok(hash)
            }
            _ => self.scalar(key, member),
        }
    }

    /// A string, number or literal: one node, pushed once, built whole at
    /// the push (a node assembled field by field on the stack and then
    /// copied stalled the copy's loads: BENCHMARKS.md, "Members the plan
    /// does not read").
    #[inline(always)]
    fn scalar(&mut self, key: (u32, u32, bool), member: Option<&mut Mix>) -> Result<u64, Stop> {
        let (tag, start, end, escaped) = self.scan_scalar()?;
        if self.values() >= self.bounds.values {
            return self.over(format!("more than max_fields = {} values", self.bounds.values));
        }
        let (key_start, key_end, key_escaped) = key;
        self.nodes.push(Node {
            tag,
            escaped,
            key_escaped,
            start: start as u32,
            end: end as u32,
            key_start,
            key_end,
            size: 1,
            count: 0,
        });
        let Some(scratch) = self.scratch.as_deref_mut() else { return Ok(0) };
        let raw = &self.src[start..end];
        Ok(match tag {
            Tag::String => scalar_hash(member, SEED, |h| feed_string(h, raw, escaped)),
            Tag::Number => scalar_hash(member, SEED, |h| feed_number(h, raw, scratch)),
            tag => scalar_hash(member, SEED, |h| feed_literal(h, tag)),
        })
    }

    /// Scans a string, number or literal at `self.i`: its tag, the span of
    /// its text (strings: inside the quotes) and whether it holds escapes.
    #[inline(always)]
    fn scan_scalar(&mut self) -> Result<(Tag, usize, usize, bool), Stop> {
        let at = self.i;
        Ok(match self.b.get(self.i) {
            Some(b'"') => {
                let (s, e, esc) = self.string()?;
                (Tag::String, s, e, esc)
            }
            Some(b'-' | b'0'..=b'9') => {
                self.number()?;
                (Tag::Number, at, self.i, false)
            }
            Some(b't') => {
                self.word(b"true")?;
                (Tag::True, at, self.i, false)
            }
            Some(b'f') => {
                self.word(b"false")?;
                (Tag::False, at, self.i, false)
            }
            Some(b'n') => {
                self.word(b"null")?;
                (Tag::Null, at, self.i, false)
            }
            _ => return self.fail("expected a JSON value"),
        })
    }

    /// Starts an object or array at `self.i`: its node is pushed now and
    /// completed by [`Parser::close`].
    fn open(&mut self, depth: usize, tag: Tag, key: (u32, u32, bool)) -> Result<(usize, Node), Stop> {
        if depth >= self.bounds.depth {
            return self.over(format!("nested deeper than max_depth = {}", self.bounds.depth));
        }
        let index = self.nodes.len();
        if self.values() >= self.bounds.values {
            return self.over(format!("more than max_fields = {} values", self.bounds.values));
        }
        let node = Node::new(tag, self.i, key);
        self.nodes.push(node);
        self.i += 1;
        self.ws();
        Ok((index, node))
    }

    fn close(&mut self, index: usize, mut node: Node) {
        node.end = self.i as u32;
        node.size = (self.nodes.len() - index) as u32;
        self.nodes[index] = node;
    }

    /// An object; at the root, `resolve` records where the plan's names are.
    /// With `skip_unread`, a member whose name is not among them is
    /// validated by [`Parser::skip`] and left out of the arena: nothing reads
    /// it, and the object's node counts only the members it holds. A value
    /// the plan reads whole ([`Names::whole`]) is recorded whole.
    fn object(
        &mut self,
        depth: usize,
        key: (u32, u32, bool),
        mut resolve: Option<(&Names, &mut [u32])>,
        skip_unread: bool,
    ) -> Result<u64, Stop> {
        let (index, mut node) = self.open(depth, Tag::Object, key)?;
        let hashing = self.scratch.is_some();
        let mut sum: u64 = 0;
        if self.b.get(self.i) == Some(&b'}') {
            self.i += 1;
        } else {
            loop {
                self.ws();
                if self.b.get(self.i) != Some(&b'"') {
                    return self.fail("expected a member name in quotes");
                }
                let (ks, ke, kesc) = self.string()?;
                self.ws();
                if self.b.get(self.i) != Some(&b':') {
                    return self.fail("expected `:` after a member name");
                }
                self.i += 1;
                self.ws();
                let mut inner = None;
                let mut skip_inner = false;
                if let Some((names, slots)) = resolve.as_mut() {
                    let id = if kesc {
                        names.find(unescape(&self.src[ks..ke]).as_bytes())
                    } else {
                        names.find(&self.b[ks..ke])
                    };
                    if id.is_none() && skip_unread {
                        self.skip(depth + 1)?;
                        self.ws();
                        match self.b.get(self.i) {
                            Some(b',') => {
                                self.i += 1;
                                continue;
                            }
                            Some(b'}') => {
                                self.i += 1;
                                break;
                            }
                            _ => return self.fail("expected `,` or `}`"),
                        }
                    }
                    if let Some(id) = id {
                        slots[names.slot_of[id]] = self.nodes.len() as u32;
                        if let Some(within) = names.inner[id].as_deref() {
                            // A repeated name: what its earlier value held is not read.
                            for &slot in &names.under[id] {
                                slots[slot] = NO_NODE;
                            }
                            inner = Some(within);
                            skip_inner = skip_unread && !names.whole[id];
                        }
                    }
                }
                let key = (ks as u32, ke as u32, kesc);
                let inner = match (inner, resolve.as_mut()) {
                    (Some(names), Some((_, slots))) => Some((names, &mut **slots)),
                    _ => None,
                };
                if hashing {
                    let mut m = member_start(&self.src[ks..ke], kesc, SEED);
                    self.value(depth + 1, key, Some(&mut m), inner, false)?;
                    sum = sum.wrapping_add(m.finish());
                } else if let Some(b'{' | b'[') = self.b.get(self.i) {
                    self.value(depth + 1, key, None, inner, skip_inner)?;
                } else {
                    // A scalar member, read here rather than through `value`.
                    self.scalar(key, None)?;
                }
                node.count += 1;
                self.ws();
                match self.b.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b'}') => {
                        self.i += 1;
                        break;
                    }
                    _ => return self.fail("expected `,` or `}`"),
                }
            }
        }
        self.close(index, node);
        Ok(if hashing { object_hash(sum, SEED) } else { 0 })
    }

    fn array(&mut self, depth: usize, key: (u32, u32, bool)) -> Result<u64, Stop> {
        let (index, mut node) = self.open(depth, Tag::Array, key)?;
        let mut h = Mix::new(SEED ^ 0x5b);
        if self.b.get(self.i) == Some(&b']') {
            self.i += 1;
        } else {
            loop {
                self.ws();
                let child = self.value(depth + 1, (0, 0, false), None, None, false)?;
                h.write_u64(child);
                node.count += 1;
                self.ws();
                match self.b.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        break;
                    }
                    _ => return self.fail("expected `,` or `]`"),
                }
            }
        }
        self.close(index, node);
        Ok(if self.scratch.is_some() { h.finish() } else { 0 })
    }

    /// Validates the value at `self.i` as [`Parser::value`] does, with the
    /// same bounds and the same errors, and records nothing: the value of a
    /// member the plan does not read. One loop over the value's tokens,
    /// with the containers open inside it kept as bits (no value is deeper
    /// than [`DEPTH_MAX`], 64).
    fn skip(&mut self, depth: usize) -> Result<(), Stop> {
        // Bit k: whether the k-th innermost open container is an object.
        let mut objects: u64 = 0;
        let mut open = 0usize;
        loop {
            // A value.
            match self.b.get(self.i) {
                Some(&c @ (b'{' | b'[')) => {
                    if depth + open >= self.bounds.depth {
                        return self.over(format!("nested deeper than max_depth = {}", self.bounds.depth));
                    }
                    self.count_skipped()?;
                    self.i += 1;
                    self.ws();
                    let object = c == b'{';
                    let close = if object { b'}' } else { b']' };
                    if self.b.get(self.i) == Some(&close) {
                        self.i += 1;
                    } else {
                        objects = (objects << 1) | u64::from(object);
                        open += 1;
                        if object {
                            self.skip_name()?;
                        }
                        continue;
                    }
                }
                _ => {
                    self.scan_scalar()?;
                    self.count_skipped()?;
                }
            }
            // After a value: close what ends here, then the next member or item.
            loop {
                if open == 0 {
                    return Ok(());
                }
                self.ws();
                let object = objects & 1 == 1;
                match (self.b.get(self.i), object) {
                    (Some(b','), _) => {
                        self.i += 1;
                        self.ws();
                        if object {
                            self.skip_name()?;
                        }
                        break;
                    }
                    (Some(b'}'), true) | (Some(b']'), false) => {
                        self.i += 1;
                        objects >>= 1;
                        open -= 1;
                    }
                    (_, true) => return self.fail("expected `,` or `}`"),
                    (_, false) => return self.fail("expected `,` or `]`"),
                }
            }
        }
    }

    /// A member's name and its colon, up to the value, not recorded.
    #[inline(always)]
    fn skip_name(&mut self) -> Result<(), Stop> {
        if self.b.get(self.i) != Some(&b'"') {
            return self.fail("expected a member name in quotes");
        }
        self.string()?;
        self.ws();
        if self.b.get(self.i) != Some(&b':') {
            return self.fail("expected `:` after a member name");
        }
        self.i += 1;
        self.ws();
        Ok(())
    }

    /// Counts a skipped value against `bounds.values`.
    #[inline]
    fn count_skipped(&mut self) -> Result<(), Stop> {
        if self.values() >= self.bounds.values {
            return self.over(format!("more than max_fields = {} values", self.bounds.values));
        }
        self.skipped += 1;
        Ok(())
    }

    /// Values recorded and skipped so far.
    #[inline(always)]
    fn values(&self) -> usize {
        self.nodes.len() + self.skipped
    }

    /// A literal at `self.i`.
    fn word(&mut self, word: &[u8]) -> Result<(), Stop> {
        if self.b[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            self.fail("expected a JSON value")
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.i;
        while self.i < self.b.len() && self.b[self.i].is_ascii_digit() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<(), Stop> {
        if self.b[self.i] == b'-' {
            self.i += 1;
        }
        match self.b.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return self.fail("expected digits in a number"),
        }
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return self.fail("expected digits after the decimal point");
            }
        }
        if matches!(self.b.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.b.get(self.i), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return self.fail("expected digits in the exponent");
            }
        }
        Ok(())
    }

    /// Scans a string at `self.i` (an opening quote); returns its inner span.
    #[inline(always)]
    fn string(&mut self) -> Result<(usize, usize, bool), Stop> {
        self.i += 1;
        let start = self.i;
        let mut escaped = false;
        loop {
            // Skip 8 plain bytes at a time: no quote, backslash or control character.
            while let Some(chunk) = self.b.get(self.i..self.i + 8) {
                let mut w = [0u8; 8];
                w.copy_from_slice(chunk);
                let stops = string_stops(u64::from_le_bytes(w));
                if stops != 0 {
                    // The lowest flagged byte is always a real stop.
                    self.i += (stops.trailing_zeros() / 8) as usize;
                    break;
                }
                self.i += 8;
            }
            let Some(&c) = self.b.get(self.i) else {
                return self.fail("unterminated string");
            };
            match c {
                b'"' => {
                    let end = self.i;
                    self.i += 1;
                    return Ok((start, end, escaped));
                }
                b'\\' => {
                    escaped = true;
                    self.i += 1;
                    match self.b.get(self.i) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 1,
                        Some(b'u') => {
                            let hex = self.b.get(self.i + 1..self.i + 5);
                            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                                return self.fail("bad \\u escape");
                            }
                            self.i += 5;
                        }
                        _ => return self.fail("bad escape in a string"),
                    }
                }
                0..=0x1f => return self.fail("control character in a string"),
                _ => self.i += 1,
            }
        }
    }
}

/// The high bit of each byte of `w` that is `"`, `\\` or below 0x20 (bytes
/// above the first such byte may be flagged falsely).
fn string_stops(w: u64) -> u64 {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let zero_in = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let quote = zero_in(w ^ (ONES * u64::from(b'"')));
    let backslash = zero_in(w ^ (ONES * u64::from(b'\\')));
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    quote | backslash | control
}

/// The member names a plan reads, at the top level and inside objects
/// (`bid.auction`), so that one pass over an event finds every field it
/// needs: each name's value gets a slot in the event's slots.
#[derive(Debug, Clone, Default)]
pub(crate) struct Names {
    names: Vec<Box<str>>,
    /// Name ids by name length (names longer than 63 bytes share the last
    /// list), each with its [`words`]: for a name of at most 16 bytes, equal
    /// words and length are equal names.
    by_len: Vec<Vec<(u64, u64, usize)>>,
    /// Each name's slot.
    slot_of: Vec<usize>,
    /// The names read inside each name's value, when it is an object.
    inner: Vec<Option<Box<Names>>>,
    /// The slots inside each name's value, at every level below: cleared
    /// when the name comes again, so that the last member of a repeated
    /// name is the one read, as [`Val::get`] reads it.
    under: Vec<Vec<usize>>,
    /// Whether the plan reads each name's value itself, not only names
    /// inside it: such a value is recorded whole.
    whole: Vec<bool>,
    /// Slots handed out at this level and below (at the top: all of them).
    slots: usize,
    /// Bit `n` set when a name is `n` bytes long (bit 63: 63 or more).
    lengths: u64,
}

/// A field path compiled against [`Names`]: the slot its value is found in.
#[derive(Debug, Clone)]
pub(crate) struct FieldRef {
    pub slot: usize,
}

const NO_NODE: u32 = u32::MAX;

impl Names {
    pub(crate) fn field(&mut self, segments: &[impl AsRef<str>]) -> FieldRef {
        let mut next = self.slots;
        let slot = self.insert(segments, &mut next);
        self.slots = next;
        FieldRef { slot }
    }

    /// The slot of `segments` below this level; new slots are numbered from `next`.
    fn insert(&mut self, segments: &[impl AsRef<str>], next: &mut usize) -> usize {
        let first = segments.first().map_or("", |s| s.as_ref());
        let id = match self.names.iter().position(|n| &**n == first) {
            Some(id) => id,
            None => {
                self.names.push(first.into());
                let len = first.len().min(63);
                if self.by_len.len() <= len {
                    self.by_len.resize(len + 1, Vec::new());
                }
                let (first_word, last_word) = words(first.as_bytes());
                self.by_len[len].push((first_word, last_word, self.names.len() - 1));
                self.lengths |= 1 << len;
                self.slot_of.push(*next);
                *next += 1;
                self.inner.push(None);
                self.under.push(Vec::new());
                self.whole.push(false);
                self.names.len() - 1
            }
        };
        if segments.len() == 1 {
            self.whole[id] = true;
            return self.slot_of[id];
        }
        let before = *next;
        let slot = self.inner[id].get_or_insert_default().insert(&segments[1..], next);
        self.under[id].extend(before..*next);
        slot
    }

    /// Slots an event needs.
    pub(crate) fn len(&self) -> usize {
        self.slots
    }

    /// The id of `key`, when it is one of the names. Most members of an
    /// event are not: their length alone says so, here, before any call.
    #[inline(always)]
    fn find(&self, key: &[u8]) -> Option<usize> {
        if self.lengths & (1 << key.len().min(63)) == 0 {
            return None;
        }
        self.find_among(key)
    }

    #[inline(always)]
    fn find_among(&self, key: &[u8]) -> Option<usize> {
        let ids = self.by_len.get(key.len().min(63))?;
        let (first, last) = words(key);
        for &(first_word, last_word, id) in ids {
            if first_word == first && last_word == last {
                let name = self.names[id].as_bytes();
                if key.len() <= 16 || (name.len() == key.len() && same(name, key)) {
                    return Some(id);
                }
            }
        }
        None
    }
}

/// Two words that, with its length, tell a name of at most 16 bytes from
/// every other: its first and last 8 bytes (overlapping below 16), or below
/// 8 bytes, its bytes packed into the first word.
#[inline]
fn words(b: &[u8]) -> (u64, u64) {
    let n = b.len();
    let load8 = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]));
    let load4 = |at: usize| u64::from(u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or([0; 4])));
    if n >= 8 {
        (load8(0), load8(n - 8))
    } else if n >= 4 {
        (load4(0) | (load4(n - 4) << 32), 0)
    } else if n > 0 {
        (u64::from(b[0]) | (u64::from(b[n / 2]) << 8) | (u64::from(b[n - 1]) << 16), 0)
    } else {
        (0, 0)
    }
}

/// Whether two slices of the same length are equal, in word loads: a field
/// name is a few bytes, and a call to `memcmp` for each was 1.7% of an
/// event's time.
#[inline]
fn same(a: &[u8], b: &[u8]) -> bool {
    debug_assert_eq!(a.len(), b.len());
    let n = a.len();
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().unwrap_or([0; 8]));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().unwrap_or([0; 4]));
    if n >= 8 {
        let mut at = 0;
        while at + 8 < n {
            if word(a, at) != word(b, at) {
                return false;
            }
            at += 8;
        }
        // The last word, overlapping the one before when n is not a multiple of 8.
        word(a, n - 8) == word(b, n - 8)
    } else if n >= 4 {
        half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4)
    } else {
        a.iter().zip(b).all(|(x, y)| x == y)
    }
}

/// An event's top-level members resolved against [`Names`].
#[derive(Clone, Copy)]
pub(crate) struct Event<'d> {
    pub root: Val<'d>,
    slots: &'d [u32],
}

impl<'d> Event<'d> {
    /// An event whose `slots` [`Doc::parse_event`] filled.
    pub(crate) fn from_slots(root: Val<'d>, slots: &'d [u32]) -> Event<'d> {
        Event { root, slots }
    }

    pub(crate) fn get(&self, field: &FieldRef) -> Option<Val<'d>> {
        let index = *self.slots.get(field.slot)?;
        if index == NO_NODE {
            return None;
        }
        Some(Val { doc: self.root.doc, src: self.root.src, index: index as usize })
    }
}

/// Decodes the inner text of a JSON string; lone surrogates become U+FFFD.
fn unescape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some('u') => {
                let hex: String = chars.by_ref().take(4).collect();
                let first = u32::from_str_radix(&hex, 16).unwrap_or(0xfffd);
                let code = if (0xd800..0xdc00).contains(&first) {
                    let rest = chars.as_str();
                    let low = rest
                        .strip_prefix("\\u")
                        .and_then(|r| r.get(..4))
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .filter(|low| (0xdc00..0xe000).contains(low));
                    match low {
                        Some(low) => {
                            chars.nth(5);
                            0x10000 + ((first - 0xd800) << 10) + (low - 0xdc00)
                        }
                        None => 0xfffd,
                    }
                } else {
                    first
                };
                out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
            }
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

impl<'d> Val<'d> {
    fn node(&self) -> &'d Node {
        &self.doc.nodes[self.index]
    }

    pub fn tag(&self) -> Tag {
        self.node().tag
    }

    /// The value's exact text as it appeared (strings without quotes).
    pub fn raw(&self) -> &'d str {
        let n = self.node();
        &self.src[n.start as usize..n.end as usize]
    }

    /// The value's JSON text (strings with their quotes).
    pub fn json_text(&self) -> &'d str {
        let n = self.node();
        if n.tag == Tag::String {
            &self.src[n.start as usize - 1..n.end as usize + 1]
        } else {
            self.raw()
        }
    }

    /// Whether a string's decoded text is `text` (no allocation without escapes).
    pub fn str_is(&self, text: &str) -> bool {
        let n = self.node();
        if n.escaped {
            self.str().is_some_and(|s| s == text)
        } else {
            self.raw() == text
        }
    }

    /// A string's decoded text.
    pub fn str(&self) -> Option<Cow<'d, str>> {
        let n = self.node();
        if n.tag != Tag::String {
            return None;
        }
        let raw = self.raw();
        Some(if n.escaped { Cow::Owned(unescape(raw)) } else { Cow::Borrowed(raw) })
    }

    #[cfg(test)]
    fn key_is(&self, name: &str) -> bool {
        let n = self.node();
        let raw = &self.src.as_bytes()[n.key_start as usize..n.key_end as usize];
        if n.key_escaped {
            return unescape(&self.src[n.key_start as usize..n.key_end as usize]) == name;
        }
        // Most names differ in length or first byte; test those before the bytes.
        let name = name.as_bytes();
        raw.len() == name.len() && raw.first() == name.first() && raw.last() == name.last() && raw == name
    }

    /// Children of an array or object, in order.
    pub fn children(&self) -> impl Iterator<Item = Val<'d>> + 'd {
        let n = *self.node();
        let (doc, src) = (self.doc, self.src);
        let mut index = self.index + 1;
        let count = if matches!(n.tag, Tag::Array | Tag::Object) { n.count } else { 0 };
        (0..count).map(move |_| {
            let child = Val { doc, src, index };
            index += doc.nodes[index].size as usize;
            child
        })
    }

    #[cfg(test)]
    /// An object's member; the last one wins when a name repeats.
    pub fn get(&self, name: &str) -> Option<Val<'d>> {
        if self.tag() != Tag::Object {
            return None;
        }
        self.children().filter(|c| c.key_is(name)).last()
    }

    #[cfg(test)]
    /// Follows a field path; `None` when any segment is missing or not an object.
    pub fn path<S: AsRef<str>>(&self, segments: &[S]) -> Option<Val<'d>> {
        let mut at = *self;
        for segment in segments {
            at = at.get(segment.as_ref())?;
        }
        Some(at)
    }

    /// A 64-bit hash of the value as parsed JSON: member order, whitespace,
    /// escapes and the spelling of numbers (`1.50` vs `1.5e0`) do not matter.
    pub fn canonical_hash(&self) -> u64 {
        self.hash_into(&mut Vec::new(), 0)
    }

    /// The same, in 128 bits (two independent seeds), for sets of values.
    pub fn canonical_hash128(&self) -> u128 {
        let mut scratch = Vec::new();
        let low = self.hash_into(&mut scratch, 0);
        let high = self.hash_into(&mut scratch, 0x5bd1_e995_7f4a_7c15);
        (u128::from(high) << 64) | u128::from(low)
    }

    fn hash_into(&self, scratch: &mut Vec<u8>, seed: u64) -> u64 {
        self.hash_as(None, scratch, seed)
    }

    /// The same definition as the parser's (see `Parser::value`).
    fn hash_as(&self, member: Option<&mut Mix>, scratch: &mut Vec<u8>, seed: u64) -> u64 {
        let n = self.node();
        let container = match n.tag {
            Tag::Array => {
                let mut h = Mix::new(seed ^ 0x5b);
                for child in self.children() {
                    h.write_u64(child.hash_as(None, scratch, seed));
                }
                h.finish()
            }
            Tag::Object => {
                let mut sum: u64 = 0;
                for child in self.children() {
                    let c = child.node();
                    let mut m = member_start(&self.src[c.key_start as usize..c.key_end as usize], c.key_escaped, seed);
                    child.hash_as(Some(&mut m), scratch, seed);
                    sum = sum.wrapping_add(m.finish());
                }
                object_hash(sum, seed)
            }
            Tag::String => return scalar_hash(member, seed, |h| feed_string(h, self.raw(), n.escaped)),
            Tag::Number => return scalar_hash(member, seed, |h| feed_number(h, self.raw(), scratch)),
            tag => return scalar_hash(member, seed, |h| feed_literal(h, tag)),
        };
        if let Some(m) = member {
            m.write_u64(container);
        }
        container
    }
}

/// The canonical hash, one definition for the parser and for [`Val`]:
/// a scalar feeds a type tag and its canonical text; an array hashes its
/// items in order; an object sums its members' hashes (name, then value), so
/// member order does not matter.
const SEED: u64 = 0;

/// An object member's hash, fed with its name; the value follows.
#[inline]
fn member_start(key: &str, escaped: bool, seed: u64) -> Mix {
    let mut h = Mix::new(seed);
    if escaped {
        write_unescaped(&mut h, key);
    } else {
        h.write(key.as_bytes());
    }
    h.write_u64(0xff);
    h
}

/// A 64-bit hash of an event's bytes as they are: the same text gives the
/// same hash, and any other spelling of the same JSON another (see
/// [`crate::Recall`]). XXH3, whose lanes run side by side, not [`Mix`],
/// whose one chain of multiplies took 4% of a run over 420-byte events:
/// these hashes are compared within one run only, never kept.
pub(crate) fn raw_hash(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(text.as_bytes(), 0x72_6177)
}

/// Feeds a string's decoded text; out of line, so that the plain strings'
/// path stays small enough to inline.
#[cold]
#[inline(never)]
fn write_unescaped(h: &mut Mix, raw: &str) {
    h.write(unescape(raw).as_bytes());
}

/// A scalar fed into its member's hash (returning 0), or hashed on its own.
#[inline]
fn scalar_hash(member: Option<&mut Mix>, seed: u64, feed: impl FnOnce(&mut Mix)) -> u64 {
    match member {
        Some(m) => {
            feed(m);
            0
        }
        None => {
            let mut h = Mix::new(seed);
            feed(&mut h);
            h.finish()
        }
    }
}

fn object_hash(sum: u64, seed: u64) -> u64 {
    let mut h = Mix::new(seed ^ 0x7b);
    h.write_u64(sum);
    h.finish()
}

#[inline]
fn feed_string(h: &mut Mix, raw: &str, escaped: bool) {
    h.write_u64(u64::from(b's'));
    if escaped {
        write_unescaped(h, raw);
    } else {
        h.write(raw.as_bytes());
    }
}

#[inline]
fn feed_number(h: &mut Mix, raw: &str, scratch: &mut Vec<u8>) {
    scratch.clear();
    crate::number::canonical_number(raw, scratch);
    h.write_u64(u64::from(b'd'));
    h.write(scratch);
}

fn feed_literal(h: &mut Mix, tag: Tag) {
    h.write_u64(match tag {
        Tag::True => u64::from(b't'),
        Tag::False => u64::from(b'f'),
        _ => u64::from(b'n'),
    });
}

/// A small, fast 64-bit hash with a fixed definition (it is kept in
/// snapshots, so it must never change): 8-byte words folded by multiply,
/// the length mixed in, and the murmur3 finaliser.
pub(crate) struct Mix {
    h: u64,
    len: u64,
}

impl Mix {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;

    #[inline]
    pub(crate) fn new(seed: u64) -> Mix {
        Mix { h: seed ^ 0x243f_6a88_85a3_08d3, len: 0 }
    }

    #[inline]
    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(Self::K).rotate_left(29);
    }

    #[inline]
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        let n = bytes.len();
        let load8 = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let load4 = |at: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&bytes[at..at + 4]);
            u64::from(u32::from_le_bytes(w))
        };
        if n >= 8 {
            let mut at = 0;
            while at + 8 <= n {
                self.word(load8(at));
                at += 8;
            }
            if at < n {
                // The last 8 bytes, overlapping what came before.
                self.word(load8(n - 8) ^ 0x5a);
            }
        } else if n >= 4 {
            self.word(load4(0) | (load4(n - 4) << 32));
        } else if n > 0 {
            self.word(u64::from(bytes[0]) | (u64::from(bytes[n / 2]) << 8) | (u64::from(bytes[n - 1]) << 16));
        }
        self.len = self.len.wrapping_add(n as u64).rotate_left(7);
    }

    #[inline]
    pub(crate) fn write_u64(&mut self, v: u64) {
        self.word(v);
        self.len = self.len.wrapping_add(8);
    }

    #[inline]
    pub(crate) fn finish(&self) -> u64 {
        let mut z = self.h ^ self.len.wrapping_mul(Self::K);
        z = (z ^ (z >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        z = (z ^ (z >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        z ^ (z >> 33)
    }
}

impl<'d> Val<'d> {}

#[cfg(test)]
mod tests {
    /// `same` against `==` for every length up to 40 and a difference at each place.
    #[test]
    fn word_compare_agrees_with_slice_equality() {
        for n in 0..40usize {
            let a: Vec<u8> = (0..n as u8).map(|i| b'a' + i % 26).collect();
            assert!(super::same(&a, &a.clone()));
            for at in 0..n {
                let mut b = a.clone();
                b[at] ^= 0x20;
                assert!(!super::same(&a, &b), "length {n}, differing at {at}");
            }
        }
    }

    use super::*;
    use crate::numbers;

    fn parses(text: &str) -> bool {
        Doc::default().parse(text).is_ok()
    }

    #[test]
    fn accepts_what_serde_json_accepts_on_samples() {
        for text in [
            "{}",
            "[]",
            "0",
            "-0.5e+3",
            "\"a\\u00e9\\n\"",
            r#"{"a":[1,{"b":null}],"c":true}"#,
            " { \"x\" : 1 } ",
            "[1,2,3]",
            "\"\\ud83d\\ude00\"",
        ] {
            assert!(parses(text), "{text}");
            assert!(serde_json::from_str::<serde_json::Value>(text).is_ok());
        }
        for text in [
            "",
            "{",
            "{\"a\":}",
            "[1,]",
            "01",
            "1.",
            "-",
            "tru",
            "\"\u{1}\"",
            "{\"a\" 1}",
            "1 2",
            "{'a':1}",
            "\"\\x\"",
            "NaN",
            "[1 2]",
        ] {
            assert!(!parses(text), "{text}");
        }
    }

    #[test]
    fn paths_and_strings() {
        let src = r#"{"acct":{"id":"a-1","n":12.50},"k\u0065y":"v\"q","dup":1,"dup":2}"#;
        let mut doc = Doc::default();
        doc.parse(src).unwrap();
        let root = doc.root(src);
        assert_eq!(root.path(&["acct", "id"]).unwrap().str().unwrap(), "a-1");
        assert_eq!(root.path(&["acct", "n"]).unwrap().raw(), "12.50");
        assert_eq!(root.get("key").unwrap().str().unwrap(), "v\"q");
        assert_eq!(root.get("dup").unwrap().raw(), "2");
        assert!(root.path(&["acct", "id", "x"]).is_none());
        assert!(root.get("missing").is_none());
    }

    #[test]
    fn canonical_hash_ignores_spelling() {
        let hash = |text: &str| {
            let mut doc = Doc::default();
            doc.parse(text).unwrap();
            doc.root(text).canonical_hash()
        };
        assert_eq!(hash(r#"{"a":1.50,"b":"x"}"#), hash(r#"{ "b" : "\u0078", "a" : 15e-1 }"#));
        assert_eq!(hash("100"), hash("1e2"));
        assert_eq!(hash("0"), hash("-0.0"));
        assert_ne!(hash(r#"{"a":1}"#), hash(r#"{"a":"1"}"#));
        assert_ne!(hash("[1,2]"), hash("[2,1]"));
        assert_ne!(hash(r#"{"a":{"b":1}}"#), hash(r#"{"a":{"c":1}}"#));
    }

    #[test]
    fn parser_hash_equals_tree_hash() {
        for text in [
            r#"{"a":1.50,"b":"x\n","c":[true,false,null,{"d":-0.0}],"e\u0041":{}}"#,
            "[]",
            "\"s\"",
            "12e3",
            "null",
            r#"{"a":{"b":{"c":[1,[2,[3]]]}}}"#,
        ] {
            let mut doc = Doc::default();
            let fused = doc.parse_hashed(text, &mut Vec::new()).unwrap();
            assert_eq!(fused, doc.root(text).canonical_hash(), "{text}");
        }
    }

    /// Every name of 0 to 40 bytes is found, and no name one byte off at
    /// any place, or a byte longer or shorter, is taken for it.
    #[test]
    fn names_are_found_by_their_words_and_nothing_else_is() {
        let mut names = Names::default();
        let all: Vec<String> =
            (0..41).map(|n| (0..n).map(|i| char::from(b'a' + (i * 7 % 26) as u8)).collect()).collect();
        for name in &all {
            names.field(&[name.as_str()]);
        }
        for (id, name) in all.iter().enumerate() {
            assert_eq!(names.find(name.as_bytes()), Some(id), "{name:?}");
            for at in 0..name.len() {
                let mut other = name.clone().into_bytes();
                other[at] ^= 0x01;
                assert_eq!(names.find(&other), None, "{name:?} changed at {at}");
            }
            let mut longer = name.clone().into_bytes();
            longer.push(b'z');
            assert_ne!(names.find(&longer), Some(id), "{name:?} and one byte more");
        }
    }

    /// Plan fields at one and two levels, found in the parse, are those a
    /// walk of the parsed tree finds (the last of a repeated name wins), over
    /// random documents: members in any order, repeated, escaped, or not
    /// objects where a path goes on.
    #[test]
    fn fields_found_in_the_parse_are_those_the_tree_holds() {
        let mut next = numbers(0x2f6b_1c3d);
        let paths: [&[&str]; 7] =
            [&["bid"], &["bid", "auction"], &["bid", "dateTime"], &["a", "b", "c"], &["a", "x"], &["t"], &["a"]];
        let mut names = Names::default();
        let fields: Vec<FieldRef> = paths.iter().map(|p| names.field(p)).collect();
        let names_pool = ["bid", "auction", "dateTime", "a", "b", "c", "x", "t", "b\\u0069d", "other"];
        fn doc(next: &mut dyn FnMut(usize) -> usize, pool: &[&str], depth: usize) -> String {
            match next(if depth > 3 { 3 } else { 5 }) {
                0 => next(100).to_string(),
                1 => "\"s\"".into(),
                2 => "null".into(),
                3 => format!("[{}]", doc(next, pool, depth + 1)),
                _ => {
                    let members: Vec<String> = (0..next(5))
                        .map(|_| format!("\"{}\":{}", pool[next(pool.len())], doc(next, pool, depth + 1)))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }
            }
        }
        let mut parsed = Doc::default();
        let mut slots = Vec::new();
        for round in 0..5_000 {
            let members: Vec<String> = (0..next(6))
                .map(|_| format!("\"{}\":{}", names_pool[next(names_pool.len())], doc(&mut next, &names_pool, 1)))
                .collect();
            let text = format!("{{{}}}", members.join(","));
            parsed.parse_event(&text, None, &names, &mut slots, Bounds::MAX).unwrap();
            let event = Event::from_slots(parsed.root(&text), &slots);
            let mut tree = Doc::default();
            tree.parse(&text).unwrap();
            for (path, field) in paths.iter().zip(&fields) {
                let want = tree.root(&text).path(path).map(|v| (v.json_text().to_owned(), v.canonical_hash()));
                // The hash walks the value's nodes: a value the plan reads whole
                // (`bid`, `a`) keeps every member, however many are skipped around it.
                let got = event.get(field).map(|v| (v.json_text().to_owned(), v.canonical_hash()));
                assert_eq!(got, want, "round {round}: {path:?} in {text}");
            }
        }
    }

    /// Skipping the members a plan does not read accepts and refuses what
    /// the whole parse does, with the same message, under the same bounds:
    /// over random documents, cut short or with a byte changed.
    #[test]
    fn skipped_members_are_validated_as_recorded_ones_are() {
        let mut next = numbers(0x51c1_77ed);
        let mut names = Names::default();
        for path in [&["id"][..], &["acct", "id"], &["t"]] {
            names.field(path);
        }
        let pool = ["id", "acct", "t", "x", "tags", "y\\u0041"];
        let scalars = ["1", "-2.5e3", "\"s\"", "\"\\n\\u00e9\"", "true", "false", "null", "\"\""];
        fn doc(next: &mut dyn FnMut(usize) -> usize, pool: &[&str], scalars: &[&str], depth: usize) -> String {
            match next(if depth > 4 { 2 } else { 5 }) {
                0 | 1 => scalars[next(scalars.len())].to_owned(),
                2 => {
                    let items: Vec<String> = (0..next(4)).map(|_| doc(next, pool, scalars, depth + 1)).collect();
                    format!("[{}]", items.join(if next(2) == 0 { "," } else { " , " }))
                }
                _ => {
                    let members: Vec<String> = (0..next(5))
                        .map(|_| format!("\"{}\":{}", pool[next(pool.len())], doc(next, pool, scalars, depth + 1)))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }
            }
        }
        let breaks: [&[u8]; 12] = [b"", b" ", b",", b":", b"{", b"}", b"[", b"]", b"\"", b"\\", b"\x01", b"1"];
        let (mut skipping, mut whole) = (Doc::default(), Doc::default());
        let mut slots = Vec::new();
        let (mut refused, mut over) = (0, 0);
        for round in 0..20_000 {
            let members: Vec<String> = (0..next(6))
                .map(|_| format!("\"{}\":{}", pool[next(pool.len())], doc(&mut next, &pool, &scalars, 1)))
                .collect();
            let mut bytes = format!("{{{}}}", members.join(",")).into_bytes();
            match next(4) {
                0 => bytes.truncate(next(bytes.len() + 1)),
                1 => {
                    let at = next(bytes.len());
                    let with = breaks[next(breaks.len())];
                    bytes.splice(at..at + 1, with.iter().copied());
                }
                _ => {}
            }
            let text = String::from_utf8(bytes).unwrap();
            let bounds = Bounds { depth: 1 + next(6), values: 1 + next(40) };
            let got = skipping.parse_event(&text, None, &names, &mut slots, bounds);
            let want = whole.parse_with(&text, None, None, bounds);
            assert_eq!(got, want, "round {round}: {text} under {bounds:?}");
            match want {
                Err(ParseError::Malformed(_)) => refused += 1,
                Err(ParseError::OverLimit(_)) => over += 1,
                Ok(_) => {}
            }
        }
        // The cases reach every outcome.
        assert!(refused > 1_000 && over > 1_000, "{refused} malformed, {over} over a bound");
    }

    #[test]
    fn depth_is_bounded() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(Doc::default().parse(&deep).unwrap_err().contains("nested deeper"));
    }
}
