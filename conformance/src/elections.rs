//! Waiting ([`Lease::acquire`](leasehold::Lease::acquire) with a wait) and
//! elections ([`Election`]), in the `every` group; and a waiter granted at
//! a crashed holder's expiry, in the `extended` group.

use std::time::Duration;

use leasehold::{Backend, Election, Leadership};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use crate::support::{LONG, TTL, acquired, fence, lease, ms, unique};
use crate::{Naming, Subject};

/// How long a waiter has waited when the holder lets go, in the hand-over
/// properties: long enough to have tried once and gone to sleep.
pub(crate) const WAITED: Duration = Duration::from_millis(200);

/// A hand-over faster than this came from a push. A polling waiter sleeps
/// at least 0.8 of its poll (1 s for [`LONG`]) from before its first
/// attempt, so it would have the lease 0.6 s after the release at the
/// earliest ([`WAITED`] of its sleep was over).
pub(crate) const PUSHED: Duration = Duration::from_millis(400);

/// Slack for a loaded machine, on top of a poll.
pub(crate) const SLACK: Duration = Duration::from_secs(1);

/// The longest poll of a waiter for `ttl` (`Lease::acquire`: `ttl/10`,
/// from 10 ms to 1 s, +20% at most).
pub(crate) fn poll_max(ttl: Duration) -> Duration {
    (ttl / 10).clamp(ms(10), ms(1_000)) * 6 / 5
}

/// How soon after a release (after [`WAITED`]) a waiter for `ttl` must
/// have the lease on `s`: faster than any poll where the server pushes,
/// else within a poll plus [`SLACK`] — a small part of the ttl either way.
pub(crate) fn hand_over_bound<S: Subject>(s: &S, ttl: Duration) -> Duration {
    if s.caps().pushes {
        PUSHED
    } else {
        poll_max(ttl) + SLACK
    }
}

/// What a hand-over's bound stands for, for the failure message.
pub(crate) fn hand_over_kind<S: Subject>(s: &S) -> &'static str {
    if s.caps().pushes {
        "the server pushes releases: a polling waiter would take 0.6 s or more"
    } else {
        "about a poll"
    }
}

/// Where the server pushes releases, have the subject's backend subscribe
/// (one wait for a held lease, which answers `None`), so that the
/// hand-overs after it are timed against a subscription that is up. A
/// backend subscribes when its first waiter waits, and keeps the
/// subscription until 10 s after its last one; a release while it is
/// still connecting reaches the waiters when it is up (it wakes every
/// waiter once) — on a loaded machine that can be a few hundred ms, which
/// is the connect's time, not the hand-over's.
pub(crate) async fn subscribe<S: Subject>(s: &S) {
    if !s.caps().pushes {
        return;
    }
    let name = unique("subscribe");
    let held = lease(s, "holder-x")
        .try_acquire(&name, LONG)
        .await
        .unwrap()
        .expect("free");
    let waited = lease(s, "holder-y")
        .acquire(&name, LONG, ms(300))
        .await
        .unwrap();
    assert!(waited.is_none(), "got a held lease");
    held.release().await.unwrap();
}

/// `state` is `Following` and names `holder` as far as the backend can
/// ([`Naming`]); `own`: `holder` acquired through the subject's backend.
pub(crate) fn assert_follows<S: Subject>(s: &S, state: &Leadership, holder: &str, own: bool) {
    let Leadership::Following { leader, .. } = state else {
        panic!("not following: {state:?}");
    };
    match s.caps().leader {
        Naming::Holder => assert_eq!(leader.as_deref(), Some(holder), "{state:?}"),
        Naming::OwnHolders if own => assert_eq!(leader.as_deref(), Some(holder), "{state:?}"),
        Naming::OwnHolders => assert_eq!(*leader, None, "{state:?}"),
        Naming::Session => assert!(
            leader.as_deref().is_some_and(|l| l.contains("pid ")),
            "the holding session: {state:?}"
        ),
    }
}

/// Whether `state` follows `holder` as [`assert_follows`] requires. An
/// election that could not ask who leads (an `inspect` that failed or timed
/// out, on a loaded machine) follows `None` until its next attempt asks
/// again: tests wait for this, then assert.
pub(crate) fn follows_as_named<S: Subject>(
    s: &S,
    state: &Leadership,
    holder: &str,
    own: bool,
) -> bool {
    let Leadership::Following { leader, .. } = state else {
        return false;
    };
    match s.caps().leader {
        Naming::Holder => leader.as_deref() == Some(holder),
        Naming::OwnHolders if own => leader.as_deref() == Some(holder),
        Naming::OwnHolders => leader.is_none(),
        Naming::Session => leader.as_deref().is_some_and(|l| l.contains("pid ")),
    }
}

