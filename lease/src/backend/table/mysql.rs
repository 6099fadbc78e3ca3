//! The MySQL / MariaDB dialect of the table backend: [`MySqlTable`].

use std::collections::HashSet;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{AssertSqlSafe, MySql};

use super::{
    Column, Info, LIST_SIZES, Layout, Ready, Renewal, Shape, Table, Templates, explain, list_size,
    sealed, shape, step_us,
};
use crate::Error;

/// `? * 1000` microseconds (the ttl is bound in milliseconds) after the
/// server's clock (`{now}`: `UTC_TIMESTAMP(6)` for a `DATETIME` column),
/// plus `{pad}` (nothing for a column of microseconds; see `layout`).
macro_rules! expiry {
    () => {
        "TIMESTAMPADD(MICROSECOND, ? * 1000{pad}, {now})"
    };
}

/// The row may be taken by the holder bound to `?`: it has expired (or was
/// released), or that holder already has it. `{cutoff}` is `{now}` for a
/// column of microseconds.
macro_rules! acquirable {
    () => {
        "(expires_at <= {cutoff} OR holder = ?)"
    };
}

/// The `CREATE TABLE` of the table `$table`: with `"{table}"` the template
/// of every table, with `"task_leases"` [`MySqlTable::SCHEMA`]. One text, so
/// the two cannot drift apart.
macro_rules! create_table {
    ($table:literal) => {
        concat!(
            "CREATE TABLE IF NOT EXISTS ",
            $table,
            " (\n    \
             name VARBINARY(255) NOT NULL PRIMARY KEY,\n    \
             holder VARBINARY(255) NOT NULL,\n    \
             expires_at DATETIME(6) NOT NULL,\n    \
             fence BIGINT NOT NULL\n\
             ) ENGINE=InnoDB"
        )
    };
}

const TEMPLATES: Templates = Templates {
    create: create_table!("{table}"),
    // MySQL 8 has no ADD COLUMN IF NOT EXISTS (MariaDB has).
    add_fence: "ALTER TABLE {table} ADD COLUMN fence BIGINT NOT NULL DEFAULT 0",
    // One statement, no RETURNING: the fence comes back as the OK packet's
    // "last insert id", set with LAST_INSERT_ID(expr):
    // - a new row inserts fence 1 and sets it to 1;
    // - on a duplicate key the fence is assigned FIRST (assignments run left
    //   to right and see earlier assignments), while `holder` and
    //   `expires_at` still hold the old row's values: if the row is
    //   acquirable the new fence (kept for our own live lease unless it is 0,
    //   a row the Go services inserted; else + 1) is both stored and set as
    //   the last insert id, otherwise the fence stays and the last insert id
    //   is set to 0;
    // - `holder` and then `expires_at` are changed under the same condition.
    //   It evaluates the same after `holder` has been changed: if the row was
    //   acquirable `holder` now equals ours (true), otherwise `holder` and
    //   `expires_at` are unchanged (false).
    // The server's clock is constant within one statement. The same values
    // are bound again instead of using VALUES(col) (deprecated in MySQL 8)
    // or a row alias (not in MariaDB). Affected rows say nothing here: sqlx
    // sets CLIENT_FOUND_ROWS.
    acquire: concat!(
        "INSERT INTO {table} (name, holder, expires_at, fence) VALUES (?, ?, ",
        expiry!(),
        ", LAST_INSERT_ID(1)) ON DUPLICATE KEY UPDATE fence = IF(",
        acquirable!(),
        ", LAST_INSERT_ID(IF(expires_at > {cutoff} AND holder = ? AND fence > 0, fence, fence + 1)), \
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
        " WHERE name = ? AND holder = ? AND fence = ? AND expires_at > {cutoff}"
    ),
    // The server's clock is the time the *statement started*. A renewal sent
    // before the release and blocked on the release's row lock would still
    // see an expiry of "the release's now" as live, and extend the released
    // lease by a full ttl. At the epoch (`{epoch}`: 1970-01-01 00:00:01 UTC,
    // the smallest TIMESTAMP), a released row is expired for every
    // statement, whenever it started.
    release: "UPDATE {table} SET expires_at = {epoch} \
              WHERE name = ? AND holder = ? AND fence = ? AND expires_at > {cutoff}",
    // Many renewals of one holder and ttl in one statement. Matched rows
    // (again CLIENT_FOUND_ROWS) equal to the number of leases means every
    // lease was renewed; otherwise `renewed_many` finds out which. The row
    // comparison `(name, fence) IN (..)` is a range scan of the primary key.
    renew_many: concat!(
        "UPDATE {table} SET expires_at = ",
        expiry!(),
        " WHERE holder = ? AND expires_at > {cutoff} AND (name, fence) IN ({list})"
    ),
    // Run right after a `renew_many` that matched fewer rows than leases: an
    // acquisition of ours that is live now was renewed by it (nothing else
    // renews it, and a newer acquisition would carry another fence).
    renewed_many: "SELECT name, fence FROM {table} \
                   WHERE holder = ? AND expires_at > {cutoff} AND (name, fence) IN ({list})",
    list_item: "(?, ?)",
    // The row of a lease, and the microseconds until another holder may
    // take it (the server's clock is constant within a statement).
    info: "SELECT holder, CAST(fence AS SIGNED), TIMESTAMPDIFF(MICROSECOND, {cutoff}, expires_at) \
           FROM {table} WHERE name = ?",
    // Every row, as `info` reads one.
    list: "SELECT name, holder, CAST(fence AS SIGNED), \
           TIMESTAMPDIFF(MICROSECOND, {cutoff}, expires_at) FROM {table} ORDER BY name",
    // An operator's release: the live row of the name, whoever holds it,
    // expired as `release` expires it (matched rows: CLIENT_FOUND_ROWS).
    force_release: "UPDATE {table} SET expires_at = {epoch} WHERE name = ? AND expires_at > {cutoff}",
};

