use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s", ttl = "2m")]
async fn send_digest() {}

fn main() {}
