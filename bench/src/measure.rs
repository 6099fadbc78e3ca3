//! The measurements: round trips per operation, overhead over the floor,
//! contention, and scale.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt, TryStreamExt};
use leasehold::{Lease, LeaseGuard};

use crate::BoxError;
use crate::servers::{Count, Counter};
use crate::targets::{Calls, Target};

const HOLDER: &str = "bench-holder";
const TTL: Duration = Duration::from_secs(30);

/// Server-counted requests per operation, in the steady state (rows exist,
/// statements prepared on the pool's connections).
#[derive(Debug, Default)]
pub(crate) struct RoundTrips {
    pub(crate) floor: f64,
    pub(crate) acquire: f64,
    pub(crate) acquire_new: f64,
    pub(crate) renew: f64,
    /// Requests for one `renew_many` of `batch` leases.
    pub(crate) renew_many: f64,
    pub(crate) batch: usize,
    pub(crate) release: f64,
    pub(crate) with_lease: f64,
    /// `PgAdvisory`: `acquire` holds acquire + release together, `release` is unused.
    pub(crate) acquire_with_release: bool,
    /// Whether a server counted the requests (all but SQLite). A count of 0
    /// is then a number like any other, not a sign that nothing counts.
    pub(crate) counted: bool,
    /// `(phase, per-command counts)` where the server tells (Redis).
    pub(crate) details: Vec<(&'static str, Count, usize)>,
    /// Redis Cluster: the hash slots of the `renew_many` batch's keys.
    pub(crate) slots: Option<usize>,
}

/// Redis Cluster: the number of distinct hash slots of the lock keys of
/// `names` (`renew_many` sends one script per slot); `None` elsewhere.
fn slots_of<'a>(t: &Target, names: impl Iterator<Item = &'a String>) -> Option<usize> {
    let Target::RedisCluster(b, _) = t else {
        return None;
    };
    let slots: std::collections::BTreeSet<u16> = names.map(|n| b.hash_slot(n)).collect();
    Some(slots.len())
}

/// How many times each counted phase runs; the smallest count is kept.
/// Requests are only ever added by others (PostgreSQL's autovacuum visits
/// the dedicated database now and then, and its transactions count there),
/// so the minimum is the phase's own count.
const REPEATS: usize = 3;