/// Watches two elections of one name until both have stopped; ends with
/// an error the first time it sees both `Leading` (a stopped election's
/// last state counts). A state is read again after the other one, so that
/// a hand-over between the two reads is not taken for an overlap.
pub(crate) fn never_two_leaders(a: &Election, b: &Election) -> JoinHandle<Result<(), String>> {
    let (mut a, mut b) = (a.watch(), b.watch());
    tokio::spawn(async move {
        let leading = |s: &Leadership| matches!(s, Leadership::Leading { .. });
        let (mut a_runs, mut b_runs) = (true, true);
        while a_runs || b_runs {
            let first = a.borrow_and_update().clone();
            let second = b.borrow_and_update().clone();
            if leading(&first) && leading(&second) && *a.borrow() == first {
                return Err(format!("both lead: {first:?} and {second:?}"));
            }
            tokio::select! {
                changed = a.changed(), if a_runs => a_runs = changed.is_ok(),
                changed = b.changed(), if b_runs => b_runs = changed.is_ok(),
            }
        }
        Ok(())
    })
}

/// The verdict of [`never_two_leaders`], once both elections have stopped.
pub(crate) async fn check_one_leader(monitor: JoinHandle<Result<(), String>>) {
    let verdict = timeout(SLACK, monitor)
        .await
        .expect("the elections stop after resigning");
    verdict.unwrap().unwrap();
}

/// A waiter in `Lease::acquire` has a released lease at once: about one
/// round trip after the release where the server pushes it, within a poll
/// elsewhere — long before the ttl (30 s) would have freed it. Both ways
/// between two holders.
pub async fn a_waiter_has_a_released_lease_at_once<S: Subject>(s: &S) {
    let name = unique("wait-hand-over");
    let (a, b) = (lease(s, "holder-a"), lease(s, "holder-b"));
    let bound = hand_over_bound(s, LONG);
    subscribe(s).await;
    let mut held = a.try_acquire(&name, LONG).await.unwrap().expect("free");
    for (round, waiter) in [b, a].into_iter().enumerate() {
        let wanted = name.clone();
        let waiting = tokio::spawn(async move {
            let got = waiter.acquire(&wanted, LONG, LONG / 2).await;
            (got, Instant::now())
        });
        sleep(WAITED).await;
        assert!(!waiting.is_finished(), "round {round}: got a held lease");
        let before = held.fencing_token();
        held.release().await.unwrap();
        let released = Instant::now();
        let (got, at) = waiting.await.unwrap();
        held = got
            .unwrap()
            .expect("the waiter has the lease within its wait");
        let took = at.saturating_duration_since(released);
        eprintln!("round {round}: hand-over in {took:?}");
        assert!(
            took < bound,
            "round {round}: the hand-over took {took:?}, not under {bound:?} ({})",
            hand_over_kind(s)
        );
        if s.caps().fencing {
            assert!(held.fencing_token() > before, "a new acquisition");
        }
    }
    held.release().await.unwrap();
}

