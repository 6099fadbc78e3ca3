//! The SQLite dialect of the table backend: [`SqliteTable`], the embedded
//! default for replicas on one host.

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Sqlite};

use super::{
    Info, LIST_SIZES, Layout, Ready, Renewal, Table, Templates, list_size, renewed_of, sealed,
};
use crate::Error;

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

/// The `CREATE TABLE` of the table `$table`: with `"{table}"` the template
/// of every table, with `"task_leases"` [`SqliteTable::SCHEMA`]. One text, so
/// the two cannot drift apart.
macro_rules! create_table {
    ($table:literal) => {
        concat!(
            "CREATE TABLE IF NOT EXISTS ",
            $table,
            " (\n    \
             name TEXT PRIMARY KEY NOT NULL,\n    \
             holder TEXT NOT NULL,\n    \
             expires_at INTEGER NOT NULL /* unix time in ms, from the host clock */,\n    \
             fence INTEGER NOT NULL\n)"
        )
    };
}

const TEMPLATES: Templates = Templates {
    create: create_table!("{table}"),
    add_fence: "ALTER TABLE {table} ADD COLUMN fence INTEGER NOT NULL DEFAULT 0",
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
    // The row of a lease, and the microseconds until it expires.
    info: concat!(
        "SELECT holder, fence, (expires_at - ",
        now_ms!(),
        ") * 1000 FROM {table} WHERE name = ?1"
    ),
    // Every row, as `info` reads one.
    list: concat!(
        "SELECT name, holder, fence, (expires_at - ",
        now_ms!(),
        ") * 1000 FROM {table} ORDER BY name"
    ),
    // An operator's release: the live row of the name, whoever holds it,
    // expired as `release` expires it; the fence stays.
    force_release: concat!(
        "UPDATE {table} SET expires_at = 0 WHERE name = ?1 AND expires_at > ",
        now_ms!()
    ),
};

/// How long a statement waits for another connection's write lock before it
/// fails with `SQLITE_BUSY`, in connections made by `SqliteTable::open`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Leases stored in a SQLite table, one row per lease name: the embedded
/// default when all replicas run on one host and can share one database file.
///
/// The table (by default `task_leases`, see [`with_table`](Table::with_table))
/// has the columns
///
/// | column | type | meaning |
/// |---|---|---|
/// | `name` | `TEXT PRIMARY KEY NOT NULL` | the lease name, compared byte for byte |
/// | `holder` | `TEXT NOT NULL` | who holds (or last held) the lease |
/// | `expires_at` | `INTEGER NOT NULL` | when the lease ends, in Unix milliseconds |
/// | `fence` | `INTEGER NOT NULL` | the fencing counter of the name |
///
/// [`open`](Table::open) creates the file and the table; with your own pool
/// use [`new`](Table::new) and [`ensure_schema`](Table::ensure_schema), or
/// create the table with your own migration tool from
/// [`SqliteTable::SCHEMA`] (`migrations/sqlite/0001_task_leases.sql`
/// in the repository).
///
/// - **Clock.** Expiry is computed inside SQL from the host's wall clock
///   (`julianday('now')`), never by the caller; as all users of the file run
///   on one host, they share that clock. Stepping the host clock shortens or
///   lengthens leases accordingly. A lease is live while `expires_at` is
///   after now.
/// - **Statements.** Acquire is a single
///   `INSERT .. ON CONFLICT .. DO UPDATE .. WHERE .. RETURNING fence`; renew
///   and release are single `UPDATE`s; a batch of renewals is one
///   `UPDATE .. FROM (VALUES (?, ?, ?), ..) .. RETURNING name, fence` per
///   1,000 leases (one write transaction), the list padded (repeating a
///   lease) to one of a few lengths so that a connection prepares at most 11
///   variants. Batches run one after the other: SQLite has one writer at a
///   time anyway.
/// - **Concurrency.** Several processes may share the file. SQLite lets one
///   writer in at a time; a statement that cannot get the write lock within
///   the busy timeout fails with `SQLITE_BUSY`, which is returned as
///   [`Error::Database`] — a transient error, never "held elsewhere".
///
/// - **Waiting** ([`Lease::acquire`](crate::Lease::acquire) with a wait,
///   an [`Election`](crate::Election)): SQLite cannot push a release (to
///   other processes), so waiters poll, every `ttl/10` (at most 1 s, at
///   least 10 ms) with ±20% jitter. Within one [`Lease`](crate::Lease) a
///   release wakes its waiters at once.
/// - **Inspect.** [`Backend::inspect`](crate::Backend::inspect) is one
///   `SELECT` of the row: holder (the last one, once released or expired),
///   fence and time left by the host's clock, in milliseconds. `Ok(None)`
///   when there is no row.
///
/// Everything else — fencing, release, the pool — is the same for every
/// table backend: see [`Table`]. With [`open`](Table::open), the leases
/// have a pool of their own.
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
pub type SqliteTable = Table<SqliteDialect>;

