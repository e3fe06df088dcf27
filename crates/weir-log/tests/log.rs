//! The embedded log against a real file system: appends, group commit,
//! reopening, segments and retention, torn tails, corruption, failed writes.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use weir_log::{Log, LogError, LogOptions, Records};

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("weir-log-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(dir: &Path, segment_bytes: u64) -> Log {
    Log::open(dir, LogOptions { segment_bytes, ..LogOptions::default() }).unwrap().0
}

fn append(log: &Log, topic: &str, records: &[(u32, &str)]) -> Result<Vec<(u32, u64)>, LogError> {
    let batch: Vec<_> = records.iter().map(|(p, r)| (*p, r.as_bytes().to_vec())).collect();
    log.append(topic, batch)?.wait_blocking()
}

fn payloads(log: &Log, topic: &str, partition: u32, from: u64) -> Vec<(u64, String)> {
    let records = log.read(topic, partition, from, usize::MAX, usize::MAX).unwrap();
    records.into_iter().map(|r| (r.offset, String::from_utf8(r.payload).unwrap())).collect()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// Records cut from one buffer (a request's body) are appended as the
/// bytes of their ranges, after the places a retry keeps; a range past the
/// buffer is refused before anything is queued.
#[test]
fn records_cut_from_a_buffer_append_their_ranges() {
    let dir = Dir::new("cut");
    let log = open(&dir.0, 1 << 20);
    log.ensure_topic("t", 2, None).unwrap();
    let body = b"{\"a\":1}\n{\"b\":2}\r\n\n{\"c\":3}".to_vec();
    let spans = vec![(1, 0..7), (0, 8..15), (1, 18..25)];
    assert!(Records::cut(body.clone(), vec![(0, 20..26)]).is_none(), "past the end");
    #[allow(clippy::reversed_empty_ranges)]
    let backwards = vec![(0, 5..4)];
    assert!(Records::cut(body.clone(), backwards).is_none(), "a range that ends before it starts");
    let mut records = Records::cut(body, spans).unwrap();
    let got: Vec<(u32, &[u8])> = records.iter().collect();
    assert_eq!(got, vec![(1, &b"{\"a\":1}"[..]), (0, &b"{\"b\":2}"[..]), (1, &b"{\"c\":3}"[..])]);
    records.retain_places(|place| place != 1);
    assert_eq!(records.len(), 2);
    assert_eq!(log.append("t", records).unwrap().wait_blocking().unwrap(), vec![(1, 0), (1, 1)]);
    assert_eq!(payloads(&log, "t", 1, 0), vec![(0, "{\"a\":1}".into()), (1, "{\"c\":3}".into())]);
    assert!(payloads(&log, "t", 0, 0).is_empty());
}

#[test]
fn appends_get_contiguous_offsets_per_partition_and_read_back() {
    let dir = Dir::new("basic");
    let log = open(&dir.0, 1 << 20);
    log.ensure_topic("payments", 2, None).unwrap();
    let got = append(&log, "payments", &[(0, "a"), (1, "b"), (0, "c")]).unwrap();
    assert_eq!(got, vec![(0, 0), (1, 0), (0, 1)]);
    assert_eq!(append(&log, "payments", &[(0, "d")]).unwrap(), vec![(0, 2)]);
    assert_eq!(payloads(&log, "payments", 0, 0), vec![(0, "a".into()), (1, "c".into()), (2, "d".into())]);
    assert_eq!(payloads(&log, "payments", 0, 2), vec![(2, "d".into())]);
    assert_eq!(payloads(&log, "payments", 1, 0), vec![(0, "b".into())]);
    assert!(payloads(&log, "payments", 0, 3).is_empty());
    assert_eq!(log.read("payments", 0, 0, 2, usize::MAX).unwrap().len(), 2);
    assert_eq!(log.bounds("payments").unwrap(), vec![(0, 3), (0, 1)]);
    assert!(matches!(log.read("payments", 2, 0, 1, 1), Err(LogError::NoPartition { .. })));
    assert!(matches!(append(&log, "nope", &[(0, "x")]), Err(LogError::NoTopic(_))));
    assert!(matches!(log.ensure_topic("payments", 3, None), Err(LogError::PartitionCount { .. })));
    assert!(matches!(log.ensure_topic("../x", 1, None), Err(LogError::TopicName(_))));
}

#[test]
fn concurrent_producers_share_fsyncs_and_lose_nothing() {
    let dir = Dir::new("group");
    let log = open(&dir.0, 1 << 20);
    log.ensure_topic("t", 1, None).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                (0..200).map(|i| append(&log, "t", &[(0, &format!("{t}-{i}"))]).unwrap()[0].1).collect::<Vec<u64>>()
            })
        })
        .collect();
    let mut offsets: Vec<u64> = threads.into_iter().flat_map(|h| h.join().unwrap()).collect();
    offsets.sort_unstable();
    assert_eq!(offsets, (0..1600).collect::<Vec<u64>>());
    let stats = log.stats();
    assert_eq!(stats.records, 1600);
    assert!(stats.commits < 1600, "every append had its own fsync: {stats:?}");
    let read = payloads(&log, "t", 0, 0);
    assert_eq!(read.len(), 1600);
    for t in 0..8 {
        // Each producer's records are in the order it sent them.
        let mine: Vec<String> =
            read.iter().map(|(_, p)| p.clone()).filter(|p| p.starts_with(&format!("{t}-"))).collect();
        assert_eq!(mine, (0..200).map(|i| format!("{t}-{i}")).collect::<Vec<_>>());
    }
}

