//! The analysis must catch what it is there to catch: these feed it records
//! of runs that broke the rules.

use super::*;

fn config() -> Config {
    Config::short(PathBuf::from("unused"))
}

fn section(holder: &str, fence: i64, start_ms: i64, valid_until_ms: Option<i64>) -> Section {
    Section {
        holder: holder.to_owned(),
        fence: Some(fence),
        t_start: start_ms * 1000,
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
        client_valid: true,
        accepted,
    }
}

fn kill_event(victim: &str, at_ms: i64) -> Event {
    Event {
        t: at_ms * 1000,
        t_lifted: None,
        victim: Some(victim.to_owned()),
        downtime: None,
    }
}

fn run(
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
        BackendKind::PgTable,
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
