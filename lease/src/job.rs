//! [`Job`]: one run (or acquisition) under a lease, configured — everything
//! `#[singleton]` can say, without the macro.

use std::future::Future;
use std::time::Duration;

use tracing::Instrument;

use crate::backend::OncePer;
use crate::engine::JobOptions;
use crate::{CancellationToken, Error, Lease, LeaseGuard, Outcome, Skip};

/// A run of a job under the lease `name`, configured step by step and then
/// [run](Job::run) (or [acquired](Job::acquire)). Made by [`Lease::job`].
///
/// It offers everything `#[singleton]` does (the attribute expands to it):
/// [`min_hold`](Job::min_hold), [`max_hold`](Job::max_hold),
/// [`grace`](Job::grace), [`wait`](Job::wait), [`once_per`](Job::once_per)
/// with [`retry_failed`](Job::retry_failed), and the fencing token, handed
/// to the job next to its cancellation token.
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
    options: JobOptions,
    wait: Duration,
    /// [`retry_failed`](Job::retry_failed) was asked (before or after `once_per`).
    retry_failed: bool,
}

impl Lease {
    /// A run of a job under the lease `name` with time-to-live `ttl`, to be
    /// configured ([`min_hold`](Job::min_hold), [`max_hold`](Job::max_hold),
    /// [`grace`](Job::grace), [`wait`](Job::wait)) and then [run](Job::run).
    pub fn job<'a>(&'a self, name: &'a str, ttl: Duration) -> Job<'a> {
        Job {
            lease: self,
            name,
            ttl,
            min_hold: None,
            options: JobOptions::default(),
            wait: Duration::ZERO,
            retry_failed: false,
        }
    }
}

impl<'a> Job<'a> {
    /// Keep the lease (renewed) until at least `min_hold` after it was
    /// acquired, even if the job returns sooner; the lease is then released
    /// in the background and [`run`](Job::run) returns at once. A panic or a
    /// dropped run releases at once. Values over 24 h count as 24 h.
    ///
    /// [`Lease::shutdown`] does not release a lease kept for its `min_hold`:
    /// it stops renewing it and leaves it to expire on the server, so it
    /// then lasts at most a ttl more (and at least until the server's
    /// expiry, whether or not `min_hold` is over by then).
    pub fn min_hold(self, min_hold: Duration) -> Self {
        Self {
            min_hold: Some(min_hold),
            ..self
        }
    }