/// Count the requests of `op`, run `n` times, per run. `op` gets the
/// repetition and the index of the run.
pub(crate) async fn per_op<F, Fut>(
    counter: &mut Counter,
    details: &mut Vec<(&'static str, Count, usize)>,
    phase: &'static str,
    n: usize,
    mut op: F,
) -> Result<f64, BoxError>
where
    F: FnMut(usize, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    let mut least: Option<Count> = None;
    // Nothing runs between two repetitions: one reading ends one and starts the next.
    let mut before = counter.read().await?;
    for rep in 0..REPEATS {
        for i in 0..n {
            op(rep, i).await?;
        }
        let after = counter.read().await?;
        let delta = after.since(&before);
        before = after;
        if least.as_ref().is_none_or(|l| delta.total < l.total) {
            least = Some(delta);
        }
    }
    let delta = least.unwrap_or_default();
    let per = delta.total as f64 / n as f64;
    details.push((phase, delta, n));
    Ok(per)
}

pub(crate) async fn round_trips(
    t: &Target,
    counter: &mut Counter,
    n: usize,
    run: &str,
) -> Result<RoundTrips, BoxError> {
    let names: Vec<String> = (0..n).map(|i| format!("{run}-rt-{i}")).collect();
    let lease = t.lease(HOLDER);
    let wl_name = format!("{run}-rt-with-lease");
    let floor_name = format!("{run}-rt-floor");
    let mut redis_conn = None;
    // Warm up: create the rows, prepare every statement on the connections.
    for _ in 0..3 {
        for name in &names {
            t.acquire(name, HOLDER, TTL).await?;
        }
        for name in &names {
            t.renew(name, HOLDER, TTL).await?;
        }
        let batch: Vec<(&str, Duration)> = names.iter().map(|n| (n.as_str(), TTL)).collect();
        t.renew_many(HOLDER, &batch).await?;
        for name in &names {
            t.release(name, HOLDER).await?;
        }
        for _ in 0..n {
            t.floor_cycle(&mut redis_conn, &floor_name, "bench-floor", TTL)
                .await?;
            let _ = lease.with_lease(&wl_name, TTL, |_| async {}).await;
        }
    }

    let mut rt = RoundTrips {
        batch: n,
        counted: counter.counts(),
        slots: slots_of(t, names.iter()),
        ..RoundTrips::default()
    };
    if matches!(t, Target::PgAdvisory(..)) {
        advisory_round_trips(t, counter, &names, &lease, &wl_name, &mut rt).await?;
        return Ok(rt);
    }
    let d = &mut rt.details;
    rt.floor = per_op(counter, d, "floor", n, |_, _| {
        // A clone of the same multiplexed connection (Redis).
        let (floor_name, mut conn) = (&floor_name, redis_conn.clone());
        async move {
            t.floor_cycle(&mut conn, floor_name, "bench-floor", TTL)
                .await
                .map(drop)
        }
    })
    .await?;
    rt.acquire = per_op(counter, d, "acquire", n, |_, i| {
        let name = &names[i];
        async move {
            if !t.acquire(name, HOLDER, TTL).await? {
                return Err(format!("{name} was not acquired").into());
            }
            Ok(())
        }
    })
    .await?;
    rt.renew = per_op(counter, d, "renew", n, |_, i| {
        let name = &names[i];
        async move {
            if !t.renew(name, HOLDER, TTL).await? {
                return Err(format!("{name} was not renewed").into());
            }
            Ok(())
        }
    })
    .await?;
    let batch: Vec<(&str, Duration)> = names.iter().map(|n| (n.as_str(), TTL)).collect();
    rt.renew_many = per_op(counter, d, "renew_many", 1, |_, _| {
        let batch = &batch;
        async move {
            let renewed = t.renew_many(HOLDER, batch).await?;
            if renewed.iter().any(|r| !r) {
                return Err("renew_many lost a lease".into());
            }
            Ok(())
        }
    })
    .await?;
    // Each repetition releases leases that are held (acquired before the
    // count starts): releasing one already released may cost less (on
    // etcd, the transaction finds no key and nothing is revoked).
    for name in &names {
        t.release(name, HOLDER).await?;
    }
    let held: Vec<String> = (0..n * REPEATS)
        .map(|i| format!("{run}-rt-held-{i}"))
        .collect();
    for name in &held {
        if !t.acquire(name, HOLDER, TTL).await? {
            return Err(format!("{name} was not acquired").into());
        }
    }
    rt.release = per_op(counter, d, "release", n, |rep, i| {
        let name = &held[rep * n + i];
        async move { Ok(t.release(name, HOLDER).await?) }
    })
    .await?;
    rt.with_lease = per_op(counter, d, "with_lease", n, |_, _| {
        let (lease, wl_name) = (&lease, &wl_name);
        async move {
            match lease.with_lease(wl_name, TTL, |_| async {}).await {
                leasehold::Outcome::Ran(()) => Ok(()),
                other => Err(format!("with_lease did not run: {other:?}").into()),
            }
        }
    })
    .await?;
    let fresh: Vec<String> = (0..n * REPEATS)
        .map(|i| format!("{run}-rt-new-{i}"))
        .collect();
    rt.acquire_new = per_op(counter, d, "acquire (new name)", n, |rep, i| {
        let name = &fresh[rep * n + i];
        async move {
            if !t.acquire(name, HOLDER, TTL).await? {
                return Err(format!("{name} was not acquired").into());
            }
            Ok(())
        }
    })
    .await?;
    for name in &fresh {
        t.release(name, HOLDER).await?;
    }
    Ok(rt)
}

/// `PgAdvisory` holds each lock on a connection of its own, and PostgreSQL
/// flushes the statistics of such a connection only once it is back in the
/// pool: count phases that end with every lock released, and take the
/// differences.
async fn advisory_round_trips(
    t: &Target,
    counter: &mut Counter,
    names: &[String],
    lease: &Lease,
    wl_name: &str,
    rt: &mut RoundTrips,
) -> Result<(), BoxError> {
    let n = names.len();
    // The pool hands out its idle connections in turn: each one must have
    // prepared these statements before they are counted.
    for _ in 0..2 * crate::servers::POOL_SIZE {
        let name = &names[0];
        t.acquire(name, HOLDER, TTL).await?;
        t.renew(name, HOLDER, TTL).await?;
        t.release(name, HOLDER).await?;
        t.floor_cycle(&mut None, "bench-floor", "bench-floor", TTL)
            .await?;
    }
    let d = &mut rt.details;
    rt.floor = per_op(counter, d, "floor", n, |_, _| async move {
        t.floor_cycle(&mut None, "bench-floor", "bench-floor", TTL)
            .await
            .map(drop)
    })
    .await?;
    let held = |name: &str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(BoxError::from(format!(
                "{name} was not acquired or renewed"
            )))
        }
    };
    let acquire_release = per_op(counter, d, "acquire + release", n, |_, i| {
        let name = &names[i];
        async move {
            held(name, t.acquire(name, HOLDER, TTL).await?)?;
            Ok(t.release(name, HOLDER).await?)
        }
    })
    .await?;
    let with_renew = per_op(counter, d, "acquire + renew + release", n, |_, i| {
        let name = &names[i];
        async move {
            held(name, t.acquire(name, HOLDER, TTL).await?)?;
            held(name, t.renew(name, HOLDER, TTL).await?)?;
            Ok(t.release(name, HOLDER).await?)
        }
    })
    .await?;
    // The same acquisitions and releases without the batch, to subtract
    // (with their `UNLISTEN *`s, watched).
    let all = per_op(
        counter,
        d,
        "acquire all + release all",
        1,
        |_, _| async move {
            for name in names {
                held(name, t.acquire(name, HOLDER, TTL).await?)?;
            }
            for name in names {
                t.release(name, HOLDER).await?;
            }
            Ok(())
        },
    )
    .await?;
    let batch: Vec<(&str, Duration)> = names.iter().map(|n| (n.as_str(), TTL)).collect();
    let with_batch = per_op(
        counter,
        d,
        "acquire all + renew_many + release all",
        1,
        |_, _| {
            let batch = &batch;
            async move {
                for name in names {
                    held(name, t.acquire(name, HOLDER, TTL).await?)?;
                }
                if t.renew_many(HOLDER, batch).await?.iter().any(|r| !r) {
                    return Err("renew_many lost a lease".into());
                }
                for name in names {
                    t.release(name, HOLDER).await?;
                }
                Ok(())
            }
        },
    )
    .await?;
    rt.with_lease = per_op(counter, d, "with_lease", n, |_, _| async move {
        match lease.with_lease(wl_name, TTL, |_| async {}).await {
            leasehold::Outcome::Ran(()) => Ok(()),
            other => Err(format!("with_lease did not run: {other:?}").into()),
        }
    })
    .await?;
    rt.acquire = acquire_release;
    rt.acquire_with_release = true;
    rt.renew = with_renew - acquire_release;
    rt.renew_many = with_batch - all;
    rt.acquire_new = f64::NAN;
    Ok(())
}

