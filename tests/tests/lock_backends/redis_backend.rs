//! `Redis`: key encoding, keys deleted or connections killed behind the
//! holder's back, an unreachable server, and fencing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lease_tests::unique;
use leasehold::backend::Redis;
use leasehold::{Lease, Outcome, Skip};
use redis::AsyncCommands;

use super::{SLACK, cancelled_within, eventually, ms};

async fn redis_backend() -> Option<(deadpool_redis::Pool, Redis)> {
    let pool = lease_tests::redis().await?;
    Some((pool.clone(), Redis::new(pool)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_names_are_data() {
    let Some((pool, backend)) = redis_backend().await else {
        return;
    };
    let pod_a = Lease::with_holder(backend.clone(), "pod-a");
    let pod_b = Lease::with_holder(backend.clone(), "pod-b");
    let base = unique("redis-names");
    // Names that a naive key scheme (no escaping, or brace-unaware) would
    // map onto each other's lock or fence keys.
    let suffixes = [
        "",
        "{",
        "}",
        "}x",
        "{x}",
        "a{b}c",
        ":fence",
        "}:fence",
        "%",
        "%25",
        "%7B",
        "%7D",
        "\"quoted\" 'single'",
        "50% off",
        "🔒🦀",
        "ünïcödé",
        " spaced ",
        "\\back\\slash",
        "*?[glob]",
    ];
    let names: Vec<String> = suffixes.iter().map(|s| format!("{base}{s}")).collect();
    let mut guards = Vec::new();
    for name in &names {
        let guard = pod_a
            .try_acquire(name, ms(5000))
            .await
            .expect("acquire")
            .unwrap_or_else(|| panic!("{name:?} is free"));
        assert_eq!(
            guard.fencing_token(),
            Some(1),
            "{name:?} has a fence counter of its own"
        );
        guards.push(guard);
    }
    let mut conn = pool.get().await.expect("connection");
    let mut keys = std::collections::HashSet::new();
    for name in &names {
        assert!(
            pod_b
                .try_acquire(name, ms(5000))
                .await
                .expect("acquire")
                .is_none(),
            "{name:?}"
        );
        let lock_key = backend.lock_key(name);
        let fence_key = backend.fence_key(name);
        let holder: Option<String> = conn.get(&lock_key).await.expect("GET");
        assert_eq!(holder.as_deref(), Some("1:pod-a"), "{name:?}");
        let fence: Option<u64> = conn.get(&fence_key).await.expect("GET");
        assert_eq!(fence, Some(1), "{name:?}");
        // Both keys share the hash tag (the text between the first `{` and the next `}`).
        let tag = |k: &str| {
            let open = k.find('{').expect("a brace");
            let close = open + k[open..].find('}').expect("a closing brace");
            k[open + 1..close].to_owned()
        };
        assert_eq!(tag(&lock_key), tag(&fence_key), "{name:?}");
        assert!(
            lock_key.starts_with("lease:{") && lock_key.ends_with('}'),
            "{lock_key}"
        );
        assert!(
            keys.insert(lock_key) && keys.insert(fence_key),
            "{name:?} shares a key with another name"
        );
    }
    assert_eq!(backend.lock_key("a{b}%"), "lease:{a%7Bb%7D%25}");
    for guard in guards {
        guard.release().await.expect("release");
    }
    for name in &names {
        let guard = pod_b
            .try_acquire(name, ms(5000))
            .await
            .expect("acquire")
            .expect("released");
        assert_eq!(guard.fencing_token(), Some(2), "{name:?}");
        guard.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_prefix_is_used() {
    let Some((pool, backend)) = redis_backend().await else {
        return;
    };
    let backend = backend.with_prefix("lease-tests:").expect("valid prefix");
    assert!(matches!(
        Redis::new(pool.clone()).with_prefix("a{b"),
        Err(leasehold::Error::InvalidPrefix { .. })
    ));
    let pod_a = Lease::with_holder(backend.clone(), "pod-a");
    let name = unique("redis-prefix");
    let guard = pod_a
        .try_acquire(&name, ms(5000))
        .await
        .expect("acquire")
        .expect("free");
    let mut conn = pool.get().await.expect("connection");
    let holder: Option<String> = conn
        .get(format!("lease-tests:{{{name}}}"))
        .await
        .expect("GET");
    assert_eq!(holder.as_deref(), Some("1:pod-a"));
    let default: Option<String> = conn.get(format!("lease:{{{name}}}")).await.expect("GET");
    assert_eq!(default, None);
    guard.release().await.expect("release");
    let holder: Option<String> = conn
        .get(format!("lease-tests:{{{name}}}"))
        .await
        .expect("GET");
    assert_eq!(holder, None, "release deletes the lock key");
}

/// A Redis Cluster refuses a script over keys of several hash slots with
/// `CROSSSLOT`; `renew_many` then renews one script per key. On a real
/// cluster (a private one-node cluster serving every slot): each lease of a
/// mixed batch learns its own fate, only the live ones are extended, and
/// the server's statistics show the fallback — the batch script refused
/// once, then one script per lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_renew_many_on_a_cluster_falls_back_to_one_script_per_key() {
    use lease_tests::servers::PrivateServer;
    use leasehold::{Acquisition, Backend};

    let server = match PrivateServer::redis_cluster().await {
        Ok(server) => server,
        Err(e) if !lease_tests::services_required() => {
            println!("skipped: cannot start a Redis cluster node: {e}");
            return;
        }
        Err(e) => panic!("cannot start a Redis cluster node: {e}"),
    };
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    let backend = Redis::new(pool.clone());
    let mut conn = pool.get().await.expect("connection");
    let (holder, thief) = ("pod-a", "pod-b");
    let name = |what: &str| unique(&format!("crossslot-{what}"));
    let (live, live_too, stolen, expired, released, never) = (
        name("live"),
        name("live-too"),
        name("stolen"),
        name("expired"),
        name("released"),
        name("never"),
    );
    let acquire = |name: &str, who: &str, ttl: Duration| {
        let (backend, name, who) = (backend.clone(), name.to_owned(), who.to_owned());
        async move {
            backend
                .acquire(&name, &who, ttl)
                .await
                .expect("acquire")
                .expect("free")
                .fencing_token
        }
    };
    let f_live = acquire(&live, holder, ms(5_000)).await;
    let f_live_too = acquire(&live_too, holder, ms(5_000)).await;
    let f_stolen = acquire(&stolen, holder, ms(100)).await;
    let f_expired = acquire(&expired, holder, ms(100)).await;
    let f_released = acquire(&released, holder, ms(5_000)).await;
    backend
        .release(Acquisition::new(&released, holder, f_released))
        .await
        .expect("release");
    let short_lived = [backend.lock_key(&stolen), backend.lock_key(&expired)];
    let gone = eventually(ms(5_000), || {
        let (pool, keys) = (pool.clone(), short_lived.clone());
        async move {
            let mut c = pool.get().await.expect("connection");
            for key in keys {
                let exists: bool = c.exists(key).await.expect("EXISTS");
                if exists {
                    return false;
                }
            }
            true
        }
    })
    .await;
    assert!(gone.is_some(), "the 100 ms leases did not expire");
    acquire(&stolen, thief, ms(30_000)).await;

    let batch = [
        (Acquisition::new(&live, holder, f_live), ms(60_000)),
        (Acquisition::new(&stolen, holder, f_stolen), ms(60_000)),
        (Acquisition::new(&expired, holder, f_expired), ms(60_000)),
        (Acquisition::new(&live_too, holder, f_live_too), ms(60_000)),
        (Acquisition::new(&released, holder, f_released), ms(60_000)),
        (Acquisition::new(&never, holder, Some(1)), ms(60_000)),
    ];
    // The keys lie in several hash slots, so one script over all of them
    // is refused.
    let mut slots = std::collections::HashSet::new();
    for (lease, _) in &batch {
        let slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(backend.lock_key(lease.name))
            .query_async(&mut conn)
            .await
            .expect("CLUSTER KEYSLOT");
        slots.insert(slot);
    }
    assert!(slots.len() > 1, "all in one slot: {slots:?}");
    // Load the one-key renew script (a first use would add `NOSCRIPT` to the
    // statistics), then count from zero.
    assert!(backend.renew(batch[0].0, ms(5_000)).await.expect("renew"));
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("CONFIG RESETSTAT");

    let renewed = backend.renew_many(&batch).await.expect("renew_many");
    assert_eq!(renewed, [true, false, false, true, false, false]);

    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .arg("errorstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    let stat = |prefix: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {info}"))
            .to_owned()
    };
    println!("{info}");
    let evalsha = stat("cmdstat_evalsha:");
    let field = |name: &str| {
        evalsha
            .split(',')
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {evalsha}"))
            .to_owned()
    };
    assert_eq!(
        (
            field("rejected_calls="),
            field("calls="),
            field("failed_calls=")
        ),
        ("1".to_owned(), batch.len().to_string(), "0".to_owned()),
        "one batch script refused, then one script per lease: {evalsha}"
    );
    let errors: Vec<&str> = info
        .lines()
        .filter(|l| l.starts_with("errorstat_"))
        .collect();
    assert_eq!(errors, ["errorstat_CROSSSLOT:count=1"]);

    // The live leases were extended to the new ttl; the others untouched.
    for name in [&live, &live_too] {
        let left: i64 = conn.pttl(backend.lock_key(name)).await.expect("PTTL");
        assert!(left > 50_000, "{name}: {left} ms left");
    }
    let left: i64 = conn.pttl(backend.lock_key(&stolen)).await.expect("PTTL");
    assert!(
        (0..=30_000).contains(&left),
        "the thief's expiry was touched: {left}"
    );
    let holder_now: Option<String> = conn.get(backend.lock_key(&stolen)).await.expect("GET");
    assert_eq!(holder_now.as_deref(), Some("2:pod-b"));
    for name in [&expired, &released, &never] {
        let exists: bool = conn.exists(backend.lock_key(name)).await.expect("EXISTS");
        assert!(
            !exists,
            "{name}: renew_many must not bring back or insert a lease"
        );
    }
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_deleted_key_cancels_token() {
    let Some((pool, backend)) = redis_backend().await else {
        return;
    };
    let pod_a = Lease::with_holder(backend.clone(), "pod-a");
    let pod_b = Lease::with_holder(backend.clone(), "pod-b");
    let name = unique("redis-del");
    let ttl = ms(2000);
    let guard = pod_a
        .try_acquire(&name, ttl)
        .await
        .expect("acquire")
        .expect("free");
    let fence = guard.fencing_token().expect("a fence");
    // Past the ttl (renewed), and half-way between two renewals.
    tokio::time::sleep(ttl + ttl / 6).await;
    assert!(guard.is_valid(), "renewed past its ttl");

    let mut conn = pool.get().await.expect("connection");
    let deleted = Instant::now();
    let n: u64 = conn.del(backend.lock_key(&name)).await.expect("DEL");
    assert_eq!(n, 1);
    // Free for anyone at once, with a larger fence.
    let takeover = pod_b
        .try_acquire(&name, ttl)
        .await
        .expect("acquire")
        .expect("free after DEL");
    assert!(takeover.fencing_token().expect("a fence") > fence);
    let limit = ttl / 3 + SLACK;
    let noticed = cancelled_within(&guard, limit).await;
    println!(
        "redis DEL: holder's token cancelled after {:?}",
        deleted.elapsed()
    );
    assert!(
        noticed.is_some(),
        "token not cancelled within ttl/3 + {SLACK:?} = {limit:?} of the DEL"
    );
    // The old holder's release is token-checked: pod-b keeps its lock.
    guard.release().await.expect("release");
    let holder: Option<String> = conn.get(backend.lock_key(&name)).await.expect("GET");
    let expected = format!("{}:pod-b", takeover.fencing_token().expect("a fence"));
    assert_eq!(holder, Some(expected), "the lock's value is fence:holder");
    assert!(takeover.is_valid());
    takeover.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_overwritten_key_is_not_renewed_or_released() {
    let Some((pool, backend)) = redis_backend().await else {
        return;
    };
    let pod_a = Lease::with_holder(backend.clone(), "pod-a");
    let name = unique("redis-overwrite");
    let ttl = ms(900);
    let guard = pod_a
        .try_acquire(&name, ttl)
        .await
        .expect("acquire")
        .expect("free");
    let mut conn = pool.get().await.expect("connection");
    let () = conn
        .set_ex(backend.lock_key(&name), "pod-x", 60)
        .await
        .expect("SET");
    assert!(
        cancelled_within(&guard, ttl / 3 + SLACK).await.is_some(),
        "a lock that holds another holder is lost"
    );
    guard.release().await.expect("release");
    let holder: Option<String> = conn.get(backend.lock_key(&name)).await.expect("GET");
    assert_eq!(
        holder.as_deref(),
        Some("pod-x"),
        "release must not delete another holder's lock"
    );
    let ttl_left: i64 = conn.pttl(backend.lock_key(&name)).await.expect("PTTL");
    assert!(
        ttl_left > 50_000,
        "renew must not have touched another holder's expiry ({ttl_left} ms)"
    );
    let _: u64 = conn.del(backend.lock_key(&name)).await.expect("DEL");
}

/// Ids of the Redis clients named `client_name`.
async fn client_ids(conn: &mut deadpool_redis::Connection, client_name: &str) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter(|line| {
            line.split(' ')
                .any(|field| field == format!("name={client_name}"))
        })
        .filter_map(|line| {
            line.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .map(str::to_owned)
        })
        .collect()
}

/// Counts the engine's "renewal failed" warnings and the Redis backend's
/// "retrying on another" connection retries.
#[derive(Clone, Default)]
struct Failures {
    renewals: Arc<AtomicUsize>,
    retries: Arc<AtomicUsize>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Failures {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0.contains("lease renewal failed") {
            self.renewals.fetch_add(1, Ordering::Relaxed);
        } else if message.0.contains("retrying on another") {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
    }
}

// Current-thread runtime: the thread-local subscriber sees the engine's events.
#[tokio::test(flavor = "current_thread")]
async fn redis_client_kill_does_not_lose_the_lease() {
    use tracing_subscriber::layer::SubscriberExt;
    let Some(admin_pool) = lease_tests::redis().await else {
        return;
    };
    let mut admin = admin_pool.get().await.expect("connection");
    let failures = Failures::default();
    lease_tests::enable_every_call_site();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(failures.clone()));

    // The pool reaches Redis through a proxy that delays every answer by
    // 20 ms, so that kills often land while a renewal is in flight (and not
    // only on idle connections, which the pool's recycle check would weed
    // out before a renewal sees them). The pool's connections are named, to
    // kill exactly those: killing every normal client would disturb the
    // tests running beside this one.
    let info = redis::IntoConnectionInfo::into_connection_info(lease_tests::redis_url())
        .expect("redis url");
    let redis::ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
        panic!("a tcp redis url")
    };
    let upstream = tokio::net::lookup_host((host, port))
        .await
        .expect("resolve")
        .next()
        .expect("an address");
    let proxy = lease_tests::SlowProxy::start(upstream, ms(20)).await;
    let info = info.set_addr(redis::ConnectionAddr::Tcp(
        "127.0.0.1".to_owned(),
        proxy.addr().port(),
    ));
    let client_name = unique("lease_kill").replace('-', "_");
    let hook_name = client_name.clone();
    let pool = deadpool_redis::Config::from_connection_info(info)
        .builder()
        .expect("pool config")
        .runtime(deadpool_redis::Runtime::Tokio1)
        .post_create(deadpool_redis::Hook::async_fn(move |conn, _| {
            let name = hook_name.clone();
            Box::pin(async move {
                let set = redis::cmd("CLIENT")
                    .arg("SETNAME")
                    .arg(&name)
                    .query_async::<()>(conn)
                    .await;
                set.map_err(deadpool_redis::HookError::Backend)
            })
        }))
        .build()
        .expect("pool");

    let backend = Redis::new(pool);
    let pod_a = Lease::with_holder(backend.clone(), "pod-a");
    let pod_b = Lease::with_holder(backend.clone(), "pod-b");
    let name = unique("redis-kill");
    let ttl = ms(2000);

    let guard = pod_a
        .try_acquire(&name, ttl)
        .await
        .expect("acquire")
        .expect("free");
    let fence = guard.fencing_token();
    // Kill the pool's connections every 50..150 ms for 3 ttls.
    let start = Instant::now();
    let mut killed = 0;
    let mut round = 0u64;
    while start.elapsed() < ttl * 3 {
        for id in client_ids(&mut admin, &client_name).await {
            let n: u64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(&id)
                .query_async(&mut *admin)
                .await
                .unwrap_or(0);
            killed += n;
        }
        round += 1;
        tokio::time::sleep(ms(50 + (round * 37) % 100)).await;
        assert!(
            guard.is_valid(),
            "lease lost after {:?} ({killed} connections killed)",
            start.elapsed()
        );
    }
    let (renewals, retries) = (
        failures.renewals.load(Ordering::Relaxed),
        failures.retries.load(Ordering::Relaxed),
    );
    println!(
        "CLIENT KILL: {killed} pool connections killed in {:?}; {retries} calls retried on another connection, \
         {renewals} renewals failed and were retried by the engine; the lease is still held",
        start.elapsed()
    );
    assert!(
        killed >= 10,
        "the test should have killed the pool's connections"
    );
    assert!(
        retries + renewals > 0,
        "no kill hit a call in flight: the test did not exercise the retry path"
    );
    assert!(!guard.token().is_cancelled());
    let holder: Option<String> = admin.get(backend.lock_key(&name)).await.expect("GET");
    let expected = format!("{}:pod-a", guard.fencing_token().expect("a fence"));
    assert_eq!(holder, Some(expected));
    assert!(
        pod_b
            .try_acquire(&name, ttl)
            .await
            .expect("acquire")
            .is_none()
    );
    // The re-acquire of the same holder keeps the fence.
    let pod_a_again = Lease::with_holder(backend.clone(), "pod-a");
    let again = pod_a_again
        .try_acquire(&name, ttl)
        .await
        .expect("acquire")
        .expect("same holder");
    assert_eq!(again.fencing_token(), fence);
    again.release().await.expect("release");
    guard.release().await.expect("release");
    drop(proxy);
}

/// A TCP server that accepts connections and never answers.
async fn black_hole() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            open.push(socket);
        }
    });
    (addr, task)
}

