//! The table backends' shared core: [`Table`], generic over its SQL
//! [`Dialect`] (PostgreSQL, MySQL/MariaDB, SQLite).
//!
//! Everything that does not depend on the SQL dialect lives here once: the
//! struct and its constructors, the validated table name and the statements
//! built from it, input checks, fencing-token conversion, the retry of
//! transient errors, the batching of renewals, and the [`Backend`] impl. A
//! dialect's file (`table/pg.rs`, `table/mysql.rs`, `table/sqlite.rs`) keeps
//! only its statements, the reasons for them, and the few lines that bind
//! and run them.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, validate};

/// The acquire, renew and release calls of a dialect whose statements
/// number their parameters (`$1` / `?1`: name, holder, ttl in ms, fence),
/// so that binding in that order fits every statement: PostgreSQL, SQLite.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! numbered_calls {
    () => {
        async fn acquire(
            t: Ready<'_, Self>,
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

        async fn renew(
            t: Ready<'_, Self>,
            lease: Renewal<'_>,
            holder: &str,
        ) -> Result<bool, sqlx::Error> {
            let done = sqlx::query(AssertSqlSafe(t.sql.renew.clone()))
                .bind(lease.name)
                .bind(holder)
                .bind(lease.ttl_ms)
                .bind(lease.fence)
                .execute(t.pool)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        release_call!();
    };
}

/// The release call: the statement takes name, holder and fence, in that
/// order, in every dialect (MySQL binds names and holders as bytes).
macro_rules! release_call {
    ($($to_bytes:ident)?) => {
        async fn release(
            t: Ready<'_, Self>,
            name: &str,
            holder: &str,
            fence: Option<i64>,
        ) -> Result<(), sqlx::Error> {
            sqlx::query(AssertSqlSafe(t.sql.release.clone()))
                .bind(name$(.$to_bytes())?)
                .bind(holder$(.$to_bytes())?)
                .bind(fence)
                .execute(t.pool)
                .await
                .map(drop)
        }
    };
}

/// A dialect's marker type, with its docs.
macro_rules! dialect {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub enum $name {}

        impl super::Dialect for $name {}
    };
}

/// `create` as one plain statement (MySQL serialises concurrent
/// `CREATE TABLE IF NOT EXISTS` itself; SQLite has one writer at a time).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
macro_rules! plain_create {
    () => {
        async fn create(t: &Table<Self>) -> Result<(), sqlx::Error> {
            sqlx::query(AssertSqlSafe(t.create.clone()))
                .execute(&t.pool)
                .await
                .map(drop)
        }
    };
}

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod pg;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "mysql")]
pub use mysql::{MySqlDialect, MySqlTable};
#[cfg(feature = "postgres")]
pub use pg::{PgDialect, PgTable};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteDialect, SqliteTable};

/// Leases in a SQL table, one row per lease name — the implementation behind
/// [`PgTable`](crate::backend::PgTable), [`MySqlTable`](crate::backend::MySqlTable)
/// and [`SqliteTable`](crate::backend::SqliteTable); see each of them for its
/// columns, clock and statements.
///
/// What every table backend guarantees:
///
/// - **The server's clock decides expiry** (the database's, or for SQLite
///   the host's, read inside SQL), never the caller's.
/// - **Fencing.** Each acquisition returns the row's `fence`: 1 for the first
///   acquisition of a name, one more for each later one, unchanged when the
///   holder re-acquires its own live lease. (In a table shared with the Go
///   services, whose release deletes the row, the counter starts again at 1
///   after each of their releases: see "Migrating from the Go packages" in
///   the README.)
/// - **Renew and release concern one acquisition**: they match name, holder
///   and fence, so a late request of an older acquisition never touches a
///   newer one. Renew never inserts a row, and never brings back a released
///   or expired lease.
/// - **Release keeps the row**: it sets `expires_at` to the epoch, so the
///   fence never restarts, and a statement that waited for the release's row
///   lock sees the row expired whatever instant it took as its "now". Rows
///   are never deleted by this crate.
/// - **One statement per call**, in autocommit; the renewals of many leases
///   of one holder ([`Backend::renew_many`], which the engine uses) are one
///   statement per 1,000 leases, and each lease learns whether it was renewed.
/// - Names and holders are always bind parameters. The table name is
///   validated when the backend is built and then put into the statements,
///   which are built once, at the first call.
/// - **The table is checked at the first call**, with one query of the
///   server's catalog, once per backend value (clones share the result): it
///   must exist and have the columns `name` (unique on its own: the primary
///   key), `holder`, `expires_at` and `fence` (an integer, NOT NULL), and
///   `expires_at` a type whose expiries every user of the table reads alike
///   (see each backend). Otherwise that call, and every later one until the
///   table is fixed, fails with [`Error::Schema`], which names the table, the
///   column and the statement that fixes it — for a table made for the Go
///   services, [`fence_migration`](Table::fence_migration). The statements
///   follow the column's type and precision.
/// - **A `fence` column with a default** (as [`fence_migration`](Table::fence_migration)
///   adds it) marks a table *shared* with services that insert rows without
///   a fence — the Go services during a migration. Their rows get the fence
///   0, and the next acquisition here makes it 1 or more. A time column
///   without a time zone is refused in a shared table: the Go services write
///   it in their sessions' time zone, which this crate cannot know.
/// - A call whose future is dropped (for example by a timeout) after its
///   statement reached the server may still take effect: an acquisition the
///   caller never learned of ends at its ttl, or is picked up by the same
///   holder's next (idempotent) acquire.
/// - **Waiting** ([`Backend::released`]): `PgTable`'s release notifies a
///   channel, and its waiters listen on one pooled connection (see
///   [`PgTable`](crate::backend::PgTable)); `MySqlTable` and `SqliteTable`
///   poll (every `ttl/10`, at most 1 s, with ±20% jitter).
/// - **[`inspect`](Backend::inspect)** is one `SELECT` of the name's row:
///   holder, fence, and the time until another holder may take it, by the
///   clock the statements use; `Ok(None)` without a row.
///
/// **Renewals share your pool.** Renewals and releases take a connection
/// from the pool the backend was given, like the rest of your program. A job
/// that holds every connection of that pool (a long transaction on each, a
/// pool of one) keeps its own lease from being renewed, and loses the lease
/// at its deadline. Give the pool one connection more than the job uses at
/// once, or give the backend a small pool of its own. (`PgTable`'s
/// listener, while some waiter waits, holds one more.)
///
/// **Round trips.** Each call checks a connection out of the pool, and by
/// default sqlx tests an idle connection before handing it out
/// (`test_before_acquire`): a renewal then costs two round trips, and it must
/// answer within `ttl/3`. Build the pool with `test_before_acquire(false)` to
/// make it one; a connection found dead is then reported by the statement
/// itself, and the engine retries the renewal on another connection.
///
/// **An unreachable server.** sqlx retries a refused connection until the
/// pool's `acquire_timeout` (30 s by default) and only then fails; the
/// backend then makes one connection attempt of its own to report why
/// ("connection refused", ...). Give the pool an `acquire_timeout` shorter
/// than the ttl, or the engine's own limit on an acquisition
/// (`min(ttl - margin, 30 s)`) ends the call first, and the log reads
/// "acquire timed out" without the reason.
///
/// Cloning is cheap: a pool and reference-counted statements.
pub struct Table<D: Dialect> {
    pool: sqlx::Pool<D::Database>,
    /// The validated table name.
    table: Arc<str>,
    /// `CREATE TABLE IF NOT EXISTS` for this table.
    create: Arc<str>,
    /// `ALTER TABLE .. ADD COLUMN fence ..` for this table.
    add_fence: Arc<str>,
    /// The statements, built at the first call from what the table looks
    /// like (its column types); shared by clones, so the table is checked
    /// once per backend value.
    sql: Arc<tokio::sync::OnceCell<Statements>>,
    /// What waiters of this backend value share ([`Backend::released`]):
    /// PostgreSQL's listener, started by the first waiter and stopped when
    /// the last clone is dropped; nothing for the dialects that poll.
    push: Arc<std::sync::OnceLock<TablePush>>,
}

