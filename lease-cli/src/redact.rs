//! Keeping passwords out of everything `lease` prints.
//!
//! A URL's password (`scheme://user:PASSWORD@host`, or a `password=` /
//! `sslpassword=` query parameter) is replaced by `***` wherever the URL is
//! shown, and any other text `lease` prints (errors of the drivers, which
//! may quote what they were given) has every occurrence of the password
//! replaced as well, raw and percent-decoded.

/// What must never be printed, found in one URL.
#[derive(Debug, Clone, Default)]
pub(crate) struct Secrets(Vec<String>);

/// The query parameters that carry a password.
const PASSWORD_PARAMS: [&str; 2] = ["password", "sslpassword"];

impl Secrets {
    /// The passwords in `url`, as written and percent-decoded.
    pub(crate) fn of(url: &str) -> Self {
        let mut found = Vec::new();
        if let Some((start, end)) = password_span(url) {
            found.push(url[start..end].to_owned());
        }
        if let Some((_, query)) = url.split_once('?') {
            for pair in query.split('&') {
                if let Some((key, value)) = pair.split_once('=')
                    && PASSWORD_PARAMS.contains(&key.to_ascii_lowercase().as_str())
                {
                    found.push(value.to_owned());
                }
            }
        }
        let decoded: Vec<String> = found.iter().map(|s| percent_decode(s)).collect();
        found.extend(decoded);
        found.retain(|s| !s.is_empty());
        found.sort_by_key(|s| std::cmp::Reverse(s.len()));
        found.dedup();
        Self(found)
    }

    /// `text` with every password replaced by `***`.
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.0 {
            text = text.replace(secret.as_str(), "***");
        }
        text
    }
}

/// `url` with its password (user info and query parameters) shown as `***`.
pub(crate) fn url(url: &str) -> String {
    let mut out = match password_span(url) {
        Some((start, end)) => format!("{}***{}", &url[..start], &url[end..]),
        None => url.to_owned(),
    };
    if let Some((base, query)) = out.clone().split_once('?') {
        let query: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if PASSWORD_PARAMS.contains(&key.to_ascii_lowercase().as_str()) => {
                    format!("{key}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        out = format!("{base}?{}", query.join("&"));
    }
    out
}

/// Where the password of `scheme://user:password@host/..` is in `url`.
fn password_span(url: &str) -> Option<(usize, usize)> {
    let authority_start = url.find("://")? + 3;
    let rest = &url[authority_start..];
    let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_len];
    let at = authority.rfind('@')?;
    let colon = authority[..at].find(':')?;
    Some((authority_start + colon + 1, authority_start + at))
}

/// `%XX` escapes decoded (invalid ones kept as they are).
pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_the_user_info_are_hidden() {
        assert_eq!(
            url("postgres://app:s3cr%40t@db.example:5432/app?sslmode=require"),
            "postgres://app:***@db.example:5432/app?sslmode=require"
        );
        assert_eq!(url("rediss://:pw@cache:6380"), "rediss://:***@cache:6380");
        assert_eq!(
            url("mysql://root@127.0.0.1/test"),
            "mysql://root@127.0.0.1/test"
        );
        assert_eq!(
            url("sqlite:/var/lib/leases.db"),
            "sqlite:/var/lib/leases.db"
        );
        // Several hosts (etcd, Redis Cluster): one user info for all.
        assert_eq!(
            url("etcd://root:s3cr3t@10.0.0.1:2379,10.0.0.2:2379/app/lease/"),
            "etcd://root:***@10.0.0.1:2379,10.0.0.2:2379/app/lease/"
        );
        assert_eq!(
            url("redis+cluster://:pw@n1:7000,n2:7001"),
            "redis+cluster://:***@n1:7000,n2:7001"
        );
        // An `@` in the path is not user info.
        assert_eq!(url("sqlite:///tmp/a:b@c.db"), "sqlite:///tmp/a:b@c.db");
    }

    #[test]
    fn password_parameters_are_hidden() {
        assert_eq!(
            url("postgres://db/app?user=app&password=hunter2&sslmode=require"),
            "postgres://db/app?user=app&password=***&sslmode=require"
        );
    }

    #[test]
    fn every_form_of_the_password_is_scrubbed() {
        let secrets = Secrets::of("postgres://app:s3cr%40t@db/app?sslpassword=k3y");
        let text = "failed for app:s3cr%40t, that is s3cr@t, with k3y";
        let scrubbed = secrets.scrub(text);
        assert!(!scrubbed.contains("s3cr"), "{scrubbed}");
        assert!(!scrubbed.contains("k3y"), "{scrubbed}");
        assert_eq!(Secrets::of("redis://127.0.0.1").scrub("as is"), "as is");
    }
}
