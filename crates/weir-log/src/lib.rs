//! weir's embedded, durable log: topics of partitions of append-only
//! segment files, with a checksum per record.
//!
//! - **Durable before acknowledged.** [`Log::append`] answers only after its
//!   records are written and fsynced. One writer thread takes every request
//!   waiting at that moment, writes them all and fsyncs each partition once
//!   (group commit), so many concurrent producers share one fsync.
//! - **All or nothing per group.** If a write or fsync fails, every
//!   partition the group touched is cut back to what was durable before it,
//!   every request of the group is refused, and the log refuses appends
//!   ([`LogError::Unavailable`]) until a probe (at most once a second)
//!   writes and syncs again. It never acknowledges what it did not write.
//! - **Readers see durable records only**, so nothing downstream can count
//!   an event that a crash could take back.
//! - **Recovery** ([`Log::open`]) checks every record: a torn tail of a
//!   partition's last segment is cut off; damage followed by valid records,
//!   or in any earlier segment, is refused with the file and position.
//! - **Retention** deletes whole closed segments whose newest record is older
//!   than the topic's retention.
//!
//! Layout: `DIR/{topic}/{partition}/{first offset:020}.seg`.

mod partition;
mod record;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use partition::Partition;
pub use partition::Recovered;
pub use record::{Record, RECORD_MAX, TAG};

/// Creates `dir` and any missing parent owner-only (0700): the log and the
/// results database hold raw events. A folder already there keeps its mode.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Creates the empty file `path` owner-only (0600) unless it is there.
pub fn create_private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    #[error("cannot {action} {}: {message}", file.display())]
    Io { file: PathBuf, action: &'static str, message: String },
    #[error("the log is damaged at {} byte {position}: {detail}; restore this file from a backup, or move the partition folder aside to start it empty", file.display())]
    Corrupt { file: PathBuf, position: u64, detail: String },
    #[error("the log is not accepting writes: {0}; it retries by itself, send again later")]
    Unavailable(String),
    #[error("no topic {0:?}")]
    NoTopic(String),
    #[error("topic {topic:?} has no partition {partition} (it has {partitions})")]
    NoPartition { topic: String, partition: u32, partitions: u32 },
    #[error("topic {topic:?} has {found} partitions on disk but {wanted} configured; a topic's partition count cannot change (keys would move between partitions)")]
    PartitionCount { topic: String, found: u32, wanted: u32 },
    #[error("bad topic name {0:?}: use 1 to 200 letters, digits, '.', '_' or '-'")]
    TopicName(String),
    #[error(
        "a record of {0} bytes is larger than the log's limit of {RECORD_MAX} ({TAG} less for a record with a tag)"
    )]
    TooLarge(usize),
    #[error("the log's writer has {queued} bytes of appends waiting, at its limit of {limit} (weir.toml log_queue_bytes); nothing was appended; send again shortly")]
    Busy { queued: usize, limit: usize },
}

impl LogError {
    pub(crate) fn io(file: &Path, action: &'static str, e: std::io::Error) -> LogError {
        LogError::Io { file: file.to_owned(), action, message: e.to_string() }
    }
}

/// How the log writes.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// A segment is closed, and a new one started, past this many bytes.
    pub segment_bytes: u64,
    /// While true, every fsync fails (after the bytes were written), as on a
    /// full disk or a failing device: for tests and drills.
    pub fail_writes: Arc<AtomicBool>,
    /// Appends waiting for the writer may hold at most this many bytes (each
    /// record counts its payload and 64 bytes); past it, appends are
    /// refused with [`LogError::Busy`] instead of queueing without bound.
    pub queue_bytes: usize,
    /// While true, the writer takes no appends (they wait in its queue), as
    /// when a disk stalls: for tests and drills.
    pub hold_writes: Arc<AtomicBool>,
}

