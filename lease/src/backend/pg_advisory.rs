//! [`PgAdvisory`]: PostgreSQL session advisory locks, one connection per held lock.
//!
//! Ground rules. Each held lock is a [`HeldLock`] in the backend's map, by
//! `(name, holder)`, on a [`LockConn`], closed when dropped: only a
//! confirmed unlock or a refused attempt lets a connection go back to the
//! pool (issue 29). An operation on it holds the lock's `turn` and takes it
//! out of the lock's state while it runs, so a release waits for a
//! heartbeat in flight; the watch (`watch.rs`) reads it only while it is in.

mod watch;

use std::collections::HashMap;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::Waker;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgAdvisoryLock, PgConnection, PgListener, PgPool, Postgres};
use sqlx::{Acquire as _, AssertSqlSafe};
use tokio::runtime::{self, Handle};
use tokio::time::{Instant, timeout, timeout_at};

use crate::backend::push::Push;
use crate::backend::push::pg::PgSource;
use crate::drop_guard::DropGuard;
use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, Result, validate};

/// Does this session hold the exclusive advisory lock on the bigint key
/// `$1`? `pg_locks` shows a bigint key as `classid` = its high 32 bits,
/// `objid` = its low 32 bits, `objsubid = 1` (two `int4`s use `objsubid = 2`).
const HEARTBEAT: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks \
     WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
     AND mode = 'ExclusiveLock' AND objsubid = 1 \
     AND classid::int8 = (($1::int8 >> 32) & 4294967295) \
     AND objid::int8 = ($1::int8 & 4294967295))";

/// Try the lock on the key `$1`: granted, and the session's pid.
const LOCK: &str = "SELECT pg_try_advisory_lock($1), pg_backend_pid()";

/// The channel every `PgAdvisory` notifies when it unlocks a key, with the
/// key in decimal as the payload (a `PgTable`'s channel always has a `:`).
const CHANNEL: &str = "lease_advisory";

/// Unlock the key `$1` and, only if it was held, notify [`CHANNEL`] in the
/// same statement (a `CASE` branch is evaluated only when taken; the
/// notification is delivered at commit, after the unlock).
const UNLOCK: &str = "SELECT CASE WHEN pg_advisory_unlock($1) \
     THEN (SELECT true FROM pg_notify('lease_advisory', $1::text)) ELSE false END";

/// The holding session `l`, as `inspect` and `list` name it:
/// `"{application_name} (pid {pid})"`, or `"pid {pid}"` without a name.
macro_rules! session_name {
    () => {
        "coalesce(nullif(a.application_name, '') || ' (pid ' || l.pid || ')', 'pid ' || l.pid)"
    };
}

/// The session holding the key `$1` in this database (an exclusive lock
/// first), named, with ` (shared)` for a shared lock, then `$columns`.
macro_rules! holder_query {
    ($columns:literal) => {
        concat!(
            "SELECT ",
            session_name!(),
            " || CASE WHEN l.mode = 'ExclusiveLock' THEN '' ELSE ' (shared)' END",
            $columns,
            " FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND l.classid::int8 = (($1::int8 >> 32) & 4294967295) \
             AND l.objid::int8 = ($1::int8 & 4294967295) \
             ORDER BY l.mode = 'ExclusiveLock' DESC, l.pid LIMIT 1"
        )
    };
}

const HOLDER: &str = holder_query!(", NULL::int8");

/// Every exclusive advisory lock on a bigint key in this database: the key
/// and the holding session, named.
const LOCKS: &str = concat!(
    "SELECT ((l.classid::int8 << 32) | l.objid::int8), ",
    session_name!(),
    " FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     ORDER BY 1, l.pid"
);

/// End the session holding the exclusive lock on the key `$1`, waiting up
/// to 5 s (PostgreSQL 14 and later): one row per session, true if it ended.
const TERMINATE: &str = "SELECT pg_terminate_backend(l.pid, 5000) FROM pg_locks l \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.mode = 'ExclusiveLock' \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND l.classid::int8 = (($1::int8 >> 32) & 4294967295) \
     AND l.objid::int8 = ($1::int8 & 4294967295)";

/// The `CREATE TABLE` of a fence table: with `"{table}"` the template, with
/// `"lease_fences"` [`PgAdvisory::FENCE_SCHEMA`]. One text, so they cannot drift.
macro_rules! create_fence_table {
    ($table:literal) => {
        concat!(
            "CREATE TABLE IF NOT EXISTS ",
            $table,
            " (\n    name TEXT PRIMARY KEY,\n    fence BIGINT NOT NULL\n)"
        )
    };
}

