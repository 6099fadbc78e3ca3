use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s", max_hold = "2days")]
async fn send_digest() {}

fn main() {}
