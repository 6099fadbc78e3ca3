//! `force-release` and `stop-in-txn`: a holder whose lease ended on the
//! server while its body ran (evicted by an operator, or frozen past its
//! ttl in a checked-in transaction). The analysis must catch a next holder
//! let in too early.

use super::*;

/// `a` force-released at 100 ms: its token fires at its next renewal
/// (300 ms), its body returns at 400 ms; `b` is granted when the lock delay
/// ends (1000 ms).
fn evicted() -> (Event, Section, Section) {
    let mut a = section("a", 1, 0, Some(300));
    a.t_cancel = Some(300_000);
    a.t_end = Some(400_000);
    a.valid_end = Some(false);
    (kill_event("a", 100), a, section("b", 2, 1000, Some(1500)))
}

#[test]
fn a_force_release_that_keeps_its_lock_delay_passes() {
    let (e, a, b) = evicted();
    let r = run(Fault::ForceRelease, &[], &[e], &[a, b], &[]);
    assert_eq!(r.hits, 1);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.cancels, vec![Some(Duration::from_millis(200))]);
    assert_eq!(r.takeovers, vec![Duration::from_millis(900)]);
    assert_eq!(r.closest, Some(Duration::from_millis(600)));
    // The evicted holder may be the one granted the name again.
    let (e, a, _) = evicted();
    let again = section("a", 2, 1000, Some(2800));
    let r = run(
        Fault::ForceRelease,
        &[],
        &[e],
        &[a, again, section("b", 3, 3000, Some(3500))],
        &[],
    );
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.takeovers, vec![Duration::from_millis(900)]);
}

#[test]
fn a_force_release_that_lets_the_next_holder_in_at_once_fails() {
    // `force_release_now`: b is granted at 110 ms.
    let (e, a, _) = evicted();
    let b = section("b", 2, 110, Some(1500));
    let r = run(Fault::ForceRelease, &[], &[e], &[a, b], &[]);
    assert!(!r.revocation(), "no overlap is excused");
    assert!(failed(&r, "1 overlaps between bodies"), "{:?}", r.failures);
    assert!(
        failed(&r, "1 overlaps between valid holders"),
        "{:?}",
        r.failures
    );
}

#[test]
fn a_force_released_holder_never_told_or_a_name_never_passed_on_fails() {
    let (e, mut a, _) = evicted();
    a.t_cancel = None;
    let late = section("b", 2, 3000, Some(3500));
    let r = run(Fault::ForceRelease, &[], &[e], &[a, late], &[]);
    assert!(
        failed(
            &r,
            "force-release: the victim's token was cancelled after None"
        ),
        "{:?}",
        r.failures
    );
    assert!(
        failed(&r, "force-release: taken over Some(2.9s) after the fault"),
        "{:?}",
        r.failures
    );
}

fn log(writes: &[(&str, i64)]) -> Vec<(String, i64)> {
    writes.iter().map(|(h, f)| ((*h).to_owned(), *f)).collect()
}

#[test]
fn an_unfenced_write_committed_after_a_later_holders_is_stale() {
    let fresh = || run(Fault::StopInTxn, &[], &[], &[], &[]);
    let mut r = fresh();
    r.unfenced(&log(&[("a", 1), ("a", 1), ("b", 2), ("c", 3)]));
    assert_eq!((r.unfenced_writes, r.unfenced_stale), (4, 0));
    assert!(!failed(&r, "unfenced"), "{:?}", r.failures);
    // a, stopped in its transaction, commits after b's write.
    let mut r = fresh();
    r.unfenced(&log(&[("a", 1), ("b", 2), ("a", 1), ("c", 3)]));
    assert_eq!(r.unfenced_stale, 1);
    assert!(
        failed(&r, "1 stale writes committed to the unfenced table"),
        "{:?}",
        r.failures
    );
    // Nothing written proves nothing.
    let mut r = fresh();
    r.unfenced(&[]);
    assert!(failed(&r, "no write committed"), "{:?}", r.failures);
}

#[test]
fn a_body_frozen_in_its_transaction_is_reported_apart() {
    // a stopped at 50 ms in its checked-in transaction, woken at 2.6 s;
    // its body returned at 2.61 s; b was granted once its transaction
    // ended, at 2.605 s.
    let mut frozen = section("a", 1, 0, Some(100));
    frozen.t_end = Some(2_610_000);
    frozen.t_cancel = Some(2_600_500);
    let mut pause = kill_event("a", 50);
    pause.t_lifted = Some(2_600_000);
    let b = section("b", 2, 2605, Some(3000));
    let r = run(
        Fault::StopInTxn,
        &[],
        &[pause.clone()],
        &[frozen.clone(), b],
        &[],
    );
    assert_eq!((r.body_overlaps, r.frozen_overlaps), (0, 1));
    assert_eq!(r.taken_during_pause, 0);
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    // Without the check-in's lock b is granted during the pause: reported.
    let b = section("b", 2, 1200, Some(1500));
    let r = run(Fault::StopInTxn, &[], &[pause], &[frozen, b], &[]);
    assert_eq!(r.taken_during_pause, 1);
}
