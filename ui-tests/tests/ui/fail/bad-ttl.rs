use leasehold::singleton;

#[singleton(name = "digest", ttl = "90x")]
async fn send_digest() {}

fn main() {}
