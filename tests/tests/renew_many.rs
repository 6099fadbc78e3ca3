//! `Backend::renew_many` of every backend that overrides it (PgTable,
//! MySqlTable, SqliteTable, Redis), against real servers: one batch mixes
//! live, expired, stolen, released, superseded and never-existing names,
//! and each lease must learn for itself whether it was renewed.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use lease::backend::{MySqlTable, PgTable, Redis, SqliteTable};
use lease::{Acquisition, Backend};
use lease_tests::{TempDb, unique};

const LONG: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(300);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Acquire `name` for `holder`; its fencing token.
async fn acquired(b: &impl Backend, name: &str, holder: &str, ttl: Duration) -> Option<u64> {
    b.acquire(name, holder, ttl)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{holder} could not acquire {name}"))
        .fencing_token
}

/// The mixed batch: which acquisitions are current and live must come back
/// `true`, in order, and only those must be extended; nothing is inserted.
async fn each_lease_learns_its_own_fate(b: impl Backend + Clone) {
    let holder = unique("holder");
    let thief = unique("thief");
    let name = |what: &str| unique(&format!("renew-many-{what}"));
    let (live, live_short, other_ttl) = (name("live"), name("live-short"), name("other-ttl"));
    let (expired, stolen, released, never, superseded) = (
        name("expired"),
        name("stolen"),
        name("released"),
        name("never"),
        name("superseded"),
    );
    let f_live = acquired(&b, &live, &holder, LONG).await;
    let f_live_short = acquired(&b, &live_short, &holder, SHORT * 2).await;
    let f_other_ttl = acquired(&b, &other_ttl, &holder, LONG).await;
    let f_expired = acquired(&b, &expired, &holder, ms(50)).await;
    let f_stolen = acquired(&b, &stolen, &holder, ms(50)).await;
    let f_released = acquired(&b, &released, &holder, LONG).await;
    b.release(Acquisition::new(&released, &holder, f_released))
        .await
        .unwrap();
    // An older acquisition of a name the same holder holds again.
    let f_old = acquired(&b, &superseded, &holder, LONG).await;
    b.release(Acquisition::new(&superseded, &holder, f_old))
        .await
        .unwrap();
    let f_new = acquired(&b, &superseded, &holder, LONG).await;
    tokio::time::sleep(ms(200)).await; // `expired` and `stolen` expire
    acquired(&b, &stolen, &thief, LONG).await;

    let batch = [
        (Acquisition::new(&live, &holder, f_live), LONG),
        (Acquisition::new(&expired, &holder, f_expired), LONG),
        (Acquisition::new(&live_short, &holder, f_live_short), LONG),
        (Acquisition::new(&stolen, &holder, f_stolen), LONG),
        (Acquisition::new(&never, &holder, f_live), LONG),
        (
            Acquisition::new(&other_ttl, &holder, f_other_ttl),
            ms(20_000),
        ),
        (Acquisition::new(&released, &holder, f_released), LONG),
        (Acquisition::new(&superseded, &holder, f_old), LONG),
    ];
    let expected = [true, false, true, false, false, true, false, false];
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed, expected);
    // The newer acquisition is still the current one.
    assert!(
        b.renew(Acquisition::new(&superseded, &holder, f_new), LONG)
            .await
            .unwrap()
    );

    // `live_short` was extended past its first ttl.
    tokio::time::sleep(SHORT * 2 + ms(200)).await;
    assert!(
        b.acquire(&live_short, &thief, LONG)
            .await
            .unwrap()
            .is_none(),
        "renew_many must have extended the lease"
    );
    // Nothing was renewed for the thief or inserted for us.
    assert!(b.acquire(&stolen, &holder, LONG).await.unwrap().is_none());
    acquired(&b, &never, &thief, LONG).await;
    acquired(&b, &expired, &thief, LONG).await;
    acquired(&b, &released, &thief, LONG).await;
    // The holder's answers stay per lease on the next batch too.
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed, expected);
    assert_eq!(b.renew_many(&[]).await.unwrap(), Vec::<bool>::new());
    // All ours and live (MySQL answers from the matched-row count alone).
    let all_ours = [
        (Acquisition::new(&live, &holder, f_live), LONG),
        (Acquisition::new(&other_ttl, &holder, f_other_ttl), LONG),
    ];
    assert_eq!(b.renew_many(&all_ours).await.unwrap(), [true, true]);
}

/// More leases than one statement (or script) takes: 2,345 leases, every
/// seventh taken over by another holder, every eleventh never acquired.
async fn a_batch_larger_than_a_chunk(b: impl Backend + Clone) {
    let holder = unique("holder");
    let thief = unique("thief");
    let prefix = unique("renew-many-big");
    let names: Vec<String> = (0..2345).map(|i| format!("{prefix}-{i}")).collect();
    let expected: Vec<bool> = (0..names.len())
        .map(|i| i % 7 != 3 && i % 11 != 5)
        .collect();
    let fences = futures_util::future::join_all(names.iter().enumerate().map(|(i, name)| {
        let (b, holder, thief) = (&b, &holder, &thief);
        async move {
            if i % 11 == 5 {
                return Some(1);
            }
            if i % 7 == 3 {
                acquired(b, name, thief, LONG).await
            } else {
                acquired(b, name, holder, LONG).await
            }
        }
    }))
    .await;
    let batch: Vec<(Acquisition<'_>, Duration)> = names
        .iter()
        .zip(fences)
        .map(|(n, f)| (Acquisition::new(n, &holder, f), LONG))
        .collect();
    let renewed = b.renew_many(&batch).await.unwrap();
    assert_eq!(renewed.len(), names.len());
    let wrong: Vec<usize> = (0..names.len())
        .filter(|&i| renewed[i] != expected[i])
        .collect();
    assert!(wrong.is_empty(), "wrong answers at {wrong:?}");
}

macro_rules! for_backend {
    ($module:ident, $make:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn each_lease_learns_its_own_fate() {
                let Some((b, _keep)) = $make.await else {
                    return;
                };
                super::each_lease_learns_its_own_fate(b).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_batch_larger_than_a_chunk() {
                let Some((b, _keep)) = $make.await else {
                    return;
                };
                super::a_batch_larger_than_a_chunk(b).await;
            }
        }
    };
}

async fn pg() -> Option<(PgTable, ())> {
    let table = PgTable::new(lease_tests::postgres().await?);
    table.ensure_schema().await.unwrap();
    Some((table, ()))
}

async fn mysql() -> Option<(MySqlTable, ())> {
    let table = MySqlTable::new(lease_tests::mysql().await?);
    table.ensure_schema().await.unwrap();
    Some((table, ()))
}

async fn sqlite() -> Option<(SqliteTable, TempDb)> {
    let db = TempDb::new("lease-renew-many");
    let table = SqliteTable::open(db.path()).await.unwrap();
    Some((table, db))
}

async fn redis() -> Option<(Redis, ())> {
    Some((Redis::new(lease_tests::redis().await?), ()))
}

for_backend!(pg_table, pg());
for_backend!(mysql_table, mysql());
for_backend!(sqlite_table, sqlite());
for_backend!(redis_backend, redis());
