//! `#[singleton]` fns called for real: what a user of the macro sees.
//!
//! `Lease`s with different holders on one `Memory` play the pods (replicas)
//! of a service, some under tokio's paused clock. Every test uses lease
//! names of its own. The two tests that need a real store (two pods on one
//! SQLite file, a lease stolen with SQL) are in the `lease-tests` crate,
//! `tests/tests/singleton_sqlite.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use leasehold::backend::Memory;
use leasehold::{Acquisition, Backend, Error, Grant, Lease, singleton};
use tokio::time::{Instant, sleep, sleep_until};

/// Two pods sharing one in-memory store.
fn pods() -> (Memory, Lease, Lease) {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "pod-a");
    let b = Lease::with_holder(db.clone(), "pod-b");
    (db, a, b)
}

// ---------------------------------------------------------------------------
// Skipped calls return the `Skippable` value, without running the body.

const SKIP: &str = "singleton-skipped";

#[singleton(name = "singleton-skipped", ttl = "2s", lease = pod)]
async fn returns_unit(pod: &Lease, runs: &AtomicU32) {
    runs.fetch_add(1, Ordering::SeqCst);
}

#[singleton(name = "singleton-skipped", ttl = "2s", lease = pod)]
async fn returns_option(pod: &Lease, runs: &AtomicU32) -> Option<u32> {
    Some(runs.fetch_add(1, Ordering::SeqCst))
}

#[singleton(name = "singleton-skipped", ttl = "2s", lease = pod)]
async fn returns_result(pod: &Lease, runs: &AtomicU32) -> Result<(), String> {
    runs.fetch_add(1, Ordering::SeqCst);
    Err("the job failed".into())
}

#[singleton(name = "singleton-skipped", ttl = "2s", lease = pod)]
async fn returns_result_option(pod: &Lease, runs: &AtomicU32) -> Result<Option<u32>, String> {
    Ok(Some(runs.fetch_add(1, Ordering::SeqCst)))
}

#[singleton(name = "singleton-skipped", ttl = "2s", lease = pod)]
async fn returns_bool(pod: &Lease, runs: &AtomicU32) -> bool {
    runs.fetch_add(1, Ordering::SeqCst);
    true
}

