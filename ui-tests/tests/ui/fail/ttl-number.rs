use leasehold::singleton;

#[singleton(name = "digest", ttl = 90)]
async fn send_digest() {}

fn main() {}
