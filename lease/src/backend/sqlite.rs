//! Leases in a SQLite table: the embedded default for replicas on one host.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, SqlitePool};

use super::sql::{self, Statements, Templates};
use crate::backend::by_holder;
use crate::{Acquisition, Backend, Error, Grant};

/// The host's wall clock as integer Unix milliseconds, computed by SQLite.
///
/// SQLite keeps `'now'` fixed within one `sqlite3_step()`, so every use in a
/// statement sees the same instant. `julianday` (milliseconds precision
/// internally) works on every SQLite version, unlike `unixepoch('subsec')`
/// (3.42+), which older versions silently evaluate to NULL.
macro_rules! now_ms {
    () => {
        "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
    };
}

const TEMPLATES: Templates = Templates {
    create: "CREATE TABLE IF NOT EXISTS {table} (\n    \
             name TEXT PRIMARY KEY NOT NULL,\n    \
             holder TEXT NOT NULL,\n    \
             expires_at INTEGER NOT NULL /* unix time in ms, from the host clock */,\n    \
             fence INTEGER NOT NULL\n)",
    // One statement: insert a new row, or take over an expired (or released)
    // row, or extend our own live row. The fence counts acquisitions; only
    // the idempotent re-acquire of our own live lease keeps it. The SET
    // expressions all see the old row. When the row is held by someone else
    // the WHERE fails and nothing is returned.
    acquire: concat!(
        "INSERT INTO {table} AS l (name, holder, expires_at, fence) VALUES (?1, ?2, ",
        now_ms!(),
        " + ?3, 1) ON CONFLICT (name) DO UPDATE SET \
         holder = excluded.holder, \
         expires_at = excluded.expires_at, \
         fence = CASE WHEN l.holder = excluded.holder AND l.expires_at > ",
        now_ms!(),
        " THEN l.fence ELSE l.fence + 1 END WHERE l.expires_at <= ",
        now_ms!(),
        " OR l.holder = excluded.holder RETURNING fence"
    ),
    // Renew and release match the acquisition: name, holder and fence.
    renew: concat!(
        "UPDATE {table} SET expires_at = ",
        now_ms!(),
        " + ?3 WHERE name = ?1 AND holder = ?2 AND fence = ?4 AND expires_at > ",
        now_ms!()
    ),
    // A released row expires at the epoch, not at "now": expired for every
    // statement, whatever instant it takes as its "now".
    release: concat!(
        "UPDATE {table} SET expires_at = 0 \
         WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND expires_at > ",
        now_ms!()
    ),
    // Many renewals in one statement: `(name, ttl, fence)` triples, then
    // the holder; the (name, fence) of the rows renewed come back.
    renew_many: concat!(
        "UPDATE {table} AS l SET expires_at = ",
        now_ms!(),
        " + b.lease_ttl FROM (SELECT column1 AS lease_name, column2 AS lease_ttl, \
         column3 AS lease_fence FROM (VALUES {list})) AS b \
         WHERE l.name = b.lease_name AND l.fence = b.lease_fence AND l.holder = ? \
         AND l.expires_at > ",
        now_ms!(),
        " RETURNING name, fence"
    ),
    renewed_many: "",
    list_item: "(?, ?, ?)",
};

