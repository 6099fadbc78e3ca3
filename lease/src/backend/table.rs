//! The table backends' shared core: [`Table`], generic over its SQL
//! [`Dialect`] (PostgreSQL, MySQL/MariaDB, SQLite).
//!
//! A dialect's file (`table/pg.rs`, `table/mysql.rs`, `table/sqlite.rs`)
//! holds its statements, the reasons for them, and the lines that bind and
//! run them; the rest is here, once. See `docs/ARCHITECTURE.md`.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::{Acquired, MAX_BATCH, Request};
use crate::{Acquisition, Backend, Error, Grant, LeaseInfo, Result, validate};

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod pg;
#[cfg(feature = "sqlite")]
mod sqlite;

mod catalog;
mod statements;

use catalog::{Column, refused, shape};
#[cfg(any(feature = "postgres", feature = "mysql"))]
use catalog::{Shape, step_us, zoneless_in_shared};
#[cfg(feature = "mysql")]
pub use mysql::{MySqlDialect, MySqlTable};
#[cfg(feature = "postgres")]
pub use pg::{PgDialect, PgTable};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteDialect, SqliteTable};
use statements::{Checked, Layout, OptionalColumns, Statements, Templates};
#[cfg(any(feature = "mysql", feature = "sqlite"))]
use statements::{LIST_SIZES, list_size};

/// Leases in a SQL table, one row per lease name — the implementation behind
/// [`PgTable`](crate::backend::PgTable), [`MySqlTable`](crate::backend::MySqlTable)
/// and [`SqliteTable`](crate::backend::SqliteTable); see each of them for its
/// columns, clock and waiting.
///
/// What every table backend guarantees:
///
/// - **The server's clock decides expiry** (for SQLite the host's, read
///   inside SQL), never the caller's.
/// - **Fencing.** The fencing token is the row's `fence`: 1 for the first
///   acquisition of a name, one more for each later one, unchanged when the
///   holder re-acquires its own live lease. Renew and release match name,
///   holder and fence ([`Acquisition`]): a late request never touches a
///   newer acquisition. Release expires the row and never deletes it, so
///   the fence never restarts. (The Go services' release deletes the row:
///   the counter then starts again at 1.)
/// - **One statement per call**, in autocommit; [`Backend::renew_many`]
///   sends one per holder and 1,000 leases. Names and holders are always
///   bind parameters.
/// - **The table is checked at the first call** (once per backend value
///   and its clones). It needs `name` (unique on its own: the primary
///   key), `holder`, `expires_at` and `fence` (an integer, NOT NULL), and
///   an `expires_at` that every user of the table reads alike (see each
///   backend). Otherwise that call, and every later one until the table is
///   fixed, fails with [`Error::Schema`], which names the table, the column
///   and the statement that fixes it (for a table made for the Go services,
///   [`fence_migration`](Table::fence_migration)).
/// - **`last_slot` and `value`**, nullable, hold the last schedule slot
///   claimed ([`Job::once_per`](crate::Job::once_per)) and the value its
///   holder published ([`Election::proclaim`](crate::Election::proclaim)).
///   A table without them (made before 0.1, or for the Go services) serves
///   plain leases. An acquisition with a slot or a value, and
///   [`Backend::publish`], fail with [`Error::Schema`] naming the `ALTER
///   TABLE` that adds them (`migrations/<database>/` has it). Each such call
///   looks at the table again, so adding them needs no restart.
/// - **[`Backend::force_release`]** empties `holder` and keeps `expires_at`
///   and `fence` (the lock delay); [`Backend::force_release_now`] expires
///   the row at once.
/// - **Guarded writes**: [`LeaseGuard::check_in`](crate::LeaseGuard::check_in)
///   in a transaction of the lease's own database.
/// - **A `fence` column with a default** marks a table *shared* with
///   services that insert rows without a fence (the Go services during a
///   migration). Their rows get the fence 0, which the next acquisition
///   here makes 1 or more.
/// - A call dropped after its statement reached the server may still take
///   effect: an acquisition the caller never learned of ends at its ttl, or
///   is picked up by the same holder's next acquire.
///
/// **The pool.** Renewals take connections from the backend's pool: a job
/// that holds all of them loses its lease at its deadline. Give the pool a
/// connection more than the job uses (one more for `PgTable`'s listener
/// while a waiter waits), and an `acquire_timeout` shorter than the ttl (so
/// that the backend, not the engine's time limit, reports why a connection
/// failed). With `test_before_acquire(false)` a renewal is one round trip.
/// Cloning a backend is cheap.
pub struct Table<D: Dialect> {
    pool: sqlx::Pool<D::Database>,
    table: Arc<str>,
    /// [`schema`](Table::schema) and [`fence_migration`](Table::fence_migration).
    create: Arc<str>,
    add_fence: Arc<str>,
    /// The statements, once the table was checked; shared by clones.
    sql: Arc<Checked>,
    /// PostgreSQL's listener for waiters, started by the first one.
    push: Arc<std::sync::OnceLock<TablePush>>,
}

