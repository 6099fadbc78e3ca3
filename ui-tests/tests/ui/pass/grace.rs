//! `grace`: a literal (checked against a literal ttl at compile time), or a
//! `Duration` expression (checked at each call).
#![deny(warnings)]

use std::time::Duration;

use leasehold::{Lease, backend::Memory, singleton};

#[singleton(name = "literal", ttl = "90s", grace = "20s", lease = lease)]
async fn literal(lease: &Lease) -> bool {
    true
}

#[singleton(name = "bounds", ttl = "90s", grace = "902ms", lease = lease)]
async fn least(lease: &Lease) -> bool {
    true
}

#[singleton(name = "bounds", ttl = "90s", grace = "45s", lease = lease)]
async fn most(lease: &Lease) -> bool {
    true
}

#[singleton(name = "expression", ttl = "90s", grace = grace, lease = lease)]
async fn expression(lease: &Lease, grace: Duration) -> bool {
    true
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    assert!(literal(&lease).await);
    assert!(least(&lease).await);
    assert!(most(&lease).await);
    assert!(expression(&lease, Duration::from_secs(30)).await);
    // Out of range for the ttl: the run is skipped (logged).
    assert!(!expression(&lease, Duration::from_secs(60)).await);
}