/// How long a statement waits for another connection's write lock before it
/// fails with `SQLITE_BUSY`, in connections made by [`SqliteTable::open`].
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Leases stored in a SQLite table, one row per lease name: the embedded
/// default when all replicas run on one host and can share one database file.
///
/// The table (by default `task_leases`, see [`with_table`](Self::with_table))
/// has the columns
///
/// | column | type | meaning |
/// |---|---|---|
/// | `name` | `TEXT PRIMARY KEY NOT NULL` | the lease name, compared byte for byte |
/// | `holder` | `TEXT NOT NULL` | who holds (or last held) the lease |
/// | `expires_at` | `INTEGER NOT NULL` | when the lease ends, in Unix milliseconds |
/// | `fence` | `INTEGER NOT NULL` | the fencing counter of the name |
///
/// [`open`](Self::open) creates the file and the table; with your own pool use
/// [`new`](Self::new) and [`ensure_schema`](Self::ensure_schema), or create
/// the table from `migrations/sqlite/0001_task_leases.sql`.
///
/// Guarantees:
///
/// - **Clock.** Expiry is computed inside SQL from the host's wall clock
///   (`julianday('now')`), never by the caller; as all users of the file run
///   on one host, they share that clock. Stepping the host clock shortens or
///   lengthens leases accordingly.
/// - **What ends a lease.** Its ttl running out without a renewal, or a
///   release by its holder. A lease is live while `expires_at` is after now.
/// - **Fencing.** Each acquisition returns the row's `fence`: 1 for the first
///   acquisition of a name, one more for each later one, unchanged when the
///   holder re-acquires its own live lease.
/// - **Release keeps the row**: it sets `expires_at` to the epoch (0), so the fence
///   never restarts, and a statement that waited for the release's row lock
///   sees the row expired whatever instant it took as its "now". Rows are never deleted by this crate.
/// - **One statement per call**, in autocommit: acquire is a single
///   `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE .. RETURNING fence`, renew
///   and release are single `UPDATE`s matched on name, holder, fence and
///   expiry: they concern one acquisition, so a late request of an older
///   acquisition never touches a newer one.
///   Renew never inserts a row.
/// - **Batched renewals**: the renewals of many leases of one holder
///   ([`Backend::renew_many`], which the engine uses) are one
///   `UPDATE .. FROM (VALUES (?, ?), ..) .. RETURNING name` per 1,000 leases
///   (one write transaction); each lease learns from the names returned
///   whether it was renewed. The lists are padded (repeating a lease) to one
///   of a few lengths, so that a connection prepares at most 11 variants.
/// - **Concurrency.** Several processes may share the file. SQLite lets one
///   writer in at a time; a statement that cannot get the write lock within
///   the busy timeout fails with `SQLITE_BUSY`, which is returned as
///   [`Error::Database`] — a transient error, never "held elsewhere".
///
/// Names and holders are always bind parameters. The table name is validated
/// when the backend is built and then put into the statements, which are
/// built once.
///
/// **Renewals share your pool.** With [`new`](Self::new), renewals and
/// releases take a connection from the pool you gave, like the rest of your
/// program: a job that holds every connection of it keeps its own lease from
/// being renewed, and loses the lease at its deadline. Give the pool one
/// connection more than the job uses at once, or let [`open`](Self::open)
/// make a pool for the leases alone.
///
/// Cloning is cheap: a [`SqlitePool`] and reference-counted statements.
///
/// A call whose future is dropped (for example by a timeout) after its
/// statement reached the server may still take effect: an acquisition the
/// caller never learned of ends at its ttl, or is picked up by the same
/// holder's next (idempotent) acquire.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lease::{Acquisition, Backend, backend::SqliteTable};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lease::Error> {
/// let path = std::env::temp_dir().join(format!("lease-doc-{}.db", std::process::id()));
/// let table = SqliteTable::open(&path).await?;
///
/// let first = table.acquire("nightly-report", "pod-a", Duration::from_secs(90)).await?;
/// assert!(first.is_some());
/// assert!(table.acquire("nightly-report", "pod-b", Duration::from_secs(90)).await?.is_none());
///
/// let fence = first.and_then(|g| g.fencing_token);
/// table.release(Acquisition::new("nightly-report", "pod-a", fence)).await?;
/// let second = table.acquire("nightly-report", "pod-b", Duration::from_secs(90)).await?;
/// let fence = |g: Option<lease::Grant>| g.and_then(|g| g.fencing_token);
/// assert_eq!(fence(second), fence(first).map(|f| f + 1));
/// # table.pool().close().await;
/// # for suffix in ["", "-wal", "-shm"] {
/// #     let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
/// # }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqliteTable {
    pool: SqlitePool,
    sql: Statements,
}

