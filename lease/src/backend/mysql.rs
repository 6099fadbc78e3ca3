//! Leases in a MySQL or MariaDB table, with expiry decided by the server's clock.

use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use sqlx::mysql::{MySqlDatabaseError, MySqlQueryResult};
use sqlx::{AssertSqlSafe, MySqlPool};

use super::sql::{self, Statements, Templates};
use crate::{Acquisition, Backend, Error, Grant};

/// `? * 1000` microseconds after the server's UTC clock; the ttl is bound in
/// milliseconds.
macro_rules! expiry {
    () => {
        "TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6))"
    };
}

/// The row may be taken by the holder bound to `?`: it has expired (or was
/// released), or that holder already has it.
macro_rules! acquirable {
    () => {
        "(expires_at <= UTC_TIMESTAMP(6) OR holder = ?)"
    };
}

const TEMPLATES: Templates = Templates {
    create: "CREATE TABLE IF NOT EXISTS {table} (\n    \
             name VARBINARY(255) NOT NULL PRIMARY KEY,\n    \
             holder VARBINARY(255) NOT NULL,\n    \
             expires_at DATETIME(6) NOT NULL,\n    \
             fence BIGINT NOT NULL\n\
             ) ENGINE=InnoDB",
    // One statement, no RETURNING: the fence comes back as the OK packet's
    // "last insert id", set with LAST_INSERT_ID(expr):
    // - a new row inserts fence 1 and sets it to 1;
    // - on a duplicate key the fence is assigned FIRST (assignments run left
    //   to right and see earlier assignments), while `holder` and
    //   `expires_at` still hold the old row's values: if the row is
    //   acquirable the new fence (kept for our own live lease, else + 1) is
    //   both stored and set as the last insert id, otherwise the fence stays
    //   and the last insert id is set to 0;
    // - `holder` and then `expires_at` are changed under the same condition.
    //   It evaluates the same after `holder` has been changed: if the row was
    //   acquirable `holder` now equals ours (true), otherwise `holder` and
    //   `expires_at` are unchanged (false).
    // UTC_TIMESTAMP(6) is constant within one statement. The same values are
    // bound again instead of using VALUES(col) (deprecated in MySQL 8) or a
    // row alias (not in MariaDB). Affected rows say nothing here: sqlx sets
    // CLIENT_FOUND_ROWS.
    acquire: concat!(
        "INSERT INTO {table} (name, holder, expires_at, fence) VALUES (?, ?, ",
        expiry!(),
        ", LAST_INSERT_ID(1)) ON DUPLICATE KEY UPDATE fence = IF(",
        acquirable!(),
        ", LAST_INSERT_ID(IF(expires_at > UTC_TIMESTAMP(6) AND holder = ?, fence, fence + 1)), \
         fence + LAST_INSERT_ID(0)), holder = IF(",
        acquirable!(),
        ", ?, holder), expires_at = IF(",
        acquirable!(),
        ", ",
        expiry!(),
        ", expires_at)"
    ),
    // sqlx always sets CLIENT_FOUND_ROWS, so "affected rows" of an UPDATE is
    // the number of rows *matched*: 1 iff the lease was ours and live, even in
    // the (theoretical) case that the new expiry equals the old one. Renew
    // and release match the acquisition: name, holder and fence.
    renew: concat!(
        "UPDATE {table} SET expires_at = ",
        expiry!(),
        " WHERE name = ? AND holder = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)"
    ),
    // UTC_TIMESTAMP(6) is the time the *statement started*. A renewal sent
    // before the release and blocked on the release's row lock would still
    // see an expiry of "the release's now" as live, and extend the released
    // lease by a full ttl. At the epoch, a released row is expired for every
    // statement, whenever it started. (1970-01-01 00:00:01 is also the
    // smallest TIMESTAMP, so tables with that column type take it.)
    release: "UPDATE {table} SET expires_at = '1970-01-01 00:00:01' \
              WHERE name = ? AND holder = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)",
    // Many renewals of one holder and ttl in one statement. Matched rows
    // (again CLIENT_FOUND_ROWS) equal to the number of leases means every
    // lease was renewed; otherwise `renewed_many` finds out which. The row
    // comparison `(name, fence) IN (..)` is a range scan of the primary key.
    renew_many: concat!(
        "UPDATE {table} SET expires_at = ",
        expiry!(),
        " WHERE holder = ? AND expires_at > UTC_TIMESTAMP(6) AND (name, fence) IN ({list})"
    ),
    // Run right after a `renew_many` that matched fewer rows than leases: an
    // acquisition of ours that is live now was renewed by it (nothing else
    // renews it, and a newer acquisition would carry another fence).
    renewed_many: "SELECT name, fence FROM {table} \
                   WHERE holder = ? AND expires_at > UTC_TIMESTAMP(6) AND (name, fence) IN ({list})",
    list_item: "(?, ?)",
};

