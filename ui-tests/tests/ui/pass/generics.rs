//! Generic fns, `impl Trait` arguments, lifetimes and where clauses.

use std::fmt::Display;

use leasehold::{Lease, backend::Memory, singleton};

#[singleton(name = "generic", ttl = "90s", lease = lease)]
async fn generic<T: Display + Send>(lease: &Lease, value: T) -> Option<String> {
    Some(value.to_string())
}

#[singleton(name = "impl-trait", ttl = "90s", lease = lease)]
async fn impl_trait(lease: &Lease, values: impl IntoIterator<Item = u32>) -> Option<u32> {
    Some(values.into_iter().sum())
}

#[singleton(name = "lifetimes", ttl = "90s", lease = lease)]
async fn lifetimes<'a, T>(lease: &Lease, items: &'a [T]) -> Option<&'a T>
where
    T: PartialOrd,
{
    items.iter().fold(None, |max, x| match max {
        Some(m) if m >= x => Some(m),
        _ => Some(x),
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    assert_eq!(generic(&lease, 42).await.as_deref(), Some("42"));
    assert_eq!(impl_trait(&lease, [1, 2, 3]).await, Some(6));
    assert_eq!(lifetimes(&lease, &[3, 9, 4]).await, Some(&9));
}