#[cfg(feature = "postgres")]
type TablePush = crate::backend::push::Push<crate::backend::push::pg::PgSource>;
#[cfg(not(feature = "postgres"))]
type TablePush = ();

// Not derived: that would ask for `D::Database: Clone`.
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
            .field("checked", &self.sql.current().is_some())
            .field("pool", &self.pool)
            .finish()
    }
}

/// The SQL dialect of a [`Table`]: PostgreSQL ([`PgDialect`]), MySQL/MariaDB
/// ([`MySqlDialect`]) or SQLite ([`SqliteDialect`]). Sealed: implemented by
/// this crate only.
pub trait Dialect: sealed::SqlDialect {}

/// What a dialect gives the core (a private module: its items may use the
/// crate's own types).
#[allow(unreachable_pub, private_interfaces, private_bounds)]
mod sealed {
    use std::future::Future;
    use std::time::Duration;

    use super::{
        Dialect, Layout, Ready, RowChange, Table, TableAnswer, TableRenewal, TableRequest,
        Templates,
    };
    use crate::{Error, LeaseInfo};

    pub trait SqlDialect: Sized + Send + Sync + 'static {
        type Database: sqlx::Database;
        /// The backend's type name, for `Debug`.
        const NAME: &'static str;
        /// The statement that creates `task_leases` ([`Table::SCHEMA`]).
        const SCHEMA: &'static str;
        /// The migration that adds `fence` to the Go services' `task_leases`.
        const ADD_FENCE: &'static str;
        /// The statements that add `last_slot` and `value` to an older
        /// `task_leases` (together, `migrations/<database>/000N_add_last_slot_and_value.sql`).
        const ADD_LAST_SLOT: &'static str;
        const ADD_VALUE: &'static str;
        const TEMPLATES: Templates;
        /// A batched renewal takes leases of one ttl only (MySQL).
        const ONE_TTL_PER_BATCH: bool = false;