/// What a table backend keeps for its waiters: PostgreSQL's listener (the
/// other dialects poll, and leave it empty).
#[cfg(feature = "postgres")]
type TablePush = crate::backend::push::Push<crate::backend::push::pg::PgSource>;
#[cfg(not(feature = "postgres"))]
type TablePush = ();

impl<D: Dialect> Clone for Table<D> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            table: self.table.clone(),
            create: self.create.clone(),
            add_fence: self.add_fence.clone(),
            sql: self.sql.clone(),
            push: self.push.clone(),
        }
    }
}

impl<D: Dialect> std::fmt::Debug for Table<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(D::NAME)
            .field("table", &self.table)
            .field("checked", &self.sql.initialized())
            .field("pool", &self.pool)
            .finish()
    }
}

/// The SQL dialect of a [`Table`]: PostgreSQL ([`PgDialect`]), MySQL/MariaDB
/// ([`MySqlDialect`]) or SQLite ([`SqliteDialect`]). Sealed: implemented by
/// this crate only.
pub trait Dialect: sealed::Calls {}

/// What a dialect provides to the core: its statements and the calls that
/// bind and run them. Not reachable from outside the crate (the module is
/// private), so its items may use the crate's own types.
#[allow(unreachable_pub, private_interfaces, private_bounds)]
mod sealed {
    use std::future::Future;
    use std::time::Duration;

    use super::{Info, Layout, Ready, Renewal, Table, Templates};
    use crate::Error;

    pub trait Calls: Sized + Send + Sync + 'static {
        /// The sqlx database.
        type Database: sqlx::Database;
        /// The backend's type name, for `Debug`.
        const NAME: &'static str;
        /// The statements, with `{table}` for the table name and the
        /// placeholders of a [`Layout`].
        const TEMPLATES: Templates;
        /// The DDL of the default table as a migration file (see
        /// [`Table::SCHEMA`]).
        const SCHEMA: &'static str;
        /// Renewal batches run concurrently (one after the other if not).
        const CONCURRENT_BATCHES: bool;

