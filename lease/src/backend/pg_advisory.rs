//! [`PgAdvisory`]: PostgreSQL session advisory locks, one connection per held lock.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgAdvisoryLock, PgListener, PgPool, Postgres};
use tokio::runtime::{self, Handle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::push::Push;
use crate::backend::push::pg::PgSource;
use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, Result, validate};

/// Is the session running this query holding the exclusive advisory lock on
/// the bigint key `$1`? PostgreSQL shows a bigint key in `pg_locks` as
/// `classid` = its high 32 bits, `objid` = its low 32 bits, `objsubid = 1`
/// (the `(int4, int4)` key space uses `objsubid = 2`).
const HEARTBEAT: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks \
     WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
     AND mode = 'ExclusiveLock' AND objsubid = 1 \
     AND classid::int8 = (($1::int8 >> 32) & 4294967295) \
     AND objid::int8 = ($1::int8 & 4294967295))";

/// How many derived keys a backend keeps ([`PgAdvisory::lock_key`]).
const KEY_CACHE: usize = 1024;

/// How long a [`Spare`] waits for the next acquisition before it goes back
/// to the pool.
const SPARE_IDLE: Duration = Duration::from_secs(1);

/// How long a watched connection may stay out of the pool as a [`Spare`]
/// and its reuses in all: after that it goes back at its next release, so
/// that the pool's own rules (`max_lifetime`, `after_release`) still see it.
const SPARE_OUT: Duration = Duration::from_secs(60);

/// At most this many [`Spare`]s for a backend value and its clones.
const MAX_SPARES: usize = 4;

/// The channel every `PgAdvisory` notifies when it unlocks a key, with the
/// key (in decimal) as the payload. (A `PgTable`'s channel always has a
/// `:`, this one none: they never meet.)
pub(crate) const CHANNEL: &str = "lease_advisory";

/// Unlock the key `$1` on the session that holds it and, only if it was
/// held, notify [`CHANNEL`] with the key, in the same statement (one round
/// trip; PostgreSQL evaluates a `CASE` branch only when it is taken, and
/// delivers the notification when the statement commits, after the unlock).
const UNLOCK: &str = "SELECT CASE WHEN pg_advisory_unlock($1) \
     THEN (SELECT true FROM pg_notify('lease_advisory', $1::text)) ELSE false END";

