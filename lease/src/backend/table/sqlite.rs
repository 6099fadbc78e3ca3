//! The SQLite dialect of the table backend: [`SqliteTable`], the embedded
//! default for replicas on one host.

use std::path::Path;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Sqlite};

use super::{
    Column, Dialect, LIST_SIZES, Layout, Ready, RowChange, Table, TableAnswer, TableRenewal,
    TableRequest, Templates, change_text, explain, hex, list_size, renewed_of, rows_text, script,
    sealed, shape,
};
use crate::{Error, LeaseInfo};

/// `migrations/sqlite/0001_task_leases.sql` with the columns of
/// `0002_add_last_slot_and_value.sql`: [`SQLITE_ADD_LAST_SLOT`],
/// [`SQLITE_ADD_VALUE`].
const SQLITE_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS task_leases (
    name TEXT PRIMARY KEY NOT NULL,
    holder TEXT NOT NULL,
    expires_at INTEGER NOT NULL /* unix time in ms, from the host clock */,
    fence INTEGER NOT NULL,
    last_slot INTEGER NULL,
    value TEXT NULL
);
";

const SQLITE_ADD_LAST_SLOT: &str = "ALTER TABLE task_leases ADD COLUMN last_slot INTEGER NULL;\n";
const SQLITE_ADD_VALUE: &str = "ALTER TABLE task_leases ADD COLUMN value TEXT NULL;\n";

const SQLITE_ADD_FENCE: &str =
    "ALTER TABLE task_leases ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;\n";

/// `{now}`: the host's wall clock as integer Unix milliseconds, computed by
/// SQLite, which keeps `'now'` fixed within one `sqlite3_step()`.
/// `julianday` works on every SQLite version, unlike `unixepoch('subsec')`
/// (3.42+), which older versions silently evaluate to NULL.
const NOW_MS: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

// The statements bind by number: name, holder, ttl in ms, fence; or as each says.
const SQLITE_SQL: Templates = Templates {
    // One statement: insert a new row, or take over an expired (or released)
    // row, or extend our own live row. The fence counts acquisitions; only
    // the idempotent re-acquire of our own live lease keeps it, and never
    // moves the expiry earlier (as in pg.rs: an attempt of ours that ran
    // late must not cut the lease we acquired since). The SET expressions
    // all see the old row. When the row is held by someone else
    // the WHERE fails and nothing is returned.
    acquire: "INSERT INTO {table} AS l (name, holder, expires_at, fence) \
              VALUES (?1, ?2, {now} + ?3, 1) ON CONFLICT (name) DO UPDATE SET \
              holder = excluded.holder, expires_at = max(l.expires_at, excluded.expires_at), \
              fence = CASE WHEN l.holder = excluded.holder AND l.expires_at > {now} \
              THEN l.fence ELSE l.fence + 1 END{clear_value} \
              WHERE l.expires_at <= {now} OR l.holder = excluded.holder RETURNING fence",
    // With a slot or a value: a script of three statements with its values
    // written in (see `SqliteTable::acquire_with`), each row tagged: (0) the
    // slot recorded before, for the log of missed slots; (1) the upsert that
    // decides, as `acquire` with the slot's condition, returning the fence
    // when it grants (nothing when it refuses); (2) the row as it is then,
    // which says why it refused (a recorded slot never goes back). `:slot`
    // is computed once, by the caller, so that the three statements agree.
    acquire_with: "SELECT 0, last_slot, NULL FROM {table} WHERE name = :name; \
                   INSERT INTO {table} AS l (name, holder, expires_at, fence, last_slot, value) \
                   VALUES (:name, :holder, {now} + :ttl, 1, \
                   CASE WHEN :retry THEN NULL ELSE :slot END, :value) \
                   ON CONFLICT (name) DO UPDATE SET \
                   holder = excluded.holder, expires_at = max(l.expires_at, excluded.expires_at), \
                   fence = CASE WHEN l.holder = excluded.holder AND l.expires_at > {now} \
                   THEN l.fence ELSE l.fence + 1 END, \
                   last_slot = coalesce(excluded.last_slot, l.last_slot), value = excluded.value \
                   WHERE (l.expires_at <= {now} OR l.holder = excluded.holder) \
                   AND coalesce(l.last_slot < :slot, 1) RETURNING 1, fence, NULL; \
                   SELECT 2, last_slot, \
                   CASE WHEN holder <> :holder THEN (expires_at - {now}) * 1000 END \
                   FROM {table} WHERE name = :name",
    // A released row expires at the epoch, not at "now": expired for every
    // statement, whatever instant it takes as its "now".
    release: "UPDATE {table} SET expires_at = 0{clear_value} \
              WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND expires_at > {now}",
    // ?4: the slot, recorded whoever has the row; the release only if it is
    // still this acquisition's (the SET expressions see the old row).
    release_ran: "UPDATE {table} SET last_slot = max(coalesce(last_slot, ?4), ?4), \
                  expires_at = CASE WHEN holder = ?2 AND fence = ?3 AND expires_at > {now} \
                  THEN 0 ELSE expires_at END, \
                  value = CASE WHEN holder = ?2 AND fence = ?3 AND expires_at > {now} \
                  THEN NULL ELSE value END \
                  WHERE name = ?1",
    publish: "UPDATE {table} SET value = ?4 \
              WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND expires_at > {now}",
    force_release: "UPDATE {table} SET holder = ''{clear_value} \
                    WHERE name = ?1 AND holder <> '' AND expires_at > {now}",
    force_release_now: "UPDATE {table} SET expires_at = 0{clear_value} \
                        WHERE name = ?1 AND expires_at > {now}",
    info: "SELECT name, holder, fence, (expires_at - {now}) * 1000, {value}, {last_slot} \
           FROM {table} WHERE name = ?1",
    list: "SELECT name, holder, fence, (expires_at - {now}) * 1000, {value}, {last_slot} \
           FROM {table} ORDER BY name",
    // `(name, ttl, fence)` triples, then the holder; the (name, fence) of
    // the rows renewed come back.
    renew_many: "UPDATE {table} AS l SET expires_at = max(l.expires_at, {now} + b.lease_ttl) \
                 FROM (SELECT column1 AS lease_name, column2 AS lease_ttl, \
                 column3 AS lease_fence FROM (VALUES {list})) AS b \
                 WHERE l.name = b.lease_name AND l.fence = b.lease_fence AND l.holder = ? \
                 AND l.expires_at > {now} RETURNING name, fence",
    renew: "",
    renewed_many: "",
    list_item: "(?, ?, ?)",
    // A no-op write of the row: the transaction becomes the database's one
    // writer (a SELECT in a deferred transaction would not stop another
    // connection's write in WAL mode), so every other write — an
    // acquisition, a renewal — waits for it to end.
    check_in: "UPDATE {table} SET holder = holder \
               WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND expires_at > {now} \
               RETURNING ''",
};

