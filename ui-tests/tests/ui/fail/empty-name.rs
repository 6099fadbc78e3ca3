use leasehold::singleton;

#[singleton(name = "", ttl = "90s")]
async fn send_digest() {}

fn main() {}
