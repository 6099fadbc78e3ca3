//! [`Lease`]: the entry point.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use crate::engine::{Attempt, Engine, JobOptions};
use crate::{Backend, CancellationToken, Error, LeaseGuard, Outcome, validate};

/// Acquires leases on behalf of one holder identity, and keeps them.
///
/// A `Lease` pairs a [`Backend`] (where leases are stored) with a holder
/// identity (who this process is). It is cheap to clone — clones share the
/// holder, the backend and one background renewal task, so create one per
/// process and pass clones around.
///
/// - [`with_lease`](Lease::with_lease) runs a closure iff the lease can be
///   had now, renews the lease while it runs and releases it afterwards: the
///   shape of a periodic job ("run this tick on one replica only").
/// - [`try_acquire`](Lease::try_acquire) hands out a [`LeaseGuard`] to hold
///   for as long as you like.
///
/// Within one `Lease`, a name that is held (or being acquired or released)
/// cannot be acquired a second time at once: the second call is skipped as
/// held elsewhere, so the same process never runs a job twice concurrently.
///
/// A `Lease` needs a [Tokio](https://tokio.rs) runtime (with its time
/// driver): renewals run on one task, spawned on the runtime of the
/// acquisition that finds no lease held. The task keeps the backend (its
/// pool) until a little after the last lease has ended. If that runtime
/// shuts down while leases are still held, nothing renews them any more, so
/// their tokens are cancelled at once; with several runtimes in one process
/// (say, one per test), give each its own `Lease`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold::{backend::Memory, Lease, Outcome};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let lease = Lease::new(Memory::new());
/// let outcome = lease
///     .with_lease("nightly-report", Duration::from_secs(90), |token| async move {
///         // ... do the work, checking `token.is_cancelled()` between steps ...
///         assert!(!token.is_cancelled());
///         42
///     })
///     .await;
/// assert!(matches!(outcome, Outcome::Ran(42)));
/// # }
/// ```
#[derive(Clone)]
pub struct Lease {
    engine: Arc<Engine>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("holder", &self.holder())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// A `Lease` on `backend` with the holder identity
    /// `"{hostname}-{pid}-{8 random hex digits}"`.
    ///
    /// The random part keeps two processes apart even when containers share
    /// a hostname and both run as pid 1.
    pub fn new(backend: impl Backend) -> Lease {
        Lease::with_holder(backend, default_holder())
    }

    /// A `Lease` on `backend` with exactly this holder identity — for tests
    /// and for simulating several pods in one process.
    ///
    /// Two `Lease`s with the same holder are the same holder to the backend:
    /// each may re-acquire (and release) the other's leases. Give every
    /// process its own holder. A holder must be 1 to 255 bytes; otherwise
    /// every acquisition fails with [`Error::InvalidHolder`].
    pub fn with_holder(backend: impl Backend, holder: impl Into<String>) -> Lease {
        let holder: String = holder.into();
        Lease {
            engine: Arc::new(Engine::new(Box::new(backend), holder.into())),
        }
    }

    /// This `Lease`'s holder identity, as stored by the backend.
    pub fn holder(&self) -> &str {
        &self.engine.holder
    }

