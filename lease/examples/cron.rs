//! A `#[singleton]` job on a cron schedule (`tokio-cron-scheduler`): two
//! replicas, each with its own scheduler, and each tick exactly one of them
//! runs the job.
//!
//! ```sh
//! cargo run -p leasehold --features sqlite --example cron
//! ```
//!
//! Each replica is what one pod of a service runs: a `JobScheduler` with the
//! job on the schedule `*/2 * * * * *` (every two seconds; the first field is
//! the seconds), and its own [`Lease`] on the shared lease table — here a
//! SQLite file that each replica opens for itself. The job's closure calls
//! the `#[singleton]` fn on every replica; one runs the body, the others
//! skip that tick.
//!
//! A cron scheduler does not fire on the dot: `tokio-cron-scheduler` looks
//! for due jobs every 500 ms, so two replicas fire the same tick up to half
//! a second apart, and by then the first one's job has finished and its
//! lease is free. `once_per = "2s"` makes each two-second slot of the
//! schedule run once: the later replica finds its slot claimed and skips,
//! however late it fires. After three runs, the example stops its
//! schedulers and exits.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::backend::SqliteTable;
use leasehold::{Lease, singleton};
use tokio::sync::mpsc;
use tokio_cron_scheduler::{Job, JobScheduler};

/// Every two seconds, at second 0, 2, 4, ... (UTC).
const SCHEDULE: &str = "*/2 * * * * *";
const REPLICAS: u32 = 2;
const RUNS: u32 = 3;

/// The job, called by every replica on every tick; the body runs on one.
#[singleton(name = "send-report", ttl = "30s", once_per = "2s", lease = replica, fence = fence)]
async fn send_report(replica: &Lease) -> bool {
    let fence = fence.unwrap_or_default();
    println!(
        "{} {} sends the report (fencing token {fence})",
        at(),
        replica.holder()
    );
    tokio::time::sleep(Duration::from_millis(100)).await; // ... the real work ...
    true
}

/// One replica's scheduler, with the job on [`SCHEDULE`]; each run is
/// reported on `ran`.
async fn replica(lease: Lease, ran: mpsc::UnboundedSender<()>) -> Result<JobScheduler, Error> {
    let scheduler = JobScheduler::new().await?;
    let job = Job::new_async(SCHEDULE, move |_id, _scheduler| {
        let (lease, ran) = (lease.clone(), ran.clone());
        Box::pin(async move {
            if send_report(&lease).await {
                let _ = ran.send(());
            } else {
                println!(
                    "{} {} skipped: this slot ran elsewhere",
                    at(),
                    lease.holder()
                );
            }
        })
    })?;
    scheduler.add(job).await?;
    scheduler.start().await?;
    Ok(scheduler)
}

/// The time within the minute, `:SS.mmm` (UTC), to see when each replica fired.
fn at() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    format!(":{:02}.{:03}", now.as_secs() % 60, now.subsec_millis())
}

type Error = Box<dyn std::error::Error>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let file = std::env::temp_dir().join(format!("lease-cron-{}.db", std::process::id()));
    println!(
        "{REPLICAS} replicas, the schedule {SCHEDULE:?}, one lease table: {}",
        file.display()
    );
    let (ran, mut runs) = mpsc::unbounded_channel();
    let mut replicas = Vec::new();
    for n in 1..=REPLICAS {
        let lease = Lease::with_holder(SqliteTable::open(&file).await?, format!("replica-{n}"));
        replicas.push((replica(lease.clone(), ran.clone()).await?, lease));
    }

    // Let it tick; give up after a while if it does not (it always does).
    let ticking = async {
        for _ in 0..RUNS {
            runs.recv().await;
        }
    };
    let result = tokio::time::timeout(Duration::from_secs(30), ticking).await;

    // On the way out (SIGTERM in a real service): stop scheduling, then
    // release what the replica holds.
    for (mut scheduler, lease) in replicas {
        scheduler.shutdown().await?;
        lease.shutdown().await;
    }
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    result.map_err(|_| "the job did not run three times in 30 s")?;
    println!("{RUNS} runs of the job, each on one replica");
    Ok(())
}
