//! One kind of `PgAdvisory` or `Redis` cycle, `N` times in a row, on the
//! multi-thread runtime the benchmark uses: for profiling a cycle under
//! `perf`, `strace -c` or `valgrind`, which see one kind at a time.
//!
//! ```text
//! cargo build -p lease-bench --release --example cycles
//! perf stat -e task-clock,context-switches,cpu-migrations \
//!     ./target/release/examples/cycles with_lease 20000
//! ```
//!
//! Kinds: `floor` (the backend's acquire and release statements sent
//! directly on a pool connection, as the benchmark's floor),
//! `with_lease` (watched, the default), `unwatched` (`with_watch(false)`),
//! `sqlx` (sqlx's own `PgAdvisoryLock`); `redis-floor` (`Redis`'s acquire
//! and release scripts sent directly on one multiplexed connection),
//! `redis` (`with_lease` on `Redis::connect`), `redis-backend` (the
//! backend's `acquire` and `release` called directly, without the engine);
//! `memory` (`with_lease` on the in-memory backend: the engine alone).
//! Prints the median per cycle, and its ratio to the first floor named.
//! The servers:
//! `DATABASE_URL`, or `postgres://postgres@127.0.0.1/test`; `REDIS_URL`,
//! or `redis://127.0.0.1:6379`.

#![allow(clippy::print_stdout)]

use std::time::{Duration, Instant};

use leasehold::Lease;
use leasehold::backend::{PgAdvisory, Redis};
use sqlx::postgres::PgPoolOptions;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const TTL: Duration = Duration::from_secs(30);
const ACQUIRE: &str = "SELECT pg_try_advisory_lock($1), pg_backend_pid()";
const UNLOCK: &str = "SELECT CASE WHEN pg_advisory_unlock($1) \
     THEN (SELECT true FROM pg_notify('lease_advisory', $1::text)) ELSE false END";

/// The backend's acquire statement and its release statement on `conn`.
async fn floor_cycle(conn: &mut sqlx::PgConnection, key: i64) -> Result<(), BoxError> {
    let (locked, _pid): (bool, i32) = sqlx::query_as(ACQUIRE)
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
    if !locked {
        return Err("the floor did not acquire".into());
    }
    let _: bool = sqlx::query_scalar(UNLOCK)
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let kinds: Vec<String> = args
        .next()
        .unwrap_or_else(|| "with_lease".to_owned())
        .split(',')
        .map(str::to_owned)
        .collect();
    let n: usize = args.next().map_or(Ok(10_000), |s| s.parse())?;
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1/test".to_owned());
    let pool = PgPoolOptions::new()
        .max_connections(40)
        .test_before_acquire(false)
        .connect(&url)
        .await?;
    let watched = PgAdvisory::new(pool.clone());
    let unwatched = PgAdvisory::new(pool.clone()).with_watch(false);
    let watched_lease = Lease::with_holder(watched.clone(), "cycles");
    let unwatched_lease = Lease::with_holder(unwatched, "cycles-unwatched");
    let name = "cycles";
    let key = watched.lock_key(name);
    let sqlx_lock =
        sqlx::postgres::PgAdvisoryLock::with_key(sqlx::postgres::PgAdvisoryLockKey::BigInt(key));
    let mut own = pool.acquire().await?;
    let redis_url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let redis = Redis::connect(&redis_url).await?;
    let redis_lease = Lease::with_holder(redis.clone(), "cycles");
    let memory_lease = Lease::with_holder(leasehold::backend::Memory::new(), "cycles");
    let redis_conn = redis::Client::open(redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut times = vec![Vec::with_capacity(n); kinds.len()];
    let warm_up = 500;
    for step in 0..n + warm_up {
        for k in 0..kinds.len() {
            // In an order that rotates, as the benchmark's overhead section.
            let which = (step + k) % kinds.len();
            let start = Instant::now();
            match kinds[which].as_str() {
                "floor" => floor_cycle(&mut *pool.acquire().await?, key).await?,
                "floor-one" => floor_cycle(&mut own, key).await?,
                kind @ ("with_lease" | "unwatched") => {
                    let lease = if kind == "unwatched" {
                        &unwatched_lease
                    } else {
                        &watched_lease
                    };
                    let ran = lease.with_lease(name, TTL, |_| async {}).await;
                    if !matches!(ran, leasehold::Outcome::Ran(())) {
                        return Err(format!("{kind} did not run: {ran:?}").into());
                    }
                }
                "redis-floor" => {
                    if !lease_bench::redis_floor_cycle(&redis, &redis_conn, "cycles-floor", TTL)
                        .await?
                    {
                        return Err("the Redis floor did not acquire".into());
                    }
                }
                "redis-backend" => {
                    use leasehold::Backend as _;
                    let grant = redis.acquire(name, "cycles-backend", TTL).await?;
                    let fence = grant.ok_or("the backend did not acquire")?.fencing_token;
                    let lease = leasehold::Acquisition::new(name, "cycles-backend", fence);
                    redis.release(lease).await?;
                }
                "memory" => {
                    let ran = memory_lease.with_lease(name, TTL, |_| async {}).await;
                    if !matches!(ran, leasehold::Outcome::Ran(())) {
                        return Err(format!("memory did not run: {ran:?}").into());
                    }
                }
                "redis" => {
                    let ran = redis_lease.with_lease(name, TTL, |_| async {}).await;
                    if !matches!(ran, leasehold::Outcome::Ran(())) {
                        return Err(format!("redis did not run: {ran:?}").into());
                    }
                }
                "sqlx" => match sqlx_lock.try_acquire(pool.acquire().await?).await? {
                    sqlx::Either::Left(guard) => drop(guard.release_now().await?),
                    sqlx::Either::Right(_) => return Err("sqlx's lock did not acquire".into()),
                },
                other => return Err(format!("unknown kind {other:?}").into()),
            }
            if step >= warm_up {
                times[which].push(start.elapsed());
            }
        }
    }
    let median = |t: &mut Vec<Duration>| {
        t.sort();
        t.get(t.len() / 2).copied().unwrap_or_default()
    };
    let medians: Vec<Duration> = times.iter_mut().map(median).collect();
    let floor = kinds
        .iter()
        .position(|k| k.contains("floor"))
        .map(|i| medians[i]);
    for (kind, m) in kinds.iter().zip(&medians) {
        match floor {
            Some(f) => println!(
                "{kind}: {n} cycles, median {m:?}, / floor {:.3}",
                m.as_secs_f64() / f.as_secs_f64()
            ),
            None => println!("{kind}: {n} cycles, median {m:?}"),
        }
    }
    Ok(())
}