    /// A ceiling on renewal: `max_hold` after the lease was acquired, the
    /// token is cancelled, and then the lease ends as at a
    /// [`Lease::shutdown`] (renewed for up to the [`grace`](Job::grace)
    /// while the job winds down, released when it returns, else left to
    /// expire). So a hung job keeps the lease at most `max_hold + grace +
    /// ttl`. Counted in `lease_lost_total` with the reason `max_hold`.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.options.max_hold = Some(max_hold);
        self
    }

    /// How long before the lease could pass to another holder its token
    /// fires (and [`LeaseGuard::is_valid`] turns false) when renewals fail:
    /// at `t_send + ttl - grace` after the last successful request. The
    /// default is `ttl/3`: failed renewals are retried for one renewal
    /// period (`ttl/3`), then the job has a third of the ttl to stop —
    /// enough too for a local clock running up to 1.5× slow. A definite
    /// loss (the backend says the lease is no longer ours) fires the token
    /// at once, whatever the grace.
    ///
    /// A grace is from the margin (`ttl/100 + 2 ms`, the least) to `ttl/2`;
    /// a larger grace leaves less time to retry renewals in.
    ///
    /// # Errors
    ///
    /// [`run`](Job::run) is skipped with, and [`acquire`](Job::acquire)
    /// returns, [`Error::InvalidGrace`] for a grace outside that range.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.options.grace = Some(grace);
        self
    }

    /// Run at most once per schedule slot of `period` across every
    /// replica: the run claims the slot `floor(clock / period)` — by
    /// the backend's clock where it has one (PostgreSQL, MySQL/MariaDB,
    /// SQLite, Redis), else this process's (etcd, `Memory`) — in the
    /// acquisition's own statement. A slot at or below the last one claimed
    /// for the name is refused: [`run`](Job::run) is skipped with
    /// [`Skip::AlreadyRan`], [`acquire`](Job::acquire) returns
    /// [`Error::AlreadyRan`]. So replicas whose ticks or clocks drift never
    /// run one slot twice; skew only shifts a run in time.
    ///
    /// By default the slot is claimed at acquisition: at most one run per
    /// slot, even if that run fails or its replica crashes mid-run. With
    /// [`retry_failed`](Job::retry_failed) it is recorded only when the run
    /// succeeds. The claim outlives release and expiry. Slots nobody
    /// claimed are logged at warn and counted (`lease_slots_missed_total`).
    /// [`LeaseGuard::slot`] is the claimed slot, a natural idempotency key.
    ///
    /// Unlike [`min_hold`](Job::min_hold), which keeps the lease a guessed
    /// while so that later ticks find it held, a slot is never run twice
    /// however late another replica's tick comes.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidDuration`] for a period that is not whole
    /// milliseconds from 1 ms to 366 days; [`Error::Unsupported`] on a
    /// backend without a slot ledger (plain `PgAdvisory`); `Error::Schema`
    /// on a lease table without the `last_slot` column (it names the
    /// `ALTER TABLE` that adds it).
    pub fn once_per(mut self, period: Duration) -> Self {
        self.options.once_per = Some(OncePer::new(period).retry_failed(self.retry_failed));
        self
    }

    /// With [`once_per`](Job::once_per): record the slot only when the run
    /// succeeds — [`run`](Job::run)'s body returns, [`try_run`](Job::try_run)'s
    /// returns `Ok` — in the release's statement, so that a failed or
    /// crashed run may run again within its slot, on any replica.
    /// (Without `once_per` it changes nothing.)
    pub fn retry_failed(mut self) -> Self {
        if let Some(once_per) = &mut self.options.once_per {
            *once_per = once_per.retry_failed(true);
        }
        self.retry_failed = true;
        self
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
            .wait_for(self.name, self.ttl, self.wait, &self.options)
            .await
    }

    /// Acquire the lease (waiting as configured); if acquired, run `f` with
    /// the lease's cancellation token and fencing token, renewing the lease
    /// while `f` runs, then release it (or keep it until `min_hold`).
    ///
    /// As [`Lease::with_lease`]: `Ran(value)` if `f` ran;
    /// `Skipped(HeldElsewhere)` (logged at debug), `Skipped(AlreadyRan)`
    /// ([`once_per`](Job::once_per), logged at debug) or `Skipped(Error(e))`
    /// (logged at warn) if not; released as there (also on a panic or a
    /// drop). With [`retry_failed`](Job::retry_failed), `f` returning is its
    /// success.
    pub async fn run<F, Fut, T>(self, f: F) -> Outcome<T>
    where
        F: FnOnce(CancellationToken, Option<u64>) -> Fut,
        Fut: Future<Output = T>,
    {
        self.run_judged(f, |_| true).await
    }

    /// [`run`](Job::run) for a fallible job: with
    /// [`retry_failed`](Job::retry_failed), only `Ok` is a success (an `Err`
    /// leaves the slot to be run again). Otherwise the same as `run`.
    pub async fn try_run<F, Fut, T, E>(self, f: F) -> Outcome<Result<T, E>>
    where
        F: FnOnce(CancellationToken, Option<u64>) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_judged(f, Result::is_ok).await
    }

    /// [`run`](Job::run), with `succeeded` telling whether the body's
    /// value is a success (what `retry_failed` records).
    pub(crate) async fn run_judged<F, Fut, T>(
        self,
        f: F,
        succeeded: impl FnOnce(&T) -> bool,
    ) -> Outcome<T>
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
            Err(Error::AlreadyRan { slot, .. }) => {
                tracing::debug!(
                    lease.name = name,
                    holder,
                    slot,
                    "skipped: this schedule slot has run already"
                );
                return Outcome::Skipped(Skip::AlreadyRan { slot });
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
        if succeeded(&value) {
            guard.succeeded();
        }
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
