//! The runtime side of `#[singleton]`. Not public API: only the macro's
//! expansion calls it, and it may change in any release.
//!
//! An annotated fn's body becomes one call:
//!
//! ```text
//! let lease = AsLease::as_lease(&(<lease expr>));   // or global()
//! run(lease, "<name>", <ttl ms>, <min_hold ms>, move |token, fence| async move { <body> }).await
//! ```

use std::future::Future;
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use crate::{CancellationToken, Lease, Outcome, Skippable};

/// Run `f` under the lease `name`, as [`Lease::with_lease`] does, and return
/// its value — or [`Skippable::skipped`] when the run is skipped.
///
/// - `lease` is `None` (no `lease = ...` and no global default): skipped,
///   logged at error. Never a panic.
/// - Held elsewhere: skipped, logged at debug. Acquisition failed (backend
///   error, invalid name or ttl): skipped, logged at warn.
/// - Otherwise `f` runs with the lease's token and fencing token. Then the
///   lease is released; with `min_hold_ms` it is kept (and renewed) until
///   that long after the acquisition and released in the background, while
///   this returns at once.
pub async fn run<T, F, Fut>(
    lease: Option<Lease>,
    name: &'static str,
    ttl_ms: u64,
    min_hold_ms: Option<u64>,
    f: F,
) -> T
where
    T: Skippable,
    F: FnOnce(CancellationToken, Option<u64>) -> Fut,
    Fut: Future<Output = T>,
{
    let Some(lease) = lease else {
        tracing::error!(
            lease.name = name,
            "skipped: no lease to run on; call `lease::set_global_default` at start-up \
             or pass `lease = ...` to `#[singleton]`"
        );
        return T::skipped();
    };
    let mut job = lease.job(name, Duration::from_millis(ttl_ms));
    if let Some(ms) = min_hold_ms {
        job = job.min_hold(Duration::from_millis(ms));
    }
    match job.run(f).await {
        Outcome::Ran(value) => value,
        Outcome::Skipped(_) => T::skipped(), // logged by `Job::run`
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
    note = "pass the `lease::Lease` to run on, e.g. `lease = self.lease`, or leave `lease` out to use `lease::global_default()`"
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