dialect! {
    /// The SQLite [`Dialect`](super::Dialect) of [`SqliteTable`].
    SqliteDialect
}

impl Table<SqliteDialect> {
    /// Opens (creating it if missing) the database file at `path` and the
    /// table `task_leases` in it.
    ///
    /// The connections use WAL journaling (readers and the writer do not
    /// block each other, and the file may be shared by several processes),
    /// `synchronous = NORMAL` (durable across a process crash; a power loss may
    /// forget the last commits, which for leases means they end early) and a
    /// busy timeout of 5 seconds. Then it runs
    /// [`ensure_schema`](Table::ensure_schema).
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

// Sealed: the calls use the crate's own types.
#[allow(private_interfaces)]
impl sealed::Calls for SqliteDialect {
    type Database = Sqlite;
    const NAME: &'static str = "SqliteTable";
    const TEMPLATES: Templates = TEMPLATES;
    const SCHEMA: &'static str = concat!(create_table!("task_leases"), ";\n");
    const CONCURRENT_BATCHES: bool = false;

    fn default_layout() -> Layout {
        Layout::NONE
    }

    /// Nothing to look at: the statements have no placeholders, and no
    /// service of another kind shares a SQLite file.
    async fn inspect(_: &Table<Self>) -> Result<Layout, Error> {
        Ok(Layout::NONE)
    }

    plain_create!();

    numbered_calls!();

    async fn info(t: Ready<'_, Self>, name: &str) -> Result<Option<Info>, sqlx::Error> {
        let row: Option<(String, i64, Option<i64>)> =
            sqlx::query_as(AssertSqlSafe(t.sql.info.clone()))
                .bind(name)
                .fetch_optional(t.pool)
                .await?;
        Ok(row.map(|(holder, fence, left_us)| Info {
            holder,
            fence,
            left_us,
        }))
    }

    async fn list(t: Ready<'_, Self>) -> Result<Vec<(String, Info)>, sqlx::Error> {
        let rows: Vec<(String, String, i64, Option<i64>)> =
            sqlx::query_as(AssertSqlSafe(t.sql.list.clone()))
                .fetch_all(t.pool)
                .await?;
        Ok(rows
            .into_iter()
            .map(|(name, holder, fence, left_us)| {
                let info = Info {
                    holder,
                    fence,
                    left_us,
                };
                (name, info)
            })
            .collect())
    }

    async fn force_release(t: Ready<'_, Self>, name: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(t.sql.force_release.clone()))
            .bind(name)
            .execute(t.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// `(name, ttl, fence)` triples, padded, then the holder; the rows
    /// renewed come back.
    async fn renew_batch(
        t: Ready<'_, Self>,
        holder: &str,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        let size = list_size(leases.len());
        let last = *leases.last().expect("BUG: an empty batch");
        let padded = leases
            .iter()
            .copied()
            .chain(std::iter::repeat_n(last, LIST_SIZES[size] - leases.len()));
        let query = sqlx::query_as(AssertSqlSafe(t.sql.renew_many[size].clone()));
        let renewed: Vec<(String, i64)> = padded
            .fold(query, |q, l| q.bind(l.name).bind(l.ttl_ms).bind(l.fence))
            .bind(holder)
            .fetch_all(t.pool)
            .await?;
        Ok(renewed_of(leases, &renewed))
    }
}
