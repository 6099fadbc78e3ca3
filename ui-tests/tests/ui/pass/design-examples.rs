//! The two signature shapes `#[singleton]` was designed around: a free fn
//! on the global default lease (the README's first example) and a method
//! with its own lease, a token and `min_hold`; stand-ins for the pool and
//! the error types.

use leasehold::singleton;

struct PgPool;

mod anyhow {
    pub type Result<T> = std::result::Result<T, String>;
}

#[singleton(name = "agent-scheduler", ttl = "90s")]
async fn check_schedules(db: &PgPool) -> anyhow::Result<()> {
    let _ = db;
    Ok(())
}

struct Scheduler {
    lease: leasehold::Lease,
}

#[derive(Debug)]
struct MyError;

impl Scheduler {
    #[singleton(name = "digest", ttl = "2m", lease = self.lease, token = cancel, min_hold = "30s")]
    async fn send_digest(&self) -> Result<Option<usize>, MyError> {
        let mut sent = 0;
        while !cancel.is_cancelled() && sent < 3 {
            sent += 1;
        }
        Ok(Some(sent))
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // No global default is set: skipped (and logged), not a panic.
    assert_eq!(check_schedules(&PgPool).await, Ok(()));

    let scheduler = Scheduler {
        lease: leasehold::Lease::new(leasehold::backend::Memory::new()),
    };
    assert_eq!(scheduler.send_digest().await.unwrap(), Some(3));
}
