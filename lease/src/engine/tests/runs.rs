//! `with_lease` and `try_acquire` runs: releases after the body, skips,
//! input checks, an acquisition that hangs.

use super::*;

#[tokio::test(start_paused = true)]
async fn with_lease_releases_after_f_returns() {
    let (db, lease, _) = pods();
    let out = lease
        .with_lease("job", TTL, |token| {
            let db = db.clone();
            async move {
                sleep(TTL * 2).await; // renewed meanwhile
                assert!(!token.is_cancelled());
                db.holder("job")
            }
        })
        .await;
    assert_eq!(out.into_result().unwrap(), Some(Some("a".to_owned())));
    assert_eq!(db.holder("job"), None);
    assert_eq!(db.fence("job"), 1, "release keeps the fencing counter");
}

#[tokio::test(start_paused = true)]
async fn with_lease_token_fires_when_the_lease_is_lost() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
    let t0 = Instant::now();
    let stolen = db.clone();
    tokio::spawn(async move {
        sleep(ms(2_500)).await;
        stolen.expire("job");
    });
    let out = lease
        .with_lease("job", TTL, |token| async move {
            token.cancelled().await;
            Instant::now() - t0
        })
        .await;
    assert_eq!(out.ran(), Some(3 * PERIOD));
}

#[tokio::test(start_paused = true)]
async fn with_lease_releases_after_f_panics() {
    let (db, lease, other) = pods();
    let task = tokio::spawn(async move {
        lease
            .with_lease("job", TTL, |_| async {
                sleep(PERIOD).await;
                panic!("job failed");
            })
            .await
    });
    assert!(task.await.unwrap_err().is_panic());
    sleep(ms(1)).await; // let the background release run
    assert_eq!(db.holder("job"), None);
    assert!(other.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn with_lease_releases_when_dropped_mid_run() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let run = lease.with_lease("job", TTL, |_| sleep(TTL * 10));
    assert!(tokio::time::timeout(ms(1_500), run).await.is_err());
    sleep(ms(1)).await;
    let calls: Vec<Call> = backend.calls().into_iter().map(|(_, c)| c).collect();
    assert_eq!(
        calls,
        vec![
            Call::Acquire("job".into()),
            Call::Renew("job".into()),
            Call::Release("job".into())
        ]
    );
    // Nothing renews it any more.
    sleep(TTL * 2).await;
    assert_eq!(backend.calls().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_second_run_of_a_held_name_on_the_same_lease_is_skipped() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
    let inner = lease.clone();
    let out = lease
        .with_lease("job", TTL, |_| async move {
            let second = inner
                .with_lease("job", TTL, |_| async { "ran twice" })
                .await;
            assert!(inner.try_acquire("job", TTL).await.unwrap().is_none());
            second
        })
        .await;
    assert!(matches!(
        out,
        Outcome::Ran(Outcome::Skipped(Skip::HeldElsewhere))
    ));
    // Free again once the first run is over.
    assert!(lease.with_lease("job", TTL, |_| async {}).await.is_ran());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_releases_in_the_background() {
    let db = Memory::new();
    let (_lease, guard, _) = job_held(db.clone()).await;
    let token = guard.token();
    drop(guard);
    assert!(token.is_cancelled());
    sleep(ms(1)).await;
    assert_eq!(db.holder("job"), None);
}

#[tokio::test(start_paused = true)]
async fn release_cancels_the_token_and_stops_renewing() {
    let backend = Scripted::new([], Step::Answer(true));
    let (_lease, guard, t0) = job_held(backend.clone()).await;
    let token = guard.token();
    sleep(ms(1_500)).await;
    guard.release().await.unwrap();
    assert!(token.is_cancelled());
    sleep(TTL * 3).await;
    assert_eq!(backend.times(t0, is_renew), vec![PERIOD]);
}

#[tokio::test(start_paused = true)]
async fn invalid_input_is_rejected_before_the_backend() {
    let backend = Scripted::default();
    let lease = Lease::with_holder(backend.clone(), "a");
    assert!(matches!(
        lease.try_acquire("", TTL).await,
        Err(Error::InvalidName { len: 0 })
    ));
    let long = "x".repeat(256);
    assert!(matches!(
        lease.try_acquire(&long, TTL).await,
        Err(Error::InvalidName { len: 256 })
    ));
    assert!(matches!(
        lease.try_acquire("job", ms(9)).await,
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        lease.try_acquire("job", Duration::from_secs(86_401)).await,
        Err(Error::InvalidTtl { .. })
    ));
    let out = lease.with_lease("job", Duration::ZERO, |_| async {}).await;
    assert!(matches!(
        out,
        Outcome::Skipped(Skip::Error(Error::InvalidTtl { .. }))
    ));
    let nobody = Lease::with_holder(backend.clone(), "");
    assert!(matches!(
        nobody.try_acquire("job", TTL).await,
        Err(Error::InvalidHolder { len: 0 })
    ));
    assert!(backend.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_acquire_times_out() {
    // A grant after `ttl - grace` would be past its deadline: not waited for.
    let lease = an_acquire_that_hangs_times_out(TTL, TTL - GRACE).await;
    // The name is free for the next attempt.
    assert!(matches!(
        lease.try_acquire("job", TTL).await,
        Err(Error::Timeout { .. })
    ));
}
