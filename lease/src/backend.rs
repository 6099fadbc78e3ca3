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
//! for the subscription), `Etcd` by a watch; elsewhere by polling.
//!
//! [`acquire`]: Backend::acquire
//! [`renew`]: Backend::renew
//! [`release`]: Backend::release

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;

use crate::{Error, Result};

mod memory;
pub use memory::Memory;

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
mod table;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) use table::check_in;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql")))
)]
pub use table::{CheckIn, Dialect, Table};
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

pub mod push;

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

/// The input checks of the engine, for a backend's own calls (see
/// [`Backend`], "Input").
///
/// # Examples
///
/// ```
/// use leasehold::backend::validate;
/// use leasehold::{Error, Request};
/// use std::time::Duration;
///
/// let request = Request::new("report", "pod-a", Duration::from_secs(30)).value("10.0.0.1");
/// assert!(validate::request(&request).is_ok());
/// assert!(matches!(validate::name(""), Err(Error::InvalidName { len: 0 })));
/// ```
pub mod validate {
    pub use crate::validate::{holder, name, request, ttl, value};
}

/// Storage for leases: one record per name, with a holder, an expiry and a
/// fencing counter.
///
/// Implementations must be atomic per call: two concurrent `acquire`s of one
/// name by different holders may not both return `Ok(Some(_))` while the first
/// grant is unexpired. Expiry should be computed by the storage's own clock
/// (the server's), never by the caller's.
///
/// Renewals and releases concern one *acquisition*: see [`Acquisition`].
///
/// Input: the engine checks names, holders and ttls before it calls a
/// backend, but a backend is also called directly (an operator's
/// `force_release`, say). So it checks its own input with [`validate`] and
/// answers invalid input with the matching `Invalid*` [`Error`]; a name a
/// lenient server truncated would become another name. The
/// `leasehold-conformance` crate checks this.
///
/// Time: the engine bounds each call it makes (it drops a call that
/// outlives its limit), so a backend needs no time limit for the engine's
/// sake; a call the engine drops may or may not have reached the server.
/// Called directly, a backend bounds only what it documents (`Redis` and
/// `Etcd`: `with_timeout`, 5 s by default; the table backends: their
/// pool's `acquire_timeout`); a direct caller bounds the rest with
/// `tokio::time::timeout`.
///
/// # Examples
///
/// A backend that stores nothing and grants every request — to show the shape
/// only (it breaks mutual exclusion, so never use it):
///
/// ```
/// use std::time::Duration;
/// use leasehold::{Acquisition, Backend, Error, Grant};
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
/// let lease = leasehold::Lease::new(GrantAll);
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
    /// and never brings back a lease that was released or has expired. It
    /// may keep a later expiry set before (a late renewal must not cut one).
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

    /// Evict whoever holds the lease on `name`, with a *lock delay* — for an
    /// operator whose job is stuck (`lease release --force`). `Ok(true)` if a
    /// live lease was evicted, `Ok(false)` if `name` was not held.
    ///
    /// The evicted acquisition's renewals fail from now on (its token fires
    /// at its next renewal, within `ttl/3`), and nobody is granted `name`
    /// before the expiry the backend last set for it: the
    /// evicted holder's job has that long to stop. [`inspect`](Backend::inspect)
    /// reports the name as [`forced`](LeaseInfo::forced) until then. The
    /// fencing counter is kept: the next acquisition gets a larger fencing
    /// token. [`force_release_now`](Backend::force_release_now) is the
    /// immediate kind, for a holder known to be dead.
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
    /// resolve about one round trip after a release ([`push::Push`] does
    /// this for a subscription to the server's notifications). An override must
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
    /// there is (`PgAdvisory` and `Etcd` override it). The future is
    /// dropped once the lease has ended; it must not keep anything of the
    /// lease alive.
    fn lost(&self, lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        let _ = lease;
        None::<std::future::Pending<()>>
    }

    /// Acquire as [`acquire`](Backend::acquire) does, with what a job asks
    /// beyond the lease: a schedule slot to claim ([`Request::once_per`])
    /// and a value to publish with it ([`Request::value`]), each in the
    /// acquisition's own statement (one round trip).
    ///
    /// With `once_per`, the slot is `floor(clock / period)` by the
    /// backend's own clock where it has one (else the caller's); a slot at
    /// or below the last one recorded for the name is refused with
    /// [`Acquired::AlreadyRan`], whoever holds the lease. Without
    /// `retry_failed` the slot is recorded with the grant; with it, only by
    /// [`release_ran`](Backend::release_ran). The record outlives release
    /// and expiry and never goes back.
    ///
    /// The default serves a request without either by
    /// [`acquire`](Backend::acquire) and refuses one with either:
    /// [`Error::Unsupported`].
    ///
    /// # Errors
    ///
    /// As [`acquire`](Backend::acquire); [`Error::Unsupported`] for what the
    /// backend cannot store.
    fn acquire_with(
        &self,
        request: Request<'_>,
    ) -> impl Future<Output = Result<Acquired, Error>> + Send {
        async move {
            if request.once_per.is_some() {
                return Err(Error::Unsupported {
                    operation: "once_per",
                });
            }
            if request.value.is_some() {
                return Err(Error::Unsupported {
                    operation: "proclaim",
                });
            }
            let grant = self
                .acquire(request.name, request.holder, request.ttl)
                .await?;
            Ok(grant.map_or(
                Acquired::HeldElsewhere { expires_in: None },
                Acquired::Granted,
            ))
        }
    }

    /// Release `lease` as [`release`](Backend::release) does and record
    /// `slot` as run for its name (never lowering the record), in one
    /// statement: the end of a successful run with
    /// [`OncePer::retry_failed`]. The slot is recorded even if `lease` is
    /// no longer the current acquisition (the run did succeed).
    ///
    /// The default answers [`Error::Unsupported`].
    ///
    /// # Errors
    ///
    /// As [`release`](Backend::release).
    fn release_ran(
        &self,
        lease: Acquisition<'_>,
        slot: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = (lease, slot);
        async {
            Err(Error::Unsupported {
                operation: "once_per",
            })
        }
    }

    /// Publish `value` (or clear it, `None`) with `lease`, iff `lease` is
    /// still the current acquisition of its name: `Ok(false)` otherwise.
    /// One statement; [`inspect`](Backend::inspect) reports the value while
    /// the lease is held, and a backend that pushes releases also wakes
    /// [`released`](Backend::released) waiters of the name.
    ///
    /// The default answers [`Error::Unsupported`].
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`], or the backend's error when it cannot be asked.
    fn publish(
        &self,
        lease: Acquisition<'_>,
        value: Option<&str>,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = (lease, value);
        async {
            Err(Error::Unsupported {
                operation: "proclaim",
            })
        }
    }

    /// End the lease on `name` now, whoever holds it, and let it pass on at
    /// once — for a holder known to be dead (`lease release --force
    /// --now`). `Ok(true)` if a live lease was ended. The fencing counter is
    /// kept. Unlike [`force_release`](Backend::force_release), a holder
    /// still running may overlap with the next one until its next renewal.
    ///
    /// The default answers [`Error::Unsupported`].
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`], or the backend's error when it cannot be asked.
    fn force_release_now(&self, name: &str) -> impl Future<Output = Result<bool, Error>> + Send {
        let _ = name;
        async {
            Err(Error::Unsupported {
                operation: "force_release_now",
            })
        }
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
    /// The value its holder published ([`Backend::publish`], an election's
    /// `proclaim`), while it is held.
    pub value: Option<String>,
    /// The last schedule slot recorded for the name ([`Request::once_per`]).
    pub slot: Option<u64>,
    /// Evicted by [`Backend::force_release`]: held by nobody, yet granted to
    /// nobody until `expires_in` has passed (the lock delay).
    pub forced: bool,
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
            value: None,
            slot: None,
            forced: false,
        }
    }

    /// The same, with the value its holder published.
    pub fn with_value(self, value: Option<String>) -> Self {
        Self { value, ..self }
    }

    /// The same, with the last schedule slot recorded for the name.
    pub fn with_slot(self, slot: Option<u64>) -> Self {
        Self { slot, ..self }
    }

    /// The same, marked as force-released and kept from new holders until
    /// it expires ([`forced`](LeaseInfo::forced)).
    pub fn with_forced(self, forced: bool) -> Self {
        Self { forced, ..self }
    }

    /// Someone holds the lease now (it has not expired or been released),
    /// or nobody may take it yet (it was [`forced`](LeaseInfo::forced)).
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
    /// The schedule slot this acquisition claimed ([`Request::once_per`]).
    pub slot: Option<u64>,
    /// The last slot recorded for the name before this one, if any: slots
    /// between the two were missed.
    pub last_slot: Option<u64>,
}

impl Grant {
    /// A grant with the given fencing token (`None` if the backend has none).
    pub fn new(fencing_token: Option<u64>) -> Self {
        Self {
            fencing_token,
            slot: None,
            last_slot: None,
        }
    }

    /// The same, having claimed `slot`; `last` was recorded before it.
    pub fn with_slot(self, slot: u64, last: Option<u64>) -> Self {
        Self {
            slot: Some(slot),
            last_slot: last,
            ..self
        }
    }
}

/// What [`Backend::acquire_with`] is asked: an acquisition of `name` by
/// `holder` for `ttl`, and what the job asks beyond it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Request<'a> {
    /// The lease's name.
    pub name: &'a str,
    /// Who asks for it.
    pub holder: &'a str,
    /// Its time-to-live.
    pub ttl: Duration,
    /// Claim a schedule slot.
    pub once_per: Option<OncePer>,
    /// Publish this value with the lease (an election's `proclaim`, §6.4).
    pub value: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// A plain acquisition of `name` by `holder` for `ttl`.
    pub fn new(name: &'a str, holder: &'a str, ttl: Duration) -> Self {
        Self {
            name,
            holder,
            ttl,
            once_per: None,
            value: None,
        }
    }

    /// The same, claiming a schedule slot.
    pub fn once_per(self, once_per: OncePer) -> Self {
        Self {
            once_per: Some(once_per),
            ..self
        }
    }

    /// The same, publishing `value` with the lease.
    pub fn value(self, value: &'a str) -> Self {
        Self {
            value: Some(value),
            ..self
        }
    }
}

/// A schedule slot to claim with an acquisition ([`Request::once_per`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OncePer {
    /// The schedule's period: the slot is `floor(clock / period)`, with the
    /// clock in milliseconds since the Unix epoch.
    pub period: Duration,
    /// Record the slot only when the run succeeds
    /// ([`Backend::release_ran`]) instead of with the grant.
    pub retry_failed: bool,
}

impl OncePer {
    /// Claim one slot of `period`, recorded with the grant.
    pub fn new(period: Duration) -> Self {
        Self {
            period,
            retry_failed: false,
        }
    }

    /// The same, recorded only when the run succeeds.
    pub fn retry_failed(self, retry_failed: bool) -> Self {
        Self {
            retry_failed,
            ..self
        }
    }

    /// The period in whole milliseconds (at least 1), as the backends'
    /// statements divide by it.
    pub fn period_ms(&self) -> u64 {
        u64::try_from(self.period.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The slot of `clock_ms` (milliseconds since the Unix epoch).
    pub fn slot_at(&self, clock_ms: u64) -> u64 {
        clock_ms / self.period_ms()
    }
}

/// The millisecond of the Unix epoch now, by this process's clock: the
/// clock of the schedule slots where the backend has none of its own
/// (`Etcd`) or its own is this host's (`SqliteTable`).
#[cfg(any(feature = "etcd", feature = "sqlite"))]
fn clock_ms() -> u64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// What [`Backend::acquire_with`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquired {
    /// The caller now holds the lease.
    Granted(Grant),
    /// Another holder has an unexpired lease (or nobody may take it yet:
    /// [`LeaseInfo::forced`]).
    HeldElsewhere {
        /// How long until it expires, by the backend's clock, if the
        /// backend can tell without another request: a waiter then tries
        /// again at the expiry itself.
        expires_in: Option<Duration>,
    },
    /// The schedule slot asked for was recorded already (a run claimed it,
    /// or succeeded in it): `slot` is the slot asked for.
    AlreadyRan {
        /// The slot of the request.
        slot: u64,
    },
}

impl Acquired {
    /// The grant, if the caller now holds the lease: what
    /// [`Backend::acquire`] answers for this `acquire_with` answer.
    pub fn granted(self) -> Option<Grant> {
        match self {
            Acquired::Granted(grant) => Some(grant),
            _ => None,
        }
    }
}

/// One acquisition of a lease, which a [`Backend::renew`] or
/// [`Backend::release`] concerns: the name, the holder, and the fencing
/// token of the [`Grant`] that acquisition got.
///
/// A backend with fencing tokens matches all three, so that a request of an
/// older acquisition (a release the network delivered late, a renewal still
/// in flight) can never extend or end a newer acquisition of the same name,
/// even by the same holder; an `Acquisition` without a fencing token matches
/// nothing there (renew answers `Ok(false)`, release does nothing). A
/// backend without fencing tokens matches name and holder.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use leasehold::{Acquisition, Backend, backend::Memory};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), leasehold::Error> {
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

    fn acquire_with(
        &self,
        request: Request<'_>,
    ) -> impl Future<Output = Result<Acquired, Error>> + Send {
        B::acquire_with(self, request)
    }

    fn release_ran(
        &self,
        lease: Acquisition<'_>,
        slot: u64,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        B::release_ran(self, lease, slot)
    }

    fn publish(
        &self,
        lease: Acquisition<'_>,
        value: Option<&str>,
    ) -> impl Future<Output = Result<bool, Error>> + Send {
        B::publish(self, lease, value)
    }

    fn force_release_now(&self, name: &str) -> impl Future<Output = Result<bool, Error>> + Send {
        B::force_release_now(self, name)
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
    fn list(&self) -> BoxFuture<'_, Result<Vec<LeaseInfo>, Error>>;
    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, Error>>;
    fn force_release_now<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, Error>>;
    fn released(&self, name: &str, poll: Duration) -> BoxFuture<'static, ()>;
    fn lost(&self, lease: Acquisition<'_>) -> Option<BoxFuture<'static, ()>>;
    fn acquire_with<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Acquired, Error>>;
    fn release_ran<'a>(
        &'a self,
        lease: Acquisition<'a>,
        slot: u64,
    ) -> BoxFuture<'a, Result<(), Error>>;
    fn publish<'a>(
        &'a self,
        lease: Acquisition<'a>,
        value: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>>;
    /// The backend itself, for what only some backends offer
    /// ([`LeaseGuard::check_in`](crate::LeaseGuard::check_in) on a table).
    #[allow(dead_code)]
    fn as_any(&self) -> &dyn std::any::Any;
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

    fn force_release_now<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Backend::force_release_now(self, name))
    }

    fn released(&self, name: &str, poll: Duration) -> BoxFuture<'static, ()> {
        Box::pin(Backend::released(self, name, poll))
    }

    fn lost(&self, lease: Acquisition<'_>) -> Option<BoxFuture<'static, ()>> {
        Backend::lost(self, lease).map(|f| Box::pin(f) as BoxFuture<'static, ()>)
    }

    fn acquire_with<'a>(&'a self, request: Request<'a>) -> BoxFuture<'a, Result<Acquired, Error>> {
        Box::pin(Backend::acquire_with(self, request))
    }

    fn release_ran<'a>(
        &'a self,
        lease: Acquisition<'a>,
        slot: u64,
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(Backend::release_ran(self, lease, slot))
    }

    fn publish<'a>(
        &'a self,
        lease: Acquisition<'a>,
        value: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Backend::publish(self, lease, value))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Any [`Backend`], boxed: one type for a backend chosen at run time (the
/// `lease` command picks it from a URL). It answers every method as the
/// backend inside does.
///
/// # Examples
///
/// ```
/// use leasehold::backend::{BoxedBackend, Memory};
///
/// let chosen = if std::env::var_os("LEASE_URL").is_some() {
///     BoxedBackend::new(Memory::new()) // a real backend here
/// } else {
///     BoxedBackend::new(Memory::new())
/// };
/// let lease = leasehold::Lease::new(chosen);
/// # let _ = lease;
/// ```
pub struct BoxedBackend(Box<dyn DynBackend>);

