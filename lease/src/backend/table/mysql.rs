//! The MySQL / MariaDB dialect of the table backend: [`MySqlTable`].

use std::collections::HashSet;
use std::sync::Arc;

use sqlx::mysql::MySqlDatabaseError;
use sqlx::{AssertSqlSafe, MySql};

use super::{
    Column, Dialect, LIST_SIZES, Layout, OptionalColumns, Ready, RowChange, Shape, Table,
    TableAnswer, TableRenewal, TableRequest, Templates, explain, hex, lease_info, list_size,
    refused, script, sealed, shape, step_us, zoneless_in_shared,
};
use crate::{Error, LeaseInfo};

/// `migrations/mysql/0001_task_leases.sql` with the columns of
/// `0002_add_last_slot_and_value.sql`: [`MYSQL_ADD_LAST_SLOT`],
/// [`MYSQL_ADD_VALUE`] (a value is at most 4 KiB of UTF-8, stored as bytes
/// as names and holders are).
const MYSQL_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS task_leases (
    name VARBINARY(255) NOT NULL PRIMARY KEY,
    holder VARBINARY(255) NOT NULL,
    expires_at DATETIME(6) NOT NULL,
    fence BIGINT NOT NULL,
    last_slot BIGINT NULL,
    value VARBINARY(4096) NULL
) ENGINE=InnoDB;
";

const MYSQL_ADD_LAST_SLOT: &str = "ALTER TABLE task_leases ADD COLUMN last_slot BIGINT NULL;\n";
const MYSQL_ADD_VALUE: &str = "ALTER TABLE task_leases ADD COLUMN value VARBINARY(4096) NULL;\n";

/// `migrations/from-go/mysql/0001_add_fence.sql` (MySQL 8 has no `ADD
/// COLUMN IF NOT EXISTS`).
const MYSQL_ADD_FENCE: &str =
    "ALTER TABLE task_leases ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;\n";

