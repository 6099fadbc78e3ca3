//! `PgAdvisory::with_fencing`: tokens that increase across holders, no
//! bump on a refused attempt, kept by re-acquires and heartbeats; a bad
//! fence table is an error.

use lease_tests::unique;
use leasehold::backend::PgAdvisory;
use leasehold::{Acquisition, Backend, Lease};
use sqlx::postgres::{PgAdvisoryLock, PgPoolOptions};
use sqlx::{Either, PgPool};

use super::pg_advisory::pg_lockers;
use super::{eventually, ms};

/// A `PgAdvisory` with fencing on the table `lease_fences` (each test uses
/// names of its own), which it creates if need be.
async fn pg_fenced(pool: PgPool) -> PgAdvisory {
    let backend = PgAdvisory::new(pool)
        .with_fencing("lease_fences")
        .expect("a valid table name");
    backend.ensure_schema().await.expect("ensure_schema");
    backend
}

/// The counter of `name` in `lease_fences`, `None` before its first
/// granted acquisition.
async fn pg_fence_row(observer: &PgPool, name: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT fence FROM lease_fences WHERE name = $1")
        .bind(name)
        .fetch_optional(observer)
        .await
        .expect("read lease_fences")
}

/// Two processes (two backends, two pools) taking turns: every acquisition
/// gets a larger token than the last, starting at 1, and the token is the
/// name's counter in the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_fenced_tokens_increase_across_holders() {
    let (Some(pool_a), Some(pool_b), Some(observer)) = (
        lease_tests::postgres().await,
        lease_tests::postgres().await,
        lease_tests::postgres().await,
    ) else {
        return;
    };
    let backends = [pg_fenced(pool_a).await, pg_fenced(pool_b).await];
    let pods = [
        Lease::with_holder(backends[0].clone(), "pod-a"),
        Lease::with_holder(backends[1].clone(), "pod-b"),
    ];
    let name = unique("pg-fenced-increase");
    let mut last = 0;
    for i in 0..6 {
        let guard = pods[i % 2]
            .try_acquire(&name, ms(2000))
            .await
            .expect("acquire")
            .expect("free");
        let token = guard
            .fencing_token()
            .expect("a fenced acquisition has a token");
        if i == 0 {
            assert_eq!(token, 1, "a name's first acquisition");
        }
        assert!(token > last, "acquisition {i}: token {token} after {last}");
        assert_eq!(pg_fence_row(&observer, &name).await, Some(token as i64));
        // Asked of the other process.
        let info = backends[1 - i % 2]
            .inspect(&name)
            .await
            .expect("inspect")
            .expect("held");
        assert_eq!(info.fencing_token, Some(token), "inspect shows the token");
        last = token;
        guard.release().await.expect("release");
    }
}

/// Attempts that find the lock held — through `Lease` and directly, and by
/// a process that locks without fencing — bump nothing: the next granted
/// acquisition gets exactly the next token. (With the insert's `WHERE
/// granted` gone, the data-modifying CTE would bump on every attempt.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_fenced_refused_attempt_does_not_bump() {
    let (Some(pool), Some(observer)) =
        (lease_tests::postgres().await, lease_tests::postgres().await)
    else {
        return;
    };
    let backend = pg_fenced(pool.clone()).await;
    let name = unique("pg-fenced-refused");
    assert_eq!(pg_fence_row(&observer, &name).await, None);
    let held = Lease::with_holder(backend.clone(), "pod-a")
        .try_acquire(&name, ms(2000))
        .await
        .expect("acquire")
        .expect("free");
    let token = held.fencing_token().expect("a token");
    let pod_b = Lease::with_holder(backend.clone(), "pod-b");
    for _ in 0..3 {
        assert!(
            pod_b
                .try_acquire(&name, ms(2000))
                .await
                .expect("acquire")
                .is_none()
        );
        assert!(
            backend
                .acquire(&name, "pod-c", ms(2000))
                .await
                .expect("acquire")
                .is_none()
        );
    }
    assert_eq!(
        pg_fence_row(&observer, &name).await,
        Some(token as i64),
        "a refused attempt bumped the counter"
    );
    held.release().await.expect("release");

    // A lock taken without fencing (sqlx's own `PgAdvisoryLock`) refuses
    // the fenced attempts too, and they leave the counter alone.
    let conn = observer.acquire().await.expect("connection");
    let sqlx_guard = match PgAdvisoryLock::new(&name)
        .try_acquire(conn)
        .await
        .expect("sqlx try_acquire")
    {
        Either::Left(guard) => guard,
        Either::Right(_) => panic!("the name is still locked after its release"),
    };
    assert!(
        pod_b
            .try_acquire(&name, ms(2000))
            .await
            .expect("acquire")
            .is_none()
    );
    drop(sqlx_guard.release_now().await.expect("sqlx release"));
    assert_eq!(pg_fence_row(&observer, &name).await, Some(token as i64));

    let next = pod_b
        .try_acquire(&name, ms(2000))
        .await
        .expect("acquire")
        .expect("free");
    assert_eq!(
        next.fencing_token(),
        Some(token + 1),
        "no token was skipped"
    );
    next.release().await.expect("release");
}

