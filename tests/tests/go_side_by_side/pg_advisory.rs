//! `PgAdvisory`: the Go `lock` package's advisory-lock key derivation.

use super::*;

/// A stand-in for the Go `lock.PG` key derivation (its docs do not give
/// it): a 64-bit FNV-1a hash of the name.
fn go_key(name: &str) -> i64 {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    hash as i64
}

/// `PgAdvisory::with_key`: Rust replicas lock the key the Go side derives,
/// so a Go session's `pg_try_advisory_lock(key)` and a Rust lease exclude
/// each other (and the sqlx-derived key does not), and the heartbeat checks
/// that key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_advisory_with_the_go_key_derivation() {
    use leasehold::backend::PgAdvisory;
    let Some(pool) = lease_tests::postgres().await else {
        return;
    };
    let name = unique("job");
    let key = go_key(&name);
    let backend = PgAdvisory::new(pool.clone()).with_key(go_key);
    assert_eq!(backend.lock_key(&name), key);
    assert_eq!(
        PgAdvisory::new(pool.clone()).lock_key(&name),
        PgAdvisory::key(&name)
    );
    let rust = Lease::with_holder(backend, "rust");
    let try_lock = "SELECT pg_try_advisory_lock($1)";

    // A Go replica holds the lock on its session: the Rust side cannot.
    let mut go = pool.acquire().await.expect("a connection");
    let locked: bool = sqlx::query_scalar(try_lock)
        .bind(key)
        .fetch_one(&mut *go)
        .await
        .expect("lock");
    assert!(locked);
    assert!(
        rust.try_acquire(&name, ms(900))
            .await
            .expect("try")
            .is_none()
    );
    let default = Lease::with_holder(PgAdvisory::new(pool.clone()), "sqlx-keys");
    let other = default
        .try_acquire(&name, ms(900))
        .await
        .expect("try")
        .expect("the sqlx-derived key is another lock");
    other.release().await.expect("release");
    let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .fetch_one(&mut *go)
        .await
        .expect("unlock");
    assert!(unlocked);

    // The Rust side holds it, past its ttl (the heartbeat checks that key):
    // the Go side cannot have it until it is released.
    let guard = rust
        .try_acquire(&name, ms(2_000))
        .await
        .expect("try")
        .expect("free");
    tokio::time::sleep(ms(2_500)).await;
    assert!(guard.is_valid(), "renewed by heartbeats on the Go key");
    let locked: bool = sqlx::query_scalar(try_lock)
        .bind(key)
        .fetch_one(&mut *go)
        .await
        .expect("lock");
    assert!(!locked);
    guard.release().await.expect("release");
    let locked: bool = sqlx::query_scalar(try_lock)
        .bind(key)
        .fetch_one(&mut *go)
        .await
        .expect("lock");
    assert!(locked);
    let _: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .fetch_one(&mut *go)
        .await
        .expect("unlock");
}