/// The fenced acquisition: try the lock on `$1` and, only if granted, bump
/// the counter of the name `$2`. `MATERIALIZED` tries the lock once; a
/// data-modifying CTE runs even if unread, hence `WHERE granted`. `ON
/// CONFLICT DO UPDATE` updates the newest committed row, so a token is
/// larger than every token handed out before it.
const FENCED_ACQUIRE: &str = "WITH lock AS MATERIALIZED \
     (SELECT pg_try_advisory_lock($1) AS granted, pg_backend_pid() AS pid), \
     bumped AS (INSERT INTO {table} AS f (name, fence) SELECT $2, 1 FROM lock WHERE granted \
     ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1 RETURNING fence) \
     SELECT lock.granted, lock.pid, (SELECT fence FROM bumped) FROM lock";

/// With fencing, [`HOLDER`] and the name `$2`'s counter.
const FENCED_HOLDER: &str = holder_query!(", (SELECT f.fence FROM {table} f WHERE f.name = $2)");

/// The fence table of a backend [`with_fencing`](PgAdvisory::with_fencing)
/// and its statements.
#[derive(Debug)]
struct Fencing {
    table: Box<str>,
    create: Box<str>,
    acquire: Arc<str>,
    holder: Arc<str>,
}

impl Fencing {
    fn on(table: &str) -> Result<Self, Error> {
        validate::table(table)?;
        let fill = |template: &str| template.replace("{table}", table);
        Ok(Self {
            table: table.into(),
            create: fill(create_fence_table!("{table}")).into(),
            acquire: fill(FENCED_ACQUIRE).into(),
            holder: fill(FENCED_HOLDER).into(),
        })
    }
}

/// Leases as PostgreSQL session-level advisory locks
/// (`pg_try_advisory_lock`), each held on a connection of its own.
///
/// No table, no migration and no fencing token (unless
/// [`with_fencing`](PgAdvisory::with_fencing)). A lease is an exclusive
/// lock on the 64-bit key that sqlx's
/// [`PgAdvisoryLock::new(name)`](sqlx::postgres::PgAdvisoryLock::new)
/// derives from its name ([`with_key`](PgAdvisory::with_key) sets another).
/// How it differs from the table backends:
///
/// - **No expiry.** A lock lives as long as the session holding it
///   ([`inspect`](Backend::inspect) reports [`Duration::MAX`]); the `ttl`
///   only sets the heartbeat (every `ttl/3`, answered within `ttl/3` or
///   retried) and the local deadline after which the holder's token is
///   cancelled. A crashed process loses its locks when the server sees its
///   connections end (for a vanished host, when TCP keepalive gives up).
/// - **Takeover as soon as the holder's session ends** (say
///   `pg_terminate_backend`). The holder's token is cancelled within
///   milliseconds of the end reaching its connection, which is watched
///   while idle ([`with_watch`](PgAdvisory::with_watch)) — **prompt loss**:
///   **for those milliseconds both believe they hold the lease**. When the
///   end does not reach it (a black hole), the unanswered heartbeats tell
///   it, at its deadline. Use `PgTable` when two holders must never overlap.
/// - **One pool connection per held lock**, plus one for the waiters'
///   listener: size the [`PgPool`] for them and the rest of the program.
///   Settings that end idle sessions (`idle_session_timeout`) end the locks.
/// - **A direct connection or a session-mode pooler is required**: behind a
///   transaction-mode pooler, locks land on sessions other clients use.
/// - **Release-on-drop is not immediate.** A connection that may still hold
///   a lock (after a failure, a lost session, a cancelled call, a dropped
///   guard) is closed, and the server frees the lock when the end reaches
///   it: a round trip later, or once a stalled network is back. Await
///   [`LeaseGuard::release`](crate::LeaseGuard::release) to know the lock
///   is gone.
///
/// A heartbeat that fails, or finds the lock gone, loses the lease at once.
/// One that does not answer in time keeps the lock: the holder's token
/// fires `grace` before the lock could pass on, and the lock stays held
/// while the body stops — until it releases, or until a ttl after the last
/// answered heartbeat was sent, when the connection is closed. Clones share
/// their locks.
///
/// # What it cannot do
///
/// - **No `once_per`** ([`Job::once_per`](crate::Job::once_per)), **no
///   value** ([`Election::proclaim`](crate::Election::proclaim)): no record
///   keeps them. Both fail with [`Error::Unsupported`].
/// - **Only the immediate forced release**: with a lock delay,
///   [`force_release`](Backend::force_release) is [`Error::Unsupported`]
///   (the lock ends with its session); [`force_release_now`](Backend::force_release_now).
///
/// # Runtime shutdown
///
/// If the runtime that renews a [`Lease`](crate::Lease) shuts down, its
/// tokens are cancelled but its locks stay held until the last clone of
/// this backend (with the `Lease` and guards that keep one) is dropped, or
/// the process exits: give each runtime its own `Lease` and let it go with
/// the runtime, as the values created in a `#[tokio::main]` `main` do.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let lease = leasehold::Lease::new(leasehold::backend::PgAdvisory::new(pool));
/// let ttl = std::time::Duration::from_secs(30); // a heartbeat every 10 s
/// let outcome = lease.with_lease("nightly-report", ttl, |token| async move {
///     // `token` is cancelled if the lock's connection dies
/// });
/// println!("{:?}", outcome.await);
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Dropping an `acquire` or `release` future closes the connection it has
/// out: a dropped acquire whose lock was granted leaves no lock behind. A
/// heartbeat runs in a task of its own, bounded by its own timeout, so a
/// renewal the engine stops waiting for is not cut off.
#[derive(Clone)]
pub struct PgAdvisory {
    pool: PgPool,
    held: Arc<Mutex<HeldLocks>>,
    key_of: fn(&str) -> i64,
    /// The waiters' listener, started by the first waiter ([`Backend::released`]).
    push: Arc<OnceLock<Push<PgSource>>>,
    fencing: Option<Arc<Fencing>>,
    watch: bool,
}

