//! The column rules of every dialect, read from its catalog.

use super::OptionalColumns;
use crate::Error;

/// A column of a lease table, as the server's catalog describes it.
#[derive(Debug, Clone, Default)]
pub(super) struct Column {
    /// The name, in lower case.
    pub(super) name: String,
    /// The type's name, in lower case (`timestamptz`, `datetime`, `bigint`, ...).
    pub(super) kind: String,
    /// Fractional-second digits, for a time column.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(super) precision: Option<u32>,
    pub(super) has_default: bool,
    pub(super) nullable: bool,
    /// A unique index (or the primary key) is on this column alone.
    pub(super) unique: bool,
}

/// What a dialect needs to know of a table that [`shape`] accepted.
#[derive(Debug)]
pub(super) struct Shape<'a> {
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(super) expires_at: &'a Column,
    /// Shared with services that insert rows without a fence (the Go
    /// services): the `fence` column has a default.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(super) shared: bool,
    /// Which of `last_slot` and `value` it has.
    pub(super) columns: OptionalColumns,
}

/// The rules that do not depend on the dialect: the table exists; it has
/// `name` (unique on its own), `holder`, `expires_at` and `fence` (one of
/// `integers`, NOT NULL); and maybe `last_slot` and `value`. `add_fence`
/// and `create` are the fixes.
pub(super) fn shape<'a>(
    table: &str,
    columns: &'a [Column],
    integers: &[&str],
    add_fence: &str,
    create: &str,
) -> Result<Shape<'a>, Error> {
    let refuse = |problem: &str, fix: &str| Err(refused(table, problem, fix));
    let lease_table = "give the backend a lease table, with the columns name, holder, \
                       expires_at and fence (with_table names another one)";
    let column = |name: &str| columns.iter().find(|c| c.name == name);
    let Some(expires_at) = column("expires_at") else {
        if columns.is_empty() {
            let create = create.split_whitespace().collect::<Vec<_>>().join(" ");
            return refuse(
                "the table does not exist (or this connection's user cannot see it)",
                &format!("create it with ensure_schema(), or with `{create}`"),
            );
        }
        return refuse("it has no column expires_at", lease_table);
    };
    match (column("name"), column("holder"), column("fence")) {
        (None, ..) => refuse("it has no column name", lease_table),
        (_, None, _) => refuse("it has no column holder", lease_table),
        (_, _, None) => refuse(
            "it has no column fence, which holds the fencing counter of each lease name \
             (a table made for the Go services has only name, holder and expires_at)",
            &format!("add it with `{add_fence}`"),
        ),
        (_, _, Some(fence)) if !integers.contains(&fence.kind.as_str()) || fence.nullable => {
            let null = if fence.nullable { " NULL" } else { "" };
            let kind = &fence.kind;
            refuse(
                &format!("its column fence is {kind}{null}; it must be an integer NOT NULL"),
                "make it BIGINT NOT NULL DEFAULT 0",
            )
        }
        (Some(name), ..) if !name.unique => refuse(
            "its column name is not unique on its own (the primary key): two rows of one \
             lease name would be two leases",
            &format!("make name the primary key: ALTER TABLE {table} ADD PRIMARY KEY (name)"),
        ),
        (_, _, Some(fence)) => Ok(Shape {
            expires_at,
            shared: fence.has_default,
            columns: OptionalColumns {
                last_slot: column("last_slot").is_some(),
                value: column("value").is_some(),
            },
        }),
    }
}

/// [`Error::Schema`] for `table`.
pub(super) fn refused(table: &str, problem: &str, fix: &str) -> Error {
    let (table, problem, fix) = (table.to_owned(), problem.to_owned(), fix.to_owned());
    Error::Schema {
        table,
        problem,
        fix,
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// `expires_at` is `kind`, without a time zone, in a shared table
/// ([`Shape::shared`]); `convert` makes it hold instants.
pub(super) fn zoneless_in_shared(table: &str, kind: &str, convert: &str) -> Error {
    refused(
        table,
        &format!(
            "its column expires_at is {kind}, without a time zone, and the table is shared \
             with services that insert rows without a fence (its column fence has a \
             default): they write `now() + ttl` into it in their session's time zone, which \
             this crate cannot know, so one side could see the other's leases end hours \
             early or late, and two replicas run the job at once"
        ),
        &format!(
            "convert it, in a session whose time zone is the Go services' (the server's \
             default if they set none): `{convert}`; or, if no service inserts rows without \
             a fence, drop the default: `ALTER TABLE {table} ALTER COLUMN fence DROP DEFAULT`"
        ),
    )
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// The step between two values of a time column of `precision`
/// fractional digits, in microseconds (1 for 6 digits, 1,000,000 for none).
pub(super) fn step_us(precision: Option<u32>) -> u32 {
    10u32.pow(6 - precision.unwrap_or(6).min(6))
}
