//! The extension point: where leases are stored.
//!
//! A [`Backend`] stores one row (or key, or lock) per lease name and answers
//! three questions atomically: may `holder` take `name` now ([`acquire`]),
//! is this acquisition still the current one ([`renew`]), and give it up
//! ([`release`]).
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
//! | `Etcd` | `etcd` | an etcd lease (whole seconds) | the key's `create_revision` | ttl, release, lease revocation |
//!
//! A waiter ([`Lease::acquire`](crate::Lease::acquire) with a wait, an
//! [`Election`](crate::Election)) learns of a release by the server's push
//! where it can ([`released`](Backend::released)): `PgTable` and
//! `PgAdvisory` by `LISTEN/NOTIFY`, `Redis` by `PUBLISH` (given a client
//! for the subscription); the others, and every backend for a lease that
//! expired, by polling.
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

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
mod table;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub use table::{Dialect, Table};
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub use table::{MySqlDialect, MySqlTable};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use table::{PgDialect, PgTable};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use table::{SqliteDialect, SqliteTable};

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
mod pg_advisory;
#[cfg(feature = "postgres")]
pub use pg_advisory::PgAdvisory;

#[cfg(any(feature = "postgres", feature = "redis"))]
mod push;

#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
mod etcd;
#[cfg(feature = "etcd")]
pub use etcd::Etcd;

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
/// Renewals and releases concern one *acquisition* ([`Acquisition`]: the
/// name, the holder and the fencing token of the grant). A backend with
/// fencing tokens matches all three, so that a request of an older
/// acquisition — a release the network delivered late, a renewal still in
/// flight — can never extend or end a newer acquisition of the same name,
/// even by the same holder. A backend without fencing tokens matches name
/// and holder.
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
/// use lease::{Acquisition, Backend, Error, Grant};
///
/// struct GrantAll;
///
/// impl Backend for GrantAll {
///     async fn acquire(&self, _name: &str, _holder: &str, _ttl: Duration) -> Result<Option<Grant>, Error> {
///         Ok(Some(Grant::new(None)))
///     }
///     async fn renew(&self, _lease: Acquisition<'_>, _ttl: Duration) -> Result<bool, Error> {
///         Ok(true)
///     }
///     async fn release(&self, _lease: Acquisition<'_>) -> Result<(), Error> {
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

    /// Extend the lease to storage-now + `ttl` iff `lease` is still the
    /// current, unexpired acquisition of its name (same holder and, where
    /// the backend has them, same fencing token). Never creates a record,
    /// and never brings back a lease that was released or has expired.
    ///
    /// `Ok(false)` means the lease is definitely lost (expired, released or
    /// taken over, or superseded by a newer acquisition).
    ///
    /// # Errors
    ///
    /// `Err` means the backend could not tell; the engine retries until the
    /// lease's local deadline.
    fn renew(
        &self,
        lease: Acquisition<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send;

    /// Give the lease up iff `lease` is still the current acquisition of its
    /// name; a no-op otherwise (also when it arrives after a newer
    /// acquisition, by anyone).
    ///
    /// Table backends expire the record instead of deleting it, so the fencing
    /// counter never restarts.
    ///
    /// # Errors
    ///
    /// `Err` when the backend could not be reached; the lease then ends at its expiry.
    fn release(&self, lease: Acquisition<'_>) -> impl Future<Output = Result<(), Error>> + Send;

    /// Renew several leases, in as few round trips as the backend allows.
    /// `Ok(v)` has one entry per lease, in order, with the meaning of
    /// [`renew`](Backend::renew)'s `Ok`.
    ///
    /// The default issues one [`renew`](Backend::renew) per lease,
    /// concurrently; backends that can batch override it. The engine sends
    /// the leases of one holder, at most [`MAX_BATCH`] per call.
    ///
    /// # Errors
    ///
    /// `Err` when the outcome of the batch is unknown; every lease in it is
    /// then retried.
    fn renew_many(
        &self,
        leases: &[(Acquisition<'_>, Duration)],
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send {
        async move {
            let calls = leases.iter().map(|&(lease, ttl)| self.renew(lease, ttl));
            futures_util::future::join_all(calls)
                .await
                .into_iter()
                .collect()
        }
    }

    /// What the backend knows about `name`: `Ok(None)` if it has no record
    /// of it at all.
    ///
    /// The default answers [`Error::Unsupported`]; backends that can tell
    /// who holds a lease override it. Used for
    /// [`Leadership::Following`](crate::Leadership::Following) and by
    /// operators.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`], or the backend's error when it cannot be asked.
    fn inspect(&self, name: &str) -> impl Future<Output = Result<Option<LeaseInfo>, Error>> + Send {
        let _ = name;
        async {
            Err(Error::Unsupported {
                operation: "inspect",
            })
        }
    }

    /// Every lease the backend has a record of, held or not, for operators
    /// (`lease list`): each as [`inspect`](Backend::inspect) would answer
    /// it. The order is the backend's (the table backends sort by name).
    ///
    /// The default answers [`Error::Unsupported`]; see each backend for
    /// what it can list.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`], or the backend's error when it cannot be asked.
    fn list(&self) -> impl Future<Output = Result<Vec<LeaseInfo>, Error>> + Send {
        async { Err(Error::Unsupported { operation: "list" }) }
    }

    /// End the lease on `name` now, whoever holds it — for an operator
    /// whose job is stuck (`lease release --force`). `Ok(true)` if a live
    /// lease was ended, `Ok(false)` if `name` was not held.
    ///
    /// The fencing counter is kept: the next acquisition gets a larger
    /// fencing token than the evicted one. The evicted holder is not told
    /// at once: its next renewal finds the lease gone, and its token is
    /// cancelled then (within `ttl/3` of the eviction).
    ///
    /// The default answers [`Error::Unsupported`].
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`], or the backend's error when it cannot be asked.
    fn force_release(&self, name: &str) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = name;
        async {
            Err(Error::Unsupported {
                operation: "force_release",
            })
        }
    }

    /// A hint for a waiter ([`Lease::acquire`](crate::Lease::acquire),
    /// elections): resolves when `name` may have been released, and after
    /// `poll` at the latest. A waiter never trusts it — it tries to acquire
    /// — so a spurious wake-up costs one attempt, and a missed one costs at
    /// most `poll`.
    ///
    /// The default simply waits `poll` (polling). A backend whose server can
    /// push releases (PostgreSQL `NOTIFY`, Redis `PUBLISH`) overrides it to
    /// resolve about one round trip after a release. An override must
    /// register its interest when it is *called*, not when the future is
    /// first polled: the engine calls it before each attempt and awaits it
    /// after a failed one, so that a release in between is not missed.
    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        let _ = name;
        tokio::time::sleep(poll)
    }

    /// A hint for the engine, asked once per acquisition just after it was
    /// granted: `Some(future)` that resolves when the backend learns that
    /// `lease` may have been lost — the holding session's end, say —
    /// sooner than the next renewal would. The engine then renews `lease`
    /// at once, and that renewal decides: a spurious hint costs one
    /// renewal, and a lease is never given up on a hint alone.
    ///
    /// The default answers `None`: the renewals, every `ttl/3`, are all
    /// there is. `PgAdvisory` watches the connection that holds the lock
    /// (see its docs, "Prompt loss"). The future is dropped once the lease
    /// has ended; it must not keep anything of the lease alive.
    fn lost(&self, lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        let _ = lease;
        None::<std::future::Pending<()>>
    }
}

/// What a backend knows about a lease ([`Backend::inspect`], [`Backend::list`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The lease's name.
    pub name: String,
    /// Who holds it, or held it last (a record that expired or was released
    /// keeps its last holder). Empty when the backend cannot tell (`Redis`
    /// after a release, or in the Go locker's protocol); `PgAdvisory` names
    /// the holding session instead (see each backend's `inspect`).
    pub holder: String,
    /// How long it stays held, by the backend's clock; `None` when the
    /// record exists but has expired or been released. [`Duration::MAX`]
    /// when it is held and has no expiry (`PgAdvisory`: until released or
    /// its session ends).
    pub expires_in: Option<Duration>,
    /// The fencing token of its last acquisition, if the backend has them.
    pub fencing_token: Option<u64>,
}

impl LeaseInfo {
    /// Information about `name`.
    pub fn new(
        name: impl Into<String>,
        holder: impl Into<String>,
        expires_in: Option<Duration>,
        fencing_token: Option<u64>,
    ) -> Self {
        Self {
            name: name.into(),
            holder: holder.into(),
            expires_in,
            fencing_token,
        }
    }

    /// Someone holds the lease now (it has not expired or been released).
    pub fn is_held(&self) -> bool {
        self.expires_in.is_some()
    }
}

/// The most leases the engine passes to one [`Backend::renew_many`] call; a
/// larger batch is split into calls of this size, sent together.
pub const MAX_BATCH: usize = 1000;

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

/// One acquisition of a lease, which a [`Backend::renew`] or
/// [`Backend::release`] concerns: the name, the holder, and the fencing
/// token of the [`Grant`] that acquisition got.
///
/// A backend with fencing tokens renews or releases only the record that
/// still carries this fencing token, so a request that belongs to an older
/// acquisition cannot touch a newer one. For such a backend, an
/// `Acquisition` without a fencing token matches nothing (it cannot be one
/// of its grants): renew answers `Ok(false)` and release does nothing.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lease::{Acquisition, Backend, backend::Memory};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lease::Error> {
/// let db = Memory::new();
/// let ttl = Duration::from_secs(30);
/// let first = db.acquire("report", "pod-a", ttl).await?.expect("free");
/// let old = Acquisition::new("report", "pod-a", first.fencing_token);
/// db.release(old).await?;
/// let second = db.acquire("report", "pod-a", ttl).await?.expect("released");
///
/// // A late copy of the first release does not end the second acquisition.
/// db.release(old).await?;
/// assert!(db.renew(Acquisition::new("report", "pod-a", second.fencing_token), ttl).await?);
/// assert!(!db.renew(old, ttl).await?);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Acquisition<'a> {
    /// The lease's name.
    pub name: &'a str,
    /// Who acquired it.
    pub holder: &'a str,
    /// The fencing token of the grant ([`Grant::fencing_token`]).
    pub fencing_token: Option<u64>,
}

impl<'a> Acquisition<'a> {
    /// The acquisition of `name` by `holder` that was granted `fencing_token`.
    pub fn new(name: &'a str, holder: &'a str, fencing_token: Option<u64>) -> Self {
        Self {
            name,
            holder,
            fencing_token,
        }
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
        lease: Acquisition<'_>,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        B::renew(self, lease, ttl)
    }

    fn release(&self, lease: Acquisition<'_>) -> impl Future<Output = Result<(), Error>> + Send {
        B::release(self, lease)
    }

    fn renew_many(
        &self,
        leases: &[(Acquisition<'_>, Duration)],
    ) -> impl Future<Output = Result<Vec<bool>, Error>> + Send {
        B::renew_many(self, leases)
    }

    fn inspect(&self, name: &str) -> impl Future<Output = Result<Option<LeaseInfo>, Error>> + Send {
        B::inspect(self, name)
    }

    fn list(&self) -> impl Future<Output = Result<Vec<LeaseInfo>, Error>> + Send {
        B::list(self)
    }

    fn force_release(&self, name: &str) -> impl Future<Output = Result<bool, Error>> + Send {
        B::force_release(self, name)
    }

    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        B::released(self, name, poll)
    }

    fn lost(&self, lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        B::lost(self, lease)
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
        lease: Acquisition<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    fn release<'a>(&'a self, lease: Acquisition<'a>) -> BoxFuture<'a, Result<(), Error>>;
    fn renew_many<'a>(
        &'a self,
        leases: &'a [(Acquisition<'a>, Duration)],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>>;
    fn inspect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<LeaseInfo>, Error>>;
    // Mirrored so the trait stays complete; nothing in the crate calls them
    // through `Lease` (operators call them on the backend itself).
    #[allow(dead_code)]
    fn list(&self) -> BoxFuture<'_, Result<Vec<LeaseInfo>, Error>>;
    #[allow(dead_code)]
    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, Error>>;
    fn released(&self, name: &str, poll: Duration) -> BoxFuture<'static, ()>;
    fn lost(&self, lease: Acquisition<'_>) -> Option<BoxFuture<'static, ()>>;
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
        lease: Acquisition<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Backend::renew(self, lease, ttl))
    }

    fn release<'a>(&'a self, lease: Acquisition<'a>) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Backend::release(self, lease))
    }

    fn renew_many<'a>(
        &'a self,
        leases: &'a [(Acquisition<'a>, Duration)],
    ) -> BoxFuture<'a, Result<Vec<bool>, Error>> {
        Box::pin(Backend::renew_many(self, leases))
    }

    fn inspect<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<LeaseInfo>, Error>> {
        Box::pin(Backend::inspect(self, name))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<LeaseInfo>, Error>> {
        Box::pin(Backend::list(self))
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Backend::force_release(self, name))
    }

    fn released(&self, name: &str, poll: Duration) -> BoxFuture<'static, ()> {
        Box::pin(Backend::released(self, name, poll))
    }

    fn lost(&self, lease: Acquisition<'_>) -> Option<BoxFuture<'static, ()>> {
        Backend::lost(self, lease).map(|f| Box::pin(f) as BoxFuture<'static, ()>)
    }
}
