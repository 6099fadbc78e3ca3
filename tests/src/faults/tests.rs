//! The analysis must catch what it is there to catch: these feed it records
//! of runs that broke the rules.

use std::collections::HashMap;

use super::nemesis::{DriftClock, executes};
use super::*;

fn config() -> Config {
    Config::short(PathBuf::from("unused"))
}

fn section(holder: &str, fence: i64, start_ms: i64, valid_until_ms: Option<i64>) -> Section {
    Section {
        holder: holder.to_owned(),
        fence: Some(fence),
        t_req: start_ms * 1000,
        t_start: start_ms * 1000,
        t_granted: None,
        t_last_valid: valid_until_ms.map(|t| t * 1000),
        t_end: Some(valid_until_ms.unwrap_or(start_ms) * 1000 + 1),
        valid_end: Some(valid_until_ms.is_some()),
        t_cancel: None,
        wake_t: None,
        wake_valid: None,
        wake_cancelled_now: None,
        wake_cancel_us: None,
        wake_write_accepted: None,
    }
}

fn write(holder: &str, fence: i64, accepted: bool) -> Write {
    Write {
        holder: holder.to_owned(),
        fence,
        valid_after: Some(false),
        accepted,
        t_client: 0,
    }
}

fn kill_event(victim: &str, at_ms: i64) -> Event {
    Event {
        t: at_ms * 1000,
        victim: Some(victim.to_owned()),
        ..Event::default()
    }
}

fn run(
    fault: Fault,
    killed: &[(&str, i64)],
    events: &[Event],
    sections: &[Section],
    writes: &[Write],
) -> ScenarioResult {
    run_on(
        BackendKind::PgTable,
        fault,
        killed,
        events,
        sections,
        writes,
    )
}

fn run_on(
    backend: BackendKind,
    fault: Fault,
    killed: &[(&str, i64)],
    events: &[Event],
    sections: &[Section],
    writes: &[Write],
) -> ScenarioResult {
    let killed = killed
        .iter()
        .map(|(h, t)| ((*h).to_owned(), t * 1000))
        .collect();
    let last = writes
        .iter()
        .filter(|w| w.accepted)
        .fold((0, String::new()), |m, w| {
            if w.fence >= m.0 {
                (w.fence, w.holder.clone())
            } else {
                m
            }
        });
    analyse(
        &config(),
        backend,
        fault,
        &killed,
        events,
        sections,
        writes,
        &last,
    )
}

#[test]
fn intersecting_valid_sections_are_overlaps() {
    let sections = [
        section("a", 1, 0, Some(500)),
        section("b", 2, 400, Some(900)),
    ];
    let r = run(Fault::Latency, &[], &[], &sections, &[]);
    assert_eq!(r.overlaps, 1);
    assert_eq!(r.max_overlap, Duration::from_millis(100));
    assert!(
        r.failures.iter().any(|f| f.contains("overlaps")),
        "{:?}",
        r.failures
    );
}

#[test]
fn sections_that_touch_or_ended_invalid_are_not_overlaps() {
    let sections = [
        section("a", 1, 0, Some(500)),
        section("b", 2, 500, Some(900)),
        // Lost its lease at once: never valid after its start.
        section("c", 3, 600, None),
        // The same holder twice is not two holders.
        section("b", 4, 850, Some(1000)),
    ];
    let r = run(Fault::Latency, &[], &[], &sections, &[]);
    assert_eq!(r.overlaps, 0, "{r:?}");
}

#[test]
fn a_killed_holder_counts_as_valid_until_its_kill() {
    let mut killed = section("a", 1, 0, Some(10));
    killed.t_end = None;
    let sections = [killed, section("b", 2, 700, Some(900))];
    // Killed at 800 ms: it could have acted until then.
    let r = run(
        Fault::Kill,
        &[("a", 800)],
        &[kill_event("a", 800)],
        &sections,
        &[],
    );
    assert_eq!(r.overlaps, 1);
    // Killed at 600 ms: b's takeover came after.
    let r = run(
        Fault::Kill,
        &[("a", 600)],
        &[kill_event("a", 600)],
        &sections,
        &[],
    );
    assert_eq!(r.overlaps, 0);
    assert_eq!(r.hits, 1);
    assert_eq!(r.takeovers, vec![Duration::from_millis(100)]);
}

