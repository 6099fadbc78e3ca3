//! A renewal in flight must not bring a released lease back (issue 10,
//! point 2), for the three table backends.
//!
//! The interleaving: holder `a` holds a lease (fence `f`, ttl 60 s). A second
//! session opens a transaction and takes the lease row's write lock. The
//! backend's renewal of `a`'s acquisition starts and waits for that lock;
//! the test polls until it sees that the renewal's statement has started
//! and is held up (PostgreSQL: `pg_blocking_pids`; MySQL: the backend's
//! connection executing the `UPDATE` in `PROCESSLIST`; SQLite: the
//! connection's thread sleeping in SQLite's busy handler), without
//! sleeping for a guessed time. Only then does the second session run the
//! backend's release statement and commit, so the release's "now" is
//! *later* than the start of the waiting renewal. The renewal then runs
//! against the released row. That is a renewal that was sent before the release, reached the row
//! after it, and waited for the release's row lock: in production the
//! release is one autocommit statement that got to the row first although
//! it started later (its lock taken by the `UPDATE` itself rather than by an
//! earlier `SELECT .. FOR UPDATE`); the order of the instants is the same.
//!
//! It must answer "lost", leave the row expired, and the name must be free
//! at once: another holder, or `a` itself, acquires it with a larger fence.
//! The renewal is sent both ways the engine sends it, `renew` and
//! `renew_many`.
//!
//! What each backend takes as "now" in the renewal decides whether it could
//! ever see the release as live:
//!
//! - MySQL/MariaDB: `UTC_TIMESTAMP(6)` is the time the *statement started*,
//!   before the wait. A release that set `expires_at` to its own now left a
//!   row that the waiting renewal saw as live, and extended by a full ttl.
//!   Release now sets the epoch, expired for every statement.
//! - PostgreSQL: `clock_timestamp()` is read when the expression is
//!   evaluated; after the wait, the renewal re-checks its `WHERE` on the
//!   released row version (EvalPlanQual) with a clock reading taken after
//!   the release committed.
//! - SQLite: a write statement takes the write lock (`OP_Transaction`,
//!   where the busy handler waits) before it evaluates anything, and
//!   `'now'` is read lazily within the `sqlite3_step()` — so after the wait.
//!
//! The second session runs a copy of the backend's release statement (the
//! backend has no way to run its statement inside someone else's
//! transaction). `the_copied_release_is_the_backends` checks that the copy
//! and the backend's own `release` leave the same row.
//!
//! This is its own file rather than a property in `conformance.rs`: it
//! needs a per-backend second session, lock probe and statement text, where
//! the properties there only call the `Backend` trait.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease_tests::{TempDb, unique};
use leasehold::backend::{MySqlTable, PgTable, SqliteTable};
use leasehold::{Acquisition, Backend};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};
use sqlx::{Connection, MySql, MySqlPool, PgPool, Postgres, SqliteConnection, Transaction};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(60);
/// How long the renewal may take to show up as waiting.
const PATIENCE: Duration = Duration::from_secs(10);

/// One backend's part of the scenario: the backend under test, and a second
/// session on the same storage that holds the lease row's lock.
trait Rig {
    type Table: Backend + Clone;
    type Session;

    fn table(&self) -> &Self::Table;
    /// Opens the second session: a transaction holding the write lock of
    /// `name`'s row (of the whole database, for SQLite).
    async fn lock(&self, name: &str) -> Self::Session;
    /// True once the renewal's statement has started on the server (so its
    /// start is before anything the session does next) and is held up by
    /// the session's lock.
    async fn renewal_waits(&self, session: &mut Self::Session) -> bool;
    /// Runs the backend's release statement in the session, then commits.
    async fn release_and_commit(
        &self,
        session: Self::Session,
        name: &str,
        holder: &str,
        fence: u64,
    );
    /// Seconds until the row of `name` expires by the storage's clock
    /// (negative once expired).
    async fn seconds_left(&self, name: &str) -> f64;
    /// The stored `expires_at` of `name`, as text.
    async fn expires_at(&self, name: &str) -> String;
}

#[derive(Clone, Copy, Debug)]
enum Renewal {
    Renew,
    RenewMany,
}

async fn acquired(b: &impl Backend, name: &str, holder: &str) -> u64 {
    b.acquire(name, holder, TTL)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{holder} could not acquire {name}"))
        .fencing_token
        .expect("table backends have fencing tokens")
}

