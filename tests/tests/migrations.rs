//! The DDL a user of the published crate gets — `PgTable::SCHEMA`,
//! `MySqlTable::SCHEMA`, `SqliteTable::SCHEMA`, `schema()`,
//! `fence_migration()`, `PgAdvisory::FENCE_SCHEMA` and `fence_schema()` —
//! is exactly the text of the files in `migrations/`, which the README
//! tells users to run: a table `ensure_schema` creates has the columns of a
//! table the files made, one after the other. (That the `ALTER TABLE`s an
//! `Error::Schema` names are the lines of the files is checked in
//! `sql_backends/`.) The files lie outside the `leasehold` package, so
//! this check lives in the repository's harness, not in the crate. No
//! server is needed: the pools are lazy and never connect.

use leasehold::backend::{MySqlTable, PgAdvisory, PgTable, SqliteTable};

const PG: &str = include_str!("../../migrations/postgres/0001_task_leases.sql");
const PG_FENCES: &str = include_str!("../../migrations/postgres/0002_lease_fences.sql");
const PG_COLUMNS: &str = include_str!("../../migrations/postgres/0003_add_last_slot_and_value.sql");
const MYSQL: &str = include_str!("../../migrations/mysql/0001_task_leases.sql");
const MYSQL_COLUMNS: &str = include_str!("../../migrations/mysql/0002_add_last_slot_and_value.sql");
const SQLITE: &str = include_str!("../../migrations/sqlite/0001_task_leases.sql");
const SQLITE_COLUMNS: &str =
    include_str!("../../migrations/sqlite/0002_add_last_slot_and_value.sql");
const PG_FENCE: &str = include_str!("../../migrations/from-go/postgres/0001_add_fence.sql");
const MYSQL_FENCE: &str = include_str!("../../migrations/from-go/mysql/0001_add_fence.sql");

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

/// `create` (a `CREATE TABLE` file, one column a line) with the columns
/// that the `ALTER TABLE .. ADD COLUMN [IF NOT EXISTS] ..;` lines of
/// `alters` add, in their order and words.
fn migrated(create: &str, alters: &str) -> String {
    let (head, tail) = create.rsplit_once("\n)").expect("a CREATE TABLE");
    let added: String = alters
        .lines()
        .map(|line| {
            let (_, column) = line.split_once(" ADD COLUMN ").expect("an ADD COLUMN");
            let column = column.strip_prefix("IF NOT EXISTS ").unwrap_or(column);
            format!(",\n    {}", column.strip_suffix(';').expect("a statement"))
        })
        .collect();
    format!("{head}{added}\n){tail}")
}

#[test]
fn schema_constants_are_the_migration_files() {
    assert_eq!(PgTable::SCHEMA, migrated(PG, PG_COLUMNS));
    assert_eq!(MySqlTable::SCHEMA, migrated(MYSQL, MYSQL_COLUMNS));
    assert_eq!(SqliteTable::SCHEMA, migrated(SQLITE, SQLITE_COLUMNS));
    assert_eq!(PgAdvisory::FENCE_SCHEMA, PG_FENCES);
}

/// `PgAdvisory`'s fence table: `lease_fences` is the file; another table
/// the same statement with its name; none without fencing.
#[tokio::test]
async fn the_fence_table_of_lease_fences_is_the_migration_file() -> Result {
    let advisory = PgAdvisory::new(sqlx::PgPool::connect_lazy(
        "postgres://unused@127.0.0.1:9/none",
    )?);
    assert_eq!(advisory.fence_schema(), None);
    assert_eq!(advisory.fence_table(), None);
    let fenced = advisory.clone().with_fencing("lease_fences")?;
    assert_eq!(fenced.fence_table(), Some("lease_fences"));
    assert_eq!(
        fenced.fence_schema().map(|s| format!("{s};\n")),
        Some(PG_FENCES.to_owned())
    );
    let other = advisory.with_fencing("jobs.fences")?;
    assert_eq!(
        other.fence_schema(),
        Some(
            &*PG_FENCES
                .trim_end_matches(";\n")
                .replace(" lease_fences ", " jobs.fences ")
        )
    );
    Ok(())
}

/// The statements of a backend on the default table are the files (the
/// files end with `;` and a newline, the statements do not); on another
/// table, the same statements with that table's name.
#[tokio::test]
async fn statements_of_the_default_table_are_the_migration_files() -> Result {
    let pg = PgTable::new(sqlx::PgPool::connect_lazy(
        "postgres://unused@127.0.0.1:9/none",
    )?);
    let mysql = MySqlTable::new(sqlx::MySqlPool::connect_lazy(
        "mysql://unused@127.0.0.1:9/none",
    )?);
    let sqlite = SqliteTable::new(sqlx::SqlitePool::connect_lazy("sqlite::memory:")?);

    assert_eq!(format!("{};\n", pg.schema()), PgTable::SCHEMA);
    assert_eq!(format!("{};\n", mysql.schema()), MySqlTable::SCHEMA);
    assert_eq!(format!("{};\n", sqlite.schema()), SqliteTable::SCHEMA);
    assert_eq!(format!("{};\n", pg.fence_migration()), PG_FENCE);
    assert_eq!(format!("{};\n", mysql.fence_migration()), MYSQL_FENCE);

    let renamed = |file: &str| {
        file.trim_end_matches(";\n")
            .replace(" task_leases ", " jobs.leases ")
    };
    let pg = pg.with_table("jobs.leases")?;
    assert_eq!(pg.schema(), renamed(PgTable::SCHEMA));
    assert_eq!(pg.fence_migration(), renamed(PG_FENCE));
    let mysql = mysql.with_table("jobs.leases")?;
    assert_eq!(mysql.schema(), renamed(MySqlTable::SCHEMA));
    let sqlite = sqlite.with_table("jobs.leases")?;
    assert_eq!(sqlite.schema(), renamed(SqliteTable::SCHEMA));
    Ok(())
}