#[test]
fn a_section_that_never_ended_without_a_kill_is_a_failure() {
    let mut lost = section("a", 1, 0, Some(10));
    lost.t_end = None;
    let r = run(Fault::Latency, &[], &[], &[lost], &[]);
    assert!(
        r.failures.iter().any(|f| f.contains("died")),
        "{:?}",
        r.failures
    );
}

#[test]
fn stale_fence_writes_are_found_in_the_log() {
    let writes = [
        write("a", 1, true),
        write("a", 1, true),
        write("b", 2, true),
        write("a", 1, false),
        // Accepted although lower: the checker's guard failed.
        write("a", 1, true),
        // An equal fence from another holder is stale too.
        write("c", 2, true),
    ];
    let r = run(
        Fault::Latency,
        &[],
        &[],
        &[section("a", 1, 0, Some(1))],
        &writes,
    );
    assert_eq!(r.stale_accepted, 2);
    assert_eq!(r.writes, (5, 1));
    assert!(
        r.failures.iter().any(|f| f.contains("stale")),
        "{:?}",
        r.failures
    );
}

#[test]
fn a_resource_that_disagrees_with_its_log_is_reported() {
    let killed = HashMap::new();
    let r = analyse(
        &config(),
        BackendKind::PgTable,
        Fault::Latency,
        &killed,
        &[],
        &[section("a", 1, 0, Some(1))],
        &[write("a", 3, true)],
        &(2, "a".to_owned()),
    );
    assert!(
        r.failures.iter().any(|f| f.contains("inconsistent")),
        "{:?}",
        r.failures
    );
}

#[test]
fn reissued_fences_are_counted() {
    let sections = [
        section("a", 5, 0, Some(10)),
        section("b", 6, 20, Some(30)),
        section("c", 1, 40, Some(50)),
        section("d", 6, 60, Some(70)),
    ];
    let r = run(Fault::RestartNoPersistence, &[], &[], &sections, &[]);
    assert_eq!(r.fence_reissues, 2);
}

#[test]
fn a_woken_holder_that_still_believes_is_a_failure() {
    let mut s = section("a", 1, 0, Some(100));
    s.t_end = Some(3_000_000);
    s.wake_t = Some(2_600_000);
    s.wake_valid = Some(true);
    s.wake_cancel_us = None;
    s.wake_write_accepted = Some(true);
    let sections = [s, section("b", 2, 1200, Some(1500))];
    let mut event = kill_event("a", 50);
    event.t_lifted = Some(2_600_000);
    assert!(
        event.t_lifted.unwrap() - event.t > 2_000_000,
        "a long pause"
    );
    let r = run(Fault::Stop, &[], &[event], &sections, &[]);
    assert_eq!(r.hits, 1);
    let all = r.failures.join("; ");
    assert!(all.contains("is_valid() was true"), "{all}");
    assert!(all.contains("not cancelled"), "{all}");
    assert!(all.contains("old fence was accepted"), "{all}");
}

/// A stopped `PgAdvisory` holder keeps its lock with its session: its
/// write with its fence after waking is not stale by itself (the fenced
/// resource decides, and the stale-fence count checks it).
#[test]
fn a_woken_advisory_holder_may_write_with_its_fence() {
    let mut s = section("a", 1, 0, Some(100));
    s.t_end = Some(3_000_000);
    s.wake_t = Some(2_600_000);
    s.wake_valid = Some(false);
    s.wake_cancel_us = Some(0);
    s.wake_write_accepted = Some(true);
    let mut event = kill_event("a", 50);
    event.t_lifted = Some(2_600_000);
    let fenced = run_on(
        BackendKind::PgAdvisoryFenced,
        Fault::Stop,
        &[],
        &[event.clone()],
        &[s.clone()],
        &[],
    );
    let all = fenced.failures.join("; ");
    assert!(!all.contains("old fence"), "{all}");
    let table = run(Fault::Stop, &[], &[event], &[s], &[]);
    let all = table.failures.join("; ");
    assert!(all.contains("old fence was accepted"), "{all}");
}

