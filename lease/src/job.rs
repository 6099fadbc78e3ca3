//! [`Job`]: one run (or acquisition) under a lease, configured — everything
//! `#[singleton]` can say, without the macro.

use std::future::Future;
use std::time::Duration;

use tracing::Instrument;

use crate::{CancellationToken, Error, Lease, LeaseGuard, Outcome, Skip};

/// A run of a job under the lease `name`, configured step by step and then
/// [run](Job::run) (or [acquired](Job::acquire)). Made by [`Lease::job`].
///
/// It offers everything `#[singleton]` does (the attribute expands to it):
///
/// - [`min_hold`](Job::min_hold): keep the lease at least this long after
///   acquiring it, even if the job finishes sooner (so that a fast job does
///   not run twice in one tick across replicas);
/// - [`max_hold`](Job::max_hold): a ceiling on renewal — that long after
///   acquiring it, the token is cancelled and the lease released, whether or
///   not the job has stopped;
/// - [`wait`](Job::wait): wait up to this long for the lease instead of
///   skipping at once;
/// - the fencing token, handed to the job next to its cancellation token.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lease::{backend::Memory, Lease, Outcome};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let lease = Lease::new(Memory::new());
/// let outcome = lease
///     .job("nightly-report", Duration::from_secs(90))
///     .min_hold(Duration::from_secs(30))
///     .max_hold(Duration::from_secs(600))
///     .wait(Duration::from_secs(5))
///     .run(|token, fencing_token| async move {
///         // pass `fencing_token` to the resource the report is written to
///         assert!(!token.is_cancelled());
///         fencing_token
///     })
///     .await;
/// assert!(matches!(outcome, Outcome::Ran(Some(1))));
/// # }
/// ```
#[must_use = "a Job does nothing until it is run or acquired"]
#[derive(Debug, Clone)]
pub struct Job<'a> {
    lease: &'a Lease,
    name: &'a str,
    ttl: Duration,
    min_hold: Option<Duration>,
    max_hold: Option<Duration>,
    wait: Duration,
}

impl Lease {
    /// A run of a job under the lease `name` with time-to-live `ttl`, to be
    /// configured ([`min_hold`](Job::min_hold), [`max_hold`](Job::max_hold),
    /// [`wait`](Job::wait)) and then [run](Job::run).
    pub fn job<'a>(&'a self, name: &'a str, ttl: Duration) -> Job<'a> {
        Job {
            lease: self,
            name,
            ttl,
            min_hold: None,
            max_hold: None,
            wait: Duration::ZERO,
        }
    }
}

impl<'a> Job<'a> {
    /// Keep the lease (renewed) until at least `min_hold` after it was
    /// acquired, even if the job returns sooner; the lease is then released
    /// in the background and [`run`](Job::run) returns at once. A panic or a
    /// dropped run releases at once. Values over 24 h count as 24 h.
    pub fn min_hold(self, min_hold: Duration) -> Self {
        Self {
            min_hold: Some(min_hold),
            ..self
        }
    }

    /// A ceiling on renewal: `max_hold` after the lease was acquired, the
    /// token is cancelled and the lease released — at once, whether or not
    /// the job stops (a hung job cannot keep a lease for ever; one that
    /// ignores its token is then no longer protected). Counted in
    /// `lease_lost_total` with the reason `max_hold`.
    pub fn max_hold(self, max_hold: Duration) -> Self {
        Self {
            max_hold: Some(max_hold),
            ..self
        }
    }

    /// Wait up to `wait` for another holder to let the lease go, as
    /// [`Lease::acquire`] does, instead of skipping at once.
    pub fn wait(self, wait: Duration) -> Self {
        Self { wait, ..self }
    }

    /// Acquire the lease (waiting as configured) and hand it out; `max_hold`
    /// applies, `min_hold` does not (release the guard when you like).
    ///
    /// # Errors
    ///
    /// As [`Lease::acquire`].
    pub async fn acquire(self) -> Result<Option<LeaseGuard>, Error> {
        self.lease
            .wait_for(self.name, self.ttl, self.wait, self.max_hold)
            .await
    }

    /// Acquire the lease (waiting as configured); if acquired, run `f` with
    /// the lease's cancellation token and fencing token, renewing the lease
    /// while `f` runs, then release it (or keep it until `min_hold`).
    ///
    /// As [`Lease::with_lease`]: `Ran(value)` if `f` ran;
    /// `Skipped(HeldElsewhere)` (logged at debug) or `Skipped(Error(e))`
    /// (logged at warn) if not. The lease is released when `f` returns, when
    /// `f` panics (in the background; the panic continues), and when this
    /// future is dropped while `f` runs (in the background).
    pub async fn run<F, Fut, T>(self, f: F) -> Outcome<T>
    where
        F: FnOnce(CancellationToken, Option<u64>) -> Fut,
        Fut: Future<Output = T>,
    {
        let (name, holder) = (self.name, self.lease.holder());
        let guard = match self.clone().acquire().await {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                tracing::debug!(lease.name = name, holder, "skipped: lease held elsewhere");
                return Outcome::Skipped(Skip::HeldElsewhere);
            }
            Err(error) => {
                tracing::warn!(lease.name = name, holder, error = %error.chain(), "skipped: could not acquire lease");
                return Outcome::Skipped(Skip::Error(error));
            }
        };
        let span = tracing::info_span!(
            "lease",
            lease.name = name,
            holder,
            fencing_token = guard.fencing_token()
        );
        let value = f(guard.token(), guard.fencing_token())
            .instrument(span)
            .await;
        match self.min_hold {
            Some(min_hold) => {
                // Clamp rather than overflow `Instant`.
                let at = guard.acquired_at() + min_hold.min(crate::MAX_TTL);
                guard.release_at(at);
            }
            None => {
                if let Err(error) = guard.release().await {
                    tracing::warn!(lease.name = name, holder, error = %error.chain(), "lease release failed; it ends at its ttl");
                }
            }
        }
        Outcome::Ran(value)
    }
}
