//! Hand-over: how soon a waiting [`Lease::acquire`] gets a lease that its
//! holder released, with the backend's push ([`Backend::released`]: PostgreSQL
//! `LISTEN/NOTIFY`, Redis `PUBLISH`, also on a Redis Cluster, which passes
//! it to every node; `Etcd`'s watch) and without it (the polling baseline,
//! measured in the same run); and how soon it takes a crashed holder's lease
//! after its expiry.
//!
//! Every sample is one holder and one waiter, each a `Lease` of its own on
//! the same backend value (so one listening connection). The waiter's
//! backend is wrapped in [`Probe`], which tells when the waiter's first
//! attempt found the lease held, and which, for the baseline, keeps the
//! trait's default `released` (it waits the poll interval), as a backend
//! without push would.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold::backend::PgAdvisory;
use leasehold::{Acquisition, Backend, Error, Grant, Lease, LeaseInfo};
use tokio::sync::Notify;

use crate::BoxError;
use crate::measure::Stats;
use crate::targets::Target;

/// What the hand-over section measured on one backend.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    /// One round trip: the median of the backend's floor cycle (its acquire
    /// and release statements sent directly, as in the overhead section),
    /// divided by its requests (2; `Etcd`: 4).
    pub(crate) rtt: Duration,
    /// The ttl of the hand-over samples (the waiter polls every ttl/10, ±20%).
    pub(crate) ttl: Duration,
    /// From the holder's `release()` returning to the waiter's `acquire`
    /// returning, with the backend's push.
    pub(crate) push: Stats,
    /// With push: from the holder's `release()` returning to the push
    /// waking the waiter (its `released` resolving); the rest of the
    /// hand-over is the waiter's acquisition.
    pub(crate) woken: Stats,
    /// With push, the rest, p50s: from the wake-up to the backend's
    /// `acquire` called; that call; from its return to the waiter's
    /// `acquire` returning.
    pub(crate) phases: [Stats; 3],
    /// The same, the waiter polling (the baseline).
    pub(crate) poll: Stats,
    /// The ttl of the crash samples.
    pub(crate) crash_ttl: Duration,
    /// From the crashed holder's expiry (the earliest instant it can have
    /// expired: its acquire sent + ttl; `PgAdvisory`: its session ended) to
    /// the waiter's `acquire` returning.
    pub(crate) crash: Stats,
    /// Whether the backend can push releases in this run.
    pub(crate) pushes: bool,
    /// Every sample of [`push`](Self::push) and [`poll`](Self::poll), for the plot.
    pub(crate) samples: (Vec<Duration>, Vec<Duration>),
}

/// How many samples of each kind.
pub(crate) struct Samples {
    pub(crate) push: usize,
    pub(crate) poll: usize,
    pub(crate) crash: usize,
}

/// The waiter's attempts that found the lease held, and a wake-up for each;
/// when the backend's push last woke the waiter.
#[derive(Default)]
struct Held {
    count: AtomicU64,
    changed: Notify,
    woken: std::sync::Mutex<Option<Instant>>,
    /// When the waiter's last successful backend `acquire` was called, and
    /// when it returned.
    granted: std::sync::Mutex<Option<(Instant, Instant)>>,
}

/// The waiter's backend: `inner`, with its push (`push`) or without (the
/// trait's default `released`, polling), counting the acquisitions it was
/// refused.
struct Probe<B> {
    inner: B,
    push: bool,
    held: Arc<Held>,
}

impl<B: Backend> Backend for Probe<B> {
    async fn acquire(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Grant>, Error> {
        let called = Instant::now();
        let grant = self.inner.acquire(name, holder, ttl).await;
        if matches!(grant, Ok(Some(_))) {
            *self.held.granted.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((called, Instant::now()));
        }
        if matches!(grant, Ok(None)) {
            self.held.count.fetch_add(1, Ordering::SeqCst);
            self.held.changed.notify_waiters();
        }
        grant
    }

    async fn renew(&self, lease: Acquisition<'_>, ttl: Duration) -> Result<bool, Error> {
        self.inner.renew(lease, ttl).await
    }

    async fn release(&self, lease: Acquisition<'_>) -> Result<(), Error> {
        self.inner.release(lease).await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>, Error> {
        self.inner.inspect(name).await
    }

    fn released(&self, name: &str, poll: Duration) -> impl Future<Output = ()> + Send + 'static {
        let pushed = self.push.then(|| self.inner.released(name, poll));
        let held = self.held.clone();
        async move {
            match pushed {
                Some(pushed) => {
                    pushed.await;
                    *held.woken.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                }
                None => tokio::time::sleep(poll).await,
            }
        }
    }
}

impl Held {
    /// Wait until the count exceeds `seen` (at most `limit`).
    async fn wait_past(&self, seen: u64, limit: Duration) -> Result<(), BoxError> {
        let until = Instant::now() + limit;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.count.load(Ordering::SeqCst) > seen {
                return Ok(());
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err("the waiter's first attempt did not come back".into());
            }
            let _ = tokio::time::timeout(left, changed).await;
        }
    }
}