/// Which clock an `expires_at` column is written and compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clock {
    /// `DATETIME`: no time zone; this crate writes and compares UTC
    /// (`UTC_TIMESTAMP(6)`), whatever the session's time zone.
    Utc,
    /// `TIMESTAMP`: an instant, converted from and to the session's time
    /// zone on every write and read; written and compared with the
    /// session's clock (`NOW(6)`), so both conversions use the same zone.
    /// Needs a session time zone with a fixed offset (checked).
    Session,
}

/// The statements' placeholders for an `expires_at` column of `clock`
/// whose values are `step` microseconds apart (`DATETIME(p)` keeps `p`
/// fractional digits, none by default).
///
/// MariaDB truncates a value to the column's precision, MySQL rounds it, so
/// a stored expiry may lie up to a step before the one its writer computed.
/// For a coarser column than microseconds, this crate therefore writes its
/// own expiries a step less a microsecond later (`{pad}`: truncated or
/// rounded, they never end before the ttl), and counts any lease as live
/// until a whole step after its stored expiry (`{cutoff}`: a lease written
/// by someone else at that precision never ends early either). For
/// microseconds both are nothing, and on a `DATETIME(6)` column the
/// statements are exactly the plain ones.
fn layout(clock: Clock, step: u32) -> Layout {
    let (now, epoch) = match clock {
        Clock::Utc => ("UTC_TIMESTAMP(6)", "'1970-01-01 00:00:01'"),
        // In the session's zone, which it is converted from.
        Clock::Session => ("NOW(6)", "FROM_UNIXTIME(1)"),
    };
    let (pad, cutoff) = if step <= 1 {
        (String::new(), "{now}".to_owned())
    } else {
        (
            format!(" + {}", step - 1),
            format!("TIMESTAMPADD(MICROSECOND, -{step}, {{now}})"),
        )
    };
    Layout(vec![
        ("{pad}", pad),
        ("{cutoff}", cutoff),
        ("{now}", now.to_owned()),
        ("{epoch}", epoch.to_owned()),
    ])
}

