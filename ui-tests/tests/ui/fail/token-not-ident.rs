use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s", token = "cancel")]
async fn send_digest() {}

fn main() {}
