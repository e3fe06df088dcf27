//! Payloads remembered by their bytes, compared canonically only when an id
//! comes again with other bytes.
//!
//! Under `[dedup]` the engine remembers a hash of each event's payload, to
//! tell a duplicate (the same event) from a conflict or a correction (SPEC.md
//! 3.2, 3.3). The canonical hash, where member order, whitespace, escapes and
//! the spelling of numbers do not matter, costs about a tenth of the engine's
//! work on every event. Almost every event is seen once, and a resent event
//! is almost always the same bytes. So where the source can read an earlier
//! event back by its partition and offset (a [`Recall`]), the engine
//! remembers a 64-bit hash of the bytes instead; when an id comes again with
//! other bytes, it reads the first version back and compares the canonical
//! hashes of the two. The verdicts are those of the canonical hash alone.

use crate::engine::Seen;
use crate::json::{raw_hash, Bounds, Doc};

/// Reads an event back by where it was read.
pub trait Recall: Send {
    /// The text of the event read at `partition` and `offset`, as it was
    /// read; an error says why it cannot be read.
    fn recall(&mut self, partition: u32, offset: u64) -> Result<String, String>;
}

/// An engine's [`Recall`], with what comparing needs.
pub(crate) struct Recalled {
    recall: Box<dyn Recall>,
    doc: Doc,
    scratch: Vec<u8>,
    /// The first event that could not be read back, and why.
    failure: Option<String>,
}

impl Recalled {
    pub(crate) fn new(recall: Box<dyn Recall>) -> Recalled {
        Recalled { recall, doc: Doc::default(), scratch: Vec::new(), failure: None }
    }

    pub(crate) fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Whether `text` (with bytes hashed to `hash`) has the payload of the
    /// remembered version `seen`. When the first version cannot be read
    /// back, or is not the event remembered, the two count as different and
    /// [`Recalled::failure`] says why.
    pub(crate) fn same(&mut self, seen: &Seen, hash: u64, text: &str, bounds: Bounds) -> bool {
        if seen.payload_hash == hash {
            return true;
        }
        let first = match self.recall.recall(seen.partition, seen.offset) {
            Ok(first) if raw_hash(&first) == seen.payload_hash => first,
            Ok(_) => {
                return self.fail(format!(
                    "the event read back at partition {} offset {} is not the one read there first: the input changed while it was read",
                    seen.partition, seen.offset
                ))
            }
            Err(why) => {
                return self.fail(format!(
                    "the event at partition {} offset {} cannot be read back to compare with a later version: {why}",
                    seen.partition, seen.offset
                ))
            }
        };
        let a = self.doc.canonical_hash_of(&first, &mut self.scratch, bounds);
        let b = self.doc.canonical_hash_of(text, &mut self.scratch, bounds);
        matches!((a, b), (Ok(a), Ok(b)) if a == b)
    }

    #[cold]
    fn fail(&mut self, why: String) -> bool {
        self.failure.get_or_insert(why);
        false
    }
}

impl std::fmt::Debug for Recalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recalled").field("failure", &self.failure).finish()
    }
}
