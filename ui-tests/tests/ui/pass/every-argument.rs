//! Every argument, in any order; `fence` and `token` bind the names given.

use lease::{CancellationToken, Lease, backend::Memory, singleton};

#[singleton(
    min_hold = "1m 30s",
    fence = fencing_token,
    token = cancel,
    lease = lease,
    ttl = "500ms",
    name = "every-argument",
    crate = "::lease",
)]
async fn every_argument(lease: &Lease) -> Option<(u64, bool)> {
    let cancel: CancellationToken = cancel;
    let fencing_token: Option<u64> = fencing_token;
    Some((fencing_token?, cancel.is_cancelled()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    assert_eq!(every_argument(&lease).await, Some((1, false)));
}