#[tokio::test]
async fn a_skipped_call_returns_the_skipped_value() {
    let (_db, a, b) = pods();
    let runs = AtomicU32::new(0);

    // Free: every one runs and returns the body's value.
    returns_unit(&a, &runs).await;
    assert_eq!(returns_option(&a, &runs).await, Some(1));
    assert_eq!(
        returns_result(&a, &runs).await,
        Err("the job failed".into())
    );
    assert_eq!(returns_result_option(&a, &runs).await, Ok(Some(3)));
    assert!(returns_bool(&a, &runs).await);
    assert_eq!(runs.load(Ordering::SeqCst), 5);

    // Held by pod-b: every one is skipped.
    let held = b
        .try_acquire(SKIP, Duration::from_secs(2))
        .await
        .unwrap()
        .expect("free");
    returns_unit(&a, &runs).await;
    assert_eq!(returns_option(&a, &runs).await, None);
    assert_eq!(returns_result(&a, &runs).await, Ok(()));
    assert_eq!(returns_result_option(&a, &runs).await, Ok(None));
    assert!(!returns_bool(&a, &runs).await);
    assert_eq!(runs.load(Ordering::SeqCst), 5, "no body ran");
    held.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// The `token` binding stays uncancelled while the lease is renewed (its
// cancellation when the lease is lost: `tests/tests/singleton_sqlite.rs`).

#[singleton(name = "singleton-token-kept", ttl = "60ms", lease = pod, token = cancel)]
async fn outlives_its_ttl(pod: &Lease) -> Option<bool> {
    sleep(Duration::from_millis(300)).await;
    Some(cancel.is_cancelled())
}

#[tokio::test(start_paused = true)]
async fn the_token_stays_uncancelled_while_the_lease_is_renewed() {
    let (_db, a, b) = pods();
    let (kept, skipped) = tokio::join!(outlives_its_ttl(&a), async {
        sleep(Duration::from_millis(200)).await; // past the 60 ms ttl
        outlives_its_ttl(&b).await
    });
    assert_eq!(kept, Some(false), "renewed for five ttls, never lost");
    assert_eq!(skipped, None, "still held by pod-a");
}

// ---------------------------------------------------------------------------
// `fence` is this acquisition's fencing token.

#[singleton(name = "singleton-fence", ttl = "2s", lease = pod, fence = fencing_token)]
async fn fenced(pod: &Lease) -> Option<u64> {
    fencing_token
}

#[tokio::test]
async fn fence_is_the_fencing_token_of_each_acquisition() {
    let (_db, a, b) = pods();
    let first = fenced(&a).await.expect("ran with a fencing token");
    let second = fenced(&b).await.expect("ran with a fencing token");
    assert!(second > first, "{second} > {first}");
}

// ---------------------------------------------------------------------------
// `min_hold` keeps the lease after a fast body, then lets go.

#[singleton(name = "singleton-min-hold", ttl = "3s", lease = pod, min_hold = "10s")]
async fn fast_job(pod: &Lease) -> Option<&str> {
    Some(pod.holder())
}

#[tokio::test(start_paused = true)]
async fn min_hold_keeps_the_lease_after_a_fast_body_then_lets_go() {
    let (db, a, b) = pods();
    let t0 = Instant::now();
    assert_eq!(fast_job(&a).await, Some("pod-a"));
    assert_eq!(t0.elapsed(), Duration::ZERO, "the fn returns at once");

    // The next ticks on both pods, before min_hold has passed: skipped, also
    // past the 3 s ttl (the lease is renewed meanwhile).
    for at in [1, 4, 9] {
        tokio::time::sleep_until(t0 + Duration::from_secs(at)).await;
        assert_eq!(fast_job(&b).await, None, "pod-b skipped at {at} s");
        assert_eq!(fast_job(&a).await, None, "pod-a skipped at {at} s");
        assert_eq!(db.holder("singleton-min-hold").as_deref(), Some("pod-a"));
    }

    // Then it is released and the next tick runs.
    tokio::time::sleep_until(t0 + Duration::from_millis(10_001)).await;
    assert_eq!(db.holder("singleton-min-hold"), None);
    assert_eq!(fast_job(&b).await, Some("pod-b"));
}

// ---------------------------------------------------------------------------
// `lease = self.lease` on methods.

struct Scheduler {
    lease: Lease,
    digests: u32,
}

impl Scheduler {
    #[singleton(name = "singleton-method", ttl = "2s", lease = self.lease)]
    async fn by_ref(&self) -> Option<u32> {
        sleep(Duration::from_millis(50)).await;
        Some(self.digests)
    }

    #[singleton(name = "singleton-method", ttl = "2s", lease = self.lease, token = cancel)]
    async fn by_mut(&mut self) -> bool {
        sleep(Duration::from_millis(50)).await;
        self.digests += 1;
        !cancel.is_cancelled()
    }

    #[singleton(name = "singleton-method", ttl = "2s", lease = self.lease)]
    async fn by_arc(self: Arc<Self>) -> Option<u32> {
        sleep(Duration::from_millis(50)).await;
        Some(self.digests)
    }
}

#[tokio::test(start_paused = true)]
async fn lease_self_lease_on_ref_mut_and_arc_methods() {
    let (_db, a, b) = pods();
    let mut pod_a = Scheduler {
        lease: a,
        digests: 0,
    };
    let mut pod_b = Scheduler {
        lease: b,
        digests: 0,
    };

    let (ran, skipped) = tokio::join!(pod_a.by_mut(), async {
        sleep(Duration::from_millis(10)).await;
        pod_b.by_mut().await
    });
    assert!(ran && !skipped);
    assert_eq!((pod_a.digests, pod_b.digests), (1, 0));

    let (ran, skipped) = tokio::join!(pod_a.by_ref(), async {
        sleep(Duration::from_millis(10)).await;
        pod_b.by_ref().await
    });
    assert_eq!((ran, skipped), (Some(1), None));

    let (pod_a, pod_b) = (Arc::new(pod_a), Arc::new(pod_b));
    let (ran, skipped) = tokio::join!(pod_a.clone().by_arc(), async {
        sleep(Duration::from_millis(10)).await;
        pod_b.clone().by_arc().await
    });
    assert_eq!((ran, skipped), (Some(1), None));
}

// ---------------------------------------------------------------------------
// Generic fns and `impl Trait` arguments.

#[singleton(name = "singleton-generic", ttl = "2s", lease = pod)]
async fn largest<T: PartialOrd + Copy + Send>(pod: &Lease, items: &[T]) -> Option<T> {
    let mut max = *items.first()?;
    for &x in items {
        if x > max {
            max = x;
        }
    }
    Some(max)
}

#[singleton(name = "singleton-impl-trait", ttl = "2s", lease = pod)]
async fn total(pod: &Lease, amounts: impl IntoIterator<Item = u64>) -> Option<u64> {
    Some(amounts.into_iter().sum())
}

#[tokio::test]
async fn generic_fns_and_impl_trait_arguments() {
    let (_db, a, b) = pods();
    assert_eq!(largest(&a, &[3, 9, 4]).await, Some(9));
    assert_eq!(largest(&a, &[0.5, -1.0]).await, Some(0.5));
    assert_eq!(total(&a, vec![1, 2, 3]).await, Some(6));
    assert_eq!(total(&a, (1..=4).map(|x| x * 10)).await, Some(100));

    let _held = b
        .try_acquire("singleton-generic", Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(largest(&a, &[3, 9, 4]).await, None);
}

// ---------------------------------------------------------------------------
// `return` and `?` in the body.

#[singleton(name = "singleton-return", ttl = "2s", lease = pod)]
async fn parse_and_double(
    pod: &Lease,
    input: &str,
) -> Result<Option<u32>, std::num::ParseIntError> {
    if input.is_empty() {
        return Ok(Some(0));
    }
    let n: u32 = input.trim().parse()?;
    Ok(Some(n * 2))
}

#[tokio::test]
async fn return_and_question_mark_in_the_body() {
    let (_db, a, b) = pods();
    assert_eq!(parse_and_double(&a, "21").await, Ok(Some(42)));
    assert_eq!(
        parse_and_double(&a, "").await,
        Ok(Some(0)),
        "early `return`"
    );
    assert!(
        parse_and_double(&a, "x").await.is_err(),
        "`?` returns the error"
    );

    // The lease is released after an early return and after an error too.
    assert_eq!(parse_and_double(&b, "1").await, Ok(Some(2)));
}

// ---------------------------------------------------------------------------
// `crate = "..."` through a re-export.

mod my_lib {
    pub(crate) use ::leasehold;
}

#[singleton(name = "singleton-crate", ttl = "2s", lease = pod, crate = "my_lib::leasehold")]
async fn through_a_re_export(pod: &my_lib::leasehold::Lease) -> Option<u8> {
    Some(1)
}

#[tokio::test]
async fn crate_path_through_a_re_export() {
    let (_db, a, b) = pods();
    assert_eq!(through_a_re_export(&a).await, Some(1));
    let _held = b
        .try_acquire("singleton-crate", Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(through_a_re_export(&a).await, None);
}

// ---------------------------------------------------------------------------
// The future of an annotated fn can be spawned.

#[singleton(name = "singleton-spawned", ttl = "2s", lease = pod, token = cancel)]
async fn spawned(pod: Lease, names: Vec<String>) -> Option<usize> {
    sleep(Duration::from_millis(500)).await;
    (!cancel.is_cancelled()).then_some(names.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_future_is_send_and_can_be_spawned() {
    let (_db, a, b) = pods();
    let one = tokio::spawn(spawned(a, vec!["x".into(), "y".into()]));
    let two = tokio::spawn(spawned(b, vec![]));
    let (one, two) = (one.await.unwrap(), two.await.unwrap());
    assert!(
        matches!((one, two), (Some(2), None) | (None, Some(0))),
        "{one:?} {two:?}"
    );
}

// ---------------------------------------------------------------------------
// A backend that cannot be reached: skipped, not an error and not a panic.

#[derive(Clone)]
struct Unreachable;

impl Backend for Unreachable {
    async fn acquire(&self, _: &str, _: &str, _: Duration) -> Result<Option<Grant>, Error> {
        Err(Error::backend("connection refused"))
    }
    async fn renew(&self, _: Acquisition<'_>, _: Duration) -> Result<bool, Error> {
        Err(Error::backend("connection refused"))
    }
    async fn release(&self, _: Acquisition<'_>) -> Result<(), Error> {
        Err(Error::backend("connection refused"))
    }
}

#[tokio::test]
async fn an_unreachable_backend_skips_the_run() {
    let down = Lease::with_holder(Unreachable, "pod-a");
    let runs = AtomicU32::new(0);
    assert_eq!(returns_option(&down, &runs).await, None);
    assert_eq!(
        returns_result(&down, &runs).await,
        Ok(()),
        "a skipped tick is not a failure"
    );
    assert_eq!(returns_result_option(&down, &runs).await, Ok(None));
    assert!(!returns_bool(&down, &runs).await);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Round two: expressions for `name` and the durations, `wait`, `max_hold`,
// `on_error = "return"`.

/// One lease per tenant: the name is made from the arguments at each call.
#[singleton(name = format!("singleton-tenant-{tenant}"), ttl = ttl, lease = pod)]
async fn tenant_report(pod: &Lease, tenant: &str, ttl: Duration) -> Option<String> {
    sleep(Duration::from_millis(100)).await;
    Some(format!("{tenant}@{}", pod.holder()))
}

#[tokio::test(start_paused = true)]
async fn a_name_expression_gives_each_tenant_its_own_lease() {
    let (db, a, b) = pods();
    let ttl = Duration::from_secs(2);
    let (acme, globex, acme_again) = tokio::join!(
        tenant_report(&a, "acme", ttl),
        tenant_report(&b, "globex", ttl),
        tenant_report(&b, "acme", ttl),
    );
    assert_eq!(acme.as_deref(), Some("acme@pod-a"));
    assert_eq!(
        globex.as_deref(),
        Some("globex@pod-b"),
        "another tenant's lease"
    );
    assert_eq!(acme_again, None, "the same tenant's lease is held");
    assert_eq!(db.holder("singleton-tenant-acme"), None, "released");

    // Invalid at run time: skipped (logged), not a panic.
    assert_eq!(tenant_report(&a, "acme", Duration::ZERO).await, None);
    let long = "x".repeat(300);
    assert_eq!(tenant_report(&a, &long, ttl).await, None);
}

#[singleton(name = "singleton-wait", ttl = "2s", lease = pod, wait = "5s")]
async fn patient(pod: &Lease) -> Option<Instant> {
    Some(Instant::now())
}

#[tokio::test(start_paused = true)]
async fn wait_runs_once_the_other_pod_lets_go() {
    let (_db, a, b) = pods();
    let held = b
        .try_acquire("singleton-wait", Duration::from_secs(2))
        .await
        .unwrap()
        .expect("free");
    let t0 = Instant::now();
    let release = async {
        sleep(Duration::from_secs(1)).await;
        held.release().await.unwrap();
    };
    let (started, ()) = tokio::join!(patient(&a), release);
    let waited = started.expect("ran after waiting") - t0;
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
}

#[singleton(name = "singleton-max-hold", ttl = "1s", lease = pod, token = cancel, max_hold = max_hold)]
async fn hangs(pod: &Lease, max_hold: Duration) -> Option<Instant> {
    cancel.cancelled().await;
    Some(Instant::now())
}

#[tokio::test(start_paused = true)]
async fn max_hold_stops_a_job_that_would_hang() {
    let (db, a, _) = pods();
    let t0 = Instant::now();
    let stopped = hangs(&a, Duration::from_secs(5)).await.expect("ran");
    assert_eq!(stopped - t0, Duration::from_secs(5));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(db.holder("singleton-max-hold"), None);
}

#[derive(Debug)]
enum ReportError {
    Lease(Error),
}

impl From<Error> for ReportError {
    fn from(e: Error) -> Self {
        ReportError::Lease(e)
    }
}

#[singleton(name = "singleton-on-error", ttl = ttl, lease = pod, on_error = "return")]
async fn reports_errors(pod: &Lease, ttl: Duration) -> Result<Option<u32>, ReportError> {
    Ok(Some(1))
}

#[tokio::test(start_paused = true)]
async fn on_error_return_gives_the_acquisition_error_to_the_caller() {
    let (_db, a, b) = pods();
    let ttl = Duration::from_secs(2);
    assert!(matches!(reports_errors(&a, ttl).await, Ok(Some(1))));
    assert!(matches!(
        reports_errors(&a, Duration::from_millis(1)).await,
        Err(ReportError::Lease(Error::InvalidTtl { .. }))
    ));
    let _held = b
        .try_acquire("singleton-on-error", ttl)
        .await
        .unwrap()
        .expect("free");
    assert!(
        matches!(reports_errors(&a, ttl).await, Ok(None)),
        "held elsewhere is not an error"
    );
}

// ---------------------------------------------------------------------------
// `once_per`: at most one run per schedule slot across the pods, whenever
// in the slot each pod's tick comes; `retry_failed = true`: a failed run
// leaves its slot to be run again.

/// Sleep until 1 s into the next slot of `period` by a `Memory` made just
/// now (its slots follow the wall clock at creation advanced by tokio's
/// clock, which is paused here).
async fn into_next_slot(period: Duration) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_millis();
    let to_next = period.as_millis() - now % period.as_millis();
    sleep(Duration::from_millis(
        u64::try_from(to_next).expect("less than a period") + 1_000,
    ))
    .await;
}

#[singleton(name = "singleton-once-per", ttl = "2s", lease = pod, once_per = "1m")]
async fn every_minute(pod: &Lease, runs: &Mutex<Vec<(String, Instant)>>) -> Option<()> {
    let mut runs = runs.lock().expect("not poisoned");
    runs.push((pod.holder().to_owned(), Instant::now()));
    Some(())
}

/// Each pod ticks every minute, pod-b 20 s after pod-a, then (its clock
/// drifting) 50 s after: each one-minute slot runs once, on whichever pod
/// ticks first in it. (Without `once_per` the lease is free again by the
/// later tick, and both would run.)
#[tokio::test(start_paused = true)]
async fn once_per_runs_each_slot_once_across_pods_with_skewed_ticks() {
    let (_db, a, b) = pods();
    let minute = Duration::from_secs(60);
    into_next_slot(minute).await;
    let t0 = Instant::now();
    let runs = Mutex::new(Vec::new());
    let ticks = |pod: Lease, skews: [u64; 6]| {
        let runs = &runs;
        async move {
            for (slot, skew) in (0..).zip(skews) {
                sleep_until(t0 + minute * slot + Duration::from_secs(skew)).await;
                every_minute(&pod, runs).await;
            }
        }
    };
    tokio::join!(
        ticks(a, [0, 0, 0, 30, 30, 30]),
        ticks(b, [20, 20, 20, 0, 10, 20])
    );
    let runs: Vec<(String, u32)> = runs
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|(pod, at)| (pod, ((at - t0).as_secs() / 60) as u32))
        .collect();
    let ran = |pod: &str, slot| (pod.to_owned(), slot);
    assert_eq!(
        runs,
        [
            ran("pod-a", 0),
            ran("pod-a", 1),
            ran("pod-a", 2),
            ran("pod-b", 3),
            ran("pod-b", 4),
            ran("pod-b", 5),
        ]
    );
}

#[singleton(name = "singleton-retry-failed", ttl = "2s", lease = pod, once_per = "1h", retry_failed = true)]
async fn retried(pod: &Lease, fail: bool, runs: &AtomicU32) -> Result<(), String> {
    runs.fetch_add(1, Ordering::SeqCst);
    if fail {
        Err("the job failed".into())
    } else {
        Ok(())
    }
}

#[singleton(name = "singleton-not-retried", ttl = "2s", lease = pod, once_per = "1h")]
async fn not_retried(pod: &Lease, fail: bool, runs: &AtomicU32) -> Result<(), String> {
    runs.fetch_add(1, Ordering::SeqCst);
    if fail {
        Err("the job failed".into())
    } else {
        Ok(())
    }
}

/// With `retry_failed = true`, an `Err` leaves the slot to be run again (by
/// any pod) until a run returns `Ok`; without it, the failed run was the
/// slot's run.
#[tokio::test(start_paused = true)]
async fn a_failed_run_runs_again_in_its_slot_only_with_retry_failed() {
    let (_db, a, b) = pods();
    into_next_slot(Duration::from_secs(3600)).await;
    let failed = Err("the job failed".to_owned());

    let runs = AtomicU32::new(0);
    assert_eq!(retried(&a, true, &runs).await, failed);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(retried(&b, true, &runs).await, failed, "ran again");
    sleep(Duration::from_secs(1)).await;
    assert_eq!(retried(&a, false, &runs).await, Ok(()), "ran again");
    sleep(Duration::from_secs(1)).await;
    assert_eq!(retried(&b, false, &runs).await, Ok(()), "skipped");
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    let runs = AtomicU32::new(0);
    assert_eq!(not_retried(&a, true, &runs).await, failed);
    sleep(Duration::from_secs(1)).await;
    assert_eq!(not_retried(&b, false, &runs).await, Ok(()), "skipped");
    assert_eq!(not_retried(&a, false, &runs).await, Ok(()), "skipped");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // The next slot runs again.
    sleep(Duration::from_secs(3600)).await;
    assert_eq!(not_retried(&b, false, &runs).await, Ok(()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[singleton(name = "singleton-once-per-expr", ttl = "2s", lease = pod, once_per = period, on_error = "return")]
async fn per_period(pod: &Lease, period: Duration) -> Result<Option<u32>, ReportError> {
    Ok(Some(1))
}

/// A `once_per` expression is checked at each call: zero is an invalid
/// duration (the run is skipped; logged at warn, see the runtime's tests),
/// here returned by `on_error = "return"`.
#[tokio::test(start_paused = true)]
async fn a_zero_once_per_expression_is_an_invalid_duration() {
    let (_db, a, _) = pods();
    assert!(matches!(
        per_period(&a, Duration::ZERO).await,
        Err(ReportError::Lease(Error::InvalidDuration {
            argument: "once_per",
            ..
        }))
    ));
    into_next_slot(Duration::from_secs(60)).await;
    let minute = Duration::from_secs(60);
    assert!(matches!(per_period(&a, minute).await, Ok(Some(1))));
    assert!(
        matches!(per_period(&a, minute).await, Ok(None)),
        "a slot that ran already is skipped, not an error"
    );
}