/// The columns of the table `?1` in the schema `?2` (any, if NULL): name,
/// type, a default, NULL allowed, unique on its own (a unique index, the
/// primary key's included, of that column alone, not partial). No rows:
/// no table.
const SQLITE_COLUMNS: &str = "SELECT c.name, lower(c.type), c.dflt_value IS NOT NULL, \
     c.\"notnull\" = 0, EXISTS (SELECT 1 FROM pragma_index_list(?1, ?2) AS i \
     WHERE i.\"unique\" AND NOT i.partial \
     AND (SELECT count(*) FROM pragma_index_info(i.name, ?2)) = 1 \
     AND (SELECT ii.name FROM pragma_index_info(i.name, ?2) AS ii) = c.name) \
     FROM pragma_table_info(?1, ?2) AS c";

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
/// | `holder` | `TEXT NOT NULL` | who holds (or last held) the lease; empty once force-released |
/// | `expires_at` | `INTEGER NOT NULL` | when the lease ends, in Unix milliseconds |
/// | `fence` | `INTEGER NOT NULL` | the fencing counter of the name |
/// | `last_slot` | `INTEGER NULL` | the last schedule slot claimed ([`Job::once_per`](crate::Job::once_per)) |
/// | `value` | `TEXT NULL` | what the holder published ([`Election::proclaim`](crate::Election::proclaim)) |
///
/// [`open`](Table::open) creates the file and the table; with your own pool
/// use [`new`](Table::new) and [`ensure_schema`](Table::ensure_schema), or
/// create the table from [`SqliteTable::SCHEMA`].
///
/// - **Clock.** Expiry is computed inside SQL from the host's wall clock,
///   which all users of the file share; stepping it shortens or lengthens
///   leases accordingly.
/// - **Concurrency.** Several processes may share the file. A statement
///   that cannot get SQLite's one write lock within the busy timeout fails
///   with `SQLITE_BUSY`, returned as [`Error::Database`] — a transient
///   error, never "held elsewhere".
/// - **Waiting.** SQLite cannot push a release to other processes: waiters
///   poll ([`Lease::acquire`](crate::Lease::acquire)). Within one
///   [`Lease`](crate::Lease) a release wakes its waiters at once.
///
/// For what every table backend does, see [`Table`].
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use leasehold::{Acquisition, Backend, backend::SqliteTable};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), leasehold::Error> {
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
/// let fence = |g: Option<leasehold::Grant>| g.and_then(|g| g.fencing_token);
/// assert_eq!(fence(second), fence(first).map(|f| f + 1));
/// # table.pool().close().await;
/// # for suffix in ["", "-wal", "-shm"] {
/// #     let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
/// # }
/// # Ok(()) }
/// ```
pub type SqliteTable = Table<SqliteDialect>;

/// The SQLite [`Dialect`] of [`SqliteTable`].
#[derive(Debug, Clone, Copy)]
pub enum SqliteDialect {}

impl Dialect for SqliteDialect {}

impl Table<SqliteDialect> {
    /// Opens (creating it if missing) the database file at `path` and the
    /// table `task_leases` in it.
    ///
    /// The connections use WAL journaling (the file may be shared by
    /// several processes), `synchronous = NORMAL` (a power loss may forget
    /// the last commits: leases then end early) and a busy timeout of 5 s.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), leasehold::Error> {
    /// let table = leasehold::backend::SqliteTable::open("/var/lib/app/leases.db").await?;
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

/// Puts the database file into WAL mode, once, with one connection. That
/// takes an exclusive lock SQLite does not wait for: when several processes
/// open a new file at once, all but one get `SQLITE_BUSY` at once, and try
/// again for up to the busy timeout.
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
impl sealed::SqlDialect for SqliteDialect {
    type Database = Sqlite;
    const NAME: &'static str = "SqliteTable";
    const SCHEMA: &'static str = SQLITE_SCHEMA;
    const ADD_FENCE: &'static str = SQLITE_ADD_FENCE;
    const ADD_LAST_SLOT: &'static str = SQLITE_ADD_LAST_SLOT;
    const ADD_VALUE: &'static str = SQLITE_ADD_VALUE;
    const TEMPLATES: Templates = SQLITE_SQL;

    /// One query of the table's pragmas, for the rules every table keeps
    /// and the optional columns: one clock, and no service of another kind
    /// shares a SQLite file.
    async fn inspect(t: &Table<Self>) -> Result<Layout, Error> {
        type SqliteColumnRow = (String, String, bool, bool, bool);
        let (schema, name) = match t.table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, &*t.table),
        };
        let query = sqlx::query_as(SQLITE_COLUMNS).bind(name).bind(schema);
        let rows: Vec<SqliteColumnRow> = explain(&t.pool, query.fetch_all(&t.pool).await).await?;
        let columns: Vec<Column> = rows
            .into_iter()
            .map(|(name, kind, has_default, nullable, unique)| Column {
                name,
                kind,
                precision: None,
                has_default,
                nullable,
                unique,
            })
            .collect();
        let integers = ["integer", "int", "bigint"];
        let shape = shape(&t.table, &columns, &integers, &t.add_fence, &t.create)?;
        let fills = vec![("{now}", NOW_MS.to_owned())];
        Ok(Layout {
            fills,
            columns: shape.columns,
        })
    }

    /// SQLite has one writer at a time.
    async fn create(t: &Table<Self>) -> Result<(), sqlx::Error> {
        let create = sqlx::query(AssertSqlSafe(t.create.clone()));
        create.execute(&t.pool).await.map(drop)
    }

    async fn acquire(
        t: &Ready<'_, Self>,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar(AssertSqlSafe(t.sql.acquire.clone()))
            .bind(name)
            .bind(holder)
            .bind(ttl_ms)
            .fetch_optional(t.pool)
            .await
    }

    /// One call: the script `acquire_with`, with this request's values
    /// written in (text as hex literals cast to text, numbers), and the
    /// slot by the host's clock.
    async fn acquire_with(
        t: &Ready<'_, Self>,
        c: &TableRequest<'_>,
    ) -> Result<TableAnswer, sqlx::Error> {
        let now_ms = i64::try_from(crate::backend::clock_ms()).unwrap_or(i64::MAX);
        let slot = c.period_ms.map(|period| now_ms / period);
        let text = |bytes: &[u8]| format!("CAST(X'{}' AS TEXT)", hex(bytes));
        let script = script(&t.sql.acquire_with, c, slot, text);
        let mut answer = TableAnswer {
            slot,
            ..TableAnswer::default()
        };
        let (mut before, mut after) = (None, None);
        for row in sqlx::raw_sql(AssertSqlSafe(script))
            .fetch_all(t.pool)
            .await?
        {
            let (tag, a, b): (i64, Option<i64>, Option<i64>) = sqlx::FromRow::from_row(&row)?;
            match tag {
                0 => before = a,
                1 => answer.fence = a,
                _ => (after, answer.others_left_us) = (a, b),
            }
        }
        answer.last_slot = if answer.fence.is_some() {
            before
        } else {
            after
        };
        Ok(answer)
    }

    /// `(name, ttl, fence)` triples, padded, then the holder.
    async fn renew_batch(
        t: &Ready<'_, Self>,
        holder: &str,
        leases: &[TableRenewal<'_>],
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

    async fn change(
        t: &Ready<'_, Self>,
        name: &str,
        change: RowChange<'_>,
    ) -> Result<bool, sqlx::Error> {
        change_text(
            t,
            name,
            change,
            sqlx::sqlite::SqliteQueryResult::rows_affected,
        )
        .await
    }

    async fn rows(t: &Ready<'_, Self>, name: Option<&str>) -> Result<Vec<LeaseInfo>, sqlx::Error> {
        rows_text(t, name).await
    }
}

impl super::CheckIn for sqlx::SqliteConnection {}

impl sealed::CheckInConnection for sqlx::SqliteConnection {
    type Dialect = SqliteDialect;

    async fn check_in(
        &mut self,
        sql: &str,
        name: &str,
        holder: &str,
        fence: Option<i64>,
    ) -> Result<Option<String>, sqlx::Error> {
        let query = sqlx::query_scalar(AssertSqlSafe(sql));
        let query = query.bind(name).bind(holder).bind(fence);
        query.fetch_optional(self).await
    }
}
