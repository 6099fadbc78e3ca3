//! Redis: the Go `lock` package's locker beside `leasehold`'s `Redis`.

use super::*;

/// Go lockers and Rust replicas (`Redis::with_go_locker_protocol`, with the
/// Go services' prefix) on one Redis: the key is the prefix and the name,
/// its value a token, there is no fence key and no fencing token, and the
/// two sides never hold the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_go_locker_mixed_fleet_never_double_runs() {
    let Some(pool) = lease_tests::redis().await else {
        return;
    };
    let prefix = format!("{}:", unique("golock"));
    let locker = GoLocker {
        pool: pool.clone(),
        prefix: prefix.clone(),
    };
    let backend = leasehold::backend::Redis::new(pool.clone())
        .with_prefix(prefix.clone())
        .expect("valid prefix")
        .with_go_locker_protocol();
    let mut conn = pool.get().await.expect("a connection");
    let get = |key: &str| redis::cmd("GET").arg(key).clone();

    // One Rust acquisition, seen from the Go side.
    let name = unique("job");
    let key = format!("{prefix}{name}");
    assert_eq!(backend.lock_key(&name), key);
    let lease = Lease::with_holder(backend.clone(), "rust");
    let guard = lease
        .try_acquire(&name, Duration::from_secs(30))
        .await
        .expect("acquire")
        .expect("free");
    assert_eq!(guard.fencing_token(), None);
    let token: String = get(&key)
        .query_async(&mut *conn)
        .await
        .expect("the lock holds a token");
    assert_eq!(token.len(), 32, "{token}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()), "{token}");
    assert_eq!(locker.try_lock(&name, ms(1_000)).await, Ok(None));
    // Re-acquired (same holder, another Lease): a new token; a release
    // with the old one deletes nothing.
    let again = Lease::with_holder(backend.clone(), "rust");
    let second = again
        .try_acquire(&name, Duration::from_secs(30))
        .await
        .expect("acquire")
        .expect("idempotent re-acquire");
    let rotated: String = get(&key).query_async(&mut *conn).await.expect("a token");
    assert_ne!(rotated, token);
    locker.unlock(&name, &token).await.expect("a stale release");
    let still: Option<String> = get(&key).query_async(&mut *conn).await.expect("get");
    assert_eq!(still.as_deref(), Some(rotated.as_str()));
    second.release().await.expect("release");
    let gone: Option<String> = get(&key).query_async(&mut *conn).await.expect("get");
    assert_eq!(gone, None, "release deletes the key");
    drop(guard);
    // The Go side's lock keeps the Rust side out until it is released.
    let go_token = locker
        .try_lock(&name, Duration::from_secs(30))
        .await
        .expect("lock")
        .expect("free");
    assert!(
        lease
            .try_acquire(&name, ms(1_000))
            .await
            .expect("try")
            .is_none()
    );
    locker.unlock(&name, &go_token).await.expect("unlock");
    let third = lease
        .try_acquire(&name, ms(1_000))
        .await
        .expect("try")
        .expect("released by Go");
    third.release().await.expect("release");

    let t = Timing {
        go_ttl: ms(300),
        rust_ttl: ms(300),
        run_for: Duration::from_secs(6),
        max_work: ms(250),
    };
    fleet(GoSide::Locker(locker), backend, 3, 3, t).await;

    // Only lock keys, never a fence key or a braced key.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut *conn)
        .await
        .expect("keys");
    for key in &keys {
        assert!(!key.contains('{') && !key.ends_with(":fence"), "{key}");
    }
}