        /// Check the table before its first statement: the SQL for the
        /// placeholders of its statements, or [`Error::Schema`].
        fn inspect(t: &Table<Self>) -> impl Future<Output = Result<Layout, Error>> + Send
        where
            Self: Dialect;
        /// Create the table if it does not exist.
        fn create(t: &Table<Self>) -> impl Future<Output = Result<(), sqlx::Error>> + Send
        where
            Self: Dialect;
        /// The fence of the grant, or `None`: another holder has a live lease.
        fn acquire(
            t: &Ready<'_, Self>,
            name: &str,
            holder: &str,
            ttl_ms: i64,
        ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send;
        /// An acquisition with a slot or a value (the `acquire_with` template).
        fn acquire_with(
            t: &Ready<'_, Self>,
            claim: &TableRequest<'_>,
        ) -> impl Future<Output = Result<TableAnswer, sqlx::Error>> + Send;
        /// Renew `leases` of `holder` (at most `MAX_BATCH`, of one ttl if
        /// `ONE_TTL_PER_BATCH`) in one statement; which were renewed.
        fn renew_batch(
            t: &Ready<'_, Self>,
            holder: &str,
            leases: &[TableRenewal<'_>],
        ) -> impl Future<Output = Result<Vec<bool>, sqlx::Error>> + Send;
        /// One statement that changes the row of `name`; whether it did.
        fn change(
            t: &Ready<'_, Self>,
            name: &str,
            change: RowChange<'_>,
        ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;
        /// The row of `name` (inspect), or every row by name (`None`: list).
        fn rows(
            t: &Ready<'_, Self>,
            name: Option<&str>,
        ) -> impl Future<Output = Result<Vec<LeaseInfo>, sqlx::Error>> + Send;
        /// The database the backend's connections use, when its options
        /// name it: [`LeaseGuard::check_in`](crate::LeaseGuard::check_in)
        /// refuses a connection to another one.
        fn database(t: &Table<Self>) -> Option<String>
        where
            Self: Dialect,
        {
            let _ = t;
            None
        }
        /// The server rolled the statement back, and it may be run again.
        fn is_transient(e: &sqlx::Error) -> bool {
            let _ = e;
            false
        }
        /// [`Backend::released`](crate::Backend::released): a poll, unless
        /// the server pushes releases.
        fn released(
            t: &Table<Self>,
            name: &str,
            poll: Duration,
        ) -> impl Future<Output = ()> + Send + 'static
        where
            Self: Dialect,
        {
            let _ = (t, name);
            tokio::time::sleep(poll)
        }
    }

    /// A connection [`check_in`](crate::LeaseGuard::check_in) runs its
    /// statement on, and the dialect of the tables it can check.
    pub trait CheckInConnection: Send {
        type Dialect: Dialect;
        /// Run `sql` (the `check_in` template) on this connection for the
        /// acquisition `(name, holder, fence)`: `Some(database)` if it holds
        /// the lease, now locked until the transaction ends.
        fn check_in(
            &mut self,
            sql: &str,
            name: &str,
            holder: &str,
            fence: Option<i64>,
        ) -> impl Future<Output = Result<Option<String>, sqlx::Error>> + Send;
    }
}

/// A connection on which a lease's holder can check in, in the caller's
/// transaction ([`LeaseGuard::check_in`](crate::LeaseGuard::check_in),
/// [`Term::check_in`](crate::Term::check_in)): `sqlx::PgConnection`
/// (feature `postgres`), `sqlx::MySqlConnection` (`mysql`) and
/// `sqlx::SqliteConnection` (`sqlite`) — what a sqlx `Transaction` derefs
/// to. Sealed: implemented by this crate only.
pub trait CheckIn: sealed::CheckInConnection {}

/// The acquisition of [`Backend::acquire_with`], as bound.
#[derive(Debug, Clone, Copy)]
struct TableRequest<'a> {
    name: &'a str,
    holder: &'a str,
    ttl_ms: i64,
    /// The slot's period in milliseconds, `None` without `once_per`.
    period_ms: Option<i64>,
    /// `once_per` with `retry_failed`: the slot is not recorded now.
    retry_failed: bool,
    value: Option<&'a str>,
}

/// What an `acquire_with` statement read and did.
#[derive(Debug, Clone, Copy, Default)]
struct TableAnswer {
    /// The fence of the grant; `None`: refused.
    fence: Option<i64>,
    /// The slot of the request, by the server's clock.
    slot: Option<i64>,
    /// The slot recorded for the name before the request.
    last_slot: Option<i64>,
    /// Microseconds left of another holder's lease (positive: live).
    others_left_us: Option<i64>,
}

impl TableAnswer {
    fn ran(&self) -> bool {
        matches!((self.slot, self.last_slot), (Some(slot), Some(last)) if slot <= last)
    }

    fn acquired(self) -> Result<Acquired, Error> {
        let slot = |s: i64| s.max(0).unsigned_abs();
        Ok(match (self.fence, self.slot) {
            (Some(fence), at) => {
                let grant = Grant::new(Some(fence_token(fence)?));
                Acquired::Granted(match at {
                    Some(at) => grant.with_slot(slot(at), self.last_slot.map(slot)),
                    None => grant,
                })
            }
            (None, Some(at)) if self.ran() => Acquired::AlreadyRan { slot: slot(at) },
            (None, _) => Acquired::HeldElsewhere {
                expires_in: self.others_left_us.and_then(left),
            },
        })
    }
}

/// The `acquire_with` script of MySQL or SQLite with the request's values
/// written in, since a script of several statements cannot take bound
/// parameters: `:name`, `:holder` and `:value` as `text` makes a literal of
/// their bytes (of hex digits: nothing in them can end the literal or
/// start a placeholder), `:ttl`, `:period`, `:slot` and `:retry` as
/// numbers (a missing period, slot or value as `NULL`).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn script(
    template: &str,
    c: &TableRequest<'_>,
    slot: Option<i64>,
    text: impl Fn(&[u8]) -> String,
) -> String {
    let number = |n: Option<i64>| n.map_or_else(|| "NULL".to_owned(), |n| n.to_string());
    let value = c
        .value
        .map_or_else(|| "NULL".to_owned(), |v| text(v.as_bytes()));
    template
        .replace(":name", &text(c.name.as_bytes()))
        .replace(":holder", &text(c.holder.as_bytes()))
        .replace(":value", &value)
        .replace(":ttl", &c.ttl_ms.to_string())
        .replace(":period", &number(c.period_ms))
        .replace(":slot", &number(slot))
        .replace(":retry", if c.retry_failed { "1" } else { "0" })
}

