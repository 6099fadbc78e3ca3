//! `#[singleton]` fns called for real, on a real SQLite file
//! (`SqliteTable`): two pods (`Lease`s with different holders on one file)
//! of which exactly one runs, and a lease stolen with SQL behind the
//! holder's back. The rest of the `#[singleton]` tests need only `Memory`
//! and live in `lease/tests/singleton.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lease_tests::TempDb;
use leasehold::backend::SqliteTable;
use leasehold::{Lease, singleton};
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, timeout};

/// Two pods sharing a fresh SQLite file (deleted when the `TempDb` drops).
async fn sqlite_pods() -> (TempDb, SqliteTable, Lease, Lease) {
    let file = TempDb::new("singleton");
    let table = SqliteTable::open(file.path())
        .await
        .expect("open sqlite file");
    let a = Lease::with_holder(table.clone(), "pod-a");
    let b = Lease::with_holder(table.clone(), "pod-b");
    (file, table, a, b)
}

// ---------------------------------------------------------------------------
// Exactly one of two pods runs.

#[singleton(name = "singleton-one-of-two", ttl = "2s", lease = pod)]
async fn one_of_two(pod: &Lease, runs: &AtomicU32) -> Option<String> {
    runs.fetch_add(1, Ordering::SeqCst);
    // Long enough for the other pod's call to overlap with this one.
    sleep(Duration::from_millis(100)).await;
    Some(pod.holder().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_two_pods_runs() {
    let (_file, _table, a, b) = sqlite_pods().await;
    let mut winners = Vec::new();
    for tick in 0..5 {
        let runs = AtomicU32::new(0);
        let (ran_a, ran_b) = tokio::join!(one_of_two(&a, &runs), one_of_two(&b, &runs));
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "tick {tick}: the body ran once"
        );
        match (ran_a, ran_b) {
            (Some(winner), None) | (None, Some(winner)) => winners.push(winner),
            other => panic!("tick {tick}: exactly one pod must run, got {other:?}"),
        }
    }
    assert!(
        winners.iter().all(|w| w == "pod-a" || w == "pod-b"),
        "{winners:?}"
    );
}

// ---------------------------------------------------------------------------
// The `token` binding is cancelled when the lease is lost.

/// Waits (at most 5 s) for the lease to be lost; returns how long it took.
#[singleton(name = "singleton-token-lost", ttl = "900ms", lease = pod, token = cancel)]
async fn until_lost(pod: &Lease, started: &Notify) -> Option<Duration> {
    started.notify_one();
    let t0 = Instant::now();
    timeout(Duration::from_secs(5), cancel.cancelled())
        .await
        .ok()?;
    Some(t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_cancelled_when_the_lease_is_lost() {
    let (_file, table, a, b) = sqlite_pods().await;
    let started = Notify::new();
    let (lost_after, ()) = tokio::join!(until_lost(&a, &started), async {
        started.notified().await;
        // Someone (an operator, a split brain) hands the lease to pod-b
        // behind pod-a's back.
        let stolen = sqlx::query("UPDATE task_leases SET holder = 'pod-b' WHERE name = ?")
            .bind("singleton-token-lost")
            .execute(table.pool())
            .await
            .expect("steal the lease");
        assert_eq!(stolen.rows_affected(), 1);
    });
    // pod-a notices at its next renewal, ttl/3 = 300 ms after acquiring.
    let lost_after = lost_after.expect("the body saw the token cancelled");
    assert!(lost_after < Duration::from_millis(900), "{lost_after:?}");
    // pod-b holds it now: pod-a's next call is skipped, pod-b's runs.
    assert_eq!(holder_of_token_lost(&a).await, None);
    assert_eq!(holder_of_token_lost(&b).await.as_deref(), Some("pod-b"));
}

#[singleton(name = "singleton-token-lost", ttl = "900ms", lease = pod)]
async fn holder_of_token_lost(pod: &Lease) -> Option<String> {
    Some(pod.holder().to_owned())
}