        /// The layout of the table `ensure_schema` creates.
        fn default_layout() -> Layout;
        /// Look at the table (once, before the first statement): the
        /// [`Layout`] its statements are built for, or
        /// [`Error::Schema`] when it cannot be used.
        fn inspect(t: &Table<Self>) -> impl Future<Output = Result<Layout, Error>> + Send
        where
            Self: super::Dialect;
        /// Create the table if it does not exist.
        fn create(t: &Table<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send
        where
            Self: super::Dialect;
        /// The acquire statement: the fence of the grant, or `None` when
        /// another holder has a live lease.
        fn acquire(
            t: Ready<'_, Self>,
            name: &str,
            holder: &str,
            ttl_ms: i64,
        ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send
        where
            Self: super::Dialect;
        /// The renew statement: whether it matched a live row.
        fn renew(
            t: Ready<'_, Self>,
            lease: Renewal<'_>,
            holder: &str,
        ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send
        where
            Self: super::Dialect;
        /// The release statement.
        fn release(
            t: Ready<'_, Self>,
            name: &str,
            holder: &str,
            fence: Option<i64>,
        ) -> impl Future<Output = Result<(), sqlx::Error>> + Send
        where
            Self: super::Dialect;
        /// Renew `leases` (of `holder`, at most [`super::RENEW_MANY_CHUNK`])
        /// in one statement (or as few as the dialect allows); which were
        /// renewed, in order.
        fn renew_batch(
            t: Ready<'_, Self>,
            holder: &str,
            leases: &[Renewal<'_>],
        ) -> impl Future<Output = Result<Vec<bool>, sqlx::Error>> + Send
        where
            Self: super::Dialect;
        /// An error after which the server rolled the statement back and it
        /// may simply be run again (none, unless the dialect says so).
        fn is_transient(e: &sqlx::Error) -> bool {
            let _ = e;
            false
        }
        /// The `info` statement: the row of `name`, if there is one.
        fn info(
            t: Ready<'_, Self>,
            name: &str,
        ) -> impl Future<Output = Result<Option<Info>, sqlx::Error>> + Send
        where
            Self: super::Dialect;
        /// The `list` statement: every row, by name.
        fn list(
            t: Ready<'_, Self>,
        ) -> impl Future<Output = Result<Vec<(String, Info)>, sqlx::Error>> + Send
        where
            Self: super::Dialect;
        /// The `force_release` statement: whether it expired a live row.
        fn force_release(
            t: Ready<'_, Self>,
            name: &str,
        ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send
        where
            Self: super::Dialect;
        /// [`Backend::released`](crate::Backend::released): polls, unless
        /// the dialect's server pushes releases.
        fn released(
            t: &Table<Self>,
            name: &str,
            poll: Duration,
        ) -> impl Future<Output = ()> + Send + 'static
        where
            Self: super::Dialect,
        {
            let _ = (t, name);
            tokio::time::sleep(poll)
        }
    }
}

/// A checked table's pool and statements: what the statement calls need.
pub(crate) struct Ready<'a, D: Dialect> {
    pub(crate) pool: &'a sqlx::Pool<D::Database>,
    pub(crate) sql: &'a Statements,
}

impl<D: Dialect> Clone for Ready<'_, D> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<D: Dialect> Copy for Ready<'_, D> {}

/// One lease of a renewal, as bound: name, ttl in milliseconds, fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Renewal<'a> {
    pub(crate) name: &'a str,
    pub(crate) ttl_ms: i64,
    pub(crate) fence: Option<i64>,
}

/// The row of a lease as the `info` statement reads it: the holder, the
/// fence, and the microseconds until another holder may take it, by the
/// server's clock (zero or less: expired or released).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Info {
    pub(crate) holder: String,
    pub(crate) fence: i64,
    pub(crate) left_us: Option<i64>,
}

impl Info {
    fn into_lease_info(self, name: &str) -> LeaseInfo {
        let expires_in = self
            .left_us
            .and_then(|us| u64::try_from(us).ok())
            .filter(|&us| us > 0)
            .map(Duration::from_micros);
        // 0: a row the Go services inserted, which has no fence yet.
        let fence = u64::try_from(self.fence).ok().filter(|&f| f > 0);
        LeaseInfo::new(name, self.holder, expires_in, fence)
    }
}

impl<D: Dialect> Table<D> {
    /// The DDL of the default table, `task_leases`, as a migration file: the
    /// `CREATE TABLE IF NOT EXISTS` that [`ensure_schema`](Table::ensure_schema)
    /// runs, then `;` and a newline — the text of
    /// `migrations/{postgres,mysql,sqlite}/0001_task_leases.sql` in the
    /// repository (a test holds them equal).
    ///
    /// Add it to your own migrations (sqlx-cli, refinery, ...) when the
    /// application's database user may not create tables. For a table named
    /// with [`with_table`](Table::with_table), use [`schema`](Table::schema).
    ///
    /// # Examples
    ///
    /// ```
    /// use lease::backend::PgTable;
    ///
    /// // The text of a migration file (sqlx-cli, refinery, ...):
    /// assert!(PgTable::SCHEMA.starts_with("CREATE TABLE IF NOT EXISTS task_leases ("));
    ///
    /// // Or run it yourself, once, as a user that may create tables:
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), sqlx::Error> {
    /// sqlx::raw_sql(PgTable::SCHEMA).execute(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub const SCHEMA: &'static str = D::SCHEMA;

    /// A backend on the table `task_leases` of `pool`'s database.
    ///
    /// Nothing is sent to the server until the first call; create the table
    /// with [`ensure_schema`](Self::ensure_schema) or a migration.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lease::backend::PgTable;
    ///
    /// # async fn f() -> Result<(), lease::Error> {
    /// let table = PgTable::new(sqlx::PgPool::connect("postgres://localhost/app").await?);
    /// assert_eq!(table.table(), "task_leases");
    /// # Ok(()) }
    /// ```
    pub fn new(pool: sqlx::Pool<D::Database>) -> Self {
        Self::on(pool, DEFAULT_TABLE).expect("BUG: the default table name is valid")
    }

    /// A backend on `table` (validated) of `pool`'s database.
    fn on(pool: sqlx::Pool<D::Database>, table: &str) -> Result<Self, Error> {
        validate::table(table)?;
        Ok(Self {
            pool,
            table: table.into(),
            create: fill(D::TEMPLATES.create, table, &Layout::NONE),
            add_fence: fill(D::TEMPLATES.add_fence, table, &Layout::NONE),
            sql: Arc::default(),
            push: Arc::default(),
        })
    }

    /// The same backend on another table, `name` or `schema.name`.
    ///
    /// The name must match `[A-Za-z_][A-Za-z0-9_]*` (at most 63 bytes), once or
    /// twice separated by one `.`; it is used unquoted (PostgreSQL folds it to
    /// lower case). A schema (MySQL: a database) must already exist.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lease::backend::PgTable;
    ///
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), lease::Error> {
    /// let table = PgTable::new(pool).with_table("jobs.leases")?;
    /// table.ensure_schema().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidTable`] when `table` is not such a name.
    pub fn with_table(self, table: &str) -> Result<Self, Error> {
        Self::on(self.pool, table)
    }

    /// Creates the table if it does not exist.
    ///
    /// Idempotent, and safe to call from many connections or processes at
    /// once. It never touches sqlx's `_sqlx_migrations` table. The DDL is
    /// [`schema`](Self::schema); for the default table it is the `SCHEMA` of
    /// the backend ([`PgTable::SCHEMA`](crate::backend::PgTable::SCHEMA),
    /// ...), the dialect's file in `migrations/`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), lease::Error> {
    /// lease::backend::PgTable::new(pool).ensure_schema().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the server cannot be reached or refuses the
    /// statement (for example a missing schema or privilege).
    pub async fn ensure_schema(&self) -> Result<(), Error> {
        explain(&self.pool, D::create(self).await).await
    }

    /// The pool this backend runs its statements on.
    ///
    /// Use it for your own queries, for example to see who holds what.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(table: lease::backend::PgTable) -> Result<(), lease::Error> {
    /// let holders: Vec<(String, String, i64)> = sqlx::query_as(
    ///     "SELECT name, holder, fence FROM task_leases WHERE expires_at > clock_timestamp()",
    /// )
    /// .fetch_all(table.pool())
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn pool(&self) -> &sqlx::Pool<D::Database> {
        &self.pool
    }

    /// The statement that creates this backend's table:
    /// `CREATE TABLE IF NOT EXISTS {table} (..)`, as
    /// [`ensure_schema`](Self::ensure_schema) runs it.
    ///
    /// For the default table, `task_leases`, it is the backend's `SCHEMA`
    /// constant ([`PgTable::SCHEMA`](crate::backend::PgTable::SCHEMA),
    /// [`MySqlTable::SCHEMA`](crate::backend::MySqlTable::SCHEMA),
    /// [`SqliteTable::SCHEMA`](crate::backend::SqliteTable::SCHEMA)) without
    /// its closing `;` and newline; for a table named with
    /// [`with_table`](Self::with_table), the same with that name. Run it with
    /// your migration tool when the application's database user may not
    /// create tables.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), lease::Error> {
    /// let table = lease::backend::PgTable::new(pool).with_table("jobs.leases")?;
    /// assert!(table.schema().starts_with("CREATE TABLE IF NOT EXISTS jobs.leases ("));
    /// # Ok(()) }
    /// ```
    pub fn schema(&self) -> &str {
        &self.create
    }

    /// The table name, as given to [`with_table`](Self::with_table)
    /// (`task_leases` by default).
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The statement that adds the `fence` column to a table made for the
    /// Go services (`name`, `holder`, `expires_at`), for this backend's
    /// table: `ALTER TABLE {table} ADD COLUMN .. fence BIGINT NOT NULL DEFAULT 0`.
    ///
    /// For `task_leases` it is the file `migrations/from-go/<database>/0001_add_fence.sql`.
    /// Existing rows, and rows the Go services insert, get the fence 0; the
    /// next acquisition through this crate makes it 1 or more. The default
    /// also tells this crate that the table is shared with services that
    /// insert rows without a fence: see "Migrating from the Go packages" in
    /// the README for what that changes and when to drop it.
    ///
    /// Run it with your migration tool or yourself; the backend never
    /// alters a table. A backend on a table without the column answers its
    /// first call with [`Error::Schema`], which quotes this statement.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), lease::Error> {
    /// let table = lease::backend::PgTable::new(pool);
    /// assert_eq!(
    ///     table.fence_migration(),
    ///     "ALTER TABLE task_leases ADD COLUMN IF NOT EXISTS fence BIGINT NOT NULL DEFAULT 0"
    /// );
    /// # Ok(()) }
    /// ```
    pub fn fence_migration(&self) -> &str {
        &self.add_fence
    }

    /// The statements, and with them the pool: built at the first call,
    /// after looking at the table ([`sealed::Calls::inspect`]); a call that
    /// fails to look (the server is unreachable, the table is unusable)
    /// leaves it to the next call to try again.
    async fn ready(&self) -> Result<Ready<'_, D>, Error> {
        let sql = match self.sql.get() {
            Some(sql) => sql,
            None => {
                self.sql
                    .get_or_try_init(|| async {
                        let layout = D::inspect(self).await?;
                        Ok::<_, Error>(Statements::new(&D::TEMPLATES, &self.table, &layout))
                    })
                    .await?
            }
        };
        Ok(Ready {
            pool: &self.pool,
            sql,
        })
    }