/// The columns of the table `?.?` (schema, or the connection's database
/// when NULL; table): name, type, fractional digits, whether it has a
/// default, may be NULL, and is unique on its own (a unique index of that
/// column alone, not a prefix of it); and the session's time zone, and the
/// system's (for `SYSTEM`). No rows: no such table.
const INSPECT: &str = "SELECT CAST(LOWER(c.COLUMN_NAME) AS CHAR), CAST(LOWER(c.DATA_TYPE) AS CHAR), \
     CAST(c.DATETIME_PRECISION AS SIGNED), CAST(c.COLUMN_DEFAULT IS NOT NULL AS SIGNED), \
     CAST(c.IS_NULLABLE = 'YES' AS SIGNED), CAST(EXISTS (SELECT 1 FROM information_schema.STATISTICS s \
     WHERE s.TABLE_SCHEMA = c.TABLE_SCHEMA AND s.TABLE_NAME = c.TABLE_NAME \
     AND s.COLUMN_NAME = c.COLUMN_NAME AND s.NON_UNIQUE = 0 AND s.SEQ_IN_INDEX = 1 \
     AND s.SUB_PART IS NULL AND NOT EXISTS (SELECT 1 FROM information_schema.STATISTICS s2 \
     WHERE s2.TABLE_SCHEMA = s.TABLE_SCHEMA AND s2.TABLE_NAME = s.TABLE_NAME \
     AND s2.INDEX_NAME = s.INDEX_NAME AND s2.SEQ_IN_INDEX > 1)) AS SIGNED), \
     CAST(@@session.time_zone AS CHAR), CAST(@@system_time_zone AS CHAR) \
     FROM information_schema.COLUMNS c \
     WHERE c.TABLE_SCHEMA = COALESCE(?, DATABASE()) AND c.TABLE_NAME = ?";

