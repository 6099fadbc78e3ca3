//! What the suite is run on: a [`Subject`] (a backend plus the test-only
//! powers the properties need) and its [`Caps`].

use std::future::Future;
use std::time::Duration;

use leasehold::{Acquisition, Backend};

/// A backend under test: the backend, what it can do ([`Caps`]), and the
/// few powers over its server that the properties need and a [`Backend`]
/// does not have, such as rewriting a lease behind its holder's back.
///
/// Every property takes a `&S` where `S: Subject` and builds what it needs
/// from [`backend`](Subject::backend): several [`Lease`](leasehold::Lease)s
/// on clones of it play several replicas sharing one server. Each property
/// uses lease names of its own (a unique suffix), so the properties may run
/// in parallel on one server, and a subject may share its server with other
/// tests.
///
/// # Examples
///
/// The subject of [`Memory`](leasehold::backend::Memory): a steal expires
/// the holder's lease and acquires it for the thief.
///
/// ```
/// use std::time::Duration;
/// use leasehold::Backend;
/// use leasehold::backend::Memory;
/// use leasehold_conformance::Subject;
///
/// struct MemorySubject(Memory);
///
/// impl Subject for MemorySubject {
///     type B = Memory;
///
///     fn backend(&self) -> Memory {
///         self.0.clone()
///     }
///
///     async fn steal(&self, name: &str, thief: &str) {
///         self.0.expire(name);
///         let ttl = Duration::from_secs(60);
///         let grant = self.0.acquire(name, thief, ttl).await.expect("acquire");
///         grant.expect("free once expired");
///     }
/// }
/// ```
pub trait Subject: Send + Sync + 'static {
    /// The backend under test.
    type B: Backend + Clone;

    /// The backend: a clone of one backend value (or a new value on the
    /// same server) at each call, which sees every lease of the others.
    fn backend(&self) -> Self::B;

    /// What the backend can do. The default is [`Caps::new`]: everything
    /// but pushed releases.
    fn caps(&self) -> Caps {
        Caps::new()
    }

    /// Behind its holder's back, make `thief` the holder of the live lease
    /// on `name`, with the next fencing token (where the backend has them)
    /// and a ttl of a minute or more, as an operator or a buggy peer
    /// rewriting the record would. Panics if it cannot.
    ///
    /// The holder must learn of it only at its next renewal (or by
    /// [`Backend::lost`]): the properties check that its token fires then.
    fn steal(&self, name: &str, thief: &str) -> impl Future<Output = ()> + Send;

    /// How long after an acquisition with `ttl` (not renewed) the server
    /// may still hold the lease: `ttl` where the server expires exactly
    /// (give or take its clock), the default; longer where it rounds the
    /// ttl up (etcd: whole seconds, and an expiry check every 500 ms).
    fn expiry(&self, ttl: Duration) -> Duration {
        ttl
    }

    /// Whether [`Backend::list`] and [`Backend::inspect`] still show a
    /// released lease (as not held). By default where the record keeps the
    /// fencing counter: with [`fencing`](Caps::fencing) and
    /// [`expires`](Caps::expires).
    fn keeps_released(&self) -> bool {
        self.caps().fencing && self.caps().expires
    }

    /// The thief of [`steal`](Subject::steal) lets the lease on `name` go,
    /// so that it is free at once. By default it releases it through the
    /// backend as a holder that did not keep its grant would
    /// ([`release_as`]); override it where that cannot work (a backend that
    /// matches a token only the acquiring value knows).
    fn let_go(&self, name: &str, thief: &str) -> impl Future<Output = ()> + Send {
        let (b, name, thief) = (self.backend(), name.to_owned(), thief.to_owned());
        async move { release_as(&b, &name, &thief).await }
    }

    /// For a backend without expiry ([`Caps::expires`] false): end the
    /// server session of whoever holds `name`, as a crash would, and return
    /// once the server has freed the name.
    ///
    /// The default panics: a backend with expiry is never asked.
    fn end_session(&self, name: &str) -> impl Future<Output = ()> + Send {
        let _ = name;
        async { panic!("only a backend without expiry has sessions to end") }
    }
}

/// Release `name` as `holder`, with the fencing token [`Backend::inspect`]
/// shows: what a holder that did not keep its grant would do. The default
/// of [`Subject::let_go`].
///
/// # Panics
///
/// If `inspect` or the release fails.
pub async fn release_as(b: &impl Backend, name: &str, holder: &str) {
    let info = b.inspect(name).await.expect("inspect");
    let fence = info.and_then(|i| i.fencing_token);
    b.release(Acquisition::new(name, holder, fence))
        .await
        .unwrap_or_else(|e| panic!("{holder}'s release of {name:?}: {e}"));
}

