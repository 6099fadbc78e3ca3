use leasehold::singleton;

const TTL_SECS: u64 = 90;

// An expression must be a `std::time::Duration`, not a number of seconds.
#[singleton(name = "digest", ttl = TTL_SECS)]
async fn send_digest() {}

fn main() {}
