//! The MySQL / MariaDB dialect of the table backend: [`MySqlTable`].

use std::collections::HashSet;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{AssertSqlSafe, MySql};

use super::{LIST_SIZES, Renewal, Table, Templates, list_size, sealed};

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
/// Leases stored in a MySQL 8 or MariaDB 10.6+ table, one row per lease name;
/// the server's clock decides expiry, and every acquisition gets a fencing
/// token.
///
/// The table (by default `task_leases`, see [`with_table`](Table::with_table))
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
/// Create the table with [`ensure_schema`](Table::ensure_schema) (MySQL
/// serialises concurrent `CREATE TABLE IF NOT EXISTS` with metadata locks),
/// or with your own migration tool from `migrations/mysql/0001_task_leases.sql`.
///
/// - **Clock.** Expiry is computed by the server with `UTC_TIMESTAMP(6)`, so
///   neither the replicas' clocks nor the session time zone matter. A lease
///   is live while `expires_at > UTC_TIMESTAMP(6)`.
/// - **Statements.** Acquire is a single `INSERT .. ON DUPLICATE KEY UPDATE`
///   that hands the fence back through `LAST_INSERT_ID(expr)` (so it also
///   sets the connection's `LAST_INSERT_ID()`); renew and release are single
///   `UPDATE`s. MySQL has no `UPDATE .. RETURNING`: a batch of renewals is
///   one `UPDATE .. WHERE holder = ? AND .. AND (name, fence) IN (..)` per
///   ttl and 1,000 leases; when it matched as many rows as it had leases,
///   every lease was renewed (one round trip), otherwise one `SELECT` of the
///   live ones follows. The lists are padded (repeating a lease) to one of a
///   few lengths, so that a connection prepares at most 11 variants of each.
/// - **Transient failures.** InnoDB may report a deadlock (error 1213) or a
///   lock wait timeout (1205) when many replicas insert a new name at once;
///   such a statement was rolled back, and it is retried a few times with a
///   short random backoff before the error is returned.
///
/// Everything else — fencing, release, round trips, the pool — is the same
/// for every table backend: see [`Table`].
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
pub type MySqlTable = Table<MySqlDialect>;

dialect! {
    /// The MySQL / MariaDB [`Dialect`](super::Dialect) of [`MySqlTable`].
    MySqlDialect
}

// Sealed: the calls use the crate's own types.
#[allow(private_interfaces)]
impl sealed::Calls for MySqlDialect {
    type Database = MySql;
    const NAME: &'static str = "MySqlTable";
    const TEMPLATES: Templates = TEMPLATES;
    const CONCURRENT_BATCHES: bool = true;

    plain_create!();

    async fn acquire(
        t: &Table<Self>,
        name: &str,
        holder: &str,
        ttl_ms: i64,
    ) -> Result<Option<i64>, sqlx::Error> {
        let (name, holder) = (name.as_bytes(), holder.as_bytes());
        let done = sqlx::query(AssertSqlSafe(t.sql.acquire.clone()))
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
            .execute(&t.pool)
            .await?;
        // 0: held by someone else. Fences start at 1, so 0 is never a fence.
        Ok(match done.last_insert_id() {
            0 => None,
            fence => Some(i64::try_from(fence).unwrap_or(-1)),
        })
    }

    async fn renew(t: &Table<Self>, lease: Renewal<'_>, holder: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(t.sql.renew.clone()))
            .bind(lease.ttl_ms)
            .bind(lease.name.as_bytes())
            .bind(holder.as_bytes())
            .bind(lease.fence)
            .execute(&t.pool)
            .await?;
        // Matched rows, thanks to CLIENT_FOUND_ROWS (see the statement).
        Ok(done.rows_affected() == 1)
    }

    release_call!(as_bytes);

    /// One `UPDATE` per ttl (a `Lease` usually uses few), and a `SELECT`
    /// of the live leases only when some lease was not renewed.
    async fn renew_batch(
        t: &Table<Self>,
        holder: &str,
        leases: &[Renewal<'_>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        let mut out = vec![false; leases.len()];
        let mut ttls: Vec<i64> = leases.iter().map(|l| l.ttl_ms).collect();
        ttls.sort_unstable();
        ttls.dedup();
        for ttl_ms in ttls {
            let at: Vec<usize> = (0..leases.len())
                .filter(|&i| leases[i].ttl_ms == ttl_ms)
                .collect();
            let items: Vec<(&[u8], Option<i64>)> = at
                .iter()
                .map(|&i| (leases[i].name.as_bytes(), leases[i].fence))
                .collect();
            let renewed = renew_one_ttl(t, holder.as_bytes(), ttl_ms, &items).await?;
            for (i, renewed) in at.into_iter().zip(renewed) {
                out[i] = renewed;
            }
        }
        Ok(out)
    }

    /// InnoDB deadlock (1213) or lock wait timeout (1205): the server rolled
    /// the statement back.
    fn is_transient(e: &sqlx::Error) -> bool {
        match e {
            sqlx::Error::Database(e) => e
                .try_downcast_ref::<MySqlDatabaseError>()
                .is_some_and(|e| matches!(e.number(), 1205 | 1213)),
            _ => false,
        }
    }
}

/// Renew `items` (name, fence) of one holder and ttl; which were renewed, in
/// order.
async fn renew_one_ttl(
    t: &Table<MySqlDialect>,
    holder: &[u8],
    ttl_ms: i64,
    items: &[(&[u8], Option<i64>)],
) -> Result<Vec<bool>, sqlx::Error> {
    let size = list_size(items.len());
    let last = *items.last().expect("BUG: an empty batch");
    let padded = || {
        let pad = LIST_SIZES[size] - items.len();
        items.iter().copied().chain(std::iter::repeat_n(last, pad))
    };
    let query = sqlx::query(AssertSqlSafe(t.sql.renew_many[size].clone()))
        .bind(ttl_ms)
        .bind(holder);
    let done = padded()
        .fold(query, |query, (name, fence)| query.bind(name).bind(fence))
        .execute(&t.pool)
        .await?;
    let mut distinct = items.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if done.rows_affected() == distinct.len() as u64 {
        return Ok(vec![true; items.len()]);
    }
    let query = sqlx::query_as(AssertSqlSafe(t.sql.renewed_many[size].clone())).bind(holder);
    let live: Vec<(Vec<u8>, i64)> = padded()
        .fold(query, |query, (name, fence)| query.bind(name).bind(fence))
        .fetch_all(&t.pool)
        .await?;
    let live: HashSet<(&[u8], i64)> = live.iter().map(|(n, f)| (n.as_slice(), *f)).collect();
    Ok(items
        .iter()
        .map(|&(name, fence)| fence.is_some_and(|f| live.contains(&(name, f))))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::{LIST_SIZES, Statements};
    use super::*;

    #[test]
    fn acquire_binds_one_value_per_placeholder() {
        // name, holder, ttl; fence: holder x2; holder: holder x2; expires_at: holder, ttl
        assert_eq!(TEMPLATES.acquire.matches('?').count(), 9);
        assert_eq!(TEMPLATES.renew.matches('?').count(), 4);
        assert_eq!(TEMPLATES.release.matches('?').count(), 3);
        let s = Statements::default_table(&TEMPLATES);
        for (i, &n) in LIST_SIZES.iter().enumerate() {
            // ttl, holder, (name, fence) pairs
            assert_eq!(s.renew_many[i].matches('?').count(), 2 + 2 * n);
            assert_eq!(s.renewed_many[i].matches('?').count(), 1 + 2 * n);
        }
    }
}
