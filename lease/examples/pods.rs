//! Three pods, one job, one SQLite file: each tick exactly one pod runs the job.
//!
//! ```sh
//! cargo run -p leasehold --features sqlite --example pods
//! ```
//!
//! The example starts three copies of itself as separate processes ("pods")
//! that share one SQLite file through `SqliteTable`. Every second each pod
//! tries to run the job; the one that gets the lease runs it and prints its
//! fencing token, the others print who holds it. Half-way through, the demo
//! kills the pod that is running the job with SIGKILL — no release, no
//! goodbye. Its lease stays until its ttl runs out, so the next ticks are
//! skipped everywhere; then another pod takes over with a larger fencing
//! token. The demo exits by itself after about ten seconds.
//!
//! The test `tests/tests/readme_demo.rs` runs this code (with
//! [`run`] and a shorter [`Schedule`]) and checks what it prints.

use std::process::{Child, Command};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::backend::SqliteTable;
use leasehold::{Lease, LeaseGuard};

const PODS: u32 = 3;
const NAME: &str = "demo-job";

/// When things happen in the demo.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Schedule {
    /// How many ticks each pod runs.
    pub(crate) ticks: u32,
    /// The time between two ticks.
    pub(crate) tick: Duration,
    /// The lease's time-to-live.
    pub(crate) ttl: Duration,
    /// How long the job runs.
    pub(crate) job: Duration,
    /// When, after the first tick, the pod running the job is killed.
    pub(crate) kill_at: Duration,
    /// Time for the pods to start before the first tick.
    pub(crate) lead: Duration,
}

/// The demo of the README: a tick every second for ten seconds, a lease of
/// three seconds, and the kill mid-job of tick 6.
pub(crate) const DEMO: Schedule = Schedule {
    ticks: 10,
    tick: Duration::from_secs(1),
    ttl: Duration::from_secs(3),
    job: Duration::from_millis(400),
    kill_at: Duration::from_millis(5_200),
    lead: Duration::from_millis(500),
};

pub(crate) type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

fn main() -> Result<()> {
    run(&DEMO)
}

/// The demo with `schedule`: the parent, or with `--pod <db> <n> <start>`
/// (the arguments the parent starts its pods with, copies of the running
/// executable) one of its pods.
pub(crate) fn run(schedule: &Schedule) -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args.get(1).map(String::as_str) {
        Some("--pod") => {
            runtime.block_on(pod(schedule, &args[2], args[3].parse()?, args[4].parse()?))
        }
        _ => runtime.block_on(demo(schedule)),
    }
}

/// Milliseconds since the Unix epoch: the pods' shared idea of when ticks are.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn sleep_until_ms(at: u64) {
    tokio::time::sleep(Duration::from_millis(at.saturating_sub(now_ms()))).await;
}

/// The parent: start the pods, kill the one holding the lease mid-way, wait.
async fn demo(schedule: &Schedule) -> Result<()> {
    let Schedule {
        tick,
        ttl,
        job,
        kill_at,
        lead,
        ..
    } = *schedule;
    let db = std::env::temp_dir().join(format!("lease-demo-{}.db", std::process::id()));
    let table = SqliteTable::open(&db).await?;
    println!(
        "lease demo: {PODS} pods share {} — a tick every {tick:?}, lease ttl {ttl:?}, job {job:?}",
        db.display()
    );
    let start = now_ms() + lead.as_millis() as u64;
    let exe = std::env::current_exe()?;
    let mut pods = Pods(Vec::new());
    for n in 1..=PODS {
        let child = Command::new(&exe)
            .args([
                "--pod",
                &db.to_string_lossy(),
                &n.to_string(),
                &start.to_string(),
            ])
            .spawn()?;
        pods.0.push((format!("pod-{n}"), child));
    }

    sleep_until_ms(start + kill_at.as_millis() as u64).await;
    let holder = current_holder(&table).await?;
    let (name, child) = match pods
        .0
        .iter_mut()
        .find(|(name, _)| Some(name) == holder.as_ref())
    {
        Some((name, child)) => (name.clone(), child),
        None => {
            let (name, child) = &mut pods.0[0];
            (name.clone(), child)
        }
    };
    child.kill()?; // SIGKILL: the pod gets no chance to release
    child.wait()?;
    println!(
        "       !! killed {name} with SIGKILL{} — its lease ends when its ttl runs out",
        if holder.as_ref() == Some(&name) {
            " while it ran the job"
        } else {
            ""
        }
    );

    for (_, child) in &mut pods.0 {
        child.wait()?;
    }
    table.pool().close().await;
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    println!("done: one pod ran each tick it could; the takeover came with a larger fencing token");
    Ok(())
}

/// Kills the pods if the demo stops early.
struct Pods(Vec<(String, Child)>);

impl Drop for Pods {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The holder of the live lease, read from the table.
async fn current_holder(table: &SqliteTable) -> Result<Option<String>> {
    let now = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
    let sql = format!(
        "SELECT holder FROM {} WHERE name = ?1 AND expires_at > {now}",
        table.table()
    );
    let holder = leasehold::sqlx::query_scalar(leasehold::sqlx::AssertSqlSafe(sql))
        .bind(NAME)
        .fetch_optional(table.pool())
        .await?;
    Ok(holder)
}

/// One pod: tick, try the lease, run the job if we got it.
async fn pod(schedule: &Schedule, db: &str, n: u32, start: u64) -> Result<()> {
    let table = SqliteTable::open(db).await?;
    let lease = Lease::with_holder(table.clone(), format!("pod-{n}"));
    for tick in 1..=schedule.ticks {
        sleep_until_ms(start + u64::from(tick - 1) * schedule.tick.as_millis() as u64).await;
        match lease.try_acquire(NAME, schedule.ttl).await {
            Ok(Some(guard)) => job(tick, n, guard, schedule.job).await,
            Ok(None) => {
                let holder = current_holder(&table)
                    .await?
                    .unwrap_or_else(|| "nobody".into());
                println!("tick {tick:>2} | pod-{n} skipped: held by {holder}");
            }
            Err(e) => println!("tick {tick:>2} | pod-{n} skipped: {e}"),
        }
    }
    Ok(())
}

/// The job: pretend to work for a while, stopping early if the lease is lost.
async fn job(tick: u32, n: u32, guard: LeaseGuard, duration: Duration) {
    let fence = guard.fencing_token().unwrap_or_default();
    println!("tick {tick:>2} | pod-{n} runs the job        fencing token {fence}");
    let token = guard.token();
    tokio::select! {
        () = tokio::time::sleep(duration) => {}
        () = token.cancelled() => println!("tick {tick:>2} | pod-{n} lost the lease mid-job and stopped"),
    }
    if let Err(e) = guard.release().await {
        println!("tick {tick:>2} | pod-{n} could not release: {e}");
    }
}
