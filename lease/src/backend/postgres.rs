//! Leases in a PostgreSQL table, with expiry decided by the server's clock.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool};

use super::sql::{self, Statements, Templates};
use crate::backend::by_holder;
use crate::{Acquisition, Backend, Error, Grant};

const TEMPLATES: Templates = Templates {
    create: "CREATE TABLE IF NOT EXISTS {table} (\n    \
             name TEXT PRIMARY KEY,\n    \
             holder TEXT NOT NULL,\n    \
             expires_at TIMESTAMPTZ NOT NULL,\n    \
             fence BIGINT NOT NULL\n)",
    // One statement: insert a new row, or take over an expired (or released)
    // row, or extend our own live row. The fence counts acquisitions; only
    // the idempotent re-acquire of our own live lease keeps it. When the row
    // is held by someone else the WHERE fails and nothing is returned.
    //
    // The NOT EXISTS is a plain read that answers "held elsewhere" without
    // touching the row: ON CONFLICT DO UPDATE locks the conflicting row
    // before it evaluates its WHERE, and a row lock costs a transaction id,
    // a WAL record and a WAL flush at commit — for every contender that
    // finds the lease held, while the holder's release queues behind them.
    // The locked WHERE below still decides when the read saw a free row.
    acquire: "INSERT INTO {table} AS l (name, holder, expires_at, fence) \
              SELECT $1, $2, clock_timestamp() + $3 * interval '1 millisecond', 1 \
              WHERE NOT EXISTS (SELECT 1 FROM {table} \
              WHERE name = $1 AND holder <> $2 AND expires_at > clock_timestamp()) \
              ON CONFLICT (name) DO UPDATE SET \
              holder = EXCLUDED.holder, \
              expires_at = EXCLUDED.expires_at, \
              fence = CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > clock_timestamp() \
              THEN l.fence ELSE l.fence + 1 END \
              WHERE l.expires_at <= clock_timestamp() OR l.holder = EXCLUDED.holder \
              RETURNING fence",
    // Renew and release match the acquisition: name, holder and fence.
    renew: "UPDATE {table} \
            SET expires_at = clock_timestamp() + $3 * interval '1 millisecond' \
            WHERE name = $1 AND holder = $2 AND fence = $4 AND expires_at > clock_timestamp()",
    // A released row expires at the epoch, not at "now": it is then expired
    // for every statement, whatever instant that statement takes as its
    // "now" (MySQL's is the statement's start, which may precede the
    // release when the statement waited for the release's row lock).
    release: "UPDATE {table} SET expires_at = TIMESTAMPTZ 'epoch' \
              WHERE name = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp()",
    // Many renewals in one statement: the names, ttls and fences as three
    // arrays; the (name, fence) of the rows renewed come back.
    renew_many: "UPDATE {table} AS l \
                 SET expires_at = clock_timestamp() + b.ttl * interval '1 millisecond' \
                 FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS b(name, ttl, fence) \
                 WHERE l.name = b.name AND l.fence = b.fence AND l.holder = $4 \
                 AND l.expires_at > clock_timestamp() \
                 RETURNING l.name, l.fence",
    renewed_many: "",
    list_item: "",
};

/// The advisory lock that serialises [`PgTable::ensure_schema`] across
/// connections: concurrent `CREATE TABLE IF NOT EXISTS` of one table can fail
/// on PostgreSQL with a unique violation in `pg_type`.
///
/// It lives in the two-`int4` key space, which PostgreSQL keeps apart from
/// the single-`bigint` key space used by sqlx's `PgAdvisoryLock` (and so by
/// lease names in `PgAdvisory`): the two can never collide. `0x6c656173` is
/// `"leas"` in ASCII.
const SCHEMA_LOCK: (i32, i32) = (0x6c65_6173, 1);

