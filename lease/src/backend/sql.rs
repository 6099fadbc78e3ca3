//! What the three table backends (`PgTable`, `MySqlTable`, `SqliteTable`) share:
//! the validated table name, the statements built from it once, and the
//! conversion of inputs to bind parameters.

use std::sync::Arc;
use std::time::Duration;

use crate::{Error, validate};

/// The table used by `X::new(pool)`.
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
pub(crate) fn list_size(n: usize) -> usize {
    LIST_SIZES
        .iter()
        .position(|&size| size >= n)
        .expect("BUG: a batch larger than RENEW_MANY_CHUNK")
}

/// SQL templates of one backend; `{table}` stands for the table name.
pub(crate) struct Templates {
    pub(crate) create: &'static str,
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
}

/// The statements of one table backend, built once from a validated table
/// name. Cloning is a few reference-count increments.
#[derive(Clone, Debug)]
pub(crate) struct Statements {
    pub(crate) table: Arc<str>,
    pub(crate) create: Arc<str>,
    pub(crate) acquire: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) release: Arc<str>,
    /// One per length in [`LIST_SIZES`], or a single statement.
    pub(crate) renew_many: Arc<[Arc<str>]>,
    /// Like `renew_many` (MySQL only, else empty).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) renewed_many: Arc<[Arc<str>]>,
}

impl Statements {
    /// Validates `table` (see [`validate::table`]) and fills it into `templates`.
    ///
    /// This is the only place where text that did not come from this crate's
    /// source is put into SQL, and it is an identifier of `[A-Za-z0-9_]` with at
    /// most one `.`: it cannot contain quotes, comments, whitespace or `;`.
    pub(crate) fn new(templates: &Templates, table: &str) -> Result<Self, Error> {
        validate::table(table)?;
        let fill = |template: &str| -> Arc<str> {
            debug_assert!(template.contains(TABLE), "BUG: a template without {TABLE}");
            template.replace(TABLE, table).into()
        };
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
        Ok(Self {
            table: table.into(),
            create: fill(templates.create),
            acquire: fill(templates.acquire),
            renew: fill(templates.renew),
            release: fill(templates.release),
            renew_many: lists(templates.renew_many),
            renewed_many: lists(templates.renewed_many),
        })
    }

    /// The statements for [`DEFAULT_TABLE`].
    pub(crate) fn default_table(templates: &Templates) -> Self {
        Self::new(templates, DEFAULT_TABLE).expect("BUG: the default table name is valid")
    }
}

/// Checks the inputs of a backend call the way the engine does, and returns
/// the ttl in whole milliseconds, the unit all three backends bind.
///
/// The engine validates before calling a backend, but the backends are public
/// and may be called directly; an over-long name must never be truncated by a
/// lenient server into a different (colliding) name, and a huge ttl must not
/// overflow the SQL arithmetic.
pub(crate) fn check(name: &str, holder: &str, ttl: Duration) -> Result<i64, Error> {
    validate::name(name)?;
    validate::holder(holder)?;
    ttl_ms(ttl)
}

/// Like [`check`], for calls without a ttl (`release`).
pub(crate) fn check_no_ttl(name: &str, holder: &str) -> Result<(), Error> {
    validate::name(name)?;
    validate::holder(holder)
}

/// `r`, with the reason a connection could not be opened when sqlx hides it.
///
/// A pool retries a refused connection until its `acquire_timeout` and then
/// reports only `PoolTimedOut`. When that happens while the pool has no
/// connection open, one connection attempt (bounded by `CONNECT_TIMEOUT`)
/// finds out why, and its error is returned instead: the log then reads
/// "connection refused", "password authentication failed", ... This costs
/// nothing on the paths that work.
pub(crate) async fn explain<T, DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    r: Result<T, sqlx::Error>,
) -> Result<T, Error> {
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
    match r {
        Err(sqlx::Error::PoolTimedOut) if pool.size() == 0 && !pool.is_closed() => {
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

/// A valid ttl (10 ms ..= 24 h, whole ms) as integer milliseconds.
pub(crate) fn ttl_ms(ttl: Duration) -> Result<i64, Error> {
    validate::ttl(ttl)?;
    // At most 86_400_000, so the conversion cannot fail.
    Ok(i64::try_from(ttl.as_millis()).expect("BUG: a valid ttl fits in i64 milliseconds"))
}

/// A fencing token read back from the `fence` column (`MySqlTable` reads it
/// as an unsigned "last insert id" instead).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) fn fence(fence: i64) -> Result<u64, Error> {
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
        acquire: "ACQUIRE {table} {table}",
        renew: "RENEW {table}",
        release: "RELEASE {table}",
        renew_many: "MANY {table} IN ({list})",
        renewed_many: "",
        list_item: "(?, ?)",
    };

    #[test]
    fn batch_statements_are_built_per_list_size() {
        let s = Statements::new(&T, "t").expect("valid");
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
        let s = Statements::new(&arrays, "t").expect("valid");
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
    fn statements_are_filled_with_the_validated_table() {
        let s = Statements::new(&T, "my_schema.leases").expect("valid");
        assert_eq!(&*s.table, "my_schema.leases");
        assert_eq!(&*s.create, "CREATE my_schema.leases");
        assert_eq!(&*s.acquire, "ACQUIRE my_schema.leases my_schema.leases");
        assert_eq!(&*s.renew, "RENEW my_schema.leases");
        assert_eq!(&*s.release, "RELEASE my_schema.leases");
        assert_eq!(&*Statements::default_table(&T).table, "task_leases");
    }

    #[test]
    fn invalid_tables_are_rejected() {
        for bad in ["leases; drop table x", "a b", "`x`", "x--", "a.b.c", ""] {
            assert!(
                matches!(Statements::new(&T, bad), Err(Error::InvalidTable { ref table }) if table == bad),
                "{bad}"
            );
        }
    }

    #[test]
    fn inputs_are_checked() {
        let ms = |ms| Duration::from_millis(ms);
        assert_eq!(check("n", "h", ms(10)).ok(), Some(10));
        assert_eq!(check("n", "h", ms(86_400_000)).ok(), Some(86_400_000));
        assert!(matches!(
            check("n", "h", ms(9)),
            Err(Error::InvalidTtl { .. })
        ));
        assert!(matches!(
            check("n", "h", Duration::MAX),
            Err(Error::InvalidTtl { .. })
        ));
        assert!(matches!(
            check("", "h", ms(10)),
            Err(Error::InvalidName { len: 0 })
        ));
        assert!(matches!(
            check(&"x".repeat(256), "h", ms(10)),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            check_no_ttl("n", ""),
            Err(Error::InvalidHolder { len: 0 })
        ));
        assert!(check_no_ttl(&"x".repeat(255), &"y".repeat(255)).is_ok());
    }

    #[test]
    #[cfg(any(feature = "postgres", feature = "sqlite"))]
    fn fences_must_be_positive() {
        assert_eq!(fence(1).ok(), Some(1));
        assert_eq!(fence(i64::MAX).ok(), Some(i64::MAX as u64));
        assert!(matches!(fence(0), Err(Error::Protocol(_))));
        assert!(matches!(fence(-1), Err(Error::Protocol(_))));
    }
}
