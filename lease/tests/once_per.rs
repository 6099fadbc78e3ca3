//! `Job::once_per` on `Memory`, under tokio's paused clock (DESIGN §6.2):
//! a slot runs once across replicas, whatever their skew; with
//! `retry_failed` a failed run leaves it to be run again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold::backend::Memory;
use leasehold::{Backend, Error, Lease, Outcome, Skip};
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(10);
const PERIOD: Duration = Duration::from_secs(60);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Two replicas tick every period, one 20 s after the other, each with a
/// job of 50 ms: every slot runs exactly once (with a plain lease, both
/// would run each tick — the lease is free again by the second tick).
#[tokio::test(start_paused = true)]
async fn skewed_ticks_run_each_slot_once() {
    let db = Memory::new();
    let runs = Arc::new(std::sync::Mutex::new(Vec::<(u64, &str)>::new()));
    let mut replicas = Vec::new();
    for (holder, offset) in [("pod-a", ms(0)), ("pod-b", ms(20_000))] {
        let (db, runs) = (db.clone(), runs.clone());
        let lease = Lease::with_holder(db.clone(), holder);
        replicas.push(tokio::spawn(async move {
            sleep(offset).await;
            for _ in 0..10 {
                let outcome = lease
                    .job("report", TTL)
                    .once_per(PERIOD)
                    .run(|_, _| async { sleep(ms(50)).await })
                    .await;
                if outcome.is_ran() {
                    let info = db.inspect("report").await.unwrap().unwrap();
                    runs.lock().unwrap().push((info.slot.unwrap(), holder));
                }
                sleep(PERIOD).await;
            }
        }));
    }
    for r in replicas {
        r.await.unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    let mut slots: Vec<u64> = runs.iter().map(|(slot, _)| *slot).collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), runs.len(), "a slot ran twice: {runs:?}");
    assert!(runs.len() >= 10, "slots were missed: {runs:?}");
}

/// A run's slot is `LeaseGuard::slot`; the same slot asked again is
/// `AlreadyRan`, from any replica, until the next period.
#[tokio::test(start_paused = true)]
async fn a_slot_is_claimed_at_acquisition_and_refused_after() {
    let db = Memory::new();
    let (a, b) = (
        Lease::with_holder(db.clone(), "pod-a"),
        Lease::with_holder(db.clone(), "pod-b"),
    );
    let guard = a
        .job("report", TTL)
        .once_per(PERIOD)
        .acquire()
        .await
        .unwrap()
        .expect("free");
    let slot = guard.slot().expect("a slot");
    guard.release().await.unwrap();
    // The lease is free, the slot is not.
    let again = b.job("report", TTL).once_per(PERIOD).acquire().await;
    assert!(
        matches!(again, Err(Error::AlreadyRan { slot: s, .. }) if s == slot),
        "{again:?}"
    );
    let skipped = b
        .job("report", TTL)
        .once_per(PERIOD)
        .run(|_, _| async { "ran" })
        .await;
    assert!(
        matches!(skipped, Outcome::Skipped(Skip::AlreadyRan { slot: s }) if s == slot),
        "{skipped:?}"
    );
    assert_eq!(skipped.into_result().unwrap(), None);
    // A plain lease of the name is not affected.
    assert!(b.try_acquire("report", TTL).await.unwrap().is_some());
    // The next period's slot runs.
    sleep(PERIOD).await;
    let next = a
        .job("report", TTL)
        .once_per(PERIOD)
        .acquire()
        .await
        .unwrap();
    let next = next.expect("the next slot");
    assert_eq!(next.slot(), Some(slot + 1));
}

/// Default: a run that fails, or whose replica crashes, still used its
/// slot. `retry_failed`: only a success does; a failure (or a crash) may
/// run again within the slot.
#[tokio::test(start_paused = true)]
async fn retry_failed_records_the_slot_only_on_success() {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "pod-a");
    let failing = |runs: Arc<AtomicUsize>| {
        move |_, _| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Err::<(), &str>("the report could not be written")
        }
    };
    // Default: one run per slot, failed or not.
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let _ = a
            .job("plain", TTL)
            .once_per(PERIOD)
            .try_run(failing(runs.clone()))
            .await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // retry_failed: every failed run may be retried, the first success ends it.
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let _ = a
            .job("retried", TTL)
            .once_per(PERIOD)
            .retry_failed()
            .try_run(failing(runs.clone()))
            .await;
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "failed runs are retried");
    let ok = a
        .job("retried", TTL)
        .once_per(PERIOD)
        .retry_failed()
        .try_run(|_, _| async { Ok::<_, &str>("written") })
        .await;
    assert!(matches!(ok, Outcome::Ran(Ok("written"))), "{ok:?}");
    let after = a
        .job("retried", TTL)
        .retry_failed()
        .once_per(PERIOD)
        .try_run(|_, _| async { Ok::<_, &str>("again") })
        .await;
    assert!(
        matches!(after, Outcome::Skipped(Skip::AlreadyRan { .. })),
        "{after:?}"
    );
    // A crash mid-run (the guard dropped, nothing succeeded): retried too.
    let crashed = a
        .job("crash", TTL)
        .once_per(PERIOD)
        .retry_failed()
        .acquire()
        .await
        .unwrap()
        .expect("free");
    drop(crashed);
    sleep(ms(10)).await;
    let b = Lease::with_holder(db, "pod-b");
    let rerun = b
        .job("crash", TTL)
        .once_per(PERIOD)
        .retry_failed()
        .run(|_, _| async { "reran" })
        .await;
    assert!(matches!(rerun, Outcome::Ran("reran")), "{rerun:?}");
}

/// A period of zero is refused at once.
#[tokio::test(start_paused = true)]
async fn a_period_of_zero_is_invalid_input() {
    let a = Lease::with_holder(Memory::new(), "pod-a");
    let zero = a
        .job("report", TTL)
        .once_per(Duration::ZERO)
        .acquire()
        .await;
    assert!(
        matches!(
            zero,
            Err(Error::InvalidDuration {
                argument: "once_per",
                ..
            })
        ),
        "{zero:?}"
    );
}
