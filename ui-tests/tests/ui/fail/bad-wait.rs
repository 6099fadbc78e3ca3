use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s", wait = "5x")]
async fn send_digest() {}

fn main() {}