/// A session time zone without daylight saving time: a fixed offset such
/// as sqlx's default `+00:00`, or UTC by name, or `SYSTEM` when the
/// system's zone is UTC. (Any other named zone may have DST, and in the
/// hour its clocks go back a `TIMESTAMP` conversion is ambiguous.)
fn fixed_zone(session: &str, system: &str) -> bool {
    let utc = |zone: &str| {
        matches!(
            zone.to_ascii_uppercase().as_str(),
            "UTC" | "GMT" | "ETC/UTC" | "ETC/GMT" | "UCT" | "Z"
        )
    };
    let offset = |zone: &str| {
        let b = zone.as_bytes();
        let digits = |s: &[u8]| !s.is_empty() && s.len() <= 2 && s.iter().all(u8::is_ascii_digit);
        match b.split_first() {
            Some((b'+' | b'-', rest)) => match rest.iter().position(|&c| c == b':') {
                Some(colon) => {
                    digits(&rest[..colon])
                        && rest[colon + 1..].len() == 2
                        && digits(&rest[colon + 1..])
                }
                None => false,
            },
            _ => false,
        }
    };
    offset(session) || utc(session) || (session.eq_ignore_ascii_case("SYSTEM") && utc(system))
}

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
/// or with your own migration tool from [`MySqlTable::SCHEMA`]
/// (`migrations/mysql/0001_task_leases.sql` in the repository).
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
/// - **Column types.** The first call looks the table up in
///   `information_schema` (see [`Table`]); `expires_at` may be
///   - `DATETIME(p)` only in a table that is not shared with the Go services
///     (its `fence` has no default): it keeps no time zone, and this crate
///     writes and compares it in UTC (`UTC_TIMESTAMP(6)`), whatever the
///     session's time zone — but a Go service writes `NOW() + ttl`, in its
///     own session's time zone, which this crate cannot know. Refused with
///     [`Error::Schema`](crate::Error::Schema) in a shared table; convert it
///     with `ALTER TABLE task_leases MODIFY expires_at TIMESTAMP(6) NOT NULL`
///     in a session whose time_zone is the Go services'.
///   - `TIMESTAMP(p)`: an instant, converted from and to the session's time
///     zone on every write and read. This crate writes and compares it with
///     the session's clock (`NOW(6)`), so both conversions use the same zone,
///     and requires that zone to be a fixed offset (sqlx sets `+00:00` unless
///     told otherwise), or UTC: a zone with daylight saving time makes one
///     hour a year ambiguous. A Go service writing `NOW() + ttl` into it
///     stores the same instants whatever its zone (unless that zone has
///     daylight saving time, which makes its own leases wrong in that hour).
///
///   With fewer than 6 fractional digits (`DATETIME`, `TIMESTAMP`: none),
///   MariaDB truncates and MySQL rounds what is stored: this crate then
///   writes its expiries a step (less a microsecond) later, so they never end
///   before the ttl, and counts every lease as live until a step after its
///   stored expiry, so that a lease written by anyone else at that precision
///   (`NOW() + INTERVAL ..` of a Go service) never ends early either. A
///   takeover after a crash then waits up to one step (a second) longer.
///
///   In a table made for the Go services, `name` and `holder` are usually
///   text with a case-insensitive collation: both sides then compare them
///   that way, so holders must differ by more than case and trailing
///   spaces (the default holders, with their random suffix, do).
/// - **Transient failures.** InnoDB may report a deadlock (error 1213) or a
///   lock wait timeout (1205) when many replicas insert a new name at once;
///   such a statement was rolled back, and it is retried a few times with a
///   short random backoff before the error is returned.
///
/// - **Waiting** ([`Lease::acquire`](crate::Lease::acquire) with a wait,
///   an [`Election`](crate::Election)): MySQL cannot push a release, so
///   waiters poll, every `ttl/10` (at most 1 s, at least 10 ms) with ±20%
///   jitter: a release, or a crashed holder's expiry, is seen about one
///   poll later.
/// - **Inspect.** [`Backend::inspect`](crate::Backend::inspect) is one
///   `SELECT` of the row: its holder (the last one, once released or
///   expired), fence, and the time left by the server's clock (the clock
///   the statements use); for a coarse column, until the lease may be
///   taken (a step after its stored expiry). `Ok(None)` when there is no
///   row.
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
    const SCHEMA: &'static str = concat!(create_table!("task_leases"), ";\n");
    const CONCURRENT_BATCHES: bool = true;

    fn default_layout() -> Layout {
        layout(Clock::Utc, 1)
    }

    /// One query of `information_schema`; see [`MySqlTable`] for the rules.
    async fn inspect(t: &Table<Self>) -> Result<Layout, Error> {
        let (schema, name) = match t.table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, &*t.table),
        };
        type Row = (String, String, Option<i64>, i64, i64, i64, String, String);
        let rows: Vec<Row> = explain(
            &t.pool,
            sqlx::query_as(INSPECT)
                .bind(schema)
                .bind(name)
                .fetch_all(&t.pool)
                .await,
        )
        .await?;
        let zones = rows
            .first()
            .map(|r| (r.6.clone(), r.7.clone()))
            .unwrap_or_default();
        let columns: Vec<Column> = rows
            .into_iter()
            .map(
                |(name, kind, precision, has_default, nullable, unique, _, _)| Column {
                    name,
                    kind,
                    precision: precision.and_then(|p| u32::try_from(p).ok()),
                    has_default: has_default != 0,
                    nullable: nullable != 0,
                    unique: unique != 0,
                },
            )
            .collect();
        let table = &*t.table;
        let create = format!(
            "create it with ensure_schema(), or with `{}`",
            t.create.split_whitespace().collect::<Vec<_>>().join(" ")
        );
        let shape = shape(table, &columns, &["bigint", "int"], &t.add_fence, &create)?;
        let clock = clock_of(table, &shape, &zones)?;
        Ok(layout(clock, step_us(shape.expires_at.precision)))
    }

    plain_create!();

    async fn acquire(
        t: Ready<'_, Self>,
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
            .execute(t.pool)
            .await?;
        // 0: held by someone else. Fences start at 1, so 0 is never a fence.
        Ok(match done.last_insert_id() {
            0 => None,
            fence => Some(i64::try_from(fence).unwrap_or(-1)),
        })
    }

    async fn renew(
        t: Ready<'_, Self>,
        lease: Renewal<'_>,
        holder: &str,
    ) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(t.sql.renew.clone()))
            .bind(lease.ttl_ms)
            .bind(lease.name.as_bytes())
            .bind(holder.as_bytes())
            .bind(lease.fence)
            .execute(t.pool)
            .await?;
        // Matched rows, thanks to CLIENT_FOUND_ROWS (see the statement).
        Ok(done.rows_affected() == 1)
    }

    release_call!(as_bytes);

    async fn info(t: Ready<'_, Self>, name: &str) -> Result<Option<Info>, sqlx::Error> {
        let row: Option<(Vec<u8>, i64, Option<i64>)> =
            sqlx::query_as(AssertSqlSafe(t.sql.info.clone()))
                .bind(name.as_bytes())
                .fetch_optional(t.pool)
                .await?;
        Ok(row.map(|(holder, fence, left_us)| Info {
            holder: String::from_utf8_lossy(&holder).into_owned(),
            fence,
            left_us,
        }))
    }

    async fn list(t: Ready<'_, Self>) -> Result<Vec<(String, Info)>, sqlx::Error> {
        /// Name and holder (bytes), fence, microseconds left.
        type Row = (Vec<u8>, Vec<u8>, i64, Option<i64>);
        let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(t.sql.list.clone()))
            .fetch_all(t.pool)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(name, holder, fence, left_us)| {
                let info = Info {
                    holder: String::from_utf8_lossy(&holder).into_owned(),
                    fence,
                    left_us,
                };
                (String::from_utf8_lossy(&name).into_owned(), info)
            })
            .collect())
    }

    async fn force_release(t: Ready<'_, Self>, name: &str) -> Result<bool, sqlx::Error> {
        let done = sqlx::query(AssertSqlSafe(t.sql.force_release.clone()))
            .bind(name.as_bytes())
            .execute(t.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// One `UPDATE` per ttl (a `Lease` usually uses few), and a `SELECT`
    /// of the live leases only when some lease was not renewed.
    async fn renew_batch(
        t: Ready<'_, Self>,
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
    t: Ready<'_, MySqlDialect>,
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
        .execute(t.pool)
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
        .fetch_all(t.pool)
        .await?;
    let live: HashSet<(&[u8], i64)> = live.iter().map(|(n, f)| (n.as_slice(), *f)).collect();
    Ok(items
        .iter()
        .map(|&(name, fence)| fence.is_some_and(|f| live.contains(&(name, f))))
        .collect())
}

/// How `expires_at`'s type is read and written, or why the table cannot be
/// used: a column without a time zone shared with services that write it in
/// theirs, or a session zone with daylight saving time.
fn clock_of(table: &str, shape: &Shape<'_>, zones: &(String, String)) -> Result<Clock, Error> {
    let refuse = |problem: String, fix: String| Error::Schema {
        table: table.to_owned(),
        problem,
        fix,
    };
    match shape.expires_at.kind.as_str() {
        // Only this crate writes it: in UTC, whatever the session's zone.
        "datetime" if !shape.shared => Ok(Clock::Utc),
        "datetime" => Err(refuse(
            "its column expires_at is DATETIME, and the table is shared with services \
                 that insert rows without a fence (its column fence has a default): \
                 DATETIME keeps no time zone, they write `NOW() + ttl` into it in their \
                 session's time_zone, which this crate cannot know, while this crate \
                 writes UTC — unless both are UTC, one side sees the other's leases end \
                 hours early, and two replicas run the job at once"
                .to_owned(),
            format!(
                "make it TIMESTAMP, which stores instants, in a session whose time_zone \
                     is the one the Go services' sessions use (the server's default if \
                     they set none), so that the rows keep their meaning: `ALTER TABLE \
                     {table} MODIFY expires_at TIMESTAMP(6) NOT NULL`; or, if no service \
                     inserts rows without a fence, drop the default: `ALTER TABLE {table} \
                     ALTER COLUMN fence DROP DEFAULT`"
            ),
        )),
        "timestamp" if fixed_zone(&zones.0, &zones.1) => Ok(Clock::Session),
        "timestamp" => Err(refuse(
            format!(
                "its column expires_at is TIMESTAMP, which is converted through the \
                     session's time zone, and this pool's sessions use time_zone '{}' \
                     (system: '{}'), which may have daylight saving time: in the hour its \
                     clocks go back, a lease could end an hour early",
                zones.0, zones.1
            ),
            "connect with a fixed-offset time zone, as sqlx does unless told otherwise \
                 (MySqlConnectOptions::timezone, default '+00:00')"
                .to_owned(),
        )),
        other => Err(refuse(
            format!("its column expires_at is {other}; it must be DATETIME or TIMESTAMP"),
            "make it DATETIME(6) or TIMESTAMP(6)".to_owned(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LIST_SIZES, Statements};
    use super::*;

    fn statements(clock: Clock, step: u32) -> Statements {
        Statements::new(&TEMPLATES, "task_leases", &layout(clock, step))
    }

    #[test]
    fn acquire_binds_one_value_per_placeholder() {
        // name, holder, ttl; fence: holder x2; holder: holder x2; expires_at: holder, ttl
        assert_eq!(TEMPLATES.acquire.matches('?').count(), 9);
        assert_eq!(TEMPLATES.renew.matches('?').count(), 4);
        assert_eq!(TEMPLATES.release.matches('?').count(), 3);
        for s in [
            statements(Clock::Utc, 1),
            statements(Clock::Session, 1_000_000),
        ] {
            assert_eq!(s.acquire.matches('?').count(), 9);
            for (i, &n) in LIST_SIZES.iter().enumerate() {
                // ttl, holder, (name, fence) pairs
                assert_eq!(s.renew_many[i].matches('?').count(), 2 + 2 * n);
                assert_eq!(s.renewed_many[i].matches('?').count(), 1 + 2 * n);
            }
        }
    }

    /// On the table `ensure_schema` creates (`DATETIME(6)`), renew and
    /// release are the plain statements: the layout adds nothing.
    #[test]
    fn the_default_layout_adds_nothing() {
        let s = statements(Clock::Utc, 1);
        assert_eq!(
            &*s.renew,
            "UPDATE task_leases SET expires_at = TIMESTAMPADD(MICROSECOND, ? * 1000, UTC_TIMESTAMP(6)) \
             WHERE name = ? AND holder = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)"
        );
        assert_eq!(
            &*s.release,
            "UPDATE task_leases SET expires_at = '1970-01-01 00:00:01' \
             WHERE name = ? AND holder = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)"
        );
        assert_eq!(
            <MySqlDialect as sealed::Calls>::default_layout(),
            layout(Clock::Utc, 1)
        );
    }

    /// A `TIMESTAMP` (whole seconds) column: the session's clock, expiries
    /// padded by a step less a microsecond, leases live until a step after.
    #[test]
    fn a_coarse_timestamp_column_pads_and_waits_a_step() {
        let s = statements(Clock::Session, 1_000_000);
        assert_eq!(
            &*s.renew,
            "UPDATE task_leases SET expires_at = TIMESTAMPADD(MICROSECOND, ? * 1000 + 999999, NOW(6)) \
             WHERE name = ? AND holder = ? AND fence = ? \
             AND expires_at > TIMESTAMPADD(MICROSECOND, -1000000, NOW(6))"
        );
        assert!(s.release.contains("SET expires_at = FROM_UNIXTIME(1)"));
        assert!(!s.acquire.contains("UTC_TIMESTAMP"));
    }

    #[test]
    fn fixed_zones() {
        for (session, system) in [
            ("+00:00", "CET"),
            ("-05:30", ""),
            ("+5:00", ""),
            ("UTC", ""),
            ("SYSTEM", "UTC"),
            ("system", "utc"),
        ] {
            assert!(fixed_zone(session, system), "{session} {system}");
        }
        for (session, system) in [
            ("SYSTEM", "CET"),
            ("SYSTEM", "EST"),
            ("Europe/Berlin", "UTC"),
            ("+0000", ""),
            ("+00:0", ""),
            ("", ""),
        ] {
            assert!(!fixed_zone(session, system), "{session} {system}");
        }
    }
}
