//! The future of an annotated fn is `Send` when its body is: it can be
//! `tokio::spawn`ed.

use std::sync::Arc;

use leasehold::{Lease, backend::Memory, singleton};

struct Jobs {
    lease: Lease,
}

impl Jobs {
    #[singleton(name = "send", ttl = "90s", lease = self.lease, token = cancel, min_hold = "1s")]
    async fn run(self: Arc<Self>, n: u32) -> Option<u32> {
        tokio::task::yield_now().await;
        (!cancel.is_cancelled()).then_some(n)
    }
}

#[singleton(name = "free", ttl = "90s", lease = lease)]
async fn free(lease: Lease, names: Vec<String>) -> Option<usize> {
    tokio::task::yield_now().await;
    Some(names.len())
}

fn assert_send<T: Send>(t: T) -> T {
    t
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    let jobs = Arc::new(Jobs {
        lease: lease.clone(),
    });
    let a = tokio::spawn(assert_send(jobs.run(7)));
    let b = tokio::spawn(assert_send(free(lease, vec!["a".into()])));
    assert_eq!(a.await.unwrap(), Some(7));
    assert_eq!(b.await.unwrap(), Some(1));
}
