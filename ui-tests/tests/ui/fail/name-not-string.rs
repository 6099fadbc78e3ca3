use leasehold::singleton;

#[singleton(name = 42, ttl = "90s")]
async fn send_digest() {}

fn main() {}