/// How many times a statement is tried when InnoDB reports a deadlock or a
/// lock wait timeout (both roll back just that autocommit statement).
const ATTEMPTS: u32 = 6;

/// Leases stored in a MySQL 8 or MariaDB 10.6+ table, one row per lease name;
/// the server's clock decides expiry, and every acquisition gets a fencing
/// token.
///
/// The table (by default `task_leases`, see [`with_table`](Self::with_table))
/// is an InnoDB table with the columns
///
/// | column | type | meaning |
/// |---|---|---|
/// | `name` | `VARBINARY(255) NOT NULL PRIMARY KEY` | the lease name, as UTF-8 bytes |
/// | `holder` | `VARBINARY(255) NOT NULL` | who holds (or last held) the lease |
/// | `expires_at` | `DATETIME(6) NOT NULL` | when the lease ends, in UTC |
/// | `fence` | `BIGINT NOT NULL` | the fencing counter of the name |
///
/// Names and holders are binary strings, compared byte for byte: with a text
/// collation `"job"`, `"JOB"`, `"jöb"` and `"job "` could all be one lease.
/// Create the table with [`ensure_schema`](Self::ensure_schema), or with your
/// own migration tool from `migrations/mysql/0001_task_leases.sql`.
///
/// Guarantees:
///
/// - **Clock.** Expiry is computed by the server with `UTC_TIMESTAMP(6)`, so
///   neither the replicas' clocks nor the session time zone matter.
/// - **What ends a lease.** Its ttl running out without a renewal, or a
///   release by its holder. A lease is live while `expires_at > UTC_TIMESTAMP(6)`.
/// - **Fencing.** Each acquisition returns the row's `fence`: 1 for the first
///   acquisition of a name, one more for each later one, unchanged when the
///   holder re-acquires its own live lease.
/// - **Release keeps the row**: it sets `expires_at` to the epoch, so the fence
///   never restarts, and a statement that waited for the release's row lock
///   sees the row expired whatever instant it took as its "now". Rows are never deleted by this crate.
/// - **One statement per call**, in autocommit. Acquire is a single
///   `INSERT .. ON DUPLICATE KEY UPDATE` that hands the fence back through
///   `LAST_INSERT_ID(expr)` (so it also sets the connection's
///   `LAST_INSERT_ID()`); renew and release are single `UPDATE`s matched on
///   name, holder, fence and expiry: they concern one acquisition, so a late
///   request of an older acquisition never touches a newer one. Renew never inserts a row.
/// - **Batched renewals**: the renewals of many leases of one holder
///   ([`Backend::renew_many`], which the engine uses) are one
///   `UPDATE .. WHERE holder = ? AND .. AND name IN (..)` per ttl and 1,000
///   leases. MySQL has no `UPDATE .. RETURNING`: when the statement matched
///   as many rows as it had names, every lease was renewed (one round trip);
///   otherwise — some lease was lost — one
///   `SELECT name .. WHERE holder = ? AND expires_at > now AND name IN (..)`
///   follows, so that each lease learns whether it was renewed. The lists
///   are padded (repeating a name) to one of a few lengths, so that a
///   connection prepares at most 11 variants of each statement.
/// - **Transient failures.** InnoDB may report a deadlock (error 1213) or a
///   lock wait timeout (1205) when many replicas insert a new name at once;
///   such a statement was rolled back, and it is retried a few times with a
///   short random backoff before the error is returned.
///
/// Names and holders are always bind parameters. The table name is validated
/// when the backend is built and then put into the statements, which are
/// built once.
///
/// Cloning is cheap: a [`MySqlPool`] and reference-counted statements.
///
/// **Round trips.** Each call checks a connection out of the pool, and by
/// default sqlx pings an idle connection before handing it out
/// (`test_before_acquire`): a renewal then costs two round trips, and it must
/// answer within `ttl/3`. Build the pool with
/// `MySqlPoolOptions::new().test_before_acquire(false)` to make it one; a
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
/// (`MySqlPoolOptions::new().max_connections(2)`).
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
/// use lease::{Acquisition, Backend, backend::MySqlTable};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lease::Error> {
/// let pool = sqlx::MySqlPool::connect("mysql://root@127.0.0.1:3306/test").await?;
/// let table = MySqlTable::new(pool);
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
pub struct MySqlTable {
    pool: MySqlPool,
    sql: Statements,
}

