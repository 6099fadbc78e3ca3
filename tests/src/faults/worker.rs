//! The contender: one OS process that loops acquire → critical section →
//! release against one backend, records every section in the checker, and
//! reports to the orchestrator on stdout.
//!
//! Lines written to stdout (one event each):
//!
//! - `READY`: connected to the checker, about to contend;
//! - `ACQ <fence> <t>`: acquired (fence 0 = none), at `t` µs since the epoch;
//! - `REL <t>`: the section ended and the lease was released;
//! - `HOLDING <t>` / `IDLE`: answer to `hold <ms>`;
//! - `WAKE <valid> <cancelled_now> <cancel_us> <write>`: it noticed that it
//!   had been paused (a gap longer than the ttl between two steps).
//!
//! Lines read from stdin: `hold <ms>` (keep the current section going for at
//! least `ms` more — the nemesis uses it to be sure its victim still holds
//! when the fault lands; it does not change what the contender does with
//! its lease) and `stop` (finish the current section and exit). End of
//! input also means stop, so contenders never outlive the orchestrator.

use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use lease::Lease;
use lease::backend::{MySqlTable, PgAdvisory, PgTable, Redis};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::AsyncBufReadExt;
use tokio::time::Instant;

use super::checker::{Checker, SectionEnd};
use super::{BackendKind, now_us};

/// Everything a worker needs, from its command line.
#[derive(Debug, Clone)]
struct Args {
    backend: BackendKind,
    url: String,
    name: String,
    holder: String,
    ttl: Duration,
    checker_url: String,
    prefix: String,
    key: String,
    section_min: Duration,
    section_max: Duration,
    run_for: Duration,
    pool_ping: bool,
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
    })
}