/// The locks a backend and its clones hold, by `(name, holder)`.
type HeldLocks = HashMap<(String, String), Arc<HeldLock>>;

/// One held lock: its key, its fencing token, and its connection.
struct HeldLock {
    key: i64,
    /// The token its acquisition returned (`None` without fencing): what an
    /// idempotent re-acquire returns again, and what renew and release compare.
    fence: Option<u64>,
    /// The holding session's pid, for logs.
    pid: i32,
    turn: tokio::sync::Mutex<()>,
    /// A std mutex, never held across an `.await`: the watch polls under it.
    state: Mutex<HeldLockState>,
}

struct HeldLockState {
    /// `None` while an operation has the connection out, and once it ended.
    conn: Option<LockConn>,
    /// A ttl after the last answered heartbeat (or the acquisition) was
    /// sent: a heartbeat still unanswered then (and ttl/3 after it was sent)
    /// closes the connection.
    expires: Instant,
    /// Released, lost or replaced: nothing may put the connection back.
    ended: bool,
    /// The watches of this lock: woken when the connection is put back (an
    /// operation's reads took the socket's wake-up from them) or it ends.
    watchers: Vec<Waker>,
}

impl HeldLock {
    fn state(&self) -> MutexGuard<'_, HeldLockState> {
        // Every update is a few assignments that cannot panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Put the connection back after a heartbeat that answered, with the
    /// lock's new `expires`; `Err` with it, to close, if the lock ended meanwhile.
    fn put_back(&self, conn: LockConn, expires: Instant) -> Result<(), LockConn> {
        let mut state = self.state();
        if state.ended {
            return Err(conn);
        }
        state.conn = Some(conn);
        state.expires = expires;
        state.watchers.drain(..).for_each(Waker::wake);
        Ok(())
    }

    /// End the lock: its connection, unless an operation has it out (which
    /// then closes it). Dropping it closes it.
    fn end(&self) -> Option<LockConn> {
        let mut state = self.state();
        state.ended = true;
        state.watchers.drain(..).for_each(Waker::wake);
        state.conn.take()
    }
}

/// A lock's session: a plain pool connection, or one taken through a
/// [`PgListener`], whose socket the watch can read while it is idle.
enum SessionConn {
    Plain(PoolConnection<Postgres>),
    Watched(Box<PgListener>),
}

/// A lock's connection: [`close`]d, never returned to the pool, when
/// dropped, unless disarmed after a confirmed unlock or a refused attempt.
type LockConn = DropGuard<SessionConn>;

impl SessionConn {
    /// The connection to run a statement on.
    async fn connection(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        match self {
            SessionConn::Plain(conn) => Ok(&mut **conn),
            SessionConn::Watched(listener) => listener.acquire().await,
        }
    }

