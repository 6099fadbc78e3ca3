//! The contender: one OS process that loops acquire → critical section →
//! release against one backend, records every section in the checker, and
//! reports to the orchestrator on stdout.
//!
//! With `--elect 1` it runs a leader election ([`Lease::elect`]) instead of
//! `try_acquire`: each [`Term`] is a section; a section that ends by its
//! length (or `end`, `stop`) resigns the election, and the next section
//! comes from a new one; a term that is lost (the section ends because it is
//! no longer valid) keeps the election, which contends again by itself, and
//! its `REL` says `lost` (nothing was sent).
//!
//! A section is the *body*: from the grant until the body returns. A
//! cooperative body stops a random 0 to grace/2 (the library's default
//! grace, ttl/3) after its token fires — its stop is work, which takes real
//! time — or at its natural end. The section's valid interval (while
//! `is_valid()`) is recorded too.
//!
//! `SIGTERM` is a deploy: the worker calls [`Lease::shutdown`] (its body
//! winds down as above) and exits when it returns. With `--max-hold-ms`
//! every acquisition is a [`Lease::job`] with that `max_hold`.
//!
//! Times are µs of [`monotonic_us`], shared by every process of the run.
//! With `--clock-rate R` (not 1) the worker runs under libfaketime with its
//! clocks at R× real speed (the `drift` fault): it reports its clock mapped
//! back to the real one, by a pair of readings the orchestrator sends
//! (`clock-map`), and contends only once it has them.
//!
//! Lines written to stdout (one event each):
//!
//! - `READY`: connected to the checker, about to contend;
//! - `ACQ <fence> <t>`: acquired (fence 0 = none) at `t`; said only once the
//!   section is in the checker's log, so that a kill cannot land on a
//!   section the log does not have;
//! - `REL <sent> <done> ok|err`: the section ended and the release was sent
//!   at `sent`, returned at `done`, confirmed or not;
//! - `HOLDING <t>` / `IDLE`: answer to `hold <ms>`;
//! - `ENDED`: the current section is over (its release follows: `REL`);
//! - `WAKE <valid> <cancelled_now> <cancel_us> <write>`: it noticed that it
//!   had been paused (a gap longer than the ttl between two steps);
//! - `RELEASING`: after `end-gated`, its section is over and recorded, and it
//!   waits for `go` to release;
//! - `YIELDED`: after `yield <ms>`, no acquisition of its is under way;
//! - `CLOCK <us>`: answer to `clock`: its own (unmapped) monotonic clock;
//! - `INTXN ok|refused` / `TXN ok|err`: after `txn-hold` (with `--txn 1`),
//!   see `faults/txn.rs`;
//! - `TERM <t>` / `SHUTDOWN <t>`: `SIGTERM` received, `shutdown()` returned.
//!
//! Lines read from stdin:
//!
//! - `hold <ms>`: keep the current section going for at least `ms` more
//!   (the nemesis uses it to be sure its victim still holds when the fault
//!   lands; it does not change what the contender does with its lease, and
//!   a body whose token has fired answers `IDLE`: it is ending);
//! - `end`: end the current section now (and release, as always);
//! - `end-gated`: end it now, and wait for `go` (at most 5 s) before
//!   releasing, so that the nemesis can set up the network first;
//! - `yield <ms>`: start no acquisition for `ms` (0: contend again), so that
//!   another contender gets the lease;
//! - `stop`: finish the current section and exit. End of input also means
//!   stop, so contenders never outlive the orchestrator;
//! - `clock`, `clock-map <real> <fake>`: see `--clock-rate` above;
//! - `txn-hold`, `commit` (with `--txn 1`): the body opens a transaction
//!   checked in with its lease, says `INTXN`, and waits for `commit` (at
//!   most 10 s) before it writes to the unfenced table (`faults/txn.rs`).
//!
//! With `--txn 1` (`stop-in-txn`) every section also starts with such a
//! write, not held.
//!
//! With [`super::breaks::VAR`] set, the backend or the
//! contender is deliberately broken (see [`super::breaks`]).

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use leasehold::backend::{MySqlTable, PgAdvisory, PgTable, Redis};
use leasehold::{Backend, Election, Lease, LeaseGuard, Term};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::breaks::{self, Broken, LateDeadline, Raw};
use super::checker::{Checker, SectionEnd};
use super::{BackendKind, monotonic_us, us};

