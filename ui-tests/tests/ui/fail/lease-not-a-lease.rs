use leasehold::singleton;

struct Jobs {
    pool: String,
}

impl Jobs {
    #[singleton(name = "count", ttl = "90s", lease = self.pool)]
    async fn count_rows(&self) {}
}

fn main() {
    let jobs = Jobs {
        pool: String::new(),
    };
    drop(jobs.count_rows());
}