    /// Runs one autocommit statement, again after a transient error (the
    /// server rolled it back, so it is safe to run again; at most
    /// [`ATTEMPTS`] times in all, with a short random backoff), and explains
    /// a connection that could not be opened.
    async fn run<T, F, Fut>(&self, statement: F) -> Result<T, Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let mut attempt = 1;
        loop {
            match statement().await {
                Err(e) if attempt < ATTEMPTS && D::is_transient(&e) => {
                    // 2, 4, 8, 16, 32 ms, each plus up to as much again at random,
                    // so that the contenders do not collide again in lockstep.
                    let base = 1u64 << attempt;
                    let jitter = RandomState::new().hash_one(attempt) % (base + 1);
                    tokio::time::sleep(Duration::from_millis(base + jitter)).await;
                    attempt += 1;
                }
                result => return explain(&self.pool, result).await,
            }
        }
    }
}

impl<D: Dialect> Table<D> {
    /// Renew the leases `at` (positions in `renewals`) of `holder`;
    /// `(position, renewed)` for each.
    async fn renew_chunk(
        &self,
        t: Ready<'_, D>,
        holder: &str,
        at: &[usize],
        renewals: &[Renewal<'_>],
    ) -> Result<Vec<(usize, bool)>> {
        let batch: Vec<Renewal<'_>> = at.iter().map(|&i| renewals[i]).collect();
        let renewed = self.run(|| D::renew_batch(t, holder, &batch)).await?;
        Ok(at.iter().copied().zip(renewed).collect())
    }
}

/// How many times a statement is tried when the server reports a transient
/// error (an InnoDB deadlock or lock wait timeout).
const ATTEMPTS: u32 = 6;

impl<D: Dialect> Backend for Table<D> {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        let ttl_ms = check(name, holder, ttl)?;
        let t = self.ready().await?;
        let fence = self.run(|| D::acquire(t, name, holder, ttl_ms)).await?;
        fence
            .map(|f| Ok(Grant::new(Some(fence_token(f)?))))
            .transpose()
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool> {
        let renewal = Renewal {
            name: lease.name,
            ttl_ms: check(lease.name, lease.holder, ttl)?,
            fence: fence_param(lease.fencing_token),
        };
        let t = self.ready().await?;
        self.run(|| D::renew(t, renewal, lease.holder)).await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<()> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let fence = fence_param(lease.fencing_token);
        let t = self.ready().await?;
        self.run(|| D::release(t, lease.name, lease.holder, fence))
            .await
    }