/// Leases stored in a PostgreSQL table, one row per lease name; the server's
/// clock decides expiry, and every acquisition gets a fencing token.
///
/// The table (by default `task_leases`, see [`with_table`](Self::with_table))
/// has the columns
///
/// | column | type | meaning |
/// |---|---|---|
/// | `name` | `TEXT PRIMARY KEY` | the lease name, compared byte for byte |
/// | `holder` | `TEXT NOT NULL` | who holds (or last held) the lease |
/// | `expires_at` | `TIMESTAMPTZ NOT NULL` | when the lease ends |
/// | `fence` | `BIGINT NOT NULL` | the fencing counter of the name |
///
/// Create it with [`ensure_schema`](Self::ensure_schema), or with your own
/// migration tool from `migrations/postgres/0001_task_leases.sql`.
///
/// Guarantees:
///
/// - **Clock.** Expiry is computed by the server with `clock_timestamp()`
///   (the wall clock at the moment the statement runs, not `now()`, which is
///   frozen at the start of the transaction). The clocks of the replicas do
///   not matter.
/// - **What ends a lease.** Its ttl running out without a renewal, or a
///   release by its holder. A lease is live while `expires_at > clock_timestamp()`.
/// - **Fencing.** Each acquisition returns the row's `fence`: 1 for the first
///   acquisition of a name, one more for each later one, unchanged when the
///   holder re-acquires its own live lease. Pass it to the systems the job
///   writes to so that they can reject a stale holder.
/// - **Release keeps the row**: it sets `expires_at` to the epoch, so the fence
///   never restarts, and a statement that waited for the release's row lock
///   sees the row expired whatever instant it took as its "now". Rows are never deleted by this crate; delete rows of names you
///   no longer use yourself, if ever (they are small).
/// - **One statement per call**, in autocommit: acquire is a single
///   `INSERT .. SELECT .. WHERE NOT EXISTS (live row of another holder)
///   ON CONFLICT .. DO UPDATE .. WHERE .. RETURNING fence` (the `NOT EXISTS`
///   answers "held elsewhere" without locking the row), renew
///   and release are single `UPDATE`s matched on name, holder, fence and
///   expiry: they concern one acquisition, so a late request of an older
///   acquisition never touches a newer one.
///   Renew never inserts a row.
/// - **Batched renewals**: the renewals of many leases of one holder
///   ([`Backend::renew_many`], which the engine uses) are one
///   `UPDATE .. FROM unnest($1::text[], $2::bigint[]) .. RETURNING name` per
///   1,000 leases; each lease learns from the names returned whether it was
///   renewed.
///
/// Names and holders are always bind parameters. The table name is validated
/// when the backend is built and then put into the statements, which are
/// built once. Names containing a NUL byte cannot be stored in a `TEXT` column
/// and fail with [`Error::Database`].
///
/// Cloning is cheap: a [`PgPool`] and reference-counted statements.
///
/// **Round trips.** Each call checks a connection out of the pool, and by
/// default sqlx pings an idle connection before handing it out
/// (`test_before_acquire`): a renewal then costs two round trips, and it must
/// answer within `ttl/3`. Build the pool with
/// `PgPoolOptions::new().test_before_acquire(false)` to make it one; a
/// connection found dead is then reported by the statement itself, and the
/// engine retries the renewal on another connection. The fault suite
/// (`docs/RELIABILITY.md`) measures the difference under added latency.
///
/// **Renewals share your pool.** Renewals and releases take a connection
/// from the pool the backend was given, like the rest of your program. A job
/// that holds every connection of that pool (a long transaction on each, a
/// pool of one) keeps its own lease from being renewed, and loses the lease
/// at its deadline. Give the pool one connection more than the job uses at
/// once, or give the backend a small pool of its own
/// (`PgPoolOptions::new().max_connections(2)`).
///
/// A call whose future is dropped (for example by a timeout) after its
/// statement reached the server may still take effect: an acquisition the
/// caller never learned of ends at its ttl, or is picked up by the same
/// holder's next (idempotent) acquire.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lease::{Acquisition, Backend, backend::PgTable};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lease::Error> {
/// let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/test").await?;
/// let table = PgTable::new(pool);
/// table.ensure_schema().await?;
///
/// let grant = table.acquire("nightly-report", "pod-a", Duration::from_secs(90)).await?;
/// let fence = grant.and_then(|g| g.fencing_token);
/// assert!(fence >= Some(1));
/// assert!(table.acquire("nightly-report", "pod-b", Duration::from_secs(90)).await?.is_none());
/// table.release(Acquisition::new("nightly-report", "pod-a", fence)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PgTable {
    pool: PgPool,
    sql: Statements,
}

