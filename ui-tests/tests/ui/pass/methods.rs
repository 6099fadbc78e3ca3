//! `lease = self.lease` on `&self`, `&mut self` and `self: Arc<Self>`
//! methods, and in a trait impl.

use std::sync::Arc;

use leasehold::{Lease, backend::Memory, singleton};

struct Jobs {
    lease: Lease,
    runs: u32,
}

impl Jobs {
    #[singleton(name = "by-ref", ttl = "90s", lease = self.lease)]
    async fn by_ref(&self) -> Option<u32> {
        Some(self.runs)
    }

    #[singleton(name = "by-mut", ttl = "90s", lease = self.lease, token = cancel)]
    async fn by_mut(&mut self) {
        if !cancel.is_cancelled() {
            self.runs += 1;
        }
    }

    #[singleton(name = "by-arc", ttl = "90s", lease = self.lease)]
    async fn by_arc(self: Arc<Self>) -> Option<u32> {
        Some(self.runs)
    }

    #[singleton(name = "by-value", ttl = "90s", lease = self.lease)]
    async fn by_value(self) -> Option<u32> {
        Some(self.runs)
    }
}

trait Job {
    async fn tick(&self) -> bool;
}

impl Job for Jobs {
    #[singleton(name = "trait", ttl = "90s", lease = self.lease)]
    async fn tick(&self) -> bool {
        self.runs > 0
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut jobs = Jobs {
        lease: Lease::new(Memory::new()),
        runs: 0,
    };
    assert_eq!(jobs.by_ref().await, Some(0));
    jobs.by_mut().await;
    assert!(jobs.tick().await);
    let jobs = Arc::new(jobs);
    assert_eq!(jobs.clone().by_arc().await, Some(1));
    let jobs = Arc::into_inner(jobs).unwrap();
    assert_eq!(jobs.by_value().await, Some(1));
}
