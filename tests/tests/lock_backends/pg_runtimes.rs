//! `PgAdvisory` and runtimes: an ending app frees its locks, drops
//! outside a runtime or during thread-local teardown never panic, a lock is
//! kept while its renewing runtime runs.
use std::time::{Duration, Instant};

use lease_tests::unique;
use leasehold::Lease;
use leasehold::backend::PgAdvisory;
use sqlx::postgres::PgPoolOptions;

use super::pg_advisory::pg_lockers;
use super::{eventually, ms};

/// A runtime built by hand, as a program (or a test harness) does: current-
/// thread for `threads == 0`, else multi-thread with that many workers.
fn runtime(threads: usize) -> tokio::runtime::Runtime {
    let mut builder = if threads == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    builder.enable_all().build().expect("build a runtime")
}

/// From a runtime and a session of its own, wait (at most `limit`) until no
/// session holds the advisory lock of `name`, then take and free it with
/// `pg_try_advisory_lock`; how long the wait took, `None` if it stayed held.
fn pg_freed_within(name: &str, limit: Duration) -> Option<Duration> {
    runtime(0).block_on(async {
        let observer = lease_tests::postgres()
            .await
            .expect("postgres answered a moment ago");
        let freed = eventually(limit, || async {
            pg_lockers(&observer, name).await.is_empty()
        })
        .await;
        if freed.is_some() {
            let mut conn = observer.acquire().await.expect("connection");
            let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(PgAdvisory::key(name))
                .fetch_one(&mut *conn)
                .await
                .expect("pg_try_advisory_lock");
            assert!(
                locked,
                "no session holds the lock, yet another one cannot take it"
            );
            let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                .bind(PgAdvisory::key(name))
                .fetch_one(&mut *conn)
                .await
                .expect("pg_advisory_unlock");
            assert!(unlocked);
        }
        freed
    })
}

#[test]
fn pg_an_ending_app_frees_its_locks() {
    // A `#[tokio::main]` app whose `main` returns while it holds locks: a
    // job still running in a task of its own, a guard held by another task,
    // a guard in `main` itself. Its runtime shuts down; the process lives
    // on here, so nothing but the backend can free the locks.
    let names = [
        unique("pg-app-job"),
        unique("pg-app-task"),
        unique("pg-app-main"),
    ];
    let ttl = ms(60_000);
    for watch in [true, false] {
        let rt = runtime(2);
        let ran = rt.block_on(async {
            let pool = lease_tests::postgres().await?;
            let observer = lease_tests::postgres().await?;
            let lease = Lease::new(PgAdvisory::new(pool).with_watch(watch));
            let job = lease.clone();
            let name = names[0].clone();
            tokio::spawn(async move {
                job.with_lease(&name, ttl, |_| std::future::pending::<()>())
                    .await
            });
            let guard = lease
                .try_acquire(&names[1], ttl)
                .await
                .expect("acquire")
                .expect("free");
            tokio::spawn(async move {
                let _guard = guard;
                std::future::pending::<()>().await
            });
            let _main_guard = lease
                .try_acquire(&names[2], ttl)
                .await
                .expect("acquire")
                .expect("free");
            let held = eventually(ms(5000), || async {
                pg_lockers(&observer, &names[0]).await.len() == 1
            })
            .await;
            assert!(held.is_some(), "the job never took its lock");
            Some(())
        });
        if ran.is_none() {
            return;
        }
        let shut = Instant::now();
        drop(rt);
        for name in &names {
            let freed = pg_freed_within(name, ms(10_000));
            println!(
                "watched {watch}: the app's runtime shut down: {name} free {freed:?} \
                 ({:?} after the shutdown)",
                shut.elapsed()
            );
            assert!(freed.is_some(), "watched {watch}: {name} still held");
        }
    }
}

#[test]
fn pg_drops_outside_a_runtime_never_panic() {
    // With `min_connections`, sqlx's `PoolConnection` spawns a task on every
    // drop, which panics without a runtime.
    let options = || PgPoolOptions::new().max_connections(4).min_connections(1);
    let ttl = ms(60_000);

    // The runtime is gone: guards, `Lease` and backend are dropped after it.
    let names = [unique("pg-drop-no-runtime"), unique("pg-drop-no-runtime")];
    let rt = runtime(0);
    let held = rt.block_on(async {
        let pool = lease_tests::postgres_with(options()).await?;
        let backend = PgAdvisory::new(pool);
        let pod_a = Lease::with_holder(backend.clone(), "pod-a");
        let mut guards = Vec::new();
        for name in &names {
            guards.push(
                pod_a
                    .try_acquire(name, ttl)
                    .await
                    .expect("acquire")
                    .expect("free"),
            );
        }
        Some((backend, pod_a, guards))
    });
    let Some((backend, pod_a, mut guards)) = held else {
        return;
    };
    rt.shutdown_timeout(ms(1000));
    drop(guards.pop());
    drop(pod_a);
    drop(backend);
    drop(guards);
    for name in &names {
        assert!(
            pg_freed_within(name, ms(10_000)).is_some(),
            "{name} still held"
        );
    }

    // The runtime lives, but the last clone of the backend (the backend
    // alone: a `Lease`'s scheduler would keep a clone on the runtime) is
    // dropped on a thread outside it.
    let name = unique("pg-drop-no-runtime");
    let rt = runtime(1);
    let backend = rt.block_on(async {
        let backend = PgAdvisory::new(lease_tests::postgres_with(options()).await?);
        let grant = leasehold::Backend::acquire(&backend, &name, "pod-a", ttl).await;
        assert!(grant.expect("acquire").is_some(), "free");
        Some(backend)
    });
    let Some(backend) = backend else {
        return;
    };
    drop(backend);
    assert!(
        pg_freed_within(&name, ms(10_000)).is_some(),
        "{name} still held"
    );
    drop(rt);
}