impl Default for LogOptions {
    fn default() -> LogOptions {
        LogOptions {
            segment_bytes: 64 << 20,
            fail_writes: Arc::new(AtomicBool::new(false)),
            queue_bytes: 256 << 20,
            hold_writes: Arc::new(AtomicBool::new(false)),
        }
    }
}

struct Topic {
    partitions: Vec<Mutex<Partition>>,
    retention: Mutex<Option<Duration>>,
    /// Bumped after every group commit that added records to this topic.
    changed: tokio::sync::watch::Sender<u64>,
}

/// Counts since the log was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Group commits that wrote records.
    pub commits: u64,
    /// fsyncs of segment files by those commits.
    pub fsyncs: u64,
    /// Records appended and acknowledged.
    pub records: u64,
    /// Appends refused because a write or fsync failed.
    pub refused: u64,
    /// Appends refused because the writer's queue was full.
    pub busy: u64,
}

struct Shared {
    dir: PathBuf,
    stats: Mutex<LogStats>,
    options: LogOptions,
    topics: RwLock<BTreeMap<String, Arc<Topic>>>,
    /// Why appends are refused, while they are.
    unhealthy: Mutex<Option<String>>,
    /// Bytes of appends queued for the writer (see [`LogOptions::queue_bytes`]).
    queued: AtomicUsize,
}

/// Records to append, in order: each one's partition and its bytes, cut
/// from one buffer (a request's body as it arrived, or the payloads of a
/// `Vec` laid end to end), so that an append copies each record once, into
/// its segment.
pub struct Records {
    buffer: Box<dyn AsRef<[u8]> + Send + Sync>,
    /// Each record's partition and its bytes' range in `buffer`.
    spans: Vec<(u32, std::ops::Range<usize>)>,
}

impl Records {
    /// Records cut from `buffer`, each `(partition, range)`; `None` when a
    /// range is not within it.
    pub fn cut(
        buffer: impl AsRef<[u8]> + Send + Sync + 'static,
        spans: Vec<(u32, std::ops::Range<usize>)>,
    ) -> Option<Records> {
        let len = buffer.as_ref().len();
        if spans.iter().any(|(_, r)| r.start > r.end || r.end > len) {
            return None;
        }
        Some(Records { buffer: Box::new(buffer), spans })
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Each record's partition and bytes, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &[u8])> {
        let buffer = (*self.buffer).as_ref();
        self.spans.iter().map(move |(p, r)| (*p, &buffer[r.clone()]))
    }

    /// Keeps the records whose place (from 0) `keep` is true for.
    pub fn retain_places(&mut self, mut keep: impl FnMut(usize) -> bool) {
        let mut place = 0;
        self.spans.retain(|_| {
            place += 1;
            keep(place - 1)
        });
    }
}

impl From<Vec<(u32, Vec<u8>)>> for Records {
    fn from(records: Vec<(u32, Vec<u8>)>) -> Records {
        let mut buffer = Vec::with_capacity(records.iter().map(|(_, r)| r.len()).sum());
        let mut spans = Vec::with_capacity(records.len());
        for (partition, payload) in records {
            spans.push((partition, buffer.len()..buffer.len() + payload.len()));
            buffer.extend_from_slice(&payload);
        }
        Records { buffer: Box::new(buffer), spans }
    }
}

/// An append's answer: each record's (partition, offset), or why not.
type Appended = Result<Vec<(u32, u64)>, LogError>;

struct Request {
    topic: Arc<Topic>,
    records: Records,
    /// The tag every record of the request carries ([`Log::append_tagged`]).
    tag: Option<[u8; TAG]>,
    /// What it counts against the queue's bound.
    bytes: usize,
    reply: tokio::sync::oneshot::Sender<Appended>,
}

/// The log. Cloning shares it.
#[derive(Clone)]
pub struct Log {
    shared: Arc<Shared>,
    requests: mpsc::Sender<Request>,
}

/// An append waiting for its group commit.
pub struct Pending(tokio::sync::oneshot::Receiver<Appended>);