#[test]
fn a_slow_takeover_after_a_kill_is_a_failure() {
    let mut killed = section("a", 1, 0, Some(10));
    killed.t_end = None;
    let sections = [killed, section("b", 2, 3000, Some(3100))];
    let r = run(
        Fault::Kill,
        &[("a", 100)],
        &[kill_event("a", 100)],
        &sections,
        &[],
    );
    assert!(
        r.failures.iter().any(|f| f.contains("takeover")),
        "{:?}",
        r.failures
    );
}

#[test]
fn a_cancellation_belongs_to_the_injection_just_before_it() {
    // One section that lived through two injections: the lease survived the
    // first (at 100 ms) and was lost 900 ms after the second (at 3000 ms).
    let mut s = section("a", 1, 0, Some(3800));
    s.t_cancel = Some(3_900_000);
    let events = [kill_event("a", 100), kill_event("a", 3000)];
    let r = run(Fault::Restart, &[], &events, &[s], &[]);
    assert_eq!(r.hits, 2);
    assert_eq!(r.cancels, vec![None, Some(Duration::from_millis(900))]);
}

fn failed(r: &ScenarioResult, what: &str) -> bool {
    r.failures.iter().any(|f| f.contains(what))
}

/// A write by `holder`, rejected although its lease was valid all along.
fn valid_but_rejected(holder: &str, fence: i64, at_ms: i64) -> Write {
    Write {
        valid_after: Some(true),
        t_client: at_ms * 1000,
        ..write(holder, fence, false)
    }
}

#[test]
fn a_valid_holders_rejected_write_fails_the_run_unless_a_revocation_explains_it() {
    let sections = [
        section("a", 1, 0, Some(500)),
        section("b", 2, 600, Some(900)),
    ];
    let writes = [write("b", 2, true), valid_but_rejected("a", 1, 700)];
    let r = run(Fault::Latency, &[], &[], &sections, &writes);
    assert_eq!(r.valid_rejected, 1);
    assert!(
        failed(&r, "rejected while their holder's lease was valid"),
        "{:?}",
        r.failures
    );

    // A steal of a's lease at 650 ms: a learns it at its next renewal.
    let steal = kill_event("a", 650);
    let r = run(
        Fault::Steal,
        &[],
        std::slice::from_ref(&steal),
        &sections,
        &writes,
    );
    assert!(!failed(&r, "rejected while"), "{:?}", r.failures);
    // But not a second later, and not for another holder.
    let late = [write("b", 2, true), valid_but_rejected("a", 1, 1700)];
    let r = run(Fault::Steal, &[], &[steal], &sections, &late);
    assert!(failed(&r, "rejected while"), "{:?}", r.failures);
    // Without persistence, the fence counter restarts: reported only.
    let r = run(Fault::RestartNoPersistence, &[], &[], &sections, &writes);
    assert!(!failed(&r, "rejected while"), "{:?}", r.failures);
}

#[test]
fn a_fence_handed_out_again_fails_the_run_unless_the_server_forgot() {
    let sections = [
        section("a", 5, 0, Some(10)),
        section("b", 6, 20, Some(30)),
        section("a", 5, 40, Some(50)),
    ];
    let r = run(Fault::Kill, &[], &[], &sections, &[]);
    assert_eq!(r.fence_reissues, 1);
    assert!(
        failed(&r, "not above an earlier holder's"),
        "{:?}",
        r.failures
    );
    let r = run(Fault::RestartNoPersistence, &[], &[], &sections, &[]);
    assert!(!failed(&r, "not above"), "{:?}", r.failures);
}

#[test]
fn a_fault_that_did_not_happen_is_a_miss_and_fails_the_run_alone() {
    let sections = [section("a", 1, 0, Some(3000))];
    let mut event = kill_event("a", 100);
    event.missed = Some("no connection of the holder was killed".to_owned());
    let r = run(Fault::ConnKill, &[], &[event], &sections, &[]);
    assert_eq!((r.hits, r.misses), (0, 1));
    assert!(
        failed(&r, "never happened (no connection"),
        "{:?}",
        r.failures
    );
}

