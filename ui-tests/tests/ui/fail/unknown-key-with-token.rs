use leasehold::{Lease, singleton};

struct Mailer {
    lease: Lease,
}

impl Mailer {
    // The unknown key is the only error: parsing goes on past it, so the body
    // still sees `cancel` and no "cannot find value" follows.
    #[singleton(name = "digest", ttl = "90s", timeout = "10s", lease = self.lease, token = cancel)]
    async fn send_digest(&self) -> bool {
        !cancel.is_cancelled()
    }
}

fn main() {
    let mailer = Mailer {
        lease: Lease::new(leasehold::backend::Memory::new()),
    };
    drop(mailer.send_digest());
}