/// The query of [`HOLDER`], with `$columns` after its own.
macro_rules! holder_query {
    ($columns:literal) => {
        concat!(
            "SELECT l.pid, a.application_name::text, l.mode = 'ExclusiveLock'",
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

/// The session holding the key `$1` in this database, if any (an exclusive
/// lock first, then a shared one): its pid and `application_name` (NULL
/// when this user may not see it).
const HOLDER: &str = holder_query!("");

/// Every exclusive advisory lock on a bigint key in this database, by key:
/// the key (rebuilt from `classid`, its high 32 bits, and `objid`, its low
/// 32 bits), the holding session's pid and `application_name`.
const LOCKS: &str = "SELECT ((l.classid::int8 << 32) | l.objid::int8), l.pid, \
     a.application_name::text \
     FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
     AND l.mode = 'ExclusiveLock' \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     ORDER BY 1, l.pid";

/// End the session holding the exclusive lock on the key `$1` in this
/// database, waiting up to 5 s for it to end (PostgreSQL 14 and later):
/// one row per session, true if it ended in time.
const TERMINATE: &str = "SELECT pg_terminate_backend(l.pid, 5000) FROM pg_locks l \
     WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
     AND l.mode = 'ExclusiveLock' \
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
     AND l.classid::int8 = (($1::int8 >> 32) & 4294967295) \
     AND l.objid::int8 = ($1::int8 & 4294967295)";

/// The `CREATE TABLE` of the fence table `$table`: with `"{table}"` the
/// template of every table, with `"lease_fences"` [`PgAdvisory::FENCE_SCHEMA`].
/// One text, so the two cannot drift apart.
macro_rules! create_fence_table {
    ($table:literal) => {
        concat!(
            "CREATE TABLE IF NOT EXISTS ",
            $table,
            " (\n    \
             name TEXT PRIMARY KEY,\n    \
             fence BIGINT NOT NULL\n)"
        )
    };
}

/// With fencing ([`PgAdvisory::with_fencing`]), the acquisition: try the
/// lock on the key `$1` and, only if it was granted, bump the counter of the
/// name `$2` in the fence table, in one statement (one round trip, and no
/// grant without its token). `lock` is `MATERIALIZED`, so the lock is tried
/// exactly once; PostgreSQL runs a data-modifying CTE whether or not the
/// outer query reads it, so the `WHERE granted` is what keeps a refused
/// attempt from bumping the counter. The upsert updates the newest
/// committed row even when it is newer than the statement's snapshot (`ON
/// CONFLICT DO UPDATE` locks it first), so a token is always larger than
/// every token handed out before it.
const FENCED_ACQUIRE: &str = "WITH lock AS MATERIALIZED \
     (SELECT pg_try_advisory_lock($1) AS granted, pg_backend_pid() AS pid), \
     bumped AS (INSERT INTO {table} AS f (name, fence) SELECT $2, 1 FROM lock WHERE granted \
     ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1 RETURNING fence) \
     SELECT lock.granted, lock.pid, (SELECT fence FROM bumped) FROM lock";

/// With fencing, [`HOLDER`] and the name `$2`'s counter in the fence table.
const FENCED_HOLDER: &str = holder_query!(", (SELECT f.fence FROM {table} f WHERE f.name = $2)");

/// The fence table of a backend [`with_fencing`](PgAdvisory::with_fencing),
/// and its statements with the table's name filled in.
#[derive(Debug)]
struct Fencing {
    table: Box<str>,
    create: Box<str>,
    acquire: Arc<str>,
    holder: Arc<str>,
}

impl Fencing {
    /// The statements on `table` (validated).
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
/// No table, no migration (unless you want fencing tokens, see
/// [`with_fencing`](PgAdvisory::with_fencing)): any PostgreSQL database
/// will do. A lease is an
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
///   heartbeat has succeeded. This backend keeps that session open only
///   while the runtime that renews the lock runs (see
///   [Runtime shutdown](#runtime-shutdown)). A process that crashes loses its
///   locks as soon as PostgreSQL notices the dead connection — at once for a
///   clean exit or a killed process (the kernel closes the socket), but for a
///   host that vanishes only when TCP keepalive (the server's
///   `tcp_keepalives_*` settings) or `tcp_user_timeout` gives up. A process
///   that is paused but alive (a long GC or VM pause, `SIGSTOP`) keeps its
///   locks: nobody else can take them over in the meantime, but when it
///   resumes its token may already have been cancelled by the local deadline.
/// - **Takeover after the holder's connection dies**, not after `ttl`: as
///   soon as the session ends (for example `pg_terminate_backend`), the lock
///   is free for the next `try_acquire`. The old holder learns of it when
///   the end of the session reaches it: the backend watches each holding
///   connection ([Prompt loss](#prompt-loss)), so the server's termination
///   message or a reset cancels the token within milliseconds. **For those
///   milliseconds both believe they hold the lease** (the fault suite
///   measured at most a few, `docs/RELIABILITY.md`); without fencing,
///   nothing stops the old holder's writes. When the end does not reach
///   the holder (the connection hangs, a black hole), the heartbeat waits
///   out its own timeout of `ttl/3` first, so about `2·ttl/3`; unwatched
///   ([`with_watch(false)`](PgAdvisory::with_watch)), every loss waits for
///   the next heartbeat, up to `ttl/3` plus a round trip. That is the
///   price of the fast takeover (the table backends make the next holder
///   wait for the expiry instead). Use `PgTable` when two holders must
///   never overlap, or fencing tokens checked by the resource when their
///   writes must not.
/// - **No fencing token by default**: [`LeaseGuard::fencing_token`](crate::LeaseGuard::fencing_token)
///   is `None`. [`with_fencing`](PgAdvisory::with_fencing) gives each
///   acquisition one — a per-name counter in a table of its own, bumped in
///   the statement that takes the lock — strictly increasing per name
///   across the acquisitions that were granted. It stops a stale holder's
///   writes only where the protected resource checks it.
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
/// # Prompt loss
///
/// A lock ends with its session, and a session can end while its process
/// lives on: `pg_terminate_backend`, a reset connection, a server restart.
/// The next contender may then take the lock at once. So each holding
/// connection is watched while it is idle: the lock is taken on a
/// connection obtained through sqlx's [`PgListener`] (from the same pool,
/// listening to nothing), whose socket is read between queries the way a
/// listener waits for a notification. When the session's end reaches it —
/// the server's termination message and the socket's end, or a reset — the
/// connection is closed, and the backend tells the engine
/// ([`Backend::lost`]), which renews at once: the heartbeat finds the lock
/// gone and the token is cancelled, a few milliseconds after the session
/// ended instead of up to `ttl/3`. The heartbeat stays, for failures that
/// send nothing (a black hole).
///
/// What it costs: no connection of its own (the holding connection is
/// watched) and no statement while a lock is held; one wake-up after each
/// heartbeat. A watched connection would go back to the pool only after an
/// `UNLISTEN *` that sqlx's listener sends, so after a release or a refused
/// attempt it is kept aside instead ([Spare connections](#spare-connections)),
/// and goes back — with that statement — only when no acquisition has
/// taken it for a second. A watched connection that must be
/// closed rather than pooled (a failed heartbeat, a cancelled operation, a
/// runtime shutting down) first ends its own session
/// (`pg_terminate_backend(pg_backend_pid())`), which frees its lock:
/// sqlx's listener can only return its connection to the pool, and a
/// pooled connection must not keep a lock.
/// [`with_watch(false)`](PgAdvisory::with_watch) takes plain pool
/// connections instead; docs/PERFORMANCE.md measures both.
///
/// # Spare connections
///
/// A connection whose lock was released (or that took none: the name was
/// held) is kept aside for the next acquisition of this backend value or a
/// clone, on the same runtime, instead of going back to the pool at once:
/// a program that takes and releases locks in a row then uses one session,
/// with no `UNLISTEN *` and no turn through the pool per cycle
/// (docs/PERFORMANCE.md measures it). At most 4 are kept; each goes back
/// to the pool after a second untaken (or after a minute out of it in all,
/// at its next release, so that the pool's `max_lifetime` and
/// `after_release` still see it), at once when the pool is closed (so
/// [`PgPool::close`] does not wait for them), and none is kept when the
/// pool has no idle connection and no room for another — someone may be
/// waiting for it. A spare skips the pool's test of an idle connection
/// (`test_before_acquire`): a watched one's socket is looked at instead,
/// and an attempt on a spare whose session ended meanwhile is made again
/// on a connection from the pool (a lock granted on that session ended
/// with it). The pool's `size()` counts them; `num_idle()` does not.
///
/// # Release
///
/// Release runs `pg_advisory_unlock` on the holding connection. Only if that
/// returns `true` does the connection go back to the pool (or aside, as a
/// spare); otherwise (or on any error) it is closed, which ends the session
/// and every lock on it.
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
/// # Waiting
///
/// Releases are pushed. The unlock of a release notifies the channel
/// `lease_advisory` with the lock's key (in decimal), in the same statement
/// (`SELECT CASE WHEN pg_advisory_unlock($1) THEN (SELECT true FROM
/// pg_notify('lease_advisory', $1::text)) ELSE false END`: one round trip,
/// and nothing is sent when the lock was not held). The payload is the key,
/// not the name: what is locked is the key, so names that share one (or a
/// derivation set with [`with_key`](PgAdvisory::with_key)) wake each
/// other's waiters.
///
/// The first waiter ([`Lease::acquire`](crate::Lease::acquire) with a wait,
/// an [`Election`](crate::Election)) of a backend value starts a listener:
/// `LISTEN lease_advisory` on **one more connection of the pool** (sqlx's
/// `PgListener`: size the pool for it), shared by every waiter of that
/// value and its clones. It wakes the waiters of the unlocked key about
/// one round trip after the unlock, and they try to acquire (a notification
/// is never trusted). It is re-established after a failure (then every
/// waiter tries once more, as unlocks in between went unseen), and ends
/// 10 s after the last waiter is gone (the next one starts it again) or
/// with the last clone of the backend.
///
/// Waiters also poll (every `ttl/10`, at most 1 s, ±20%), and that is how
/// they learn of a lock that ended **with its session** — a crashed or
/// killed holder, a heartbeat that failed, a runtime shut down, the last
/// clone dropped, a program other than this crate unlocking — none of which
/// notifies: such a lock is taken about one poll after the session ends.
/// The same holds while the listener is down or not yet listening, behind
/// a transaction-mode pooler, and for a listening connection that died
/// without a word (noticed only when TCP gives up).
///
/// # Runtime shutdown
///
/// A lock without expiry must not outlive what renews it. Each held lock is
/// kept by the Tokio runtime of its last successful acquire or heartbeat —
/// the runtime that runs its `Lease`'s renewals, normally also the one that
/// acquired it — through a small task that this backend starts once on
/// every runtime that uses it. When that runtime shuts down while the lock
/// is held, the task is dropped and its drop closes the connection of every
/// lock the runtime keeps — even if the guards, their `Lease` and this
/// backend live on, as with a global default `Lease` used across
/// `#[tokio::test]` runtimes. The lock is then free for other sessions as
/// soon as the server sees the connection end, and the holder's token is
/// cancelled, since nothing renews the lease any more. (A runtime that
/// acquired a lock and shuts down before its first heartbeat ran on another
/// runtime closes it too; the holder then learns at its next heartbeat, as
/// when a connection dies.)
///
/// Closing a connection never blocks and never panics, inside a runtime or
/// outside any (the guard, the `Lease` or the last clone of this backend
/// dropped after the runtime is gone, or on another thread): outside, the
/// connection is closed on the runtime that acquired it, and if that runtime
/// is gone its socket is dropped at once.
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
    /// Keys already derived by `key_of`, by name: [`PgAdvisory::key`] is a
    /// keyed hash (HKDF-SHA-256) that cost about as much CPU as the rest of
    /// a `with_lease` cycle's own work together (a callgrind profile).
    keys: Arc<Mutex<HashMap<Box<str>, i64>>>,
    /// The waiters' listener, started by the first waiter and stopped
    /// with the last clone ([`Backend::released`]).
    push: Arc<OnceLock<Push<PgSource>>>,
    /// The fence table, if [`with_fencing`](PgAdvisory::with_fencing).
    fencing: Option<Arc<Fencing>>,
    /// Watch each holding connection ([`with_watch`](PgAdvisory::with_watch)).
    watch: bool,
}

/// The locks held, and the keeper of each runtime that keeps one.
#[derive(Debug, Default)]
struct HeldLocks {
    /// By `(name, holder)`.
    slots: HashMap<(String, String), Arc<Slot>>,
    /// The [`Keeper`] of each runtime that acquired or renewed a lock of
    /// this backend, until that runtime shuts down or the backend is dropped.
    keepers: HashMap<runtime::Id, Arc<KeeperLink>>,
    /// Watched connections put aside for the next acquisition, the most
    /// recent last.
    spares: Vec<Spare>,
}

/// A lock's connection that holds no lock any more — its lock was
/// released, or it took none — put aside for the next acquisition of the
/// same kind (watched or plain) on the same runtime instead of going back
/// to the pool: a watched one would go back only after an `UNLISTEN *` that
/// sqlx's listener sends (a statement and a task per cycle, the largest
/// part of the watch's cost in a profile), and the pool hands out its idle
/// connections in turn, each session colder than the last one used. The
/// [`Keeper`] of its runtime returns it to the pool after [`SPARE_IDLE`],
/// or at once when the pool is closed; see [`PgAdvisory::put_aside`] for
/// when one is kept.
struct Spare {
    /// `None` only while it is taken (or dropped).
    conn: Option<Conn>,
    /// The runtime it was put aside on (and whose keeper returns it).
    runtime: Handle,
    /// Put aside at.
    idle_since: Instant,
    /// When it left the pool ([`SPARE_OUT`]).
    taken_at: Instant,
}

impl std::fmt::Debug for Spare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spare")
            .field("idle_since", &self.idle_since)
            .finish_non_exhaustive()
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Back to the pool (sqlx spawns that), wherever this runs.
            in_runtime(&self.runtime, move || drop(conn));
        }
    }
}

