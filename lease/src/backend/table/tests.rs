//! Unit tests of the table backends' statements and helpers.

use super::*;

#[test]
#[cfg(any(feature = "mysql", feature = "sqlite"))]
fn batches_are_padded_to_the_next_list_size() {
    let sizes = [1, 3, 512, 513, MAX_BATCH].map(list_size);
    assert_eq!(sizes, [0, 2, 9, 10, 10]);
}

/// `schema()`, `fence_migration()` and the fixes of a table without
/// `last_slot` and `value` are the migrations on the table (that they
/// are the files in `migrations/` is checked by
/// `tests/tests/migrations.rs` and `sql_backends/`: the package holds
/// no file outside it).
#[test]
fn migrations_name_the_table_once() {
    fn check<D: Dialect>() {
        for migration in [D::SCHEMA, D::ADD_FENCE, D::ADD_LAST_SLOT, D::ADD_VALUE] {
            let statement = migration_for(migration, "jobs.leases");
            assert_eq!(statement.matches("jobs.leases").count(), 1, "{statement}");
            assert!(!statement.contains(DEFAULT_TABLE), "{statement}");
            let default = migration_for(migration, DEFAULT_TABLE);
            assert_eq!(format!("{default};\n"), migration);
        }
    }
    #[cfg(feature = "postgres")]
    check::<PgDialect>();
    #[cfg(feature = "mysql")]
    check::<MySqlDialect>();
    #[cfg(feature = "sqlite")]
    check::<SqliteDialect>();
}

#[test]
fn fences_must_be_positive() {
    assert_eq!(fence_token(1).ok(), Some(1));
    assert_eq!(fence_token(i64::MAX).ok(), Some(i64::MAX as u64));
    assert!(matches!(fence_token(0), Err(Error::Protocol(_))));
    assert!(matches!(fence_token(-1), Err(Error::Protocol(_))));
    assert_eq!(fence_param(Some(u64::MAX)), None);
    assert_eq!(fence_param(Some(7)), Some(7));
}

/// What an `acquire_with` statement read and did, as the caller learns it.
#[test]
fn answers_say_granted_already_ran_or_held() {
    let answer = |fence, slot, last_slot, others_left_us| {
        let answer = TableAnswer {
            fence,
            slot,
            last_slot,
            others_left_us,
        };
        answer.acquired().expect("valid")
    };
    let granted = Grant::new(Some(3)).with_slot(9, Some(7));
    assert_eq!(
        answer(Some(3), Some(9), Some(7), None),
        Acquired::Granted(granted)
    );
    assert_eq!(
        answer(Some(1), None, None, None),
        Acquired::Granted(Grant::new(Some(1)))
    );
    // The slot first, whoever holds the lease.
    let ran = Acquired::AlreadyRan { slot: 9 };
    assert_eq!(answer(None, Some(9), Some(9), Some(5)), ran);
    let held = |expires_in| Acquired::HeldElsewhere { expires_in };
    let left = Some(Duration::from_micros(5));
    assert_eq!(answer(None, Some(9), Some(8), Some(5)), held(left));
    assert_eq!(answer(None, None, None, Some(-5)), held(None));
}

mod shapes {
    use super::super::*;

    /// The Go services' table and a fence, with changes: whether it is
    /// shared, and which optional columns it has.
    fn check(change: impl FnOnce(&mut Vec<Column>)) -> Result<(bool, OptionalColumns), String> {
        let column = |name: &str, kind: &str| Column {
            name: name.to_owned(),
            kind: kind.to_owned(),
            unique: name == "name",
            ..Column::default()
        };
        let mut columns = vec![
            column("name", "text"),
            column("holder", "text"),
            column("expires_at", "timestamptz"),
            column("fence", "int8"),
        ];
        change(&mut columns);
        match shape("t", &columns, &["int8"], "ADD FENCE", "CREATE") {
            Ok(shape) => Ok((shape.shared, shape.columns)),
            Err(e @ Error::Schema { .. }) => Err(e.to_string()),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_table_with_a_fence_fits_and_its_default_says_it_is_shared() {
        let plain = OptionalColumns::default();
        assert_eq!(check(|_| ()), Ok((false, plain)));
        assert_eq!(check(|c| c[3].has_default = true), Ok((true, plain)));
        let value = |c: &mut Vec<Column>| {
            c.push(Column {
                name: "value".into(),
                ..Column::default()
            })
        };
        assert_eq!(check(value), Ok((false, OptionalColumns::VALUE)));
    }

    #[test]
    fn unusable_tables_are_refused_with_their_fix() {
        let refused = |change: fn(&mut Vec<Column>), problem: &str, fix: &str| {
            let error = check(change).expect_err(problem);
            assert!(
                error.starts_with("lease table t cannot be used: "),
                "{error}"
            );
            assert!(error.contains(problem) && error.contains(fix), "{error}");
        };
        refused(|c| c.truncate(3), "it has no column fence", "`ADD FENCE`");
        refused(|c| c.clear(), "does not exist", "`CREATE`");
        refused(|c| drop(c.remove(1)), "no column holder", "with_table");
        refused(|c| c[3].nullable = true, "fence is int8 NULL", "NOT NULL");
        refused(|c| c[3].kind = "text".into(), "fence is text", "BIGINT");
        refused(|c| c[0].unique = false, "not unique", "PRIMARY KEY (name)");
    }

    #[test]
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn steps_follow_the_precision() {
        let steps = [None, Some(6), Some(3), Some(0)].map(step_us);
        assert_eq!(steps, [1, 1, 1_000, 1_000_000]);
    }
}