    /// One `SELECT` of the lease's row: its holder (the last one, if it has
    /// expired or was released), fence, and the time until another holder
    /// may take it, by the server's clock — for a coarse `expires_at`
    /// column that is up to a step after its stored expiry (see each
    /// dialect). `Ok(None)` when the table has no row for `name` (never
    /// acquired here, or deleted by the Go services' release).
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>> {
        validate::name(name)?;
        let t = self.ready().await?;
        let row = self.run(|| D::info(t, name)).await?;
        Ok(row.map(|info| info.into_lease_info(name)))
    }

    /// One `SELECT` of every row of the table, ordered by name, each as
    /// [`inspect`](Backend::inspect) reads it: released and expired rows
    /// too (with `expires_in: None`). A table keeps a row for every name
    /// ever acquired in it, so the list grows with the names (one per
    /// tenant, ...), not with the leases held.
    async fn list(&self) -> Result<Vec<LeaseInfo>> {
        let t = self.ready().await?;
        let rows = self.run(|| D::list(t)).await?;
        Ok(rows
            .into_iter()
            .map(|(name, info)| info.into_lease_info(&name))
            .collect())
    }

    /// One `UPDATE` that expires the live row of `name` as a release does
    /// (`expires_at` at the epoch), whoever holds it; the fence is kept, so
    /// the next acquisition gets a larger fencing token. The evicted holder
    /// finds out at its next renewal, which matches no live row: its token
    /// is cancelled then. `PgTable` notifies the table's channel, as a
    /// release does, so waiters take it at once. `Ok(false)` when no live
    /// row was there (free, released, expired, or no row).
    async fn force_release(&self, name: &str) -> Result<bool> {
        validate::name(name)?;
        let t = self.ready().await?;
        self.run(|| D::force_release(t, name)).await
    }

    /// PostgreSQL: a notification on the table's channel, about one round
    /// trip after the release (see [`PgTable`](crate::backend::PgTable));
    /// MySQL and SQLite: `poll`.
    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        D::released(self, name, poll)
    }

    /// One statement per holder and 1,000 leases (MySQL: per holder, ttl
    /// and 1,000 leases, and a `SELECT` when some lease was not renewed).
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>> {
        let mut groups: Vec<(&str, Vec<usize>)> = Vec::new();
        let mut renewals = Vec::with_capacity(leases.len());
        for (i, &(lease, ttl)) in leases.iter().enumerate() {
            renewals.push(Renewal {
                name: lease.name,
                ttl_ms: check(lease.name, lease.holder, ttl)?,
                fence: fence_param(lease.fencing_token),
            });
            match groups.iter_mut().find(|(h, _)| *h == lease.holder) {
                Some((_, at)) => at.push(i),
                None => groups.push((lease.holder, vec![i])),
            }
        }
        let t = self.ready().await?;
        let chunks: Vec<(&str, &[usize])> = groups
            .iter()
            .flat_map(|(holder, at)| at.chunks(RENEW_MANY_CHUNK).map(move |c| (*holder, c)))
            .collect();
        let calls = chunks
            .iter()
            .map(|&(holder, at)| self.renew_chunk(t, holder, at, &renewals));
        let results = if D::CONCURRENT_BATCHES {
            futures_util::future::join_all(calls).await
        } else {
            let mut results = Vec::new();
            for call in calls {
                results.push(call.await);
            }
            results
        };
        let mut out = vec![false; leases.len()];
        for chunk in results {
            for (i, renewed) in chunk? {
                out[i] = renewed;
            }
        }
        Ok(out)
    }
}

type Result<T, E = Error> = std::result::Result<T, E>;

/// The table used by `new(pool)`.
pub(crate) const DEFAULT_TABLE: &str = "task_leases";

/// The placeholder for the table name in the SQL templates of the backends.
const TABLE: &str = "{table}";

/// The placeholder for the list of bind parameters of a batch.
const LIST: &str = "{list}";

/// The most leases one batched renewal statement takes; larger batches are
/// split (the engine never sends larger ones).
pub(crate) const RENEW_MANY_CHUNK: usize = crate::backend::MAX_BATCH;

/// The list lengths the batched statements are built for, when a backend
/// binds one parameter (or pair) per lease: a batch is padded up to the next
/// length by repeating its last lease, so that a connection prepares at most
/// this many variants of the statement.
pub(crate) const LIST_SIZES: [usize; 11] =
    [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, RENEW_MANY_CHUNK];

/// The index in [`LIST_SIZES`] of the shortest list that takes `n` leases
/// (`1 ..= RENEW_MANY_CHUNK`).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn list_size(n: usize) -> usize {
    LIST_SIZES
        .iter()
        .position(|&size| size >= n)
        .expect("BUG: a batch larger than RENEW_MANY_CHUNK")
}

