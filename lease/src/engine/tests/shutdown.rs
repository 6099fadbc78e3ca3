//! `shutdown` and `max_hold`: the body is waited for up to its grace, a
//! lease inside its `min_hold` is left to expire.

use super::*;

/// An acquisition whose request is in flight when `shutdown` is called: its
/// grant, arriving after the shutdown began, is given back and the call
/// fails with `ShutDown`; `shutdown` waits for that, so that nothing is held
/// when it returns (issue 29, point 3).
#[tokio::test(start_paused = true)]
async fn a_grant_arriving_during_shutdown_is_released_and_refused() {
    let backend = Scripted::new([], Step::Answer(true)).acquires(Step::Slow(ms(300), true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let acquiring = tokio::spawn({
        let lease = lease.clone();
        async move { lease.try_acquire("job", TTL).await }
    });
    sleep(ms(100)).await; // the acquire request is in flight
    lease.shutdown().await;
    let shut_down_after = Instant::now() - t0;
    match acquiring.await.unwrap() {
        Err(Error::ShutDown) => {}
        Ok(Some(guard)) => panic!(
            "a grant that arrived after shutdown was handed out: valid {}",
            guard.is_valid()
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        shut_down_after,
        ms(300),
        "shutdown waits for the acquisition in flight"
    );
    assert!(lease.held().is_empty());
    // Given back when it arrived, by its fence, before shutdown returned.
    let releases = backend.times(t0, |c| matches!(c, Call::Release(_)));
    assert_eq!(releases, [ms(300)]);
    assert_eq!(backend.0.lock().unwrap().fences, [Some(1)]);
    sleep(TTL * 2).await;
    assert!(
        backend.times(t0, is_renew).is_empty(),
        "renewed after shutdown"
    );
}

/// `shutdown` waits for an acquisition in flight only as long as its time
/// limits: one whose caller stopped polling it does not hold it up for ever.
#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_an_acquisition_no_longer_than_its_time_limits() {
    let backend = Scripted::new([], Step::Answer(true)).acquires(Step::Hang);
    let lease = Lease::with_holder(backend, "a");
    let t0 = Instant::now();
    let mut acquiring = std::pin::pin!(lease.try_acquire("job", TTL));
    assert!(
        tokio::time::timeout(ms(1), acquiring.as_mut())
            .await
            .is_err()
    );
    // Never polled again.
    lease.shutdown().await;
    assert_eq!(
        Instant::now() - t0,
        crate::engine::timing::acquire_timeout(TTL) + crate::engine::timing::release_timeout(TTL)
    );
}

/// `Memory` whose acquisitions take effect at once but answer after a delay
/// (a slow reply).
#[derive(Clone)]
struct SlowAcquire(Memory, Duration);

impl Backend for SlowAcquire {
    async fn acquire(&self, n: &str, h: &str, ttl: Duration) -> Result<Option<Grant>, Error> {
        let grant = self.0.acquire(n, h, ttl).await;
        sleep(self.1).await;
        grant
    }
    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        self.0.renew(lease, ttl).await
    }
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.0.release(lease).await
    }
}

/// An election whose acquisition is in flight when its `Lease` is shut
/// down never leads, and another holder takes the lease as soon as
/// `shutdown` has returned (issue 29, point 3).
#[tokio::test(start_paused = true)]
async fn an_election_contending_during_shutdown_never_leads() {
    let db = Memory::new();
    let lease = Lease::with_holder(SlowAcquire(db.clone(), ms(300)), "a");
    let election = lease.elect("leader", TTL);
    let seen: Arc<Mutex<Vec<crate::Leadership>>> = Arc::default();
    let mut watch = election.watch();
    tokio::spawn({
        let seen = seen.clone();
        async move {
            while watch.changed().await.is_ok() {
                seen.lock().unwrap().push(watch.borrow_and_update().clone());
            }
        }
    });
    sleep(ms(100)).await; // the election's acquire request is in flight
    lease.shutdown().await;
    let other = Lease::with_holder(db.clone(), "b");
    let taken = other.try_acquire("leader", TTL).await.unwrap();
    assert!(
        taken.is_some(),
        "another holder cannot take the lease after shutdown: held by {:?}",
        db.holder("leader")
    );
    sleep(TTL).await;
    assert!(!election.is_leader());
    let seen = seen.lock().unwrap().clone();
    assert!(
        !seen
            .iter()
            .any(|l| matches!(l, crate::Leadership::Leading { .. })),
        "led after shutdown: {seen:?}"
    );
    assert!(matches!(election.resign().await, Err(Error::ShutDown)));
}

