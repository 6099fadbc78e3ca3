//! A body that is a single expression compiles without a warning, for every
//! return type with a skipped value, in free fns and in methods: the
//! expansion must not make rustc lint the user's code (it used to get
//! `unused_braces`).
//!
//! The bodies stay on one line, as written (do not rustfmt this file): rustc
//! only lints braces that do not span several lines.
#![deny(warnings)]

use std::sync::atomic::{AtomicBool, Ordering};

use leasehold::{Lease, backend::Memory, singleton};

static RAN: AtomicBool = AtomicBool::new(false);

#[singleton(name = "unit-empty", ttl = "90s", lease = lease)]
async fn unit_empty(lease: &Lease) {}

#[singleton(name = "unit", ttl = "90s", lease = lease)]
async fn unit(lease: &Lease) { RAN.store(true, Ordering::Relaxed) }

// clippy's own advice on the user's `()`, nothing to do with the macro.
#[allow(clippy::unused_unit)]
#[singleton(name = "unit-expr", ttl = "90s", lease = lease)]
async fn unit_expr(lease: &Lease) { () }

#[singleton(name = "bool", ttl = "90s", lease = lease)]
async fn boolean(lease: &Lease) -> bool { true }

#[singleton(name = "option", ttl = "90s", lease = lease)]
async fn option(lease: &Lease) -> Option<u32> { Some(1) }

#[singleton(name = "result", ttl = "90s", lease = lease)]
async fn result(lease: &Lease) -> Result<(), String> { Ok(()) }

#[singleton(name = "result-option", ttl = "90s", lease = lease)]
async fn result_option(lease: &Lease) -> Result<Option<u8>, String> { Ok(Some(1)) }

#[singleton(name = "awaited", ttl = "90s", lease = lease)]
async fn awaited(lease: &Lease) -> bool { std::future::ready(true).await }

macro_rules! ok {
    () => {
        Ok(())
    };
}

#[singleton(name = "macro", ttl = "90s", lease = lease)]
async fn macro_call(lease: &Lease) -> Result<(), String> { ok!() }

#[singleton(name = "if-else", ttl = "90s", lease = lease)]
async fn if_else(lease: &Lease, n: u32) -> Option<u32> { if n > 0 { Some(n) } else { None } }

struct Jobs {
    lease: Lease,
    runs: u32,
}

impl Jobs {
    #[singleton(name = "m-unit-empty", ttl = "90s", lease = self.lease)]
    async fn unit_empty(&self) {}

    #[singleton(name = "m-unit", ttl = "90s", lease = self.lease)]
    async fn unit(&self) { RAN.store(self.runs > 0, Ordering::Relaxed) }

    #[allow(clippy::unused_unit)]
    #[singleton(name = "m-unit-expr", ttl = "90s", lease = self.lease)]
    async fn unit_expr(&self) { () }

    #[singleton(name = "m-bool", ttl = "90s", lease = self.lease)]
    async fn boolean(&self) -> bool { self.runs > 0 }

    #[singleton(name = "m-option", ttl = "90s", lease = self.lease)]
    async fn option(&self) -> Option<u32> { Some(self.runs) }

    #[singleton(name = "m-result", ttl = "90s", lease = self.lease)]
    async fn result(&self) -> Result<(), String> { Ok(()) }

    #[singleton(name = "m-result-option", ttl = "90s", lease = self.lease)]
    async fn result_option(&self) -> Result<Option<u32>, String> { Ok(Some(self.runs)) }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    unit_empty(&lease).await;
    unit(&lease).await;
    unit_expr(&lease).await;
    assert!(RAN.load(Ordering::Relaxed));
    assert!(boolean(&lease).await);
    assert_eq!(option(&lease).await, Some(1));
    assert_eq!(result(&lease).await, Ok(()));
    assert_eq!(result_option(&lease).await, Ok(Some(1)));
    assert!(awaited(&lease).await);
    assert_eq!(macro_call(&lease).await, Ok(()));
    assert_eq!(if_else(&lease, 2).await, Some(2));
    assert_eq!(if_else(&lease, 0).await, None);

    let jobs = Jobs { lease, runs: 1 };
    jobs.unit_empty().await;
    jobs.unit_expr().await;
    RAN.store(false, Ordering::Relaxed);
    jobs.unit().await;
    assert!(RAN.load(Ordering::Relaxed));
    assert!(jobs.boolean().await);
    assert_eq!(jobs.option().await, Some(1));
    assert_eq!(jobs.result().await, Ok(()));
    assert_eq!(jobs.result_option().await, Ok(Some(1)));
    new_arguments().await;
}

// The new arguments, as expressions, with one-expression bodies.
const JOB: &str = "const-name";

#[singleton(name = JOB, ttl = std::time::Duration::from_secs(90), lease = lease)]
async fn const_name(lease: &Lease) -> bool { true }

#[singleton(name = format!("tenant-{tenant}"), ttl = "90s", wait = "1s", max_hold = "10m", lease = lease)]
async fn per_tenant(lease: &Lease, tenant: u32) -> Option<u32> { Some(tenant) }

#[singleton(name = "durations", ttl = ttl, min_hold = ttl / 2, max_hold = ttl * 2, wait = ttl / 90, lease = lease)]
async fn durations(lease: &Lease, ttl: std::time::Duration) -> Option<u64> { Some(ttl.as_secs()) }

#[singleton(name = "returns-errors", ttl = "90s", lease = lease, on_error = "return")]
async fn returns_errors(lease: &Lease) -> Result<Option<u8>, leasehold::Error> { Ok(Some(1)) }

#[singleton(name = "returns-errors-unit", ttl = "90s", lease = lease, on_error = "return")]
async fn returns_errors_unit(lease: &Lease) -> Result<(), leasehold::Error> { ok!() }

impl Jobs {
    #[singleton(name = format!("m-{}", self.runs), ttl = "90s", lease = self.lease, on_error = "return")]
    async fn named_by_self(&self) -> Result<Option<u32>, leasehold::Error> { Ok(Some(self.runs)) }
}

async fn new_arguments() {
    let lease = Lease::new(Memory::new());
    assert!(const_name(&lease).await);
    assert_eq!(per_tenant(&lease, 7).await, Some(7));
    assert_eq!(durations(&lease, std::time::Duration::from_secs(90)).await, Some(90));
    assert!(matches!(returns_errors(&lease).await, Ok(Some(1))));
    assert!(returns_errors_unit(&lease).await.is_ok());
    let jobs = Jobs { lease, runs: 3 };
    assert!(matches!(jobs.named_by_self().await, Ok(Some(3))));
}