/// A Redis backend that cannot reach its server fails, with an error that
/// says why, and never hangs: refused at once; a silent server is given up
/// after the backend's timeout (5 s by default) — or sooner, after the
/// pool's own connection timeout, when the pool has one (redis' default is
/// 1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unreachable_is_an_error_not_a_hang() {
    use deadpool_redis::PoolError;
    use leasehold::Error;

    // Needs no server. Nothing listens on port 1: connections are refused.
    let refused = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    let pod_a = Lease::with_holder(Redis::new(refused), "pod-a");
    let start = Instant::now();
    let result = pod_a.try_acquire(&unique("redis-refused"), ms(2000)).await;
    println!(
        "refused: try_acquire answered {result:?} after {:?}",
        start.elapsed()
    );
    assert!(
        matches!(&result, Err(Error::RedisPool(PoolError::Backend(e))) if e.is_connection_refusal()),
        "{result:?}"
    );
    assert!(
        start.elapsed() < ms(1000),
        "a refused connection must fail fast, took {:?}",
        start.elapsed()
    );
    let outcome = pod_a
        .with_lease(&unique("redis-refused"), ms(2000), |_| async {
            panic!("must not run")
        })
        .await;
    assert!(
        matches!(outcome, Outcome::Skipped(Skip::Error(_))),
        "{outcome:?}"
    );

    // A server that accepts and never answers: the backend's timeout bounds
    // the call (here shorter than the pool's 1 s connection timeout).
    let (addr, task) = black_hole().await;
    let silent = deadpool_redis::Config::from_url(format!("redis://{addr}"))
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    let timeout = ms(300);
    let pod_a = Lease::with_holder(Redis::new(silent).with_timeout(timeout), "pod-a");
    let start = Instant::now();
    let result = pod_a.try_acquire(&unique("redis-silent"), ms(10_000)).await;
    let took = start.elapsed();
    println!("silent server: try_acquire answered {result:?} after {took:?} (timeout {timeout:?})");
    assert!(
        matches!(result, Err(Error::Timeout { operation: "acquire", after }) if after == timeout),
        "{result:?}"
    );
    assert!(
        took >= timeout && took < timeout + SLACK,
        "the call must end at its timeout, took {took:?}"
    );
    let outcome = pod_a
        .with_lease(&unique("redis-silent"), ms(10_000), |_| async {
            panic!("must not run")
        })
        .await;
    assert!(
        matches!(outcome, Outcome::Skipped(Skip::Error(_))),
        "{outcome:?}"
    );

    // The default timeout, 5 s, with a pool whose connections have no
    // timeouts of their own: the backend's is the one that ends the call.
    let manager = deadpool_redis::Manager::new_with_config(
        format!("redis://{addr}"),
        redis::AsyncConnectionConfig::new()
            .set_connection_timeout(None)
            .set_response_timeout(None),
    )
    .expect("manager");
    let untimed = deadpool_redis::Pool::builder(manager)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()
        .expect("pool");
    let pod_a = Lease::with_holder(Redis::new(untimed), "pod-a");
    let start = Instant::now();
    let result = pod_a.try_acquire(&unique("redis-silent"), ms(60_000)).await;
    let took = start.elapsed();
    println!("silent server, default timeout: try_acquire answered {result:?} after {took:?}");
    assert!(
        matches!(
            result,
            Err(Error::Timeout { operation: "acquire", after }) if after == Redis::DEFAULT_TIMEOUT
        ),
        "{result:?}"
    );
    assert!(
        took >= Redis::DEFAULT_TIMEOUT && took < Redis::DEFAULT_TIMEOUT + SLACK,
        "took {took:?}"
    );

    // The default timeout with redis' default connection settings: the
    // pool's connection attempt gives up first (after 1 s), with its own
    // timeout error.
    let silent = deadpool_redis::Config::from_url(format!("redis://{addr}"))
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .expect("pool");
    let pod_a = Lease::with_holder(Redis::new(silent), "pod-a");
    let start = Instant::now();
    let result = pod_a.try_acquire(&unique("redis-silent"), ms(60_000)).await;
    let took = start.elapsed();
    println!("silent server, default settings: try_acquire answered {result:?} after {took:?}");
    assert!(
        matches!(&result, Err(Error::RedisPool(PoolError::Backend(e))) if e.is_timeout()),
        "{result:?}"
    );
    assert!(
        took >= ms(1000) && took < Redis::DEFAULT_TIMEOUT,
        "took {took:?}"
    );
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fences_increase_and_survive_reacquire() {
    let Some((pool, backend)) = redis_backend().await else {
        return;
    };
    let pod_a = Lease::with_holder(backend.clone(), "pod-a");
    let pod_a_again = Lease::with_holder(backend.clone(), "pod-a");
    let pod_b = Lease::with_holder(backend.clone(), "pod-b");
    let name = unique("redis-fence");
    let ttl = ms(2000);

    let mut last = 0;
    for round in 0..3 {
        let guard = pod_a
            .try_acquire(&name, ttl)
            .await
            .expect("acquire")
            .expect("free");
        let fence = guard.fencing_token().expect("a fence");
        assert!(fence > last, "round {round}: {fence} after {last}");
        // An idempotent re-acquire by the same holder keeps the fence.
        let again = pod_a_again
            .try_acquire(&name, ttl)
            .await
            .expect("acquire")
            .expect("same holder");
        assert_eq!(again.fencing_token(), Some(fence), "round {round}");
        // Either guard's release frees the name (they are the same holder).
        again.release().await.expect("release");
        guard.release().await.expect("release");

        let outcome = pod_b
            .with_lease(&name, ttl, |token| async move { token.is_cancelled() })
            .await;
        assert!(
            matches!(outcome, Outcome::Ran(false)),
            "round {round}: {outcome:?}"
        );
        let guard_b = pod_b
            .try_acquire(&name, ttl)
            .await
            .expect("acquire")
            .expect("free");
        let fence_b = guard_b.fencing_token().expect("a fence");
        // pod-b's with_lease took fence + 1, this acquisition fence + 2.
        assert_eq!(fence_b, fence + 2, "round {round}");
        guard_b.release().await.expect("release");
        last = fence_b;
    }
    // Release deletes the lock, never the counter.
    let mut conn = pool.get().await.expect("connection");
    let counter: Option<u64> = conn.get(backend.fence_key(&name)).await.expect("GET");
    assert_eq!(counter, Some(last));
}