/// `max_hold` is kept to the millisecond even when another lease held
/// through the same `Lease` has the scheduler planned to wake up later
/// (issue 29, point 5).
#[tokio::test(start_paused = true)]
async fn max_hold_fires_on_time_with_another_lease_held() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let ttl = Duration::from_secs(9);
    let other = lease.try_acquire("other", ttl).await.unwrap().unwrap();
    sleep(ms(100)).await; // the scheduler sleeps until other's renewal at 3 s
    let t0 = Instant::now();
    let guard = granted(lease.job("capped", ttl).max_hold(ms(500))).await;
    let fired = cancelled_after(&guard, t0).await;
    assert!(
        fired >= ms(500) && fired <= ms(501),
        "the token fired {fired:?} after acquisition, not at max_hold (500ms)"
    );
    assert!(other.is_valid());
}

/// Try to acquire `name` through `other` every 10 ms until it succeeds;
/// when it did.
async fn acquired_by(other: &Lease, name: &str) -> (Instant, LeaseGuard) {
    loop {
        if let Some(guard) = other.try_acquire(name, TTL).await.unwrap() {
            return (Instant::now(), guard);
        }
        sleep(ms(10)).await;
    }
}

/// A body that winds down for 400 ms once its token fires: when it was
/// told to stop, and when it returned.
async fn winding_down(token: crate::CancellationToken) -> (Instant, Instant) {
    token.cancelled().await;
    let told = Instant::now();
    sleep(ms(400)).await;
    (told, Instant::now())
}

/// The lease passed to another holder at `taken_at`: not before its body
/// returned, and at the other holder's next try after that (10 ms).
fn taken_once_returned(taken_at: Instant, returned: Instant, t0: Instant) {
    assert!(
        taken_at >= returned,
        "another holder got the lease {:?} before the body returned",
        returned - taken_at
    );
    assert!(taken_at - returned <= ms(10), "{:?}", taken_at - t0);
}

/// Issue 28, point 2: `shutdown` cancels the token, keeps the lease while
/// the body winds down (400 ms here, within its grace of 1 s), and releases
/// it as soon as the body has returned — never before: another holder
/// trying all along gets it only then, and `shutdown` returns then too.
#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_a_body_that_stops_within_its_grace() {
    let (_db, a, b) = pods();
    let t0 = Instant::now();
    let job = tokio::spawn({
        let a = a.clone();
        async move { a.with_lease("job", TTL, winding_down).await }
    });
    sleep(ms(500)).await;
    let shutdown = tokio::spawn({
        let a = a.clone();
        async move {
            a.shutdown().await;
            Instant::now()
        }
    });
    let (taken_at, _taken) = acquired_by(&b, "job").await;
    let Outcome::Ran((_, returned)) = job.await.unwrap() else {
        panic!("the job did not run")
    };
    assert_eq!(returned - t0, ms(900));
    taken_once_returned(taken_at, returned, t0);
    assert_eq!(
        shutdown.await.unwrap() - t0,
        ms(900),
        "released once the body ended"
    );
}

/// Issue 28, point 2: a body that ignores its token does not make
/// `shutdown` hang — it returns when the grace is over — and its lease is
/// left unreleased and unrenewed: nobody else gets it before it expires on
/// the store, a ttl after its last renewal (sent at 1 s, during the grace).
#[tokio::test(start_paused = true)]
async fn shutdown_leaves_a_body_that_ignores_its_token_to_expire() {
    use crate::test_util::capture_logs;
    let (logs, _guard) = capture_logs();
    let (_db, a, b) = pods();
    let t0 = Instant::now();
    let _job = tokio::spawn({
        let a = a.clone();
        async move {
            a.with_lease("stubborn", TTL, |_| std::future::pending::<()>())
                .await
        }
    });
    sleep(ms(500)).await;
    a.shutdown().await;
    assert_eq!(
        Instant::now() - t0,
        ms(500) + GRACE,
        "shutdown returns at the grace"
    );
    assert!(a.held().is_empty());
    let (taken_at, _taken) = acquired_by(&b, "stubborn").await;
    assert_eq!(
        taken_at - t0,
        PERIOD + TTL,
        "the lease passed on before it expired on the store"
    );
    let logs = logs.text();
    assert!(
        logs.lines().any(|l| l.contains("WARN")
            && l.contains("lease.name=stubborn")
            && l.contains("grace")),
        "{logs}"
    );
}