/// What a backend can do, where backends differ: each property checks what
/// the backend does, and where it lacks a capability, what it does instead
/// (a refusal with [`Error::Unsupported`](leasehold::Error::Unsupported),
/// or, without expiry, a lease that ends with its session).
///
/// Start from [`Caps::new`] and turn off what the backend lacks:
///
/// ```
/// use leasehold_conformance::{Caps, Naming};
///
/// // A backend of plain leases: no slots, values or forced releases.
/// let caps = Caps::new()
///     .with_once_per(false)
///     .with_values(false)
///     .with_lock_delay(false)
///     .with_force_now(false);
/// assert!(caps.fencing && !caps.values);
/// assert_eq!(caps.leader, Naming::Holder);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Caps {
    /// Acquisitions carry a fencing token: 1 for the first acquisition of a
    /// name, one more for each later one, unchanged by an idempotent
    /// re-acquire. (Tokens that only grow, such as etcd's revisions, are
    /// counted so by [`Ordinal`](crate::Ordinal).) When false, every token
    /// is `None`, and renew and release match name and holder only.
    pub fencing: bool,
    /// The server expires a lease that is not renewed within its ttl. When
    /// false, a lease lives as long as its holder's session and ends when
    /// that session does ([`Subject::end_session`]).
    pub expires: bool,
    /// The server pushes releases to waiters ([`Backend::released`]): a
    /// waiter has a released lease, and a follower a new value, about one
    /// round trip after the release (under 400 ms). When false, waiters
    /// poll (every `ttl/10`, at most 1 s), and have it within a poll.
    pub pushes: bool,
    /// Whom [`Backend::inspect`] names as the holder of a live lease, which
    /// is what an election's `Leadership::Following { leader }` shows.
    pub leader: Naming,
    /// Schedule slots ([`Request::once_per`](leasehold::Request::once_per),
    /// [`Backend::release_ran`]). When false, a request for one is refused
    /// with `Error::Unsupported`.
    pub once_per: bool,
    /// Values published with a lease ([`Request::value`](leasehold::Request::value),
    /// [`Backend::publish`]), which `inspect` reports. When false, both are
    /// refused with `Error::Unsupported`.
    pub values: bool,
    /// [`Backend::force_release`] keeps a lock delay: nobody is granted the
    /// name before the expiry the server last set. When false, it is not
    /// checked.
    pub lock_delay: bool,
    /// [`Backend::force_release_now`] ends a lease at once. When false, it
    /// answers `Error::Unsupported`.
    pub force_now: bool,
}

impl Caps {
    /// Every capability but pushed releases: fencing tokens counted per
    /// name, expiry, polling waiters, [`Naming::Holder`], slots, values,
    /// both forced releases. What `Memory` has.
    pub const fn new() -> Self {
        Self {
            fencing: true,
            expires: true,
            pushes: false,
            leader: Naming::Holder,
            once_per: true,
            values: true,
            lock_delay: true,
            force_now: true,
        }
    }

    /// The same, with [`fencing`](Caps::fencing) as given.
    pub const fn with_fencing(self, fencing: bool) -> Self {
        Self { fencing, ..self }
    }

    /// The same, with [`expires`](Caps::expires) as given.
    pub const fn with_expires(self, expires: bool) -> Self {
        Self { expires, ..self }
    }

    /// The same, with [`pushes`](Caps::pushes) as given.
    pub const fn with_pushes(self, pushes: bool) -> Self {
        Self { pushes, ..self }
    }

    /// The same, with [`leader`](Caps::leader) as given.
    pub const fn with_leader(self, leader: Naming) -> Self {
        Self { leader, ..self }
    }

    /// The same, with [`once_per`](Caps::once_per) as given.
    pub const fn with_once_per(self, once_per: bool) -> Self {
        Self { once_per, ..self }
    }

    /// The same, with [`values`](Caps::values) as given.
    pub const fn with_values(self, values: bool) -> Self {
        Self { values, ..self }
    }

    /// The same, with [`lock_delay`](Caps::lock_delay) as given.
    pub const fn with_lock_delay(self, lock_delay: bool) -> Self {
        Self { lock_delay, ..self }
    }

    /// The same, with [`force_now`](Caps::force_now) as given.
    pub const fn with_force_now(self, force_now: bool) -> Self {
        Self { force_now, ..self }
    }
}

impl Default for Caps {
    /// [`Caps::new`].
    fn default() -> Self {
        Self::new()
    }
}

/// Whom [`Backend::inspect`] names as the holder of a live lease
/// ([`Caps::leader`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Naming {
    /// The holder, whoever took it.
    Holder,
    /// The holder if it acquired through this backend value (or a clone),
    /// else nobody (`Following { leader: None }`): where the record holds a
    /// random token that only the acquiring backend value can map back to
    /// its holder (the Go locker's protocol on Redis).
    OwnHolders,
    /// The server session that holds it, with `pid ` in its name
    /// (`PgAdvisory`: `... (pid N)`).
    Session,
}
