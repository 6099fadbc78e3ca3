//! How the `Redis` backend uses its connection (issue 10, point 5): a
//! connection that stops answering is replaced, and lease calls never share
//! a socket with other users of the pool.
//!
//! - A half-open connection (black-holed by the [`FaultProxy`] for good,
//!   while new connections get through) is replaced after the first call that
//!   gets no answer on it, whether the engine drops that call at its own time
//!   limit or redis' response timeout ends it: acquisitions of free names
//!   succeed again within one call's time limit plus a reconnect.
//! - Concurrent calls that fail on the same dead connection open one new
//!   connection between them, not one each.
//! - A `BLPOP` that another user of the same pool runs does not stall the
//!   lease calls, nor the renewals of a held lease.
//!
//! Timings are asserted with generous slack (a loaded 2-core machine) and
//! printed, so `--nocapture` shows the measured values.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lease_tests::proxy::FaultProxy;
use lease_tests::unique;
use leasehold::Lease;
use leasehold::backend::Redis;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// How long each test keeps trying after the fault: longer than the
/// backend's own 5 s timeout, so that no bound of the old code is missed by
/// giving up too early.
const WINDOW: Duration = Duration::from_secs(8);

/// The test server's address (resolved from the Redis URL), or `None` when
/// there is no test server (and it is not required).
async fn upstream() -> Option<SocketAddr> {
    lease_tests::redis().await?;
    let info = redis::IntoConnectionInfo::into_connection_info(lease_tests::redis_url())
        .expect("redis url");
    let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
        panic!("a tcp redis url")
    };
    let addr = tokio::net::lookup_host((host, port))
        .await
        .expect("resolve")
        .next()
        .expect("an address");
    Some(addr)
}

/// A deadpool pool (default settings: redis' 500 ms response timeout) on
/// the test server through `proxy`.
fn pool_through(proxy: &FaultProxy) -> deadpool_redis::Pool {
    let info = redis::IntoConnectionInfo::into_connection_info(lease_tests::redis_url())
        .expect("redis url");
    let info = info.set_addr(redis::ConnectionAddr::Tcp(
        "127.0.0.1".to_owned(),
        proxy.addr().port(),
    ));
    deadpool_redis::Config::from_connection_info(info)
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool")
}

/// Acquire and release a fresh name, so that the backend has a connection.
async fn warm_up(lease: &Lease) {
    let guard = lease
        .try_acquire(&unique("redis-conn-warm"), ms(5000))
        .await
        .expect("acquire")
        .expect("free");
    guard.release().await.expect("release");
}

/// Try to acquire fresh free names, one after another, until one is granted
/// or [`WINDOW`] passes; how long that took, and the failures seen.
async fn first_success(lease: &Lease, ttl: Duration) -> (Option<Duration>, Vec<String>) {
    let start = Instant::now();
    let mut failures = Vec::new();
    while start.elapsed() < WINDOW {
        let tried = Instant::now();
        match lease.try_acquire(&unique("redis-conn-free"), ttl).await {
            Ok(Some(guard)) => {
                let took = start.elapsed();
                guard.release().await.expect("release");
                return (Some(took), failures);
            }
            Ok(None) => panic!("a fresh name is free"),
            Err(e) => failures.push(format!("{} (after {:?})", chain(&e), tried.elapsed())),
        }
    }
    (None, failures)
}

/// An error and its sources: `redis error: timed out`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        text += &format!(": {e}");
        source = e.source();
    }
    text
}

fn summary(failures: &[String]) -> String {
    match failures {
        [] => "no failures".to_owned(),
        [only] => format!("1 failure: {only}"),
        [first, .., last] => format!("{} failures, first: {first}; last: {last}", failures.len()),
    }
}

/// ttl 300 ms: the engine gives an acquisition 295 ms, less than redis'
/// 500 ms response timeout and the backend's 5 s timeout, so every call on
/// the dead connection is dropped by the engine — as renewals (ttl/3) are in
/// production. The backend must notice the dropped call and reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_black_holed_connection_is_replaced_when_the_engine_drops_calls() {
    let Some(upstream) = upstream().await else {
        return;
    };
    let proxy = FaultProxy::start(upstream).await;
    let lease = Lease::with_holder(Redis::new(pool_through(&proxy)), "pod-a");
    warm_up(&lease).await;
    let stuck = proxy.black_hole_open();
    assert!(
        stuck >= 1,
        "the backend's connection goes through the proxy"
    );

    let ttl = ms(300);
    let (recovered, failures) = first_success(&lease, ttl).await;
    println!(
        "black hole, ttl {ttl:?} (calls dropped by the engine): acquired again after {recovered:?}; {}",
        summary(&failures)
    );
    // One call dropped at 295 ms, then one on a new connection.
    let bound = ms(2000);
    let took = recovered.unwrap_or_else(|| {
        panic!(
            "no acquisition succeeded within {WINDOW:?} of black-holing the connection: {}",
            summary(&failures)
        )
    });
    assert!(took < bound, "acquired again only after {took:?}");
    // The new connection is kept: the next acquisitions succeed at once.
    let (again, failures) = first_success(&lease, ttl).await;
    assert!(
        again.is_some_and(|t| t < ms(295)),
        "{again:?}: {}",
        summary(&failures)
    );
}

