use leasehold::singleton;

// Slots are counted in whole milliseconds.
#[singleton(name = "digest", ttl = "90s", once_per = "1500us")]
async fn send_digest() {}

fn main() {}