// `{now}` is the server's clock, constant within a statement (its start):
// `UTC_TIMESTAMP(6)` for a `DATETIME` column, `NOW(6)` for a `TIMESTAMP`.
// `{cutoff}` is the instant before which a lease has ended (`{now}`, or a
// step earlier for a coarse column); `{pad}` is added to the microseconds
// of the expiries written. See `layout`.
//
// sqlx always sets CLIENT_FOUND_ROWS: "affected rows" of an UPDATE is the
// number of rows *matched*, and says nothing of an INSERT .. ON DUPLICATE
// KEY UPDATE.
const MYSQL_SQL: Templates = Templates {
    // One statement, no RETURNING: the fence comes back as the OK packet's
    // "last insert id", set with LAST_INSERT_ID(expr). A new row inserts
    // fence 1. On a duplicate key `fence` is assigned first (assignments
    // run left to right and see earlier ones), while `holder` and
    // `expires_at` are still the old row's: if the row is acquirable
    // (expired, or ours), the new fence (kept for our own live lease unless
    // it is 0, a row the Go services inserted; else + 1) is stored and is
    // the last insert id; otherwise the fence stays and the id is 0.
    // `holder`, then `expires_at`, change under the same condition, which
    // reads the same once `holder` is ours. GREATEST: `{now}` is the
    // statement's start, before any wait for the row's lock, and a late
    // attempt of ours must not cut the lease we acquired since (as in pg.rs).
    // Values are bound again instead of VALUES(col) (deprecated in MySQL 8)
    // or a row alias (not in MariaDB). `{clear_value_of_ours}` is last: once
    // `holder` is assigned, it is ours iff the row was acquired.
    acquire: "INSERT INTO {table} (name, holder, expires_at, fence) \
              VALUES (?, ?, TIMESTAMPADD(MICROSECOND, ? * 1000{pad}, {now}), LAST_INSERT_ID(1)) \
              ON DUPLICATE KEY UPDATE \
              fence = IF(expires_at <= {cutoff} OR holder = ?, LAST_INSERT_ID(\
              IF(expires_at > {cutoff} AND holder = ? AND fence > 0, fence, fence + 1)), \
              fence + LAST_INSERT_ID(0)), \
              holder = IF(expires_at <= {cutoff} OR holder = ?, ?, holder), \
              expires_at = IF(expires_at <= {cutoff} OR holder = ?, \
              GREATEST(expires_at, TIMESTAMPADD(MICROSECOND, ? * 1000{pad}, {now})), expires_at){clear_value_of_ours}",
    // With a slot or a value: a script of three statements with its values
    // written in (see `MySqlTable::acquire_with`), since MySQL has no
    // RETURNING and an OK packet carries one number (the last insert id).
    // 1. The slot by the server's clock in UTC (UNIX_TIMESTAMP would
    //    convert from the session's time zone), and the slot recorded
    //    before, for the log of missed slots.
    // 2. The decision, as in `acquire`, refusing a slot at or below the
    //    recorded one: the fence, or 0, becomes the last insert id.
    //    `last_slot` is assigned last, and kept when the slot is not
    //    recorded now (retry_failed, or no slot); `value` after `holder` and
    //    `expires_at`, while the condition reads as it did.
    // 3. What it did: the last insert id, the slot, the slot recorded
    //    before; for a refusal the row as it is now (a recorded slot never
    //    goes back: if it is at or above ours, our slot has run).
    acquire_with: "SET @leasehold_slot = TIMESTAMPDIFF(MICROSECOND, '1970-01-01', \
                   UTC_TIMESTAMP(6)) DIV (:period * 1000), @leasehold_last = \
                   (SELECT CAST(last_slot AS SIGNED) FROM {table} WHERE name = :name); \
                   INSERT INTO {table} (name, holder, expires_at, fence, last_slot, value) \
                   VALUES (:name, :holder, TIMESTAMPADD(MICROSECOND, :ttl * 1000{pad}, {now}), \
                   LAST_INSERT_ID(1), IF(:retry, NULL, @leasehold_slot), :value) \
                   ON DUPLICATE KEY UPDATE \
                   fence = IF((expires_at <= {cutoff} OR holder = :holder) AND COALESCE(last_slot < @leasehold_slot, TRUE), LAST_INSERT_ID(\
                   IF(expires_at > {cutoff} AND holder = :holder AND fence > 0, fence, fence + 1)), \
                   fence + LAST_INSERT_ID(0)), \
                   holder = IF((expires_at <= {cutoff} OR holder = :holder) AND COALESCE(last_slot < @leasehold_slot, TRUE), :holder, holder), \
                   expires_at = IF((expires_at <= {cutoff} OR holder = :holder) AND COALESCE(last_slot < @leasehold_slot, TRUE), \
                   GREATEST(expires_at, TIMESTAMPADD(MICROSECOND, :ttl * 1000{pad}, {now})), expires_at), \
                   value = IF((expires_at <= {cutoff} OR holder = :holder) AND COALESCE(last_slot < @leasehold_slot, TRUE), :value, value), \
                   last_slot = IF((expires_at <= {cutoff} OR holder = :holder) AND COALESCE(last_slot < @leasehold_slot, TRUE), \
                   COALESCE(IF(:retry, NULL, @leasehold_slot), last_slot), last_slot); \
                   SELECT CAST(LAST_INSERT_ID() AS SIGNED), CAST(@leasehold_slot AS SIGNED), \
                   CAST(@leasehold_last AS SIGNED), CAST(l.last_slot AS SIGNED), \
                   IF(l.holder <> :holder, TIMESTAMPDIFF(MICROSECOND, {cutoff}, l.expires_at), NULL) \
                   FROM (SELECT 1) AS d LEFT JOIN {table} AS l ON l.name = :name",
    // `{now}` is the statement's start: a renewal sent before the release
    // and blocked on its row lock would still see an expiry of "the
    // release's now" as live. At the epoch (1970-01-01 00:00:01 UTC, the
    // smallest TIMESTAMP; in a DATETIME column some hours around it), a
    // released row is expired for every statement, whenever it started.
    release: "UPDATE {table} SET expires_at = FROM_UNIXTIME(1){clear_value} \
              WHERE name = ? AND holder = ? AND fence = ? AND expires_at > {cutoff}",
    // The slot recorded whoever has the row; the release only if it is
    // still this acquisition's (`value` is assigned before `expires_at`,
    // whose old value both conditions read).
    release_ran: "UPDATE {table} SET \
                  value = IF(holder = ? AND fence = ? AND expires_at > {cutoff}, NULL, value), \
                  expires_at = IF(holder = ? AND fence = ? AND expires_at > {cutoff}, \
                  FROM_UNIXTIME(1), expires_at), \
                  last_slot = GREATEST(COALESCE(last_slot, ?), ?) \
                  WHERE name = ?",
    publish: "UPDATE {table} SET value = ? \
              WHERE name = ? AND holder = ? AND fence = ? AND expires_at > {cutoff}",
    force_release: "UPDATE {table} SET holder = ''{clear_value} \
                    WHERE name = ? AND holder <> '' AND expires_at > {cutoff}",
    force_release_now: "UPDATE {table} SET expires_at = FROM_UNIXTIME(1){clear_value} \
                        WHERE name = ? AND expires_at > {cutoff}",
    info: "SELECT name, holder, CAST(fence AS SIGNED), \
           TIMESTAMPDIFF(MICROSECOND, {cutoff}, expires_at), {value}, CAST({last_slot} AS SIGNED) \
           FROM {table} WHERE name = ?",
    list: "SELECT name, holder, CAST(fence AS SIGNED), \
           TIMESTAMPDIFF(MICROSECOND, {cutoff}, expires_at), {value}, CAST({last_slot} AS SIGNED) \
           FROM {table} ORDER BY name",
    // One holder and ttl. Rows matched equal to the number of leases: every
    // lease was renewed; otherwise `renewed_many` finds out which. The row
    // comparison `(name, fence) IN (..)`, of two or more, is a range scan of
    // the primary key.
    // `{now}` is the statement's start, before any row-lock wait: GREATEST
    // keeps a later expiry (`a_late_renewal_never_moves_the_expiry_earlier`).
    renew_many: "UPDATE {table} \
                 SET expires_at = GREATEST(expires_at, TIMESTAMPADD(MICROSECOND, ? * 1000{pad}, {now})) \
                 WHERE holder = ? AND expires_at > {cutoff} AND (name, fence) IN ({list})",
    // One lease: by its name. MariaDB scans the whole index for an
    // `UPDATE` whose `(name, fence) IN (..)` has a single element
    // (`mysql_a_renewal_of_one_lease_reads_one_row`). Rows matched: 1 if
    // renewed.
    renew: "UPDATE {table} \
            SET expires_at = GREATEST(expires_at, TIMESTAMPADD(MICROSECOND, ? * 1000{pad}, {now})) \
            WHERE name = ? AND fence = ? AND holder = ? AND expires_at > {cutoff}",
    // Right after such a `renew_many`: an acquisition of ours that is live
    // now was renewed by it (nothing else renews it, and a newer
    // acquisition would carry another fence).
    renewed_many: "SELECT name, fence FROM {table} \
                   WHERE holder = ? AND expires_at > {cutoff} AND (name, fence) IN ({list})",
    list_item: "(?, ?)",
    // A share lock on the row, which the acquisitions' and renewals' row
    // locks wait for (InnoDB). `{now}` is the statement's start, before
    // any wait for a renewal's lock; the lease cannot pass on meanwhile.
    check_in: "SELECT COALESCE(DATABASE(), '') FROM {table} \
               WHERE name = ? AND holder = ? AND fence = ? AND expires_at > {cutoff} \
               LOCK IN SHARE MODE",
};

