//! Every argument, in any order; `fence` and `token` bind the names given.

use leasehold::{CancellationToken, Lease, backend::Memory, singleton};

#[singleton(
    on_error = "return",
    retry_failed = true,
    once_per = "1h",
    wait = "1s",
    grace = "100ms",
    max_hold = "10m",
    min_hold = "1m 30s",
    fence = fencing_token,
    token = cancel,
    lease = lease,
    ttl = "500ms",
    name = "every-argument",
    crate = "::leasehold",
)]
async fn every_argument(lease: &Lease) -> Result<Option<(u64, bool)>, leasehold::Error> {
    let cancel: CancellationToken = cancel;
    let fencing_token: Option<u64> = fencing_token;
    Ok(fencing_token.map(|f| (f, cancel.is_cancelled())))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    assert!(matches!(every_argument(&lease).await, Ok(Some((1, false)))));
}
