use leasehold::singleton;

// Up to 24 h is accepted (longer than the ttl is fine); more is a mistake.
#[singleton(name = "digest", ttl = "90s", min_hold = "2days")]
async fn send_digest() {}

fn main() {}