#[test]
fn pg_lock_is_kept_while_its_renewing_runtime_runs() {
    // The converse: the runtime that acquired the lock shuts down after a
    // heartbeat ran on the scheduler's runtime, which lives on. The lock is
    // renewed there, so it stays held and valid. (Its connection was opened
    // on the scheduler's runtime: a socket opened on a runtime that shut
    // down cannot be used any more, and the next heartbeat would lose it.)
    let ttl = ms(2000);
    let renewer = runtime(1);
    let (warm, name) = (unique("pg-renewer"), unique("pg-kept"));
    let Some((pool, observer)) = renewer.block_on(async {
        let options = PgPoolOptions::new().max_connections(2);
        Some((
            lease_tests::postgres_with(options).await?,
            lease_tests::postgres().await?,
        ))
    }) else {
        return;
    };
    let pod_a = Lease::with_holder(PgAdvisory::new(pool.clone()), "pod-a");
    // The scheduler starts on `renewer`, and a second connection is opened
    // there and left idle in the pool for the lock below.
    let warm_guard = renewer.block_on(async {
        let warm_guard = pod_a
            .try_acquire(&warm, ttl)
            .await
            .expect("acquire")
            .expect("free");
        drop(pool.acquire().await.expect("connection"));
        let idle = eventually(ms(2000), || async { pool.num_idle() == 1 }).await;
        assert!(idle.is_some(), "the connection went back to the pool");
        warm_guard
    });
    let acquirer = runtime(1);
    let guard = acquirer
        .block_on(pod_a.try_acquire(&name, ttl))
        .expect("acquire")
        .expect("free");
    // A heartbeat (every ttl/3) runs on `renewer`, which keeps the lock from then on.
    std::thread::sleep(ttl / 3 + ms(200));
    drop(acquirer);
    std::thread::sleep(ttl * 2);
    assert!(guard.is_valid(), "renewed by the runtime that lives on");
    let lockers = renewer.block_on(pg_lockers(&observer, &name));
    assert_eq!(lockers.len(), 1, "still held by one session");
    renewer.block_on(async {
        guard.release().await.expect("release");
        warm_guard.release().await.expect("release");
        assert!(pg_lockers(&observer, &name).await.is_empty());
    });
}

#[test]
fn pg_drop_while_thread_storage_is_torn_down_never_panics() {
    // The last clone of a backend dropped by a thread-local's destructor,
    // after Tokio's own thread-local context is gone: no runtime can be
    // entered on that thread any more, and with `min_connections` sqlx's
    // drop of a pool connection spawns a task. A panic in a thread-local's
    // destructor aborts the process. With and without `min_connections`.
    thread_local! {
        static KEPT: std::cell::RefCell<Vec<PgAdvisory>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let names = [unique("pg-drop-tls"), unique("pg-drop-tls")];
    let rt = runtime(1);
    let mut pools = Vec::new();
    for min in [1, 0] {
        let options = PgPoolOptions::new().max_connections(4).min_connections(min);
        let Some(pool) = rt.block_on(lease_tests::postgres_with(options)) else {
            return;
        };
        pools.push(pool);
    }
    let handle = rt.handle().clone();
    let thread_names = names.clone();
    std::thread::spawn(move || {
        // Destructors of thread-locals run last registered, first run:
        // touching `KEPT` before Tokio's context makes it run after.
        KEPT.with(|_| ());
        for (pool, name) in pools.into_iter().zip(&thread_names) {
            let backend = PgAdvisory::new(pool);
            let grant = handle.block_on(leasehold::Backend::acquire(
                &backend,
                name,
                "pod-a",
                ms(60_000),
            ));
            assert!(grant.expect("acquire").is_some(), "free");
            KEPT.with(|k| k.borrow_mut().push(backend));
        }
    })
    .join()
    .expect("the thread ends without panicking");
    for name in &names {
        let freed = pg_freed_within(name, ms(10_000));
        println!("backend dropped by a thread-local's destructor: lock free: {freed:?}");
        assert!(freed.is_some(), "{name} still held");
    }
    drop(rt);
}
