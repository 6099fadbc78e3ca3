use leasehold::singleton;

#[singleton(name = "count", ttl = "90s")]
async fn count_rows() -> u32 {
    42
}

fn main() {
    drop(count_rows());
}