impl Pending {
    /// Waits for the answer: each record's partition and offset, in order.
    pub async fn wait(self) -> Result<Vec<(u32, u64)>, LogError> {
        self.0.await.unwrap_or_else(|_| Err(LogError::Unavailable("the log's writer stopped".into())))
    }

    /// The same, blocking the thread (not for async code).
    pub fn wait_blocking(self) -> Result<Vec<(u32, u64)>, LogError> {
        self.0.blocking_recv().unwrap_or_else(|_| Err(LogError::Unavailable("the log's writer stopped".into())))
    }
}

/// Opens each partition of `jobs` (topic, folder, number), on a thread per
/// core at most: each reads and checks every record of its segments. The
/// partitions come back in the order of `jobs`; the first failure in that
/// order is the answer.
fn open_partitions(jobs: &[(&str, PathBuf, u32)]) -> Result<Vec<(Partition, Recovered)>, LogError> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, jobs.len().max(1));
    let next = AtomicUsize::new(0);
    type Opened = Result<(Partition, Recovered), LogError>;
    let done: Mutex<Vec<Option<Opened>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let work = || {
        let mut buf = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((_, dir, p)) = jobs.get(i) else { break };
            let opened = Partition::open(dir, *p, &mut buf);
            if let Some(slot) = lock(&done).get_mut(i) {
                *slot = Some(opened);
            }
        }
    };
    std::thread::scope(|s| {
        // A thread that cannot start leaves its share to the others.
        for _ in 1..threads {
            let _ = std::thread::Builder::new().name("weir-log-open".into()).spawn_scoped(s, work);
        }
        work();
    });
    let done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.into_iter()
        .map(|r| r.unwrap_or_else(|| Err(LogError::Unavailable("a partition was not opened".into()))))
        .collect()
}

