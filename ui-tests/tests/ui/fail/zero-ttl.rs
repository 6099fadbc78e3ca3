use leasehold::singleton;

#[singleton(name = "digest", ttl = "0s")]
async fn send_digest() {}

fn main() {}