#[test]
fn a_lease_lost_to_conn_kill_or_reset_is_a_failure_except_for_advisory_locks() {
    let mut s = section("a", 1, 0, Some(400));
    s.t_cancel = Some(450_000);
    let mut event = kill_event("a", 100);
    event.count = 2;
    for fault in [Fault::ConnKill, Fault::Reset] {
        let r = run(fault, &[], &[event.clone()], &[s.clone()], &[]);
        assert_eq!(r.connections, 2);
        assert!(failed(&r, "it must be kept"), "{:?}", r.failures);
        let r = run_on(
            BackendKind::PgAdvisory,
            fault,
            &[],
            &[event.clone()],
            &[s.clone()],
            &[],
        );
        assert!(!failed(&r, "it must be kept"), "{:?}", r.failures);
    }
}

#[test]
fn every_variant_of_a_fault_must_land() {
    let sections = [section("a", 1, 0, Some(9000))];
    let mut events = [kill_event("a", 100), kill_event("a", 4000)];
    events[1].variant = 1;
    let r = run(Fault::Restart, &[], &events, &sections, &[]);
    assert!(!failed(&r, "never landed"), "{:?}", r.failures);
    assert_eq!(r.variants, vec![(1, 0), (1, 0)]);
    // Only the first variant, twice.
    let mut again = events.clone();
    again[1].variant = 0;
    let r = run(Fault::Restart, &[], &again, &sections, &[]);
    assert!(
        failed(&r, "\"restarted at once\" never landed"),
        "{:?}",
        r.failures
    );
}

#[test]
fn a_grant_is_valid_from_when_its_answer_left_the_server() {
    // b's acquisition returned at 600 ms (a slow link), but the server had
    // granted it at 450 ms, while a still believed until 500 ms.
    let mut b = section("b", 2, 600, Some(900));
    b.t_req = 300_000;
    let sections = [section("a", 1, 0, Some(500)), b.clone()];
    let r = run(Fault::Latency, &[], &[], &sections, &[]);
    assert_eq!(r.overlaps, 0, "invisible without the proxy's reading");
    b.t_granted = Some(450_000);
    let sections = [section("a", 1, 0, Some(500)), b];
    let r = run(Fault::Latency, &[], &[], &sections, &[]);
    assert_eq!(r.overlaps, 1);
    assert_eq!(r.max_overlap, Duration::from_millis(50));
}

#[test]
fn a_kill_of_a_holder_whose_section_is_not_in_the_log_is_a_failure() {
    let sections = [section("b", 2, 0, Some(50))];
    let r = run(
        Fault::Kill,
        &[("a", 800)],
        &[kill_event("a", 800)],
        &sections,
        &[],
    );
    assert!(
        failed(&r, "no section of its in the log"),
        "{:?}",
        r.failures
    );
}

#[test]
fn a_late_release_that_ends_the_newer_lease_is_a_failure() {
    let old = section("a", 1, 0, Some(500));
    let mut newer = section("a", 3, 1600, Some(3000));
    let mut event = kill_event("a", 510);
    event.t_lifted = Some(1_700_000);
    event.fences = Some((1, 3));
    event.count = 1;
    let r = run(
        Fault::LateRelease,
        &[],
        &[event.clone()],
        &[old.clone(), newer.clone()],
        &[],
    );
    assert_eq!((r.hits, r.late_releases), (1, (1, 1)));
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    // Lost 300 ms after the delivery, ended early.
    newer.t_cancel = Some(2_000_000);
    newer.t_last_valid = Some(1_990_000);
    newer.t_end = Some(2_010_000);
    newer.valid_end = Some(false);
    let r = run(Fault::LateRelease, &[], &[event], &[old, newer], &[]);
    assert_eq!(r.late_releases, (1, 0));
    assert!(failed(&r, "the newer lease was lost"), "{:?}", r.failures);
}

#[test]
fn a_holder_that_cannot_acquire_again_after_black_hole_conn_is_a_failure() {
    let sections = [section("a", 1, 0, Some(3000))];
    let mut event = kill_event("a", 100);
    event.count = 1;
    event.reacquired_after = Some(Some(Duration::from_millis(80)));
    let r = run_on(
        BackendKind::Redis,
        Fault::BlackHoleConn,
        &[],
        &[event.clone()],
        &sections,
        &[],
    );
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    event.reacquired_after = Some(None);
    let r = run_on(
        BackendKind::Redis,
        Fault::BlackHoleConn,
        &[],
        &[event],
        &sections,
        &[],
    );
    assert!(failed(&r, "acquired again after None"), "{:?}", r.failures);
}