    /// Run `f` iff the lease `name` can be acquired now; renew the lease
    /// every `ttl/3` while `f` runs; release it when `f` is done.
    ///
    /// `f` receives a [`CancellationToken`] that is cancelled the moment the
    /// lease is lost (taken over, expired, or not renewed before its local
    /// deadline). Stop work that must not overlap with another holder as soon
    /// as it fires.
    ///
    /// - `Ran(value)`: `f` ran and returned `value`.
    /// - `Skipped(HeldElsewhere)`: another holder has the lease (or this
    ///   `Lease` is running `name` already); `f` did not run. Logged at debug.
    /// - `Skipped(Error(e))`: the backend could not be asked, or the input is
    ///   invalid; `f` did not run. Logged at warn. For a periodic job this is
    ///   not a failure: the next tick tries again.
    ///
    /// The lease is released when `f` returns or panics, or when this future
    /// is dropped. A failed release is logged; the lease then ends when its
    /// ttl runs out, and this `Lease` skips `name` until then.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::{backend::Memory, Lease, Outcome, Skip};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let db = Memory::new();
    /// let pod_a = Lease::with_holder(db.clone(), "pod-a");
    /// let pod_b = Lease::with_holder(db.clone(), "pod-b");
    /// let ttl = Duration::from_secs(30);
    ///
    /// let outcome = pod_a
    ///     .with_lease("digest", ttl, |_token| async {
    ///         // While pod-a runs the job, pod-b's tick is skipped.
    ///         let other = pod_b.with_lease("digest", ttl, |_| async { "pod-b ran" }).await;
    ///         assert!(matches!(other, Outcome::Skipped(Skip::HeldElsewhere)));
    ///         "pod-a ran"
    ///     })
    ///     .await;
    /// assert_eq!(outcome.into_result().unwrap(), Some("pod-a ran"));
    /// # }
    /// ```
    ///
    /// # Panics
    ///
    /// Only if `f` or its future panics. The panic then continues at once;
    /// the lease is released in the background (a task on the current
    /// runtime), so another holder may still find it held for a round trip.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future stops `f`, stops renewing and releases the lease in
    /// the background.
    pub async fn with_lease<F, Fut, T>(&self, name: &str, ttl: Duration, f: F) -> Outcome<T>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = T>,
    {
        self.job(name, ttl)
            .run(|token, _fencing_token| f(token))
            .await
    }

