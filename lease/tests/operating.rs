//! Operating a `Lease`: `held()`, `shutdown()`, `max_hold`, the `Job`
//! builder — under tokio's paused clock, against `Memory`.

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Duration;

use leasehold::backend::Memory;
use leasehold::{Error, Lease, Outcome, Skip};
use tokio::time::{Instant, sleep};

const TTL: Duration = Duration::from_secs(3);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test(start_paused = true)]
async fn held_lists_the_live_leases_with_their_times() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "pod-a");
    assert!(lease.held().is_empty());
    let a = lease.try_acquire("a", TTL).await.unwrap().unwrap();
    sleep(ms(500)).await;
    let b = lease.try_acquire("b", TTL).await.unwrap().unwrap();
    sleep(ms(200)).await;
    let mut held = lease.held();
    held.sort_by(|x, y| x.name.cmp(&y.name));
    assert_eq!(held.len(), 2);
    assert_eq!(
        (held[0].name.as_str(), held[0].fencing_token),
        ("a", Some(1))
    );
    assert_eq!(held[0].held_for, ms(700));
    assert_eq!(held[1].held_for, ms(200));
    // b's deadline: acquired 200 ms ago, ttl - grace (default ttl/3) ahead
    // of that.
    assert_eq!(held[1].valid_for, TTL - TTL / 3 - ms(200));
    assert_eq!(b.valid_for(), held[1].valid_for);
    assert_eq!(b.ttl(), TTL);
    // Renewals push it out.
    sleep(ms(1500)).await;
    assert!(a.valid_for() > ms(1500), "{:?}", a.valid_for());
    a.release().await.unwrap();
    assert_eq!(lease.held().len(), 1);
    db.expire("b");
    b.token().cancelled().await;
    assert!(lease.held().is_empty(), "a lost lease is not held");
    assert_eq!(b.valid_for(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_everything_and_refuses_new_acquisitions() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "pod-a");
    let clone = lease.clone();
    let g1 = lease.try_acquire("one", TTL).await.unwrap().unwrap();
    let g2 = lease.try_acquire("two", TTL).await.unwrap().unwrap();
    // The holder of "one" releases it when told; "two"'s never does.
    let one = tokio::spawn(async move {
        g1.token().cancelled().await;
        g1.release().await
    });
    let job = tokio::spawn({
        let lease = lease.clone();
        async move {
            lease
                .with_lease("three", TTL, |token| async move {
                    token.cancelled().await;
                    "stopped"
                })
                .await
        }
    });
    let election = lease.elect("leader", TTL);
    election.leading().await;
    sleep(ms(10)).await;
    assert_eq!(lease.held().len(), 4);

    let t0 = Instant::now();
    clone.shutdown().await;
    // It waits for the bodies (Memory answers at once), up to the grace
    // (ttl/3) for "two", which is then left to expire.
    assert_eq!(Instant::now() - t0, TTL / 3);
    assert!(g2.token().is_cancelled() && !g2.is_valid());
    one.await.unwrap().unwrap();
    for name in ["one", "three", "leader"] {
        assert_eq!(db.holder(name), None, "{name} was not released");
    }
    assert_eq!(db.holder("two").as_deref(), Some("pod-a"), "left to expire");
    assert!(matches!(job.await.unwrap(), Outcome::Ran("stopped")));
    assert!(lease.held().is_empty());
    // Every clone refuses to acquire now.
    assert!(matches!(
        lease.try_acquire("four", TTL).await,
        Err(Error::ShutDown)
    ));
    assert!(matches!(
        clone.acquire("four", TTL, ms(1000)).await,
        Err(Error::ShutDown)
    ));
    assert!(matches!(
        lease.with_lease("four", TTL, |_| async {}).await,
        Outcome::Skipped(Skip::Error(Error::ShutDown))
    ));
    assert!(matches!(
        election.resign().await,
        Ok(()) | Err(Error::ShutDown)
    ));
    assert!(!lease.elect("other", TTL).is_leader());
    // Its body done, the guard left to expire may still release it.
    g2.release().await.unwrap();
    assert_eq!(db.holder("two"), None);
}