#[test]
fn only_requests_that_run_a_statement_are_stalled() {
    let pg = |messages: &[(u8, &[u8])]| -> Vec<u8> {
        let mut out = Vec::new();
        for (kind, body) in messages {
            out.push(*kind);
            out.extend_from_slice(&(u32::try_from(body.len()).unwrap_or(0) + 4).to_be_bytes());
            out.extend_from_slice(body);
        }
        out
    };
    let sync = pg(&[(b'S', b"")]);
    let prepare = pg(&[(b'P', b"s1\0UPDATE\0\0\0"), (b'D', b"Ss1\0"), (b'S', b"")]);
    let execute = pg(&[
        (b'B', b"\0s1\0\0\0\0\0\0\0"),
        (b'E', b"\0\0\0\0\0"),
        (b'S', b""),
    ]);
    assert!(!executes(BackendKind::PgTable, &sync));
    assert!(!executes(BackendKind::PgTable, &prepare));
    assert!(executes(BackendKind::PgTable, &execute));

    let mysql = |command: u8| vec![1, 0, 0, 0, command];
    assert!(!executes(BackendKind::MySqlTable, &mysql(0x0e)), "COM_PING");
    assert!(
        !executes(BackendKind::MySqlTable, &mysql(0x16)),
        "COM_STMT_PREPARE"
    );
    assert!(
        executes(BackendKind::MySqlTable, &mysql(0x17)),
        "COM_STMT_EXECUTE"
    );

    assert!(!executes(
        BackendKind::Redis,
        b"*1\r\n$7\r\nUNWATCH\r\n*1\r\n$4\r\nPING\r\n"
    ));
    assert!(executes(
        BackendKind::Redis,
        b"*5\r\n$7\r\nEVALSHA\r\n$40\r\n..."
    ));
}

#[test]
fn the_monotonic_clock_is_the_one_of_instant() {
    let (a, t) = (std::time::Instant::now(), monotonic_us());
    std::thread::sleep(Duration::from_millis(20));
    let (b, u) = (std::time::Instant::now(), monotonic_us());
    let elapsed = i64::try_from((b - a).as_micros()).unwrap_or(0);
    assert!((u - t - elapsed).abs() < 2000, "{} vs {elapsed}", u - t);
    assert_eq!(crate::monotonic_us_of(a) / 1000, t / 1000);
}

/// Election scenarios: someone must lead again within the takeover bound
/// after each fault.
fn leader_again_failures(
    killed: &[(&str, i64)],
    events: &[Event],
    sections: &[Section],
) -> Vec<String> {
    let killed: HashMap<String, i64> = killed
        .iter()
        .map(|(h, t)| ((*h).to_owned(), t * 1000))
        .collect();
    let mut r = run(Fault::Kill, &[], &[], &[], &[]);
    r.failures.clear();
    super::leader_again(
        &config(),
        BackendKind::PgTable,
        &killed,
        events,
        sections,
        &mut r,
    );
    r.failures
}

#[test]
fn an_election_without_a_leader_after_a_kill_fails() {
    let mut victim = section("a", 1, 0, None);
    victim.t_end = None;
    // Nobody after the kill at 500 ms.
    let failures = leader_again_failures(&[("a", 500)], &[kill_event("a", 500)], &[victim.clone()]);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains("nobody led"), "{failures:?}");
    // A takeover later than the bound (ttl + ttl/3 + slack = 1833 ms) fails too.
    let late = section("b", 2, 500 + 2_000, Some(3_000));
    let failures = leader_again_failures(
        &[("a", 500)],
        &[kill_event("a", 500)],
        &[victim.clone(), late],
    );
    assert_eq!(failures.len(), 1, "{failures:?}");
    // One within the bound passes.
    let next = section("b", 2, 1_600, Some(2_500));
    let failures = leader_again_failures(&[("a", 500)], &[kill_event("a", 500)], &[victim, next]);
    assert_eq!(failures, Vec::<String>::new());
}

#[test]
fn an_election_whose_leader_kept_its_lease_through_the_fault_passes() {
    // conn-kill on a table: the victim's term goes on past the bound.
    let kept = section("a", 1, 0, Some(3_000));
    let failures = leader_again_failures(&[], &[kill_event("a", 500)], &[kept]);
    assert_eq!(failures, Vec::<String>::new());
    // ... but one that ended soon after the fault, with nobody after, fails.
    let ended = section("a", 1, 0, Some(600));
    let failures = leader_again_failures(&[], &[kill_event("a", 500)], &[ended]);
    assert_eq!(failures.len(), 1, "{failures:?}");
}