/// The placeholders for an `expires_at` read with the clock `now` whose
/// values are `step` microseconds apart. MariaDB truncates a value to the
/// column's precision, MySQL rounds it: for a coarser column than
/// microseconds, this crate's expiries are a step less a microsecond later
/// (`{pad}`), and a lease is live until a step after its stored expiry
/// (`{cutoff}`), so that none ends early, whoever wrote it (a Go service's
/// `NOW() + INTERVAL ..` has whole seconds).
fn layout(now: &'static str, step: u32, columns: OptionalColumns) -> Layout {
    let (pad, cutoff) = match step {
        0 | 1 => (String::new(), now.to_owned()),
        step => (
            format!(" + {}", step - 1),
            format!("TIMESTAMPADD(MICROSECOND, -{step}, {now})"),
        ),
    };
    let clear = if columns.value {
        ", value = IF(holder = ?, NULL, value)"
    } else {
        ""
    };
    let fills = vec![
        ("{clear_value_of_ours}", clear.to_owned()),
        ("{pad}", pad),
        ("{cutoff}", cutoff),
        ("{now}", now.to_owned()),
    ];
    Layout { fills, columns }
}

/// The columns of the table `?.?` (schema, or the connection's database;
/// table): name, type, fractional digits, a default, NULL allowed, unique on
/// its own (a unique index of the whole column alone); the session's time
/// zone, and the system's (for `SYSTEM`). No rows: no table.
const MYSQL_COLUMNS: &str = "SELECT CAST(LOWER(c.COLUMN_NAME) AS CHAR), \
     CAST(LOWER(c.DATA_TYPE) AS CHAR), CAST(c.DATETIME_PRECISION AS SIGNED), \
     CAST(c.COLUMN_DEFAULT IS NOT NULL AS SIGNED), CAST(c.IS_NULLABLE = 'YES' AS SIGNED), \
     CAST(EXISTS (SELECT 1 FROM information_schema.STATISTICS s \
     WHERE s.TABLE_SCHEMA = c.TABLE_SCHEMA AND s.TABLE_NAME = c.TABLE_NAME \
     AND s.COLUMN_NAME = c.COLUMN_NAME AND s.NON_UNIQUE = 0 AND s.SEQ_IN_INDEX = 1 \
     AND s.SUB_PART IS NULL AND NOT EXISTS (SELECT 1 FROM information_schema.STATISTICS s2 \
     WHERE s2.TABLE_SCHEMA = s.TABLE_SCHEMA AND s2.TABLE_NAME = s.TABLE_NAME \
     AND s2.INDEX_NAME = s.INDEX_NAME AND s2.SEQ_IN_INDEX > 1)) AS SIGNED), \
     CAST(@@session.time_zone AS CHAR), CAST(@@system_time_zone AS CHAR) \
     FROM information_schema.COLUMNS c \
     WHERE c.TABLE_SCHEMA = COALESCE(?, DATABASE()) AND c.TABLE_NAME = ?";

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
/// | `holder` | `VARBINARY(255) NOT NULL` | who holds (or last held) the lease; empty once force-released |
/// | `expires_at` | `DATETIME(6) NOT NULL` | when the lease ends, in UTC |
/// | `fence` | `BIGINT NOT NULL` | the fencing counter of the name |
/// | `last_slot` | `BIGINT NULL` | the last schedule slot claimed ([`Job::once_per`](crate::Job::once_per)) |
/// | `value` | `VARBINARY(4096) NULL` | what the holder published ([`Election::proclaim`](crate::Election::proclaim)) |
///
/// Names and holders are binary strings, compared byte for byte: with a text
/// collation `"job"`, `"JOB"`, `"jöb"` and `"job "` could all be one lease.
/// Create the table with [`ensure_schema`](Table::ensure_schema), or from
/// [`MySqlTable::SCHEMA`].
///
/// - **Clock.** A lease is live while `expires_at > UTC_TIMESTAMP(6)`.
/// - **Column types.** `expires_at` may be `DATETIME(p)` in a table not
///   shared with the Go services (see [`Table`]; they write `NOW() + ttl`
///   in their session's time zone, so a shared one is refused with
///   [`Error::Schema`](crate::Error::Schema)). Or it may be `TIMESTAMP(p)`,
///   compared with the session's clock (`NOW(6)`), if the session's time
///   zone is a fixed offset (sqlx sets `+00:00`) or UTC; a zone with
///   daylight saving time is refused. With fewer than 6 fractional digits,
///   a takeover after a crash may wait up to a second longer: rounding
///   never ends a lease early. In a table made for the Go services, `name`
///   and `holder` are usually text with a case-insensitive collation:
///   holders must then differ by more than case and trailing spaces (the
///   default holders do).
/// - **Transient failures.** An InnoDB deadlock (1213) or lock wait timeout
///   (1205), which many replicas inserting a new name at once can cause,
///   rolls the statement back. It is run again after a short random pause,
///   up to 6 times in all.
/// - **Waiting.** MySQL cannot push a release: waiters poll
///   ([`Lease::acquire`](crate::Lease::acquire)).
///
/// For what every table backend does, see [`Table`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use leasehold::{Acquisition, Backend, backend::MySqlTable};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), leasehold::Error> {
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