/// An idempotent re-acquire returns the token of the acquisition it
/// repeats; heartbeats leave it (and the counter) alone; renew and release
/// with another token do nothing to the held acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_fenced_reacquire_and_heartbeats_keep_the_token() {
    let (Some(pool), Some(observer)) =
        (lease_tests::postgres().await, lease_tests::postgres().await)
    else {
        return;
    };
    let backend = pg_fenced(pool).await;
    let name = unique("pg-fenced-reacquire");
    // One acquisition before, so that the token is not 1.
    let before = backend
        .acquire(&name, "pod-a", ms(2000))
        .await
        .expect("acquire")
        .expect("free");
    backend
        .release(Acquisition::new(&name, "pod-a", before.fencing_token))
        .await
        .expect("release");

    let ttl = ms(300); // a heartbeat every 100 ms
    let pod_a = Lease::with_holder(backend.clone(), "pod-a");
    let guard = pod_a
        .try_acquire(&name, ttl)
        .await
        .expect("acquire")
        .expect("free");
    let token = guard.fencing_token();
    assert_eq!(token, Some(2));
    for _ in 0..2 {
        let again = backend
            .acquire(&name, "pod-a", ttl)
            .await
            .expect("acquire")
            .expect("the same holder re-acquires");
        assert_eq!(again.fencing_token, token, "the re-acquire's token");
    }
    let twin = Lease::with_holder(backend.clone(), "pod-a")
        .try_acquire(&name, ttl)
        .await
        .expect("acquire")
        .expect("the same holder re-acquires");
    assert_eq!(twin.fencing_token(), token);
    tokio::time::sleep(ms(1000)).await; // ten heartbeats
    assert!(guard.is_valid(), "renewed past its ttl");
    assert_eq!(guard.fencing_token(), token);
    assert_eq!(pg_fence_row(&observer, &name).await, Some(2));

    // Another acquisition's renew and release: nothing happens to this one.
    let stale = Acquisition::new(&name, "pod-a", Some(1));
    assert!(!backend.renew(stale, ttl).await.expect("renew"));
    backend.release(stale).await.expect("release");
    assert_eq!(pg_lockers(&observer, &name).await.len(), 1, "still locked");
    assert!(
        backend
            .renew(Acquisition::new(&name, "pod-a", token), ttl)
            .await
            .expect("renew")
    );
    assert!(guard.is_valid());
    guard.release().await.expect("release");
    assert!(pg_lockers(&observer, &name).await.is_empty(), "released");
    twin.release().await.expect("release");
}

/// A fence table name that is not an identifier is refused before any SQL
/// is sent; a fence table that does not exist fails the acquisition with a
/// database error, and leaves no lock behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_fenced_bad_table_is_an_error() {
    let offline = PgAdvisory::new(
        PgPoolOptions::new()
            .connect_lazy("postgres://nobody@127.0.0.1:1/none")
            .expect("lazy pool"),
    );
    for bad in [
        "",
        "fences; DROP TABLE task_leases",
        "a.b.c",
        "\"fences\"",
        "1fences",
    ] {
        match offline.clone().with_fencing(bad) {
            Err(leasehold::Error::InvalidTable { table }) => assert_eq!(table, bad),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(offline.clone().with_fencing("jobs.lease_fences").is_ok());

    let (Some(pool), Some(observer)) =
        (lease_tests::postgres().await, lease_tests::postgres().await)
    else {
        return;
    };
    let missing = unique("no_such_table").replace('-', "_");
    let backend = PgAdvisory::new(pool).with_fencing(&missing).expect("valid");
    let name = unique("pg-fenced-missing");
    match backend.acquire(&name, "pod-a", ms(2000)).await {
        Err(leasehold::Error::Database(e)) => {
            assert!(e.to_string().contains("does not exist"), "{e}")
        }
        other => panic!("acquire without the fence table: {other:?}"),
    }
    assert!(
        eventually(ms(5000), || async {
            pg_lockers(&observer, &name).await.is_empty()
        })
        .await
        .is_some(),
        "a failed fenced acquisition left a lock behind"
    );
}
