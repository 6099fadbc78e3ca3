//! The extension point: where leases are stored.
//!
//! A [`Backend`] stores one row (or key, or lock) per lease name and answers
//! three questions atomically: may `holder` take `name` now ([`acquire`]),
//! does `holder` still hold it ([`renew`]), and give it up ([`release`]).
//! Everything else — the renewal schedule, deadlines, cancellation, logging —
//! lives in the engine behind [`Lease`](crate::Lease), so a backend stays small.
//!
//! | type | feature | expiry decided by | fencing token | what ends a lease |
//! |---|---|---|---|---|
//! | [`Memory`] | always | tokio's clock | per-name counter | ttl, release |
//! | `SqliteTable` | `sqlite` | the host clock, in SQL | `fence` column | ttl, release |
//! | `PgTable` | `postgres` | PostgreSQL `clock_timestamp()` | `fence` column | ttl, release |
//! | `MySqlTable` | `mysql` | MySQL `UTC_TIMESTAMP(6)` | `fence` column | ttl, release |
//! | `PgAdvisory` | `postgres` | nothing: no expiry, ttl sets the heartbeat | none | the session's end, release |
//! | `Redis` | `redis` | Redis `PX` | `INCR` of a companion key | ttl, release |
//!
//! [`acquire`]: Backend::acquire
//! [`renew`]: Backend::renew
//! [`release`]: Backend::release

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::Error;

mod memory;
pub use memory::Memory;

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
mod sqlite;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteTable;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
mod postgres;
#[cfg(feature = "postgres")]
pub use postgres::PgTable;

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
mod mysql;
#[cfg(feature = "mysql")]
pub use mysql::MySqlTable;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod sql;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
mod pg_advisory;
#[cfg(feature = "postgres")]
pub use pg_advisory::PgAdvisory;

#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
mod redis;
#[cfg(feature = "redis")]
pub use self::redis::Redis;