/// The fence table of `pg-advisory-fenced`, on the private PostgreSQL
/// (created with the lease table when the run starts).
pub(crate) const FENCE_TABLE: &str = "lease_fences";

/// Everything a worker needs, from its command line ([`Args::command_line`]).
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub(crate) backend: BackendKind,
    pub(crate) url: String,
    pub(crate) name: String,
    pub(crate) holder: String,
    pub(crate) ttl: Duration,
    pub(crate) checker_url: String,
    pub(crate) prefix: String,
    pub(crate) key: String,
    pub(crate) section_min: Duration,
    pub(crate) section_max: Duration,
    pub(crate) run_for: Duration,
    pub(crate) pool_ping: bool,
    pub(crate) elect: bool,
    /// Every acquisition is a job with this `max_hold`.
    pub(crate) max_hold: Option<Duration>,
    /// The speed of its clocks (under libfaketime); 1: real.
    pub(crate) clock_rate: f64,
    /// Each section writes to the unfenced table in a checked-in
    /// transaction, and `txn-hold` holds one (`faults/txn.rs`).
    pub(crate) txn: bool,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let get = |flag: &str| -> Result<String, String> {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .ok_or_else(|| format!("missing {flag}"))
    };
    let ms = |flag: &str| -> Result<Duration, String> {
        Ok(Duration::from_millis(
            get(flag)?.parse().map_err(|e| format!("{flag}: {e}"))?,
        ))
    };
    Ok(Args {
        backend: BackendKind::from_str(&get("--backend")?)?,
        url: get("--url")?,
        name: get("--name")?,
        holder: get("--holder")?,
        ttl: ms("--ttl-ms")?,
        checker_url: get("--checker")?,
        prefix: get("--prefix")?,
        key: get("--key")?,
        section_min: ms("--section-min-ms")?,
        section_max: ms("--section-max-ms")?,
        run_for: ms("--run-for-ms")?,
        pool_ping: get("--pool-ping")? == "1",
        // Absent: the try_acquire loop.
        elect: get("--elect").is_ok_and(|v| v == "1"),
        // Absent or 0: none.
        max_hold: ms("--max-hold-ms").ok().filter(|d| !d.is_zero()),
        clock_rate: match get("--clock-rate") {
            Ok(rate) => rate.parse().map_err(|e| format!("--clock-rate: {e}"))?,
            Err(_) => 1.0,
        },
        txn: get("--txn").is_ok_and(|v| v == "1"),
    })
}

impl Args {
    /// The command-line arguments of a worker (after the `worker` role word).
    pub(crate) fn command_line(&self) -> Vec<String> {
        let ms = |d: Duration| d.as_millis().to_string();
        [
            ("--backend", self.backend.as_str().to_owned()),
            ("--url", self.url.clone()),
            ("--name", self.name.clone()),
            ("--holder", self.holder.clone()),
            ("--ttl-ms", ms(self.ttl)),
            ("--checker", self.checker_url.clone()),
            ("--prefix", self.prefix.clone()),
            ("--key", self.key.clone()),
            ("--section-min-ms", ms(self.section_min)),
            ("--section-max-ms", ms(self.section_max)),
            ("--run-for-ms", ms(self.run_for)),
            ("--pool-ping", u8::from(self.pool_ping).to_string()),
            ("--elect", u8::from(self.elect).to_string()),
            ("--max-hold-ms", ms(self.max_hold.unwrap_or_default())),
            ("--clock-rate", self.clock_rate.to_string()),
            ("--txn", u8::from(self.txn).to_string()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), v])
        .collect()
    }

    /// The grace the contenders' leases have: the library's default, ttl/3.
    pub(crate) fn grace(&self) -> Duration {
        self.ttl / 3
    }
}

/// The mapping of a drifting worker's clock to the real one: a reading of
/// each taken at the same instant (`(real, own)`, µs), and its speed.
#[derive(Debug, Clone, Copy)]
struct ClockMap {
    real: i64,
    own: i64,
    rate: f64,
}

