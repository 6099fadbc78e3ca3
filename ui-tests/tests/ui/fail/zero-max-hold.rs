use leasehold::singleton;

// The token would fire as soon as the lease is acquired.
#[singleton(name = "digest", ttl = "90s", max_hold = "0s")]
async fn send_digest() {}

fn main() {}
