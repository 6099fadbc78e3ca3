//! The runtime side of `#[singleton]`. Not public API: only the macro's
//! expansion calls it, and it may change in any release.
//!
//! An annotated fn's body becomes one call:
//!
//! ```text
//! let lease = AsLease::as_lease(&(<lease expr>));   // or global()
//! run(lease, Settings { name, ttl, min_hold, max_hold, grace, wait, once_per, retry_failed }, move |token, fence| async move { <body> }).await
//! ```
//!
//! (`run_or_err` instead of `run` with `on_error = "return"`). The
//! settings' expressions are evaluated in the fn, before the body takes its
//! captures; literals arrive checked already (at compile time), expressions
//! are checked here, by the same rules.

use std::borrow::Cow;
use std::future::Future;
use std::rc::Rc;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use crate::{CancellationToken, Error, Lease, Outcome, Skip, Skippable, validate};

/// The attribute's arguments, as evaluated at this call.
#[derive(Debug, Clone, Copy)]
pub struct Settings<'a> {
    /// `name`: a literal, or the value of the expression (checked by the
    /// engine: an invalid one is [`Error::InvalidName`]).
    pub name: &'a str,
    /// `ttl` (an invalid one is [`Error::InvalidTtl`]).
    pub ttl: Duration,
    /// `min_hold`, if given.
    pub min_hold: Option<Duration>,
    /// `max_hold`, if given.
    pub max_hold: Option<Duration>,
    /// `grace`, if given (checked by the engine against the ttl: an
    /// invalid one is [`Error::InvalidGrace`]).
    pub grace: Option<Duration>,
    /// `wait`, if given.
    pub wait: Option<Duration>,
    /// `once_per`, if given (checked with the name and ttl, before the
    /// backend is called: an invalid one is [`Error::InvalidDuration`]).
    pub once_per: Option<Duration>,
    /// `retry_failed = true`: with `once_per`, the slot is recorded only
    /// when the body succeeds ([`Skippable::succeeded`]).
    pub retry_failed: bool,
}

impl Settings<'_> {
    /// The rules a literal is checked against at compile time, for values
    /// that were expressions. Name and ttl are the engine's to check.
    fn check(&self) -> Result<(), Error> {
        let holds = [
            ("min_hold", self.min_hold),
            ("max_hold", self.max_hold),
            ("wait", self.wait),
        ];
        for (argument, duration) in holds {
            if let Some(duration) = duration {
                validate::hold(argument, duration)?;
            }
        }
        Ok(())
    }
}

/// Run `f` under the lease `settings.name`, as [`Lease::job`] does, and
/// return its value — or [`Skippable::skipped`] when the run is skipped.
///
/// - `lease` is `None` (no `lease = ...` and no global default): skipped,
///   with [`Error::NoLease`], logged at error the first time for each name
///   (at debug after that). Never a panic.
/// - Held elsewhere, or (with `once_per`) the schedule slot ran already:
///   skipped, logged at debug. Acquisition failed (backend error, invalid
///   name, ttl or duration): skipped, logged at warn.
/// - Otherwise `f` runs with the lease's token and fencing token (after
///   waiting up to `wait` for the lease), then the lease is released, as
///   with [`Job::min_hold`](crate::Job::min_hold) and
///   [`Job::max_hold`](crate::Job::max_hold).
pub async fn run<T, F, Fut>(lease: Option<Lease>, settings: Settings<'_>, f: F) -> T
where
    T: Skippable,
    F: FnOnce(CancellationToken, Option<u64>) -> Fut,
    Fut: Future<Output = T>,
{
    match attempt(lease, settings, f).await {
        Ok(value) => value,
        Err(_) => T::skipped(), // logged
    }
}

/// [`run`] for `on_error = "return"`: an acquisition error (not "held
/// elsewhere", not "the slot ran already") comes back as
/// `Err(error.into())` instead of the skipped value. It is logged as in
/// `run`.
pub async fn run_or_err<T, F, Fut>(lease: Option<Lease>, settings: Settings<'_>, f: F) -> T
where
    T: Skippable + ReturnsError,
    F: FnOnce(CancellationToken, Option<u64>) -> Fut,
    Fut: Future<Output = T>,
{
    match attempt(lease, settings, f).await {
        Ok(value) => value,
        Err(Skip::Error(error)) => T::from_lease_error(error),
        Err(_) => T::skipped(),
    }
}

/// `Ok` with `f`'s value if it ran; why not otherwise (logged).
async fn attempt<T, F, Fut>(lease: Option<Lease>, settings: Settings<'_>, f: F) -> Result<T, Skip>
where
    T: Skippable,
    F: FnOnce(CancellationToken, Option<u64>) -> Fut,
    Fut: Future<Output = T>,
{
    let name = settings.name;
    let Some(lease) = lease else {
        // At error the first time for each name, so that a misconfigured
        // job is seen in the logs; then at debug, not at every tick.
        if first_without_lease(name) {
            tracing::error!(
                lease.name = name,
                "skipped: no lease to run on; call `leasehold::set_global_default` at start-up \
                 or pass `lease = ...` to `#[singleton]` (reported once per name)"
            );
        } else {
            tracing::debug!(lease.name = name, "skipped: no lease to run on");
        }
        return Err(Skip::Error(Error::NoLease));
    };
    if let Err(error) = settings.check() {
        tracing::warn!(lease.name = name, holder = lease.holder(), error = %error.chain(), "skipped: could not acquire lease");
        return Err(Skip::Error(error));
    }
    let mut job = lease.job(name, settings.ttl);
    if let Some(min_hold) = settings.min_hold {
        job = job.min_hold(min_hold);
    }
    if let Some(max_hold) = settings.max_hold {
        job = job.max_hold(max_hold);
    }
    if let Some(grace) = settings.grace {
        job = job.grace(grace);
    }
    if let Some(wait) = settings.wait {
        job = job.wait(wait);
    }
    if let Some(period) = settings.once_per {
        job = job.once_per(period);
        if settings.retry_failed {
            job = job.retry_failed();
        }
    }
    match job.run_judged(f, T::succeeded).await {
        Outcome::Ran(value) => Ok(value),
        Outcome::Skipped(skip) => Err(skip), // logged by `Job::run_judged`
    }
}

/// Whether this is the first call for `name` that found no lease to run on.
fn first_without_lease(name: &str) -> bool {
    static REPORTED: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut reported = REPORTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    reported.insert(name.to_owned())
}

/// What `on_error = "return"` needs of the fn's return type: a way to carry
/// a [`leasehold::Error`](Error) — `Result<_, E>` with `E: From<leasehold::Error>`.
#[diagnostic::on_unimplemented(
    message = "`on_error = \"return\"` cannot return a `leasehold::Error` from a fn that returns `{Self}`",
    label = "`{Self}` cannot carry a `leasehold::Error`",
    note = "return `Result<(), E>` or `Result<Option<T>, E>` where `E: From<leasehold::Error>` \
            (e.g. `anyhow::Error`, or an error enum with a `#[from] leasehold::Error` variant), \
            or leave out `on_error` to skip the run on an acquisition error"
)]
pub trait ReturnsError {
    /// `Err(error.into())`.
    fn from_lease_error(error: Error) -> Self;
}

impl<T, E: From<Error>> ReturnsError for Result<T, E> {
    fn from_lease_error(error: Error) -> Self {
        Err(error.into())
    }
}

/// What `name = <expression>` accepts: anything that reads as a string.
///
/// The macro evaluates `AsName::as_name(&(expr))` before the body takes its
/// captures, so `name = self.name` works for `&self`, `&mut self` and
/// `self: Arc<Self>` alike (the name is copied).
#[diagnostic::on_unimplemented(
    message = "`name = ...` must be a string, not `{Self}`",
    label = "expected `&str`, `String` or `Cow<str>`",
    note = "pass the lease's name, e.g. `name = \"nightly-report\"`, `name = JOB_NAME` \
            or `name = format!(\"report-{{tenant}}\")`"
)]
pub trait AsName {
    /// The name, copied.
    fn as_name(&self) -> String;
}