/// Summary of a set of latency samples.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stats {
    pub(crate) median: Duration,
    pub(crate) p99: Duration,
    pub(crate) n: usize,
}

impl Stats {
    pub(crate) fn of(samples: &mut [Duration]) -> Stats {
        if samples.is_empty() {
            return Stats::default();
        }
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Stats {
            median: at(0.5),
            p99: at(0.99),
            n: samples.len(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Overhead {
    pub(crate) floor: Stats,
    pub(crate) with_lease: Stats,
    pub(crate) singleton: Stats,
    pub(crate) sqlx_lock: Option<Stats>,
    /// Every floor and `with_lease` sample, for the plot of their spread.
    pub(crate) samples: (Vec<Duration>, Vec<Duration>),
}

/// `#[singleton]` on an empty body, on the `Lease` passed in.
#[leasehold::singleton(name = "bench-singleton", ttl = "30s", lease = lease)]
async fn singleton_job(lease: &Lease) {}

/// The same, hand-written with `with_lease`.
async fn with_lease_job(lease: &Lease) {
    let _ = lease.with_lease("bench-singleton", TTL, |_| async {}).await;
}

/// Median time of a `with_lease` cycle with an empty job, of the same
/// cycle through `#[singleton]`, and of the floor, sampled in interleaved
/// blocks so that a change of load affects all alike.
pub(crate) async fn overhead(
    t: &Target,
    rounds: usize,
    block: usize,
) -> Result<Overhead, BoxError> {
    let lease = t.lease(HOLDER);
    let mut redis_conn = None;
    let advisory = matches!(t, Target::PgAdvisory(..));
    let (mut floor, mut wl, mut sg, mut sq) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // Warm up every path.
    for _ in 0..block.max(50) {
        t.floor_cycle(&mut redis_conn, "bench-floor", "bench-floor", TTL)
            .await?;
        with_lease_job(&lease).await;
        singleton_job(&lease).await;
        if advisory {
            t.sqlx_lock_cycle("bench-sqlx-lock").await?;
        }
    }
    // One cycle of each variant per step, in an order that rotates, so that
    // a change of load (or a neighbour's burst) hits all of them alike.
    let variants = if advisory { 4 } else { 3 };
    for step in 0..rounds * block {
        for k in 0..variants {
            let start = Instant::now();
            match (step + k) % variants {
                0 => {
                    let ok = t
                        .floor_cycle(&mut redis_conn, "bench-floor", "bench-floor", TTL)
                        .await?;
                    floor.push(start.elapsed());
                    if !ok {
                        return Err("the floor did not acquire".into());
                    }
                }
                1 => {
                    with_lease_job(&lease).await;
                    wl.push(start.elapsed());
                }
                2 => {
                    singleton_job(&lease).await;
                    sg.push(start.elapsed());
                }
                _ => {
                    t.sqlx_lock_cycle("bench-sqlx-lock").await?;
                    sq.push(start.elapsed());
                }
            }
        }
    }
    // Make sure the cycles really ran (and were not skipped).
    let ran = lease
        .with_lease("bench-singleton", TTL, |_| async { true })
        .await;
    if !matches!(ran, leasehold::Outcome::Ran(true)) {
        return Err(format!("with_lease did not run: {ran:?}").into());
    }
    Ok(Overhead {
        floor: Stats::of(&mut floor),
        with_lease: Stats::of(&mut wl),
        singleton: Stats::of(&mut sg),
        sqlx_lock: advisory.then(|| Stats::of(&mut sq)),
        samples: (floor, wl),
    })
}

#[derive(Debug, Default)]
pub(crate) struct Contention {
    pub(crate) names: usize,
    pub(crate) secs: f64,
    pub(crate) attempts: u64,
    pub(crate) acquisitions: u64,
    pub(crate) errors: u64,
    pub(crate) latency: Stats,
    /// Server-counted requests per successful acquisition (acquire attempts
    /// and releases together).
    pub(crate) requests_per_acquisition: Option<f64>,
}

/// `contenders` holders (one `Lease` each) loop `try_acquire` + `release`
/// for `duration`, on one name or one name each.
pub(crate) async fn contention(
    t: &Target,
    counter: &mut Counter,
    contenders: usize,
    one_name: bool,
    duration: Duration,
    run: &str,
) -> Result<Contention, BoxError> {
    let names = if one_name { 1 } else { contenders };
    let attempts = Arc::new(AtomicU64::new(0));
    let acquisitions = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let leases: Vec<Lease> = (0..contenders)
        .map(|i| t.lease(&format!("bench-contender-{i}")))
        .collect();
    let name_of = |i: usize| format!("{run}-contention-{names}-{}", i % names);
    // Warm up (rows, prepared statements), not counted.
    for (i, lease) in leases.iter().enumerate() {
        let _ = lease.with_lease(&name_of(i), TTL, |_| async {}).await;
    }
    let before = counter.read().await?;
    let start = Instant::now();
    let end = start + duration;
    let tasks: Vec<_> = leases
        .into_iter()
        .enumerate()
        .map(|(i, lease)| {
            let name = name_of(i);
            let (attempts, acquisitions, errors) =
                (attempts.clone(), acquisitions.clone(), errors.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < end {
                    let t0 = Instant::now();
                    let got = lease.try_acquire(&name, TTL).await;
                    latencies.push(t0.elapsed());
                    attempts.fetch_add(1, Ordering::Relaxed);
                    match got {
                        Ok(Some(guard)) => {
                            acquisitions.fetch_add(1, Ordering::Relaxed);
                            if guard.release().await.is_err() {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(None) => tokio::task::yield_now().await,
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await?);
    }
    let secs = start.elapsed().as_secs_f64();
    let delta = counter.read().await?.since(&before);
    let acquisitions = acquisitions.load(Ordering::Relaxed);
    Ok(Contention {
        names,
        secs,
        attempts: attempts.load(Ordering::Relaxed),
        acquisitions,
        errors: errors.load(Ordering::Relaxed),
        latency: Stats::of(&mut latencies),
        requests_per_acquisition: (counter.counts() && acquisitions > 0)
            .then(|| delta.total as f64 / acquisitions as f64),
    })
}

#[derive(Debug, Default)]
pub(crate) struct Scale {
    pub(crate) leases: usize,
    pub(crate) batched: bool,
    pub(crate) ttl: Duration,
    pub(crate) acquire_secs: f64,
    /// Renewal requests the server counted in one ttl/3 window.
    pub(crate) server_requests: Option<u64>,
    /// `renew` + `renew_many` calls the engine made in that window.
    pub(crate) calls: u64,
    /// Leases renewed in that window (each lease should be renewed once).
    pub(crate) renewed: u64,
    /// `renew` + `renew_many` calls the engine made while the server
    /// counted (between the ends of its two readings), to compare with
    /// [`server_requests`](Self::server_requests).
    pub(crate) counted_calls: u64,
    /// Sizes of the calls in the window, with their time after the first
    /// acquisition, in ms.
    pub(crate) batches: Vec<(u128, usize)>,
    pub(crate) cpu_ms: f64,
    pub(crate) rss_kib_per_lease: f64,
    /// Redis Cluster: the hash slots of the leases' keys.
    pub(crate) slots: Option<usize>,
}

/// One `Lease` acquires `n` leases with time-to-live `ttl` (64 at a time),
/// holds them, and we watch one renewal window of `ttl/3`:
/// `[t0 + ttl/3 - 0.5 s, t0 + 2 ttl/3 - 0.5 s)` where `t0` is the first
/// acquisition, which holds exactly one renewal of every lease when the
/// acquisitions take less than `ttl/3 - 2 s`.
pub(crate) async fn scale(
    t: &Target,
    counter: &mut Counter,
    n: usize,
    batched: bool,
    ttl: Duration,
    run: &str,
) -> Result<Scale, BoxError> {
    let calls = Arc::new(Calls::default());
    let lease = t.counted_lease(HOLDER, batched, calls.clone());
    let period = ttl / 3;
    let names: Vec<String> = (0..n)
        .map(|i| format!("{run}-scale-{n}-{batched}-{i}"))
        .collect();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    calls.start.get_or_init(|| t0);
    let guards: Vec<LeaseGuard> = stream::iter(names.iter())
        .map(|name| {
            let lease = lease.clone();
            async move {
                lease
                    .try_acquire(name, ttl)
                    .await?
                    .ok_or_else(|| BoxError::from(format!("{name} is held elsewhere")))
            }
        })
        .buffer_unordered(64)
        .try_collect()
        .await?;
    let acquire_secs = t0.elapsed().as_secs_f64();
    let rss1 = rss_kib();
    let early = (period / 4).min(Duration::from_millis(500));
    let from = t0 + period - early;
    let to = t0 + 2 * period - early;
    // A PostgreSQL reading takes a few hundred ms to settle (up to ~1.3 s
    // on a busy machine): start it early enough, but after the acquisitions.
    let settle = if matches!(counter, Counter::Pg { .. }) {
        Duration::from_millis(1600).min(period / 2)
    } else {
        Duration::ZERO
    };
    if Instant::now() + settle > from {
        return Err(format!(
            "acquiring {n} leases took {acquire_secs:.1} s, too long to watch a clean window"
        )
        .into());
    }
    // The engine's calls are counted from their log over the window itself;
    // the server's count covers the time between the ends of its two
    // readings, which take a variable time (long on a busy machine), so it
    // is compared with the calls logged between those two instants.
    tokio::time::sleep_until((from - settle).into()).await;
    let before = counter.read().await?;
    let counted_from = t0.elapsed().as_millis();
    let cpu0 = cpu_ms();
    tokio::time::sleep_until((to - settle).into()).await;
    let after = counter.read().await?;
    let counted_to = t0.elapsed().as_millis();
    let cpu1 = cpu_ms();
    let lo = (from - t0).as_millis();
    let hi = (to - t0).as_millis();
    let log = calls.log.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let batches: Vec<(u128, usize)> = log
        .iter()
        .filter(|(at, _)| (lo..hi).contains(at))
        .copied()
        .collect();
    let counted_calls = log
        .iter()
        .filter(|(at, _)| (counted_from..counted_to).contains(at))
        .count() as u64;
    let lost = guards.iter().filter(|g| !g.is_valid()).count();
    if lost > 0 {
        return Err(format!("{lost} of {n} leases were lost while held").into());
    }
    stream::iter(guards)
        .map(|g| g.release())
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(Scale {
        leases: n,
        batched,
        ttl,
        acquire_secs,
        server_requests: counter.counts().then(|| after.since(&before).total),
        calls: batches.len() as u64,
        renewed: batches.iter().map(|&(_, n)| n as u64).sum(),
        counted_calls,
        batches: summarize(&batches),
        cpu_ms: cpu1 - cpu0,
        rss_kib_per_lease: (rss1.saturating_sub(rss0)) as f64 / n as f64,
        slots: slots_of(t, names.iter()),
    })
}

/// Group calls made within 50 ms of each other: `(first ms, leases)`.
fn summarize(calls: &[(u128, usize)]) -> Vec<(u128, usize)> {
    let mut out: Vec<(u128, usize, u128)> = Vec::new();
    for &(at, n) in calls {
        match out.last_mut() {
            Some((_, total, last)) if at - *last <= 50 => {
                *total += n;
                *last = at;
            }
            _ => out.push((at, n, at)),
        }
    }
    out.into_iter().map(|(at, n, _)| (at, n)).collect()
}

/// Resident memory of this process, in KiB.
pub(crate) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time of this process's live threads, in ms (`/proc/self/task/*/schedstat`).
pub(crate) fn cpu_ms() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let mut ns: u64 = 0;
    for task in tasks.flatten() {
        if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    ns as f64 / 1e6
}

/// The engine alone, on the in-memory backend: CPU and wall time to acquire
/// `n` leases (64 at a time) through one `Lease`, and to release them.
pub(crate) async fn engine_only(n: usize) -> Result<(f64, f64, f64), BoxError> {
    let lease = Lease::with_holder(leasehold::backend::Memory::new(), HOLDER);
    let names: Vec<String> = (0..n).map(|i| format!("engine-{i}")).collect();
    let (cpu0, t0) = (cpu_ms(), Instant::now());
    let guards: Vec<LeaseGuard> = stream::iter(names.iter())
        .map(|name| {
            let lease = lease.clone();
            async move {
                lease
                    .try_acquire(name, TTL)
                    .await?
                    .ok_or_else(|| BoxError::from(format!("{name} is held elsewhere")))
            }
        })
        .buffer_unordered(64)
        .try_collect()
        .await?;
    let (cpu1, wall) = (cpu_ms(), t0.elapsed().as_secs_f64() * 1e3);
    stream::iter(guards)
        .map(|g| g.release())
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await?;
    let cpu2 = cpu_ms();
    Ok((wall, cpu1 - cpu0, cpu2 - cpu1))
}