/// `bytes` as hex digits.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A change of one row, each one statement of the dialect.
#[derive(Debug, Clone, Copy)]
enum RowChange<'a> {
    /// Expire the live row of the acquisition `(holder, fence)`.
    Release(&'a str, Option<i64>),
    /// Release, and record the slot (never lowering it) in any case.
    ReleaseRan(&'a str, Option<i64>, i64),
    /// Set the value of the live row of the acquisition.
    Publish(&'a str, Option<i64>, Option<&'a str>),
    /// Empty the holder of the live row, keeping its expiry (the lock delay).
    Evict,
    /// Expire the live row, whoever holds it.
    EvictNow,
}

/// A checked table's pool and statements: what the calls need.
struct Ready<'a, D: sealed::SqlDialect> {
    pool: &'a sqlx::Pool<D::Database>,
    sql: Arc<Statements>,
}

/// One lease of a renewal, as bound: name, ttl in milliseconds, fence.
#[derive(Debug, Clone, Copy)]
struct TableRenewal<'a> {
    name: &'a str,
    ttl_ms: i64,
    fence: Option<i64>,
}

/// The table used by `new(pool)`.
const DEFAULT_TABLE: &str = "task_leases";

/// `migration` (a file's text, on `task_leases`) as a statement on `table`.
fn migration_for(migration: &str, table: &str) -> Arc<str> {
    let statement = migration.strip_suffix(";\n").expect("BUG: not a migration");
    let default = format!(" {DEFAULT_TABLE} ");
    debug_assert_eq!(statement.matches(&default).count(), 1, "{statement}");
    statement
        .replacen(&default, &format!(" {table} "), 1)
        .into()
}

impl<D: Dialect> Table<D> {
    /// The DDL of the default table, `task_leases`: the `CREATE TABLE IF NOT
    /// EXISTS` that [`ensure_schema`](Table::ensure_schema) runs, then `;`
    /// and a newline. It makes the table that the files in
    /// `migrations/<database>/` make together: `0001_task_leases.sql`, and
    /// `000N_add_last_slot_and_value.sql` for a table made before. Add it to
    /// your own migrations when the application's database user may not
    /// create tables; for another table, use [`schema`](Table::schema).
    ///
    /// # Examples
    ///
    /// ```
    /// use leasehold::backend::PgTable;
    ///
    /// assert!(PgTable::SCHEMA.starts_with("CREATE TABLE IF NOT EXISTS task_leases ("));
    /// # async fn f(pool: sqlx::PgPool) -> Result<(), sqlx::Error> {
    /// sqlx::raw_sql(PgTable::SCHEMA).execute(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub const SCHEMA: &'static str = D::SCHEMA;

    /// A backend on the table `task_leases` of `pool`'s database.
    ///
    /// Nothing is sent to the server until the first call; create the table
    /// with [`ensure_schema`](Self::ensure_schema) or a migration.
    pub fn new(pool: sqlx::Pool<D::Database>) -> Self {
        Self::on(pool, DEFAULT_TABLE).expect("BUG: the default table name is valid")
    }