/// ttl 3 s: the engine gives an acquisition 2.97 s, so redis' own 500 ms
/// response timeout ends each call first, with an error that redis calls
/// retryable (not "unrecoverable"). The backend must not keep the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_black_holed_connection_is_replaced_after_a_response_timeout() {
    let Some(upstream) = upstream().await else {
        return;
    };
    let proxy = FaultProxy::start(upstream).await;
    let lease = Lease::with_holder(Redis::new(pool_through(&proxy)), "pod-a");
    warm_up(&lease).await;
    assert!(proxy.black_hole_open() >= 1);

    let ttl = ms(3000);
    let (recovered, failures) = first_success(&lease, ttl).await;
    println!(
        "black hole, ttl {ttl:?} (redis' response timeout): acquired again after {recovered:?}; {}",
        summary(&failures)
    );
    // The 500 ms response timeout, then the call is retried on a new connection.
    let bound = ms(500) + ms(1500);
    let took = recovered.unwrap_or_else(|| {
        panic!(
            "no acquisition succeeded within {WINDOW:?} of black-holing the connection: {}",
            summary(&failures)
        )
    });
    assert!(took < bound, "acquired again only after {took:?}");
}

/// Many acquisitions in flight when the connection goes silent: they all
/// fail over to one new connection, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_concurrent_calls_open_one_new_connection() {
    let Some(upstream) = upstream().await else {
        return;
    };
    let proxy = FaultProxy::start(upstream).await;
    let lease = Lease::with_holder(Redis::new(pool_through(&proxy)), "pod-a");
    warm_up(&lease).await;
    assert!(proxy.black_hole_open() >= 1);
    let before = proxy.accepted();

    let ttl = ms(300);
    let start = Instant::now();
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let lease = lease.clone();
            tokio::spawn(async move { first_success(&lease, ttl).await })
        })
        .collect();
    for task in tasks {
        let (recovered, failures) = task.await.expect("task");
        assert!(
            recovered.is_some(),
            "a task never acquired: {}",
            summary(&failures)
        );
    }
    let opened = proxy.accepted() - before;
    println!(
        "16 concurrent acquirers after the black hole: all acquired within {:?}, {opened} new connection(s)",
        start.elapsed()
    );
    // Normally 1; a second if a call on the new connection was itself
    // dropped before its answer on a loaded machine.
    assert!(opened <= 2, "{opened} new connections");
}

/// Another user of the same pool runs `BLPOP` (an empty list, 3 s) on a
/// connection it got from the pool. Lease calls — new acquisitions and the
/// renewals of a held lease — go on undisturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_blocking_command_of_another_pool_user_does_not_stall_lease_calls() {
    let Some(pool) = lease_tests::redis().await else {
        return;
    };
    let backend = Redis::new(pool.clone());
    let lease = Lease::with_holder(backend, "pod-a");
    // The backend has connected (through the pool) and released the name.
    warm_up(&lease).await;
    let ttl = ms(2000);
    let held = lease
        .try_acquire(&unique("redis-conn-held"), ttl)
        .await
        .expect("acquire")
        .expect("free");

    // Another user of the pool: a blocking pop that waits 3 s, with a
    // response timeout long enough for it (as such a user would set).
    let blocked_for = Duration::from_secs(3);
    let mut conn = pool.get().await.expect("connection");
    conn.set_response_timeout(blocked_for * 2);
    let list = unique("redis-conn-list");
    let user = tokio::spawn(async move {
        let start = Instant::now();
        let popped: Option<(String, String)> = redis::cmd("BLPOP")
            .arg(&list)
            .arg(blocked_for.as_secs())
            .query_async(&mut conn)
            .await
            .expect("BLPOP");
        (popped, start.elapsed())
    });
    tokio::time::sleep(ms(100)).await;

    // Meanwhile: acquisitions of free names, each quick, and the held lease
    // renewed (every 667 ms) all along.
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    let (mut acquired, mut failures) = (0, Vec::new());
    let mut lost = None;
    while start.elapsed() < blocked_for - ms(500) {
        let tried = Instant::now();
        let result = lease
            .try_acquire(&unique("redis-conn-free"), ms(5000))
            .await;
        let took = tried.elapsed();
        slowest = slowest.max(took);
        match result {
            Ok(Some(guard)) => {
                acquired += 1;
                guard.release().await.expect("release");
            }
            Ok(None) => panic!("a fresh name is free"),
            Err(e) => failures.push(format!(
                "{} (after {took:?}, {:?} into the BLPOP)",
                chain(&e),
                start.elapsed()
            )),
        }
        if lost.is_none() && !held.is_valid() {
            lost = Some(start.elapsed());
        }
        tokio::time::sleep(ms(50)).await;
    }
    let (popped, waited) = user.await.expect("task");
    println!(
        "BLPOP by another pool user ({waited:?}, answered {popped:?}): {acquired} acquisitions meanwhile, \
         slowest {slowest:?}, {}; held lease lost: {lost:?}",
        summary(&failures)
    );
    assert!(popped.is_none() && waited >= blocked_for - ms(100));
    assert!(failures.is_empty(), "{}", summary(&failures));
    assert!(slowest < ms(1000), "an acquisition took {slowest:?}");
    assert_eq!(lost, None, "the held lease was lost during the BLPOP");
    assert!(held.is_valid());
    held.release().await.expect("release");
}