#[test]
fn reopening_keeps_everything_and_continues_the_offsets() {
    let dir = Dir::new("reopen");
    {
        let log = open(&dir.0, 100);
        log.ensure_topic("t", 1, None).unwrap();
        for i in 0..20 {
            append(&log, "t", &[(0, &format!("record number {i}"))]).unwrap();
        }
    }
    let (log, recovered) = Log::open(&dir.0, LogOptions { segment_bytes: 100, ..LogOptions::default() }).unwrap();
    assert_eq!(recovered.len(), 1);
    assert_eq!((recovered[0].1.records, recovered[0].1.torn_bytes), (20, 0));
    assert!(segments(&dir.0.join("t/0")).len() > 5, "small segments roll");
    assert_eq!(append(&log, "t", &[(0, "after")]).unwrap(), vec![(0, 20)]);
    let read = payloads(&log, "t", 0, 0);
    assert_eq!(read.len(), 21);
    assert_eq!(read[7], (7, "record number 7".into()));
    assert_eq!(payloads(&log, "t", 0, 13)[0], (13, "record number 13".into()));
}

#[test]
fn retention_deletes_whole_old_segments_only() {
    let dir = Dir::new("retention");
    let log = open(&dir.0, 100);
    log.ensure_topic("t", 1, Some(Duration::from_secs(3600))).unwrap();
    for i in 0..20 {
        append(&log, "t", &[(0, &format!("record number {i}"))]).unwrap();
    }
    assert_eq!(log.enforce_retention(weir_log::now_ms()).unwrap(), 0, "nothing is an hour old");
    let before = segments(&dir.0.join("t/0")).len();
    let dropped = log.enforce_retention(weir_log::now_ms() + 7_200_000).unwrap();
    assert_eq!(dropped as usize, before - 1, "all but the segment being written");
    let (start, end) = log.bounds("t").unwrap()[0];
    assert_eq!(end, 20);
    let read = payloads(&log, "t", 0, 0);
    assert_eq!(read.first().map(|r| r.0), Some(start).filter(|_| start < end));
    assert_eq!(read.len() as u64, end - start);
}

#[test]
fn a_torn_tail_is_cut_and_writing_goes_on() {
    let dir = Dir::new("torn");
    {
        let log = open(&dir.0, 1 << 20);
        log.ensure_topic("t", 1, None).unwrap();
        for i in 0..10 {
            append(&log, "t", &[(0, &format!("event {i}"))]).unwrap();
        }
    }
    let seg = segments(&dir.0.join("t/0")).pop().unwrap();
    let len = std::fs::metadata(&seg).unwrap().len();
    // A crash in the middle of the last record's write.
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 3).unwrap();
    let (log, recovered) = Log::open(&dir.0, LogOptions::default()).unwrap();
    assert_eq!(recovered[0].1.records, 9);
    assert!(recovered[0].1.torn_bytes > 0);
    assert_eq!(append(&log, "t", &[(0, "new")]).unwrap(), vec![(0, 9)]);
    assert_eq!(payloads(&log, "t", 0, 8), vec![(8, "event 8".into()), (9, "new".into())]);
    drop(log);
    // Zeros after the last record, as a file system may leave after a power cut.
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes.extend_from_slice(&[0u8; 100]);
    std::fs::write(&seg, &bytes).unwrap();
    let (log, recovered) = Log::open(&dir.0, LogOptions::default()).unwrap();
    assert_eq!((recovered[0].1.records, recovered[0].1.torn_bytes), (10, 100));
    assert_eq!(payloads(&log, "t", 0, 0).len(), 10);
}