/// Set once by `clock-map` (a drifting worker only).
static CLOCK_MAP: OnceLock<ClockMap> = OnceLock::new();

/// The time now, in µs of the run's clock ([`monotonic_us`]): for a
/// drifting worker, its own clock mapped back to the real one.
fn now_us() -> i64 {
    let own = monotonic_us();
    match CLOCK_MAP.get() {
        Some(map) => map.real + ((own - map.own) as f64 / map.rate) as i64,
        None => own,
    }
}

/// `real` µs of real time, on this worker's own clock (what to sleep for).
fn on_own_clock(real: i64) -> Duration {
    let rate = CLOCK_MAP.get().map_or(1.0, |m| m.rate);
    Duration::from_micros(u64::try_from((real as f64 * rate) as i64).unwrap_or(0))
}

/// Run a worker with `args` (everything after the `worker` role word);
/// returns the process exit code.
pub fn main(args: &[String]) -> i32 {
    let args = match parse(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("fault-suite worker: {e}");
            return 2;
        }
    };
    if std::env::var_os("LEASE_FAULTS_TRACE").is_some() {
        // For a person reading one run: the contenders' tracing on stderr,
        // filtered by RUST_LOG (e.g. `lease=debug`).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .try_init();
        tracing::info!(pid = std::process::id(), "worker");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fault-suite worker: runtime: {e}");
            return 1;
        }
    };
    let result = runtime.block_on(run(args));
    // Not waiting for the task blocked reading stdin, which the orchestrator
    // keeps open after a deploy's `SIGTERM`.
    runtime.shutdown_background();
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("fault-suite worker: {e}");
            1
        }
    }
}

/// A small xorshift generator; the seed comes from `RandomState`.
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        use std::hash::{BuildHasher, RandomState};
        Self(RandomState::new().hash_one(std::process::id()) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_micros().max(1);
        let span = u64::try_from(span).unwrap_or(u64::MAX);
        lo + Duration::from_micros(self.next() % span)
    }
}

/// The lease of a contender, what `deadline-1.2` believes if that
/// break is on, and where `release-at-shutdown` sends its release.
struct Contender {
    lease: Lease,
    late_deadline: Option<Arc<LateDeadline>>,
    raw: Raw,
}

/// `backend`, wrapped in the breaks of [`breaks::VAR`] if any.
fn contender(backend: impl Backend, raw: Raw, holder: &str) -> Contender {
    if breaks::active().is_empty() {
        return Contender {
            lease: Lease::with_holder(backend, holder),
            late_deadline: None,
            raw,
        };
    }
    let broken = Broken::new(backend, raw.clone());
    let late_deadline = broken.late_deadline();
    Contender {
        lease: Lease::with_holder(broken, holder),
        late_deadline,
        raw,
    }
}