impl Log {
    /// Opens (or creates) the log in `dir`, recovering every topic on disk.
    pub fn open(dir: &Path, options: LogOptions) -> Result<(Log, Vec<(String, Recovered)>), LogError> {
        create_private_dir(dir).map_err(|e| LogError::io(dir, "create the log folder", e))?;
        let mut topics = BTreeMap::new();
        let mut recovered = Vec::new();
        let entries = std::fs::read_dir(dir).map_err(|e| LogError::io(dir, "list the log folder", e))?;
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| valid_topic(n))
            .collect();
        names.sort();
        let mut jobs = Vec::new();
        for name in &names {
            let tdir = dir.join(name);
            jobs.extend((0..count_partitions(&tdir)?).map(|p| (name.as_str(), tdir.join(p.to_string()), p)));
        }
        let mut partitions: BTreeMap<&str, Vec<Mutex<Partition>>> =
            names.iter().map(|n| (n.as_str(), Vec::new())).collect();
        for ((name, _, _), (partition, report)) in jobs.iter().zip(open_partitions(&jobs)?) {
            recovered.push((name.to_string(), report));
            partitions.entry(name).or_default().push(Mutex::new(partition));
        }
        for (name, partitions) in partitions {
            topics.insert(name.to_owned(), Arc::new(new_topic(partitions)));
        }
        let shared = Arc::new(Shared {
            dir: dir.to_owned(),
            options,
            stats: Mutex::new(LogStats::default()),
            topics: RwLock::new(topics),
            unhealthy: Mutex::new(None),
            queued: AtomicUsize::new(0),
        });
        let (tx, rx) = mpsc::channel();
        let writer = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("weir-log-writer".into())
            .spawn(move || write_loop(&writer, &rx))
            .map_err(|e| LogError::io(dir, "start the writer thread for", e))?;
        Ok((Log { shared, requests: tx }, recovered))
    }

    /// Makes sure `topic` exists with `partitions` partitions (creating it if
    /// needed) and sets its retention.
    pub fn ensure_topic(&self, topic: &str, partitions: u32, retention: Option<Duration>) -> Result<(), LogError> {
        if !valid_topic(topic) {
            return Err(LogError::TopicName(topic.to_owned()));
        }
        let partitions = partitions.max(1);
        let mut topics = self.shared.topics.write().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = topics.get(topic) {
            let found = t.partitions.len() as u32;
            if found != partitions {
                return Err(LogError::PartitionCount { topic: topic.to_owned(), found, wanted: partitions });
            }
            *lock(&t.retention) = retention;
            return Ok(());
        }
        let tdir = self.shared.dir.join(topic);
        let mut parts = Vec::new();
        for p in 0..partitions {
            parts.push(Mutex::new(Partition::create(&tdir.join(p.to_string()))?));
        }
        let t = new_topic(parts);
        *lock(&t.retention) = retention;
        topics.insert(topic.to_owned(), Arc::new(t));
        Ok(())
    }

    /// Removes `topic` and its files (a drill's copy when the drill ends);
    /// `false` when there was none. Appends still queued for it fail.
    pub fn remove_topic(&self, topic: &str) -> Result<bool, LogError> {
        if !valid_topic(topic) {
            return Err(LogError::TopicName(topic.to_owned()));
        }
        let removed = self.shared.topics.write().unwrap_or_else(|e| e.into_inner()).remove(topic);
        if removed.is_none() {
            return Ok(false);
        }
        let tdir = self.shared.dir.join(topic);
        std::fs::remove_dir_all(&tdir).map_err(|e| LogError::io(&tdir, "remove the topic folder", e))?;
        Ok(true)
    }

    pub fn topics(&self) -> Vec<String> {
        self.shared.topics.read().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    pub fn partitions(&self, topic: &str) -> Result<u32, LogError> {
        Ok(self.topic(topic)?.partitions.len() as u32)
    }

    fn topic(&self, topic: &str) -> Result<Arc<Topic>, LogError> {
        let topics = self.shared.topics.read().unwrap_or_else(|e| e.into_inner());
        topics.get(topic).cloned().ok_or_else(|| LogError::NoTopic(topic.to_owned()))
    }

    /// Queues records `(partition, payload)` for the next group commit.
    pub fn append(&self, topic: &str, records: impl Into<Records>) -> Result<Pending, LogError> {
        self.append_with(topic, records.into(), None)
    }

    /// As [`Log::append`], each record carrying `tag` (read back as
    /// [`Record::tag`]): the records of one request can be told from any
    /// other's with the same bytes.
    pub fn append_tagged(&self, topic: &str, records: impl Into<Records>, tag: [u8; TAG]) -> Result<Pending, LogError> {
        self.append_with(topic, records.into(), Some(tag))
    }

    fn append_with(&self, topic: &str, records: Records, tag: Option<[u8; TAG]>) -> Result<Pending, LogError> {
        let t = self.topic(topic)?;
        let partitions = t.partitions.len() as u32;
        if let Some((partition, _)) = records.iter().find(|(p, _)| *p >= partitions) {
            return Err(LogError::NoPartition { topic: topic.to_owned(), partition, partitions });
        }
        // A tag is part of the record's body, so it counts against the limit.
        let most = RECORD_MAX - if tag.is_some() { TAG } else { 0 };
        if let Some((_, big)) = records.iter().find(|(_, r)| r.len() > most) {
            return Err(LogError::TooLarge(big.len()));
        }
        if let Some(why) = lock(&self.shared.unhealthy).clone() {
            return Err(LogError::Unavailable(why));
        }
        let bytes = records.iter().map(|(_, r)| r.len() + 64).sum::<usize>() + 64;
        let limit = self.shared.options.queue_bytes;
        let queued = self.shared.queued.fetch_add(bytes, Ordering::SeqCst);
        if queued + bytes > limit && queued > 0 {
            self.shared.queued.fetch_sub(bytes, Ordering::SeqCst);
            lock(&self.shared.stats).busy += 1;
            return Err(LogError::Busy { queued, limit });
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        if self.requests.send(Request { topic: t, records, tag, bytes, reply }).is_err() {
            self.shared.queued.fetch_sub(bytes, Ordering::SeqCst);
            return Err(LogError::Unavailable("the log's writer stopped".into()));
        }
        Ok(Pending(rx))
    }

    pub fn stats(&self) -> LogStats {
        *lock(&self.shared.stats)
    }

    /// Why appends are refused, while they are.
    pub fn unhealthy(&self) -> Option<String> {
        lock(&self.shared.unhealthy).clone()
    }

    /// Durable records of one partition from offset `from`: at most
    /// `max_records`, and stopping once about `max_bytes` of payload are read.
    pub fn read(
        &self,
        topic: &str,
        partition: u32,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>, LogError> {
        let t = self.topic(topic)?;
        let partitions = t.partitions.len() as u32;
        let p = t.partitions.get(partition as usize).ok_or_else(|| LogError::NoPartition {
            topic: topic.to_owned(),
            partition,
            partitions,
        })?;
        let mut out: Vec<Record> = Vec::new();
        let mut from = from;
        while out.len() < max_records && out.iter().map(|r| r.payload.len()).sum::<usize>() < max_bytes {
            let Some(plan) = lock(p).locate(from) else { break };
            partition::read_segment(&plan, partition, max_records, max_bytes, &mut out)?;
            // Read to the segment's end unless a limit stopped it: go on from there.
            from = plan.end;
        }
        Ok(out)
    }

    /// For each partition: the first offset still kept and the offset the
    /// next durable record will get.
    pub fn bounds(&self, topic: &str) -> Result<Vec<(u64, u64)>, LogError> {
        let t = self.topic(topic)?;
        Ok(t.partitions.iter().map(|p| lock(p)).map(|p| (p.start_offset(), p.durable_end())).collect())
    }

    /// A receiver that changes after every group commit adding to `topic`.
    pub fn subscribe(&self, topic: &str) -> Result<tokio::sync::watch::Receiver<u64>, LogError> {
        Ok(self.topic(topic)?.changed.subscribe())
    }

    /// Deletes closed segments older than each topic's retention; returns
    /// how many it deleted.
    pub fn enforce_retention(&self, now_ms: i64) -> Result<u64, LogError> {
        let topics: Vec<Arc<Topic>> =
            self.shared.topics.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        let mut dropped = 0;
        for t in topics {
            let Some(retention) = *lock(&t.retention) else { continue };
            let cutoff = now_ms.saturating_sub(retention.as_millis() as i64);
            for p in &t.partitions {
                dropped += lock(p).drop_older_than(cutoff)?;
            }
        }
        Ok(dropped)
    }
}

fn new_topic(partitions: Vec<Mutex<Partition>>) -> Topic {
    Topic { partitions, retention: Mutex::new(None), changed: tokio::sync::watch::Sender::new(0) }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn valid_topic(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn count_partitions(tdir: &Path) -> Result<u32, LogError> {
    let entries = std::fs::read_dir(tdir).map_err(|e| LogError::io(tdir, "list the topic folder", e))?;
    let mut ids: Vec<u32> = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    ids.sort_unstable();
    for (i, id) in ids.iter().enumerate() {
        if *id != i as u32 {
            let detail = format!("partition folder {i} is missing; the topic has folders {ids:?}");
            return Err(LogError::Corrupt { file: tdir.to_owned(), position: 0, detail });
        }
    }
    Ok(ids.len() as u32)
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// The writer thread: group commits until every [`Log`] handle is gone.
fn write_loop(shared: &Shared, rx: &mpsc::Receiver<Request>) {
    let mut last_probe = Instant::now();
    loop {
        let first = match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                heal(shared, &mut last_probe);
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        // (Taken requests still count against the queue until answered.)
        while shared.options.hold_writes.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut group = vec![first];
        while group.len() < 4096 {
            match rx.try_recv() {
                Ok(r) => group.push(r),
                Err(_) => break,
            }
        }
        heal(shared, &mut last_probe);
        let bytes: usize = group.iter().map(|r| r.bytes).sum();
        let unhealthy = lock(&shared.unhealthy).clone();
        let answers = match unhealthy {
            Some(why) => refuse(shared, group, &why),
            None => commit(shared, group),
        };
        // The queue is freed before anyone hears back, so a caller that
        // appends again on its answer finds the room its append left.
        shared.queued.fetch_sub(bytes, Ordering::SeqCst);
        for (reply, answer) in answers {
            let _ = reply.send(answer);
        }
    }
}

/// Where an append's answer goes, and the answer.
type Answer = (tokio::sync::oneshot::Sender<Appended>, Appended);

fn refuse(shared: &Shared, group: Vec<Request>, why: &str) -> Vec<Answer> {
    lock(&shared.stats).refused += group.len() as u64;
    group.into_iter().map(|req| (req.reply, Err(LogError::Unavailable(why.to_string())))).collect()
}

/// One group commit: push, write and fsync every touched partition, then
/// publish; on any failure, cut everything back and refuse all. Returns
/// the answers, for the caller to send once the queue is freed.
fn commit(shared: &Shared, group: Vec<Request>) -> Vec<Answer> {
    let now = now_ms();
    let mut answers = Vec::with_capacity(group.len());
    // Touched partitions, in a fixed order: (topic pointer, partition).
    let mut touched: Vec<(Arc<Topic>, u32)> = Vec::new();
    for req in &group {
        let mut offsets = Vec::with_capacity(req.records.len());
        for (partition, payload) in req.records.iter() {
            let mut p = lock(&req.topic.partitions[partition as usize]);
            if !p.has_pending() {
                touched.push((Arc::clone(&req.topic), partition));
            }
            offsets.push((partition, p.push(payload, req.tag.as_ref(), now)));
        }
        answers.push(offsets);
    }
    let fail = shared.options.fail_writes.load(Ordering::SeqCst);
    let mut failure = None;
    for (topic, partition) in &touched {
        if let Err(e) = lock(&topic.partitions[*partition as usize]).write_pending(fail) {
            failure = Some(e);
            break;
        }
    }
    if let Some(e) = failure {
        for (topic, partition) in &touched {
            lock(&topic.partitions[*partition as usize]).discard_pending();
        }
        *lock(&shared.unhealthy) = Some(e.to_string());
        return refuse(shared, group, &e.to_string());
    }
    {
        let mut stats = lock(&shared.stats);
        stats.commits += 1;
        stats.fsyncs += touched.len() as u64;
        stats.records += answers.iter().map(|a| a.len() as u64).sum::<u64>();
    }
    for (topic, partition) in &touched {
        if let Err(e) = lock(&topic.partitions[*partition as usize]).publish(shared.options.segment_bytes) {
            // The records are durable and answered; new ones wait for a probe.
            *lock(&shared.unhealthy) = Some(e.to_string());
        }
    }
    let mut notified: Vec<*const Topic> = Vec::new();
    for (topic, _) in &touched {
        if !notified.contains(&Arc::as_ptr(topic)) {
            notified.push(Arc::as_ptr(topic));
            topic.changed.send_modify(|n| *n += 1);
        }
    }
    group.into_iter().zip(answers).map(|(req, offsets)| (req.reply, Ok(offsets))).collect()
}

/// While unhealthy, at most once a second: probe every partition (cut back,
/// fsync); healthy again when all succeed and writes are not being failed.
fn heal(shared: &Shared, last_probe: &mut Instant) {
    if lock(&shared.unhealthy).is_none() || last_probe.elapsed() < Duration::from_secs(1) {
        return;
    }
    *last_probe = Instant::now();
    if shared.options.fail_writes.load(Ordering::SeqCst) {
        return;
    }
    let topics: Vec<Arc<Topic>> = shared.topics.read().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
    for t in topics {
        for p in &t.partitions {
            if let Err(e) = lock(p).probe() {
                *lock(&shared.unhealthy) = Some(e.to_string());
                return;
            }
        }
    }
    *lock(&shared.unhealthy) = None;
}
