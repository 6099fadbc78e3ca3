//! Leader election between processes on one SQLite file: the leader works,
//! the other follows; Ctrl-C makes the leader resign, and the other takes
//! over at once.
//!
//! Run it twice, in two terminals:
//!
//! ```sh
//! cargo run -p leasehold --features sqlite --example leader   # terminal 1: leads
//! cargo run -p leasehold --features sqlite --example leader   # terminal 2: follows
//! ```
//!
//! Both open the same file (`lease-leader.db` in the temp directory, or
//! the path given as the argument) and call `Lease::elect`, each
//! proclaiming the address it would serve on (`Election::proclaim`). The
//! leader prints a line for each round of work with its fencing token; the
//! other prints whom it follows and where that leader is — what a follower
//! needs to forward requests to it. Press Ctrl-C in the leader's terminal: it
//! resigns (releases the lease) and exits, and the follower leads within
//! about a poll (SQLite cannot push releases: waiters poll every ttl/10,
//! here 1 s) — not after the ttl of 10 s, which is what a leader that
//! crashed (`kill -9`) costs. Start it again and it follows the new leader.
//!
//! The test `tests/tests/leader_example.rs` runs this code as two
//! processes and sends the leader SIGINT.

use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold::backend::SqliteTable;
use leasehold::{Leadership, Lease};

/// The lease both processes elect on.
const NAME: &str = "leader-demo";
/// How long a crashed leader blocks the other; renewed every ttl/3.
const TTL: Duration = Duration::from_secs(10);
/// The time between two rounds of the leader's work.
const ROUND: Duration = Duration::from_millis(500);

pub(crate) type Result<T, E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let db = std::env::args_os().nth(1).map_or_else(
        || std::env::temp_dir().join("lease-leader.db"),
        PathBuf::from,
    );
    run(&db).await
}

/// One process of the election, on the SQLite file `db`, until Ctrl-C.
pub(crate) async fn run(db: &Path) -> Result<()> {
    let lease = Lease::new(SqliteTable::open(db).await?);
    let me = lease.holder().to_owned();
    println!("{me} | electing on {}", db.display());
    let election = lease.elect(NAME, TTL);
    // Where this process would serve, should it lead (a made-up port).
    let address = format!("127.0.0.1:{}", 8000 + std::process::id() % 1000);
    election.proclaim(address.as_str())?;
    let mut state = election.watch();
    // Installs the SIGINT handler when first polled, in the first turn of
    // the loop below: from then on Ctrl-C no longer kills the process.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    'elect: loop {
        // Until we lead: say whom we follow.
        let term = tokio::select! {
            term = election.leading() => term,
            changed = state.changed() => {
                changed?;
                if let Leadership::Following { leader, value } = &*state.borrow_and_update() {
                    let leader = leader.as_deref().unwrap_or("someone");
                    let at = value.as_deref().unwrap_or("an unknown address");
                    println!("{me} | following {leader} at {at}");
                }
                continue;
            }
            signal = &mut ctrl_c => {
                signal?;
                break 'elect;
            }
        };
        // Lead: work until the term ends (the lease was lost) or Ctrl-C. A
        // real leader passes the fencing token to what it writes, so that
        // a deposed leader's late writes are refused.
        let fence = term
            .fencing_token()
            .map_or_else(|| "none".to_owned(), |f| f.to_string());
        println!("{me} | leading, fencing token {fence}, serving at {address}");
        let token = term.token();
        let mut work = tokio::time::interval(ROUND);
        for round in 1.. {
            tokio::select! {
                () = token.cancelled() => {
                    println!("{me} | lost the lease: stopped working, contending again");
                    continue 'elect;
                }
                signal = &mut ctrl_c => {
                    signal?;
                    break 'elect;
                }
                _ = work.tick() => println!("{me} | working, round {round}, fencing token {fence}"),
            }
        }
    }
    println!("{me} | Ctrl-C: resigning");
    election.resign().await?;
    println!("{me} | resigned");
    Ok(())
}