impl Drop for HeldLocks {
    fn drop(&mut self) {
        // The last clone of the backend is gone: the keepers stop (the slots,
        // dropped with this map, close their connections).
        for link in self.keepers.values() {
            link.stop.cancel();
        }
    }
}

/// One held lock: the key, its fencing token, and its connection unless an
/// operation has it out.
#[derive(Debug)]
struct Slot {
    key: i64,
    /// The token its acquisition returned (`None` without fencing): what an
    /// idempotent re-acquire returns again, and what renew and release
    /// compare.
    fence: Option<u64>,
    /// Taken by every operation on the connection for as long as it runs,
    /// so that a release waits for a heartbeat in flight.
    turn: tokio::sync::Mutex<()>,
    /// The connection and its fate. A std mutex, never held across an
    /// `.await`, so that a keeper's drop can close the connection when no
    /// runtime is left to run anything.
    state: Mutex<SlotState>,
}

#[derive(Debug)]
struct SlotState {
    /// `None` while an operation has the connection out, and once it is gone.
    held: Option<Held>,
    /// The connection was released or closed, or is to be closed when the
    /// operation that has it out is done: nothing may put it back.
    ended: bool,
    /// The runtime that keeps it: the runtime of its last successful acquire
    /// or heartbeat. When that runtime shuts down, its [`Keeper`] ends it.
    runtime: runtime::Id,
    /// The tasks watching the connection ([`PgAdvisory::watch`]): woken when
    /// it is put back (an operation's reads took the socket's wake-up from
    /// them) or the slot ends.
    watchers: Vec<Waker>,
}

impl SlotState {
    fn wake_watchers(&mut self) {
        for w in self.watchers.drain(..) {
            w.wake();
        }
    }
}

