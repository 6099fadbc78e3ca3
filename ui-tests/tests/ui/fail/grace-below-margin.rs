use leasehold::singleton;

// A grace under the margin (ttl/100 + 2 ms = 902 ms for 90 s) would let the
// lease pass on before the token fires on a slightly slow clock.
#[singleton(name = "digest", ttl = "90s", grace = "900ms")]
async fn send_digest() {}

fn main() {}