/// The MySQL / MariaDB [`Dialect`] of [`MySqlTable`].
#[derive(Debug, Clone, Copy)]
pub enum MySqlDialect {}

impl Dialect for MySqlDialect {}

// Sealed: the calls use the crate's own types.
#[allow(private_interfaces)]
impl sealed::SqlDialect for MySqlDialect {
    type Database = MySql;
    const NAME: &'static str = "MySqlTable";
    const SCHEMA: &'static str = MYSQL_SCHEMA;
    const ADD_FENCE: &'static str = MYSQL_ADD_FENCE;
    const ADD_LAST_SLOT: &'static str = MYSQL_ADD_LAST_SLOT;
    const ADD_VALUE: &'static str = MYSQL_ADD_VALUE;
    const TEMPLATES: Templates = MYSQL_SQL;
    const ONE_TTL_PER_BATCH: bool = true;

    async fn inspect(t: &Table<Self>) -> Result<Layout, Error> {
        type MySqlColumnRow = (String, String, Option<i64>, i64, i64, i64, String, String);
        let (schema, name) = match t.table.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, &*t.table),
        };
        let query = sqlx::query_as(MYSQL_COLUMNS).bind(schema).bind(name);
        let rows: Vec<MySqlColumnRow> = explain(&t.pool, query.fetch_all(&t.pool).await).await?;
        let zones = rows.first().map(|r| (r.6.clone(), r.7.clone()));
        let columns: Vec<Column> = rows
            .into_iter()
            .map(
                |(name, kind, precision, default, nullable, unique, ..)| Column {
                    name,
                    kind,
                    precision: precision.and_then(|p| u32::try_from(p).ok()),
                    has_default: default != 0,
                    nullable: nullable != 0,
                    unique: unique != 0,
                },
            )
            .collect();
        let integers = ["bigint", "int"];
        let shape = shape(&t.table, &columns, &integers, &t.add_fence, &t.create)?;
        let now = clock_of(&t.table, &shape, &zones.unwrap_or_default())?;
        Ok(layout(
            now,
            step_us(shape.expires_at.precision),
            shape.columns,
        ))
    }

    /// MySQL serialises concurrent `CREATE TABLE IF NOT EXISTS` itself.
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
        let holder = holder.as_bytes();
        let query = sqlx::query(AssertSqlSafe(t.sql.acquire.clone()))
            // VALUES (name, holder, expiry)
            .bind(name.as_bytes())
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
            .bind(ttl_ms);
        // value = IF(ours now, NULL, ..)
        let query = if t.sql.columns.value {
            query.bind(holder)
        } else {
            query
        };
        let done = query.execute(t.pool).await?;
        // 0: held by someone else. Fences start at 1, so 0 is never a fence.
        Ok(match done.last_insert_id() {
            0 => None,
            fence => Some(i64::try_from(fence).unwrap_or(-1)),
        })
    }

    /// One request: the script `acquire_with`, with this request's values
    /// written in (binary strings as hex literals, numbers).
    async fn acquire_with(
        t: &Ready<'_, Self>,
        c: &TableRequest<'_>,
    ) -> Result<TableAnswer, sqlx::Error> {
        let script = script(&t.sql.acquire_with, c, None, |bytes| {
            format!("X'{}'", hex(bytes))
        });
        let rows = sqlx::raw_sql(AssertSqlSafe(script))
            .fetch_all(t.pool)
            .await?;
        let row = rows.last().ok_or(sqlx::Error::RowNotFound)?;
        let (fence, slot, before, after, others_left_us): (i64, _, _, _, _) =
            sqlx::FromRow::from_row(row)?;
        let fence = (fence > 0).then_some(fence);
        Ok(TableAnswer {
            fence,
            slot,
            last_slot: if fence.is_some() { before } else { after },
            others_left_us,
        })
    }

    /// One `UPDATE`, and a `SELECT` of the live leases when some, not all,
    /// were renewed.
    async fn renew_batch(
        t: &Ready<'_, Self>,
        holder: &str,
        leases: &[TableRenewal<'_>],
    ) -> Result<Vec<bool>, sqlx::Error> {
        if let [one] = leases {
            let done = sqlx::query(AssertSqlSafe(t.sql.renew.clone()))
                .bind(one.ttl_ms)
                .bind(one.name.as_bytes())
                .bind(one.fence)
                .bind(holder.as_bytes())
                .execute(t.pool)
                .await?;
            return Ok(vec![done.rows_affected() == 1]);
        }
        let (size, holder) = (list_size(leases.len()), holder.as_bytes());
        let last = leases[leases.len() - 1];
        // The list, padded to its size by repeating the last lease.
        let list = || {
            let pad = std::iter::repeat_n(&last, LIST_SIZES[size] - leases.len());
            leases
                .iter()
                .chain(pad)
                .map(|l| (l.name.as_bytes(), l.fence))
        };
        let update = sqlx::query(AssertSqlSafe(t.sql.renew_many[size].clone()))
            .bind(last.ttl_ms)
            .bind(holder);
        let done = list()
            .fold(update, |q, (name, fence)| q.bind(name).bind(fence))
            .execute(t.pool)
            .await?;
        let distinct: HashSet<(&str, Option<i64>)> =
            leases.iter().map(|l| (l.name, l.fence)).collect();
        let live: HashSet<(Vec<u8>, i64)> = match done.rows_affected() {
            0 => HashSet::new(),
            n if n == distinct.len() as u64 => return Ok(vec![true; leases.len()]),
            _ => {
                let select = sqlx::query_as(AssertSqlSafe(t.sql.renewed_many[size].clone()));
                let select = list().fold(select.bind(holder), |q, (n, f)| q.bind(n).bind(f));
                select.fetch_all(t.pool).await?.into_iter().collect()
            }
        };
        let renewed = |l: &TableRenewal<'_>| {
            l.fence
                .is_some_and(|f| live.contains(&(l.name.as_bytes().to_vec(), f)))
        };
        Ok(leases.iter().map(renewed).collect())
    }

    /// The binds in the order of each statement's `?`s.
    async fn change(
        t: &Ready<'_, Self>,
        name: &str,
        change: RowChange<'_>,
    ) -> Result<bool, sqlx::Error> {
        let on = |sql: &Arc<str>| sqlx::query(AssertSqlSafe(sql.clone()));
        let name = name.as_bytes();
        let query = match change {
            RowChange::Release(holder, fence) => on(&t.sql.release)
                .bind(name)
                .bind(holder.as_bytes())
                .bind(fence),
            RowChange::ReleaseRan(holder, fence, slot) => on(&t.sql.release_ran)
                .bind(holder.as_bytes())
                .bind(fence)
                .bind(holder.as_bytes())
                .bind(fence)
                .bind(slot)
                .bind(slot)
                .bind(name),
            RowChange::Publish(holder, fence, value) => on(&t.sql.publish)
                .bind(value.map(str::as_bytes))
                .bind(name)
                .bind(holder.as_bytes())
                .bind(fence),
            RowChange::Evict => on(&t.sql.force_release).bind(name),
            RowChange::EvictNow => on(&t.sql.force_release_now).bind(name),
        };
        Ok(query.execute(t.pool).await?.rows_affected() == 1)
    }

    async fn rows(t: &Ready<'_, Self>, name: Option<&str>) -> Result<Vec<LeaseInfo>, sqlx::Error> {
        let query = match name {
            Some(name) => sqlx::query_as(AssertSqlSafe(t.sql.info.clone())).bind(name.as_bytes()),
            None => sqlx::query_as(AssertSqlSafe(t.sql.list.clone())),
        };
        /// Name and holder (bytes), fence, microseconds left, value (bytes), last slot.
        type MySqlLeaseRow = (
            Vec<u8>,
            Vec<u8>,
            i64,
            Option<i64>,
            Option<Vec<u8>>,
            Option<i64>,
        );
        let rows: Vec<MySqlLeaseRow> = query.fetch_all(t.pool).await?;
        let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
        Ok(rows
            .into_iter()
            .map(|(name, holder, fence, left_us, value, slot)| {
                lease_info((
                    text(name),
                    text(holder),
                    fence,
                    left_us,
                    value.map(text),
                    slot,
                ))
            })
            .collect())
    }

    /// The database named in the pool's options, for a table not qualified
    /// with one.
    fn database(t: &Table<Self>) -> Option<String> {
        let options = t.pool.connect_options();
        let database = options.get_database().filter(|_| !t.table.contains('.'));
        database.map(str::to_owned)
    }

    /// InnoDB deadlock (1213) or lock wait timeout (1205): the server rolled
    /// the statement back.
    fn is_transient(e: &sqlx::Error) -> bool {
        let sqlx::Error::Database(e) = e else {
            return false;
        };
        e.try_downcast_ref::<MySqlDatabaseError>()
            .is_some_and(|e| matches!(e.number(), 1205 | 1213))
    }
}