async fn a_renewal_in_flight_cannot_revive_a_released_lease(rig: impl Rig) {
    for renewal in [Renewal::Renew, Renewal::RenewMany] {
        for next in ["b", "a"] {
            one_round(&rig, renewal, next).await;
        }
    }
    the_copied_release_is_the_backends(&rig).await;
}

/// The interleaving once; then `next` acquires the name.
async fn one_round(rig: &impl Rig, renewal: Renewal, next: &str) {
    let name = unique("renew-in-flight");
    let table = rig.table();
    let fence = acquired(table, &name, "a").await;

    let mut session = rig.lock(&name).await;
    let task = tokio::spawn({
        let (table, name) = (table.clone(), name.clone());
        async move {
            let lease = Acquisition::new(&name, "a", Some(fence));
            match renewal {
                Renewal::Renew => table.renew(lease, TTL).await,
                Renewal::RenewMany => table
                    .renew_many(&[(lease, TTL)])
                    .await
                    .map(|renewed| renewed == [true]),
            }
        }
    });
    // Polling for a state, not a guess at timing: the release below runs
    // only once the renewal's statement is known to be waiting.
    let give_up = Instant::now() + PATIENCE;
    while !rig.renewal_waits(&mut session).await {
        if task.is_finished() {
            panic!(
                "{renewal:?} did not wait for the second session's lock: {:?}",
                task.await
            );
        }
        assert!(
            Instant::now() < give_up,
            "{renewal:?} was not seen waiting for the lock within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    rig.release_and_commit(session, &name, "a", fence).await;
    let renewed = task.await.expect("renewal task").expect("renewal");

    let left = rig.seconds_left(&name).await;
    let grant = table
        .acquire(&name, next, TTL)
        .await
        .unwrap()
        .map(|g| g.fencing_token.expect("a fence"));
    assert!(
        !renewed && left <= 0.0 && grant == Some(fence + 1),
        "{renewal:?} that waited for the release's row lock answered {renewed} and left \
         the lease live for {left:.3} s more; then {next:?} got fence {grant:?} \
         (a's was {fence}, expected {})",
        fence + 1
    );
}

/// The statement the rig runs as "the release" is the backend's: on two
/// fresh leases, it and the backend's own `release` store the same expiry.
async fn the_copied_release_is_the_backends(rig: &impl Rig) {
    let table = rig.table();
    let (copied, own) = (unique("copied-release"), unique("own-release"));
    let fence = acquired(table, &copied, "a").await;
    let session = rig.lock(&copied).await;
    rig.release_and_commit(session, &copied, "a", fence).await;
    let fence = acquired(table, &own, "a").await;
    table
        .release(Acquisition::new(&own, "a", Some(fence)))
        .await
        .unwrap();
    assert_eq!(rig.expires_at(&copied).await, rig.expires_at(&own).await);
}

// PostgreSQL

/// `PgTable`'s release statement (lease/src/backend/table/pg.rs), on the
/// default table: the `UPDATE`, and the notification of its waiters.
/// Keep in sync; `the_copied_release_is_the_backends` compares the effects.
const PG_RELEASE: &str = "WITH released AS (UPDATE task_leases \
                          SET expires_at = TIMESTAMPTZ 'epoch' \
                          WHERE name = $1 AND holder = $2 AND fence = $3 \
                          AND expires_at > clock_timestamp() RETURNING name) \
                          SELECT pg_notify('lease:task_leases', name) FROM released";

struct PgRig {
    table: PgTable,
    pool: PgPool,
}

struct PgSession {
    tx: Transaction<'static, Postgres>,
    pid: i32,
}

impl Rig for PgRig {
    type Table = PgTable;
    type Session = PgSession;

    fn table(&self) -> &PgTable {
        &self.table
    }

    async fn lock(&self, name: &str) -> PgSession {
        let mut tx = self.pool.begin().await.unwrap();
        let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        sqlx::query("SELECT 1 FROM task_leases WHERE name = $1 FOR UPDATE")
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        PgSession { tx, pid }
    }

    async fn renewal_waits(&self, session: &mut PgSession) -> bool {
        // Only the renewal touches this row, so whoever the session blocks
        // is the renewal, waiting for the row lock.
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
             WHERE $1 = ANY(pg_blocking_pids(pid)))",
        )
        .bind(session.pid)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    async fn release_and_commit(&self, session: PgSession, name: &str, holder: &str, fence: u64) {
        let mut tx = session.tx;
        let done = sqlx::query(PG_RELEASE)
            .bind(name)
            .bind(holder)
            .bind(i64::try_from(fence).unwrap())
            .execute(&mut *tx)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1, "the release matched the lease");
        tx.commit().await.unwrap();
    }

    async fn seconds_left(&self, name: &str) -> f64 {
        sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8 \
             FROM task_leases WHERE name = $1",
        )
        .bind(name)
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    async fn expires_at(&self, name: &str) -> String {
        sqlx::query_scalar("SELECT expires_at::text FROM task_leases WHERE name = $1")
            .bind(name)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

mod pg {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_in_flight_cannot_revive_a_released_lease() {
        let Some(pool) = lease_tests::postgres().await else {
            return;
        };
        let table = PgTable::new(pool.clone());
        table.ensure_schema().await.unwrap();
        super::a_renewal_in_flight_cannot_revive_a_released_lease(PgRig { table, pool }).await;
    }
}

// MySQL / MariaDB

/// `MySqlTable`'s release statement (lease/src/backend/mysql.rs), on the
/// default table. Keep in sync; `the_copied_release_is_the_backends`
/// compares the effects.
const MYSQL_RELEASE: &str = "UPDATE task_leases SET expires_at = '1970-01-01 00:00:01' \
                             WHERE name = ? AND holder = ? AND fence = ? \
                             AND expires_at > UTC_TIMESTAMP(6)";

struct MySqlRig {
    /// On a pool of one connection, whose id is `renewer`.
    table: MySqlTable,
    renewer: u64,
    /// For the second session and the probes.
    pool: MySqlPool,
}

impl Rig for MySqlRig {
    type Table = MySqlTable;
    type Session = Transaction<'static, MySql>;

    fn table(&self) -> &MySqlTable {
        &self.table
    }

    async fn lock(&self, name: &str) -> Transaction<'static, MySql> {
        let mut tx = self.pool.begin().await.unwrap();
        sqlx::query("SELECT fence FROM task_leases WHERE name = ? FOR UPDATE")
            .bind(name.as_bytes())
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx
    }

    async fn renewal_waits(&self, _: &mut Transaction<'static, MySql>) -> bool {
        // The backend's only connection is executing the renewal's UPDATE
        // (not preparing it). The server fixed the statement's start time,
        // which is its `UTC_TIMESTAMP(6)`, before it made the text visible
        // here; and the statement cannot get past the row lock that the
        // session took before the renewal was sent, so it is waiting for it.
        //
        // Not `INNODB_TRX` (`trx_state = 'LOCK WAIT'`): its rows come from a
        // cache that InnoDB refreshes only after 0.1 s without a read, so it
        // can still show an earlier round's renewal waiting on the same
        // connection while this round's has not been sent yet.
        let running: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE ID = ? AND COMMAND IN ('Query', 'Execute') AND INFO LIKE 'UPDATE %'",
        )
        .bind(self.renewer)
        .fetch_one(&self.pool)
        .await
        .unwrap();
        running > 0
    }

    async fn release_and_commit(
        &self,
        mut tx: Transaction<'static, MySql>,
        name: &str,
        holder: &str,
        fence: u64,
    ) {
        let done = sqlx::query(MYSQL_RELEASE)
            .bind(name.as_bytes())
            .bind(holder.as_bytes())
            .bind(i64::try_from(fence).unwrap())
            .execute(&mut *tx)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1, "the release matched the lease");
        tx.commit().await.unwrap();
    }

    async fn seconds_left(&self, name: &str) -> f64 {
        let micros: i64 = sqlx::query_scalar(
            "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) \
             FROM task_leases WHERE name = ?",
        )
        .bind(name.as_bytes())
        .fetch_one(&self.pool)
        .await
        .unwrap();
        micros as f64 / 1e6
    }

    async fn expires_at(&self, name: &str) -> String {
        sqlx::query_scalar("SELECT CAST(expires_at AS CHAR) FROM task_leases WHERE name = ?")
            .bind(name.as_bytes())
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

mod mysql {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_in_flight_cannot_revive_a_released_lease() {
        let Some(pool) = lease_tests::mysql().await else {
            return;
        };
        // One connection, so that the renewal's session is known in advance.
        let one = MySqlPoolOptions::new()
            .max_connections(1)
            .connect(&lease_tests::mysql_url())
            .await
            .unwrap();
        let renewer = sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(&one)
            .await
            .unwrap();
        let table = MySqlTable::new(one);
        table.ensure_schema().await.unwrap();
        super::a_renewal_in_flight_cannot_revive_a_released_lease(MySqlRig {
            table,
            renewer,
            pool,
        })
        .await;
    }
}

// SQLite

/// `SqliteTable`'s release statement (lease/src/backend/sqlite.rs), on the
/// default table. Keep in sync; `the_copied_release_is_the_backends`
/// compares the effects.
const SQLITE_RELEASE: &str = "UPDATE task_leases SET expires_at = 0 \
                              WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND expires_at > \
                              CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

/// The name of the backend's connection threads (sqlx runs each SQLite
/// connection on a thread of its own); at most 15 bytes, the kernel's limit.
const SQLITE_WORKER: &str = "renew-in-flight";

struct SqliteRig {
    /// On a pool of one connection, on a thread named [`SQLITE_WORKER`].
    table: SqliteTable,
    options: SqliteConnectOptions,
    _db: TempDb,
}

impl Rig for SqliteRig {
    type Table = SqliteTable;
    type Session = SqliteConnection;

    fn table(&self) -> &SqliteTable {
        &self.table
    }

    async fn lock(&self, _: &str) -> SqliteConnection {
        let mut conn = SqliteConnection::connect_with(&self.options).await.unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .unwrap();
        conn
    }

    async fn renewal_waits(&self, _: &mut SqliteConnection) -> bool {
        sqlite_worker_sleeps().await
    }

    async fn release_and_commit(
        &self,
        mut conn: SqliteConnection,
        name: &str,
        holder: &str,
        fence: u64,
    ) {
        let done = sqlx::query(SQLITE_RELEASE)
            .bind(name)
            .bind(holder)
            .bind(i64::try_from(fence).unwrap())
            .execute(&mut conn)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 1, "the release matched the lease");
        sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
        conn.close().await.unwrap();
    }

    async fn seconds_left(&self, name: &str) -> f64 {
        sqlx::query_scalar(
            "SELECT (expires_at - \
             CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)) / 1000.0 \
             FROM task_leases WHERE name = ?1",
        )
        .bind(name)
        .fetch_one(self.table.pool())
        .await
        .unwrap()
    }

    async fn expires_at(&self, name: &str) -> String {
        sqlx::query_scalar("SELECT CAST(expires_at AS TEXT) FROM task_leases WHERE name = ?1")
            .bind(name)
            .fetch_one(self.table.pool())
            .await
            .unwrap()
    }
}

