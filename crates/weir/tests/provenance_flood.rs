//! Issue 17 point 4, readers cannot exhaust what producers need: 300
//! readers asking for provenance without pause, while a steady producer's
//! POST time stays within twice its time alone. Measured by `weir bench
//! provenance` (the readers on one client thread, as clients on other
//! machines would be); alone in its test binary, so no other test's load
//! falls on one half of the comparison.

mod common;

/// The numbers after each `p99 ` in the bench's report, in order: one
/// request at a time, the producer alone, the producer with the readers.
fn p99s(report: &str) -> Vec<f64> {
    report.split("p99 ").skip(1).filter_map(|rest| rest.split(' ').next()?.parse().ok()).collect()
}

#[test]
fn point_4_three_hundred_readers_asking_for_provenance_do_not_stall_a_producer() {
    let out = common::weir(&[&"bench", &"provenance", &"--events", &"20000", &"--readers", &"300", &"--seconds", &"5"]);
    let report = common::text(&out.stdout);
    assert!(out.status.success(), "{report}{}", common::text(&out.stderr));
    let p99 = p99s(&report);
    assert_eq!(p99.len(), 3, "{report}");
    let (alone, loaded) = (p99[1], p99[2]);
    assert!(loaded <= 2.0 * alone, "the producer's p99 went from {alone} ms alone to {loaded} ms: {report}");
    let answers: f64 = report
        .split(" provenance answers/s")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    assert!(answers >= 100.0, "the readers were answered too: {report}");
    assert!(report.contains(", 0 failed"), "every reader's request was answered 200: {report}");
}