impl super::CheckIn for sqlx::MySqlConnection {}

impl sealed::CheckInConnection for sqlx::MySqlConnection {
    type Dialect = MySqlDialect;

    async fn check_in(
        &mut self,
        sql: &str,
        name: &str,
        holder: &str,
        fence: Option<i64>,
    ) -> Result<Option<String>, sqlx::Error> {
        let query = sqlx::query_scalar(AssertSqlSafe(sql));
        let query = query
            .bind(name.as_bytes())
            .bind(holder.as_bytes())
            .bind(fence);
        query.fetch_optional(self).await
    }
}

/// The clock `expires_at` is written and compared with, or why the table
/// cannot be used: a column without a time zone shared with services that
/// write it in theirs, or a session zone with daylight saving time.
fn clock_of(
    table: &str,
    shape: &Shape<'_>,
    zones: &(String, String),
) -> Result<&'static str, Error> {
    match shape.expires_at.kind.as_str() {
        // Only this crate writes it: in UTC, whatever the session's zone.
        "datetime" if !shape.shared => Ok("UTC_TIMESTAMP(6)"),
        "datetime" => Err(zoneless_in_shared(
            table,
            "DATETIME",
            &format!("ALTER TABLE {table} MODIFY expires_at TIMESTAMP(6) NOT NULL"),
        )),
        // Converted from and to the session's zone on every write and read:
        // written with the session's clock, both conversions use one zone.
        "timestamp" if fixed_zone(&zones.0, &zones.1) => Ok("NOW(6)"),
        "timestamp" => Err(refused(
            table,
            &format!(
                "its column expires_at is TIMESTAMP, which is converted through the session's \
                 time zone, and this pool's sessions use time_zone '{}' (system: '{}'), which \
                 may have daylight saving time: in the hour its clocks go back, a lease could \
                 end an hour early",
                zones.0, zones.1
            ),
            "connect with a fixed-offset time zone, as sqlx does unless told otherwise \
             (MySqlConnectOptions::timezone, default '+00:00')",
        )),
        other => Err(refused(
            table,
            &format!("its column expires_at is {other}; it must be DATETIME or TIMESTAMP"),
            "make it DATETIME(6) or TIMESTAMP(6)",
        )),
    }
}

