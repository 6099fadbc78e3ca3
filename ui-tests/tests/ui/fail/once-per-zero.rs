use leasehold::singleton;

// A period of zero has no slots to run once in.
#[singleton(name = "digest", ttl = "90s", once_per = "0s")]
async fn send_digest() {}

fn main() {}