/// A wait that runs out while another holds the lease answers `None` after
/// the wait, and changes nothing; a wait that is dropped leaves nothing
/// behind.
pub async fn a_wait_runs_out_while_another_holds<S: Subject>(s: &S) {
    let name = unique("wait-timeout");
    let (a, b) = (lease(s, "holder-a"), lease(s, "holder-b"));
    let held = a.try_acquire(&name, LONG).await.unwrap().expect("free");
    let wait = ms(700);
    let started = Instant::now();
    assert!(b.acquire(&name, LONG, wait).await.unwrap().is_none());
    let took = started.elapsed();
    assert!(took >= wait, "gave up after {took:?}, before its wait");
    assert!(
        took < wait + SLACK,
        "gave up {took:?} after a wait of {wait:?}"
    );
    // A zero wait is one attempt.
    assert!(
        b.acquire(&name, LONG, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert!(held.is_valid() && !held.token().is_cancelled());
    assert!(
        timeout(ms(200), b.acquire(&name, LONG, LONG))
            .await
            .is_err()
    );
    held.release().await.unwrap();
    let c = lease(s, "holder-c");
    let g = c
        .try_acquire(&name, LONG)
        .await
        .unwrap()
        .expect("the waits left the lease to its holder, and nothing after its release");
    if s.caps().fencing {
        assert_eq!(g.fencing_token(), fence(s, 2));
    }
    g.release().await.unwrap();
}

/// A holder that crashed (it acquired, and nothing renews or releases its
/// lease) blocks a waiter until its lease ends — at the ttl, or, without
/// expiry, with its session — and the waiter has it about a poll later.
pub async fn a_waiter_takes_over_from_a_crashed_holder<S: Subject>(s: &S) {
    let name = unique("wait-crash");
    let ttl = TTL; // a poll of 200 ms ± 20%
    let b = s.backend();
    let sent = Instant::now();
    let crashed = acquired(&b, &name, "crashed", ttl).await;
    let survivor = lease(s, "survivor");
    let ((got, at), (earliest, freed)) = tokio::join!(
        async {
            let got = survivor.acquire(&name, ttl, ms(10_000)).await;
            (got, Instant::now())
        },
        async {
            if s.caps().expires {
                // The server's expiry: its time of the request plus the ttl.
                (sent + ttl, sent + ttl)
            } else {
                // Outlives its ttl; free once its session ends.
                sleep(ttl + ms(400)).await;
                let ending = Instant::now();
                s.end_session(&name).await;
                (ending, Instant::now())
            }
        }
    );
    let guard = got.unwrap().expect("taken over within the wait");
    let early = ms(20); // clocks that round to the millisecond
    assert!(
        at + early >= earliest,
        "taken {:?} before the lease ended",
        earliest.saturating_duration_since(at)
    );
    let late = at.saturating_duration_since(freed);
    let bound = poll_max(ttl) + SLACK;
    eprintln!("taken {late:?} after the lease ended");
    assert!(
        late < bound,
        "taken {late:?} after the lease ended, not within a poll (+{SLACK:?})"
    );
    if s.caps().fencing {
        assert!(guard.fencing_token() > crashed, "a larger fence");
    }
    guard.release().await.unwrap();
}

/// Two elections of one name: the first leads, the second follows it
/// (naming it where the backend can), and has the lease at once when the
/// leader resigns (`resign`) or is dropped; never do both lead.
pub(crate) async fn an_election_hands_over<S: Subject>(s: &S, resign: bool) {
    let name = unique("elect-hand-over");
    subscribe(s).await;
    let first = lease(s, "leader-a").elect(&name, LONG);
    let term = timeout(LONG, first.leading())
        .await
        .expect("the first leads");
    let second = lease(s, "leader-b").elect(&name, LONG);
    let monitor = never_two_leaders(&first, &second);
    let following = timeout(
        LONG,
        second
            .watch()
            .wait_for(|l| matches!(l, Leadership::Following { .. })),
    )
    .await
    .expect("the second follows")
    .unwrap()
    .clone();
    assert_follows(s, &following, "leader-a", true);
    assert!(first.is_leader() && !second.is_leader());
    sleep(WAITED).await;
    assert!(!second.is_leader(), "the second leads while the first does");
    // The leader's work stops with its term (the lease passes on only
    // once every clone of the Term is dropped).
    let (token, fence) = (term.token(), term.fencing_token());
    drop(term);
    let stepped_down = Instant::now();
    if resign {
        first.resign().await.unwrap();
        assert!(token.is_cancelled());
    } else {
        drop(first); // releases in the background
    }
    let bound = hand_over_bound(s, LONG);
    let next = timeout(LONG / 2, second.leading())
        .await
        .expect("the second leads once the first has stepped down");
    let took = stepped_down.elapsed();
    eprintln!("led {took:?} after the first stepped down");
    assert!(
        took < bound,
        "led {took:?} after the first stepped down, not under {bound:?} ({})",
        hand_over_kind(s)
    );
    assert!(token.is_cancelled(), "the first term ended");
    assert_eq!(
        *second.watch().borrow(),
        Leadership::Leading {
            fencing_token: next.fencing_token()
        }
    );
    if s.caps().fencing {
        assert!(next.fencing_token() > fence);
    }
    second.resign().await.unwrap();
    check_one_leader(monitor).await;
}

/// Two elections of one name: the first leads, the second follows it
/// (naming it as far as the backend can, [`Naming`]), and leads once the
/// first resigns — about one round trip later where the server pushes
/// releases, else within a poll — with a larger fencing token; never do
/// both lead.
pub async fn an_election_hands_over_on_resign<S: Subject>(s: &S) {
    an_election_hands_over(s, true).await;
}

/// As [`an_election_hands_over_on_resign`], with the leader's election
/// dropped instead of resigned: it releases in the background, as fast.
pub async fn an_election_hands_over_on_drop<S: Subject>(s: &S) {
    an_election_hands_over(s, false).await;
}

/// A leader whose lease is stolen: its term's token fires, it stops
/// leading and follows the thief; it contends again, and leads again
/// (with a larger fence) about a poll after the thief lets go.
pub async fn an_election_contends_again_after_a_steal<S: Subject>(s: &S) {
    let name = unique("elect-steal");
    let ttl = ms(1_500); // renewed every 500 ms; a poll of 150 ms ± 20%
    let election = lease(s, "leader-a").elect(&name, ttl);
    let term = timeout(LONG, election.leading()).await.expect("leads");
    let mut state = election.watch();
    sleep(ms(100)).await;
    s.steal(&name, "thief").await;
    // Noticed at the next renewal, as `a_stolen_lease_cancels_the_token`.
    let bound = ttl / 3 + ms(500);
    timeout(bound, term.token().cancelled())
        .await
        .unwrap_or_else(|_| panic!("the term did not end within {bound:?} of the steal"));
    assert!(!term.is_valid() && !election.is_leader());
    let stolen_term = term.fencing_token();
    drop(term); // the leader's work stops
    // Followed as named within a few polls (each attempt asks again).
    // (The answer is a read guard of the state: dropped at once, or the
    // election could not publish its next state.)
    let named = timeout(
        SLACK + poll_max(ttl) * 3,
        state.wait_for(|l| follows_as_named(s, l, "thief", false)),
    )
    .await
    .is_ok_and(|seen| seen.is_ok());
    let following = election.watch().borrow().clone();
    assert!(named, "does not follow the thief as named: {following:?}");
    assert_follows(s, &following, "thief", false);
    // The thief keeps it: no term.
    sleep(poll_max(ttl) * 2).await;
    assert!(
        !election.is_leader(),
        "leads while the thief holds the lease"
    );
    let stolen = s
        .backend()
        .inspect(&name)
        .await
        .unwrap()
        .and_then(|i| i.fencing_token);
    let freed = Instant::now();
    s.let_go(&name, "thief").await;
    let bound = poll_max(ttl) + SLACK;
    let next = timeout(bound, election.leading())
        .await
        .unwrap_or_else(|_| panic!("did not lead again within {bound:?} of the thief letting go"));
    eprintln!("led again {:?} after the thief let go", freed.elapsed());
    assert!(next.is_valid() && !next.token().is_cancelled());
    if s.caps().fencing {
        assert!(next.fencing_token() > stolen && stolen > stolen_term);
    }
    election.resign().await.unwrap();
}

/// A waiter whose holder crashed (it acquired with a ttl of
/// 2 s, and nothing renews or releases its lease) is granted the lease at
/// its expiry — the expiry the backend reports, or its watch — not a poll
/// later: no sooner than the ttl after the crashed acquisition was sent,
/// and within two round trips (plus 300 ms for a loaded machine) of the
/// latest the server may expire it. The waiter's own ttl is long, so that
/// its poll (1 s ± 20%) would mostly come later than that.
pub async fn a_waiter_is_granted_at_a_crashed_holders_expiry<S: Subject>(s: &S) {
    if !s.caps().expires {
        return; // a lease without expiry ends with its session: above
    }
    let name = unique("wait-expiry");
    let ttl = TTL;
    let b = s.backend();
    let sent = Instant::now();
    let crashed = acquired(&b, &name, "crashed", ttl).await;
    let answered = Instant::now();
    let asked = Instant::now();
    b.inspect(&name).await.unwrap().expect("a record");
    let rtt = asked.elapsed().max(answered - sent);
    let survivor = lease(s, "survivor");
    let got = survivor.acquire(&name, LONG, ms(10_000)).await;
    let at = Instant::now();
    let guard = got.unwrap().expect("taken over within the wait");
    let early = ms(20); // clocks that round to the millisecond
    assert!(
        at + early >= sent + ttl,
        "taken {:?} before the lease expired",
        (sent + ttl).saturating_duration_since(at)
    );
    let latest = answered + s.expiry(ttl);
    let late = at.saturating_duration_since(latest);
    let bound = rtt * 2 + ms(300);
    eprintln!(
        "taken {:?} after the ttl, round trip {rtt:?}",
        at.saturating_duration_since(sent + ttl)
    );
    assert!(
        late <= bound,
        "taken {late:?} after the latest expiry, not within {bound:?}: a poll later?"
    );
    if s.caps().fencing {
        assert!(guard.fencing_token() > crashed, "a larger fence");
    }
    guard.release().await.unwrap();
}