/// The command-line arguments of a worker (after the `worker` role word).
#[allow(clippy::too_many_arguments)]
pub(crate) fn command_line(
    backend: BackendKind,
    url: &str,
    name: &str,
    holder: &str,
    ttl: Duration,
    checker_url: &str,
    prefix: &str,
    key: &str,
    section: (Duration, Duration),
    run_for: Duration,
    pool_ping: bool,
) -> Vec<String> {
    let ms = |d: Duration| d.as_millis().to_string();
    [
        ("--backend", backend.as_str().to_owned()),
        ("--url", url.to_owned()),
        ("--name", name.to_owned()),
        ("--holder", holder.to_owned()),
        ("--ttl-ms", ms(ttl)),
        ("--checker", checker_url.to_owned()),
        ("--prefix", prefix.to_owned()),
        ("--key", key.to_owned()),
        ("--section-min-ms", ms(section.0)),
        ("--section-max-ms", ms(section.1)),
        ("--run-for-ms", ms(run_for)),
        ("--pool-ping", u8::from(pool_ping).to_string()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_owned(), v])
    .collect()
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
    match runtime.block_on(run(args)) {
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

async fn lease(args: &Args) -> Result<Lease, String> {
    let err = |e: sqlx::Error| e.to_string();
    Ok(match args.backend {
        BackendKind::PgTable | BackendKind::PgAdvisory => {
            let options = PgConnectOptions::from_str(&args.url)
                .map_err(err)?
                .application_name(&args.holder);
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .test_before_acquire(args.pool_ping)
                .connect_lazy_with(options);
            if args.backend == BackendKind::PgTable {
                Lease::with_holder(PgTable::new(pool), &args.holder)
            } else {
                Lease::with_holder(PgAdvisory::new(pool), &args.holder)
            }
        }
        BackendKind::MySqlTable => {
            let pool = sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .test_before_acquire(args.pool_ping)
                .connect_lazy(&args.url)
                .map_err(err)?;
            Lease::with_holder(MySqlTable::new(pool), &args.holder)
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
            Lease::with_holder(Redis::new(pool), &args.holder)
        }
    })
}

/// Commands from the orchestrator.
#[derive(Default)]
struct Control {
    stop: AtomicBool,
    /// Keep the current section going until this instant (µs since the epoch).
    hold_until: AtomicI64,
    in_section: AtomicBool,
}

fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn run(args: Args) -> Result<(), String> {
    let checker_pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&args.checker_url)
        .await
        .map_err(|e| format!("checker: {e}"))?;
    let checker = Checker::new(checker_pool, &args.prefix);
    let lease = lease(&args).await?;
    let control = Arc::new(Control::default());
    let stdin_control = control.clone();
    tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut words = line.split_whitespace();
            match (
                words.next(),
                words.next().and_then(|w| w.parse::<i64>().ok()),
            ) {
                (Some("hold"), Some(ms)) => {
                    stdin_control
                        .hold_until
                        .store(now_us() + ms * 1000, Ordering::SeqCst);
                    if stdin_control.in_section.load(Ordering::SeqCst) {
                        say(&format!("HOLDING {}", now_us()));
                    } else {
                        say("IDLE");
                    }
                }
                (Some("stop"), _) => break,
                _ => {}
            }
        }
        stdin_control.stop.store(true, Ordering::SeqCst);
    });
    say("READY");
    let fenced = args.backend.fenced();
    let ttl_us = i64::try_from(args.ttl.as_micros()).unwrap_or(i64::MAX);
    let step = Duration::from_millis(20);
    let mut rng = Rng::new();
    let started = Instant::now();
    let pid = std::process::id();
    let err = |e: sqlx::Error| format!("checker: {e}");

    while !control.stop.load(Ordering::SeqCst) && started.elapsed() < args.run_for {
        let guard = match lease.try_acquire(&args.name, args.ttl).await {
            Ok(Some(guard)) => guard,
            Ok(None) | Err(_) => {
                tokio::time::sleep(
                    rng.between(Duration::from_millis(5), Duration::from_millis(25)),
                )
                .await;
                continue;
            }
        };
        control.in_section.store(true, Ordering::SeqCst);
        let t_start = now_us();
        let valid_start = guard.is_valid();
        let fence = guard
            .fencing_token()
            .map(|f| i64::try_from(f).unwrap_or(i64::MAX));
        say(&format!("ACQ {} {t_start}", fence.unwrap_or(0)));
        let token = guard.token();
        let cancelled_at = Arc::new(AtomicI64::new(0));
        let watcher = {
            let (token, at) = (token.clone(), cancelled_at.clone());
            tokio::spawn(async move {
                token.cancelled().await;
                at.store(now_us(), Ordering::SeqCst);
            })
        };
        let section = checker
            .start_section(&args.key, &args.holder, pid, fence, t_start, valid_start)
            .await
            .map_err(err)?;
        if let Some(f) = fence.filter(|_| fenced) {
            let valid = guard.is_valid();
            checker
                .write(&args.key, &args.holder, f, "start", valid, now_us())
                .await
                .map_err(err)?;
        }
        let mut end = SectionEnd {
            t_last_valid: valid_start.then_some(t_start),
            ..SectionEnd::default()
        };
        let length = rng.between(args.section_min, args.section_max);
        let began = Instant::now();
        let mut previous = now_us();
        let mut woke = false;
        loop {
            let held = control.hold_until.load(Ordering::SeqCst) > now_us();
            if (began.elapsed() >= length && !held) || control.stop.load(Ordering::SeqCst) {
                break;
            }
            tokio::time::sleep(step).await;
            let t = now_us();
            let valid = guard.is_valid();
            if t - previous > ttl_us {
                // We were paused for longer than the ttl (SIGSTOP): the lease
                // must already be invalid, and its token cancelled as soon as
                // the engine's task has run.
                let cancelled_now = token.is_cancelled();
                let wait = tokio::time::timeout(Duration::from_secs(2), token.cancelled()).await;
                let cancel_us = wait.is_ok().then(|| now_us() - t);
                let write = match fence.filter(|_| fenced) {
                    Some(f) => Some(
                        checker
                            .write(&args.key, &args.holder, f, "after-pause", valid, now_us())
                            .await
                            .map_err(err)?,
                    ),
                    None => None,
                };
                end.wake_t = Some(t);
                end.wake_valid = Some(valid);
                end.wake_cancelled_now = Some(cancelled_now);
                end.wake_cancel_us = cancel_us;
                end.wake_write_accepted = write;
                say(&format!(
                    "WAKE {valid} {cancelled_now} {} {}",
                    cancel_us.unwrap_or(-1),
                    write.map_or("n/a".to_owned(), |w| w.to_string())
                ));
                woke = true;
                break;
            }
            previous = t;
            if !valid {
                // Lost: a correct holder stops its work.
                break;
            }
            end.t_last_valid = Some(t);
        }
        // From here on a `hold` finds this worker idle: its section is ending.
        control.in_section.store(false, Ordering::SeqCst);
        end.t_end = now_us();
        end.valid_end = guard.is_valid();
        if end.valid_end {
            end.t_last_valid = Some(end.t_end);
        }
        if !woke && let Some(f) = fence.filter(|_| fenced) {
            // Written whether or not the lease is still valid: a holder that
            // lost its lease without noticing would write too, and the
            // resource must reject it once a newer holder has written.
            checker
                .write(&args.key, &args.holder, f, "end", end.valid_end, now_us())
                .await
                .map_err(err)?;
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
        checker.end_section(section, &end).await.map_err(err)?;
        let _ = guard.release().await;
        say(&format!("REL {}", now_us()));
        tokio::time::sleep(rng.between(Duration::ZERO, Duration::from_millis(60))).await;
    }
    Ok(())
}
