use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s", timeout = "10s")]
async fn send_digest() {}

fn main() {}
