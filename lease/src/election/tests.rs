//! Waiting and elections under tokio's paused clock, against `Memory`
//! (which cannot push releases: waiters poll every ttl/10 ± 20%).

use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::backend::Memory;
use crate::{Backend, Error, Leadership, Lease};

const TTL: Duration = Duration::from_secs(3);
/// The longest poll for `TTL`: ttl/10 + 20%.
const POLL_MAX: Duration = Duration::from_millis(360);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn pods() -> (Memory, Lease, Lease) {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "pod-a");
    let b = Lease::with_holder(db.clone(), "pod-b");
    (db, a, b)
}

#[tokio::test(start_paused = true)]
async fn a_waiter_takes_over_within_a_poll_of_the_release() {
    let (_db, a, b) = pods();
    let t0 = Instant::now();
    let held = a.try_acquire("job", TTL).await.unwrap().unwrap();
    tokio::spawn(async move {
        sleep(ms(2000)).await;
        held.release().await.unwrap();
    });
    let guard = b.acquire("job", TTL, ms(10_000)).await.unwrap();
    let took = Instant::now() - t0;
    assert!(guard.is_some());
    assert!(took >= ms(2000) && took <= ms(2000) + POLL_MAX, "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_wait_that_runs_out_answers_held_elsewhere() {
    let (_db, a, b) = pods();
    let _held = a.try_acquire("job", TTL).await.unwrap().unwrap();
    let t0 = Instant::now();
    assert!(b.acquire("job", TTL, ms(1000)).await.unwrap().is_none());
    let took = Instant::now() - t0;
    assert!(took >= ms(1000) && took <= ms(1000) + POLL_MAX, "{took:?}");
    // A zero wait is one attempt.
    let t1 = Instant::now();
    assert!(
        b.acquire("job", TTL, Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(Instant::now(), t1);
}

#[tokio::test(start_paused = true)]
async fn a_crashed_holders_lease_is_taken_about_a_poll_after_it_expires() {
    let (db, _a, b) = pods();
    let t0 = Instant::now();
    // A holder that acquired and then vanished: nothing renews it.
    db.acquire("job", "crashed", TTL).await.unwrap().unwrap();
    let guard = b.acquire("job", TTL, ms(10_000)).await.unwrap().unwrap();
    let took = Instant::now() - t0;
    assert!(took >= TTL && took <= TTL + POLL_MAX, "{took:?}");
    assert_eq!(guard.fencing_token(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn within_one_lease_a_waiter_is_woken_by_the_release_itself() {
    let (_db, a, _b) = pods();
    let held = a.try_acquire("job", TTL).await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move {
            let got = a.acquire("job", TTL, ms(10_000)).await.unwrap();
            (got.is_some(), Instant::now())
        }
    });
    sleep(ms(1234)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let (got, at) = waiter.await.unwrap();
    assert!(got);
    assert_eq!(at, released_at, "no poll: the release wakes the waiter");
}

#[tokio::test(start_paused = true)]
async fn invalid_input_is_answered_at_once_and_a_dropped_wait_leaves_nothing() {
    let (_db, a, b) = pods();
    assert!(matches!(
        a.acquire("", TTL, ms(1000)).await,
        Err(Error::InvalidName { len: 0 })
    ));
    let held = a.try_acquire("job", TTL).await.unwrap().unwrap();
    // b's wait is dropped mid-way...
    let dropped = tokio::time::timeout(ms(500), b.acquire("job", TTL, ms(10_000))).await;
    assert!(dropped.is_err());
    held.release().await.unwrap();
    // ...and left nothing behind in b: b can acquire at once.
    assert!(b.try_acquire("job", TTL).await.unwrap().is_some());
}

/// A backend that fails its first `n` acquisitions, then behaves like Memory.
#[derive(Clone)]
struct Flaky {
    db: Memory,
    failures: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Backend for Flaky {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> crate::Result<Option<crate::Grant>> {
        let left = self.failures.load(std::sync::atomic::Ordering::Relaxed);
        if left > 0 {
            self.failures
                .store(left - 1, std::sync::atomic::Ordering::Relaxed);
            return Err(Error::backend("connection refused"));
        }
        self.db.acquire(name, holder, ttl).await
    }
    async fn renew(&self, lease: crate::Acquisition<'_>, ttl: Duration) -> crate::Result<bool> {
        self.db.renew(lease, ttl).await
    }
    async fn release(&self, lease: crate::Acquisition<'_>) -> crate::Result<()> {
        self.db.release(lease).await
    }
}

#[tokio::test(start_paused = true)]
async fn transient_errors_are_retried_within_the_wait() {
    let flaky = |n: usize| Flaky {
        db: Memory::new(),
        failures: std::sync::Arc::new(n.into()),
    };
    let lease = Lease::with_holder(flaky(3), "pod-a");
    assert!(lease.acquire("job", TTL, ms(5000)).await.unwrap().is_some());
    // Nothing but errors: the last one, when the wait is over.
    let down = Lease::with_holder(flaky(usize::MAX), "pod-a");
    let t0 = Instant::now();
    let err = down.acquire("job", TTL, ms(1000)).await.unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err}");
    assert!(Instant::now() - t0 >= ms(1000));
}

#[tokio::test(start_paused = true)]
async fn an_election_leads_follows_and_hands_over_on_resign() {
    let (_db, a, b) = pods();
    let first = a.elect("scheduler", TTL);
    let term = first.leading().await;
    assert!(first.is_leader() && term.is_valid());
    assert_eq!(
        *first.watch().borrow(),
        Leadership::Leading {
            fencing_token: Some(1)
        }
    );
    let second = b.elect("scheduler", TTL);
    let mut seen = second.watch();
    seen.wait_for(|l| {
        *l == Leadership::Following {
            leader: Some("pod-a".into()),
        }
    })
    .await
    .unwrap();
    assert!(!second.is_leader());
    let resigned_at = Instant::now();
    first.resign().await.unwrap();
    assert!(term.token().is_cancelled() && !term.is_valid());
    let next = second.leading().await;
    let took = Instant::now() - resigned_at;
    assert!(took <= POLL_MAX, "hand-over took {took:?}");
    assert_eq!(next.fencing_token(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_election_releases_in_the_background() {
    let (_db, a, b) = pods();
    let first = a.elect("scheduler", TTL);
    let term = first.leading().await;
    let second = b.elect("scheduler", TTL);
    sleep(ms(100)).await;
    let dropped_at = Instant::now();
    drop(first);
    let next = second.leading().await;
    assert!(term.token().is_cancelled());
    assert!(Instant::now() - dropped_at <= POLL_MAX + ms(10));
    assert!(next.is_valid());
}

#[tokio::test(start_paused = true)]
async fn a_stolen_lease_ends_the_term_and_the_election_contends_again() {
    let (db, a, _b) = pods();
    let election = a.elect("scheduler", TTL);
    let term = election.leading().await;
    // Someone else takes the lease behind our back.
    db.expire("scheduler");
    let thief = db
        .acquire("scheduler", "thief", TTL)
        .await
        .unwrap()
        .unwrap();
    term.token().cancelled().await; // at the next renewal
    assert!(!election.is_leader());
    let mut seen = election.watch();
    seen.wait_for(|l| {
        *l == Leadership::Following {
            leader: Some("thief".into()),
        }
    })
    .await
    .unwrap();
    // The thief lets go: the election leads again, with a newer fence.
    db.release(crate::Acquisition::new(
        "scheduler",
        "thief",
        thief.fencing_token,
    ))
    .await
    .unwrap();
    let again = election.leading().await;
    assert!(again.fencing_token() > thief.fencing_token);
}

#[tokio::test(start_paused = true)]
async fn two_elections_never_lead_at_once() {
    let (db, a, b) = pods();
    let (ea, eb) = (a.elect("scheduler", TTL), b.elect("scheduler", TTL));
    let t0 = Instant::now();
    let mut leaders_seen = 0;
    while Instant::now() - t0 < ms(30_000) {
        let leading = [ea.is_leader(), eb.is_leader()];
        assert!(
            !(leading[0] && leading[1]),
            "two leaders at {:?}",
            Instant::now() - t0
        );
        if leading.iter().any(|l| *l) {
            leaders_seen += 1;
        }
        // Every so often the store loses the lease (as in a failover).
        if (Instant::now() - t0).as_millis() % 5_000 < 50 {
            db.expire("scheduler");
        }
        sleep(ms(50)).await;
    }
    assert!(leaders_seen > 0);
}

#[tokio::test]
async fn without_a_runtime_an_election_stops_with_an_error() {
    let lease = Lease::with_holder(Memory::new(), "pod-a");
    let election = std::thread::spawn(move || lease.elect("scheduler", TTL))
        .join()
        .unwrap();
    assert!(matches!(election.resign().await, Err(Error::NoRuntime)));
}
