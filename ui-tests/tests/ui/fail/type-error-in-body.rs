use leasehold::singleton;

// The error points at the user's `rows`, not into the expansion.
#[singleton(name = "count", ttl = "90s")]
async fn count_rows() -> Option<u32> {
    let rows = "42";
    Some(rows)
}

fn main() {
    drop(count_rows());
}
