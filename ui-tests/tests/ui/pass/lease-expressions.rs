//! `lease = ...` takes any expression that leads to a `Lease`, evaluated in
//! the fn with its parameters (and `self`) in scope.

use std::sync::{Arc, LazyLock};

use leasehold::{Lease, backend::Memory, singleton};

static LEASE: LazyLock<Lease> = LazyLock::new(|| Lease::new(Memory::new()));

#[singleton(name = "static", ttl = "90s", lease = LEASE)]
async fn from_a_static() -> bool {
    true
}

#[singleton(name = "param", ttl = "90s", lease = lease)]
async fn from_a_reference(lease: &Lease) -> bool {
    true
}

#[singleton(name = "owned", ttl = "90s", lease = lease)]
async fn from_an_owned_value(lease: Lease) -> bool {
    true
}

#[singleton(name = "arc", ttl = "90s", lease = lease)]
async fn from_an_arc(lease: Arc<Lease>) -> bool {
    true
}

#[singleton(name = "option", ttl = "90s", lease = leasehold::global_default())]
async fn from_an_option() -> bool {
    true
}

fn make() -> Lease {
    LEASE.clone()
}

#[singleton(name = "call", ttl = "90s", lease = make())]
async fn from_a_call() -> bool {
    true
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = LEASE.clone();
    assert!(from_a_static().await);
    assert!(from_a_reference(&lease).await);
    assert!(from_an_owned_value(lease.clone()).await);
    assert!(from_an_arc(Arc::new(lease)).await);
    assert!(from_a_call().await);
    assert!(!from_an_option().await, "no global default: skipped");
}