/// A `Lease` for the waiter: `t`'s backend value in a [`Probe`].
fn waiter(t: &Target, holder: &str, push: bool, held: &Arc<Held>) -> Lease {
    let held = held.clone();
    match t {
        Target::Pg(b) => Lease::with_holder(probe(b.clone(), push, held), holder),
        Target::MySql(b) => Lease::with_holder(probe(b.clone(), push, held), holder),
        Target::Sqlite(b) => Lease::with_holder(probe(b.clone(), push, held), holder),
        Target::Redis(b, _) => Lease::with_holder(probe(b.clone(), push, held), holder),
        Target::PgAdvisory(b, _) => Lease::with_holder(probe(b.clone(), push, held), holder),
        Target::Etcd(b) => Lease::with_holder(probe((**b).clone(), push, held), holder),
        Target::RedisCluster(b, _) => Lease::with_holder(probe(b.clone(), push, held), holder),
    }
}

fn probe<B>(inner: B, push: bool, held: Arc<Held>) -> Probe<B> {
    Probe { inner, push, held }
}

/// A number in `[0, 1)`, different on every call.
fn fraction() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let bits = RandomState::new().hash_one(Instant::now()) >> 11;
    bits as f64 / (1u64 << 53) as f64
}

/// How long a waiting `acquire` with `ttl` polls (the library's rule:
/// ttl/10 between 10 ms and 1 s), before its ±20% jitter.
fn poll_interval(ttl: Duration) -> Duration {
    (ttl / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Start `waiter.acquire(name)` and wait until its first attempt found the
/// lease held; the task returns when its `acquire` returned, and when.
async fn start_waiting(
    waiter: &Lease,
    held: &Held,
    name: &str,
    ttl: Duration,
) -> Result<tokio::task::JoinHandle<Result<Instant, BoxError>>, BoxError> {
    let seen = held.count.load(Ordering::SeqCst);
    let (w, n) = (waiter.clone(), name.to_owned());
    let task = tokio::spawn(async move {
        let got = w.acquire(&n, ttl, Duration::from_secs(30)).await;
        let done = Instant::now();
        let guard = got?.ok_or_else(|| format!("the waiter did not get {n} within 30 s"))?;
        guard.release().await?;
        Ok(done)
    });
    held.wait_past(seen, Duration::from_secs(10)).await?;
    Ok(task)
}

/// One hand-over's latency, and where it went (with push).
struct Sample {
    took: Duration,
    /// Release → woken, woken → backend called, backend call, → returned.
    phases: Option<[Duration; 4]>,
}

/// One hand-over: the holder holds, the waiter waits, the holder releases
/// after a random part of a poll interval (so that the release falls
/// anywhere in the baseline's polling cycle).
async fn one_handover(
    holder: &Lease,
    waiter: &Lease,
    held: &Held,
    name: &str,
    ttl: Duration,
) -> Result<Sample, BoxError> {
    let guard = holder
        .try_acquire(name, ttl)
        .await?
        .ok_or_else(|| format!("the holder could not acquire {name}"))?;
    let task = start_waiting(waiter, held, name, ttl).await?;
    tokio::time::sleep(poll_interval(ttl).mul_f64(fraction())).await;
    guard.release().await?;
    let released = Instant::now();
    let acquired = task.await??;
    let woken = held.woken.lock().unwrap_or_else(|e| e.into_inner()).take();
    let granted = held
        .granted
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let phases = woken.zip(granted).map(|(woken, (called, returned))| {
        [
            woken.saturating_duration_since(released),
            called.saturating_duration_since(woken),
            returned.saturating_duration_since(called),
            acquired.saturating_duration_since(returned),
        ]
    });
    Ok(Sample {
        took: acquired.saturating_duration_since(released),
        phases,
    })
}

/// One crash: a holder acquires through the backend directly and never
/// renews nor releases; the waiter takes the lease after its expiry.
async fn one_crash(
    t: &Target,
    waiter: &Lease,
    held: &Held,
    name: &str,
    ttl: Duration,
) -> Result<Duration, BoxError> {
    if let Target::PgAdvisory(_, pool) = t {
        return advisory_crash(pool, waiter, held, name, ttl).await;
    }
    // A crash falls at any instant: without this pause each sample would
    // start right after the last take-over, in step with any periodic
    // expiry sweep of the server (etcd's lessor checks every 500 ms), and
    // report one point of that sweep's cycle instead of its spread.
    tokio::time::sleep(Duration::from_secs(1).mul_f64(fraction())).await;
    let sent = Instant::now();
    if !t.acquire(name, "bench-crashed", ttl).await? {
        return Err(format!("the crashing holder could not acquire {name}").into());
    }
    let task = start_waiting(waiter, held, name, ttl).await?;
    let acquired = task.await??;
    Ok(acquired.saturating_duration_since(sent + ttl))
}

/// `PgAdvisory`'s lock lasts as long as its session: the holder crashes when
/// its session is terminated (what the server sees of a killed process).
async fn advisory_crash(
    pool: &sqlx::PgPool,
    waiter: &Lease,
    held: &Held,
    name: &str,
    ttl: Duration,
) -> Result<Duration, BoxError> {
    const APP: &str = "lease-bench-crashed";
    let options = pool
        .connect_options()
        .as_ref()
        .clone()
        .application_name(APP);
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(options)
        .await?;
    let crashed = PgAdvisory::new(own.clone());
    if crashed.acquire(name, "bench-crashed", ttl).await?.is_none() {
        return Err(format!("the crashing holder could not acquire {name}").into());
    }
    let task = start_waiting(waiter, held, name, ttl).await?;
    // The session ends, its lock with it, between this instant and the
    // answer (the call waits up to 5 s for it).
    let gone = Instant::now();
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(APP)
    .fetch_all(pool)
    .await?;
    if !ended.iter().any(|e| *e) {
        return Err("the crashing holder's session was not terminated".into());
    }
    let acquired = task.await??;
    drop(crashed);
    own.close().await;
    Ok(acquired.saturating_duration_since(gone))
}

/// Measure the hand-over section on `t`.
pub(crate) async fn handover(
    t: &Target,
    samples: &Samples,
    run: &str,
) -> Result<Handover, BoxError> {
    let ttl = Duration::from_secs(2);
    let crash_ttl = Duration::from_secs(1);
    // One round trip: the overhead section's floor, halved.
    let mut redis_conn = None;
    let floor_name = format!("{run}-handover-floor");
    let mut floor = Vec::new();
    for i in 0..60 {
        let start = Instant::now();
        t.floor_cycle(&mut redis_conn, &floor_name, "bench-floor", ttl)
            .await?;
        if i >= 10 {
            floor.push(start.elapsed());
        }
    }
    let rtt = Stats::of(&mut floor).median / t.floor_requests();

    let held = Arc::new(Held::default());
    let holder = t.lease("bench-handover-holder");
    let pushing = waiter(t, "bench-handover-waiter", true, &held);
    let polling = waiter(t, "bench-handover-poller", false, &held);
    let name = format!("{run}-handover");
    // Warm up: the listening connection, the statements on both paths.
    for w in [&pushing, &polling] {
        for _ in 0..2 {
            one_handover(&holder, w, &held, &name, ttl).await?;
        }
    }
    // Interleaved, so that a change of load hits both alike.
    let (mut push, mut poll) = (Vec::new(), Vec::new());
    let mut phases: [Vec<Duration>; 4] = Default::default();
    for i in 0..samples.push.max(samples.poll) {
        if i < samples.push {
            let sample = one_handover(&holder, &pushing, &held, &name, ttl).await?;
            push.push(sample.took);
            for (all, one) in phases.iter_mut().zip(sample.phases.into_iter().flatten()) {
                all.push(one);
            }
        }
        if i < samples.poll {
            poll.push(
                one_handover(&holder, &polling, &held, &name, ttl)
                    .await?
                    .took,
            );
        }
    }
    let [mut woken, mut to_call, mut call, mut back] = phases;
    let mut crash = Vec::new();
    for i in 0..samples.crash {
        let name = format!("{run}-crash-{i}");
        crash.push(one_crash(t, &pushing, &held, &name, crash_ttl).await?);
    }
    let samples = (push.clone(), poll.clone());
    Ok(Handover {
        rtt,
        ttl,
        samples,
        push: Stats::of(&mut push),
        woken: Stats::of(&mut woken),
        phases: [
            Stats::of(&mut to_call),
            Stats::of(&mut call),
            Stats::of(&mut back),
        ],
        poll: Stats::of(&mut poll),
        crash_ttl,
        crash: Stats::of(&mut crash),
        pushes: matches!(
            t,
            Target::Pg(_)
                | Target::PgAdvisory(..)
                | Target::Redis(..)
                | Target::RedisCluster(..)
                | Target::Etcd(_)
        ),
    })
}

/// The hand-over table, in Markdown, onto `s`.
pub(crate) fn report<'a>(
    s: &mut String,
    quick: bool,
    all: impl Iterator<Item = (&'static str, &'a Handover)>,
) {
    use std::fmt::Write as _;
    let all: Vec<_> = all.collect();
    let Some((_, first)) = all.first() else {
        return;
    };
    let ms = |d: Duration| {
        if d < Duration::from_millis(10) {
            format!("{:.0} µs", d.as_secs_f64() * 1e6)
        } else {
            format!("{:.1} ms", d.as_secs_f64() * 1e3)
        }
    };
    let rtts = |d: Duration, rtt: Duration| d.as_secs_f64() / rtt.as_secs_f64();
    let _ = writeln!(s, "\n### Hand-over: a waiting `acquire`\n");
    let _ = writeln!(
        s,
        "One holder and one waiter, each a `Lease` of its own on the same backend value. The holder acquires; the waiter calls `acquire` (wait 30 s) and finds the lease held; the holder releases after a random part of a poll interval. Hand-over: from the holder's `release()` returning to the waiter's `acquire` returning. *Push*: the backend's `released` (PostgreSQL `LISTEN/NOTIFY`, Redis `PUBLISH`, on a Redis Cluster too, which passes it to every node; `Etcd`'s watch); *polling*: the same waiter with the trait's default `released`, which waits the poll interval (ttl/10 = {} here, ±20%), as a backend without push does — the baseline, sampled interleaved with push. One round trip (RTT): the median of the backend's own acquire and release statements sent directly (the overhead section's floor), divided by their number (2; `Etcd`: 4, a grant and a transaction to acquire, a transaction and a revoke to release). Crash: after a random pause of up to 1 s (so that crashes fall anywhere in a server's expiry sweep), a holder acquires through the backend and never renews nor releases (`PgAdvisory`: its session is terminated); from its expiry (its acquire sent + ttl of {}; `PgAdvisory`: the session's end) to the waiter's `acquire` returning — the waiter sleeps until the expiry its refused attempt reported, plus a jitter of at most 5 ms; on `Etcd` its watch sees the key deleted when etcd revokes the expired lease, which etcd's leader does from a sweep every 500 ms. Required: push p50 ≤ {} RTT on `PgTable`, `PgAdvisory`, `Redis`, `RedisCluster` and `Etcd`{}; crash take-over p50 ≤ 2 RTT + {} ms after the expiry on every backend with expiry (`Etcd`: + the 500 ms of its sweep).\n",
        ms(poll_interval(first.ttl)),
        ms(first.crash_ttl),
        if quick {
            crate::QUICK_HANDOVER_RTT_BOUND
        } else {
            crate::HANDOVER_RTT_TARGET
        },
        if quick {
            format!(
                " (the quick run's bound; the full run's target is {})",
                crate::HANDOVER_RTT_TARGET
            )
        } else {
            String::new()
        },
        if quick {
            crate::checks::QUICK_CRASH_SLACK
        } else {
            crate::checks::CRASH_SLACK
        }
        .as_millis(),
    );
    let _ = writeln!(
        s,
        "| backend | RTT | push: p50 | push: p99 | **push p50 in RTT** | push: woken after, p50 | then: to the backend's acquire / its call / back to the caller, p50s | polling: p50 | polling: p99 | polling p50 / push p50 | crash take-over: p50 | crash: p99 | samples (push, polling, crash) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, h) in all {
        let push = if h.pushes { "" } else { " (no push: polls)" };
        let _ = writeln!(
            s,
            "| {label}{push} | {} | {} | {} | **{:.2}** | {} | {} | {} | {} | {:.1} | {} | {} | {}, {}, {} |",
            ms(h.rtt),
            ms(h.push.median),
            ms(h.push.p99),
            rtts(h.push.median, h.rtt),
            if h.woken.n == 0 || !h.pushes {
                "—".to_owned()
            } else {
                ms(h.woken.median)
            },
            if h.woken.n == 0 || !h.pushes {
                "—".to_owned()
            } else {
                h.phases
                    .iter()
                    .map(|p| ms(p.median))
                    .collect::<Vec<_>>()
                    .join(" / ")
            },
            ms(h.poll.median),
            ms(h.poll.p99),
            h.poll.median.as_secs_f64() / h.push.median.as_secs_f64(),
            ms(h.crash.median),
            ms(h.crash.p99),
            h.push.n,
            h.poll.n,
            h.crash.n
        );
    }
}