impl PgTable {
    /// A backend on the table `task_leases` of `pool`'s database (found by the
    /// connections' `search_path`).
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
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            sql: Statements::default_table(&TEMPLATES),
        }
    }

    /// The same backend on another table, `name` or `schema.name`.
    ///
    /// The name must match `[A-Za-z_][A-Za-z0-9_]*` (at most 63 bytes), once or
    /// twice separated by one `.`; it is used unquoted, so PostgreSQL folds it
    /// to lower case. A schema must already exist.
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
        Ok(Self {
            pool: self.pool,
            sql: Statements::new(&TEMPLATES, table)?,
        })
    }

    /// Creates the table if it does not exist.
    ///
    /// Idempotent, and safe to call from many connections or processes at
    /// once: the `CREATE TABLE IF NOT EXISTS` runs in a short transaction
    /// that first takes a transaction-scoped advisory lock (the key pair
    /// `(1818583411, 1)`), because concurrent `CREATE TABLE IF NOT EXISTS`
    /// statements can otherwise fail with a unique violation. It never touches
    /// sqlx's `_sqlx_migrations` table. The DDL is the same as
    /// `migrations/postgres/0001_task_leases.sql`.
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
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
            .bind(SCHEMA_LOCK.0)
            .bind(SCHEMA_LOCK.1)
            .execute(&mut *tx)
            .await?;
        sqlx::query(AssertSqlSafe(self.sql.create.clone()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
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
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table name, as given to [`with_table`](Self::with_table)
    /// (`task_leases` by default).
    pub fn table(&self) -> &str {
        &self.sql.table
    }
}

impl Backend for PgTable {
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

    /// One `UPDATE .. FROM unnest(..) .. RETURNING name, fence` per holder
    /// and 1,000 leases.
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        let groups = by_holder(leases);
        let chunks = groups.iter().flat_map(|(holder, at)| {
            at.chunks(sql::RENEW_MANY_CHUNK)
                .map(move |chunk| (*holder, chunk))
        });
        let calls = chunks.map(|(holder, at)| async move {
            let mut names = Vec::with_capacity(at.len());
            let mut ttls = Vec::with_capacity(at.len());
            let mut fences = Vec::with_capacity(at.len());
            for &i in at {
                let (lease, ttl) = leases[i];
                ttls.push(sql::check(lease.name, holder, ttl)?);
                names.push(lease.name);
                fences.push(sql::fence_param(lease.fencing_token));
            }
            let renewed: Vec<(String, i64)> = sql::explain(
                &self.pool,
                sqlx::query_as(AssertSqlSafe(self.sql.renew_many[0].clone()))
                    .bind(&names)
                    .bind(&ttls)
                    .bind(&fences)
                    .bind(holder)
                    .fetch_all(&self.pool)
                    .await,
            )
            .await?;
            let renewed: HashSet<(&str, i64)> =
                renewed.iter().map(|(n, f)| (n.as_str(), *f)).collect();
            Ok::<_, Error>(
                at.iter()
                    .zip(names.iter().zip(&fences))
                    .map(|(&i, (n, f))| (i, f.is_some_and(|f| renewed.contains(&(*n, f)))))
                    .collect::<Vec<_>>(),
            )
        });
        let mut out = vec![false; leases.len()];
        for chunk in futures_util::future::join_all(calls).await {
            for (i, renewed) in chunk? {
                out[i] = renewed;
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
            include_str!("../../../migrations/postgres/0001_task_leases.sql"),
            format!("{ddl};\n")
        );
    }
}
