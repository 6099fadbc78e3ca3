//! Engine timing, under tokio's paused clock, against `Memory` and a scripted backend.
//!
//! With ttl = 3 s: renewals every 1 s, default grace = ttl/3 = 1 s, so a
//! lease acquired (request sent) at `t0` has its first deadline (when the
//! token fires if no renewal succeeds) at `t0 + 2 s`. With the least grace,
//! the margin = 3 s/100 + 2 ms = 32 ms, it is at `t0 + 2.968 s`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use crate::backend::Memory;
use crate::{Acquisition, Backend, Error, Grant, Lease, Outcome, Skip};

const TTL: Duration = Duration::from_secs(3);
const PERIOD: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(32);
/// The default grace for [`TTL`]: ttl/3.
const GRACE: Duration = Duration::from_secs(1);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What a scripted renewal does.
#[derive(Debug, Clone)]
enum Step {
    Answer(bool),
    Fail,
    Hang,
    /// Answer after a delay.
    Slow(Duration, bool),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Acquire(String),
    Renew(String),
    RenewMany(Vec<String>),
    Release(String),
}

#[derive(Debug, Default)]
struct Script {
    renews: VecDeque<Step>,
    /// What renewals do once `renews` is used up.
    then: Option<Step>,
    calls: Vec<(Instant, Call)>,
    fence: u64,
    /// What releases do (default: answer at once).
    release: Option<Step>,
    /// What acquisitions do before granting (default: grant at once;
    /// `false` answers "held elsewhere").
    acquire: Option<Step>,
    /// The fencing token of every lease renewed or released, in order.
    fences: Vec<Option<u64>>,
    /// With [`Scripted::hinted`]: every acquisition's [`Backend::lost`]
    /// hint resolves when this is notified ([`Scripted::hint`]).
    hint: Option<Arc<tokio::sync::Notify>>,
}

/// A backend whose acquisitions always succeed and whose renewals follow a script.
#[derive(Debug, Clone, Default)]
struct Scripted(Arc<Mutex<Script>>);

impl Scripted {
    fn new(renews: impl IntoIterator<Item = Step>, then: Step) -> Self {
        let s = Scripted::default();
        {
            let mut script = s.0.lock().unwrap();
            script.renews = renews.into_iter().collect();
            script.then = Some(then);
        }
        s
    }

    fn calls(&self) -> Vec<(Instant, Call)> {
        self.0.lock().unwrap().calls.clone()
    }

    /// Times of the calls matching `f`, relative to `t0`.
    fn times(&self, t0: Instant, f: impl Fn(&Call) -> bool) -> Vec<Duration> {
        self.calls()
            .into_iter()
            .filter(|(_, c)| f(c))
            .map(|(t, _)| t - t0)
            .collect()
    }

    fn record(&self, call: Call) {
        self.0.lock().unwrap().calls.push((Instant::now(), call));
    }

    fn next_step(&self) -> Step {
        let mut s = self.0.lock().unwrap();
        let then = s.then.clone().unwrap_or(Step::Answer(true));
        s.renews.pop_front().unwrap_or(then)
    }
}

async fn run(step: Step) -> Result<bool, Error> {
    match step {
        Step::Answer(ok) => Ok(ok),
        Step::Fail => Err(Error::backend("scripted failure")),
        Step::Hang => std::future::pending().await,
        Step::Slow(d, ok) => {
            sleep(d).await;
            Ok(ok)
        }
    }
}

impl Backend for Scripted {
    async fn acquire(
        &self,
        name: &str,
        _holder: &str,
        _ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        self.record(Call::Acquire(name.into()));
        let step = self.0.lock().unwrap().acquire.clone();
        if let Some(step) = step
            && !run(step).await?
        {
            return Ok(None);
        }
        let mut s = self.0.lock().unwrap();
        s.fence += 1;
        Ok(Some(Grant::new(Some(s.fence))))
    }

    async fn renew(&self, lease: Acquisition<'_>, _ttl: Duration) -> Result<bool, Error> {
        self.record(Call::Renew(lease.name.into()));
        self.0.lock().unwrap().fences.push(lease.fencing_token);
        let step = self.next_step();
        run(step).await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.record(Call::Release(lease.name.into()));
        self.0.lock().unwrap().fences.push(lease.fencing_token);
        let step = self.0.lock().unwrap().release.clone();
        match step {
            None => Ok(()),
            Some(step) => run(step).await.map(drop),
        }
    }

    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        self.record(Call::RenewMany(
            leases.iter().map(|(l, _)| l.name.to_string()).collect(),
        ));
        let fences = leases.iter().map(|(l, _)| l.fencing_token);
        self.0.lock().unwrap().fences.extend(fences);
        let step = self.next_step();
        let ok = run(step).await?;
        Ok(vec![ok; leases.len()])
    }

    fn lost(&self, _lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        let fire = self.0.lock().unwrap().hint.clone()?;
        Some(async move { fire.notified().await })
    }
}