    fn on(pool: sqlx::Pool<D::Database>, table: &str) -> Result<Self, Error> {
        validate::table(table)?;
        Ok(Self {
            pool,
            table: table.into(),
            create: migration_for(D::SCHEMA, table),
            add_fence: migration_for(D::ADD_FENCE, table),
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
    /// # Errors
    ///
    /// [`Error::InvalidTable`] when `table` is not such a name.
    pub fn with_table(self, table: &str) -> Result<Self, Error> {
        Self::on(self.pool, table)
    }

    /// Creates the table if it does not exist, with [`schema`](Self::schema).
    ///
    /// Idempotent, and safe to call from many connections or processes at
    /// once. It never alters an existing table, and never touches sqlx's
    /// `_sqlx_migrations` table.
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the server cannot be reached or refuses the
    /// statement (for example a missing schema or privilege).
    pub async fn ensure_schema(&self) -> Result<(), Error> {
        explain(&self.pool, D::create(self).await).await
    }

    /// The pool this backend runs its statements on; use it for your own
    /// queries, for example to see who holds what.
    pub fn pool(&self) -> &sqlx::Pool<D::Database> {
        &self.pool
    }

    /// The statement that creates this backend's table, as
    /// [`ensure_schema`](Self::ensure_schema) runs it: the backend's `SCHEMA`
    /// on this table, without its closing `;` and newline.
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
    /// table: `ALTER TABLE {table} ADD COLUMN .. fence BIGINT NOT NULL DEFAULT 0`
    /// (for `task_leases`, the file `migrations/from-go/<database>/0001_add_fence.sql`).
    ///
    /// The default marks the table as shared (see [`Table`], and "Migrating
    /// from the Go packages" in the README). The backend never alters a
    /// table itself.
    pub fn fence_migration(&self) -> &str {
        &self.add_fence
    }

    /// The pool and the statements, built once the dialect has checked the
    /// table; a call that fails to check it leaves it to the next.
    async fn ready(&self) -> Result<Ready<'_, D>, Error> {
        self.ready_for(OptionalColumns::default()).await
    }

    /// [`ready`](Self::ready), for a call that `needs` optional columns: if
    /// the table lacked one, it is checked again (an operator may have
    /// added it since), and if it still lacks it the call fails with
    /// [`Error::Schema`] naming the `ALTER TABLE` that adds it.
    async fn ready_for(&self, needs: OptionalColumns) -> Result<Ready<'_, D>, Error> {
        let seen = self.sql.current();
        let sql = match seen {
            Some(sql) if sql.columns.has(needs) => sql,
            seen => {
                let _one = self.sql.checking.lock().await;
                match self.sql.current() {
                    // Checked by another call while this one waited.
                    Some(sql) if seen.as_ref().is_none_or(|s| !Arc::ptr_eq(s, &sql)) => sql,
                    _ => {
                        let layout = D::inspect(self).await?;
                        let sql = Arc::new(Statements::new(&D::TEMPLATES, &self.table, &layout));
                        let statements = self.sql.statements.write();
                        *statements.unwrap_or_else(|e| e.into_inner()) = Some(sql.clone());
                        sql
                    }
                }
            }
        };
        if !sql.columns.has(needs) {
            return Err(self.lacks(needs, sql.columns));
        }
        Ok(Ready {
            pool: &self.pool,
            sql,
        })
    }

    /// [`Error::Schema`]: the table has not the optional columns a call `needs`.
    fn lacks(&self, needs: OptionalColumns, has: OptionalColumns) -> Error {
        let missing = [
            (
                needs.last_slot && !has.last_slot,
                "last_slot",
                D::ADD_LAST_SLOT,
            ),
            (needs.value && !has.value, "value", D::ADD_VALUE),
        ];
        let (columns, fixes): (Vec<&str>, Vec<String>) = (missing.iter())
            .filter(|(lacked, ..)| *lacked)
            .map(|&(_, column, add)| (column, format!("`{}`", migration_for(add, &self.table))))
            .unzip();
        let problem = format!(
            "it has no column {}: last_slot records the schedule slots runs claimed (once_per), \
             value what a holder publishes (an election's proclaim); an acquisition with either \
             needs both",
            columns.join(" and no column ")
        );
        refused(
            &self.table,
            &problem,
            &format!("run {}", fixes.join(" and ")),
        )
    }

    /// Runs one autocommit statement, again after a transient error, at
    /// most [`ATTEMPTS`] times in all.
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

/// How many times a statement is tried when the server reports a transient
/// error (an InnoDB deadlock or lock wait timeout).
const ATTEMPTS: u32 = 6;

impl<D: Dialect> Backend for Table<D> {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Option<Grant>> {
        let ttl_ms = check(name, holder, ttl)?;
        let t = self.ready().await?;
        let fence = self.run(|| D::acquire(&t, name, holder, ttl_ms)).await?;
        fence
            .map(|f| Ok(Grant::new(Some(fence_token(f)?))))
            .transpose()
    }

    /// The slot is by the server's clock (SQLite: the host's).
    /// [`Error::Schema`] on a table without `last_slot` and `value`.
    async fn acquire_with(&self, request: Request<'_>) -> Result<Acquired, Error> {
        let ttl_ms = i64::from(validate::request(&request)?);
        let Request {
            name,
            holder,
            ttl,
            once_per,
            value,
            ..
        } = request;
        if value.is_none() && once_per.is_none() {
            let grant = self.acquire(name, holder, ttl).await?;
            let held = Acquired::HeldElsewhere { expires_in: None };
            return Ok(grant.map_or(held, Acquired::Granted));
        }
        let claim = TableRequest {
            name,
            holder,
            ttl_ms,
            // At most 366 days in milliseconds.
            period_ms: once_per.map(|o| i64::try_from(o.period_ms()).unwrap_or(i64::MAX)),
            retry_failed: once_per.is_some_and(|o| o.retry_failed),
            value,
        };
        let t = self.ready_for(OptionalColumns::BOTH).await?;
        let answer = self.run(|| D::acquire_with(&t, &claim)).await?;
        answer.acquired()
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        let renewed = self.renew_many(&[(lease, ttl)]).await?;
        Ok(renewed == [true])
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let change = RowChange::Release(lease.holder, fence_param(lease.fencing_token));
        self.change(lease.name, change, OptionalColumns::default())
            .await
            .map(drop)
    }

    async fn release_ran(&self, lease: Acquisition<'_>, slot: u64) -> Result<(), Error> {
        validate::call_no_ttl(lease.name, lease.holder)?;
        let slot = i64::try_from(slot)
            .map_err(|_| Error::Protocol(format!("slot {slot} is beyond a BIGINT column")))?;
        let fence = fence_param(lease.fencing_token);
        let change = RowChange::ReleaseRan(lease.holder, fence, slot);
        self.change(lease.name, change, OptionalColumns::BOTH)
            .await
            .map(drop)
    }

    async fn publish(&self, lease: Acquisition<'_>, value: Option<&str>) -> Result<bool, Error> {
        validate::publish(&lease, value)?;
        let fence = fence_param(lease.fencing_token);
        let change = RowChange::Publish(lease.holder, fence, value);
        self.change(lease.name, change, OptionalColumns::VALUE)
            .await
    }

    /// `Ok(None)` without a row: never acquired here, or deleted by the Go
    /// services' release.
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        validate::name(name)?;
        let t = self.ready().await?;
        let rows = self.run(|| D::rows(&t, Some(name))).await?;
        Ok(rows.into_iter().next())
    }

    /// Every row, by name, released and expired ones too: a table keeps a
    /// row for every name ever acquired in it.
    async fn list(&self) -> Result<Vec<LeaseInfo>, Error> {
        let t = self.ready().await?;
        self.run(|| D::rows(&t, None)).await
    }

    async fn force_release(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        self.change(name, RowChange::Evict, OptionalColumns::default())
            .await
    }

    async fn force_release_now(&self, name: &str) -> Result<bool, Error> {
        validate::name(name)?;
        self.change(name, RowChange::EvictNow, OptionalColumns::default())
            .await
    }

    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        D::released(self, name, poll)
    }