#[test]
fn a_corrupt_middle_is_refused_naming_the_file_and_position() {
    let dir = Dir::new("corrupt");
    {
        let log = open(&dir.0, 1 << 20);
        log.ensure_topic("t", 1, None).unwrap();
        for i in 0..10 {
            append(&log, "t", &[(0, &format!("event {i}"))]).unwrap();
        }
    }
    let seg = segments(&dir.0.join("t/0")).pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    // The third record's payload: 2 records of 24 + 7 bytes, then a header.
    bytes[2 * 31 + 24] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();
    let err = Log::open(&dir.0, LogOptions::default()).err().unwrap();
    match &err {
        LogError::Corrupt { file, position, .. } => assert_eq!((file, *position), (&seg, 62)),
        other => panic!("not a corruption error: {other}"),
    }
    let text = err.to_string();
    assert!(text.contains(&seg.display().to_string()) && text.contains("byte 62"), "{text}");
    // Nothing was cut: the damage is left for an operator to see.
    assert_eq!(std::fs::read(&seg).unwrap(), bytes);
}

#[test]
fn damage_in_an_earlier_segment_is_refused_even_at_its_end() {
    let dir = Dir::new("corrupt-early");
    {
        let log = open(&dir.0, 100);
        log.ensure_topic("t", 1, None).unwrap();
        for i in 0..10 {
            append(&log, "t", &[(0, &format!("record number {i}"))]).unwrap();
        }
    }
    let first = segments(&dir.0.join("t/0")).remove(0);
    let len = std::fs::metadata(&first).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&first).unwrap().set_len(len - 1).unwrap();
    assert!(matches!(Log::open(&dir.0, LogOptions::default()), Err(LogError::Corrupt { .. })));
}

#[test]
fn a_failed_write_acknowledges_nothing_and_refuses_until_healthy() {
    let dir = Dir::new("fail");
    let options = LogOptions::default();
    let fail = options.fail_writes.clone();
    let (log, _) = Log::open(&dir.0, options).unwrap();
    log.ensure_topic("t", 2, None).unwrap();
    append(&log, "t", &[(0, "before")]).unwrap();
    fail.store(true, Ordering::SeqCst);
    let refused = append(&log, "t", &[(0, "lost"), (1, "lost too")]);
    assert!(matches!(refused, Err(LogError::Unavailable(_))), "{refused:?}");
    assert!(log.unhealthy().is_some());
    // Refused at once while unhealthy, even once the disk is fine again,
    // until the writer has probed it.
    assert!(matches!(append(&log, "t", &[(0, "x")]), Err(LogError::Unavailable(_))));
    fail.store(false, Ordering::SeqCst);
    let mut healthy = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        if log.unhealthy().is_none() {
            healthy = true;
            break;
        }
    }
    assert!(healthy, "the log did not heal");
    assert_eq!(append(&log, "t", &[(0, "after"), (1, "after")]).unwrap(), vec![(0, 1), (1, 0)]);
    assert_eq!(payloads(&log, "t", 0, 0), vec![(0, "before".into()), (1, "after".into())]);
    assert_eq!(payloads(&log, "t", 1, 0), vec![(0, "after".into())]);
    drop(log);
    let (log, recovered) = Log::open(&dir.0, LogOptions::default()).unwrap();
    assert!(recovered.iter().all(|(_, r)| r.torn_bytes == 0));
    assert_eq!(payloads(&log, "t", 0, 0).len(), 2);
}

#[tokio::test]
async fn async_appends_and_subscribers_see_commits() {
    let dir = Dir::new("async");
    let log = open(&dir.0, 1 << 20);
    log.ensure_topic("t", 1, None).unwrap();
    let mut changes = log.subscribe("t").unwrap();
    let pending = log.append("t", vec![(0, b"{}".to_vec())]).unwrap();
    assert_eq!(pending.wait().await.unwrap(), vec![(0, 0)]);
    tokio::time::timeout(Duration::from_secs(5), changes.changed()).await.unwrap().unwrap();
    assert_eq!(log.read("t", 0, 0, 10, 1 << 20).unwrap()[0].payload, b"{}");
}

