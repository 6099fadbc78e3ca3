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
use crate::test_util::{ms, paused_runtime, pods};
use crate::{Acquisition, Backend, Error, Grant, Lease, LeaseGuard, Outcome, Skip};

mod batches_and_releases;
mod renewals;
mod runs;
mod shutdown;

const TTL: Duration = Duration::from_secs(3);
const PERIOD: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(32);
/// The default grace for [`TTL`]: ttl/3.
const GRACE: Duration = Duration::from_secs(1);

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

    /// The renewal calls, each with its time relative to `t0`.
    fn renewals(&self, t0: Instant) -> Vec<(Duration, Call)> {
        self.calls()
            .into_iter()
            .filter(|(_, c)| is_renew(c))
            .map(|(t, c)| (t - t0, c))
            .collect()
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

/// Holder "a" on `backend` takes "job" for [`TTL`]: its `Lease`, the
/// guard, and when it asked.
async fn job_held(backend: impl Backend) -> (Lease, LeaseGuard, Instant) {
    let lease = Lease::with_holder(backend, "a");
    let t0 = Instant::now();
    let guard = lease.try_acquire("job", TTL).await.unwrap().unwrap();
    (lease, guard, t0)
}

/// The guard of `job`, which must be granted.
async fn granted(job: crate::Job<'_>) -> LeaseGuard {
    job.acquire().await.unwrap().unwrap()
}

/// Wait for the token and return when it fired, relative to `t0`.
async fn cancelled_after(guard: &LeaseGuard, t0: Instant) -> Duration {
    guard.token().cancelled().await;
    Instant::now() - t0
}

fn is_renew(c: &Call) -> bool {
    matches!(c, Call::Renew(_) | Call::RenewMany(_))
}

/// Whether `c` renews `name`, alone or in a batch.
fn renews(name: &str) -> impl Fn(&Call) -> bool + '_ {
    move |c| match c {
        Call::Renew(n) => n == name,
        Call::RenewMany(names) => names.iter().any(|n| n == name),
        _ => false,
    }
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

/// Through a backend whose acquisitions never answer, holder "a" tries
/// "job" for `ttl`: the attempt fails with `Error::Timeout` after `limit`.
/// The `Lease`.
async fn an_acquire_that_hangs_times_out(ttl: Duration, limit: Duration) -> Lease {
    let lease = Lease::with_holder(HangingAcquire, "a");
    let t0 = Instant::now();
    let err = lease.try_acquire("job", ttl).await.unwrap_err();
    assert!(
        matches!(err, Error::Timeout { operation: "acquire", after } if after == limit),
        "{err:?}"
    );
    assert_eq!(Instant::now() - t0, limit);
    lease
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