/// Wait for the token and return when it fired, relative to `t0`.
async fn cancelled_after(guard: &crate::LeaseGuard, t0: Instant) -> Duration {
    guard.token().cancelled().await;
    Instant::now() - t0
}

fn is_renew(c: &Call) -> bool {
    matches!(c, Call::Renew(_) | Call::RenewMany(_))
}

#[tokio::test(start_paused = true)]
async fn renewals_and_the_release_carry_the_grants_fencing_token() {
    let backend = Scripted::new([], Step::Answer(true));
    backend.0.lock().unwrap().fence = 41;
    let lease = Lease::with_holder(backend.clone(), "a");
    let one = lease.try_acquire("one", TTL).await.unwrap().unwrap();
    let two = lease.try_acquire("two", TTL).await.unwrap().unwrap();
    assert_eq!(
        (one.fencing_token(), two.fencing_token()),
        (Some(42), Some(43))
    );
    sleep(PERIOD * 2 + ms(10)).await;
    two.release().await.unwrap();
    sleep(PERIOD).await;
    one.release().await.unwrap();
    let calls: Vec<Call> = backend.calls().into_iter().map(|(_, c)| c).collect();
    let fences = backend.0.lock().unwrap().fences.clone();
    // Each lease's renewals and release carry its own grant's token.
    let mut expected = Vec::new();
    for call in &calls {
        match call {
            Call::Acquire(_) => {}
            Call::Renew(n) | Call::Release(n) => expected.push(fence_of(n)),
            Call::RenewMany(names) => expected.extend(names.iter().map(|n| fence_of(n))),
        }
    }
    assert!(expected.len() >= 4, "{calls:?}");
    assert_eq!(fences, expected, "{calls:?}");
}

fn fence_of(name: &str) -> Option<u64> {
    match name {
        "one" => Some(42),
        "two" => Some(43),
        other => panic!("unexpected lease {other}"),
    }
}

#[tokio::test(start_paused = true)]
async fn renews_every_third_of_the_ttl() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(ms(10_500)).await;
    assert!(guard.is_valid());
    assert!(!guard.token().is_cancelled());
    let expected: Vec<Duration> = (1..=10).map(|i| PERIOD * i).collect();
    assert_eq!(backend.times(t0, is_renew), expected);
}

#[tokio::test(start_paused = true)]
async fn memory_lease_survives_many_ttls_and_blocks_others() {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
    let guard = a.try_acquire("job", TTL).await.unwrap().unwrap();
    for _ in 0..10 {
        sleep(TTL).await;
        assert!(b.try_acquire("job", TTL).await.unwrap().is_none());
    }
    assert!(guard.is_valid());
    assert_eq!(db.holder("job").as_deref(), Some("a"));
    guard.release().await.unwrap();
    assert_eq!(db.holder("job"), None);
    let guard = b.try_acquire("job", TTL).await.unwrap().unwrap();
    assert_eq!(guard.fencing_token(), Some(2));
}

#[tokio::test(start_paused = true)]
async fn definite_loss_cancels_at_once() {
    let backend = Scripted::new(
        [Step::Answer(true), Step::Answer(false)],
        Step::Answer(true),
    );
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    assert_eq!(cancelled_after(&guard, t0).await, 2 * PERIOD);
    assert!(!guard.is_valid());
    // No more renewals after the loss.
    sleep(TTL * 3).await;
    assert_eq!(backend.times(t0, is_renew), vec![PERIOD, 2 * PERIOD]);
}

#[tokio::test(start_paused = true)]
async fn memory_loss_behind_our_back_cancels_at_next_renewal() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(ms(1_500)).await;
    db.expire("job");
    assert_eq!(cancelled_after(&guard, t0).await, 2 * PERIOD);
}

#[tokio::test(start_paused = true)]
async fn errors_are_retried_and_cancel_exactly_at_the_deadline() {
    let backend = Scripted::new([], Step::Fail);
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();

    // Not before the deadline (ttl - grace)...
    sleep_until(t0 + TTL - GRACE - ms(1)).await;
    assert!(guard.is_valid());
    assert!(!guard.token().is_cancelled());
    // ...but exactly at it.
    assert_eq!(cancelled_after(&guard, t0).await, TTL - GRACE);
    assert!(!guard.is_valid());

    // Retried with a short backoff (ttl/30 = 100 ms, doubling) over one
    // renewal period, between the first renewal at 1 s and the deadline.
    let renews = backend.times(t0, is_renew);
    assert_eq!(renews, vec![ms(1_000), ms(1_100), ms(1_300), ms(1_700)]);
}

