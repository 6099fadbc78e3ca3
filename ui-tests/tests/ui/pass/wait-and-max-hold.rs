//! `wait` waits for the lease instead of skipping at once; `max_hold`
//! cancels the token (and ends the lease) that long after acquisition.
#![deny(warnings)]

use std::time::Duration;

use leasehold::{Lease, backend::Memory, singleton};

#[singleton(name = "waits", ttl = "90s", wait = "5s", lease = lease)]
async fn waits(lease: &Lease) -> bool {
    true
}

#[singleton(name = "capped", ttl = "90s", max_hold = "200ms", lease = lease, token = cancel)]
async fn capped(lease: &Lease) -> bool {
    cancel.cancelled().await;
    true
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let db = Memory::new();
    let lease = Lease::with_holder(db.clone(), "a");
    let other = Lease::with_holder(db, "b");
    let held = other.try_acquire("waits", Duration::from_secs(90)).await.unwrap().expect("free");
    let release = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        held.release().await.unwrap();
    };
    let (ran, ()) = tokio::join!(waits(&lease), release);
    assert!(ran, "waited for the other holder to let go");

    // Returns only because max_hold cancels the token.
    assert!(capped(&lease).await);
}