async fn lease(args: &Args) -> Result<Contender, String> {
    let err = |e: sqlx::Error| e.to_string();
    Ok(match args.backend {
        BackendKind::PgTable | BackendKind::PgAdvisory | BackendKind::PgAdvisoryFenced => {
            let options = PgConnectOptions::from_str(&args.url)
                .map_err(err)?
                .application_name(&args.holder);
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .test_before_acquire(args.pool_ping)
                .connect_lazy_with(options);
            let raw = Raw::Pg(pool.clone());
            match args.backend {
                BackendKind::PgTable => contender(PgTable::new(pool), raw, &args.holder),
                BackendKind::PgAdvisory => contender(PgAdvisory::new(pool), raw, &args.holder),
                _ => contender(
                    PgAdvisory::new(pool)
                        .with_fencing(FENCE_TABLE)
                        .map_err(|e| e.to_string())?,
                    raw,
                    &args.holder,
                ),
            }
        }
        BackendKind::MySqlTable => {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .test_before_acquire(args.pool_ping)
                .connect_lazy(&args.url)
                .map_err(err)?;
            contender(
                MySqlTable::new(pool.clone()),
                Raw::MySql(pool),
                &args.holder,
            )
        }
        BackendKind::Redis => {
            let name = args.holder.clone();
            let pool = deadpool_redis::Config::from_url(args.url.clone())
                .builder()
                .map_err(|e| e.to_string())?
                .max_size(4)
                .runtime(deadpool_redis::Runtime::Tokio1)
                .post_create(deadpool_redis::Hook::async_fn(move |conn, _| {
                    let name = name.clone();
                    Box::pin(async move {
                        redis::cmd("CLIENT")
                            .arg("SETNAME")
                            .arg(&name)
                            .query_async::<()>(conn)
                            .await
                            .map_err(deadpool_redis::HookError::Backend)
                    })
                }))
                .build()
                .map_err(|e| e.to_string())?;
            let backend = Redis::new(pool.clone());
            contender(backend.clone(), Raw::Redis(pool, backend), &args.holder)
        }
        BackendKind::RedisCluster => {
            // The nodes' URLs, comma-separated.
            let backend = Redis::cluster(args.url.split(','))
                .await
                .map_err(|e| e.to_string())?;
            contender(backend, Raw::None, &args.holder)
        }
        BackendKind::Etcd => {
            // Every member, through this contender's proxy; `connect` only
            // fails when no member answers (a restart of them all, say):
            // retried for a while.
            let endpoints: Vec<&str> = args.url.split(',').collect();
            let limit = Instant::now() + Duration::from_secs(30);
            let etcd = loop {
                match leasehold::backend::Etcd::connect(&endpoints).await {
                    Ok(etcd) => break etcd,
                    Err(e) if Instant::now() > limit => return Err(e.to_string()),
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            };
            contender(etcd.clone(), Raw::Etcd(Box::new(etcd)), &args.holder)
        }
    })
}

/// Commands from the orchestrator.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    /// Keep the current section going until this instant (µs).
    hold_until: AtomicI64,
    in_section: AtomicBool,
    /// The current section's token has fired: its body is ending.
    winding_down: AtomicBool,
    /// End the current section now.
    end_now: AtomicBool,
    /// Before releasing, say `RELEASING` and wait for `go`.
    gated: AtomicBool,
    go: Notify,
    /// Start no acquisition before this instant (µs).
    yield_until: AtomicI64,
    /// A `yield` waits for its `YIELDED`.
    yield_unanswered: AtomicBool,
    /// `txn-hold`: hold the next write's checked-in transaction open.
    txn_hold: AtomicBool,
    /// `commit`: the held transaction may go on.
    commit: Notify,
}

pub(super) fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// What a section holds: a lease from `try_acquire`, or an election's term.
pub(super) enum Holding {
    Guard(LeaseGuard),
    Term(Term),
}

impl Holding {
    fn is_valid(&self) -> bool {
        match self {
            Holding::Guard(guard) => guard.is_valid(),
            Holding::Term(term) => term.is_valid(),
        }
    }

    fn fencing_token(&self) -> Option<u64> {
        match self {
            Holding::Guard(guard) => guard.fencing_token(),
            Holding::Term(term) => term.fencing_token(),
        }
    }

    fn token(&self) -> leasehold::CancellationToken {
        match self {
            Holding::Guard(guard) => guard.token(),
            Holding::Term(term) => term.token(),
        }
    }

    /// `check_in` of the lease (or term) on `conn`.
    pub(super) async fn check_in<C: leasehold::CheckIn>(
        &self,
        conn: &mut C,
    ) -> Result<(), leasehold::Error> {
        match self {
            Holding::Guard(guard) => guard.check_in(conn).await,
            Holding::Term(term) => term.check_in(conn).await,
        }
    }
}

/// Whether the holder believes its lease valid: the guard's (or term's)
/// `is_valid()`, or under the `deadline-1.2` break what that break believes.
struct Validity {
    guard: Arc<Holding>,
    name: String,
    late_deadline: Option<Arc<LateDeadline>>,
}

impl Validity {
    fn valid(&self) -> bool {
        match &self.late_deadline {
            Some(late) => late.valid(&self.name),
            None => self.guard.is_valid(),
        }
    }

    /// Should the body start to stop: its token fired (or, under
    /// `deadline-1.2`, the broken belief ended; under `ignore-token`, never).
    fn told_to_stop(&self, token: &leasehold::CancellationToken) -> bool {
        if breaks::on("ignore-token") {
            return false;
        }
        match &self.late_deadline {
            Some(late) => !late.valid(&self.name),
            None => token.is_cancelled(),
        }
    }
}

