//! The statements of a table: its dialect's templates, filled in for the
//! table's name, time column and optional columns.

use std::sync::Arc;

use super::MAX_BATCH;

/// A dialect's statements, with `{table}` for the table name and the
/// placeholders its [`Layout`] fills in. The core fills in those of the
/// optional columns: `{value}` and `{last_slot}` (the column, or `NULL`
/// when the table lacks it) and `{clear_value}` (`, value = NULL`, or
/// nothing).
pub(super) struct Templates {
    pub(super) acquire: &'static str,
    /// An acquisition with a slot or a value (it needs both columns).
    /// MySQL's and SQLite's are a script of three statements, with the
    /// values written in ([`script`](super::script)).
    pub(super) acquire_with: &'static str,
    pub(super) release: &'static str,
    pub(super) release_ran: &'static str,
    pub(super) publish: &'static str,
    /// Empty the holder of the live row of the name bound (lock delay).
    pub(super) force_release: &'static str,
    /// Expire the live row of the name bound, whoever holds it.
    pub(super) force_release_now: &'static str,
    /// Name, holder, fence, the microseconds until another holder may take
    /// the lease, value and last slot: of the name bound (`info`), of every
    /// row (`list`).
    pub(super) info: &'static str,
    pub(super) list: &'static str,
    /// With a `list_item`, `{list}` stands for one per lease, and a
    /// statement is built per length in [`LIST_SIZES`].
    pub(super) renew_many: &'static str,
    /// The renewal of one lease, by its name (PostgreSQL and MySQL; empty
    /// for SQLite, whose `renew_many` renews one lease too).
    pub(super) renew: &'static str,
    /// MySQL only (else empty): which of a batch's leases are ours and live.
    pub(super) renewed_many: &'static str,
    pub(super) list_item: &'static str,
    /// The database's name if the acquisition bound holds the lease, which
    /// is then locked until the transaction ends.
    pub(super) check_in: &'static str,
}

/// The SQL for each placeholder of a dialect's templates, chosen from the
/// table's time column: which clock, and for a coarse column how expiries
/// are padded and liveness judged; and which optional columns it has.
/// Every value comes from this crate.
#[derive(Debug)]
pub(super) struct Layout {
    pub(super) fills: Vec<(&'static str, String)>,
    pub(super) columns: OptionalColumns,
}

/// The columns a table may lack and still serve plain leases.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct OptionalColumns {
    pub(super) last_slot: bool,
    pub(super) value: bool,
}

impl OptionalColumns {
    pub(super) const VALUE: Self = Self {
        last_slot: false,
        value: true,
    };
    pub(super) const BOTH: Self = Self {
        last_slot: true,
        value: true,
    };

    pub(super) fn has(self, needs: Self) -> bool {
        (self.last_slot || !needs.last_slot) && (self.value || !needs.value)
    }
}

/// `template` with `table` and `layout` filled in. The table name is the
/// only text not from this crate, and it was validated ([`validate::table`](crate::validate::table)):
/// no quote, comment, `;` or placeholder.
fn fill(template: &str, table: &str, layout: &Layout) -> Arc<str> {
    let column = |has: bool, sql: &str, or: &str| if has { sql } else { or }.to_owned();
    let OptionalColumns { last_slot, value } = layout.columns;
    let optional = [
        ("{value}", column(value, "value", "NULL")),
        ("{last_slot}", column(last_slot, "last_slot", "NULL")),
        ("{clear_value}", column(value, ", value = NULL", "")),
    ];
    let mut sql = template.replace("{table}", table);
    for (placeholder, fill) in layout.fills.iter().chain(&optional) {
        sql = sql.replace(placeholder, fill);
    }
    debug_assert!(!sql.contains('{'), "BUG: a placeholder left in {sql}");
    sql.into()
}

/// The statements of one table: its dialect's [`Templates`], filled.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) acquire: Arc<str>,
    pub(super) acquire_with: Arc<str>,
    pub(super) release: Arc<str>,
    pub(super) release_ran: Arc<str>,
    pub(super) publish: Arc<str>,
    pub(super) force_release: Arc<str>,
    pub(super) force_release_now: Arc<str>,
    pub(super) info: Arc<str>,
    pub(super) list: Arc<str>,
    /// One per length in [`LIST_SIZES`], or a single statement.
    pub(super) renew_many: Vec<Arc<str>>,
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(super) renew: Arc<str>,
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(super) renewed_many: Vec<Arc<str>>,
    pub(super) check_in: Arc<str>,
    pub(super) columns: OptionalColumns,
}

impl Statements {
    pub(super) fn new(templates: &Templates, table: &str, layout: &Layout) -> Self {
        let fill = |template: &str| fill(template, table, layout);
        let lists = |template: &str| match (template, templates.list_item) {
            ("", _) => Vec::new(),
            (template, "") => vec![fill(template)],
            (template, item) => LIST_SIZES
                .iter()
                .map(|&n| fill(&template.replace("{list}", &vec![item; n].join(", "))))
                .collect(),
        };
        Self {
            acquire: fill(templates.acquire),
            acquire_with: fill(templates.acquire_with),
            release: fill(templates.release),
            release_ran: fill(templates.release_ran),
            publish: fill(templates.publish),
            force_release: fill(templates.force_release),
            force_release_now: fill(templates.force_release_now),
            info: fill(templates.info),
            list: fill(templates.list),
            renew_many: lists(templates.renew_many),
            renew: fill(templates.renew),
            renewed_many: lists(templates.renewed_many),
            check_in: fill(templates.check_in),
            columns: layout.columns,
        }
    }
}

/// The statements of a table once checked ([`Table::ready_for`](super::Table::ready_for)), and the
/// lock that lets one call at a time check it.
#[derive(Default)]
pub(super) struct Checked {
    pub(super) statements: std::sync::RwLock<Option<Arc<Statements>>>,
    pub(super) checking: tokio::sync::Mutex<()>,
}

impl Checked {
    pub(super) fn current(&self) -> Option<Arc<Statements>> {
        // Written whole under the lock: a poisoned lock is still consistent.
        self.statements
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The list lengths of the batched statements: a batch is padded to the
/// next one by repeating its last lease, so that a connection prepares at
/// most 11 variants of the statement.
pub(super) const LIST_SIZES: [usize; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, MAX_BATCH];

/// The index in [`LIST_SIZES`] of the shortest list that takes `n` leases.
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(super) fn list_size(n: usize) -> usize {
    LIST_SIZES
        .iter()
        .position(|&size| size >= n)
        .expect("BUG: a batch larger than MAX_BATCH")
}