impl SqliteTable {
    /// Opens (creating it if missing) the database file at `path` and the
    /// table `task_leases` in it.
    ///
    /// The connections use WAL journaling (readers and the writer do not
    /// block each other, and the file may be shared by several processes),
    /// `synchronous = NORMAL` (durable across a process crash; a power loss may
    /// forget the last commits, which for leases means they end early) and a
    /// busy timeout of 5 seconds. Then it runs
    /// [`ensure_schema`](Self::ensure_schema).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), lease::Error> {
    /// let table = lease::backend::SqliteTable::open("/var/lib/app/leases.db").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the file cannot be opened or created, or the
    /// table cannot be created.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT);
        switch_to_wal(&options).await?;
        // The file is in WAL mode now, for good: the pool's connections need
        // not (and must not, see `switch_to_wal`) switch it again.
        let pool = SqlitePoolOptions::new().connect_with(options).await?;
        let table = Self::new(pool);
        table.ensure_schema().await?;
        Ok(table)
    }

    /// A backend on the table `task_leases` of `pool`'s database.
    ///
    /// Nothing is run until the first call; create the table with
    /// [`ensure_schema`](Self::ensure_schema) or a migration. For several
    /// processes on one file, configure the pool as [`open`](Self::open) does
    /// (WAL, a busy timeout).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lease::backend::SqliteTable;
    ///
    /// # async fn f() -> Result<(), lease::Error> {
    /// let table = SqliteTable::new(sqlx::SqlitePool::connect("sqlite://app.db").await?);
    /// assert_eq!(table.table(), "task_leases");
    /// # Ok(()) }
    /// ```
    pub fn new(pool: SqlitePool) -> Self {
        Self {
            pool,
            sql: Statements::default_table(&TEMPLATES),
        }
    }

    /// The same backend on another table, `name` or `schema.name` (such as
    /// `main.leases`, or a table of an attached database).
    ///
    /// The name must match `[A-Za-z_][A-Za-z0-9_]*` (at most 63 bytes), once or
    /// twice separated by one `.`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lease::backend::SqliteTable;
    ///
    /// # async fn f(pool: sqlx::SqlitePool) -> Result<(), lease::Error> {
    /// let table = SqliteTable::new(pool).with_table("main.job_leases")?;
    /// table.ensure_schema().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTable`] when `table` is not such a name.
    pub fn with_table(self, table: &str) -> Result<Self, Error> {
        Ok(Self {
            pool: self.pool,
            sql: Statements::new(&TEMPLATES, table)?,
        })
    }

    /// Creates the table if it does not exist.
    ///
    /// Idempotent, and safe to call from many connections or processes at
    /// once (SQLite serialises the writes; a writer waits up to the busy
    /// timeout). It never touches sqlx's `_sqlx_migrations` table. The DDL is
    /// the same as `migrations/sqlite/0001_task_leases.sql`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::SqlitePool) -> Result<(), lease::Error> {
    /// lease::backend::SqliteTable::new(pool).ensure_schema().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the statement fails, for example with
    /// `SQLITE_BUSY` after the busy timeout.
    pub async fn ensure_schema(&self) -> Result<(), Error> {
        sqlx::query(AssertSqlSafe(self.sql.create.clone()))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The pool this backend runs its statements on.
    ///
    /// Use it for your own queries, for example to see who holds what.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(table: lease::backend::SqliteTable) -> Result<(), lease::Error> {
    /// let holders: Vec<(String, String, i64)> = sqlx::query_as(
    ///     "SELECT name, holder, fence FROM task_leases WHERE expires_at > \
    ///      CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)",
    /// )
    /// .fetch_all(table.pool())
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table name, as given to [`with_table`](Self::with_table)
    /// (`task_leases` by default).
    pub fn table(&self) -> &str {
        &self.sql.table
    }
}

