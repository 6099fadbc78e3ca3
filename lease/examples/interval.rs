//! A `#[singleton]` job on a `tokio::time::interval`: three replicas tick
//! together, and each tick exactly one of them runs the job.
//!
//! ```sh
//! cargo run -p leasehold --features sqlite --example interval
//! ```
//!
//! Each replica is what one pod of a service runs: its own [`Lease`] (its
//! own holder) on the shared lease table — here a SQLite file that each
//! replica opens for itself, as separate processes would — and its own
//! interval, which calls the `#[singleton]` fn on every tick. The replicas'
//! ticks do not come at quite the same instant (clocks, start-up and load
//! differ; here each tick comes 0 to 40 ms late), and by the time a late
//! replica ticks, the job has finished and its lease is free. `once_per`
//! makes each half-second slot run once: the late replica finds its slot
//! claimed and skips, instead of running the job a second time. The
//! intervals start in the middle of a slot, so that one tick of every
//! replica falls in one slot. Six ticks, half a second apart, then the
//! example exits.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use leasehold::backend::SqliteTable;
use leasehold::{Lease, singleton};
use tokio::time::{MissedTickBehavior, interval_at, sleep};

const REPLICAS: u32 = 3;
const TICKS: u32 = 6;
const PERIOD: Duration = Duration::from_millis(500);

/// The job, called by every replica on every tick; the body runs on one.
///
/// `once_per` is the ticks' period: one run per slot of it across the
/// replicas. `ttl` bounds how long a crashed replica keeps the job from
/// running.
#[singleton(name = "send-digest", ttl = "30s", once_per = "500ms", lease = replica, fence = fence)]
async fn send_digest(replica: &Lease, tick: u32) -> bool {
    let fence = fence.unwrap_or_default();
    println!(
        "tick {tick} | {} sends the digest (fencing token {fence})",
        replica.holder()
    );
    sleep(Duration::from_millis(50)).await; // ... the real work ...
    true
}

/// One replica: an interval, and the job on every tick. How many times it
/// ran the job.
async fn replica(lease: Lease) -> u32 {
    let mut ticks = interval_at(mid_slot(), PERIOD);
    // After a stall, skip the ticks that were missed instead of firing them
    // all at once: the job runs on the schedule, not in a burst.
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut ran = 0;
    for tick in 1..=TICKS {
        ticks.tick().await;
        sleep(late()).await;
        if send_digest(&lease, tick).await {
            ran += 1;
        } else {
            println!(
                "tick {tick} | {} skipped: this slot ran elsewhere",
                lease.holder()
            );
        }
    }
    // On the way out (SIGTERM in a real service): release what it holds now.
    lease.shutdown().await;
    ran
}

/// The middle of the next slot of [`PERIOD`] (slots count from the Unix
/// epoch), so that ticks a few milliseconds apart fall in one slot.
fn mid_slot() -> tokio::time::Instant {
    let period = PERIOD.as_millis();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let wait = period - now % period + period / 2;
    tokio::time::Instant::now() + Duration::from_millis(u64::try_from(wait).unwrap_or(0))
}

/// How late this replica's tick comes: 0 to 40 ms, at random.
fn late() -> Duration {
    Duration::from_millis(RandomState::new().hash_one(()) % 40)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let file = std::env::temp_dir().join(format!("lease-interval-{}.db", std::process::id()));
    println!(
        "{REPLICAS} replicas, a tick every {PERIOD:?}, one lease table: {}",
        file.display()
    );
    let mut leases = Vec::new();
    for n in 1..=REPLICAS {
        let table = SqliteTable::open(&file).await?;
        leases.push(Lease::with_holder(table, format!("replica-{n}")));
    }
    // Start the replicas' intervals together.
    let replicas: tokio::task::JoinSet<u32> = leases.into_iter().map(replica).collect();
    let runs: u32 = replicas.join_all().await.into_iter().sum();

    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
    }
    println!("{TICKS} ticks, {runs} runs of the job");
    Ok(())
}