/// SQL templates of one backend; `{table}` stands for the table name.
pub(crate) struct Templates {
    pub(crate) create: &'static str,
    /// Adds the `fence` column to a table made for the Go services.
    pub(crate) add_fence: &'static str,
    pub(crate) acquire: &'static str,
    pub(crate) renew: &'static str,
    pub(crate) release: &'static str,
    /// The batched renewal. With a `list_item`, `{list}` stands for one
    /// `list_item` per lease, separated by commas, and one statement is built
    /// per length in [`LIST_SIZES`].
    pub(crate) renew_many: &'static str,
    /// MySQL only (else empty): which of a batch's leases are ours and live,
    /// for when the renewal matched fewer rows than it had leases.
    pub(crate) renewed_many: &'static str,
    /// The bind parameters of one lease in `{list}`, or empty when the
    /// statement takes arrays.
    pub(crate) list_item: &'static str,
    /// The row of one lease ([`Info`]): holder, fence, and microseconds
    /// left by the server's clock; the name bound as the only parameter.
    pub(crate) info: &'static str,
    /// Every row ([`Info`] with the name first), ordered by name; no
    /// parameters.
    pub(crate) list: &'static str,
    /// Expire the live row of the name bound as the only parameter,
    /// whoever holds it (the fence is kept); one row matched iff it was live.
    pub(crate) force_release: &'static str,
}

/// What the statements of a table look like beyond its name: the SQL put in
/// for each placeholder of a dialect's templates (`{now}`, `{cutoff}`,
/// `{pad}`, `{epoch}`: which clock, how a lease's liveness is judged at the
/// column's precision, ...), in order (a value may contain a later
/// placeholder). Every value comes from this crate's source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout(pub(crate) Vec<(&'static str, String)>);

impl Layout {
    /// No placeholders (the DDL, SQLite).
    pub(crate) const NONE: Layout = Layout(Vec::new());
}

/// `template` with `table` and the values of `layout` filled in.
///
/// The table name is the only text that did not come from this crate's
/// source, and it was validated ([`validate::table`]): an identifier of
/// `[A-Za-z0-9_]` with at most one `.`, which cannot contain quotes,
/// comments, whitespace, `;` or braces (so no placeholder either).
fn fill(template: &str, table: &str, layout: &Layout) -> Arc<str> {
    debug_assert!(template.contains(TABLE), "BUG: a template without {TABLE}");
    let mut sql = template.replace(TABLE, table);
    for (placeholder, value) in &layout.0 {
        sql = sql.replace(placeholder, value);
    }
    debug_assert!(
        !sql.contains('{'),
        "BUG: a placeholder left unfilled in {sql}"
    );
    sql.into()
}

/// The statements of one table backend, built once from a validated table
/// name and the table's [`Layout`]. Cloning is a few reference-count
/// increments.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    pub(crate) acquire: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) info: Arc<str>,
    pub(crate) list: Arc<str>,
    pub(crate) force_release: Arc<str>,
    /// One per length in [`LIST_SIZES`], or a single statement.
    pub(crate) renew_many: Arc<[Arc<str>]>,
    /// Like `renew_many` (MySQL only, else empty).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) renewed_many: Arc<[Arc<str>]>,
}

impl Statements {
    /// `templates` with `table` (validated by the caller, see [`fill`]) and
    /// `layout` filled in.
    pub(crate) fn new(templates: &Templates, table: &str, layout: &Layout) -> Self {
        let fill = |template: &str| fill(template, table, layout);
        let lists = |template: &'static str| -> Arc<[Arc<str>]> {
            if template.is_empty() {
                return Arc::new([]);
            }
            if templates.list_item.is_empty() {
                return Arc::new([fill(template)]);
            }
            debug_assert!(
                template.contains(LIST),
                "BUG: a batch template without {LIST}"
            );
            LIST_SIZES
                .iter()
                .map(|&n| {
                    let list = vec![templates.list_item; n].join(", ");
                    fill(&template.replace(LIST, &list))
                })
                .collect()
        };
        Self {
            acquire: fill(templates.acquire),
            renew: fill(templates.renew),
            release: fill(templates.release),
            info: fill(templates.info),
            list: fill(templates.list),
            force_release: fill(templates.force_release),
            renew_many: lists(templates.renew_many),
            renewed_many: lists(templates.renewed_many),
        }
    }
}

/// A column of a lease table, as the server describes it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug, Clone, Default)]
pub(crate) struct Column {
    /// The name, in lower case.
    pub(crate) name: String,
    /// The type's name, in lower case (`timestamptz`, `datetime`, `bigint`, ...).
    pub(crate) kind: String,
    /// Fractional-second digits, for a time column.
    pub(crate) precision: Option<u32>,
    /// It has a default value.
    pub(crate) has_default: bool,
    /// It may be NULL.
    pub(crate) nullable: bool,
    /// A unique index (or the primary key) is on this column alone.
    pub(crate) unique: bool,
}

/// What a table backend needs to know of a table, once the rules every
/// dialect shares hold ([`shape`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug)]
pub(crate) struct Shape<'a> {
    /// The `expires_at` column.
    pub(crate) expires_at: &'a Column,
    /// The table is shared with services that insert rows without a fence
    /// (the Go services): the `fence` column has a default.
    pub(crate) shared: bool,
}

/// The rules for a lease table's columns that do not depend on the dialect:
/// the table exists; it has `name` (unique on its own: one row per lease),
/// `holder`, `expires_at` and `fence` (an integer type of `integers`, NOT
/// NULL). `add_fence` is the statement that adds a missing `fence`, `create`
/// how to make the table.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn shape<'a>(
    table: &str,
    columns: &'a [Column],
    integers: &[&str],
    add_fence: &str,
    create: &str,
) -> Result<Shape<'a>, Error> {
    let refuse = |problem: String, fix: String| Error::Schema {
        table: table.to_owned(),
        problem,
        fix,
    };
    if columns.is_empty() {
        return Err(refuse(
            "the table does not exist (or this connection's user cannot see it)".to_owned(),
            create.to_owned(),
        ));
    }
    let column = |name: &str| columns.iter().find(|c| c.name == name);
    for name in ["name", "holder", "expires_at"] {
        if column(name).is_none() {
            return Err(refuse(
                format!(
                    "it has no column {name}; a lease table has the columns name, holder, \
                     expires_at and fence"
                ),
                "give the backend a lease table (with_table names another one)".to_owned(),
            ));
        }
    }
    let Some(fence) = column("fence") else {
        return Err(refuse(
            "it has no column fence, which holds the fencing counter of each lease name \
             (a table made for the Go services has only name, holder and expires_at)"
                .to_owned(),
            format!("add it with `{add_fence}`"),
        ));
    };
    if !integers.contains(&fence.kind.as_str()) || fence.nullable {
        return Err(refuse(
            format!(
                "its column fence is {}{}; it must be an integer column that is NOT NULL",
                fence.kind,
                if fence.nullable { " NULL" } else { "" },
            ),
            "make it BIGINT NOT NULL DEFAULT 0".to_owned(),
        ));
    }
    if !column("name").is_some_and(|c| c.unique) {
        return Err(refuse(
            "its column name is not unique on its own (the primary key): two rows of one \
             lease name would be two leases"
                .to_owned(),
            format!("make name the primary key: ALTER TABLE {table} ADD PRIMARY KEY (name)"),
        ));
    }
    Ok(Shape {
        expires_at: column("expires_at").expect("checked above"),
        shared: fence.has_default,
    })
}