impl Slot {
    fn new(key: i64, fence: Option<u64>, held: Held, runtime: runtime::Id) -> Arc<Self> {
        Arc::new(Self {
            key,
            fence,
            turn: tokio::sync::Mutex::new(()),
            state: Mutex::new(SlotState {
                held: Some(held),
                ended: false,
                runtime,
                watchers: Vec::new(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, SlotState> {
        // Every update is a few assignments that cannot panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection, to run a query on (under `turn`); `None` once the
    /// slot has ended.
    fn take(&self) -> Option<Held> {
        let mut state = self.state();
        if state.ended {
            return None;
        }
        state.held.take()
    }

    /// Put the connection back after a successful heartbeat: `Ok` with the
    /// runtime that keeps it, or `Err` with the connection, to close, if the
    /// slot ended meanwhile.
    fn put_back(&self, held: Held) -> Result<runtime::Id, Held> {
        let mut state = self.state();
        if state.ended {
            return Err(held);
        }
        state.held = Some(held);
        state.wake_watchers();
        Ok(state.runtime)
    }

    /// End the slot: nothing puts the connection back any more. Returns the
    /// connection unless an operation has it out (which then closes it) or
    /// it is gone; dropping it closes it.
    fn end(&self) -> Option<Held> {
        let mut state = self.state();
        state.ended = true;
        state.wake_watchers();
        state.held.take()
    }
}

/// What a runtime's [`Keeper`] shares with the backend.
#[derive(Debug, Default)]
struct KeeperLink {
    /// Tells the keeper to stop without ending anything: the backend is gone,
    /// or another keeper of the same runtime was registered first.
    stop: CancellationToken,
    /// The keeper was dropped: its runtime is shutting down (or refused to
    /// run it). Set before it ends its runtime's slots.
    gone: AtomicBool,
    /// The keeper has a timer for its runtime's spares (set and read under
    /// the map's lock): a spare put aside then needs no wake-up call.
    timing: AtomicBool,
    /// Wakes the keeper: a spare was put aside while it had no timer.
    spared: tokio::sync::Notify,
}

/// A task per runtime that acquires or renews locks of a backend, which
/// sees to it that no lock outlives what renews it. It waits until told to
/// stop. Dropped before — its runtime shuts down — it ends every slot that
/// runtime keeps (see [`SlotState::runtime`]) and closes their connections:
/// nothing renews those locks any more.
///
/// It also returns its runtime's [`Spare`]s to the pool: each after
/// [`SPARE_IDLE`] untaken, all of them when the pool is closed (whose
/// `close()` waits for every connection to come back).
struct Keeper {
    runtime: runtime::Id,
    link: Arc<KeeperLink>,
    locks: Weak<Mutex<HeldLocks>>,
    pool: PgPool,
    /// Told to stop: its drop ends nothing.
    stopped: bool,
}

impl Keeper {
    async fn run(mut self) {
        let mut closing = std::pin::pin!(self.pool.close_event());
        let mut closed = false;
        loop {
            let next = self.return_spares(closed);
            tokio::select! {
                biased;
                () = self.link.stop.cancelled() => break,
                () = &mut closing, if !closed => closed = true,
                () = self.link.spared.notified() => {}
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
            }
        }
        self.stopped = true;
    }

    /// Return this runtime's spares that waited [`SPARE_IDLE`] (`all`:
    /// every one) to the pool; when the next one is due, if any.
    fn return_spares(&self, all: bool) -> Option<Instant> {
        let locks = self.locks.upgrade()?;
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut returned = Vec::new();
        {
            let mut locks = locks.lock().unwrap_or_else(|e| e.into_inner());
            let mut kept = Vec::with_capacity(locks.spares.len());
            for spare in locks.spares.drain(..) {
                let due = spare.idle_since + SPARE_IDLE;
                if spare.runtime.id() != self.runtime {
                    kept.push(spare);
                } else if all || due <= now {
                    returned.push(spare);
                } else {
                    next = Some(next.map_or(due, |n| n.min(due)));
                    kept.push(spare);
                }
            }
            locks.spares = kept;
            self.link.timing.store(next.is_some(), Ordering::SeqCst);
        }
        // Returned under no lock.
        drop(returned);
        next
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        // Before the map is locked: a slot registered with this keeper from
        // now on is registered after the sweep below, which sees it, or it
        // sees `gone` and is not registered.
        self.link.gone.store(true, Ordering::SeqCst);
        let Some(locks) = self.locks.upgrade() else {
            return;
        };
        let mut closing = Vec::new();
        let mut removed = Vec::new();
        let spares: Vec<Spare>;
        {
            let mut locks = locks.lock().unwrap_or_else(|e| e.into_inner());
            if locks
                .keepers
                .get(&self.runtime)
                .is_some_and(|l| Arc::ptr_eq(l, &self.link))
            {
                locks.keepers.remove(&self.runtime);
            }
            locks.slots.retain(|(name, holder), slot| {
                let mut state = slot.state();
                if state.ended || state.runtime != self.runtime {
                    return true;
                }
                state.ended = true;
                // An operation that has the connection out closes it.
                let held = state.held.take();
                drop(state);
                tracing::debug!(
                    lease.name = name,
                    holder,
                    pid = held.as_ref().map(|h| h.pid),
                    "the runtime keeping the advisory lock is shutting down; closing its connection"
                );
                closing.extend(held);
                removed.push(slot.clone());
                false
            });
            let (ours, others) = std::mem::take(&mut locks.spares)
                .into_iter()
                .partition(|spare| spare.runtime.id() == self.runtime);
            locks.spares = others;
            spares = ours;
        }
        // Closed under no lock.
        drop(closing);
        drop(removed);
        drop(spares);
    }
}

#[derive(Debug)]
struct Held {
    conn: Armed,
    /// Backend pid of the holding session (for logs).
    pid: i32,
}

/// The connection of a lock: a plain pool connection, or one taken through a
/// [`PgListener`], whose socket can be watched while it is idle
/// ([`PgAdvisory::with_watch`]).
enum Conn {
    Plain(PoolConnection<Postgres>),
    Watched(Box<PgListener>),
}

/// Try the lock on the key `key` (with fencing, and bump the counter of
/// `name` if granted): whether it was granted, the session's pid, the token.
async fn try_lock<'c>(
    e: impl sqlx::PgExecutor<'c>,
    fencing: Option<&Fencing>,
    key: i64,
    name: &str,
) -> std::result::Result<(bool, i32, Option<i64>), sqlx::Error> {
    match fencing {
        None => {
            let (locked, pid): (bool, i32) =
                sqlx::query_as("SELECT pg_try_advisory_lock($1), pg_backend_pid()")
                    .bind(key)
                    .fetch_one(e)
                    .await?;
            Ok((locked, pid, None))
        }
        Some(fencing) => {
            sqlx::query_as(AssertSqlSafe(fencing.acquire.clone()))
                .bind(key)
                .bind(name)
                .fetch_one(e)
                .await
        }
    }
}

/// A lock's connection that is closed — never returned to the pool — when
/// dropped, unless [`disarm`](Armed::disarm)ed. The drop never blocks and
/// never panics, inside a runtime or not.
struct Armed {
    conn: Option<Conn>,
    /// The runtime it was acquired on: to close it on when dropped outside
    /// any runtime (if that runtime is gone too, its socket is dropped at once).
    runtime: Handle,
    /// The pool keeps `min_connections`: sqlx's drop of a pool connection
    /// then always spawns a task, and panics where it cannot.
    spawns_on_drop: bool,
    /// The watch saw the session end, and the listener let its connection
    /// go: there is nothing left to close.
    gone: bool,
    /// When it left the pool ([`SPARE_OUT`]).
    taken_at: Instant,
}

impl std::fmt::Debug for Armed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Armed")
    }
}

impl Armed {
    fn new(conn: Conn, runtime: Handle, pool: &PgPool, taken_at: Instant) -> Self {
        Self {
            conn: Some(conn),
            runtime,
            spawns_on_drop: pool.options().get_min_connections() > 0,
            gone: false,
            taken_at,
        }
    }

    fn conn(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("BUG: armed connection already taken")
    }

    /// Run `sql`, which takes the key `$1` and answers one boolean.
    async fn query_bool(&mut self, sql: &'static str, key: i64) -> Result<bool, sqlx::Error> {
        let query = sqlx::query_scalar::<_, bool>(sql).bind(key);
        match self.conn() {
            Conn::Plain(conn) => query.fetch_one(&mut **conn).await,
            Conn::Watched(listener) => query.fetch_one(&mut **listener).await,
        }
    }

    /// [`try_lock`] on this connection.
    async fn try_lock(
        &mut self,
        fencing: Option<&Fencing>,
        key: i64,
        name: &str,
    ) -> Result<(bool, i32, Option<i64>), sqlx::Error> {
        match self.conn() {
            Conn::Plain(conn) => try_lock(&mut **conn, fencing, key, name).await,
            Conn::Watched(listener) => try_lock(&mut **listener, fencing, key, name).await,
        }
    }

    /// The connection, to be returned to the pool when dropped (a watched
    /// one after `UNLISTEN *`, which sqlx's listener sends) or put aside
    /// ([`PgAdvisory::put_aside`]).
    fn disarm(mut self) -> Conn {
        self.conn
            .take()
            .expect("BUG: armed connection already taken")
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        match self.conn.take() {
            Some(Conn::Plain(conn)) => close(conn, &self.runtime, self.spawns_on_drop),
            Some(Conn::Watched(listener)) => close_watched(listener, &self.runtime, self.gone),
            None => {}
        }
    }
}

/// Close `conn` instead of returning it to the pool, wherever this runs:
/// without blocking, and without letting sqlx panic for want of a runtime.
fn close(mut conn: PoolConnection<Postgres>, runtime: &Handle, spawns_on_drop: bool) {
    match Handle::try_current() {
        // Closed gracefully in a task sqlx spawns here (Terminate, then the
        // socket; the pool keeps the permit until it is closed). On a runtime
        // that is shutting down, the task is dropped at once, and the socket
        // with it.
        Ok(_) => {
            conn.close_on_drop();
            drop(conn);
        }
        // Outside any runtime: the same on the runtime it was acquired on.
        Err(e) if !e.is_thread_local_destroyed() => {
            let _entered = runtime.enter();
            conn.close_on_drop();
            drop(conn);
        }
        // This thread's storage is being torn down: no runtime can be
        // entered here. With nothing to spawn, detaching drops the socket
        // right here.
        Err(_) if !spawns_on_drop => drop(conn.detach()),
        // Otherwise on a thread of its own.
        Err(_) => on_a_thread(conn, runtime.clone(), move |conn, runtime| {
            close(conn, &runtime, spawns_on_drop);
        }),
    }
}

/// How long ending a watched connection's session may take before its
/// listener is let go anyway.
const END_SESSION_LIMIT: Duration = Duration::from_secs(5);

/// Close a watched connection. sqlx's listener always returns its
/// connection to the pool when dropped (after `UNLISTEN *`), and a lock's
/// connection must not go back with its lock: so its session ends itself
/// first (`pg_terminate_backend(pg_backend_pid())`, which frees the lock
/// whatever state the connection was left in), and the pool's test of a
/// returned connection then discards it. In a task, on the runtime it was
/// acquired on when this runs outside any (entered, so that the listener's
/// own drop finds it), or on a thread of its own while this thread's
/// storage is torn down. A runtime that is shutting down drops the task at
/// once, and the socket with it. `gone`: the session has ended already.
fn close_watched(listener: Box<PgListener>, runtime: &Handle, gone: bool) {
    let task = async move {
        let mut listener = listener;
        if !gone {
            let end = sqlx::query("SELECT pg_terminate_backend(pg_backend_pid())")
                .execute(&mut *listener);
            let _ = tokio::time::timeout(END_SESSION_LIMIT, end).await;
        }
        drop(listener);
    };
    in_runtime(runtime, move || drop(tokio::spawn(task)));
}

/// Run `f` in a runtime's context, wherever this runs: here inside one;
/// outside any, with `runtime` entered; on a thread of its own (with
/// `runtime` entered) while this thread's storage is torn down.
fn in_runtime(runtime: &Handle, f: impl FnOnce() + Send + 'static) {
    match Handle::try_current() {
        Ok(_) => f(),
        Err(e) if !e.is_thread_local_destroyed() => {
            let _entered = runtime.enter();
            f();
        }
        Err(_) => on_a_thread(f, runtime.clone(), |f, runtime| {
            let _entered = runtime.enter();
            f();
        }),
    }
}

/// Run `f(value, runtime)` on a thread of its own: for what cannot be
/// dropped where this thread's storage is being torn down. If the thread
/// never starts, `value` is leaked rather than dropped here.
fn on_a_thread<T: Send + 'static>(
    value: T,
    runtime: Handle,
    f: impl FnOnce(T, Handle) + Send + 'static,
) {
    let value = Unclosed(Some(value));
    let started = std::thread::Builder::new()
        .name("lease-pg-close".to_owned())
        .spawn(move || {
            let mut value = value;
            if let Some(value) = value.0.take() {
                f(value, runtime);
            }
        });
    if let Err(e) = started {
        tracing::error!(
            error = %e,
            "could not start a thread to close an advisory lock's connection; \
             it stays open until the process exits"
        );
    }
}

/// What is on its way to a thread that closes it: if the thread never
/// starts, it is leaked rather than dropped where dropping it panics.
struct Unclosed<T>(Option<T>);

impl<T> Drop for Unclosed<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            std::mem::forget(value);
        }
    }
}

/// Resolves when the session of `slot`'s watched connection ends (the
/// server's termination, the socket closed or reset), or the slot ends
/// (released, lost, or its runtime shut down): [`Backend::lost`].
///
/// It reads the idle connection the way sqlx's listener waits for a
/// notification — one poll of `try_recv` at a time, dropped again, which
/// sqlx keeps cancel-safe — under the slot's lock, so never while an
/// operation has the connection out; the operation wakes it when it puts
/// the connection back ([`Slot::put_back`]), since its reads took the
/// socket's wake-up. A session that ended is closed at once and the slot
/// ended, so the engine's renewal that follows answers `false`.
fn watch(
    slot: Weak<Slot>,
    name: String,
    holder: String,
) -> impl Future<Output = ()> + Send + 'static {
    std::future::poll_fn(move |cx| {
        let Some(slot) = slot.upgrade() else {
            return Poll::Ready(());
        };
        let mut state = slot.state();
        if state.ended {
            return Poll::Ready(());
        }
        let ended = match state.held.as_mut() {
            Some(held) => match &mut held.conn.conn {
                Some(Conn::Watched(listener)) => match poll_session(listener, cx) {
                    Poll::Ready(why) => Some((why, held.pid)),
                    Poll::Pending => None,
                },
                // Not watched (a clone `with_watch(false)` took it).
                _ => None,
            },
            // An operation has it out; it wakes this when it puts it back.
            None => None,
        };
        let Some((why, pid)) = ended else {
            if !state.watchers.iter().any(|w| w.will_wake(cx.waker())) {
                state.watchers.push(cx.waker().clone());
            }
            return Poll::Pending;
        };
        state.ended = true;
        state.wake_watchers();
        let mut held = state.held.take();
        drop(state);
        if let Some(held) = &mut held {
            held.conn.gone = why.gone;
        }
        tracing::debug!(
            lease.name = name,
            holder,
            pid,
            "advisory lock lost: {}; closing its connection",
            why.what
        );
        drop(held);
        Poll::Ready(())
    })
}

