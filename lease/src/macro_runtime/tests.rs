//! `#[singleton]`'s runtime side under tokio's paused clock, against `Memory`.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use super::{AsLease, run};
use crate::backend::Memory;
use crate::test_util::capture_logs;
use crate::{Error, Lease, Skippable};

/// ttl 3 s: renewed every 1 s.
const TTL_MS: u64 = 3_000;
const TTL: Duration = Duration::from_millis(TTL_MS);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn pods() -> (Memory, Lease, Lease) {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
    (db, a, b)
}

/// Run a body that records that it ran and returns `value`.
async fn tick<T: Skippable>(lease: Option<&Lease>, ran: &Mutex<bool>, value: T) -> T {
    run(lease.cloned(), "job", TTL_MS, None, |_, _| async move {
        *ran.lock().unwrap() = true;
        value
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn runs_the_body_with_the_token_and_fencing_token_and_releases() {
    let (db, a, _) = pods();
    for expected_fence in [1, 2] {
        let db = &db;
        let out = run(
            Some(a.clone()),
            "job",
            TTL_MS,
            None,
            |token, fence| async move {
                assert!(!token.is_cancelled());
                assert_eq!(db.holder("job").as_deref(), Some("a"));
                fence
            },
        )
        .await;
        assert_eq!(out, Some(expected_fence));
        sleep(ms(1)).await;
        assert_eq!(db.holder("job"), None, "released after the body");
    }
}

#[tokio::test(start_paused = true)]
async fn held_elsewhere_returns_the_skipped_value_without_running() {
    let (_db, a, b) = pods();
    let _held = b.try_acquire("job", TTL).await.unwrap().unwrap();
    let ran = Mutex::new(false);
    tick(Some(&a), &ran, ()).await;
    assert!(!tick(Some(&a), &ran, true).await);
    assert_eq!(tick(Some(&a), &ran, Some(7)).await, None);
    assert_eq!(tick(Some(&a), &ran, Ok::<(), String>(())).await, Ok(()));
    assert_eq!(tick(Some(&a), &ran, Err::<(), _>("boom")).await, Ok(()));
    assert_eq!(
        tick(Some(&a), &ran, Ok::<_, String>(Some(7))).await,
        Ok(None)
    );
    assert!(!*ran.lock().unwrap(), "the body must not run");
}

#[tokio::test(start_paused = true)]
async fn an_acquisition_error_returns_the_skipped_value() {
    let (_db, a, _) = pods();
    let out: Result<Option<u8>, Error> = run(Some(a), "job", 0, None, |_, _| async {
        unreachable!("ttl 0 is invalid");
    })
    .await;
    assert!(matches!(out, Ok(None)));
}

#[tokio::test(start_paused = true)]
async fn no_lease_is_skipped_with_an_error_log_not_a_panic() {
    let (logs, _guard) = capture_logs();
    let ran = Mutex::new(false);
    assert_eq!(tick(None, &ran, Some(1)).await, None);
    assert!(!*ran.lock().unwrap());
    let logs = logs.text();
    assert!(logs.contains("ERROR"), "{logs}");
    assert!(logs.contains("lease::set_global_default"), "{logs}");
    assert!(logs.contains("lease = ..."), "{logs}");
    assert!(logs.contains("lease.name=\"job\""), "{logs}");
}

#[tokio::test(start_paused = true)]
async fn min_hold_keeps_the_lease_after_a_fast_body_then_lets_go() {
    let (db, a, b) = pods();
    let t0 = Instant::now();
    let out = run(Some(a.clone()), "job", TTL_MS, Some(2_000), |_, _| async {
        Some(1)
    })
    .await;
    assert_eq!(out, Some(1));
    assert_eq!(Instant::now(), t0, "returns at once");

    sleep_until(t0 + ms(1_999)).await;
    assert_eq!(db.holder("job").as_deref(), Some("a"));
    assert!(
        b.try_acquire("job", TTL).await.unwrap().is_none(),
        "another pod is refused"
    );
    let again = run(Some(a.clone()), "job", TTL_MS, None, |_, _| async {
        Some(2)
    })
    .await;
    assert_eq!(again, None, "this pod's next tick is skipped too");

    sleep_until(t0 + ms(2_001)).await;
    assert_eq!(db.holder("job"), None, "released once min_hold has passed");
    assert!(b.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn min_hold_longer_than_the_ttl_renews_the_lease() {
    let (db, a, b) = pods();
    let t0 = Instant::now();
    let fence = run(
        Some(a.clone()),
        "job",
        TTL_MS,
        Some(10_000),
        |_, fence| async move { fence },
    )
    .await;
    for at in [2_000, 4_000, 6_000, 8_000, 9_999] {
        sleep_until(t0 + ms(at)).await;
        assert_eq!(
            db.holder("job").as_deref(),
            Some("a"),
            "held at {at} ms, past the 3 s ttl"
        );
        assert!(b.try_acquire("job", TTL).await.unwrap().is_none());
    }
    assert_eq!(
        db.fence("job"),
        fence.unwrap(),
        "renewed, never re-acquired"
    );
    sleep_until(t0 + ms(10_001)).await;
    assert_eq!(db.holder("job"), None);
}

#[tokio::test(start_paused = true)]
async fn min_hold_shorter_than_the_body_releases_when_the_body_ends() {
    let (db, a, _) = pods();
    let t0 = Instant::now();
    run(Some(a), "job", TTL_MS, Some(2_000), |_, _| sleep(ms(5_000))).await;
    assert_eq!(Instant::now() - t0, ms(5_000));
    sleep(ms(1)).await;
    assert_eq!(db.holder("job"), None);
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_during_min_hold_is_cleaned_up() {
    let (db, a, b) = pods();
    let t0 = Instant::now();
    run(Some(a.clone()), "job", TTL_MS, Some(10_000), |_, _| async {
    })
    .await;
    sleep_until(t0 + ms(1_500)).await;
    db.expire("job");
    let taker = b
        .try_acquire("job", TTL)
        .await
        .unwrap()
        .expect("expired, so free");
    // a's renewal at 2 s finds the lease gone: a stops holding it at once
    // (and does not release b's lease).
    sleep_until(t0 + ms(2_001)).await;
    assert_eq!(db.holder("job").as_deref(), Some("b"));
    assert!(taker.is_valid());
    drop(taker);
    sleep(ms(1)).await;
    assert!(
        a.try_acquire("job", TTL).await.unwrap().is_some(),
        "a may acquire the name again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_during_the_body_is_released_despite_min_hold() {
    let (db, a, _) = pods();
    let db2 = db.clone();
    run(
        Some(a.clone()),
        "job",
        TTL_MS,
        Some(10_000),
        |token, _| async move {
            db2.expire("job");
            token.cancelled().await; // noticed at the renewal at 1 s
        },
    )
    .await;
    sleep(ms(1)).await;
    // Nothing renews a lost lease, so nothing may wait for min_hold to free
    // the name: this pod can run the job again at once.
    let again = run(Some(a.clone()), "job", TTL_MS, None, |_, _| async { true }).await;
    assert!(again, "the name must not stay reserved after a loss");
}

#[tokio::test(start_paused = true)]
async fn a_panicking_body_releases_at_once_despite_min_hold() {
    let (db, a, _) = pods();
    let task: tokio::task::JoinHandle<()> = tokio::spawn(async move {
        run(Some(a), "job", TTL_MS, Some(10_000), |_, _| async {
            panic!("job failed")
        })
        .await
    });
    let err = task.await.unwrap_err();
    assert!(err.is_panic());
    sleep(ms(1)).await;
    assert_eq!(db.holder("job"), None);
}

#[test]
fn a_runtime_shutting_down_during_min_hold_frees_the_name() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let a = Lease::with_holder(Memory::new(), "a");
    let rt = runtime();
    rt.block_on(run(
        Some(a.clone()),
        "job",
        TTL_MS,
        Some(10_000),
        |_, _| async {},
    ));
    drop(rt);
    let rt = runtime();
    let guard = rt.block_on(a.try_acquire("job", TTL)).unwrap();
    assert!(
        guard.is_some(),
        "no scheduler is left to release it, so the name must be free"
    );
}

#[tokio::test(start_paused = true)]
async fn the_future_is_send_when_the_body_is() {
    fn assert_send<F: std::future::Future + Send>(f: F) -> F {
        f
    }
    let (_db, a, _) = pods();
    let fut = assert_send(run(
        Some(a),
        "job",
        TTL_MS,
        Some(1_000),
        |token, _| async move {
            sleep(ms(1)).await;
            token.is_cancelled()
        },
    ));
    assert!(!tokio::spawn(fut).await.unwrap());
}

#[test]
fn as_lease_accepts_every_way_of_holding_a_lease() {
    static LAZY: LazyLock<Lease> = LazyLock::new(|| Lease::with_holder(Memory::new(), "lazy"));
    let lease = Lease::with_holder(Memory::new(), "a");
    let holder = |l: Option<Lease>| l.map(|l| l.holder().to_owned());
    assert_eq!(holder(AsLease::as_lease(&lease)).as_deref(), Some("a"));
    assert_eq!(holder(AsLease::as_lease(&&lease)).as_deref(), Some("a"));
    assert_eq!(holder(AsLease::as_lease(&&&lease)).as_deref(), Some("a"));
    assert_eq!(
        holder(AsLease::as_lease(&Arc::new(lease.clone()))).as_deref(),
        Some("a")
    );
    assert_eq!(
        holder(AsLease::as_lease(&Some(&lease))).as_deref(),
        Some("a")
    );
    assert_eq!(holder(AsLease::as_lease(&None::<&Lease>)), None);
    assert_eq!(holder(AsLease::as_lease(&LAZY)).as_deref(), Some("lazy"));
}