#[tokio::test(start_paused = true)]
async fn max_hold_cancels_the_token_and_a_job_that_does_not_stop_keeps_the_lease_at_most_a_grace_and_a_ttl_more()
 {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "pod-a");
    let other = Lease::with_holder(db.clone(), "pod-b");
    let t0 = Instant::now();
    // A job that stops when told.
    let out = lease
        .job("polite", TTL)
        .max_hold(ms(5000))
        .run(|token, _| async move {
            token.cancelled().await;
            Instant::now()
        })
        .await;
    let Outcome::Ran(told_at) = out else {
        panic!("{out:?}")
    };
    assert_eq!(told_at - t0, ms(5000));
    assert_eq!(db.holder("polite"), None);

    // A job that ignores its token: the lease is renewed for its grace
    // (ttl/3) after max_hold, then left to expire, so it passes on at most
    // max_hold + grace + ttl after the acquisition — never while the job
    // could still be stopping.
    let t1 = Instant::now();
    let stubborn = tokio::spawn({
        let lease = lease.clone();
        async move {
            lease
                .job("stubborn", TTL)
                .max_hold(ms(5000))
                .run(|_, _| sleep(ms(20_000)))
                .await
        }
    });
    sleep(ms(10)).await;
    assert_eq!(db.holder("stubborn").as_deref(), Some("pod-a"));
    let taken = other
        .acquire("stubborn", TTL, ms(30_000))
        .await
        .unwrap()
        .unwrap();
    let took = Instant::now() - t1;
    let most = ms(5000) + TTL / 3 + TTL;
    // Its last renewal was sent at 5 s (the one due at 6 s, when the grace
    // ends, is not sent); the waiter polls every ttl/10 ± 20%.
    assert!(took >= ms(5000) + TTL && took <= most + ms(360), "{took:?}");
    assert!(taken.fencing_token() > Some(1));
    assert!(stubborn.await.unwrap().is_ran());
}

#[tokio::test(start_paused = true)]
async fn a_job_waits_keeps_min_hold_and_hands_over_the_fencing_token() {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "pod-a");
    let b = Lease::with_holder(db.clone(), "pod-b");
    let t0 = Instant::now();
    // a runs a fast job but keeps the lease for min_hold = 2 s.
    let out = a
        .job("report", TTL)
        .min_hold(ms(2000))
        .run(|_, fence| async move { fence })
        .await;
    assert!(matches!(out, Outcome::Ran(Some(1))));
    assert_eq!(db.holder("report").as_deref(), Some("pod-a"));
    // b waits for it instead of skipping.
    let out = b
        .job("report", TTL)
        .wait(ms(5000))
        .run(|token, fence| async move { (Instant::now() - t0, token.is_cancelled(), fence) })
        .await;
    let Outcome::Ran((at, cancelled, fence)) = out else {
        panic!("{out:?}")
    };
    assert!(at >= ms(2000) && at <= ms(2400), "{at:?}");
    assert!(!cancelled);
    assert_eq!(fence, Some(2));
    // Without a wait, a held lease is skipped at once.
    let _held = a.try_acquire("busy", TTL).await.unwrap().unwrap();
    assert!(matches!(
        b.job("busy", TTL).run(|_, _| async {}).await,
        Outcome::Skipped(Skip::HeldElsewhere)
    ));
    // `acquire` hands out a guard with max_hold applied.
    let guard = b
        .job("guarded", TTL)
        .max_hold(ms(1000))
        .acquire()
        .await
        .unwrap()
        .unwrap();
    guard.token().cancelled().await;
    assert_eq!(Instant::now() - t0, at + ms(1000));
}

/// DESIGN §6.1: an operator's `force_release` keeps a lock delay — the
/// evicted holder's token fires at its next renewal, and nobody gets the
/// lease before the expiry the store last set — while `force_release_now`
/// frees it at once (for a holder known to be dead).
#[tokio::test(start_paused = true)]
async fn a_forced_release_keeps_a_lock_delay_and_the_immediate_one_does_not() {
    use leasehold::Backend;
    let db = Memory::new();
    let (a, b) = (
        Lease::with_holder(db.clone(), "pod-a"),
        Lease::with_holder(db.clone(), "pod-b"),
    );
    let guard = a.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(ms(1500)).await; // renewed at 1 s: the store's expiry is 4 s
    let forced_at = Instant::now();
    assert!(db.force_release("job").await.unwrap());
    let info = db.inspect("job").await.unwrap().unwrap();
    assert!(info.forced && info.is_held(), "{info:?}");
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let got = b.acquire("job", TTL, ms(10_000)).await.unwrap();
            (got, Instant::now())
        }
    });
    guard.token().cancelled().await;
    assert_eq!(Instant::now() - forced_at, ms(500), "at the next renewal");
    let (got, at) = waiter.await.unwrap();
    let got = got.expect("b gets it after the delay");
    assert!(
        at - forced_at >= ms(2500),
        "b got the lease {:?} after the forced release, before its expiry",
        at - forced_at
    );
    assert_eq!(got.fencing_token(), Some(2), "the fence is kept");
    drop(guard);
    // The immediate kind: the next holder may take it at once.
    sleep(ms(100)).await;
    assert!(db.force_release_now("job").await.unwrap());
    assert!(a.try_acquire("job", TTL).await.unwrap().is_some());
}