impl AsName for str {
    fn as_name(&self) -> String {
        self.to_owned()
    }
}

impl AsName for String {
    fn as_name(&self) -> String {
        self.clone()
    }
}

impl AsName for Cow<'_, str> {
    fn as_name(&self) -> String {
        (**self).to_owned()
    }
}

impl AsName for Box<str> {
    fn as_name(&self) -> String {
        (**self).to_owned()
    }
}

impl AsName for Arc<str> {
    fn as_name(&self) -> String {
        (**self).to_owned()
    }
}

impl AsName for Rc<str> {
    fn as_name(&self) -> String {
        (**self).to_owned()
    }
}

impl<N: AsName + ?Sized> AsName for &N {
    fn as_name(&self) -> String {
        (**self).as_name()
    }
}

impl<N: AsName + ?Sized> AsName for &mut N {
    fn as_name(&self) -> String {
        (**self).as_name()
    }
}

/// The default lease of `#[singleton]` without `lease = ...`.
pub fn global() -> Option<Lease> {
    crate::global_default().cloned()
}

/// What `lease = ...` accepts: anything that leads to a [`Lease`].
///
/// The macro evaluates `AsLease::as_lease(&(expr))` before the body takes its
/// captures, so `lease = self.lease` works for `&self`, `&mut self` and
/// `self: Arc<Self>` alike; the clone it makes is cheap (an `Arc`).
#[diagnostic::on_unimplemented(
    message = "`lease = ...` must be a `Lease`, not `{Self}`",
    label = "expected `Lease`, `&Lease`, `Arc<Lease>`, `LazyLock<Lease>` or `Option<&Lease>`",
    note = "pass the `leasehold::Lease` to run on, e.g. `lease = self.lease`, or leave `lease` out to use `leasehold::global_default()`"
)]
pub trait AsLease {
    /// The lease to run on, cloned; `None` when there is none.
    fn as_lease(&self) -> Option<Lease>;
}

impl AsLease for Lease {
    fn as_lease(&self) -> Option<Lease> {
        Some(self.clone())
    }
}

impl<L: AsLease + ?Sized> AsLease for &L {
    fn as_lease(&self) -> Option<Lease> {
        (**self).as_lease()
    }
}

impl<L: AsLease + ?Sized> AsLease for &mut L {
    fn as_lease(&self) -> Option<Lease> {
        (**self).as_lease()
    }
}

impl<L: AsLease + ?Sized> AsLease for Arc<L> {
    fn as_lease(&self) -> Option<Lease> {
        (**self).as_lease()
    }
}

impl<L: AsLease + ?Sized> AsLease for Box<L> {
    fn as_lease(&self) -> Option<Lease> {
        (**self).as_lease()
    }
}

impl<L: AsLease, F: FnOnce() -> L> AsLease for LazyLock<L, F> {
    fn as_lease(&self) -> Option<Lease> {
        (**self).as_lease()
    }
}

impl<L: AsLease> AsLease for OnceLock<L> {
    fn as_lease(&self) -> Option<Lease> {
        self.get().and_then(AsLease::as_lease)
    }
}

impl<L: AsLease> AsLease for Option<L> {
    fn as_lease(&self) -> Option<Lease> {
        self.as_ref().and_then(AsLease::as_lease)
    }
}

#[cfg(test)]
mod tests;
