use leasehold::singleton;

#[singleton(ttl = "90s")]
async fn send_digest() {}

fn main() {}