/// True while the backend's connection thread sleeps in SQLite's busy
/// handler: the only place where a connection thread sleeps (an idle one
/// waits on a futex for its next command). SQLite's `sqlite3_busy_timeout`
/// handler sleeps with `nanosleep`, which glibc makes a `clock_nanosleep`.
#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
async fn sqlite_worker_sleeps() -> bool {
    #[cfg(target_arch = "x86_64")]
    const SLEEPS: [u64; 2] = [35, 230]; // nanosleep, clock_nanosleep
    #[cfg(target_arch = "aarch64")]
    const SLEEPS: [u64; 2] = [101, 115];
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    tasks.flatten().any(|task| {
        let read = |file: &str| std::fs::read_to_string(task.path().join(file)).unwrap_or_default();
        // `syscall` is the number of the system call the thread is blocked
        // in, then its arguments; or "running".
        read("comm").trim_end() == SQLITE_WORKER
            && read("syscall")
                .split(' ')
                .next()
                .and_then(|n| n.parse().ok())
                .is_some_and(|n: u64| SLEEPS.contains(&n))
    })
}

/// Elsewhere the wait cannot be seen: give the renewal time to start. The
/// assertions hold either way; only whether it was already waiting when the
/// release ran is then not certain.
#[cfg(not(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
)))]
async fn sqlite_worker_sleeps() -> bool {
    tokio::time::sleep(Duration::from_millis(500)).await;
    true
}

mod sqlite {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_renewal_in_flight_cannot_revive_a_released_lease() {
        let db = TempDb::new("lease-renew-in-flight");
        // Creates the file, switches it to WAL and creates the table.
        drop(SqliteTable::open(db.path()).await.unwrap());
        let options = SqliteConnectOptions::new().filename(db.path());
        let one = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(
                options
                    .clone()
                    .busy_timeout(PATIENCE)
                    .thread_name(|_| SQLITE_WORKER.to_owned()),
            )
            .await
            .unwrap();
        let table = SqliteTable::new(one);
        super::a_renewal_in_flight_cannot_revive_a_released_lease(SqliteRig {
            table,
            options,
            _db: db,
        })
        .await;
    }
}