/// An explicit grace moves the deadline: at the least grace (the margin,
/// the timing before issue 28) the token fires at `ttl - margin`, and the
/// retries go on until then.
#[tokio::test(start_paused = true)]
async fn an_explicit_grace_sets_when_failing_renewals_fire_the_token() {
    let backend = Scripted::new([], Step::Fail);
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let least = lease
        .job("least", TTL)
        .grace(MARGIN)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    let half_s = lease
        .job("half-s", TTL)
        .grace(ms(500))
        .acquire()
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cancelled_after(&half_s, t0).await, TTL - ms(500));
    assert!(least.is_valid());
    sleep_until(t0 + TTL - MARGIN - ms(1)).await;
    assert!(least.is_valid());
    assert_eq!(cancelled_after(&least, t0).await, TTL - MARGIN);
    let least_renewed = backend.times(t0, |c| match c {
        Call::Renew(n) => n == "least",
        Call::RenewMany(names) => names.iter().any(|n| n == "least"),
        _ => false,
    });
    assert_eq!(
        least_renewed,
        [
            ms(1_000),
            ms(1_100),
            ms(1_300),
            ms(1_700),
            ms(2_200),
            ms(2_700)
        ]
    );
}

/// A grace outside `margin..=ttl/2` is refused before the backend is asked.
#[tokio::test(start_paused = true)]
async fn a_grace_out_of_range_is_refused() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    for grace in [MARGIN - ms(1), TTL / 2 + ms(1)] {
        let got = lease.job("job", TTL).grace(grace).acquire().await;
        assert!(
            matches!(got, Err(Error::InvalidGrace { grace: g, ttl }) if g == grace && ttl == TTL),
            "{got:?}"
        );
        let ran = lease
            .job("job", TTL)
            .grace(grace)
            .run(|_, _| async {})
            .await;
        assert!(matches!(
            ran,
            Outcome::Skipped(Skip::Error(Error::InvalidGrace { .. }))
        ));
    }
    assert!(backend.calls().is_empty(), "{:?}", backend.calls());
    let at_the_bounds = [MARGIN, TTL / 2];
    for grace in at_the_bounds {
        let guard = lease.job("job", TTL).grace(grace).acquire().await;
        guard.unwrap().unwrap().release().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_success_after_errors_keeps_the_lease() {
    let backend = Scripted::new(
        [Step::Fail, Step::Fail, Step::Answer(true)],
        Step::Answer(true),
    );
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(TTL * 4).await;
    assert!(guard.is_valid());
    // Failures at 1.0 and 1.1, success at 1.3, then every period from there.
    let renews = backend.times(t0, is_renew);
    assert_eq!(
        &renews[..5],
        &[ms(1_000), ms(1_100), ms(1_300), ms(2_300), ms(3_300)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_does_not_delay_the_cancellation() {
    let backend = Scripted::new([], Step::Hang);
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    assert_eq!(cancelled_after(&guard, t0).await, TTL - GRACE);
    // The first attempt was cut off after ttl/3, which is the deadline.
    let renews = backend.times(t0, is_renew);
    assert_eq!(renews, vec![ms(1_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_answering_after_the_deadline_does_not_revive_the_lease() {
    // Answers true, but only after 1.9 s, past the 1 s attempt timeout: the
    // engine must not wait for it, and the lease stays lost afterwards.
    let backend = Scripted::new([], Step::Slow(ms(1_900), true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    assert_eq!(cancelled_after(&guard, t0).await, TTL - GRACE);
    sleep(TTL).await;
    assert!(!guard.is_valid());
    assert!(guard.token().is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_when_the_renewal_was_sent_not_answered() {
    // The renewal sent at 1 s answers at 1.9 s; the next one hangs. The
    // deadline is 1 s + 2 s, not 1.9 s + 2 s.
    let backend = Scripted::new([Step::Slow(ms(900), true)], Step::Hang);
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    assert_eq!(cancelled_after(&guard, t0).await, PERIOD + TTL - GRACE);
    // The next renewal was due one period after the successful one was sent.
    assert_eq!(backend.times(t0, is_renew)[..2], [ms(1_000), ms(2_000)]);
}

#[tokio::test(start_paused = true)]
async fn with_lease_releases_after_f_returns() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
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
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
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
    let other = Lease::with_holder(db.clone(), "b");
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
async fn another_holder_is_skipped() {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
    let _held = a.try_acquire("job", TTL).await.unwrap().unwrap();
    let out = b
        .with_lease("job", TTL, |_| async { unreachable!("must not run") })
        .await;
    assert!(matches!(out, Outcome::Skipped(Skip::HeldElsewhere)));
    assert_eq!(out_into_none(out), None);

    fn out_into_none(out: Outcome<()>) -> Option<()> {
        out.into_result().unwrap()
    }
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_releases_in_the_background() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    let token = guard.token();
    drop(guard);
    assert!(token.is_cancelled());
    sleep(ms(1)).await;
    assert_eq!(db.holder("job"), None);
}

#[tokio::test(start_paused = true)]
async fn release_cancels_the_token_and_stops_renewing() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
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

/// A backend whose acquisitions never answer.
#[derive(Clone)]
struct HangingAcquire;

impl Backend for HangingAcquire {
    async fn acquire(&self, _: &str, _: &str, _: Duration) -> Result<Option<Grant>, Error> {
        std::future::pending().await
    }
    async fn renew(&self, _: Acquisition<'_>, _: Duration) -> Result<bool, Error> {
        Ok(true)
    }
    async fn release(&self, _: Acquisition<'_>) -> Result<(), Error> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_hanging_acquire_times_out() {
    let lease = Lease::with_holder(HangingAcquire, "a");
    let t0 = Instant::now();
    let err = lease.try_acquire("job", TTL).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "acquire",
                ..
            }
        ),
        "{err}"
    );
    // A grant after `ttl - grace` would be past its deadline: not waited for.
    assert_eq!(Instant::now() - t0, TTL - GRACE);
    // The name is free for the next attempt.
    assert!(matches!(
        lease.try_acquire("job", TTL).await,
        Err(Error::Timeout { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn leases_falling_due_together_are_renewed_in_one_batch() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let a = lease.try_acquire("a", TTL).await.unwrap().unwrap();
    sleep(ms(400)).await; // within half a period of `a`
    let b = lease.try_acquire("b", TTL).await.unwrap().unwrap();
    sleep(ms(2_700)).await;
    let renews: Vec<(Duration, Call)> = backend
        .calls()
        .into_iter()
        .filter(|(_, c)| is_renew(c))
        .map(|(t, c)| (t - t0, c))
        .collect();
    let both = Call::RenewMany(vec!["a".into(), "b".into()]);
    let both_rev = Call::RenewMany(vec!["b".into(), "a".into()]);
    assert_eq!(renews.len(), 3, "{renews:?}");
    for (i, (at, call)) in renews.iter().enumerate() {
        assert_eq!(*at, PERIOD * (i as u32 + 1));
        assert!(*call == both || *call == both_rev, "{call:?}");
    }
    assert!(a.is_valid() && b.is_valid());
}

#[test]
fn a_runtime_shutting_down_cancels_the_tokens_it_renewed() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let lease = Lease::with_holder(Memory::new(), "a");
    let guard = rt.block_on(lease.try_acquire("job", TTL)).unwrap().unwrap();
    assert!(!guard.token().is_cancelled());
    drop(rt);
    assert!(
        guard.token().is_cancelled(),
        "nothing renews the lease any more"
    );
    assert!(!guard.is_valid());
    // A new runtime can acquire through the same Lease once the guard is gone.
    drop(guard);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let guard = rt.block_on(lease.try_acquire("job", TTL)).unwrap().unwrap();
    rt.block_on(async {
        sleep(TTL * 2).await;
        assert!(guard.is_valid(), "a fresh scheduler renews it");
    });
}

#[test]
fn a_release_timed_by_a_scheduler_whose_runtime_shuts_down_ends_at_once() {
    // The scheduler runs on runtime `a`; the release waits on runtime `b`,
    // its time limit kept by that scheduler. When `a` shuts down, the
    // release must end (as timed out) rather than wait forever.
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Hang);
    let lease = Lease::with_holder(backend, "a");
    let a = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let guard = a.block_on(lease.try_acquire("job", TTL)).unwrap().unwrap();
    let b = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let shutdown = std::thread::spawn(move || {
        std::thread::sleep(ms(100));
        drop(a);
    });
    let t0 = std::time::Instant::now();
    let err = b.block_on(guard.release()).unwrap_err();
    shutdown.join().unwrap();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    // Generous: the release's own limit would be the ttl, 3 s.
    assert!(t0.elapsed() < ms(2500), "{:?}", t0.elapsed());
}

#[test]
fn outside_a_runtime_acquire_is_an_error() {
    let lease = Lease::with_holder(Memory::new(), "a");
    let err = futures_util::FutureExt::now_or_never(lease.try_acquire("job", TTL))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::NoRuntime));
}

#[tokio::test(start_paused = true)]
async fn a_large_batch_is_split_into_calls_of_at_most_max_batch() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let mut guards = Vec::new();
    for i in 0..2500 {
        let name = format!("n{i}");
        guards.push(lease.try_acquire(&name, TTL).await.unwrap().unwrap());
    }
    sleep(PERIOD + ms(10)).await;
    let mut sizes = Vec::new();
    let mut renewed = std::collections::HashSet::new();
    for (at, call) in backend.calls() {
        match call {
            Call::RenewMany(names) => {
                assert_eq!(at - t0, PERIOD, "all due together, sent together");
                sizes.push(names.len());
                for name in names {
                    assert!(renewed.insert(name), "a lease renewed twice");
                }
            }
            Call::Renew(name) => panic!("{name} renewed on its own"),
            _ => {}
        }
    }
    sizes.sort_unstable();
    assert_eq!(sizes, [500, super::MAX_BATCH, super::MAX_BATCH]);
    assert_eq!(renewed.len(), 2500);
    assert!(guards.iter().all(|g| g.is_valid()));
}

impl Scripted {
    fn releases(self, step: Step) -> Self {
        self.0.lock().unwrap().release = Some(step);
        self
    }

    fn acquires(self, step: Step) -> Self {
        self.0.lock().unwrap().acquire = Some(step);
        self
    }

    /// Hint losses ([`Backend::lost`]) when told to ([`Scripted::hint`]).
    fn hinted(self) -> Self {
        self.0.lock().unwrap().hint = Some(Arc::default());
        self
    }

    /// Resolve the loss hints of the acquisitions so far.
    fn hint(&self) {
        if let Some(fire) = &self.0.lock().unwrap().hint {
            fire.notify_waiters();
        }
    }
}

#[tokio::test(start_paused = true)]
async fn after_a_failed_release_the_name_stays_taken_for_a_ttl() {
    // The failed release may still reach the backend later; had this Lease
    // taken the name again meanwhile, it would end the new lease behind its
    // back. So the name stays taken until the old lease has ended anyway.
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Fail);
    let lease = Lease::with_holder(backend.clone(), "a");
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    let t_release = Instant::now();
    assert!(guard.release().await.is_err());
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_none());
    sleep_until(t_release + TTL - ms(1)).await;
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_none());
    sleep_until(t_release + TTL).await;
    tokio::task::yield_now().await;
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_release_frees_the_name_at_once() {
    let backend = Scripted::new([], Step::Answer(true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    guard.release().await.unwrap();
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_release_is_sent_again_and_keeps_the_name_for_a_ttl() {
    // The first release is cut off in flight; it is sent again in the
    // background. Even though the second one succeeds, the first may still
    // land, so the name stays taken until a ttl after it was sent.
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Slow(ms(50), true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    let t_release = Instant::now();
    assert!(tokio::time::timeout(ms(10), guard.release()).await.is_err());
    sleep(ms(100)).await; // the second release has answered by now
    let releases = backend.times(t_release, |c| matches!(c, Call::Release(_)));
    assert_eq!(releases, vec![ms(0), ms(10)]);
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_none());
    sleep_until(t_release + TTL).await;
    tokio::task::yield_now().await;
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_release_times_out_on_the_schedulers_timer() {
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Hang);
    let lease = Lease::with_holder(backend.clone(), "a");
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(ms(100)).await;
    let t_release = Instant::now();
    let err = guard.release().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "release",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        Instant::now() - t_release,
        super::timing::release_timeout(TTL)
    );
    // A ttl after it was sent, the old lease has ended anyway: the name is free.
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_hanging_release_times_out_after_the_scheduler_has_gone() {
    // The lease is lost at its first renewal; the scheduler lingers and exits.
    let backend = Scripted::new([], Step::Answer(false)).releases(Step::Hang);
    let lease = Lease::with_holder(backend.clone(), "a");
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(PERIOD + super::scheduler::IDLE_LINGER + ms(100)).await;
    assert!(!guard.is_valid());
    let t_release = Instant::now();
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert_eq!(
        Instant::now() - t_release,
        super::timing::release_timeout(TTL)
    );
}

#[tokio::test(start_paused = true)]
async fn a_suspended_machine_wakes_up_with_its_leases_invalid() {
    // On Linux the monotonic clock stops while the machine is suspended; the
    // wall clock does not. Simulate a suspend of 10 ttls: the wall clock jumps,
    // tokio's clock does not move.
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(ms(100)).await;
    assert!(guard.is_valid());
    super::timing::WALL_SHIFT.set(TTL * 10);
    assert!(!guard.is_valid(), "is_valid reads the wall clock too");
    // The token fires when the scheduler next looks, at the renewal that was
    // due anyway — without renewing a lease that may be someone else's by now.
    assert_eq!(cancelled_after(&guard, t0).await, PERIOD);
    super::timing::WALL_SHIFT.set(Duration::ZERO);
}

/// A backend whose acquisitions answer only after `delay` (a reply that sat
/// in a socket while the runtime stalled), always granting.
#[derive(Clone)]
struct SlowGrant {
    delay: Duration,
    released: Arc<Mutex<Vec<Option<u64>>>>,
}

impl Backend for SlowGrant {
    async fn acquire(&self, _: &str, _: &str, _: Duration) -> Result<Option<Grant>, Error> {
        sleep(self.delay).await;
        Ok(Some(Grant::new(Some(7))))
    }
    async fn renew(&self, _: Acquisition<'_>, _: Duration) -> Result<bool, Error> {
        Ok(true)
    }
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.released.lock().unwrap().push(lease.fencing_token);
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn a_grant_handled_after_its_deadline_is_not_handed_out() {
    // The runtime stalls (or the machine is suspended) while the grant sits
    // in the socket: when the task runs again, both the reply and the call's
    // time limit are ready, and `tokio::time::timeout` polls the reply first.
    let backend = SlowGrant {
        delay: TTL * 2,
        released: Arc::default(),
    };
    let lease = Lease::with_holder(backend.clone(), "a");
    let acquiring = tokio::spawn({
        let lease = lease.clone();
        async move { lease.try_acquire("job", TTL).await }
    });
    tokio::task::yield_now().await; // the acquire is sent and waits
    // Both timers expire in one step, as after a stall of the runtime.
    tokio::time::advance(TTL * 2).await;
    let got = acquiring.await.unwrap();
    match got {
        Err(Error::Timeout {
            operation: "acquire",
            ..
        }) => {}
        Ok(Some(guard)) => panic!(
            "a grant past its deadline was handed out: valid {}, token cancelled {}",
            guard.is_valid(),
            guard.token().is_cancelled()
        ),
        other => panic!("{other:?}"),
    }
    // The lease the server may hold for us is given back, by its fence.
    sleep(ms(10)).await;
    assert_eq!(*backend.released.lock().unwrap(), [Some(7)]);
}

#[tokio::test(start_paused = true)]
async fn a_lease_near_its_deadline_does_not_shorten_a_healthy_ones_renewal() {
    use crate::test_util::capture_logs;
    let (logs, _guard) = capture_logs();
    // "a", with the least grace (the margin, 32 ms), fails five renewals in
    // a row (at 1.0, 1.1, 1.3, 1.7 and 2.2 s), so its retry at 2.7 s has
    // 0.268 s left before its deadline (2.968 s). "b",
    // acquired at 2.0 s, is due at 3.0 s and would be coalesced with that
    // retry. The backend answers every call after 400 ms: in a batch with
    // "a", "b" would get a's 0.268 s and time out for nothing.
    let backend = Scripted::new(vec![Step::Fail; 5], Step::Slow(ms(400), true));
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let a = lease
        .job("a", TTL)
        .grace(MARGIN)
        .acquire()
        .await
        .unwrap()
        .unwrap();
    sleep_until(t0 + ms(2000)).await;
    let b = lease.try_acquire("b", TTL).await.unwrap().unwrap();
    assert_eq!(
        cancelled_after(&a, t0).await,
        TTL - MARGIN,
        "a is lost at its deadline"
    );
    sleep_until(t0 + ms(3500)).await;
    assert!(b.is_valid());
    let logs = logs.text();
    let b_failures: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("renewal failed") && l.contains("lease.name=b"))
        .collect();
    assert!(b_failures.is_empty(), "b's renewal failed: {b_failures:#?}");
    // b was renewed by a call of its own, sent at 2.7 s.
    let b_renewed = backend.times(t0, |c| match c {
        Call::Renew(n) => n == "b",
        Call::RenewMany(names) => names.iter().any(|n| n == "b"),
        _ => false,
    });
    assert_eq!(b_renewed, [ms(2700)], "{:?}", backend.calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_outside_any_runtime_is_released_on_the_renewing_runtime() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
    let guard = lease
        .try_acquire("job", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    // Dropped on a thread with no runtime (a destructor in a plain thread,
    // a callback of a C library): the release is sent all the same, on the
    // runtime that renews the lease, instead of waiting out the ttl.
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let mut released = false;
    for _ in 0..200 {
        if db.holder("job").is_none() {
            released = true;
            break;
        }
        tokio::time::sleep(ms(10)).await;
    }
    assert!(
        released,
        "the lease is still held: its release was never sent"
    );
    // And the name is free for this Lease again.
    assert!(lease.try_acquire("job", TTL).await.unwrap().is_some());
}

/// The longest ttl there is: the time limits of acquire and release are
/// capped at 30 s, far below `ttl - margin` and `ttl`.
const DAY: Duration = Duration::from_secs(86_400);
const CAP: Duration = Duration::from_secs(30);

#[tokio::test(start_paused = true)]
async fn a_hanging_acquire_with_a_long_ttl_times_out_after_30_s() {
    let lease = Lease::with_holder(HangingAcquire, "a");
    let t0 = Instant::now();
    let err = lease.try_acquire("job", DAY).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "acquire",
                after,
            } if after == CAP
        ),
        "{err:?}"
    );
    assert_eq!(Instant::now() - t0, CAP);
    // Through `with_lease`: skipped with the same error, after the same 30 s.
    let t0 = Instant::now();
    let out = lease
        .with_lease("job", DAY, |_| async { unreachable!("must not run") })
        .await;
    assert!(
        matches!(
            out,
            Outcome::Skipped(Skip::Error(Error::Timeout {
                operation: "acquire",
                ..
            }))
        ),
        "{out:?}"
    );
    assert_eq!(Instant::now() - t0, CAP);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_release_with_a_long_ttl_times_out_after_30_s() {
    let backend = Scripted::new([], Step::Answer(true)).releases(Step::Hang);
    let lease = Lease::with_holder(backend.clone(), "a");
    let guard = lease.try_acquire("job", DAY).await.unwrap().unwrap();
    sleep(ms(100)).await;
    let t_release = Instant::now();
    let err = guard.release().await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Timeout {
                operation: "release",
                after,
            } if after == CAP
        ),
        "{err:?}"
    );
    assert_eq!(Instant::now() - t_release, CAP);
    // The release was sent once and is not waited for any longer.
    let releases = backend.times(t_release, |c| matches!(c, Call::Release(_)));
    assert_eq!(releases, [Duration::ZERO]);
}

/// A hint of loss makes the engine renew at once, and the renewal decides:
/// `false` cancels the token then, not at the next renewal a period later.
#[tokio::test(start_paused = true)]
async fn a_hint_of_loss_renews_at_once_and_the_renewal_decides() {
    let backend = Scripted::new([Step::Answer(false)], Step::Answer(true)).hinted();
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(ms(200)).await;
    backend.hint();
    tokio::time::timeout(ms(1), guard.token().cancelled())
        .await
        .expect("cancelled by the renewal the hint asked for");
    let renews = backend.times(t0, is_renew);
    assert_eq!(renews, [ms(200)]);
    assert!(!guard.is_valid());
}

/// A spurious hint costs one renewal: the lease stays, and the next renewal
/// comes a period after that one.
#[tokio::test(start_paused = true)]
async fn a_spurious_hint_costs_one_renewal() {
    let backend = Scripted::new([], Step::Answer(true)).hinted();
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep(ms(200)).await;
    backend.hint();
    sleep(ms(1500)).await;
    assert!(guard.is_valid());
    let renews = backend.times(t0, is_renew);
    assert_eq!(renews, [ms(200), ms(200) + PERIOD]);
    guard.release().await.unwrap();
}

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
        super::timing::acquire_timeout(TTL) + super::timing::release_timeout(TTL)
    );
}

/// `Memory` whose acquisitions take effect at once but answer after a delay
/// (a slow reply).
#[derive(Clone)]
struct SlowAcquire(Memory, Duration);

impl Backend for SlowAcquire {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        let grant = self.0.acquire(name, holder, ttl).await;
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
    let guard = lease
        .job("capped", ttl)
        .max_hold(ms(500))
        .acquire()
        .await
        .unwrap()
        .unwrap();
    let fired = cancelled_after(&guard, t0).await;
    assert!(
        fired >= ms(500) && fired <= ms(501),
        "the token fired {fired:?} after acquisition, not at max_hold (500ms)"
    );
    assert!(other.is_valid());
}

/// Issue 28, point 1: when renewals fail, the token fires (and `is_valid`
/// turns false) `grace` before the lease could pass to another holder —
/// by default `ttl/3`, so at `t_send + ttl - ttl/3` = 2 s for a lease
/// acquired at `t0` whose renewals all fail.
#[tokio::test(start_paused = true)]
async fn failing_renewals_fire_the_token_a_default_grace_before_the_lease_could_pass_on() {
    let backend = Scripted::new([], Step::Fail);
    let lease = Lease::with_holder(backend.clone(), "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    sleep_until(t0 + TTL - TTL / 3 - ms(1)).await;
    assert!(guard.is_valid());
    assert_eq!(cancelled_after(&guard, t0).await, TTL - TTL / 3);
    assert!(!guard.is_valid());
}

/// Try to acquire `name` through `other` every 10 ms until it succeeds;
/// when it did.
async fn acquired_by(other: &Lease, name: &str) -> (Instant, crate::LeaseGuard) {
    loop {
        if let Some(guard) = other.try_acquire(name, TTL).await.unwrap() {
            return (Instant::now(), guard);
        }
        sleep(ms(10)).await;
    }
}

/// Issue 28, point 2: `shutdown` cancels the token, keeps the lease while
/// the body winds down (400 ms here, within its grace of 1 s), and releases
/// it as soon as the body has returned — never before: another holder
/// trying all along gets it only then, and `shutdown` returns then too.
#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_a_body_that_stops_within_its_grace() {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
    let t0 = Instant::now();
    let job = tokio::spawn({
        let a = a.clone();
        async move {
            a.with_lease("job", TTL, |token| async move {
                token.cancelled().await;
                sleep(ms(400)).await; // winding down
                Instant::now()
            })
            .await
        }
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
    let Outcome::Ran(returned_at) = job.await.unwrap() else {
        panic!("the job did not run")
    };
    assert_eq!(returned_at - t0, ms(900));
    assert!(
        taken_at >= returned_at,
        "another holder got the lease {:?} before the body returned",
        returned_at - taken_at
    );
    assert!(taken_at - returned_at <= ms(10), "{:?}", taken_at - t0);
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
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
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
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
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
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
    let t0 = Instant::now();
    let job = tokio::spawn({
        let a = a.clone();
        async move {
            a.job("capped", TTL)
                .max_hold(ms(1500))
                .run(|token, _| async move {
                    token.cancelled().await;
                    let told = Instant::now();
                    sleep(ms(400)).await; // winding down
                    (told, Instant::now())
                })
                .await
        }
    });
    sleep(ms(10)).await; // the job has the lease
    let (taken_at, _taken) = acquired_by(&b, "capped").await;
    let Outcome::Ran((told, returned)) = job.await.unwrap() else {
        panic!("the job did not run")
    };
    assert_eq!(told - t0, ms(1500));
    assert_eq!(returned - t0, ms(1900));
    assert!(
        taken_at >= returned,
        "another holder got the lease {:?} before the body returned",
        returned - taken_at
    );
    assert!(taken_at - returned <= ms(10), "{:?}", taken_at - t0);
}

/// Issue 28, point 3: a body that ignores its token after `max_hold` keeps
/// the lease renewed for at most its grace, then it is left to expire: at
/// most `max_hold + grace + ttl` after the acquisition (here its last
/// renewal is sent at 2 s, within the grace that ends at 2.5 s).
#[tokio::test(start_paused = true)]
async fn max_hold_leaves_a_hung_body_s_lease_to_expire_after_the_grace() {
    let db = Memory::new();
    let a = Lease::with_holder(db.clone(), "a");
    let b = Lease::with_holder(db.clone(), "b");
    let t0 = Instant::now();
    let guard = a
        .job("hung", TTL)
        .max_hold(ms(1500))
        .acquire()
        .await
        .unwrap()
        .unwrap();
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
    assert_eq!(took, ms(950) + super::timing::release_timeout(TTL));
    assert!(took <= GRACE + super::timing::release_timeout(TTL));
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
    let mut guards = Vec::new();
    for name in ["a", "b"] {
        let job = lease.job(name, TTL).grace(TTL / 2);
        guards.push(job.acquire().await.unwrap().unwrap());
    }
    sleep(ms(3_100)).await;
    let renews: Vec<(Duration, Call)> = backend
        .calls()
        .into_iter()
        .filter(|(_, c)| is_renew(c))
        .map(|(t, c)| (t - t0, c))
        .collect();
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