    /// Run `sql`, which takes the key `$1` and answers one boolean.
    async fn query_bool(&mut self, sql: &'static str, key: i64) -> Result<bool, sqlx::Error> {
        let conn = self.connection().await?;
        sqlx::query_scalar(sql).bind(key).fetch_one(conn).await
    }
}

/// Close a lock's connection here and now, wherever this runs, without
/// blocking or panicking. Dropping a pool connection or a listener spawns a
/// task that returns it to the pool, which must never run for a lock's
/// connection (issue 29): after a stall it would put the session back in
/// the pool with its lock once the network is back, and hold a pool slot
/// until then. With a shut-down runtime entered, that task is dropped
/// inside `spawn`, and the connection with it (sqlx takes it out of the
/// pool's count first). The server frees the lock when the end reaches it.
fn close(conn: SessionConn) {
    match Handle::try_current() {
        // A thread-local's destructor: no runtime can be entered on this
        // thread any more. On a thread of its own, or leaked if none starts.
        Err(e) if e.is_thread_local_destroyed() => {
            let conn = ManuallyDrop::new(conn);
            let started = std::thread::Builder::new()
                .name("lease-pg-close".to_owned())
                .spawn(move || close(ManuallyDrop::into_inner(conn)));
            if let Err(e) = started {
                tracing::error!(error = %e, "no thread to close an advisory lock's connection");
            }
        }
        _ => {
            let _entered = shut_down_runtime().enter();
            drop(conn);
        }
    }
}