/// Issue 28, point 2b: a lease kept for its `min_hold` after a fast body
/// returned is not released by `shutdown` (that would let another replica
/// run the job again in the same tick): it is left to expire on the store,
/// a ttl after its acquisition here (no renewal since).
#[tokio::test(start_paused = true)]
async fn shutdown_keeps_min_hold_by_leaving_the_lease_to_expire() {
    let (_db, a, b) = pods();
    let t0 = Instant::now();
    let out = a
        .job("fast", TTL)
        .min_hold(ms(1500))
        .run(|_, _| async {})
        .await;
    assert!(out.is_ran());
    sleep(ms(300)).await;
    a.shutdown().await;
    assert_eq!(Instant::now() - t0, ms(300), "nothing to wait for");
    let (taken_at, _taken) = acquired_by(&b, "fast").await;
    assert_eq!(
        taken_at - t0,
        TTL,
        "the lease passed on before it expired on the store"
    );
}

/// Issue 28, point 3: at `max_hold` the token fires, and then the lease is
/// kept (renewed) while the body winds down and released once it returns;
/// nobody else has it before.
#[tokio::test(start_paused = true)]
async fn max_hold_waits_for_the_body_before_releasing() {
    let (_db, a, b) = pods();
    let t0 = Instant::now();
    let job = tokio::spawn(async move {
        let job = a.job("capped", TTL).max_hold(ms(1500));
        job.run(|token, _| winding_down(token)).await
    });
    sleep(ms(10)).await; // the job has the lease
    let (taken_at, _taken) = acquired_by(&b, "capped").await;
    let Outcome::Ran((told, returned)) = job.await.unwrap() else {
        panic!("the job did not run")
    };
    assert_eq!(told - t0, ms(1500));
    assert_eq!(returned - t0, ms(1900));
    taken_once_returned(taken_at, returned, t0);
}

/// Issue 28, point 3: a body that ignores its token after `max_hold` keeps
/// the lease renewed for at most its grace, then it is left to expire: at
/// most `max_hold + grace + ttl` after the acquisition (here its last
/// renewal is sent at 2 s, within the grace that ends at 2.5 s).
#[tokio::test(start_paused = true)]
async fn max_hold_leaves_a_hung_body_s_lease_to_expire_after_the_grace() {
    let (_db, a, b) = pods();
    let t0 = Instant::now();
    let guard = granted(a.job("hung", TTL).max_hold(ms(1500))).await;
    assert_eq!(cancelled_after(&guard, t0).await, ms(1500));
    assert!(!guard.is_valid());
    let (taken_at, _taken) = acquired_by(&b, "hung").await;
    assert_eq!(taken_at - t0, 2 * PERIOD + TTL);
    assert!(taken_at - t0 <= ms(1500) + GRACE + TTL);
    drop(guard);
}

/// Issue 28, point 2: `shutdown` returns within the grace plus the
/// release's time limit: a body that stops late in its grace, then a
/// release that hangs until its limit (`min(ttl, 30 s)` = 3 s).
#[tokio::test(start_paused = true)]
async fn shutdown_returns_within_the_grace_plus_the_release_limit() {
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Hang);
    let lease = Lease::with_holder(backend.clone(), "a");
    let _job = tokio::spawn({
        let lease = lease.clone();
        async move {
            lease
                .with_lease("job", TTL, |token| async move {
                    token.cancelled().await;
                    sleep(ms(950)).await;
                })
                .await
        }
    });
    sleep(ms(100)).await;
    let t0 = Instant::now();
    lease.shutdown().await;
    let took = Instant::now() - t0;
    assert_eq!(took, ms(950) + crate::engine::timing::release_timeout(TTL));
    assert!(took <= GRACE + crate::engine::timing::release_timeout(TTL));
    // The lease was renewed while the body wound down (due 1 s after the
    // acquisition), then released once it had ended.
    assert_eq!(backend.times(t0, is_renew), [ms(900)]);
    let released = backend.times(t0, |c| matches!(c, Call::Release(_)));
    assert_eq!(released, [ms(950)]);
}

/// Healthy leases with the largest grace (ttl/2: 0.5 s left before the
/// deadline when a renewal is due) are still renewed together, in one call
/// per period: only a lease with less left than a healthy one goes alone.
#[tokio::test(start_paused = true)]
async fn leases_with_a_large_grace_are_still_renewed_in_one_batch() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guards = [
        granted(lease.job("a", TTL).grace(TTL / 2)).await,
        granted(lease.job("b", TTL).grace(TTL / 2)).await,
    ];
    sleep(ms(3_100)).await;
    let renews = backend.renewals(t0);
    assert_eq!(renews.len(), 3, "{renews:?}");
    for (i, (at, call)) in renews.iter().enumerate() {
        assert_eq!(*at, PERIOD * (i as u32 + 1));
        assert!(
            matches!(call, Call::RenewMany(names) if names.len() == 2),
            "{call:?}"
        );
    }
    assert!(guards.iter().all(|g| g.is_valid()));
}