/// The fence key of a live lease is lost (deleted, evicted): the idempotent
/// re-acquire must still return the lease's own fence, not restart the
/// counter at 1, and the counter must not go back for later acquisitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fence_never_goes_back_when_the_fence_key_is_lost() {
    let Some((pool, backend)) = redis_backend().await else {
        return;
    };
    let pod_a = Lease::with_holder(backend.clone(), "pod-a");
    let name = unique("redis-lost-fence");
    let ttl = ms(5000);
    for _ in 0..3 {
        let guard = pod_a.try_acquire(&name, ttl).await.unwrap().expect("free");
        guard.release().await.unwrap();
    }
    let guard = pod_a.try_acquire(&name, ttl).await.unwrap().expect("free");
    let fence = guard.fencing_token().expect("a fence");
    assert_eq!(fence, 4);

    let mut conn = pool.get().await.expect("connection");
    let _: () = conn.del(backend.fence_key(&name)).await.expect("DEL");
    // The same holder (say, a restarted process that kept its identity)
    // re-acquires the live lease idempotently.
    let again = leasehold::Backend::acquire(&backend, &name, "pod-a", ttl)
        .await
        .unwrap()
        .expect("same holder");
    assert_eq!(
        again.fencing_token,
        Some(fence),
        "the re-acquire of a live lease returned another fence"
    );
    let counter: Option<u64> = conn.get(backend.fence_key(&name)).await.expect("GET");
    assert_eq!(counter, Some(fence), "the counter is put back up");
    guard.release().await.unwrap();
    let next = pod_a.try_acquire(&name, ttl).await.unwrap().expect("free");
    assert_eq!(next.fencing_token(), Some(fence + 1));
    next.release().await.unwrap();
}