/// The step between two values of a time column of `precision` fractional
/// digits, in microseconds (1 for 6 digits, 1,000,000 for none).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn step_us(precision: Option<u32>) -> u32 {
    10u32.pow(6 - precision.unwrap_or(6).min(6))
}

/// [`validate::call`], with the ttl as the `i64` milliseconds SQL binds.
fn check(name: &str, holder: &str, ttl: Duration) -> Result<i64, Error> {
    validate::call(name, holder, ttl).map(i64::from)
}

/// `r`, with the reason a connection could not be opened when sqlx hides it.
///
/// A pool retries a refused connection until its `acquire_timeout` and then
/// reports only `PoolTimedOut`. When that happens, one connection attempt
/// (bounded by `CONNECT_TIMEOUT`) finds out why, and its error is returned
/// instead: the log then reads "connection refused", "password
/// authentication failed", ... If the attempt succeeds (the pool was merely
/// exhausted), `PoolTimedOut` stands. This costs nothing on the paths that
/// work. (Whether the pool still counts an abandoned connection attempt as
/// open is a race, so the pool's size is not consulted.)
pub(crate) async fn explain<T, DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    r: Result<T, sqlx::Error>,
) -> Result<T, Error> {
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    match r {
        Err(sqlx::Error::PoolTimedOut) if !pool.is_closed() => {
            use sqlx::ConnectOptions;
            let options = pool.connect_options();
            match tokio::time::timeout(CONNECT_TIMEOUT, options.connect()).await {
                Ok(Err(why)) => Err(Error::Database(why)),
                Ok(Ok(conn)) => {
                    // It works now: the pool will find that too.
                    let _ = sqlx::Connection::close(conn).await;
                    Err(Error::Database(sqlx::Error::PoolTimedOut))
                }
                Err(_) => Err(Error::Database(sqlx::Error::PoolTimedOut)),
            }
        }
        r => Ok(r?),
    }
}

/// A fencing token as bound to the `fence` column. `None` (no grant of a
/// table backend has none) and tokens beyond `i64` (no table hands them out)
/// bind NULL, which matches no row.
pub(crate) fn fence_param(fencing_token: Option<u64>) -> Option<i64> {
    fencing_token.and_then(|t| i64::try_from(t).ok())
}

/// Which of `leases` a batched renewal renewed, from the `(name, fence)`
/// pairs of the rows it returned (PostgreSQL, SQLite).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn renewed_of(leases: &[Renewal<'_>], returned: &[(String, i64)]) -> Vec<bool> {
    let returned: std::collections::HashSet<(&str, i64)> =
        returned.iter().map(|(n, f)| (n.as_str(), *f)).collect();
    leases
        .iter()
        .map(|l| l.fence.is_some_and(|f| returned.contains(&(l.name, f))))
        .collect()
}