/// Resolves when the body's token fires, if the body listens to it (not
/// under `deadline-1.2`, whose belief is polled, nor `ignore-token`).
async fn token_fired(token: &leasehold::CancellationToken, listens: bool) {
    if listens {
        token.cancelled().await;
    } else {
        std::future::pending::<()>().await;
    }
}

/// Sample the validity every millisecond, from a task of its own, until it
/// is false; the last instant it was true is in the returned cell. The
/// section's own 20 ms steps would leave up to 20 ms between the last
/// instant seen valid and the real end of the lease, enough to hide a short
/// overlap.
fn sample(validity: Arc<Validity>, last: Arc<AtomicI64>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // The clock first: if the lease is valid now, it was valid then.
            let t = now_us();
            if !validity.valid() {
                return;
            }
            last.store(t, Ordering::SeqCst);
        }
    })
}

/// A write to the fenced resource, and whether the lease was still valid
/// once it had returned.
async fn write(
    checker: &Checker,
    args: &Args,
    validity: &Validity,
    fence: i64,
    kind: &str,
    valid: bool,
) -> Result<bool, String> {
    let err = |e: sqlx::Error| format!("checker: {e}");
    let (accepted, id) = checker
        .write(&args.key, &args.holder, fence, kind, valid, now_us())
        .await
        .map_err(err)?;
    checker
        .valid_after(id, validity.valid())
        .await
        .map_err(err)?;
    Ok(accepted)
}

/// Read the orchestrator's commands from stdin (see the module docs) until
/// `stop` or the end of input.
fn listen(control: Arc<Control>, clock_rate: f64, clock_set: Arc<Notify>) {
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut words = line.split_whitespace();
            let word = words.next();
            let mut number = || words.next().and_then(|w| w.parse::<i64>().ok());
            match (word, number()) {
                (Some("hold"), Some(ms)) => {
                    control
                        .hold_until
                        .store(now_us() + ms * 1000, Ordering::SeqCst);
                    if control.in_section.load(Ordering::SeqCst)
                        && !control.winding_down.load(Ordering::SeqCst)
                    {
                        say(&format!("HOLDING {}", now_us()));
                    } else {
                        say("IDLE");
                    }
                }
                (Some("end"), _) => {
                    control.hold_until.store(0, Ordering::SeqCst);
                    control.end_now.store(true, Ordering::SeqCst);
                }
                (Some("end-gated"), _) => {
                    control.hold_until.store(0, Ordering::SeqCst);
                    control.gated.store(true, Ordering::SeqCst);
                    control.end_now.store(true, Ordering::SeqCst);
                }
                (Some("go"), _) => control.go.notify_one(),
                (Some("txn-hold"), _) => control.txn_hold.store(true, Ordering::SeqCst),
                (Some("commit"), _) => control.commit.notify_one(),
                (Some("yield"), Some(ms)) => {
                    let until = if ms > 0 { now_us() + ms * 1000 } else { 0 };
                    control.yield_until.store(until, Ordering::SeqCst);
                    control.yield_unanswered.store(ms > 0, Ordering::SeqCst);
                }
                // Its own clock, unmapped: the orchestrator pairs it with its own.
                (Some("clock"), _) => say(&format!("CLOCK {}", monotonic_us())),
                (Some("clock-map"), Some(real)) => {
                    if let Some(own) = number() {
                        let rate = clock_rate;
                        let _ = CLOCK_MAP.set(ClockMap { real, own, rate });
                        clock_set.notify_one();
                    }
                }
                (Some("stop"), _) => break,
                _ => {}
            }
        }
        control.stop.store(true, Ordering::SeqCst);
    });
}

/// A deploy: on `SIGTERM`, [`Lease::shutdown`] (the body winds down as its
/// token tells it), then stop. Under `release-at-shutdown` the lease is
/// first ended on the server, as a library that released at shutdown
/// without waiting for the body would.
fn on_sigterm(lease: Lease, control: Arc<Control>, raw: Raw, name: String, holder: String) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        return;
    };
    tokio::spawn(async move {
        term.recv().await;
        say(&format!("TERM {}", now_us()));
        if breaks::on("release-at-shutdown") {
            let _ = breaks::release_ignoring_fence(
                &raw,
                leasehold::Acquisition::new(&name, &holder, None),
            )
            .await;
        }
        lease.shutdown().await;
        say(&format!("SHUTDOWN {}", now_us()));
        control.stop.store(true, Ordering::SeqCst);
    });
}