#[test]
fn the_timeline_draws_the_injection_that_cost_the_lease_with_every_process() {
    let h = |w: &str| format!("pg-table-kill-{w}");
    let mut killed_section = section(&h("w0-1"), 1, 9_500, None);
    killed_section.t_end = None;
    let sections = [
        // Before the window: not drawn.
        section(&h("w1-2"), 0, 1_000, Some(1_400)),
        killed_section,
        section(&h("w1-2"), 2, 10_840, Some(11_500)),
    ];
    // Three from the start, and one replacing the killed one; one more
    // started after the window (by a later kill).
    let processes: HashMap<String, i64> = [
        ("w0-1", 0),
        ("w1-2", 0),
        ("w2-3", 0),
        ("w0-4", 10_005_000),
        ("w0-5", 60_000_000),
    ]
    .into_iter()
    .map(|(w, t)| (h(w), t))
    .collect();
    let killed = [(h("w0-1"), 10_005_000)].into_iter().collect();
    let missed = Event {
        missed: Some("the victim's section had ended".to_owned()),
        ..kill_event(&h("w1-2"), 5_000)
    };
    let events = [missed, kill_event(&h("w0-1"), 10_000)];
    let t = timeline::build(
        Duration::from_secs(1),
        BackendKind::PgTable,
        Fault::Kill,
        &processes,
        &killed,
        &events,
        &sections,
    )
    .expect("a timeline");
    // A lane per process, the replacement next to the one it replaced.
    let names: Vec<&str> = t.lanes.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["process 1", "process 4", "process 2", "process 3"]);
    assert_eq!(t.fault, "SIGKILL of process 1");
    // The victim: valid until it was killed, 5 ms after the fault.
    let victim = &t.lanes[0];
    assert_eq!(victim.bars.len(), 1);
    assert_eq!(victim.bars[0].fence, Some(1));
    assert_eq!(victim.bars[0].valid_until_ms, 5.0);
    assert!(
        victim
            .marks
            .iter()
            .any(|m| m.kind == crate::plots::MarkKind::Killed && m.at_ms == 5.0)
    );
    // The next holder, 840 ms after the fault, and only its section in the window.
    assert_eq!(t.takeover, Some((2, 840.0)));
    assert_eq!(t.lanes[2].bars.len(), 1);
    assert_eq!(t.lanes[2].bars[0].fence, Some(2));
    assert!(t.from_ms < 0.0 && t.to_ms > 840.0);

    // No fences where the backend has none.
    let t = timeline::build(
        Duration::from_secs(1),
        BackendKind::PgAdvisory,
        Fault::Kill,
        &processes,
        &killed,
        &events,
        &sections,
    )
    .expect("a timeline");
    assert!(
        t.lanes
            .iter()
            .flat_map(|l| &l.bars)
            .all(|b| b.fence.is_none())
    );
}

#[test]
fn no_timeline_where_no_injection_landed() {
    let missed = Event {
        missed: Some("no connection of the holder was killed".to_owned()),
        ..kill_event("a", 1_000)
    };
    let t = timeline::build(
        Duration::from_secs(1),
        BackendKind::PgTable,
        Fault::ConnKill,
        &HashMap::new(),
        &HashMap::new(),
        &[missed],
        &[section("a", 1, 900, Some(1_500))],
    );
    assert_eq!(t, None);
}

