//! [`PgAdvisory`]: PostgreSQL session advisory locks, one connection per held lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgAdvisoryLock, PgConnection, PgPool, Postgres};

use crate::{Acquisition, Backend, Error, Grant};

/// Is the session running this query holding the exclusive advisory lock on
/// the bigint key `$1`? PostgreSQL shows a bigint key in `pg_locks` as
/// `classid` = its high 32 bits, `objid` = its low 32 bits, `objsubid = 1`
/// (the `(int4, int4)` key space uses `objsubid = 2`).
const HEARTBEAT: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks \
     WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
     AND mode = 'ExclusiveLock' AND objsubid = 1 \
     AND classid::int8 = (($1::int8 >> 32) & 4294967295) \
     AND objid::int8 = ($1::int8 & 4294967295))";

/// Leases as PostgreSQL session-level advisory locks
/// (`pg_try_advisory_lock`), each held on a connection of its own.
///
/// No table, no migration: any PostgreSQL database will do. A lease is an
/// exclusive advisory lock on the 64-bit key that sqlx's
/// [`PgAdvisoryLock::new(name)`](sqlx::postgres::PgAdvisoryLock::new)
/// derives from the lease name, so these locks exclude (and are excluded by)
/// other programs that lock the same name through sqlx's `PgAdvisoryLock`;
/// [`with_key`](PgAdvisory::with_key) sets another derivation (for example
/// the Go services' during a migration).
///
/// # How it differs from the table backends
///
/// - **No server-side expiry.** A lock lives exactly as long as the session
///   (connection) holding it, however long that is: the `ttl` passed to
///   [`Lease`](crate::Lease) only sets the heartbeat cadence (`ttl/3`) and the
///   local deadline after which the holder's token is cancelled if no
///   heartbeat has succeeded. A process that crashes loses its locks as soon
///   as PostgreSQL notices the dead connection — at once for a clean exit or
///   a killed process (the kernel closes the socket), but for a host that
///   vanishes only when TCP keepalive (the server's `tcp_keepalives_*`
///   settings) or `tcp_user_timeout` gives up. A process that is paused but
///   alive (a long GC or VM pause, `SIGSTOP`) keeps its locks: nobody else
///   can take them over in the meantime, but when it resumes its token may
///   already have been cancelled by the local deadline.
/// - **Takeover after the holder's connection dies**, not after `ttl`: as
///   soon as the session ends (for example `pg_terminate_backend`), the lock
///   is free for the next `try_acquire`; the old holder's next heartbeat fails
///   and cancels its token. When the end of the session reaches the holder
///   (the server's termination message, a reset), that is within `ttl/3`
///   plus one round trip; when it does not (the connection hangs, a black
///   hole), the heartbeat waits out its own timeout of `ttl/3` first, so
///   about `2·ttl/3`.
///   **Until then both believe they hold the lease**: when the session ends
///   while its process lives on — the connection is killed or reset, the
///   server restarts — a new holder may take the lock at once while the old
///   one's token is not yet cancelled and its `is_valid()` is still true,
///   for up to `ttl/3` plus a round trip (about `2·ttl/3` if the heartbeat
///   hangs), and there is no fencing token to stop the old holder's writes. That is the price of the fast takeover
///   (the table backends make the next holder wait for the expiry instead);
///   the fault suite measures it (`docs/RELIABILITY.md`). Use `PgTable` when
///   two holders must never overlap.
/// - **No fencing token**: [`LeaseGuard::fencing_token`](crate::LeaseGuard::fencing_token)
///   is always `None`. Use a table backend (`PgTable`) if the protected
///   resource needs one.
/// - **One pool connection per held lock**, checked out from the
///   [`PgPool`] for as long as the lock is held. Size the pool for the number
///   of leases held at once plus the connections the rest of the program
///   needs; an acquire that finds the pool exhausted waits for a connection
///   and fails with [`Error::Timeout`] (or the pool's own acquire timeout).
///   Settings that end idle sessions (`idle_session_timeout`, a proxy's idle
///   timeout) end the locks of held connections too — the holder then loses
///   its lease at the next heartbeat.
/// - **A direct connection (or a session-mode pooler) is required.** Behind
///   a transaction-mode pooler (PgBouncer `pool_mode = transaction`), one
///   client connection does not keep one server session, and session locks
///   end up on sessions other clients use: do not use this backend there.
///
/// # Heartbeat
///
/// Every `ttl/3` the engine renews: the holding connection checks in
/// `pg_locks` that its own backend pid still holds the lock's key, with a
/// timeout of `ttl/3`. Any error on that connection (it was terminated, the
/// network failed, the query timed out) means the lock is gone for us: the
/// connection is closed — never returned to the pool — and the lease is
/// reported lost. Unlike the other backends, a single heartbeat that fails
/// or takes longer than `ttl/3` therefore loses the lease: there is no
/// retrying on a connection whose state is unknown.
///
/// # Release
///
/// Release runs `pg_advisory_unlock` on the holding connection. Only if that
/// returns `true` does the connection go back to the pool; otherwise (or on
/// any error) it is closed, which ends the session and every lock on it.
/// A lock is never stacked: re-acquiring a name this backend already holds
/// for the same holder checks the existing lock instead of taking it again,
/// so one unlock always frees it.
///
/// ### Note: Release-on-drop is not immediate!
///
/// Dropping a [`LeaseGuard`](crate::LeaseGuard) releases in a background
/// task, and a connection that is closed instead (after an error, or
/// because the future owning it was dropped) is closed in a background task
/// too: the server drops the lock when it processes the connection's end, a
/// round trip or so later. Until then another `try_acquire` may still find
/// the name held. Call [`LeaseGuard::release`](crate::LeaseGuard::release)
/// and await it to know the lock is gone.
///
/// Clones share their locks. Dropping the last clone closes the connection
/// of every lock still held, which ends those locks.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lease::{backend::PgAdvisory, Lease};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::postgres::PgPoolOptions::new()
///     .max_connections(10) // one per lease held at once, plus your own
///     .connect("postgres://postgres@127.0.0.1:5432/test")
///     .await?;
/// let lease = Lease::new(PgAdvisory::new(pool));
/// let outcome = lease
///     .with_lease("nightly-report", Duration::from_secs(30), |token| async move {
///         // heartbeats every 10 s; `token` is cancelled if the connection dies
///         let _ = token;
///     })
///     .await;
/// println!("{outcome:?}");
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// The engine gives every call a timeout and drops the call's future when
/// it runs out. While a connection is owned by an in-flight acquire or
/// release, it sits in a guard that closes it if the future is dropped: a
/// dropped acquire whose `pg_try_advisory_lock` had already been granted
/// leaves no lock behind (the session ends), and a connection is never
/// returned to the pool with a lock on it. A heartbeat runs in a task of its
/// own, bounded by its own timeout, so that a renewal the engine stops
/// waiting for does not cut the query off; a release waits for it and then
/// unlocks normally.
#[derive(Clone)]
pub struct PgAdvisory {
    pool: PgPool,
    held: Arc<Mutex<HeldLocks>>,
    /// The advisory-lock key of a lease name ([`PgAdvisory::with_key`]).
    key_of: fn(&str) -> i64,
}