/// Puts the database file into WAL mode, once, with one connection.
///
/// Changing the journal mode needs an exclusive lock that SQLite does not
/// wait for with its busy timeout: when several processes open a new file at
/// once, all but one get `SQLITE_BUSY` at once. Retry for up to the busy
/// timeout.
async fn switch_to_wal(options: &SqliteConnectOptions) -> Result<(), Error> {
    use sqlx::ConnectOptions;

    let wal = options.clone().journal_mode(SqliteJournalMode::Wal);
    let give_up = tokio::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(2);
    loop {
        match wal.connect().await {
            Ok(conn) => {
                sqlx::Connection::close(conn).await?;
                return Ok(());
            }
            Err(e) if is_busy(&e) && tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `SQLITE_BUSY` or `SQLITE_LOCKED` (primary result codes 5 and 6).
fn is_busy(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    db.code()
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| matches!(c & 0xff, 5 | 6))
}

impl Backend for SqliteTable {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        let ttl_ms = sql::check(name, holder, ttl)?;
        let fence: Option<i64> = sql::explain(
            &self.pool,
            sqlx::query_scalar(AssertSqlSafe(self.sql.acquire.clone()))
                .bind(name)
                .bind(holder)
                .bind(ttl_ms)
                .fetch_optional(&self.pool)
                .await,
        )
        .await?;
        fence
            .map(|f| Ok(Grant::new(Some(sql::fence(f)?))))
            .transpose()
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        let ttl_ms = sql::check(lease.name, lease.holder, ttl)?;
        let done = sql::explain(
            &self.pool,
            sqlx::query(AssertSqlSafe(self.sql.renew.clone()))
                .bind(lease.name)
                .bind(lease.holder)
                .bind(ttl_ms)
                .bind(sql::fence_param(lease.fencing_token))
                .execute(&self.pool)
                .await,
        )
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        sql::check_no_ttl(lease.name, lease.holder)?;
        sql::explain(
            &self.pool,
            sqlx::query(AssertSqlSafe(self.sql.release.clone()))
                .bind(lease.name)
                .bind(lease.holder)
                .bind(sql::fence_param(lease.fencing_token))
                .execute(&self.pool)
                .await,
        )
        .await?;
        Ok(())
    }

    /// One `UPDATE .. FROM (VALUES ..) .. RETURNING name, fence` per holder
    /// and 1,000 leases.
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        let mut out = vec![false; leases.len()];
        // One after the other: SQLite has one writer at a time anyway.
        for (holder, at) in by_holder(leases) {
            for chunk in at.chunks(sql::RENEW_MANY_CHUNK) {
                let mut items = Vec::with_capacity(chunk.len());
                for &i in chunk {
                    let (lease, ttl) = leases[i];
                    let ttl_ms = sql::check(lease.name, holder, ttl)?;
                    items.push((lease.name, ttl_ms, sql::fence_param(lease.fencing_token)));
                }
                let size = sql::list_size(items.len());
                let last = *items.last().expect("BUG: an empty chunk");
                let padded = items.iter().copied().chain(std::iter::repeat_n(
                    last,
                    sql::LIST_SIZES[size] - items.len(),
                ));
                let query = sqlx::query_as(AssertSqlSafe(self.sql.renew_many[size].clone()));
                let renewed: Vec<(String, i64)> = sql::explain(
                    &self.pool,
                    padded
                        .fold(query, |q, (name, ttl_ms, fence)| {
                            q.bind(name).bind(ttl_ms).bind(fence)
                        })
                        .bind(holder)
                        .fetch_all(&self.pool)
                        .await,
                )
                .await?;
                let renewed: HashSet<(&str, i64)> =
                    renewed.iter().map(|(n, f)| (n.as_str(), *f)).collect();
                for (&i, (name, _, fence)) in chunk.iter().zip(&items) {
                    out[i] = fence.is_some_and(|f| renewed.contains(&(*name, f)));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_is_the_default_ddl() {
        let ddl = Statements::default_table(&TEMPLATES).create;
        assert_eq!(
            include_str!("../../../migrations/sqlite/0001_task_leases.sql"),
            format!("{ddl};\n")
        );
    }
}