/// A fencing token read back from the `fence` column.
pub(crate) fn fence_token(fence: i64) -> Result<u64, Error> {
    match u64::try_from(fence) {
        Ok(fence) if fence > 0 => Ok(fence),
        _ => Err(Error::Protocol(format!(
            "the fence column holds {fence}; fencing tokens start at 1 and only grow"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Templates = Templates {
        create: "CREATE {table}",
        add_fence: "ADD {table}",
        acquire: "ACQUIRE {table} {table} {now}",
        renew: "RENEW {table} {cutoff}",
        release: "RELEASE {table}",
        renew_many: "MANY {table} IN ({list})",
        renewed_many: "",
        list_item: "(?, ?)",
        info: "INFO {table} {now}",
        list: "LIST {table} {now}",
        force_release: "FORCE {table} {cutoff}",
    };

    fn layout() -> Layout {
        Layout(vec![
            ("{cutoff}", "CUT({now})".to_owned()),
            ("{now}", "NOW".to_owned()),
        ])
    }

    #[test]
    fn batch_statements_are_built_per_list_size() {
        let s = Statements::new(&T, "t", &layout());
        assert_eq!(s.renew_many.len(), LIST_SIZES.len());
        assert_eq!(&*s.renew_many[0], "MANY t IN ((?, ?))");
        assert_eq!(&*s.renew_many[1], "MANY t IN ((?, ?), (?, ?))");
        assert_eq!(s.renew_many[10].matches("(?, ?)").count(), RENEW_MANY_CHUNK);
        assert!(s.renewed_many.is_empty());
        let arrays = Templates {
            list_item: "",
            renew_many: "MANY {table} $1",
            ..T
        };
        let s = Statements::new(&arrays, "t", &layout());
        assert_eq!(s.renew_many.len(), 1);
        assert_eq!(&*s.renew_many[0], "MANY t $1");
    }

    #[test]
    #[cfg(any(feature = "mysql", feature = "sqlite"))]
    fn batches_are_padded_to_the_next_list_size() {
        assert_eq!(list_size(1), 0);
        assert_eq!(list_size(3), 2);
        assert_eq!(list_size(512), 9);
        assert_eq!(list_size(513), 10);
        assert_eq!(list_size(RENEW_MANY_CHUNK), 10);
    }

    #[test]
    fn statements_are_filled_with_the_table_and_the_layout_in_order() {
        let s = Statements::new(&T, "my_schema.leases", &layout());
        assert_eq!(&*s.acquire, "ACQUIRE my_schema.leases my_schema.leases NOW");
        assert_eq!(&*s.renew, "RENEW my_schema.leases CUT(NOW)");
        assert_eq!(&*s.release, "RELEASE my_schema.leases");
        assert_eq!(
            &*fill(T.add_fence, "my_schema.leases", &Layout::NONE),
            "ADD my_schema.leases"
        );
    }

    /// The public `SCHEMA` of each dialect is the DDL `ensure_schema` runs
    /// on the default table, as a file (`;` and a newline). That it is also
    /// the file in `migrations/` is checked by `tests/tests/migrations.rs`
    /// (lease-tests): this crate's package holds no file outside it.
    #[test]
    fn schema_constants_are_the_default_ddl() {
        fn check<D: Dialect>(schema: &str) {
            let ddl = fill(D::TEMPLATES.create, DEFAULT_TABLE, &Layout::NONE);
            assert_eq!(schema, format!("{ddl};\n"));
        }
        #[cfg(feature = "postgres")]
        check::<PgDialect>(PgTable::SCHEMA);
        #[cfg(feature = "mysql")]
        check::<MySqlDialect>(MySqlTable::SCHEMA);
        #[cfg(feature = "sqlite")]
        check::<SqliteDialect>(SqliteTable::SCHEMA);
    }

    /// Every placeholder of every dialect is filled by its default layout
    /// (`fill` asserts it in debug builds).
    #[test]
    fn default_layouts_fill_every_placeholder() {
        fn check<D: Dialect>() {
            let s = Statements::new(&D::TEMPLATES, DEFAULT_TABLE, &D::default_layout());
            for sql in [
                &s.acquire,
                &s.renew,
                &s.release,
                &s.info,
                &s.list,
                &s.force_release,
            ]
            .into_iter()
            .chain(s.renew_many.iter())
            .chain(s.renewed_many.iter())
            {
                assert!(!sql.contains('{'), "{sql}");
            }
        }
        #[cfg(feature = "postgres")]
        check::<PgDialect>();
        #[cfg(feature = "mysql")]
        check::<MySqlDialect>();
        #[cfg(feature = "sqlite")]
        check::<SqliteDialect>();
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    mod shapes {
        use super::super::*;

        fn column(name: &str, kind: &str) -> Column {
            Column {
                name: name.to_owned(),
                kind: kind.to_owned(),
                unique: name == "name",
                ..Column::default()
            }
        }

        fn go_table() -> Vec<Column> {
            vec![
                column("name", "text"),
                column("holder", "text"),
                Column {
                    precision: Some(6),
                    ..column("expires_at", "timestamptz")
                },
            ]
        }

        fn check(columns: &[Column]) -> Result<Shape<'_>, Error> {
            shape("t", columns, &["int8"], "ADD FENCE", "CREATE")
        }

        fn problem(columns: &[Column]) -> (String, String) {
            match check(columns) {
                Err(Error::Schema {
                    table,
                    problem,
                    fix,
                }) => {
                    assert_eq!(table, "t");
                    (problem, fix)
                }
                other => panic!("{other:?}"),
            }
        }

        #[test]
        fn a_missing_fence_is_named_with_the_statement_that_adds_it() {
            let (problem, fix) = problem(&go_table());
            assert!(problem.contains("no column fence"), "{problem}");
            assert!(fix.contains("ADD FENCE"), "{fix}");
            let error = check(&go_table()).expect_err("no fence").to_string();
            assert!(
                error.starts_with("lease table t cannot be used: it has no column fence"),
                "{error}"
            );
            assert!(error.contains("ADD FENCE"), "{error}");
        }

        #[test]
        fn a_table_with_a_fence_fits_and_its_default_says_it_is_shared() {
            let mut columns = go_table();
            columns.push(column("fence", "int8"));
            let shape = check(&columns).expect("fits");
            assert_eq!(shape.expires_at.kind, "timestamptz");
            assert!(!shape.shared);
            columns[3].has_default = true;
            assert!(check(&columns).expect("fits").shared);
        }

        #[test]
        fn unusable_tables_are_refused() {
            assert!(problem(&[]).0.contains("does not exist"));
            assert_eq!(problem(&[]).1, "CREATE");
            let mut columns = go_table();
            columns.push(column("fence", "int8"));
            columns.remove(1);
            assert!(problem(&columns).0.contains("no column holder"));

            let mut columns = go_table();
            columns.push(Column {
                nullable: true,
                ..column("fence", "int8")
            });
            assert!(problem(&columns).0.contains("NOT NULL"));
            columns[3] = column("fence", "text");
            assert!(problem(&columns).0.contains("fence is text"));

            let mut columns = go_table();
            columns.push(column("fence", "int8"));
            columns[0].unique = false;
            assert!(problem(&columns).0.contains("not unique"));
        }

        #[test]
        fn steps_follow_the_precision() {
            assert_eq!(step_us(None), 1);
            assert_eq!(step_us(Some(6)), 1);
            assert_eq!(step_us(Some(3)), 1_000);
            assert_eq!(step_us(Some(0)), 1_000_000);
        }
    }

    #[test]
    fn fences_must_be_positive() {
        assert_eq!(fence_token(1).ok(), Some(1));
        assert_eq!(fence_token(i64::MAX).ok(), Some(i64::MAX as u64));
        assert!(matches!(fence_token(0), Err(Error::Protocol(_))));
        assert!(matches!(fence_token(-1), Err(Error::Protocol(_))));
        assert_eq!(fence_param(Some(u64::MAX)), None);
        assert_eq!(fence_param(Some(7)), Some(7));
    }
}