/// The locks held, by `(name, holder)`.
type HeldLocks = HashMap<(String, String), Arc<Slot>>;

/// One held lock: the key and (unless an operation has it out) its connection.
#[derive(Debug)]
struct Slot {
    key: i64,
    /// `None` once the connection was closed or released. An async mutex so
    /// that a release waits for a heartbeat in flight on the same connection.
    held: tokio::sync::Mutex<Option<Held>>,
}

#[derive(Debug)]
struct Held {
    conn: Armed,
    /// Backend pid of the holding session (for logs).
    pid: i32,
}

/// A pool connection that is closed — never returned to the pool — when
/// dropped, unless [`disarm`](Armed::disarm)ed.
struct Armed(Option<PoolConnection<Postgres>>);

impl std::fmt::Debug for Armed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Armed")
    }
}

impl Armed {
    fn conn(&mut self) -> &mut PgConnection {
        self.0
            .as_mut()
            .expect("BUG: armed connection already taken")
    }

    /// The connection, to be returned to the pool when dropped.
    fn disarm(mut self) -> PoolConnection<Postgres> {
        self.0.take().expect("BUG: armed connection already taken")
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        let Some(mut conn) = self.0.take() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            // Closed gracefully in a task sqlx spawns (Terminate, then the
            // socket); the pool keeps the permit until it is closed.
            conn.close_on_drop();
            drop(conn);
        } else {
            // No runtime to close it on: drop the socket right here.
            drop(conn.detach());
        }
    }
}

impl std::fmt::Debug for PgAdvisory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAdvisory")
            .field("pool", &self.pool)
            .field("held", &self.held().len())
            .finish()
    }
}

