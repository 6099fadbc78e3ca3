use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s", wait = "5s", wait = "10s")]
async fn send_digest() {}

fn main() {}