/// Does `e` say that the session is gone: the socket failed, or the server
/// ended the session (SQLSTATE class `57P`: terminated by an administrator,
/// a crash or a shutdown; class `08`: a connection exception)?
fn session_ended(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) => true,
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("57P") || code.starts_with("08")),
        _ => false,
    }
}

/// Why a watched session ended.
struct SessionEnd {
    what: String,
    /// The listener let its connection go already.
    gone: bool,
}

/// One look at a watched, idle connection: `Ready` once its session has
/// ended. Nothing is sent on it; a notification (nothing `LISTEN`s on a
/// lock's connection) is read and ignored.
fn poll_session(listener: &mut PgListener, cx: &mut std::task::Context<'_>) -> Poll<SessionEnd> {
    loop {
        let polled = {
            let recv = std::pin::pin!(listener.try_recv());
            recv.poll(cx)
        };
        return match polled {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(Some(_))) => continue,
            Poll::Ready(Ok(None)) => Poll::Ready(SessionEnd {
                what: "the server closed its connection".to_owned(),
                gone: true,
            }),
            Poll::Ready(Err(e)) => Poll::Ready(SessionEnd {
                what: format!("its connection failed: {}", Error::from(e).chain()),
                gone: false,
            }),
        };
    }
}

impl std::fmt::Debug for PgAdvisory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAdvisory")
            .field("pool", &self.pool)
            .field("held", &self.held().slots.len())
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
            keys: Arc::default(),
            push: Arc::default(),
            fencing: None,
            watch: true,
        }
    }

    /// The same backend, watching the connection of each held lock (`true`,
    /// the default) or not (`false`); see [Prompt loss](PgAdvisory#prompt-loss).
    ///
    /// Unwatched, a lost session is noticed at the next heartbeat (within
    /// `ttl/3`), and the acquisition takes a plain pool connection: one
    /// statement fewer per acquisition attempt and release (the `UNLISTEN
    /// *` a watched connection sends on its way back to the pool).
    pub fn with_watch(mut self, watch: bool) -> Self {
        self.watch = watch;
        self
    }

    /// Does this backend watch the connections of its locks
    /// ([`with_watch`](PgAdvisory::with_watch))?
    pub fn watches(&self) -> bool {
        self.watch
    }

    /// The same backend, with `key` deriving the advisory-lock key of each
    /// lease name (instead of [`key`](PgAdvisory::key)): to share
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
    /// assert_eq!(advisory.lock_key("nightly-report"), fnv1a("nightly-report"));
    /// # }
    /// ```
    pub fn with_key(self, key: fn(&str) -> i64) -> Self {
        Self {
            key_of: key,
            // Keys derived the old way must not be used.
            keys: Arc::default(),
            ..self
        }
    }

    /// The advisory-lock key this backend locks for the lease `name`:
    /// [`key`](PgAdvisory::key) unless [`with_key`](PgAdvisory::with_key)
    /// set another derivation.
    pub fn lock_key(&self, name: &str) -> i64 {
        let keys = || self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&key) = keys().get(name) {
            return key;
        }
        // Derived outside the lock: other names need not wait for it.
        let key = (self.key_of)(name);
        let mut keys = keys();
        if keys.len() >= KEY_CACHE {
            // Names a process uses are few; a program that makes up new
            // ones without end pays a derivation each, as without the cache.
            keys.clear();
        }
        keys.insert(name.into(), key);
        key
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
    /// file: the `CREATE TABLE IF NOT EXISTS` that
    /// [`ensure_schema`](PgAdvisory::ensure_schema) runs for
    /// `with_fencing("lease_fences")`, then `;` and a newline — the text of
    /// `migrations/postgres/0002_lease_fences.sql` in the repository (a test
    /// holds them equal).
    ///
    /// | column | type | meaning |
    /// |---|---|---|
    /// | `name` | `TEXT PRIMARY KEY` | the lease name, compared byte for byte |
    /// | `fence` | `BIGINT NOT NULL` | the last fencing token handed out for the name |
    ///
    /// For a table named otherwise, use [`fence_schema`](PgAdvisory::fence_schema).
    ///
    /// # Examples
    ///
    /// ```
    /// use lease::backend::PgAdvisory;
    ///
    /// assert!(PgAdvisory::FENCE_SCHEMA.starts_with("CREATE TABLE IF NOT EXISTS lease_fences ("));
    /// ```
    pub const FENCE_SCHEMA: &'static str = concat!(create_fence_table!("lease_fences"), ";\n");

    /// The same backend with fencing tokens: each acquisition also bumps
    /// the lease name's counter in the fence table `table` (`name` or
    /// `schema.name`), in the statement that takes the lock, and returns
    /// it as the grant's fencing token.
    ///
    /// The statement, with `{table}` the table:
    ///
    /// ```sql
    /// WITH lock AS MATERIALIZED
    ///   (SELECT pg_try_advisory_lock($1) AS granted, pg_backend_pid() AS pid),
    /// bumped AS (INSERT INTO {table} AS f (name, fence) SELECT $2, 1 FROM lock WHERE granted
    ///   ON CONFLICT (name) DO UPDATE SET fence = f.fence + 1 RETURNING fence)
    /// SELECT lock.granted, lock.pid, (SELECT fence FROM bumped) FROM lock
    /// ```
    ///
    /// with `$1` the lock's key and `$2` the lease name: one round trip, as
    /// without fencing, plus the write of one row (a transaction id and a
    /// WAL flush at commit) — but only when the lock was granted; a refused
    /// attempt writes nothing. What the token guarantees:
    ///
    /// - **Strictly increasing per name** across the acquisitions that were
    ///   granted, by any process that locks the name with fencing on the
    ///   same table: the counter is bumped while the lock is held, and the
    ///   lock is held by one session at a time. The counter is kept by the
    ///   table (never reset by a release, a crash or
    ///   [`force_release`](Backend::force_release)), and keyed by the lease
    ///   name, not by the lock's key.
    /// - **One token per acquisition**: an idempotent re-acquire (the same
    ///   holder, the lock still held by this backend) returns the token of
    ///   the acquisition it repeats, and heartbeats never change it. Renew
    ///   and release compare it: an older acquisition's late release does
    ///   not end the newer one.
    /// - It protects the resource only if the **resource checks it**
    ///   (rejects a write with a token smaller than one it has seen). A
    ///   holder whose session ended while its process lives on keeps
    ///   believing it holds until its next heartbeat (see "Takeover after the
    ///   holder's connection dies" above); only the check stops its writes.
    ///   Processes that lock the same key without fencing (sqlx's
    ///   `PgAdvisoryLock`, this backend without `with_fencing`) bump nothing.
    ///
    /// Create the table with [`ensure_schema`](PgAdvisory::ensure_schema),
    /// or with your migration tool from [`FENCE_SCHEMA`](PgAdvisory::FENCE_SCHEMA)
    /// (`migrations/postgres/0002_lease_fences.sql`, for `lease_fences`) or
    /// [`fence_schema`](PgAdvisory::fence_schema). Without the table, every
    /// acquisition fails with [`Error::Database`] (and takes no lock).
    /// Needs PostgreSQL 12 or later (`MATERIALIZED`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use lease::{backend::PgAdvisory, Lease};
    ///
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), lease::Error> {
    /// let advisory = PgAdvisory::new(pool).with_fencing("lease_fences")?;
    /// advisory.ensure_schema().await?;
    /// let lease = Lease::new(advisory);
    /// if let Some(guard) = lease.try_acquire("nightly-report", Duration::from_secs(30)).await? {
    ///     assert!(guard.fencing_token() >= Some(1));
    ///     guard.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTable`] when `table` is not `[A-Za-z_][A-Za-z0-9_]*`
    /// (at most 63 bytes), once or twice separated by one `.`: the name is
    /// used unquoted (PostgreSQL folds it to lower case), so nothing else
    /// may reach the statements.
    pub fn with_fencing(self, table: &str) -> Result<Self, Error> {
        Ok(Self {
            fencing: Some(Arc::new(Fencing::on(table)?)),
            ..self
        })
    }

    /// The fence table, as given to [`with_fencing`](PgAdvisory::with_fencing);
    /// `None` without fencing.
    pub fn fence_table(&self) -> Option<&str> {
        self.fencing.as_deref().map(|f| &*f.table)
    }

    /// The statement that creates the fence table:
    /// `CREATE TABLE IF NOT EXISTS {table} (..)`, as
    /// [`ensure_schema`](PgAdvisory::ensure_schema) runs it; `None` without
    /// fencing. For `lease_fences` it is [`FENCE_SCHEMA`](PgAdvisory::FENCE_SCHEMA)
    /// without its closing `;` and newline.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), lease::Error> {
    /// let advisory = lease::backend::PgAdvisory::new(pool).with_fencing("jobs.fences")?;
    /// assert!(advisory.fence_schema().unwrap().starts_with("CREATE TABLE IF NOT EXISTS jobs.fences ("));
    /// # Ok(()) }
    /// ```
    pub fn fence_schema(&self) -> Option<&str> {
        self.fencing.as_deref().map(|f| &*f.create)
    }

    /// Creates the fence table if it does not exist; without fencing, does
    /// nothing.
    ///
    /// Idempotent, and safe to call from many connections or processes at
    /// once: the `CREATE TABLE IF NOT EXISTS` ([`fence_schema`](PgAdvisory::fence_schema))
    /// runs in a short transaction that first takes a transaction-scoped
    /// advisory lock (the key pair `(1818583411, 1)`, as `PgTable`'s
    /// `ensure_schema`).
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the server cannot be reached or refuses the
    /// statement (for example a missing schema or privilege).
    pub async fn ensure_schema(&self) -> Result<(), Error> {
        let Some(fencing) = self.fencing.as_deref() else {
            return Ok(());
        };
        // One at a time with `PgTable`'s (concurrent `CREATE TABLE IF NOT
        // EXISTS` can fail with a unique violation).
        crate::backend::table::pg::create_one_at_a_time(&self.pool, &fencing.create).await?;
        Ok(())
    }

    fn held(&self) -> MutexGuard<'_, HeldLocks> {
        // Every update of the map is a single insert or remove: a panic
        // elsewhere cannot leave it inconsistent.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(&self, name: &str, holder: &str) -> Option<Arc<Slot>> {
        self.held()
            .slots
            .get(&(name.to_owned(), holder.to_owned()))
            .cloned()
    }

    /// Have the keeper of `runtime` keep `slot`, starting one if this runtime
    /// has none yet; with `key`, put `slot` in the map too, and return the
    /// slot it replaces. `Err` if the runtime is shutting down: then `slot`
    /// is neither kept nor put in the map.
    fn keep(
        &self,
        slot: &Arc<Slot>,
        runtime: &Handle,
        key: Option<(String, String)>,
    ) -> Result<Option<Arc<Slot>>, ()> {
        let id = runtime.id();
        let mut started: Option<Arc<KeeperLink>> = None;
        loop {
            let mut locks = self.held();
            let live = locks
                .keepers
                .get(&id)
                .is_some_and(|l| !l.gone.load(Ordering::SeqCst));
            if live {
                if let Some(ours) = started.take() {
                    // Another call registered one meanwhile.
                    ours.stop.cancel();
                }
            } else if let Some(ours) = started.take() {
                if ours.gone.load(Ordering::SeqCst) {
                    return Err(());
                }
                locks.keepers.insert(id, ours);
            } else {
                drop(locks);
                let link = Arc::new(KeeperLink::default());
                let keeper = Keeper {
                    runtime: id,
                    link: link.clone(),
                    locks: Arc::downgrade(&self.held),
                    pool: self.pool.clone(),
                    stopped: false,
                };
                // Spawned under no lock: a runtime that is shutting down
                // drops the task, and runs the keeper's drop, inside `spawn`.
                drop(runtime.spawn(keeper.run()));
                started = Some(link);
                continue;
            }
            // Under the map's lock: the keeper, if its runtime shuts down
            // from now on, finds the slot.
            slot.state().runtime = id;
            return Ok(match key {
                Some(key) => locks.slots.insert(key, slot.clone()),
                None => None,
            });
        }
    }

    /// A spare of the kind this backend takes (watched or plain) put aside
    /// on `runtime`, with when it left the pool. A watched one's socket is
    /// looked at first; the spares found dead on the way are closed.
    fn take_spare(&self, runtime: &Handle) -> Option<(Conn, Instant)> {
        let id = runtime.id();
        loop {
            let mut spare = {
                let mut locks = self.held();
                let at = locks.spares.iter().rposition(|s| {
                    s.runtime.id() == id && matches!(s.conn, Some(Conn::Watched(_))) == self.watch
                })?;
                locks.spares.remove(at)
            };
            let taken_at = spare.taken_at;
            let conn = spare.conn.take()?;
            drop(spare);
            let Conn::Watched(mut listener) = conn else {
                return Some((conn, taken_at));
            };
            // One look at its socket, as the watch looks (a session that was
            // terminated or reset while it waited has said so there), in
            // place of the pool's test of an idle connection.
            let mut cx = Context::from_waker(Waker::noop());
            match poll_session(&mut listener, &mut cx) {
                Poll::Pending => return Some((Conn::Watched(listener), taken_at)),
                Poll::Ready(end) => {
                    tracing::debug!(
                        "a spare connection's session ended: {}; closing it",
                        end.what
                    );
                    let mut dead = Armed::new(
                        Conn::Watched(listener),
                        runtime.clone(),
                        &self.pool,
                        taken_at,
                    );
                    dead.gone = end.gone;
                }
            }
        }
    }

    /// A connection from the pool for a lock: through a listener if watched.
    async fn connect(&self) -> Result<(Conn, Instant)> {
        let conn = if self.watch {
            let mut listener = PgListener::connect_with(&self.pool).await?;
            // Its socket is read only by the watch, which must see the
            // session's end rather than a new connection, and ignores the
            // pool's closing (the held connection keeps the pool open, as a
            // plain one does).
            listener.eager_reconnect(false);
            listener.ignore_pool_close_event(true);
            Conn::Watched(Box::new(listener))
        } else {
            Conn::Plain(self.pool.acquire().await?)
        };
        Ok((conn, Instant::now()))
    }

    /// A connection that holds no lock, done with: put aside as a [`Spare`]
    /// for the next acquisition, unless the pool is closed, has no idle
    /// connection and no room for another (someone may be waiting for one:
    /// this one goes back), [`MAX_SPARES`] are aside already, it has been
    /// out of the pool for [`SPARE_OUT`], or this runtime has no live keeper
    /// to return it; then it goes back to the pool.
    fn put_aside(&self, conn: Conn, taken_at: Instant) {
        let Ok(runtime) = Handle::try_current() else {
            return drop(conn);
        };
        let now = Instant::now();
        let pool = &self.pool;
        let pressed = pool.num_idle() == 0 && pool.size() >= pool.options().get_max_connections();
        let mut locks = self.held();
        // Under the map's lock, where a keeper returns every spare once the
        // pool is closed: a spare put aside after that sees it closed.
        let link = locks
            .keepers
            .get(&runtime.id())
            .filter(|l| !l.gone.load(Ordering::SeqCst))
            .cloned();
        let Some(link) = link.filter(|_| {
            !pressed
                && !pool.is_closed()
                && locks.spares.len() < MAX_SPARES
                && now.saturating_duration_since(taken_at) < SPARE_OUT
        }) else {
            drop(locks);
            return drop(conn);
        };
        locks.spares.push(Spare {
            conn: Some(conn),
            runtime,
            idle_since: now,
            taken_at,
        });
        let timing = link.timing.load(Ordering::SeqCst);
        drop(locks);
        if !timing {
            link.spared.notify_one();
        }
    }

    /// Is `slot` the acquisition `lease`? With fencing, its token must be
    /// the slot's; without, name and holder (the slot's key) are all there
    /// is to compare.
    fn is_acquisition(&self, slot: &Slot, lease: Acquisition<'_>) -> bool {
        self.fencing.is_none() || slot.fence == lease.fencing_token
    }

    /// Forget `slot` for `(name, holder)` if it is still the one in the map.
    fn forget(&self, name: &str, holder: &str, slot: &Arc<Slot>) {
        let mut held = self.held();
        let k = (name.to_owned(), holder.to_owned());
        let removed = if held.slots.get(&k).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            held.slots.remove(&k)
        } else {
            None
        };
        // Not dropped under the lock.
        drop(held);
        drop(removed);
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
    /// the connection and answers `false`; so does dropping this future. A
    /// success hands the keeping of the connection to this runtime.
    async fn heartbeat(&self, name: &str, holder: &str, slot: &Arc<Slot>, limit: Duration) -> bool {
        let turn = slot.turn.lock().await;
        // Out of the slot while the query runs: if this future is dropped,
        // `held` is dropped with it and its connection closed.
        let Some(mut held) = slot.take() else {
            drop(turn);
            self.forget(name, holder, slot);
            return false;
        };
        let check = held.conn.query_bool(HEARTBEAT, slot.key);
        let why = match tokio::time::timeout(limit, check).await {
            Ok(Ok(true)) => match slot.put_back(held) {
                Ok(kept_by) => match Handle::try_current() {
                    // Renewed on another runtime than the one that kept it:
                    // this one keeps it from now on.
                    Ok(runtime) if runtime.id() != kept_by => {
                        if self.keep(slot, &runtime, None).is_ok() {
                            return true;
                        }
                        // This runtime is shutting down.
                        drop(slot.end());
                        drop(turn);
                        self.forget(name, holder, slot);
                        return false;
                    }
                    _ => return true,
                },
                Err(back) => {
                    held = back;
                    "the runtime keeping it shut down meanwhile".to_owned()
                }
            },
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
        drop(slot.end());
        drop(turn);
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
    ///
    /// A lock taken is kept by the current runtime until a heartbeat runs on
    /// another (see [Runtime shutdown](PgAdvisory#runtime-shutdown)):
    /// [`Error::NoRuntime`] outside a Tokio runtime, or if the runtime is
    /// shutting down (the lock just taken is then closed at once).
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        validate::call(name, holder, ttl)?;
        // Where the lock is kept (see `Keeper`), and its connection closed
        // if dropped outside any runtime.
        let runtime = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        if let Some(slot) = self.slot(name, holder) {
            // The token of the acquisition this repeats.
            let fence = slot.fence;
            if self.check(name, holder, slot, ttl / 3).await {
                return Ok(Some(Grant::new(fence)));
            }
        }
        let key = self.lock_key(name);
        let fencing = self.fencing.as_deref();
        let spare = self.take_spare(&runtime);
        let from_spare = spare.is_some();
        let (conn, taken_at) = match spare {
            Some(spare) => spare,
            None => self.connect().await?,
        };
        let mut conn = Armed::new(conn, runtime.clone(), &self.pool, taken_at);
        // If this fails after the lock was granted (the fence table is
        // missing), `conn` is closed, and the lock with it.
        let (locked, pid, fence) = match conn.try_lock(fencing, key, name).await {
            Ok(answer) => answer,
            // A spare whose session ended while it waited (a plain one
            // cannot be looked at first: sqlx reads an idle connection only
            // through a listener; the pool's `test_before_acquire` ping
            // would cost a round trip): closed, and tried once more on a
            // connection from the pool. A lock granted on that session ended
            // with it; one that it still holds refuses this attempt.
            Err(e) if from_spare && session_ended(&e) => {
                tracing::debug!(
                    lease.name = name,
                    holder,
                    "a spare connection failed ({e}); trying on one from the pool"
                );
                drop(conn);
                let (fresh, taken_at) = self.connect().await?;
                conn = Armed::new(fresh, runtime.clone(), &self.pool, taken_at);
                conn.try_lock(fencing, key, name).await?
            }
            Err(e) => return Err(e.into()),
        };
        let fence = match (&self.fencing, locked, fence.map(u64::try_from)) {
            (None, _, _) | (_, false, _) => None,
            (Some(_), true, Some(Ok(fence))) => Some(fence),
            (Some(fencing), true, other) => {
                return Err(Error::Protocol(format!(
                    "the fence table {} gave {name:?} the fencing token {other:?}",
                    fencing.table
                )));
            }
        };
        if !locked {
            // Clean: it took no lock. Back to the pool, or aside.
            let taken_at = conn.taken_at;
            self.put_aside(conn.disarm(), taken_at);
            return Ok(None);
        }
        // Kept by this runtime until a heartbeat runs on another: when it
        // shuts down, the connection is closed.
        let slot = Slot::new(key, fence, Held { conn, pid }, runtime.id());
        let k = (name.to_owned(), holder.to_owned());
        let Ok(stale) = self.keep(&slot, &runtime, Some(k)) else {
            // The runtime is shutting down: the lock goes with its connection.
            drop(slot.end());
            return Err(Error::NoRuntime);
        };
        // We hold the lock on a new session, so no other session holds it: a
        // slot still in the map for this name and holder is stale. Ending it
        // closes its connection (after any heartbeat in flight on it).
        if let Some(stale) = stale {
            drop(stale.end());
        }
        tracing::debug!(
            lease.name = name,
            holder,
            pid,
            key,
            fence,
            "advisory lock acquired"
        );
        Ok(Some(Grant::new(fence)))
    }

    /// The heartbeat: `Ok(true)` iff the holding connection still holds the
    /// lock (checked in `pg_locks`). Never `Err`: a failure on the connection
    /// means the lock is gone (the connection is closed) and answers `Ok(false)`.
    ///
    /// The acquisition is the lock held by this backend for `(name,
    /// holder)`, on its own connection; with fencing, only if its token is
    /// `lease.fencing_token` too (an older acquisition's renewal answers
    /// `Ok(false)` and leaves the newer one alone). Without fencing the
    /// token is not compared.
    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        validate::call(lease.name, lease.holder, ttl)?;
        let (name, holder) = (lease.name, lease.holder);
        match self.slot(name, holder) {
            Some(slot) if self.is_acquisition(&slot, lease) => {
                Ok(self.check(name, holder, slot, ttl / 3).await)
            }
            _ => Ok(false),
        }
    }

    /// `pg_advisory_unlock` on the holding connection, which goes back to the
    /// pool only if the unlock succeeded; otherwise it is closed. With
    /// fencing, a release whose token is not the held acquisition's (a late
    /// release of an older one) does nothing.
    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let (name, holder) = (lease.name, lease.holder);
        let slot = {
            let mut held = self.held();
            let k = (name.to_owned(), holder.to_owned());
            match held.slots.get(&k) {
                Some(slot) if self.is_acquisition(slot, lease) => held.slots.remove(&k),
                _ => None,
            }
        };
        let Some(slot) = slot else {
            return Ok(());
        };
        // Waits for a heartbeat in flight on this connection.
        let _turn = slot.turn.lock().await;
        // For good: nothing puts it back.
        let Some(mut held) = slot.end() else {
            return Ok(());
        };
        // If this future is dropped now, `held` closes the connection.
        let unlocked = held.conn.query_bool(UNLOCK, slot.key).await?;
        if unlocked {
            let taken_at = held.conn.taken_at;
            self.put_aside(held.conn.disarm(), taken_at);
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

    /// Who holds the lock, from `pg_locks` (one query on a pool
    /// connection). Advisory locks keep nothing once unlocked: `Ok(None)`
    /// when no session holds the key (released, never taken, or its session
    /// ended). When one does:
    ///
    /// - `holder` is the holding *session*, not the holder identity given
    ///   to [`Lease`](crate::Lease), which PostgreSQL never sees:
    ///   `"{application_name} (pid {pid})"`, or `"pid {pid}"` when the
    ///   session has no `application_name` (sqlx sets none unless told:
    ///   `PgConnectOptions::application_name`, for example the pod's
    ///   name, makes the leader recognisable). The same string for every
    ///   observer; a lock taken by another program on the same key (sqlx's
    ///   `PgAdvisoryLock`, the Go services) shows its session the same way,
    ///   and a shared lock on the key gets ` (shared)` after it;
    /// - `expires_in` is [`Duration::MAX`]: the lock has no expiry, it is
    ///   held until it is unlocked or its session ends;
    /// - `fencing_token` is `None` without fencing; with it, the name's
    ///   counter in the fence table, read in the same query: the token of
    ///   the holder's acquisition when it locked with fencing (a session
    ///   that locked the key another way bumped nothing, and shows the
    ///   token of the last fenced acquisition).
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        crate::validate::name(name)?;
        let key = self.lock_key(name);
        let row: Option<(i32, Option<String>, bool, Option<i64>)> = match self.fencing.as_deref() {
            None => sqlx::query_as::<_, (i32, Option<String>, bool)>(HOLDER)
                .bind(key)
                .fetch_optional(&self.pool)
                .await?
                .map(|(pid, application, exclusive)| (pid, application, exclusive, None)),
            Some(fencing) => {
                sqlx::query_as(AssertSqlSafe(fencing.holder.clone()))
                    .bind(key)
                    .bind(name)
                    .fetch_optional(&self.pool)
                    .await?
            }
        };
        Ok(row.map(|(pid, application, exclusive, fence)| {
            let mut holder = match application.filter(|a| !a.is_empty()) {
                Some(application) => format!("{application} (pid {pid})"),
                None => format!("pid {pid}"),
            };
            if !exclusive {
                holder.push_str(" (shared)");
            }
            let fence = fence.and_then(|f| u64::try_from(f).ok());
            LeaseInfo::new(name, holder, Some(Duration::MAX), fence)
        }))
    }

    /// Every exclusive advisory lock on a 64-bit key in this database, from
    /// `pg_locks` (one query), by key — as far as `pg_locks` can tell:
    ///
    /// - **Names are not known**: PostgreSQL sees only the 64-bit key, a
    ///   hash of the name that cannot be turned back. A lock that this
    ///   backend value holds is listed with its lease name; any other (held
    ///   by another process, or by another program on the same keys) as
    ///   `#` and its key in decimal (`#-5188171837425302540`). Look a
    ///   known name up with [`inspect`](Backend::inspect).
    /// - Only held locks: an advisory lock leaves nothing once unlocked.
    /// - `holder` and `expires_in` as [`inspect`](Backend::inspect)
    ///   answers them (the session, [`Duration::MAX`]); `fencing_token` is
    ///   `None` without fencing, and with it the token of the acquisitions
    ///   of this backend value (others: `None`, as their names are not
    ///   known); shared locks and the two-`int4` key space are left out.
    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        let rows: Vec<(i64, i32, Option<String>)> =
            sqlx::query_as(LOCKS).fetch_all(&self.pool).await?;
        let names: HashMap<i64, (String, Option<u64>)> = self
            .held()
            .slots
            .iter()
            .map(|((name, _), slot)| (slot.key, (name.clone(), slot.fence)))
            .collect();
        Ok(rows
            .into_iter()
            .map(|(key, pid, application)| {
                let (name, fence) = names
                    .get(&key)
                    .cloned()
                    .unwrap_or((format!("#{key}"), None));
                let holder = match application.filter(|a| !a.is_empty()) {
                    Some(application) => format!("{application} (pid {pid})"),
                    None => format!("pid {pid}"),
                };
                LeaseInfo::new(name, holder, Some(Duration::MAX), fence)
            })
            .collect())
    }

    /// Ends the *session* that holds the lock (`pg_terminate_backend`, then
    /// waits up to 5 s for it to end): an advisory lock can be unlocked only
    /// by its own session. `Ok(true)` once the session has ended, and with
    /// it the lock; the evicted holder's next heartbeat fails, and its
    /// token is cancelled. Everything else of that session ends too: for a
    /// `PgAdvisory` holder that is this one lock (one connection per lock),
    /// for another program on the same key, all its locks and its open
    /// transaction.
    ///
    /// Needs PostgreSQL 14 or later, and a user allowed to end the session:
    /// the same role, a member of `pg_signal_backend`, or a superuser;
    /// otherwise [`Error::Database`]. With fencing, the name's counter is
    /// kept: the next acquisition gets a larger token.
    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        crate::validate::name(name)?;
        let ended: Vec<bool> = sqlx::query_scalar(TERMINATE)
            .bind(self.lock_key(name))
            .fetch_all(&self.pool)
            .await?;
        Ok(ended.contains(&true))
    }

    /// A notification on the channel `lease_advisory`, which this backend's
    /// release sends with the lock's key (so names that share a key wake
    /// each other's waiters, as they share the lock): about one round trip
    /// after the unlock. A lock that ends with its session (a crash, a
    /// heartbeat that failed, a runtime shut down) notifies nobody; its
    /// waiters poll. See [`PgAdvisory`]'s "Waiting".
    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        self.push
            .get_or_init(|| {
                Push::new(PgSource {
                    pool: self.pool.clone(),
                    channel: CHANNEL.to_owned(),
                })
            })
            .released(self.lock_key(name).to_string(), poll)
    }

    /// With the watch on (the default), resolves when the session holding
    /// the lock ends — the server's termination message, or the socket
    /// closed or reset — about when it happens; see [Prompt
    /// loss](PgAdvisory#prompt-loss). `None` [`with_watch(false)`](PgAdvisory::with_watch).
    fn lost(&self, lease: Acquisition<'_>) -> Option<impl Future<Output = ()> + Send + 'static> {
        if !self.watch {
            return None;
        }
        let slot = self
            .slot(lease.name, lease.holder)
            .filter(|slot| self.is_acquisition(slot, lease))?;
        Some(watch(
            Arc::downgrade(&slot),
            lease.name.to_owned(),
            lease.holder.to_owned(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::{KEY_CACHE, PgAdvisory};

    /// A backend on a pool that never connects (keys need no server).
    fn offline() -> PgAdvisory {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("lazy pool");
        PgAdvisory::new(pool)
    }

    static DERIVED: AtomicUsize = AtomicUsize::new(0);

    fn counted(name: &str) -> i64 {
        DERIVED.fetch_add(1, Ordering::SeqCst);
        PgAdvisory::key(name)
    }

    /// A name's key is derived once, not on every call; past the cache's
    /// size every name still gets its own key; and a backend given another
    /// derivation does not use keys derived the old way.
    #[tokio::test]
    async fn keys_are_derived_once_per_name() {
        let advisory = offline().with_key(counted);
        for _ in 0..10 {
            assert_eq!(advisory.lock_key("nightly"), PgAdvisory::key("nightly"));
        }
        assert_eq!(DERIVED.load(Ordering::SeqCst), 1, "derived on every call");
        for i in 0..2 * KEY_CACHE + 1 {
            let name = format!("name-{i}");
            assert_eq!(advisory.lock_key(&name), PgAdvisory::key(&name));
            assert_eq!(advisory.lock_key(&name), PgAdvisory::key(&name));
        }
        fn seven(_: &str) -> i64 {
            7
        }
        let plain = offline();
        assert_eq!(plain.lock_key("nightly"), PgAdvisory::key("nightly"));
        let other = plain.clone().with_key(seven);
        assert_eq!(other.lock_key("nightly"), 7);
        assert_eq!(plain.lock_key("nightly"), PgAdvisory::key("nightly"));
    }

    /// Sets its flag when dropped.
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// What `close` relies on outside any runtime: a task spawned (as sqlx
    /// spawns its close) on the handle of a runtime that has shut down is
    /// dropped at once, inside `spawn`, and nothing panics.
    #[test]
    fn a_task_spawned_on_a_runtime_that_shut_down_is_dropped_at_once() {
        for multi_thread in [false, true] {
            let rt = if multi_thread {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .build()
            } else {
                tokio::runtime::Builder::new_current_thread().build()
            }
            .expect("runtime");
            let handle = rt.handle().clone();
            drop(rt);
            let dropped = Arc::new(AtomicBool::new(false));
            let flag = Flag(dropped.clone());
            let _entered = handle.enter();
            drop(tokio::spawn(async move {
                let _flag = flag;
                std::future::pending::<()>().await;
            }));
            assert!(
                dropped.load(Ordering::SeqCst),
                "multi_thread: {multi_thread}"
            );
        }
    }
}