async fn run(args: Args) -> Result<(), String> {
    let checker_pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&args.checker_url)
        .await
        .map_err(|e| format!("checker: {e}"))?;
    let checker = Checker::new(checker_pool, &args.prefix);
    let Contender {
        lease,
        late_deadline,
        raw,
    } = lease(&args).await?;
    let announce_before_record = breaks::on("announce-before-record");
    let control = Arc::new(Control::default());
    let clock_set = Arc::new(Notify::new());
    listen(control.clone(), args.clock_rate, clock_set.clone());
    on_sigterm(
        lease.clone(),
        control.clone(),
        raw.clone(),
        args.name.clone(),
        args.holder.clone(),
    );
    say("READY");
    if args.clock_rate != 1.0
        && tokio::time::timeout(Duration::from_secs(10), clock_set.notified())
            .await
            .is_err()
        && CLOCK_MAP.get().is_none()
    {
        return Err("no clock-map within 10 s".to_owned());
    }
    let ttl_us = us(args.ttl);
    let mut rng = Rng::new();
    let started = Instant::now();
    // `--elect 1`: the election, while one runs, and since when it has been
    // waited for (where its grant's answer is looked for).
    let mut election: Option<Election> = None;
    let mut waiting_since = now_us();

    while !control.stop.load(Ordering::SeqCst) && started.elapsed() < args.run_for {
        if control.yield_until.load(Ordering::SeqCst) > now_us() {
            if let Some(e) = election.take() {
                // Contend no more (it cannot lead here: its sections are over).
                let _ = e.resign().await;
            }
            if control.yield_unanswered.swap(false, Ordering::SeqCst) {
                say("YIELDED");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let (t_req, holding) = if args.elect {
            let e = election.get_or_insert_with(|| {
                waiting_since = now_us();
                lease.elect(&args.name, args.ttl)
            });
            // Short waits, so that `stop` and `yield` are seen.
            match tokio::time::timeout(Duration::from_millis(20), e.leading()).await {
                Ok(term) => (waiting_since, Holding::Term(term)),
                Err(_) => continue,
            }
        } else {
            let t_req = now_us();
            let acquired = match args.max_hold {
                Some(max_hold) => {
                    lease
                        .job(&args.name, args.ttl)
                        .max_hold(max_hold)
                        .acquire()
                        .await
                }
                None => lease.try_acquire(&args.name, args.ttl).await,
            };
            match acquired {
                Ok(Some(guard)) => (t_req, Holding::Guard(guard)),
                Ok(None) | Err(_) => {
                    tokio::time::sleep(
                        rng.between(Duration::from_millis(5), Duration::from_millis(25)),
                    )
                    .await;
                    continue;
                }
            }
        };
        let validity = Arc::new(Validity {
            guard: Arc::new(holding),
            name: args.name.clone(),
            late_deadline: late_deadline.clone(),
        });
        let section = Section {
            args: &args,
            checker: &checker,
            control: &control,
            raw: &raw,
            validity,
            t_req,
            announce_before_record,
        };
        let (validity, ended) = section.run(ttl_us, &mut rng).await?;
        if control.gated.swap(false, Ordering::SeqCst) {
            say("RELEASING");
            let _ = tokio::time::timeout(Duration::from_secs(5), control.go.notified()).await;
        }
        let Ok(Validity { guard, .. }) = Arc::try_unwrap(validity) else {
            return Err("BUG: the guard is still shared".to_owned());
        };
        let Ok(holding) = Arc::try_unwrap(guard) else {
            return Err("BUG: the guard is still shared".to_owned());
        };
        let sent = now_us();
        let released = match holding {
            Holding::Guard(guard) => guard.release().await.is_ok(),
            Holding::Term(_) if ended.lost || ended.woke => {
                // The election contends again by itself.
                say(&format!("REL {sent} {sent} lost"));
                waiting_since = now_us();
                continue;
            }
            Holding::Term(term) => {
                // The body has returned: its Term goes before the resign,
                // which releases only once every clone is dropped (§6.1).
                drop(term);
                match election.take() {
                    Some(e) => e.resign().await.is_ok(),
                    None => return Err("BUG: a term without its election".to_owned()),
                }
            }
        };
        say(&format!(
            "REL {sent} {} {}",
            now_us(),
            if released { "ok" } else { "err" }
        ));
        tokio::time::sleep(rng.between(Duration::ZERO, Duration::from_millis(60))).await;
    }
    if let Some(e) = election.take() {
        let _ = e.resign().await;
    }
    Ok(())
}

/// One section — the body — from its grant: recorded in the checker, run
/// until its natural end (or `end`, `stop`), or until a random 0 to grace/2
/// after its token fired, or cut short by a pause longer than the ttl.
struct Section<'a> {
    args: &'a Args,
    checker: &'a Checker,
    control: &'a Control,
    /// Where `--txn 1` writes the unfenced table.
    raw: &'a Raw,
    validity: Arc<Validity>,
    t_req: i64,
    announce_before_record: bool,
}

