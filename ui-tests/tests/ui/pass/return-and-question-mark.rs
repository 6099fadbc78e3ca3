//! `return` and `?` in the body return from the fn, as without the macro.

use leasehold::{Lease, backend::Memory, singleton};

#[singleton(name = "parse", ttl = "90s", lease = lease)]
async fn parse(lease: &Lease, input: &str) -> Result<Option<u32>, std::num::ParseIntError> {
    if input.is_empty() {
        return Ok(None);
    }
    let n: u32 = input.parse()?;
    Ok(Some(n * 2))
}

#[singleton(name = "first-even", ttl = "90s", lease = lease)]
async fn first_even(lease: &Lease, xs: Vec<u32>) -> Option<u32> {
    for x in xs {
        if x % 2 == 0 {
            return Some(x);
        }
    }
    None
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let lease = Lease::new(Memory::new());
    assert_eq!(parse(&lease, "21").await, Ok(Some(42)));
    assert_eq!(parse(&lease, "").await, Ok(None));
    assert!(parse(&lease, "x").await.is_err());
    assert_eq!(first_even(&lease, vec![1, 3, 4, 6]).await, Some(4));
}