impl PgAdvisory {
    /// A backend that takes one connection from `pool` for every lock it holds.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            held: Arc::default(),
            key_of: Self::sqlx_key,
        }
    }

    /// The same backend, with `key` deriving the advisory-lock key of each
    /// lease name (instead of [`sqlx_key`](PgAdvisory::sqlx_key)): to share
    /// locks with programs that derive keys another way — the Go `lock.PG`
    /// locker of the services a migration replaces, whose derivation its
    /// docs do not give (take it from its source).
    ///
    /// The key is locked with `pg_try_advisory_lock(bigint)`, in the
    /// single-`bigint` key space (a program that locks
    /// `pg_try_advisory_lock(int, int)` uses another space, and is not
    /// excluded). `key` must be a pure function of the name: every replica
    /// of a job must derive the same key, and a process must not change it
    /// while it holds a lock. Two names with one key are one lock.
    ///
    /// # Examples
    ///
    /// ```
    /// # async fn f(pool: sqlx::PgPool) {
    /// use lease::backend::PgAdvisory;
    ///
    /// // For example a 64-bit FNV-1a hash of the name.
    /// fn fnv1a(name: &str) -> i64 {
    ///     let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
    ///         (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    ///     });
    ///     hash as i64
    /// }
    ///
    /// let advisory = PgAdvisory::new(pool).with_key(fnv1a);
    /// assert_eq!(advisory.key("nightly-report"), fnv1a("nightly-report"));
    /// # }
    /// ```
    pub fn with_key(self, key: fn(&str) -> i64) -> Self {
        Self {
            key_of: key,
            ..self
        }
    }

    /// The advisory-lock key this backend locks for the lease `name`:
    /// [`sqlx_key`](PgAdvisory::sqlx_key) unless [`with_key`](PgAdvisory::with_key)
    /// set another derivation.
    pub fn key(&self, name: &str) -> i64 {
        (self.key_of)(name)
    }

    /// The default advisory-lock key of a lease name: exactly the key of sqlx's
    /// [`PgAdvisoryLock::new(name)`](sqlx::postgres::PgAdvisoryLock::new),
    /// in the single-`bigint` key space.
    ///
    /// # Examples
    ///
    /// ```
    /// use lease::backend::PgAdvisory;
    /// use sqlx::postgres::{PgAdvisoryLock, PgAdvisoryLockKey};
    ///
    /// let key = PgAdvisory::sqlx_key("nightly-report");
    /// assert_eq!(PgAdvisoryLock::new("nightly-report").key(), &PgAdvisoryLockKey::BigInt(key));
    /// ```
    pub fn sqlx_key(name: &str) -> i64 {
        PgAdvisoryLock::new(name)
            .key()
            .as_bigint()
            .expect("BUG: PgAdvisoryLock::new always derives a key in the bigint key space")
    }

    fn held(&self) -> MutexGuard<'_, HeldLocks> {
        // Every update of the map is a single insert or remove: a panic
        // elsewhere cannot leave it inconsistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(&self, name: &str, holder: &str) -> Option<Arc<Slot>> {
        self.held()
            .get(&(name.to_owned(), holder.to_owned()))
            .cloned()
    }

    /// Forget `slot` for `(name, holder)` if it is still the one in the map.
    fn forget(&self, name: &str, holder: &str, slot: &Arc<Slot>) {
        let mut held = self.held();
        let k = (name.to_owned(), holder.to_owned());
        if held.get(&k).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            held.remove(&k);
        }
    }

    /// Does the connection of `slot` still hold its lock? Asked in a task of
    /// its own, so that a caller that stops waiting (the engine's timeout)
    /// does not cut the query off: the heartbeat ends by its own timeout
    /// `limit`, and a release waits for it instead of finding the
    /// connection gone.
    async fn check(&self, name: &str, holder: &str, slot: Arc<Slot>, limit: Duration) -> bool {
        let this = self.clone();
        let (name, holder) = (name.to_owned(), holder.to_owned());
        let task = tokio::spawn(async move { this.heartbeat(&name, &holder, &slot, limit).await });
        // A task that did not finish (its runtime is shutting down) dropped
        // the connection it had out, and with it the lock.
        task.await.unwrap_or(false)
    }

    /// The heartbeat query on the connection of `slot`. Any failure closes
    /// the connection and answers `false`; so does dropping this future.
    async fn heartbeat(&self, name: &str, holder: &str, slot: &Arc<Slot>, limit: Duration) -> bool {
        let mut guard = slot.held.lock().await;
        // Out of the slot while the query runs: if this future is dropped,
        // `held` is dropped with it and its connection closed.
        let Some(mut held) = guard.take() else {
            drop(guard);
            self.forget(name, holder, slot);
            return false;
        };
        let check = sqlx::query_scalar::<_, bool>(HEARTBEAT)
            .bind(slot.key)
            .fetch_one(held.conn.conn());
        let why = match tokio::time::timeout(limit, check).await {
            Ok(Ok(true)) => {
                *guard = Some(held);
                return true;
            }
            Ok(Ok(false)) => "its session no longer holds the lock".to_owned(),
            Ok(Err(e)) => format!("the heartbeat query failed: {}", Error::from(e).chain()),
            Err(_) => format!("the heartbeat query did not answer within {limit:?}"),
        };
        tracing::debug!(
            lease.name = name,
            holder,
            pid = held.pid,
            "advisory lock lost ({why}); closing its connection"
        );
        drop(held);
        drop(guard);
        self.forget(name, holder, slot);
        false
    }
}