impl MySqlTable {
    /// A backend on the table `task_leases` of `pool`'s current database.
    ///
    /// Nothing is sent to the server until the first call; create the table
    /// with [`ensure_schema`](Self::ensure_schema) or a migration.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lease::backend::MySqlTable;
    ///
    /// # async fn f() -> Result<(), lease::Error> {
    /// let table = MySqlTable::new(sqlx::MySqlPool::connect("mysql://localhost/app").await?);
    /// assert_eq!(table.table(), "task_leases");
    /// # Ok(()) }
    /// ```
    pub fn new(pool: MySqlPool) -> Self {
        Self {
            pool,
            sql: Statements::default_table(&TEMPLATES),
        }
    }

    /// The same backend on another table, `name` or `database.name`.
    ///
    /// The name must match `[A-Za-z_][A-Za-z0-9_]*` (at most 63 bytes), once or
    /// twice separated by one `.`. A database must already exist.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lease::backend::MySqlTable;
    ///
    /// # async fn f(pool: sqlx::MySqlPool) -> Result<(), lease::Error> {
    /// let table = MySqlTable::new(pool).with_table("jobs.leases")?;
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
    /// once (MySQL serialises `CREATE TABLE IF NOT EXISTS` with metadata
    /// locks). It never touches sqlx's `_sqlx_migrations` table. The DDL is
    /// the same as `migrations/mysql/0001_task_leases.sql`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::MySqlPool) -> Result<(), lease::Error> {
    /// lease::backend::MySqlTable::new(pool).ensure_schema().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Database`] when the server cannot be reached or refuses the
    /// statement (for example a missing database or privilege).
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
    /// # async fn f(table: lease::backend::MySqlTable) -> Result<(), lease::Error> {
    /// let holders: Vec<(Vec<u8>, Vec<u8>, i64)> = sqlx::query_as(
    ///     "SELECT name, holder, fence FROM task_leases WHERE expires_at > UTC_TIMESTAMP(6)",
    /// )
    /// .fetch_all(table.pool())
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The table name, as given to [`with_table`](Self::with_table)
    /// (`task_leases` by default).
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Runs one autocommit statement, retrying InnoDB deadlocks and lock wait
    /// timeouts (the server rolled the statement back, so it is safe to run
    /// it again).
    async fn run<F, Fut>(&self, statement: F) -> Result<MySqlQueryResult, Error>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<MySqlQueryResult, sqlx::Error>>,
    {
        let mut attempt = 1;
        loop {
            match statement().await {
                Err(e) if attempt < ATTEMPTS && is_transient(&e) => {
                    // 2, 4, 8, 16, 32 ms, each plus up to as much again at random,
                    // so that the contenders do not collide again in lockstep.
                    let base = 1u64 << attempt;
                    let jitter = RandomState::new().hash_one(attempt) % (base + 1);
                    tokio::time::sleep(Duration::from_millis(base + jitter)).await;
                    attempt += 1;
                }
                result => return sql::explain(&self.pool, result).await,
            }
        }
    }
}

/// InnoDB deadlock (1213) or lock wait timeout (1205).
fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(e) => e
            .try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| matches!(e.number(), 1205 | 1213)),
        _ => false,
    }
}