#[test]
fn the_report_links_each_row_to_its_timeline_and_writes_it_beside_itself() {
    let h = |w: &str| format!("pg-table-kill-{w}");
    let mut killed_section = section(&h("w0-1"), 1, 9_500, None);
    killed_section.t_end = None;
    let sections = [killed_section, section(&h("w1-2"), 2, 10_840, Some(11_500))];
    let killed = [(h("w0-1"), 10_005)];
    let events = [kill_event(&h("w0-1"), 10_000)];
    let victim = h("w0-1");
    let mut with = run(
        Fault::Kill,
        &[(victim.as_str(), 10_005)],
        &events,
        &sections,
        &[],
    );
    let killed_us = killed.iter().map(|(h, t)| (h.clone(), t * 1000)).collect();
    with.timeline = timeline::build(
        Duration::from_secs(1),
        BackendKind::PgTable,
        Fault::Kill,
        &HashMap::new(),
        &killed_us,
        &events,
        &sections,
    );
    assert!(with.timeline.is_some());
    // A scenario without a picture keeps its plain row.
    let mut without = with.clone();
    without.fault = Fault::Stop;
    without.timeline = None;
    let report = Report {
        config: config(),
        environment: Environment::default(),
        results: vec![with, without],
        checker: String::new(),
        elapsed: Duration::ZERO,
    };
    let dir = std::env::temp_dir().join(crate::unique("lease-report"));
    let doc = dir.join("RELIABILITY.md");
    report.write_into(&doc, "fault-suite").expect("written");
    let md = std::fs::read_to_string(&doc).expect("the report");
    let svg = std::fs::read_to_string(dir.join("img/faults-pg-table-kill.svg"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        md.contains("| [kill](img/faults-pg-table-kill.svg) |"),
        "{md}"
    );
    assert!(md.contains("| stop |"), "{md}");
    assert!(
        md.contains("![PgTable · kill](img/faults-pg-table-kill.svg)"),
        "{md}"
    );
    assert!(!md.contains("faults-pg-table-stop"), "{md}");
    assert!(svg.expect("the picture").contains("SIGKILL of process 1"));
}

#[test]
fn a_lock_not_free_soon_after_black_hole_long_heals_is_a_failure() {
    // The victim's token is cancelled at its deadline; the heal comes 8 s
    // after the fault; another contender acquires `after_ms` after the heal.
    let outcome = |after_ms: Option<i64>| {
        let mut victim = section("a", 1, 0, Some(1100));
        victim.t_cancel = Some(1_050_000);
        let mut sections = vec![victim];
        sections.extend(after_ms.map(|a| section("b", 2, 8100 + a, Some(8100 + a + 500))));
        let mut event = kill_event("a", 100);
        event.t_lifted = Some(8_100_000);
        run_on(
            BackendKind::PgAdvisory,
            Fault::BlackHoleLong,
            &[],
            &[event],
            &sections,
            &[],
        )
    };
    let r = outcome(Some(200));
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.freed, vec![Some(Duration::from_millis(200))]);
    let r = outcome(Some(1400));
    assert!(
        failed(&r, "another contender acquired Some(1.4s) after the heal"),
        "{:?}",
        r.failures
    );
    let r = outcome(None);
    assert!(
        failed(&r, "another contender acquired None after the heal"),
        "{:?}",
        r.failures
    );
}

/// `a`'s body: granted at 0, valid until 500 ms, its token fired then, and
/// it returned at `returned_ms`.
fn body(returned_ms: i64) -> Section {
    let mut a = section("a", 1, 0, Some(500));
    a.t_cancel = Some(500_000);
    a.t_end = Some(returned_ms * 1000);
    a.valid_end = Some(false);
    a
}

#[test]
fn a_body_that_runs_into_the_next_holders_is_an_overlap() {
    let next = section("b", 2, 600, Some(900));
    let r = run(Fault::BlackHole, &[], &[], &[body(700), next.clone()], &[]);
    assert_eq!(r.overlaps, 0, "the valid intervals do not intersect");
    assert_eq!(r.body_overlaps, 1);
    assert_eq!(r.max_body_overlap, Duration::from_millis(100));
    assert!(failed(&r, "1 overlaps between bodies"), "{:?}", r.failures);
    // Returned before the next grant: none.
    let r = run(Fault::BlackHole, &[], &[], &[body(590), next], &[]);
    assert_eq!(r.body_overlaps, 0);
    assert!(!failed(&r, "between bodies"), "{:?}", r.failures);
}