impl BoxedBackend {
    /// `backend`, boxed.
    pub fn new(backend: impl Backend) -> Self {
        Self(Box::new(backend))
    }

    /// The backend inside, if it is a `B` (for what only one kind of
    /// backend offers).
    pub fn downcast_ref<B: Backend>(&self) -> Option<&B> {
        self.0.as_any().downcast_ref()
    }
}

impl std::fmt::Debug for BoxedBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoxedBackend").finish_non_exhaustive()
    }
}

impl Backend for BoxedBackend {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        self.0.acquire(name, holder, ttl).await
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        self.0.renew(lease, ttl).await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.0.release(lease).await
    }

    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        self.0.renew_many(leases).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        self.0.inspect(name).await
    }

    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        self.0.list().await
    }

    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        self.0.force_release(name).await
    }

    async fn force_release_now(&self, name: &str) -> Result<bool, Error> {
        self.0.force_release_now(name).await
    }

    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.0.released(name, poll)
    }

    fn lost(&self, lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        self.0.lost(lease)
    }

    async fn acquire_with(&self, request: Request<'_>) -> Result<Acquired, Error> {
        self.0.acquire_with(request).await
    }

    async fn release_ran(&self, lease: Acquisition<'_>, slot: u64) -> Result<(), Error> {
        self.0.release_ran(lease, slot).await
    }

    async fn publish(&self, lease: Acquisition<'_>, value: Option<&str>) -> Result<bool, Error> {
        self.0.publish(lease, value).await
    }
}
