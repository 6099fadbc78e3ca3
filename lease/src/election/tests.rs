//! Waiting and elections under tokio's paused clock, against `Memory`
//! (which cannot push releases: waiters poll every ttl/10 ± 20%).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::{Instant, sleep};

use crate::backend::Memory;
use crate::test_util::{capture_logs, ms, pods};
use crate::{Backend, Election, Error, Leadership, Lease};

const TTL: Duration = Duration::from_secs(3);
/// The longest poll for `TTL`: ttl/10 + 20%.
const POLL_MAX: Duration = Duration::from_millis(360);

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

/// A crashed holder's lease is taken at its expiry (the
/// refused attempt says when), not a poll later.
#[tokio::test(start_paused = true)]
async fn a_crashed_holders_lease_is_taken_at_its_expiry() {
    let (db, _a, b) = pods();
    let t0 = Instant::now();
    // A holder that acquired and then vanished: nothing renews it.
    db.acquire("job", "crashed", TTL).await.unwrap().unwrap();
    sleep(ms(1234)).await;
    let guard = b.acquire("job", TTL, ms(10_000)).await.unwrap().unwrap();
    let took = Instant::now() - t0;
    // The expiry plus a jitter of at most 5 ms (a poll would be 240-360 ms).
    assert!(took >= TTL && took <= TTL + ms(5), "{took:?}");
    assert_eq!(guard.fencing_token(), Some(2));
}

/// A follower of a crashed leader leads at the leader's expiry too.
#[tokio::test(start_paused = true)]
async fn a_follower_of_a_crashed_leader_leads_at_its_expiry() {
    let (db, _a, b) = pods();
    let t0 = Instant::now();
    db.acquire("scheduler", "crashed", TTL)
        .await
        .unwrap()
        .unwrap();
    sleep(ms(1234)).await;
    let election = b.elect("scheduler", TTL);
    election.leading().await;
    let took = Instant::now() - t0;
    assert!(took >= TTL && took <= TTL + ms(5), "{took:?}");
}

/// The value `db` holds with the lease `name`, which must be held.
async fn value_of(db: &Memory, name: &str) -> Option<String> {
    db.inspect(name).await.unwrap().expect("held").value
}

