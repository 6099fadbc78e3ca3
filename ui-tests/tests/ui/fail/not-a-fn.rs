use leasehold::singleton;

#[singleton(name = "digest", ttl = "90s")]
struct Digest {
    recipients: Vec<String>,
}

fn main() {
    let digest = Digest {
        recipients: Vec::new(),
    };
    assert!(digest.recipients.is_empty());
}