    // The batches are sent one after the other.
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        let mut renewals = Vec::with_capacity(leases.len());
        for &(lease, ttl) in leases {
            renewals.push(TableRenewal {
                name: lease.name,
                ttl_ms: check(lease.name, lease.holder, ttl)?,
                fence: fence_param(lease.fencing_token),
            });
        }
        let t = self.ready().await?;
        // A batch is of one holder (and for MySQL one ttl): its statements bind them once.
        let key = |i: usize| {
            let ttl = if D::ONE_TTL_PER_BATCH {
                renewals[i].ttl_ms
            } else {
                0
            };
            (leases[i].0.holder, ttl)
        };
        let mut keys: Vec<(&str, i64)> = (0..leases.len()).map(key).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut out = vec![false; leases.len()];
        for k in keys {
            let group: Vec<usize> = (0..leases.len()).filter(|&i| key(i) == k).collect();
            for at in group.chunks(MAX_BATCH) {
                let batch: Vec<TableRenewal<'_>> = at.iter().map(|&i| renewals[i]).collect();
                let renewed = self.run(|| D::renew_batch(&t, k.0, &batch)).await?;
                for (&i, renewed) in at.iter().zip(renewed) {
                    out[i] = renewed;
                }
            }
        }
        Ok(out)
    }
}

impl<D: Dialect> Table<D> {
    /// Runs the statement of `change` on the row of `name`, with the
    /// optional columns it `needs`.
    async fn change(
        &self,
        name: &str,
        change: RowChange<'_>,
        needs: OptionalColumns,
    ) -> Result<bool, Error> {
        let t = self.ready_for(needs).await?;
        self.run(|| D::change(&t, name, change)).await
    }