#[test]
fn a_frozen_body_is_reported_apart_and_a_revoked_one_is_not_failed() {
    // Stopped at 50 ms, woken at 2.6 s: b held in between.
    let mut frozen = section("a", 1, 0, Some(100));
    frozen.t_end = Some(2_600_500);
    frozen.wake_t = Some(2_600_000);
    frozen.wake_valid = Some(false);
    frozen.wake_cancel_us = Some(0);
    frozen.wake_write_accepted = Some(false);
    let mut pause = kill_event("a", 50);
    pause.t_lifted = Some(2_600_000);
    let sections = [frozen, section("b", 2, 1200, Some(1500))];
    let r = run(Fault::Stop, &[], &[pause], &sections, &[]);
    assert_eq!((r.body_overlaps, r.frozen_overlaps), (0, 1));
    assert!(!failed(&r, "between bodies"), "{:?}", r.failures);

    // A steal at 390 ms: b acquires at 400 ms; a learns at 500 ms and
    // returns at 650 ms.
    let sections = [body(650), section("b", 2, 400, Some(900))];
    let r = run(Fault::Steal, &[], &[kill_event("a", 390)], &sections, &[]);
    assert_eq!(r.body_overlaps, 1);
    assert!(!failed(&r, "between bodies"), "{:?}", r.failures);
}

#[test]
fn a_deploy_hands_over_when_the_body_returns_and_the_process_exits() {
    // SIGTERM at 1 s: the token fires at once, the body returns 100 ms later.
    let mut victim = section("a", 1, 0, Some(1000));
    victim.t_cancel = Some(1_001_000);
    victim.t_end = Some(1_100_000);
    victim.valid_end = Some(false);
    let mut term = kill_event("a", 1000);
    term.t_lifted = Some(1_300_000);
    let outcome = |next_ms: i64, term: &Event| {
        let next = section("b", 2, next_ms, Some(next_ms + 500));
        run(
            Fault::Deploy,
            &[],
            std::slice::from_ref(term),
            &[victim.clone(), next],
            &[],
        )
    };
    let r = outcome(1120, &term);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.handovers, vec![Some(Duration::from_millis(20))]);
    assert_eq!(r.exits, vec![Some(Duration::from_millis(300))]);
    // Left to expire instead of released: granted again a ttl later.
    let r = outcome(2150, &term);
    assert!(
        failed(&r, "deploy: the lease was handed over Some(1.05s)"),
        "{:?}",
        r.failures
    );
    // Granted to another before the victim's body returned.
    let r = outcome(1050, &term);
    assert!(failed(&r, "overlaps between bodies"), "{:?}", r.failures);
    // The victim never exited.
    term.t_lifted = None;
    let r = outcome(1120, &term);
    assert!(
        failed(&r, "deploy: the victim exited None"),
        "{:?}",
        r.failures
    );
}

#[test]
fn a_max_hold_that_fires_late_or_never_is_a_failure() {
    // max_hold (1 s) over at 1 s: the token must fire then.
    let outcome = |cancel_ms: Option<i64>| {
        let mut victim = section("a", 1, 0, Some(cancel_ms.unwrap_or(2000)));
        victim.t_cancel = cancel_ms.map(|c| c * 1000);
        let next = section("b", 2, 2100, Some(2500));
        run(
            Fault::MaxHold,
            &[],
            &[kill_event("a", 1000)],
            &[victim, next],
            &[],
        )
    };
    let r = outcome(Some(1002));
    assert_eq!(r.cancels, vec![Some(Duration::from_millis(2))]);
    assert!(!failed(&r, "cancelled after"), "{:?}", r.failures);
    let r = outcome(Some(1700));
    assert!(
        failed(&r, "cancelled after Some(700ms)"),
        "{:?}",
        r.failures
    );
    let r = outcome(None);
    assert!(failed(&r, "cancelled after None"), "{:?}", r.failures);
}

#[test]
fn a_drifting_holder_whose_times_are_off_fails_the_run() {
    let mut victim = section("a", 1, 0, Some(800));
    victim.t_cancel = Some(800_000);
    let mut event = kill_event("a", 100);
    event.clock = Some(DriftClock {
        rate: 0.8,
        error: Duration::from_micros(300),
    });
    let r = run(Fault::Drift, &[], &[event.clone()], &[victim.clone()], &[]);
    assert_eq!(r.clocks, vec![(0.8, Duration::from_micros(300))]);
    assert!(!failed(&r, "times were off"), "{:?}", r.failures);
    event.clock = Some(DriftClock {
        rate: 0.8,
        error: Duration::from_millis(8),
    });
    let r = run(Fault::Drift, &[], &[event], &[victim], &[]);
    assert!(failed(&r, "times were off by 8ms"), "{:?}", r.failures);
}

mod evictions;