    /// What a waiter for `name` waits for between two attempts: a release
    /// in this `Lease`, one the backend reports, or a poll interval.
    /// Registers at the call.
    pub(crate) fn waiter(&self, name: &str, ttl: Duration) -> impl Future<Output = ()> + Send + '_ {
        self.engine.freed(name, crate::engine::wait_poll(ttl))
    }

    /// The backend's hint that `name` may have changed
    /// ([`Backend::released`]), after `poll` at the latest.
    pub(crate) fn released(
        &self,
        name: &str,
        poll: Duration,
    ) -> impl Future<Output = ()> + Send + 'static {
        self.engine.backend.released(name, poll)
    }

    /// What the backend knows about `name` ([`Backend::inspect`]).
    pub(crate) async fn inspect(&self, name: &str) -> Result<Option<crate::LeaseInfo>, Error> {
        self.engine.backend.inspect(name).await
    }

    /// Acquire the lease `name` for `ttl`, waiting up to `wait` for another
    /// holder to let it go.
    ///
    /// `Ok(Some(guard))` as soon as the lease is ours (as
    /// [`try_acquire`](Lease::try_acquire)); `Ok(None)` if another holder
    /// (or this `Lease`) still has it when `wait` is over.
    ///
    /// Between attempts it waits for a release: pushed by the server where
    /// the backend can ([`backend`](crate::backend) says which), else polled
    /// every `ttl/10` (10 ms to 1 s, ±20% jitter). A crashed holder's lease
    /// is taken at its expiry, not a poll later. A zero `wait` is one
    /// attempt, like `try_acquire`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::{backend::Memory, Lease};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), leasehold::Error> {
    /// let db = Memory::new();
    /// let (a, b) = (Lease::with_holder(db.clone(), "a"), Lease::with_holder(db, "b"));
    /// let ttl = Duration::from_secs(30);
    /// let held = a.try_acquire("compactor", ttl).await?.expect("free");
    /// tokio::spawn(async move {
    ///     tokio::time::sleep(Duration::from_secs(2)).await;
    ///     held.release().await
    /// });
    /// // b waits for a's release instead of skipping.
    /// let guard = b.acquire("compactor", ttl, Duration::from_secs(10)).await?;
    /// assert!(guard.is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Invalid input, [`Error::NoRuntime`] and [`Error::ShutDown`] at once.
    /// A backend error is retried within `wait`; if no attempt got an
    /// answer, the last error is returned when `wait` is over.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Lease::try_acquire): a dropped wait leaves no
    /// lease behind in this `Lease` (a request that already reached the
    /// backend may have taken it; it then ends at its ttl).
    pub async fn acquire(
        &self,
        name: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Option<LeaseGuard>, Error> {
        self.wait_for(name, ttl, wait, &JobOptions::default()).await
    }

    /// [`acquire`](Lease::acquire) with a job's options.
    ///
    /// Between attempts it wakes for a release (this `Lease`'s, the
    /// backend's push, or a poll) and at the expiry of the holder's lease
    /// (a crashed holder's lease is taken at its expiry, not a
    /// poll later): the expiry the refused attempt reported, or else one
    /// [`inspect`](crate::Backend::inspect), asked again only once a wake-up
    /// at the known expiry found the lease still held (renewed meanwhile).
    pub(crate) async fn wait_for(
        &self,
        name: &str,
        ttl: Duration,
        wait: Duration,
        options: &JobOptions,
    ) -> Result<Option<LeaseGuard>, Error> {
        use tokio::time::Instant;
        let until = Instant::now() + wait.min(crate::MAX_TTL);
        // The last error, unless some attempt got an answer ("held").
        let mut error: Option<Error> = None;
        let mut answered = false;
        // When the holder's lease expires at the earliest, as last learned;
        // `None` once that has passed (or the backend cannot say).
        let mut expiry: Option<Instant> = None;
        let mut can_inspect = true;
        loop {
            // Registered before the attempt: a release right after a failed
            // attempt still wakes us. Without a wait there is nothing to
            // wake: a single attempt registers nothing with the backend
            // (which, for a push backend, would be a subscription kept open
            // and a key derived for nothing).
            let freed = (!wait.is_zero()).then(|| self.waiter(name, ttl));
            match self.attempt(name, ttl, options).await {
                Ok(Attempt::Granted(guard)) => return Ok(Some(guard)),
                Ok(Attempt::Held { expires_in }) => {
                    answered = true;
                    if !wait.is_zero() {
                        self.learn_expiry(name, ttl, expires_in, &mut expiry, &mut can_inspect)
                            .await;
                    }
                }
                Err(e)
                    if e.is_invalid_input()
                        || matches!(
                            e,
                            Error::NoRuntime | Error::ShutDown | Error::AlreadyRan { .. }
                        ) =>
                {
                    return Err(e);
                }
                Err(e) => {
                    tracing::debug!(lease.name = name, holder = self.holder(), error = %e.chain(), "acquire failed; retrying within the wait");
                    error = Some(e);
                }
            }
            let Some(freed) = freed.filter(|_| Instant::now() < until) else {
                return match error {
                    Some(e) if !answered => Err(e),
                    _ => Ok(None),
                };
            };
            // At the expiry, plus a little (up to 1% of the ttl, at most
            // 5 ms), so that waiters do not all ask at the same instant.
            let at_expiry = expiry.filter(|at| *at < until).map(|at| at + jitter(ttl));
            tokio::select! {
                () = freed => {}
                () = tokio::time::sleep_until(until) => {}
                () = async { tokio::time::sleep_until(at_expiry.unwrap_or(until)).await }, if at_expiry.is_some() => {}
            }
        }
    }

    /// When the holder's lease on `name` expires at the earliest, for a
    /// waiter: `expires_in` if the refused attempt said; else the `expiry`
    /// learned before while it has not passed; else one `inspect` (not
    /// asked again once the backend said it cannot).
    async fn learn_expiry(
        &self,
        name: &str,
        ttl: Duration,
        expires_in: Option<Duration>,
        expiry: &mut Option<tokio::time::Instant>,
        can_inspect: &mut bool,
    ) {
        let now = tokio::time::Instant::now();
        // `Duration::MAX`, say, is "no expiry" (`PgAdvisory`).
        let at = |left: Duration| Some(left).filter(|l| *l <= crate::MAX_TTL).map(|l| now + l);
        *expiry = expiry.filter(|at| *at > now);
        if let Some(left) = expires_in {
            *expiry = at(left);
        } else if expiry.is_none() && *can_inspect {
            let limit = crate::engine::timing::acquire_timeout(ttl);
            match tokio::time::timeout(limit, self.inspect(name)).await {
                Ok(Ok(Some(info))) => *expiry = info.expires_in.and_then(at),
                Ok(Err(Error::Unsupported { .. })) => *can_inspect = false,
                _ => {}
            }
        }
    }

    /// Acquire the lease `name` for `ttl` if it is free now; never waits for
    /// another holder.
    ///
    /// `Ok(Some(guard))`: the lease is ours; it is renewed every `ttl/3` in
    /// the background until the guard is released or dropped, and
    /// [`guard.token()`](LeaseGuard::token) is cancelled if it is lost.
    /// `Ok(None)` has two meanings, told apart by asking the `Lease`: either
    /// another holder has the lease, or this `Lease` (this process) holds
    /// it, or is acquiring or releasing it, already — [`held`](Lease::held)
    /// lists the latter. Either way, the caller must not run the job now.
    ///
    /// `name` is any 1 to 255 bytes of UTF-8 (quotes, `%`, braces and the
    /// like are data). `ttl` is whole milliseconds from 10 ms to 24 h: it
    /// bounds how long a crashed holder blocks the others.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::{backend::Memory, Lease};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), leasehold::Error> {
    /// let lease = Lease::new(Memory::new());
    /// if let Some(guard) = lease.try_acquire("compaction", Duration::from_secs(60)).await? {
    ///     // Pass the fencing token to the resource you write to, so that it can
    ///     // reject writes from an older holder.
    ///     assert_eq!(guard.fencing_token(), Some(1));
    ///     assert!(guard.is_valid());
    ///     guard.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidName`], [`Error::InvalidTtl`], [`Error::InvalidHolder`]
    ///   for input outside the rules above;
    /// - [`Error::Timeout`] when the backend does not answer within
    ///   `min(ttl - grace, 30 s)` (grace = ttl/3 here, see
    ///   [`Job::grace`](crate::Job::grace));
    /// - the backend's error when it fails (connection refused, SQL error, ...);
    /// - [`Error::NoRuntime`] outside a Tokio runtime.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before it completes, no guard is handed out
    /// and nothing renews the lease; a request that already reached the
    /// backend may still have taken it, and it then ends at its ttl (the same
    /// holder may re-acquire it at once).
    pub async fn try_acquire(
        &self,
        name: &str,
        ttl: Duration,
    ) -> Result<Option<LeaseGuard>, Error> {
        match self.attempt(name, ttl, &JobOptions::default()).await? {
            Attempt::Granted(guard) => Ok(Some(guard)),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// One acquisition attempt, with a job's options; counted in the
    /// metrics by its outcome.
    pub(crate) async fn attempt(
        &self,
        name: &str,
        ttl: Duration,
        options: &JobOptions,
    ) -> Result<Attempt<LeaseGuard>, Error> {
        validate::name(name)?;
        validate::ttl(ttl)?;
        options.grace(ttl)?;
        if let Some(once_per) = options.once_per {
            validate::once_per(once_per.period)?;
        }
        validate::holder(self.holder())?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime);
        }
        if self.engine.is_closed() {
            return Err(Error::ShutDown);
        }
        let entry = match self.engine.reserve(name) {
            Some(reservation) => self.engine.acquire(reservation, ttl, options).await,
            None => Ok(Attempt::Held { expires_in: None }),
        };
        crate::metrics::acquired(
            name,
            match &entry {
                Ok(Attempt::Granted(_)) => "acquired",
                Ok(Attempt::Held { .. }) => "held_elsewhere",
                Err(Error::AlreadyRan { .. }) => "already_ran",
                Err(_) => "error",
            },
        );
        Ok(match entry? {
            Attempt::Granted(entry) => {
                tracing::debug!(
                    lease.name = name,
                    holder = self.holder(),
                    fencing_token = entry.fencing_token,
                    slot = entry.slot.map(|(slot, _)| slot),
                    "lease acquired"
                );
                Attempt::Granted(LeaseGuard::new(self.engine.clone(), entry))
            }
            Attempt::Held { expires_in } => Attempt::Held { expires_in },
        })
    }

    /// What this `Lease` holds now: one [`Held`] per live lease (renewed, not
    /// lost or released). A cheap snapshot, for health checks and status
    /// pages.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::{backend::Memory, Lease};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), leasehold::Error> {
    /// let lease = Lease::new(Memory::new());
    /// let guard = lease.try_acquire("compaction", Duration::from_secs(60)).await?.expect("free");
    /// let held = lease.held();
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].name, "compaction");
    /// // Valid until ttl - grace (ttl/3 by default) after the acquisition.
    /// assert!(held[0].valid_for > Duration::from_secs(35));
    /// assert!(held[0].valid_for <= Duration::from_secs(40));
    /// guard.release().await?;
    /// assert!(lease.held().is_empty());
    /// # Ok(()) }
    /// ```
    pub fn held(&self) -> Vec<Held> {
        let now = tokio::time::Instant::now();
        self.engine
            .held()
            .into_iter()
            .map(|entry| Held {
                name: entry.name.to_string(),
                fencing_token: entry.fencing_token,
                held_for: now.saturating_duration_since(entry.acquired_at),
                valid_for: entry.valid_for(),
            })
            .collect()
    }

    /// Shut this `Lease` (and every clone) down: cancel every held lease's
    /// token, wait for the bodies to stop, release each lease as soon as its
    /// body has ended, and let the renewal task end. Afterwards every
    /// acquisition through this `Lease` or a clone fails with
    /// [`Error::ShutDown`], and elections stop. Call it when the process is
    /// asked to stop, so that a rolling deploy hands the leases over as soon
    /// as the jobs have stopped instead of after a ttl.
    ///
    /// A *body* is the closure of [`with_lease`](Lease::with_lease),
    /// [`Job::run`](crate::Job::run) or `#[singleton]` until it returns, and
    /// a [`LeaseGuard`] until it is released or dropped. Another holder is
    /// never granted a lease while its body may still run:
    ///
    /// - each lease is still renewed while its body winds down, for up to
    ///   its grace ([`Job::grace`](crate::Job::grace), `ttl/3` by default),
    ///   and released as soon as the body ends (within `min(ttl, 30 s)`);
    /// - a body still running when its grace is over keeps its lease,
    ///   unrenewed, to expire on the server (logged at warn);
    /// - a lease kept for its [`min_hold`](crate::Job::min_hold) is not
    ///   released either (another replica could run the job again): it
    ///   expires on the server, at most a ttl later.
    ///
    /// An acquisition in flight fails with [`Error::ShutDown`] too (a lease
    /// granted to it is released at once), and `shutdown` waits for it. So
    /// `shutdown` returns within the time limits of those acquisitions plus
    /// the largest grace plus the release's time limit, and then this
    /// `Lease` holds nothing. Releases already running in the background
    /// (of guards dropped earlier) are not awaited.
    ///
    /// ```no_run
    /// # async fn serve(lease: leasehold::Lease) {
    /// tokio::signal::ctrl_c().await.expect("signal handler"); // or SIGTERM, see the README
    /// lease.shutdown().await;
    /// # }
    /// ```
    pub async fn shutdown(&self) {
        self.engine.shut_down().await;
    }
}