/// A session time zone without daylight saving time: a fixed offset such
/// as sqlx's default `+00:00`, or UTC by name, or `SYSTEM` when the
/// system's zone is UTC. (Any other named zone may have DST.)
fn fixed_zone(session: &str, system: &str) -> bool {
    let utc = |zone: &str| {
        let zone = zone.to_ascii_uppercase();
        ["UTC", "GMT", "ETC/UTC", "ETC/GMT", "UCT", "Z"].contains(&zone.as_str())
    };
    let digits = |s: &str| (1..=2).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    let offset = session
        .strip_prefix(['+', '-'])
        .and_then(|rest| rest.split_once(':'))
        .is_some_and(|(h, m)| digits(h) && m.len() == 2 && digits(m));
    offset || utc(session) || (session.eq_ignore_ascii_case("SYSTEM") && utc(system))
}

#[cfg(test)]
mod tests {
    use super::super::Statements;
    use super::*;

    /// On the table `ensure_schema` creates (`DATETIME(6)`) the statements
    /// are the plain ones; on a `TIMESTAMP` (whole seconds) they use the
    /// session's clock, pad expiries by a step less a microsecond, and count
    /// leases live a step longer.
    #[test]
    fn the_layout_follows_the_column() {
        let plain = OptionalColumns::default();
        let utc = layout("UTC_TIMESTAMP(6)", 1, plain);
        let s = Statements::new(&MYSQL_SQL, "task_leases", &utc);
        assert_eq!(
            &*s.release,
            "UPDATE task_leases SET expires_at = FROM_UNIXTIME(1) \
             WHERE name = ? AND holder = ? AND fence = ? AND expires_at > UTC_TIMESTAMP(6)"
        );
        let s = Statements::new(&MYSQL_SQL, "t", &layout("NOW(6)", 1_000_000, plain));
        assert!(s.renew_many[0].starts_with(
            "UPDATE t \
             SET expires_at = GREATEST(expires_at, TIMESTAMPADD(MICROSECOND, ? * 1000 + 999999, NOW(6))) \
             WHERE holder = ? AND expires_at > TIMESTAMPADD(MICROSECOND, -1000000, NOW(6))"
        ));
        assert!(!s.acquire.contains("UTC_TIMESTAMP"));
        let lists = s.renew_many.iter().chain(&s.renewed_many);
        assert!(
            lists
                .zip(LIST_SIZES.iter().cycle())
                .all(|(s, &n)| s.matches("(?, ?)").count() == n)
        );
        // name, holder, ttl; fence: holder x2; holder: holder x2; expires_at: holder, ttl
        assert_eq!(s.acquire.matches('?').count(), 9);
        // value: holder, on a table with the column
        let with_value = layout("NOW(6)", 1, OptionalColumns::BOTH);
        let s = Statements::new(&MYSQL_SQL, "t", &with_value);
        assert_eq!(s.acquire.matches('?').count(), 10);
    }

    #[test]
    fn fixed_zones() {
        let fixed = [
            ("+00:00", "CET"),
            ("-05:30", ""),
            ("+5:00", ""),
            ("UTC", ""),
        ];
        for (session, system) in fixed
            .into_iter()
            .chain([("SYSTEM", "UTC"), ("system", "utc")])
        {
            assert!(fixed_zone(session, system), "{session} {system}");
        }
        let named = [
            ("SYSTEM", "CET"),
            ("SYSTEM", "EST"),
            ("Europe/Berlin", "UTC"),
        ];
        for (session, system) in named
            .into_iter()
            .chain([("+0000", ""), ("+00:0", ""), ("", "")])
        {
            assert!(!fixed_zone(session, system), "{session} {system}");
        }
    }
}
