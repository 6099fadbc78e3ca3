use leasehold::singleton;

#[singleton(name = "digest")]
async fn send_digest() {}

fn main() {}