impl Backend for PgAdvisory {
    /// Takes a connection from the pool and `pg_try_advisory_lock`s the key
    /// on it; the connection is kept while the lock is held, or returned to
    /// the pool if the lock is held elsewhere.
    ///
    /// An idempotent re-acquire (the name is already held by this backend
    /// for `holder`) runs the heartbeat on the existing connection instead
    /// of locking again, since session locks would stack; if that lock turns
    /// out to be gone, it acquires afresh.
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        if let Some(slot) = self.slot(name, holder)
            && self.check(name, holder, slot, ttl / 3).await
        {
            return Ok(Some(Grant::new(None)));
        }
        let key = self.key(name);
        let mut conn = Armed(Some(self.pool.acquire().await?));
        let (locked, pid): (bool, i32) =
            sqlx::query_as("SELECT pg_try_advisory_lock($1), pg_backend_pid()")
                .bind(key)
                .fetch_one(conn.conn())
                .await?;
        if !locked {
            // Clean: it took no lock. Back to the pool.
            drop(conn.disarm());
            return Ok(None);
        }
        let slot = Arc::new(Slot {
            key,
            held: tokio::sync::Mutex::new(Some(Held { conn, pid })),
        });
        // We hold the lock on a new session, so no other session holds it: a
        // slot still in the map for this name and holder is stale. Dropping
        // it (after any heartbeat in flight on it) closes its connection.
        let stale = self
            .held()
            .insert((name.to_owned(), holder.to_owned()), slot);
        drop(stale);
        tracing::debug!(
            lease.name = name,
            holder,
            pid,
            key,
            "advisory lock acquired"
        );
        Ok(Some(Grant::new(None)))
    }

    /// The heartbeat: `Ok(true)` iff the holding connection still holds the
    /// lock (checked in `pg_locks`). Never `Err`: a failure on the connection
    /// means the lock is gone (the connection is closed) and answers `Ok(false)`.
    ///
    /// Advisory locks have no fencing token: the acquisition is the lock
    /// held by this backend for `(name, holder)`, on its own connection.
    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        let (name, holder) = (lease.name, lease.holder);
        match self.slot(name, holder) {
            Some(slot) => Ok(self.check(name, holder, slot, ttl / 3).await),
            None => Ok(false),
        }
    }

    /// `pg_advisory_unlock` on the holding connection, which goes back to the
    /// pool only if the unlock succeeded; otherwise it is closed.
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        let (name, holder) = (lease.name, lease.holder);
        let Some(slot) = self.held().remove(&(name.to_owned(), holder.to_owned())) else {
            return Ok(());
        };
        // Waits for a heartbeat in flight on this connection.
        let Some(mut held) = slot.held.lock().await.take() else {
            return Ok(());
        };
        // If this future is dropped now, `held` closes the connection.
        let unlocked = sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock($1)")
            .bind(slot.key)
            .fetch_one(held.conn.conn())
            .await?;
        if unlocked {
            drop(held.conn.disarm());
            tracing::debug!(
                lease.name = name,
                holder,
                pid = held.pid,
                "advisory lock released"
            );
        } else {
            tracing::warn!(
                lease.name = name,
                holder,
                pid = held.pid,
                "advisory lock was not held by its connection at release; closing the connection"
            );
        }
        Ok(())
    }
}
