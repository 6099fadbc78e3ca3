use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s")]
fn send_digest() {}

fn main() {
    send_digest();
}