/// A leader's proclaimed value reaches its followers (and observers), and
/// a new value replaces it at once; it ends with the term.
#[tokio::test(start_paused = true)]
async fn a_proclaimed_value_reaches_followers_and_ends_with_the_term() {
    let (db, a, b) = pods();
    let first = a.elect("scheduler", TTL);
    first.proclaim("10.0.0.7:8080").unwrap();
    let term = first.leading().await;
    assert_eq!(
        value_of(&db, "scheduler").await.as_deref(),
        Some("10.0.0.7:8080"),
        "written with the acquisition"
    );
    let second = b.elect("scheduler", TTL);
    let mut seen = second.watch();
    seen.wait_for(|l| {
        *l == Leadership::Following {
            leader: Some("a".into()),
            value: Some("10.0.0.7:8080".into()),
        }
    })
    .await
    .unwrap();
    first.proclaim("10.0.0.8:8080").unwrap();
    sleep(ms(1)).await;
    assert_eq!(
        value_of(&db, "scheduler").await.as_deref(),
        Some("10.0.0.8:8080"),
        "published at once while leading"
    );
    // Too long: refused, nothing changes.
    assert!(matches!(
        first.proclaim("x".repeat(4097)),
        Err(Error::InvalidValue { len: 4097 })
    ));
    drop(term);
    first.resign().await.unwrap();
    let led = second.leading().await;
    drop(led);
    let info = db.inspect("scheduler").await.unwrap().unwrap();
    assert_eq!((info.holder.as_str(), info.value), ("b", None));
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
            leader: Some("a".into()),
            value: None,
        }
    })
    .await
    .unwrap();
    assert!(!second.is_leader());
    // The leader's work has stopped: it keeps only the token.
    let token = term.token();
    drop(term);
    let resigned_at = Instant::now();
    first.resign().await.unwrap();
    assert!(token.is_cancelled());
    let next = second.leading().await;
    let took = Instant::now() - resigned_at;
    assert!(took <= POLL_MAX, "hand-over took {took:?}");
    assert_eq!(next.fencing_token(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_election_releases_in_the_background() {
    let (_db, a, b) = pods();
    let first = a.elect("scheduler", TTL);
    let token = first.leading().await.token();
    let second = b.elect("scheduler", TTL);
    sleep(ms(100)).await;
    let dropped_at = Instant::now();
    drop(first);
    let next = second.leading().await;
    assert!(token.is_cancelled());
    assert!(Instant::now() - dropped_at <= POLL_MAX + ms(10));
    assert!(next.is_valid());
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
    let lease = Lease::with_holder(Memory::new(), "a");
    let election = std::thread::spawn(move || lease.elect("scheduler", TTL))
        .join()
        .unwrap();
    assert!(matches!(
        &*election.watch().borrow(),
        Leadership::Stopped { error } if error.contains("runtime")
    ));
    assert!(matches!(election.resign().await, Err(Error::NoRuntime)));
}

/// What a [`Rigged`] call does instead of asking its `Memory`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Ask the `Memory`.
    None,
    /// Never answer (a request stuck on a dead connection).
    Hang,
    /// Fail (a server that refuses connections).
    Fail,
    /// Fail this many times more, then ask the `Memory`.
    FailTimes(usize),
}

/// `Memory`, with faults injected into `acquire` and `inspect` on request.
#[derive(Clone)]
struct Rigged {
    db: Memory,
    acquire: std::sync::Arc<Mutex<Fault>>,
    inspect: std::sync::Arc<Mutex<Fault>>,
}

impl Rigged {
    fn new(db: Memory) -> Self {
        Rigged {
            db,
            acquire: std::sync::Arc::new(Fault::None.into()),
            inspect: std::sync::Arc::new(Fault::None.into()),
        }
    }

    fn set_acquire(&self, fault: Fault) {
        *self.acquire.lock().unwrap() = fault;
    }

    fn set_inspect(&self, fault: Fault) {
        *self.inspect.lock().unwrap() = fault;
    }
}

/// What the fault in `slot` makes of a call: `None` to go on and ask the
/// `Memory`. A `FailTimes` counts down.
async fn inject(slot: &Mutex<Fault>) -> Option<Error> {
    let fault = {
        let mut slot = slot.lock().unwrap();
        let fault = *slot;
        if let Fault::FailTimes(n) = fault {
            *slot = Fault::FailTimes(n.saturating_sub(1));
        }
        fault
    };
    match fault {
        Fault::None | Fault::FailTimes(0) => None,
        Fault::Hang => std::future::pending().await,
        Fault::Fail | Fault::FailTimes(_) => Some(Error::backend("connection refused")),
    }
}

impl Backend for Rigged {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> crate::Result<Option<crate::Grant>> {
        match inject(&self.acquire).await {
            Some(e) => Err(e),
            None => self.db.acquire(name, holder, ttl).await,
        }
    }
    async fn renew(&self, lease: crate::Acquisition<'_>, ttl: Duration) -> crate::Result<bool> {
        self.db.renew(lease, ttl).await
    }
    async fn release(&self, lease: crate::Acquisition<'_>) -> crate::Result<()> {
        self.db.release(lease).await
    }
    async fn inspect(&self, name: &str) -> crate::Result<Option<crate::LeaseInfo>> {
        match inject(&self.inspect).await {
            Some(e) => Err(e),
            None => self.db.inspect(name).await,
        }
    }
}

/// "a" leads "scheduler" on a `Memory`; "b", through that `Memory` with
/// the faults `acquire` and `inspect`, contends for 100 ms (asked,
/// refused, and now asking who leads, or waiting).
async fn a_leads_b_contends(acquire: Fault, inspect: Fault) -> (Election, Election) {
    let db = Memory::new();
    let rigged = Rigged::new(db.clone());
    rigged.set_acquire(acquire);
    rigged.set_inspect(inspect);
    let first = Lease::with_holder(db, "a").elect("scheduler", TTL);
    first.leading().await;
    let second = Lease::with_holder(rigged, "b").elect("scheduler", TTL);
    sleep(ms(100)).await;
    (first, second)
}

#[tokio::test(start_paused = true)]
async fn a_follower_whose_inspect_hangs_takes_over_when_the_leader_resigns() {
    let (first, second) = a_leads_b_contends(Fault::None, Fault::Hang).await;
    let resigned_at = Instant::now();
    first.resign().await.unwrap();
    let led = tokio::time::timeout(ms(5000), second.leading()).await;
    assert!(
        led.is_ok(),
        "the follower did not lead within 5 s of the leader's resign: {:?}",
        *second.watch().borrow()
    );
    let took = Instant::now() - resigned_at;
    assert!(took <= POLL_MAX, "hand-over took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_follower_whose_inspect_hangs_reads_as_following_someone_unnamed() {
    let (_first, second) = a_leads_b_contends(Fault::None, Fault::Hang).await;
    let mut seen = second.watch();
    let following = tokio::time::timeout(
        POLL_MAX,
        seen.wait_for(|l| {
            *l == Leadership::Following {
                leader: None,
                value: None,
            }
        }),
    )
    .await;
    assert!(
        matches!(following, Ok(Ok(_))),
        "{:?}",
        *second.watch().borrow()
    );
}

/// A contender whose `inspect` (a follower) or `acquire` (a candidate)
/// hangs resigns at once.
#[tokio::test(start_paused = true)]
async fn a_contender_whose_call_hangs_resigns_at_once() {
    for (acquire, inspect) in [(Fault::None, Fault::Hang), (Fault::Hang, Fault::None)] {
        let (_first, second) = a_leads_b_contends(acquire, inspect).await;
        let resigned = tokio::time::timeout(ms(10), second.resign()).await;
        assert!(
            resigned.is_ok(),
            "resign() did not return while a call hung: acquire {acquire:?}, inspect {inspect:?}"
        );
        assert!(resigned.unwrap().is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn transient_errors_are_retried_within_the_wait() {
    let flaky = Rigged::new(Memory::new());
    flaky.set_acquire(Fault::FailTimes(3));
    let lease = Lease::with_holder(flaky, "a");
    assert!(lease.acquire("job", TTL, ms(5000)).await.unwrap().is_some());
    // Nothing but errors: the last one, when the wait is over.
    let down = Rigged::new(Memory::new());
    down.set_acquire(Fault::Fail);
    let down = Lease::with_holder(down, "a");
    let t0 = Instant::now();
    let err = down.acquire("job", TTL, ms(1000)).await.unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err}");
    assert!(Instant::now() - t0 >= ms(1000));
}

/// The state of `election`, `Stopped` or `Failing`, and its error; after
/// `context`, it must not read as `Contending` (nor `Leading`, `Following`).
fn error_after(election: &Election, context: &str) -> (Leadership, String) {
    let state = election.watch().borrow().clone();
    match &state {
        Leadership::Stopped { error } | Leadership::Failing { error } => {
            let error = error.clone();
            (state, error)
        }
        _ => panic!("{context}, and the election reads as {state:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_invalid_ttl_is_seen_at_once() {
    let (_db, a, _b) = pods();
    let election = a.elect("scheduler", ms(1));
    let (state, error) = error_after(&election, "the ttl is 1 ms");
    assert!(
        matches!(state, Leadership::Stopped { .. }) && error.contains("invalid ttl"),
        "{state:?}"
    );
    assert!(matches!(
        election.resign().await,
        Err(Error::InvalidTtl { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_backend_failing_while_contending_is_seen_and_warned_once() {
    let (logs, _guard) = capture_logs();
    let rigged = Rigged::new(Memory::new());
    rigged.set_acquire(Fault::Fail);
    let election = Lease::with_holder(rigged.clone(), "a").elect("scheduler", TTL);
    // About 30 attempts, a poll apart.
    sleep(ms(10_000)).await;
    let logs = logs.text();
    let warnings: Vec<&str> = logs.lines().filter(|l| l.contains(" WARN ")).collect();
    assert_eq!(warnings.len(), 1, "{logs}");
    assert!(warnings[0].contains("connection refused"), "{logs}");
    let (state, error) = error_after(&election, "the backend has failed for 10 s");
    assert!(
        matches!(state, Leadership::Failing { .. }) && error.contains("connection refused"),
        "{state:?}"
    );
    // The backend is back: the election leads.
    rigged.set_acquire(Fault::None);
    let led = tokio::time::timeout(POLL_MAX, election.leading()).await;
    assert!(led.is_ok(), "{:?}", *election.watch().borrow());
}

#[tokio::test(start_paused = true)]
async fn an_election_of_a_shut_down_lease_reads_as_stopped() {
    let (_db, a, _b) = pods();
    let election = a.elect("scheduler", TTL);
    election.leading().await;
    a.shutdown().await;
    let mut seen = election.watch();
    let stopped = tokio::time::timeout(
        ms(10_000),
        seen.wait_for(|l| matches!(l, Leadership::Stopped { .. })),
    )
    .await;
    // (An error: the election's task ended without saying so.)
    assert!(
        matches!(stopped, Ok(Ok(_))),
        "{:?}",
        *election.watch().borrow()
    );
    assert!(matches!(election.resign().await, Err(Error::ShutDown)));
}

/// An election of "scheduler" through `lease`, once it follows.
async fn a_follower(lease: &Lease) -> Election {
    let election = lease.elect("scheduler", TTL);
    let mut seen = election.watch();
    seen.wait_for(|l| matches!(l, Leadership::Following { .. }))
        .await
        .unwrap();
    election
}

/// §6.1: a `Term` is the leader's body. A worker that still holds a clone
/// of it after its token fired is still acting as leader; the lease passes
/// on only once every clone is dropped.
#[tokio::test(start_paused = true)]
async fn resign_hands_over_only_after_every_term_is_dropped() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_db, a, b) = pods();
    let first = a.elect("scheduler", TTL);
    let term = first.leading().await;
    let worker_done = Arc::new(AtomicBool::new(false));
    let worker = tokio::spawn({
        let (term, done) = (term.clone(), worker_done.clone());
        async move {
            term.token().cancelled().await;
            sleep(ms(400)).await; // its last write
            done.store(true, Ordering::SeqCst);
            drop(term);
        }
    });
    drop(term);
    let second = a_follower(&b).await;
    let resigned_at = Instant::now();
    let resign = tokio::spawn(first.resign());
    let next = second.leading().await;
    assert!(
        worker_done.load(Ordering::SeqCst),
        "the next leader was granted {:?} after the resign, while the old leader's worker still held its Term",
        Instant::now() - resigned_at
    );
    assert!(next.is_valid());
    // Once the worker let go, the hand-over is prompt (a release, not an expiry).
    assert!(Instant::now() - resigned_at <= ms(400) + POLL_MAX);
    resign.await.unwrap().unwrap();
    worker.await.unwrap();
}

/// A worker that never lets go of its `Term`: `resign` returns after the
/// grace, and the lease is left to expire on the server, never released
/// under the running worker.
#[tokio::test(start_paused = true)]
async fn resign_leaves_the_lease_of_a_term_kept_past_its_grace_to_expire() {
    let (db, a, b) = pods();
    let first = a.elect("scheduler", TTL);
    let kept = first.leading().await;
    let second = a_follower(&b).await;
    let resigned_at = Instant::now();
    first.resign().await.unwrap();
    let returned = Instant::now() - resigned_at;
    assert!(
        returned >= TTL / 3 && returned <= TTL / 3 + ms(50),
        "resign returned after {returned:?}, not at the grace"
    );
    assert!(kept.token().is_cancelled() && !kept.is_valid());
    let next = second.leading().await;
    let took = Instant::now() - resigned_at;
    // Renewed up to the grace, then left: it expires a ttl after the last
    // renewal was sent, not before.
    assert!(
        took >= TTL,
        "the lease passed on after {took:?}, before it expired"
    );
    assert!(took <= TTL / 3 + TTL + POLL_MAX, "{took:?}");
    assert!(next.fencing_token() > kept.fencing_token());
    // When the worker finally lets go, nothing of the old term touches the new one.
    drop(kept);
    sleep(ms(100)).await;
    let info = db.inspect("scheduler").await.unwrap().unwrap();
    assert_eq!(info.holder, "b");
    assert!(second.is_leader());
}
