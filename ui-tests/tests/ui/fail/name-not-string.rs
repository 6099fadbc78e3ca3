use lease::singleton;

#[singleton(name = digest, ttl = "90s")]
async fn send_digest() {}

fn main() {}