    /// [`LeaseGuard::check_in`](crate::LeaseGuard::check_in) on `conn`.
    async fn check_in<C>(&self, conn: &mut C, lease: Acquisition<'_>) -> Result<(), Error>
    where
        C: sealed::CheckInConnection<Dialect = D>,
    {
        let t = self.ready().await?;
        let fence = fence_param(lease.fencing_token);
        let checked = conn.check_in(&t.sql.check_in, lease.name, lease.holder, fence);
        let elsewhere = |problem: String| {
            let fix = "check in on a connection to the lease table's database, as the \
                       backend's own pool() gives";
            refused(&self.table, &problem, fix)
        };
        match checked.await {
            Ok(Some(database)) => match D::database(self) {
                Some(ours) if ours != database => Err(elsewhere(format!(
                    "check_in's connection is to the database {database}, the backend's to {ours}"
                ))),
                _ => Ok(()),
            },
            Ok(None) => Err(Error::NotHeld {
                name: lease.name.to_owned(),
            }),
            Err(e) if no_such_table(&e) => Err(elsewhere(format!(
                "check_in's connection has no such table ({}): it is not a connection to the \
                 lease's database",
                Error::from(e).chain()
            ))),
            Err(e) => Err(e.into()),
        }
    }
}

/// [`LeaseGuard::check_in`](crate::LeaseGuard::check_in): `backend` must be
/// the table of `conn`'s kind ([`Table`] or `Arc<Table>`), else
/// [`Error::Unsupported`].
pub(crate) async fn check_in<C: CheckIn>(
    backend: &dyn crate::backend::DynBackend,
    conn: &mut C,
    lease: Acquisition<'_>,
) -> Result<(), Error> {
    let table = table_of::<C::Dialect>(backend).ok_or(Error::Unsupported {
        operation: "check_in on this kind of connection",
    })?;
    table.check_in(conn, lease).await
}

fn table_of<D: Dialect>(backend: &dyn crate::backend::DynBackend) -> Option<&Table<D>> {
    let any = backend.as_any();
    any.downcast_ref::<Table<D>>()
        .or_else(|| any.downcast_ref::<Arc<Table<D>>>().map(|t| &**t))
}

/// The server says the statement's table does not exist (PostgreSQL
/// 42P01, MySQL 42S02, SQLite "no such table").
fn no_such_table(e: &sqlx::Error) -> bool {
    e.as_database_error().is_some_and(|e| {
        matches!(e.code().as_deref(), Some("42P01" | "42S02"))
            || e.message().starts_with("no such table")
    })
}

/// [`validate::call`], with the ttl as the `i64` milliseconds SQL binds.
fn check(name: &str, holder: &str, ttl: Duration) -> Result<i64, Error> {
    validate::call(name, holder, ttl).map(i64::from)
}

/// `r`, with the reason a connection could not be opened when sqlx hides it:
/// after a pool's `PoolTimedOut`, one connection attempt's error
/// ("connection refused", ...), unless it succeeds (the pool was exhausted).
async fn explain<T, DB: sqlx::Database>(
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

/// A fencing token as bound to the `fence` column: NULL, which matches no
/// row, for `None` and tokens beyond `i64` (no table hands them out).
fn fence_param(fencing_token: Option<u64>) -> Option<i64> {
    fencing_token.and_then(|t| i64::try_from(t).ok())
}

/// A fencing token read back from the `fence` column.
fn fence_token(fence: i64) -> Result<u64, Error> {
    match u64::try_from(fence) {
        Ok(fence) if fence > 0 => Ok(fence),
        _ => Err(Error::Protocol(format!(
            "the fence column holds {fence}; fencing tokens start at 1 and only grow"
        ))),
    }
}

/// A row as `info` and `list` read it: name, holder, fence, microseconds
/// left (zero or less: expired or released), value, last slot.
type TableRow = (
    String,
    String,
    i64,
    Option<i64>,
    Option<String>,
    Option<i64>,
);

/// The [`LeaseInfo`] of a row. An empty holder is a forced release's
/// (no holder is empty), kept from everyone until it expires.
fn lease_info((name, holder, fence, left_us, value, slot): TableRow) -> LeaseInfo {
    let expires_in = left_us.and_then(left);
    let forced = holder.is_empty() && expires_in.is_some();
    // 0: a row the Go services inserted, which has no fence yet.
    let fence = u64::try_from(fence).ok().filter(|&f| f > 0);
    LeaseInfo::new(name, holder, expires_in, fence)
        .with_value(value.filter(|_| expires_in.is_some() && !forced))
        .with_slot(slot.and_then(|s| u64::try_from(s).ok()))
        .with_forced(forced)
}

/// Microseconds left as a duration, if positive.
fn left(us: i64) -> Option<Duration> {
    u64::try_from(us)
        .ok()
        .filter(|&us| us > 0)
        .map(Duration::from_micros)
}

/// Which of `leases` were renewed, by the `(name, fence)` of the rows a
/// batched renewal returned (PostgreSQL, SQLite).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn renewed_of(leases: &[TableRenewal<'_>], returned: &[(String, i64)]) -> Vec<bool> {
    let returned: std::collections::HashSet<(&str, i64)> =
        returned.iter().map(|(n, f)| (n.as_str(), *f)).collect();
    leases
        .iter()
        .map(|l| l.fence.is_some_and(|f| returned.contains(&(l.name, f))))
        .collect()
}

/// [`sealed::SqlDialect::change`] for the dialects whose names, holders
/// and values are text (PostgreSQL, SQLite): the statements take the name
/// first, then the change's own values. sqlx has no trait for a result's
/// rows affected, so each dialect passes its own accessor.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
async fn change_text<D: Dialect>(
    t: &Ready<'_, D>,
    name: &str,
    change: RowChange<'_>,
    rows_affected: fn(&<D::Database as sqlx::Database>::QueryResult) -> u64,
) -> Result<bool, sqlx::Error>
where
    for<'a> &'a str: sqlx::Encode<'a, D::Database> + sqlx::Type<D::Database>,
    for<'a> Option<&'a str>: sqlx::Encode<'a, D::Database> + sqlx::Type<D::Database>,
    for<'a> i64: sqlx::Encode<'a, D::Database> + sqlx::Type<D::Database>,
    for<'a> Option<i64>: sqlx::Encode<'a, D::Database> + sqlx::Type<D::Database>,
    for<'c> &'c sqlx::Pool<D::Database>: sqlx::Executor<'c, Database = D::Database>,
    <D::Database as sqlx::Database>::Arguments: sqlx::IntoArguments<D::Database>,
{
    let on = |sql: &Arc<str>| sqlx::query(sqlx::AssertSqlSafe(sql.clone())).bind(name);
    let query = match change {
        RowChange::Release(holder, fence) => on(&t.sql.release).bind(holder).bind(fence),
        RowChange::ReleaseRan(holder, fence, slot) => {
            on(&t.sql.release_ran).bind(holder).bind(fence).bind(slot)
        }
        RowChange::Publish(holder, fence, value) => {
            on(&t.sql.publish).bind(holder).bind(fence).bind(value)
        }
        RowChange::Evict => on(&t.sql.force_release),
        RowChange::EvictNow => on(&t.sql.force_release_now),
    };
    Ok(rows_affected(&query.execute(t.pool).await?) == 1)
}

/// [`sealed::SqlDialect::rows`] for the dialects whose rows read as a
/// [`TableRow`] (PostgreSQL, SQLite).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
async fn rows_text<D: Dialect>(
    t: &Ready<'_, D>,
    name: Option<&str>,
) -> Result<Vec<LeaseInfo>, sqlx::Error>
where
    for<'a> &'a str: sqlx::Encode<'a, D::Database> + sqlx::Type<D::Database>,
    TableRow: for<'r> sqlx::FromRow<'r, <D::Database as sqlx::Database>::Row>,
    for<'c> &'c sqlx::Pool<D::Database>: sqlx::Executor<'c, Database = D::Database>,
    <D::Database as sqlx::Database>::Arguments: sqlx::IntoArguments<D::Database>,
{
    let query = match name {
        Some(name) => sqlx::query_as(sqlx::AssertSqlSafe(t.sql.info.clone())).bind(name),
        None => sqlx::query_as(sqlx::AssertSqlSafe(t.sql.list.clone())),
    };
    let rows: Vec<TableRow> = query.fetch_all(t.pool).await?;
    Ok(rows.into_iter().map(lease_info).collect())
}

#[cfg(test)]
mod tests;