/// How a section ended.
struct Ended {
    /// Its token fired, or the lease was no longer valid, before it ended.
    lost: bool,
    /// It woke from a pause longer than the ttl.
    woke: bool,
}

impl Section<'_> {
    async fn run(self, ttl_us: i64, rng: &mut Rng) -> Result<(Arc<Validity>, Ended), String> {
        let Section {
            args,
            checker,
            control,
            raw,
            validity,
            t_req,
            announce_before_record,
        } = self;
        let err = |e: sqlx::Error| format!("checker: {e}");
        let fenced = args.backend.fenced();
        let step = Duration::from_millis(20);
        let t_start = now_us();
        let valid_start = validity.valid();
        let fence = validity
            .guard
            .fencing_token()
            .map(|f| i64::try_from(f).unwrap_or(i64::MAX));
        let token = validity.guard.token();
        let cancelled_at = Arc::new(AtomicI64::new(0));
        let watcher = {
            let (token, at) = (token.clone(), cancelled_at.clone());
            tokio::spawn(async move {
                token.cancelled().await;
                at.store(now_us(), Ordering::SeqCst);
            })
        };
        let last_valid = Arc::new(AtomicI64::new(0));
        let sampler = sample(validity.clone(), last_valid.clone());
        control.end_now.store(false, Ordering::SeqCst);
        control.winding_down.store(false, Ordering::SeqCst);
        control.in_section.store(true, Ordering::SeqCst);
        if announce_before_record {
            // Break: the acquisition is announced, and its section recorded late.
            say(&format!("ACQ {} {t_start} {t_req}", fence.unwrap_or(0)));
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let section = checker
            .start_section(
                &args.key,
                &args.holder,
                std::process::id(),
                fence,
                (t_req, t_start),
                valid_start,
            )
            .await
            .map_err(err)?;
        if !announce_before_record {
            say(&format!("ACQ {} {t_start} {t_req}", fence.unwrap_or(0)));
        }
        if let Some(f) = fence.filter(|_| fenced) {
            let valid = validity.valid();
            write(checker, args, &validity, f, "start", valid).await?;
        }
        let unfenced = super::txn::Writer {
            raw,
            holding: &validity.guard,
            args,
            fence: fence.unwrap_or(0),
        };
        if args.txn {
            unfenced.write("start", None).await;
        }
        let mut end = SectionEnd {
            t_last_valid: valid_start.then_some(t_start),
            ..SectionEnd::default()
        };
        let length = rng.between(args.section_min, args.section_max);
        // How long this body takes to stop once told: work, so real time
        // (under `drift`, longer on its own clock).
        let stop_delay = us(rng.between(Duration::ZERO, args.grace() / 2));
        // The body listens to its token (see `Validity::told_to_stop`).
        let listens = validity.late_deadline.is_none() && !breaks::on("ignore-token");
        let began = Instant::now();
        let mut previous = now_us();
        let mut woke = false;
        // When the body returns, once told to stop.
        let mut stop_at: Option<i64> = None;
        loop {
            let now = now_us();
            match stop_at {
                Some(at) if now >= at => break,
                Some(_) => {}
                None => {
                    let held = control.hold_until.load(Ordering::SeqCst) > now;
                    if (began.elapsed() >= length && !held)
                        || control.stop.load(Ordering::SeqCst)
                        || control.end_now.load(Ordering::SeqCst)
                    {
                        break;
                    }
                }
            }
            let nap = stop_at.map_or(step, |at| step.min(on_own_clock(at - now)));
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = token_fired(&token, listens && stop_at.is_none()) => {}
            }
            if args.txn && control.txn_hold.swap(false, Ordering::SeqCst) {
                // `stop-in-txn`: the nemesis stops it inside, until `commit`.
                unfenced.write("held", Some(&control.commit)).await;
            }
            let t = now_us();
            let valid = validity.valid();
            if t - previous > ttl_us {
                // We were paused for longer than the ttl (SIGSTOP): the lease
                // must already be invalid, and its token cancelled as soon as
                // the engine's task has run. A frozen body cannot stop in
                // time: it ends here, and the report shows its overlap apart.
                let cancelled_now = token.is_cancelled();
                let wait = tokio::time::timeout(Duration::from_secs(2), token.cancelled()).await;
                let cancel_us = wait.is_ok().then(|| now_us() - t);
                let written = match fence.filter(|_| fenced) {
                    Some(f) => {
                        Some(write(checker, args, &validity, f, "after-pause", valid).await?)
                    }
                    None => None,
                };
                end.wake_t = Some(t);
                end.wake_valid = Some(valid);
                end.wake_cancelled_now = Some(cancelled_now);
                end.wake_cancel_us = cancel_us;
                end.wake_write_accepted = written;
                say(&format!(
                    "WAKE {valid} {cancelled_now} {} {}",
                    cancel_us.unwrap_or(-1),
                    written.map_or("n/a".to_owned(), |w| w.to_string())
                ));
                woke = true;
                break;
            }
            previous = t;
            if stop_at.is_none() && (validity.told_to_stop(&token) || (listens && !valid)) {
                // Told to stop (lost, shut down, max_hold): a cooperative
                // body stops its work, which takes a while.
                stop_at = Some(t + stop_delay);
                control.winding_down.store(true, Ordering::SeqCst);
            }
            if valid {
                end.t_last_valid = Some(t);
            }
        }
        // From here on a `hold` finds this worker idle: its section is ending.
        control.in_section.store(false, Ordering::SeqCst);
        say("ENDED");
        end.t_end = now_us();
        end.valid_end = validity.valid();
        let lost = stop_at.is_some() || !end.valid_end;
        if end.valid_end {
            end.t_last_valid = Some(end.t_end);
        }
        if !woke && let Some(f) = fence.filter(|_| fenced) {
            // Written whether or not the lease is still valid: a holder that
            // lost its lease without noticing would write too, and the
            // resource must reject it once a newer holder has written.
            write(checker, args, &validity, f, "end", end.valid_end).await?;
        }
        if !end.valid_end && cancelled_at.load(Ordering::SeqCst) == 0 {
            // `is_valid()` turns false by the clock at the deadline, and the
            // engine's task cancels the token when its timer fires for that
            // same instant: this loop may get there first. Wait for the
            // token (the watcher task may not have run yet either); if it
            // does not come, `t_cancel` stays empty and the run fails.
            if tokio::time::timeout(Duration::from_millis(500), token.cancelled())
                .await
                .is_ok()
            {
                let _ =
                    cancelled_at.compare_exchange(0, now_us(), Ordering::SeqCst, Ordering::SeqCst);
            }
        }
        let cancelled = cancelled_at.load(Ordering::SeqCst);
        end.t_cancel = (cancelled > 0).then_some(cancelled);
        watcher.abort();
        sampler.abort();
        let _ = sampler.await;
        // The sampler saw the lease valid at most a millisecond before it ended.
        let sampled = last_valid.load(Ordering::SeqCst);
        if sampled > 0 {
            end.t_last_valid = Some(end.t_last_valid.map_or(sampled, |t| t.max(sampled)));
        }
        checker.end_section(section, &end).await.map_err(err)?;
        Ok((validity, Ended { lost, woke }))
    }
}
