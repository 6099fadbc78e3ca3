//! Operating a `Lease`: `held()`, `shutdown()`, `max_hold`, the `Job`
//! builder — under tokio's paused clock, against `Memory`.

#![allow(clippy::unwrap_used, missing_docs)]

use std::time::Duration;

use lease::backend::Memory;
use lease::{Error, Lease, Outcome, Skip};
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
    // b's deadline: acquired 200 ms ago, ttl - margin (32 ms) ahead of that.
    assert_eq!(held[1].valid_for, TTL - ms(32) - ms(200));
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
    assert_eq!(Instant::now(), t0, "Memory answers at once");
    assert!(g1.token().is_cancelled() && g2.token().is_cancelled());
    for name in ["one", "two", "three", "leader"] {
        assert_eq!(db.holder(name), None, "{name} was not released");
    }
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
    // Releasing a guard after the shutdown is a no-op.
    g1.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn max_hold_cancels_the_token_and_releases_even_a_job_that_does_not_stop() {
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

    // A job that ignores its token: the lease ends at max_hold all the same.
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
    assert!(took >= ms(5000) && took <= ms(5400), "{took:?}");
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