#[test]
fn a_full_writer_queue_refuses_appends_at_once_and_takes_them_again_once_it_drains() {
    let dir = Dir::new("busy");
    let options = LogOptions { queue_bytes: 10_000, ..LogOptions::default() };
    let hold = options.hold_writes.clone();
    let (log, _) = Log::open(&dir.0, options).unwrap();
    log.ensure_topic("t", 1, None).unwrap();
    // The writer stalls (as on a stalled disk): appends wait in its queue
    // until about 10,000 bytes are waiting, and then are refused at once.
    hold.store(true, Ordering::SeqCst);
    let record = "x".repeat(1_000);
    let mut waiting = Vec::new();
    let refused = loop {
        match log.append("t", vec![(0, record.clone().into_bytes())]) {
            Ok(pending) => waiting.push(pending),
            Err(e) => break e,
        }
        assert!(waiting.len() < 100, "the queue is not bounded");
    };
    // 1,000 bytes a record, plus 64 for the record and 64 for the append: 8 fit in 10,000.
    assert_eq!(waiting.len(), 8);
    assert!(matches!(refused, LogError::Busy { limit: 10_000, .. }), "{refused:?}");
    assert!(refused.to_string().contains("log_queue_bytes"), "{refused}");
    assert_eq!(log.stats().busy, 1);
    hold.store(false, Ordering::SeqCst);
    let offsets: Vec<u64> = waiting.into_iter().map(|p| p.wait_blocking().unwrap()[0].1).collect();
    assert_eq!(offsets, (0..8).collect::<Vec<u64>>(), "every queued append is written, in order");
    assert_eq!(log.append("t", vec![(0, record.into_bytes())]).unwrap().wait_blocking().unwrap(), vec![(0, 8)]);
}

#[test]
fn a_removed_topic_is_gone_with_its_files_and_the_others_stay() {
    let dir = Dir::new("remove");
    let log = open(&dir.0, 1 << 20);
    log.ensure_topic("payments", 1, None).unwrap();
    log.ensure_topic("payments.drill-1", 2, None).unwrap();
    append(&log, "payments", &[(0, "a")]).unwrap();
    append(&log, "payments.drill-1", &[(0, "b"), (1, "c")]).unwrap();
    assert!(log.remove_topic("payments.drill-1").unwrap());
    assert!(!dir.0.join("payments.drill-1").exists());
    assert!(matches!(append(&log, "payments.drill-1", &[(0, "x")]), Err(LogError::NoTopic(_))));
    assert!(!log.remove_topic("payments.drill-1").unwrap(), "nothing left to remove");
    assert!(matches!(log.remove_topic("../x"), Err(LogError::TopicName(_))));
    assert_eq!(payloads(&log, "payments", 0, 0), vec![(0, "a".into())]);
    drop(log);
    let log = open(&dir.0, 1 << 20);
    assert_eq!(log.topics(), ["payments"], "not recovered after a restart");
}

/// A tagged record reads back with its tag after a reopen, beside untagged
/// ones, and its tag counts against the record limit: a payload that would
/// make the body larger than any record is refused, not written unreadable.
#[test]
fn tagged_records_keep_their_tag_and_the_tag_counts_against_the_limit() {
    let dir = Dir::new("tagged");
    let tag = [7u8; weir_log::TAG];
    {
        let log = open(&dir.0, 1 << 20);
        log.ensure_topic("t", 1, None).unwrap();
        append(&log, "t", &[(0, "{\"a\":1}")]).unwrap();
        log.append_tagged("t", vec![(0, b"{\"b\":2}".to_vec())], tag).unwrap().wait_blocking().unwrap();
        let over = vec![b'x'; weir_log::RECORD_MAX - weir_log::TAG + 1];
        assert!(matches!(log.append_tagged("t", vec![(0, over)], tag), Err(LogError::TooLarge(_))));
    }
    let log = open(&dir.0, 1 << 20);
    let read = log.read("t", 0, 0, 10, 1 << 20).unwrap();
    let tags: Vec<Option<[u8; weir_log::TAG]>> = read.iter().map(|r| r.tag).collect();
    assert_eq!(tags, vec![None, Some(tag)]);
    assert_eq!(read[1].payload, b"{\"b\":2}");
}
