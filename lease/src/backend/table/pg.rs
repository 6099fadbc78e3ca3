//! The PostgreSQL dialect of the table backend: [`PgTable`].

use sqlx::{AssertSqlSafe, Postgres};

use super::{Renewal, Table, Templates, renewed_of, sealed};

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

/// The advisory lock that serialises `PgTable::ensure_schema` across
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
/// The table (by default `task_leases`, see [`with_table`](Table::with_table))
/// has the columns
///
/// | column | type | meaning |
/// |---|---|---|
/// | `name` | `TEXT PRIMARY KEY` | the lease name, compared byte for byte |
/// | `holder` | `TEXT NOT NULL` | who holds (or last held) the lease |
/// | `expires_at` | `TIMESTAMPTZ NOT NULL` | when the lease ends |
/// | `fence` | `BIGINT NOT NULL` | the fencing counter of the name |
///
/// Create it with [`ensure_schema`](Table::ensure_schema), or with your own
/// migration tool from `migrations/postgres/0001_task_leases.sql`.
/// `ensure_schema` runs its `CREATE TABLE IF NOT EXISTS` in a short
/// transaction that first takes a transaction-scoped advisory lock (the key
/// pair `(1818583411, 1)`), because concurrent `CREATE TABLE IF NOT EXISTS`
/// statements can otherwise fail with a unique violation.
///
/// - **Clock.** Expiry is computed by the server with `clock_timestamp()`
///   (the wall clock at the moment the statement runs, not `now()`, which is
///   frozen at the start of the transaction). A lease is live while
///   `expires_at > clock_timestamp()`.
/// - **Statements.** Acquire is a single
///   `INSERT .. SELECT .. WHERE NOT EXISTS (live row of another holder)
///   ON CONFLICT .. DO UPDATE .. WHERE .. RETURNING fence` (the `NOT EXISTS`
///   answers "held elsewhere" without locking the row); renew and release
///   are single `UPDATE`s; a batch of renewals is one
///   `UPDATE .. FROM unnest($1::text[], $2::bigint[], $3::bigint[]) ..
///   RETURNING name, fence` per 1,000 leases.
/// - Names containing a NUL byte cannot be stored in a `TEXT` column and
///   fail with [`Error::Database`](crate::Error::Database).
///
/// Everything else — fencing, release, round trips, the pool — is the same
/// for every table backend: see [`Table`].
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
pub type PgTable = Table<PgDialect>;

dialect! {
    /// The PostgreSQL [`Dialect`](super::Dialect) of [`PgTable`].
    PgDialect
}

// Sealed: the calls use the crate's own types.
#[allow(private_interfaces)]
impl sealed::Calls for PgDialect {
    type Database = Postgres;
    const NAME: &'static str = "PgTable";
    const TEMPLATES: Templates = TEMPLATES;
    const CONCURRENT_BATCHES: bool = true;

    async fn create(t: &Table<Self>) -> Result<(), sqlx::Error> {
        let mut tx = t.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
            .bind(SCHEMA_LOCK.0)
            .bind(SCHEMA_LOCK.1)
            .execute(&mut *tx)
            .await?;
        sqlx::query(AssertSqlSafe(t.sql.create.clone()))
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    numbered_calls!();

    /// The names, ttls and fences as three arrays; the rows renewed come back.
    async fn renew_batch(
        t: &Table<Self>,
        holder: &str,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        let names: Vec<&str> = leases.iter().map(|l| l.name).collect();
        let ttls: Vec<i64> = leases.iter().map(|l| l.ttl_ms).collect();
        let fences: Vec<Option<i64>> = leases.iter().map(|l| l.fence).collect();
        let renewed: Vec<(String, i64)> =
            sqlx::query_as(AssertSqlSafe(t.sql.renew_many[0].clone()))
                .bind(&names)
                .bind(&ttls)
                .bind(&fences)
                .bind(holder)
                .fetch_all(&t.pool)
                .await?;
        Ok(renewed_of(leases, &renewed))
    }
}