/// One lease held by a [`Lease`], as [`Lease::held`] reports it.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The lease's name.
    pub name: String,
    /// Its fencing token, if the backend has them.
    pub fencing_token: Option<u64>,
    /// Since it was acquired (since the acquire request was sent).
    pub held_for: Duration,
    /// How long it stays valid without another successful renewal: until
    /// its local deadline.
    pub valid_for: Duration,
}

/// `"{hostname}-{pid}-{8 hex digits}"`, the hostname shortened so the whole
/// fits the 255-byte holder limit.
fn default_holder() -> String {
    let host = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut host = if host.is_empty() {
        "unknown-host".to_owned()
    } else {
        host
    };
    let mut cut = host.len().min(200);
    while !host.is_char_boundary(cut) {
        cut -= 1;
    }
    host.truncate(cut);
    // `RandomState` is seeded from the OS's randomness once per thread and
    // differs for every instance: enough to tell two processes apart.
    let random = RandomState::new().hash_one(std::process::id()) as u32;
    format!("{host}-{}-{random:08x}", std::process::id())
}

/// A little time after an expiry before a waiter tries: up to 1% of the
/// ttl, at most 5 ms, at random.
fn jitter(ttl: Duration) -> Duration {
    let spread = RandomState::new().hash_one(ttl) as f64 / u64::MAX as f64;
    (ttl / 100).min(Duration::from_millis(5)).mul_f64(spread)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Memory;
    use crate::{Acquisition, Grant};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// [`Memory`], counting the waiters registered with it.
    #[derive(Clone, Default)]
    struct Counting {
        inner: Memory,
        registered: Arc<AtomicUsize>,
    }

    impl Backend for Counting {
        async fn acquire(&self, n: &str, h: &str, ttl: Duration) -> Result<Option<Grant>, Error> {
            self.inner.acquire(n, h, ttl).await
        }
        async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
            self.inner.renew(lease, ttl).await
        }
        async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
            self.inner.release(lease).await
        }
        fn released(
            &self,
            name: &str,
            poll: Duration,
        ) -> impl Future<Output = ()> + Send + 'static {
            self.registered.fetch_add(1, Ordering::SeqCst);
            self.inner.released(name, poll)
        }
    }

    /// A single attempt (no wait) registers no waiter with the backend —
    /// on a push backend that is a subscription and, on `PgAdvisory`, a
    /// key derivation, for nothing — while a wait still registers before
    /// its first attempt.
    #[tokio::test(start_paused = true)]
    async fn only_a_wait_registers_a_waiter() {
        let backend = Counting::default();
        let registered = backend.registered.clone();
        let lease = Lease::with_holder(backend.clone(), "a");
        let ttl = Duration::from_secs(10);
        assert!(matches!(
            lease.with_lease("n", ttl, |_| async {}).await,
            Outcome::Ran(())
        ));
        let guard = lease.try_acquire("n", ttl).await.unwrap().expect("free");
        let other = Lease::with_holder(backend, "b");
        assert!(other.try_acquire("n", ttl).await.unwrap().is_none());
        assert_eq!(
            registered.load(Ordering::SeqCst),
            0,
            "a single attempt registered a waiter"
        );
        assert!(
            other
                .acquire("n", ttl, Duration::from_millis(50))
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            registered.load(Ordering::SeqCst) >= 1,
            "a wait registered no waiter"
        );
        guard.release().await.unwrap();
    }

    #[test]
    fn default_holder_shape() {
        let holder = default_holder();
        let mut parts = holder.rsplitn(3, '-');
        let random = parts.next().expect("random part");
        let pid = parts.next().expect("pid part");
        let host = parts.next().expect("host part");
        assert_eq!(random.len(), 8);
        assert!(random.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(pid, std::process::id().to_string());
        assert!(!host.is_empty());
        assert_ne!(
            default_holder(),
            holder,
            "two holders of one process must differ"
        );
    }
}