/// Storage for leases: one record per name, with a holder, an expiry and a
/// fencing counter.
///
/// Implementations must be atomic per call: two concurrent `acquire`s of one
/// name by different holders may not both return `Ok(Some(_))` while the first
/// grant is unexpired. Expiry should be computed by the storage's own clock
/// (the server's), never by the caller's.
///
/// The engine validates names (1..=255 bytes), holders (1..=255 bytes) and ttls
/// (10 ms..=24 h, whole milliseconds) before calling a backend, and applies its
/// own timeouts; a backend need not repeat either.
///
/// # Examples
///
/// A backend that stores nothing and grants every request — to show the shape
/// only (it breaks mutual exclusion, so never use it):
///
/// ```
/// use std::time::Duration;
/// use lease::{Backend, Error, Grant};
///
/// struct GrantAll;
///
/// impl Backend for GrantAll {
///     async fn acquire(&self, _name: &str, _holder: &str, _ttl: Duration) -> Result<Option<Grant>, Error> {
///         Ok(Some(Grant::new(None)))
///     }
///     async fn renew(&self, _name: &str, _holder: &str, _ttl: Duration) -> Result<bool, Error> {
///         Ok(true)
///     }
///     async fn release(&self, _name: &str, _holder: &str) -> Result<(), Error> {
///         Ok(())
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let lease = lease::Lease::new(GrantAll);
/// let guard = lease.try_acquire("job", Duration::from_secs(1)).await.unwrap().unwrap();
/// assert_eq!(guard.fencing_token(), None);
/// guard.release().await.unwrap();
/// # }
/// ```
pub trait Backend: Send + Sync + 'static {
    /// Claim `name` for `holder` until storage-now + `ttl`.
    ///
    /// Returns `Ok(Some(grant))` iff the caller now holds the lease: there was
    /// no record, it had expired or been released, or it is already held by
    /// the same `holder` (an idempotent re-acquire, which extends the expiry
    /// and keeps the fencing token). `Ok(None)` means another holder has an
    /// unexpired lease.
    ///
    /// # Errors
    ///
    /// `Err` only when the backend could not tell (network, timeout, server error).
    fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Grant>, Error>> + Send;

    /// Extend the lease to storage-now + `ttl` iff `holder` still holds an
    /// unexpired lease on `name`. Never creates a record.
    ///
    /// `Ok(false)` means the lease is definitely lost (expired, released or
    /// taken over).
    ///
    /// # Errors
    ///
    /// `Err` means the backend could not tell; the engine retries until the
    /// lease's local deadline.
    fn renew(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Give the lease up iff `holder` holds it; a no-op otherwise.
    ///
    /// Table backends expire the record instead of deleting it, so the fencing
    /// counter never restarts.
    ///
    /// # Errors
    ///
    /// `Err` when the backend could not be reached; the lease then ends at its expiry.
    fn release(&self, name: &str, holder: &str) -> impl Future<Output = Result<(), Error>> + Send;

    /// Renew several leases of one holder, in as few round trips as the
    /// backend allows. `Ok(v)` has one entry per lease, in order, with the
    /// meaning of [`renew`](Backend::renew)'s `Ok`.
    ///
    /// The default issues one [`renew`](Backend::renew) per lease,
    /// concurrently; backends that can batch override it.
    ///
    /// # Errors
    ///
    /// `Err` when the outcome of the batch is unknown; every lease in it is
    /// then retried.
    fn renew_many(
        &self,
        holder: &str,
        leases: &[(&str, Duration)],
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send {
        async move {
            let calls = leases
                .iter()
                .map(|&(name, ttl)| self.renew(name, holder, ttl));
            futures_util::future::join_all(calls)
                .await
                .into_iter()
                .collect()
        }
    }
}

/// What a successful [`Backend::acquire`] hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grant {
    /// The fencing token of this acquisition: larger than that of every
    /// earlier acquisition of the same name, unchanged by an idempotent
    /// re-acquire. `None` when the backend cannot provide one.
    pub fencing_token: Option<u64>,
}

impl Grant {
    /// A grant with the given fencing token (`None` if the backend has none).
    pub fn new(fencing_token: Option<u64>) -> Self {
        Self { fencing_token }
    }
}

impl<B: Backend> Backend for Arc<B> {
    fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Grant>, Error>> + Send {
        B::acquire(self, name, holder, ttl)
    }

    fn renew(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        B::renew(self, name, holder, ttl)
    }

    fn release(&self, name: &str, holder: &str) -> impl Future<Output = Result<(), Error>> + Send {
        B::release(self, name, holder)
    }

    fn renew_many(
        &self,
        holder: &str,
        leases: &[(&str, Duration)],
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send {
        B::renew_many(self, holder, leases)
    }
}

/// Object-safe mirror of [`Backend`], so that [`Lease`](crate::Lease) need not be generic.
pub(crate) trait DynBackend: Send + Sync + 'static {
    fn acquire<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<Grant>, Error>>;
    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    fn release<'a>(&'a self, name: &'a str, holder: &'a str) -> BoxFuture<'a, Result<(), Error>>;
    fn renew_many<'a>(
        &'a self,
        holder: &'a str,
        leases: &'a [(&'a str, Duration)],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>>;
}

impl<B: Backend> DynBackend for B {
    fn acquire<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<Grant>, Error>> {
        Box::pin(Backend::acquire(self, name, holder, ttl))
    }

    fn renew<'a>(
        &'a self,
        name: &'a str,
        holder: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Backend::renew(self, name, holder, ttl))
    }

    fn release<'a>(&'a self, name: &'a str, holder: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Backend::release(self, name, holder))
    }

    fn renew_many<'a>(
        &'a self,
        holder: &'a str,
        leases: &'a [(&'a str, Duration)],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        Box::pin(Backend::renew_many(self, holder, leases))
    }
}
