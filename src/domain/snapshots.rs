//! An etcd snapshot policy as a cluster declares it (`etcdSnapshots: {every: 6h, keep: 28, store:
//! s3://bucket/prefix}` in its inventory document) and the store URLs it may name. Pure rules:
//! imports nothing but std, serde and url.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How often, how many, where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SnapshotPolicy {
    /// Take one this often: `6h`, `30m`, `1d`, `1h30m` (at least 5 minutes).
    #[schema(value_type = String)]
    pub every: Every,
    /// Verified snapshots kept (older ones are removed once a newer one is verified).
    pub keep: u32,
    /// `s3://BUCKET/PREFIX` or `file:///ABSOLUTE/PATH`; never credentials.
    pub store: String,
}

impl SnapshotPolicy {
    /// What is wrong with it: (field, message) pairs.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.every.0 < Duration::from_secs(300) {
            out.push(("every", "must be at least 5m".to_string()));
        }
        if !(1..=10_000).contains(&self.keep) {
            out.push(("keep", "must be between 1 and 10000".to_string()));
        }
        if let Err(e) = parse_store_url(&self.store) {
            out.push(("store", e));
        }
        out
    }
}

/// A period written `6h`, `30m`, `1d`, `90s` or a sum such as `1h30m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Every(pub Duration);

impl std::str::FromStr for Every {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not a period such as 6h, 30m, 1d or 1h30m");
        let mut total: u64 = 0;
        let mut num = String::new();
        for c in s.trim().chars() {
            if c.is_ascii_digit() {
                num.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return Err(bad()),
            };
            let n: u64 = num.parse().map_err(|_| bad())?;
            total = n
                .checked_mul(unit)
                .and_then(|v| total.checked_add(v))
                .ok_or_else(bad)?;
            num.clear();
        }
        if !num.is_empty() || total == 0 {
            return Err(bad());
        }
        Ok(Every(Duration::from_secs(total)))
    }
}

impl std::fmt::Display for Every {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut s = self.0.as_secs();
        for (unit, n) in [("d", 86_400), ("h", 3600), ("m", 60)] {
            if s >= n {
                write!(f, "{}{unit}", s / n)?;
                s %= n;
            }
        }
        if s > 0 || self.0.as_secs() == 0 {
            write!(f, "{s}s")?;
        }
        Ok(())
    }
}

impl Serialize for Every {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Every {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// A directory.
    Dir(PathBuf),
    /// A bucket and a prefix (no leading or trailing `/`; may be empty).
    S3 {
        /// Bucket.
        bucket: String,
        /// Key prefix.
        prefix: String,
    },
}

/// Parse `s3://bucket/prefix` or `file:///absolute/path`, naming what is wrong.
pub fn parse_store_url(url: &str) -> Result<StoreUrl, String> {
    let u = url::Url::parse(url).map_err(|e| {
        format!("`{url}` is not a URL ({e}): use s3://BUCKET/PREFIX or file:///ABSOLUTE/PATH")
    })?;
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!(
            "`{}` carries credentials: they never go in the inventory (use [snapshots] s3_credentials_file or AWS_* variables)",
            u.scheme()
        ));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(format!(
            "`{url}` has a query or fragment: name only the bucket and prefix"
        ));
    }
    match u.scheme() {
        "file" => {
            if u.host_str().is_some_and(|h| !h.is_empty()) {
                return Err(format!(
                    "`{url}`: a file URL has no host (file:///ABSOLUTE/PATH)"
                ));
            }
            let p = u
                .to_file_path()
                .map_err(|_| format!("`{url}` is not an absolute file path"))?;
            Ok(StoreUrl::Dir(p))
        }
        "s3" => {
            let bucket = u.host_str().unwrap_or_default().to_string();
            if bucket.is_empty() {
                return Err(format!("`{url}` names no bucket (s3://BUCKET/PREFIX)"));
            }
            let prefix = u.path().trim_matches('/').to_string();
            if prefix.split('/').any(|s| s == "." || s == "..") {
                return Err(format!("`{url}`: the prefix may not contain `.` or `..`"));
            }
            Ok(StoreUrl::S3 { bucket, prefix })
        }
        other => Err(format!(
            "`{other}:` stores are not supported: use s3://BUCKET/PREFIX or file:///ABSOLUTE/PATH"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_parse_and_print() {
        for (text, secs, back) in [
            ("6h", 21_600, "6h"),
            ("30m", 1800, "30m"),
            ("1d", 86_400, "1d"),
            ("1h30m", 5400, "1h30m"),
            ("90s", 90, "1m30s"),
        ] {
            let e: Every = text.parse().expect(text);
            assert_eq!(e.0.as_secs(), secs);
            assert_eq!(e.to_string(), back);
        }
        for bad in ["", "6", "h", "6x", "-1h", "0h"] {
            assert!(bad.parse::<Every>().is_err(), "{bad}");
        }
        let p = SnapshotPolicy {
            every: "1m".parse().expect("1m"),
            keep: 0,
            store: "ftp://x".into(),
        };
        let fields: Vec<_> = p.problems().into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, ["every", "keep", "store"]);
    }

    #[test]
    fn store_urls_name_what_is_wrong() {
        assert_eq!(
            parse_store_url("s3://backups/etcd/prod").expect("s3"),
            StoreUrl::S3 {
                bucket: "backups".into(),
                prefix: "etcd/prod".into()
            }
        );
        assert_eq!(
            parse_store_url("s3://backups").expect("s3"),
            StoreUrl::S3 {
                bucket: "backups".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            parse_store_url("file:///var/lib/plinth/snapshots").expect("dir"),
            StoreUrl::Dir("/var/lib/plinth/snapshots".into())
        );
        for (bad, says) in [
            ("s3://key:secret@backups/x", "credentials"),
            ("s3:///x", "no bucket"),
            ("ftp://h/x", "not supported"),
            ("file://host/x", "no host"),
            ("not a url", "not a URL"),
            ("s3://b/x?region=eu", "query"),
        ] {
            let e = parse_store_url(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