impl Backend for MySqlTable {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        let ttl_ms = sql::check(name, holder, ttl)?;
        let (name, holder) = (name.as_bytes(), holder.as_bytes());
        let done = self
            .run(|| {
                sqlx::query(AssertSqlSafe(self.sql.acquire.clone()))
                    // VALUES (name, holder, expiry)
                    .bind(name)
                    .bind(holder)
                    .bind(ttl_ms)
                    // fence = IF(acquirable, LAST_INSERT_ID(IF(ours and live, ..)), ..)
                    .bind(holder)
                    .bind(holder)
                    // holder = IF(acquirable, holder, ..)
                    .bind(holder)
                    .bind(holder)
                    // expires_at = IF(acquirable, expiry, ..)
                    .bind(holder)
                    .bind(ttl_ms)
                    .execute(&self.pool)
            })
            .await?;
        // 0: held by someone else. Fences start at 1, so 0 is never a fence.
        Ok(match done.last_insert_id() {
            0 => None,
            fence => Some(Grant::new(Some(fence))),
        })
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        let ttl_ms = sql::check(lease.name, lease.holder, ttl)?;
        let (name, holder) = (lease.name.as_bytes(), lease.holder.as_bytes());
        let fence = sql::fence_param(lease.fencing_token);
        let done = self
            .run(|| {
                sqlx::query(AssertSqlSafe(self.sql.renew.clone()))
                    .bind(ttl_ms)
                    .bind(name)
                    .bind(holder)
                    .bind(fence)
                    .execute(&self.pool)
            })
            .await?;
        // Matched rows, thanks to CLIENT_FOUND_ROWS (see the statement).
        Ok(done.rows_affected() == 1)
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        sql::check_no_ttl(lease.name, lease.holder)?;
        let (name, holder) = (lease.name.as_bytes(), lease.holder.as_bytes());
        let fence = sql::fence_param(lease.fencing_token);
        self.run(|| {
            sqlx::query(AssertSqlSafe(self.sql.release.clone()))
                .bind(name)
                .bind(holder)
                .bind(fence)
                .execute(&self.pool)
        })
        .await?;
        Ok(())
    }

    /// One `UPDATE .. IN (..)` per holder, ttl and 1,000 leases, and a
    /// `SELECT` of the renewed leases only when some lease was not renewed.
    async fn renew_many(&self, leases: &[(Acquisition<'_>, Duration)]) -> Result<Vec<bool>, Error> {
        // Group by holder and ttl (a `Lease` has one holder and usually uses
        // few ttls), keeping the positions.
        let mut groups: Vec<((&str, i64), Vec<usize>)> = Vec::new();
        for (i, &(lease, ttl)) in leases.iter().enumerate() {
            let key = (lease.holder, sql::check(lease.name, lease.holder, ttl)?);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, at)) => at.push(i),
                None => groups.push((key, vec![i])),
            }
        }
        let chunks = groups.iter().flat_map(|(key, at)| {
            at.chunks(sql::RENEW_MANY_CHUNK)
                .map(move |chunk| (*key, chunk))
        });
        let calls = chunks.map(|((holder, ttl_ms), at)| async move {
            let items: Vec<(&[u8], Option<i64>)> = at
                .iter()
                .map(|&i| {
                    let lease = leases[i].0;
                    (lease.name.as_bytes(), sql::fence_param(lease.fencing_token))
                })
                .collect();
            let renewed = self.renew_chunk(holder.as_bytes(), ttl_ms, &items).await?;
            Ok::<_, Error>(at.iter().copied().zip(renewed).collect::<Vec<_>>())
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

impl MySqlTable {
    /// Renew `items` (name, fence; at most [`sql::RENEW_MANY_CHUNK`], one
    /// holder and ttl); which were renewed, in order.
    async fn renew_chunk(
        &self,
        holder: &[u8],
        ttl_ms: i64,
        items: &[(&[u8], Option<i64>)],
    ) -> Result<Vec<bool>, Error> {
        let size = sql::list_size(items.len());
        let padded = || {
            let last = *items.last().expect("BUG: an empty chunk");
            let pad = sql::LIST_SIZES[size] - items.len();
            items.iter().copied().chain(std::iter::repeat_n(last, pad))
        };
        let done = self
            .run(|| {
                let query = sqlx::query(AssertSqlSafe(self.sql.renew_many[size].clone()))
                    .bind(ttl_ms)
                    .bind(holder);
                padded()
                    .fold(query, |query, (name, fence)| query.bind(name).bind(fence))
                    .execute(&self.pool)
            })
            .await?;
        let mut distinct = items.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        if done.rows_affected() == distinct.len() as u64 {
            return Ok(vec![true; items.len()]);
        }
        let query = sqlx::query_as(AssertSqlSafe(self.sql.renewed_many[size].clone())).bind(holder);
        let live = padded()
            .fold(query, |query, (name, fence)| query.bind(name).bind(fence))
            .fetch_all(&self.pool)
            .await;
        let live: Vec<(Vec<u8>, i64)> = sql::explain(&self.pool, live).await?;
        let live: std::collections::HashSet<(&[u8], i64)> =
            live.iter().map(|(n, f)| (n.as_slice(), *f)).collect();
        Ok(items
            .iter()
            .map(|&(name, fence)| fence.is_some_and(|f| live.contains(&(name, f))))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_is_the_default_ddl() {
        let ddl = Statements::default_table(&TEMPLATES).create;
        assert_eq!(
            include_str!("../../../migrations/mysql/0001_task_leases.sql"),
            format!("{ddl};\n")
        );
    }

    #[test]
    fn acquire_binds_one_value_per_placeholder() {
        // name, holder, ttl; fence: holder x2; holder: holder x2; expires_at: holder, ttl
        assert_eq!(TEMPLATES.acquire.matches('?').count(), 9);
        assert_eq!(TEMPLATES.renew.matches('?').count(), 4);
        assert_eq!(TEMPLATES.release.matches('?').count(), 3);
        let s = Statements::default_table(&TEMPLATES);
        for (i, &n) in sql::LIST_SIZES.iter().enumerate() {
            // ttl, holder, (name, fence) pairs
            assert_eq!(s.renew_many[i].matches('?').count(), 2 + 2 * n);
            assert_eq!(s.renewed_many[i].matches('?').count(), 1 + 2 * n);
        }
    }
}