/// A runtime that has shut down, whose handle [`close`] enters.
fn shut_down_runtime() -> &'static Handle {
    static DEAD: OnceLock<Handle> = OnceLock::new();
    DEAD.get_or_init(|| {
        let runtime = runtime::Builder::new_current_thread()
            .build()
            .expect("BUG: a current-thread runtime without drivers cannot fail to build");
        let handle = runtime.handle().clone();
        // Allowed inside another runtime, unlike dropping it.
        runtime.shutdown_background();
        handle
    })
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
            key_of: Self::key,
            push: Arc::default(),
            fencing: None,
            watch: true,
        }
    }

    /// The same backend, watching the connection of each held lock (`true`,
    /// the default) or not: a lock's session that ends is then noticed at
    /// the next heartbeat (within `ttl/3`), not at once ([`Backend::lost`]),
    /// and its connection needs no `UNLISTEN *` on its way back to the pool.
    pub fn with_watch(mut self, watch: bool) -> Self {
        self.watch = watch;
        self
    }

    /// Does this backend watch the connections of its locks
    /// ([`with_watch`](PgAdvisory::with_watch))?
    pub fn watches(&self) -> bool {
        self.watch
    }

    /// The same backend, with `key` deriving the advisory-lock key (in the
    /// single-`bigint` key space) of each lease name instead of
    /// [`key`](PgAdvisory::key): to share locks with programs that derive
    /// keys another way, such as the Go `lock.PG` locker. `key` must be a
    /// pure function of the name; two names with one key are one lock.
    ///
    /// ```
    /// # async fn f(pool: sqlx::PgPool) {
    /// fn fnv1a(name: &str) -> i64 {
    ///     let fold = |h: u64, b: u8| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    ///     name.bytes().fold(0xcbf2_9ce4_8422_2325, fold) as i64
    /// }
    /// let advisory = leasehold::backend::PgAdvisory::new(pool).with_key(fnv1a);
    /// assert_eq!(advisory.lock_key("nightly-report"), fnv1a("nightly-report"));
    /// # }
    /// ```
    pub fn with_key(mut self, key: fn(&str) -> i64) -> Self {
        self.key_of = key;
        self
    }

    /// The advisory-lock key this backend locks for the lease `name`:
    /// [`key`](PgAdvisory::key) unless [`with_key`](PgAdvisory::with_key)
    /// set another derivation.
    pub fn lock_key(&self, name: &str) -> i64 {
        (self.key_of)(name)
    }

    /// The default key of a lease name: exactly the key of sqlx's
    /// [`PgAdvisoryLock::new(name)`](sqlx::postgres::PgAdvisoryLock::new),
    /// in the single-`bigint` key space.
    ///
    /// ```
    /// use leasehold::backend::PgAdvisory;
    /// use sqlx::postgres::{PgAdvisoryLock, PgAdvisoryLockKey};
    ///
    /// let key = PgAdvisory::key("nightly-report");
    /// assert_eq!(PgAdvisoryLock::new("nightly-report").key(), &PgAdvisoryLockKey::BigInt(key));
    /// ```
    pub fn key(name: &str) -> i64 {
        PgAdvisoryLock::new(name)
            .key()
            .as_bigint()
            .expect("BUG: PgAdvisoryLock::new always derives a key in the bigint key space")
    }

    /// The DDL of the default fence table, `lease_fences`, as a migration
    /// (`migrations/postgres/0002_lease_fences.sql`): the statement
    /// [`ensure_schema`](PgAdvisory::ensure_schema) runs, then `;` and a
    /// newline. Columns: `name TEXT PRIMARY KEY`, `fence BIGINT NOT NULL`
    /// (the last token handed out for the name).
    ///
    /// ```
    /// use leasehold::backend::PgAdvisory;
    ///
    /// assert!(PgAdvisory::FENCE_SCHEMA.starts_with("CREATE TABLE IF NOT EXISTS lease_fences ("));
    /// ```
    pub const FENCE_SCHEMA: &'static str = concat!(create_fence_table!("lease_fences"), ";\n");

    /// The same backend with fencing tokens: each granted acquisition also
    /// bumps the lease name's counter in the fence table `table` (`name` or
    /// `schema.name`), in the statement that takes the lock. The token is:
    ///
    /// - **strictly increasing per name** across the granted acquisitions
    ///   of every process that locks the name with fencing on the table
    ///   (nothing resets the counter, not even
    ///   [`force_release_now`](Backend::force_release_now));
    /// - **one per acquisition**: an idempotent re-acquire returns it again,
    ///   and renew and release compare it, so an older acquisition's late
    ///   release does not end a newer one;
    /// - a protection only where the **resource checks it**: a holder whose
    ///   session ended believes it holds until it learns of the end.
    ///
    /// Create the table ([`ensure_schema`](PgAdvisory::ensure_schema),
    /// [`FENCE_SCHEMA`](PgAdvisory::FENCE_SCHEMA)); without it every
    /// acquisition fails with [`Error::Database`]. PostgreSQL 12 or later.
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), leasehold::Error> {
    /// let advisory = leasehold::backend::PgAdvisory::new(pool).with_fencing("lease_fences")?;
    /// advisory.ensure_schema().await?;
    /// let lease = leasehold::Lease::new(advisory);
    /// if let Some(guard) = lease.try_acquire("nightly-report", std::time::Duration::from_secs(30)).await? {
    ///     assert!(guard.fencing_token() >= Some(1));
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTable`] when `table` is not `[A-Za-z_][A-Za-z0-9_]*`
    /// (at most 63 bytes), once or twice separated by one `.`: the name is
    /// used unquoted (PostgreSQL folds it to lower case).
    pub fn with_fencing(mut self, table: &str) -> Result<Self, Error> {
        self.fencing = Some(Arc::new(Fencing::on(table)?));
        Ok(self)
    }

    /// The fence table, as given to [`with_fencing`](PgAdvisory::with_fencing);
    /// `None` without fencing.
    pub fn fence_table(&self) -> Option<&str> {
        self.fencing.as_deref().map(|f| &*f.table)
    }

    /// The statement that creates the fence table, as
    /// [`ensure_schema`](PgAdvisory::ensure_schema) runs it (for
    /// `lease_fences`, [`FENCE_SCHEMA`](PgAdvisory::FENCE_SCHEMA) without its
    /// `;` and newline); `None` without fencing.
    pub fn fence_schema(&self) -> Option<&str> {
        self.fencing.as_deref().map(|f| &*f.create)
    }

    /// Creates the fence table if it does not exist; without fencing, does
    /// nothing. Safe to call from many processes at once (one at a time
    /// under the advisory lock `(1818583411, 1)`, as `PgTable`'s).
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the server cannot be reached or refuses the
    /// statement (for example a missing schema or privilege).
    pub async fn ensure_schema(&self) -> Result<(), Error> {
        let Some(fencing) = self.fencing.as_deref() else {
            return Ok(());
        };
        crate::backend::table::pg::create_one_at_a_time(&self.pool, &fencing.create).await?;
        Ok(())
    }

    fn held(&self) -> MutexGuard<'_, HeldLocks> {
        // Every update of the map is a single insert or remove.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self, name: &str, holder: &str) -> Option<Arc<HeldLock>> {
        let k = (name.to_owned(), holder.to_owned());
        self.held().get(&k).cloned()
    }

    /// Take the lock of `(name, holder)` out of the map if `which` says so.
    fn remove(
        &self,
        name: &str,
        holder: &str,
        which: impl FnOnce(&Arc<HeldLock>) -> bool,
    ) -> Option<Arc<HeldLock>> {
        let mut held = self.held();
        let k = (name.to_owned(), holder.to_owned());
        held.get(&k).is_some_and(which).then(|| held.remove(&k))?
    }

    /// Is `lock` the acquisition `lease`? With fencing, the tokens must
    /// match; without, name and holder (the map's key) are all there is.
    fn is_acquisition(&self, lock: &HeldLock, lease: Acquisition<'_>) -> bool {
        self.fencing.is_none() || lock.fence == lease.fencing_token
    }

    /// A connection from the pool for a lock: through a listener if watched.
    async fn connect(&self) -> Result<SessionConn> {
        if !self.watch {
            return Ok(SessionConn::Plain(self.pool.acquire().await?));
        }
        let mut listener = PgListener::connect_with(&self.pool).await?;
        // The watch must see the session's end, not a new connection, and
        // a held connection keeps the pool open, as a plain one does.
        listener.eager_reconnect(false);
        listener.ignore_pool_close_event(true);
        Ok(SessionConn::Watched(Box::new(listener)))
    }

    /// The heartbeat: does the connection of `lock` still hold it?
    /// `Ok(false)` if not (its session ended or lost the lock, or the
    /// connection failed): the lock ends, its connection closed.
    /// [`Error::Timeout`] if it has not answered within `ttl/3`: it runs on,
    /// and the lock with it, as long as the lock `expires` allows.
    async fn check(
        &self,
        name: &str,
        holder: &str,
        lock: Arc<HeldLock>,
        ttl: Duration,
    ) -> Result<bool> {
        let (this, name, holder) = (self.clone(), name.to_owned(), holder.to_owned());
        // In a task of its own, so that a caller that stops waiting (this
        // one at ttl/3, or the engine) does not cut the query off: a
        // connection whose query was cut off would have to be closed, and
        // the lock with it, as the holder's token fires (its
        // body has `grace` left). A release waits for the task instead.
        let task = tokio::spawn(async move {
            let turn = lock.turn.lock().await;
            let (conn, expires) = {
                let mut state = lock.state();
                (state.conn.take(), state.expires)
            };
            let why = match conn {
                None => "it ended".to_owned(),
                // Closed at the end of its arm, unless put back.
                Some(mut conn) => {
                    // No heartbeat for a while (no expiry): still ttl/3 for this one.
                    let sent = Instant::now();
                    let until = expires.max(sent + ttl / 3);
                    match timeout_at(until, conn.query_bool(HEARTBEAT, lock.key)).await {
                        Ok(Ok(true)) => match lock.put_back(conn, sent + ttl) {
                            Ok(()) => return true,
                            Err(_) => "it was replaced meanwhile".to_owned(),
                        },
                        Ok(Ok(false)) => "its session no longer holds the lock".to_owned(),
                        Ok(Err(e)) => format!("the heartbeat failed: {}", Error::from(e).chain()),
                        Err(_) => format!("the heartbeat did not answer in {:?}", until - sent),
                    }
                }
            };
            let pid = lock.pid;
            tracing::debug!(lease.name = name, holder, pid, "advisory lock lost: {why}");
            drop(lock.end());
            drop(turn);
            drop(this.remove(&name, &holder, |l| Arc::ptr_eq(l, &lock)));
            false
        });
        let limit = ttl / 3;
        match timeout(limit, task).await {
            // A task dropped unfinished (its runtime is shutting down)
            // closed the connection it had out.
            Ok(held) => Ok(held.unwrap_or(false)),
            Err(_) => Err(Error::Timeout {
                operation: "renew",
                after: limit,
            }),
        }
    }
}

impl Backend for PgAdvisory {
    /// [`Error::NoRuntime`] outside a tokio runtime.
    // An idempotent re-acquire runs the heartbeat instead of locking again
    // (session locks would stack).
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        validate::call(name, holder, ttl)?;
        Handle::try_current().map_err(|_| Error::NoRuntime)?;
        if let Some(lock) = self.lock(name, holder) {
            let fence = lock.fence;
            if self.check(name, holder, lock, ttl).await? {
                return Ok(Some(Grant::new(fence)));
            }
        }
        let key = self.lock_key(name);
        let expires = Instant::now() + ttl;
        // Closed, with any lock on it, if this future is dropped or fails.
        let mut conn: LockConn = DropGuard::new(self.connect().await?, close);
        let (locked, pid, fence): (bool, i32, Option<i64>) = match self.fencing.as_deref() {
            None => sqlx::query_as::<_, (bool, i32)>(LOCK)
                .bind(key)
                .fetch_one(conn.connection().await?)
                .await
                .map(|(locked, pid)| (locked, pid, None))?,
            Some(fencing) => {
                sqlx::query_as(AssertSqlSafe(fencing.acquire.clone()))
                    .bind(key)
                    .bind(name)
                    .fetch_one(conn.connection().await?)
                    .await?
            }
        };
        let fence = match (&self.fencing, locked, fence.map(u64::try_from)) {
            (None, _, _) | (_, false, _) => None,
            (Some(_), true, Some(Ok(fence))) => Some(fence),
            (Some(fencing), true, other) => {
                let e = format!(
                    "fence table {} gave {name:?} the token {other:?}",
                    fencing.table
                );
                return Err(Error::Protocol(e));
            }
        };
        if !locked {
            drop(conn.disarm());
            return Ok(None);
        }
        let state = Mutex::new(HeldLockState {
            conn: Some(conn),
            expires,
            ended: false,
            watchers: Vec::new(),
        });
        let lock = HeldLock {
            key,
            fence,
            pid,
            turn: Default::default(),
            state,
        };
        let k = (name.to_owned(), holder.to_owned());
        let stale = self.held().insert(k, Arc::new(lock));
        // This session holds the lock, so no other does: a lock still in the
        // map for this name and holder is stale. Ending it closes its
        // connection (after any heartbeat in flight on it).
        drop(stale.and_then(|stale| stale.end()));
        tracing::debug!(
            lease.name = name,
            holder,
            pid,
            fence,
            "advisory lock acquired"
        );
        Ok(Some(Grant::new(fence)))
    }

    /// The heartbeat: `Ok(false)` once the lock is gone or its connection
    /// failed. [`Error::Timeout`] if it has not answered within `ttl/3`; the
    /// lock is then kept a while (see [`PgAdvisory`]).
    // The heartbeat checks `pg_locks` for our own pid and key. With fencing,
    // the token must be the held acquisition's.
    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        validate::call(lease.name, lease.holder, ttl)?;
        match self.lock(lease.name, lease.holder) {
            Some(lock) if self.is_acquisition(&lock, lease) => {
                self.check(lease.name, lease.holder, lock, ttl).await
            }
            _ => Ok(false),
        }
    }

    // `pg_advisory_unlock` on the holding connection, which goes back to the
    // pool only if the unlock succeeded; otherwise it is closed. With
    // fencing, the token must be the held acquisition's.
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let (name, holder) = (lease.name, lease.holder);
        let Some(lock) = self.remove(name, holder, |l| self.is_acquisition(l, lease)) else {
            return Ok(());
        };
        // Waits for a heartbeat in flight on this connection.
        let _turn = lock.turn.lock().await;
        let Some(mut conn) = lock.end() else {
            return Ok(());
        };
        let pid = lock.pid;
        if conn.query_bool(UNLOCK, lock.key).await? {
            drop(conn.disarm());
            tracing::debug!(lease.name = name, holder, pid, "advisory lock released");
        } else {
            let what = "advisory lock not held by its connection at release; closing it";
            tracing::warn!(lease.name = name, holder, pid, "{what}");
        }
        Ok(())
    }

    /// Who holds the lock, from `pg_locks`. `holder` is the holding
    /// *session* (PostgreSQL never sees the holder identity):
    /// `"{application_name} (pid {pid})"`, or `"pid {pid}"` without an
    /// `application_name` (set one, say the pod's name, to recognise the
    /// leader), with ` (shared)` after another program's shared lock;
    /// `expires_in` is [`Duration::MAX`]; `fencing_token` the name's counter.
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        validate::name(name)?;
        let key = self.lock_key(name);
        let row: Option<(String, Option<i64>)> = match self.fencing.as_deref() {
            None => {
                sqlx::query_as(HOLDER)
                    .bind(key)
                    .fetch_optional(&self.pool)
                    .await?
            }
            Some(fencing) => {
                let query = sqlx::query_as(AssertSqlSafe(fencing.holder.clone()));
                query
                    .bind(key)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?
            }
        };
        Ok(row.map(|(holder, fence)| {
            let fence = fence.and_then(|f| u64::try_from(f).ok());
            LeaseInfo::new(name, holder, Some(Duration::MAX), fence)
        }))
    }

    /// Every exclusive advisory lock on a 64-bit key in this database, from
    /// `pg_locks`. PostgreSQL knows keys, not names: a lock of this backend
    /// value is listed by its lease name (and token), any other as `#` and
    /// its key in decimal (`#-5188171837425302540`). `holder` and
    /// `expires_in` as [`inspect`](Backend::inspect) gives them.
    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        let rows: Vec<(i64, String)> = sqlx::query_as(LOCKS).fetch_all(&self.pool).await?;
        let held = self.held();
        let names: HashMap<i64, (&str, Option<u64>)> = held
            .iter()
            .map(|((name, _), lock)| (lock.key, (name.as_str(), lock.fence)))
            .collect();
        let info = |(key, holder): (i64, String)| {
            let (name, fence) = match names.get(&key) {
                Some(&(name, fence)) => (name.to_owned(), fence),
                None => (format!("#{key}"), None),
            };
            LeaseInfo::new(name, holder, Some(Duration::MAX), fence)
        };
        Ok(rows.into_iter().map(info).collect())
    }

    /// Always [`Error::Unsupported`]: an advisory lock ends with its
    /// session, and once the session has ended nothing stops the next
    /// acquisition, so no lock delay can be kept.
    /// [`force_release_now`](Backend::force_release_now) is the kind this
    /// backend offers: for a holder known to be dead.
    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        Err(Error::Unsupported {
            operation: "force_release",
        })
    }

    /// Ends the *session* that holds the lock (`pg_terminate_backend`,
    /// waiting up to 5 s): `Ok(true)` once it has ended, `Ok(false)` if no
    /// session held it. The lock is free at once, while a holder still
    /// running learns of it only when the end reaches its connection. For
    /// another program that ends all its locks and its transaction. Needs
    /// PostgreSQL 14 and a role allowed to end the session (else
    /// [`Error::Database`]).
    async fn force_release_now(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        let ended: Vec<bool> = sqlx::query_scalar(TERMINATE)
            .bind(self.lock_key(name))
            .fetch_all(&self.pool)
            .await?;
        Ok(ended.contains(&true))
    }

    /// A notification on the channel `lease_advisory`, which a release sends
    /// with the lock's key (names that share a key share the lock, and wake
    /// each other's waiters). A lock that ends with its session notifies
    /// nobody; its waiters poll.
    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        let pool = self.pool.clone();
        let channel = CHANNEL.to_owned();
        let push = self
            .push
            .get_or_init(|| Push::new(PgSource { pool, channel }));
        push.released(self.lock_key(name).to_string(), poll)
    }

    /// Watched (the default), resolves when the session holding the lock
    /// ends (the server's termination message, or the socket closed or
    /// reset), about when it happens. `None` [`with_watch(false)`](PgAdvisory::with_watch).
    fn lost(&self, lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        let lock = self.lock(lease.name, lease.holder);
        let lock = lock.filter(|lock| self.watch && self.is_acquisition(lock, lease))?;
        let (name, holder) = (lease.name.to_owned(), lease.holder.to_owned());
        Some(watch::session_end(Arc::downgrade(&lock), name, holder))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    /// Spawns a task that holds its value when dropped (as sqlx's pool
    /// connection, dropped in the listener's task, spawns its return).
    struct SpawnOnDrop(Option<Arc<()>>);

    impl Drop for SpawnOnDrop {
        fn drop(&mut self) {
            let held = self.0.take();
            drop(tokio::spawn(async move {
                let _held = held;
                std::future::pending::<()>().await;
            }));
        }
    }

    /// What `close` relies on: a task spawned (as sqlx spawns a pool
    /// connection's return, or the listener its `UNLISTEN *`) on the handle
    /// of a runtime that has shut down is dropped at once, inside `spawn`,
    /// and so is a task that its drop spawns; nothing panics.
    #[test]
    fn a_task_spawned_on_a_runtime_that_shut_down_is_dropped_at_once() {
        let _entered = super::shut_down_runtime().enter();
        let (outer, nested) = (Arc::new(()), Arc::new(()));
        let held = (outer.clone(), SpawnOnDrop(Some(nested.clone())));
        drop(tokio::spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        }));
        assert_eq!(Arc::strong_count(&outer), 1, "the task was kept");
        let kept = "the task spawned by the task's drop was kept";
        assert_eq!(Arc::strong_count(&nested), 1, "{kept}");
    }
}
