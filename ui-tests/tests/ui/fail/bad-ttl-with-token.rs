use leasehold::{Lease, singleton};

struct Mailer {
    lease: Lease,
    batches: Vec<u32>,
}

impl Mailer {
    // The bad ttl is the only error: the body still sees `cancel` and
    // `fencing_token`, with their types, so no "cannot find value" follows.
    #[singleton(name = "digest", ttl = "90x", lease = self.lease, token = cancel, fence = fencing_token)]
    async fn send_digest(&self) -> Option<u64> {
        let mut sent = 0;
        for _ in &self.batches {
            if cancel.is_cancelled() {
                return None;
            }
            sent += 1;
        }
        Some(fencing_token? + sent)
    }
}

fn main() {
    let mailer = Mailer {
        lease: Lease::new(leasehold::backend::Memory::new()),
        batches: vec![1, 2],
    };
    drop(mailer.send_digest());
}
