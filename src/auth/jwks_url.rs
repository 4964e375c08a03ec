//! `jwt.jwks_url`: where the keys are fetched from, checked when the
//! config is read. `https` only, or plain `http` to a loopback host (see
//! `fetch.rs`).

use std::net::IpAddr;

use http::Uri;

/// A validated `jwks_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwksUrl {
    raw: String,
    pub(super) tls: bool,
    pub(super) host: String,
    pub(super) port: u16,
    /// `host` or `host:port`, as the Host header.
    pub(super) authority: String,
    pub(super) path: String,
}

impl JwksUrl {
    /// Parse `https://host[:port]/path`, or `http://` to a loopback host.
    pub fn parse(raw: &str) -> Result<JwksUrl, String> {
        let uri: Uri = raw.parse().map_err(|e| format!("not a URL: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("must start with https:// (or http:// to a loopback host)".into()),
        };
        let authority = uri.authority().ok_or("has no host")?;
        if authority.as_str().contains('@') {
            return Err("must not hold credentials".into());
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if !tls && !is_loopback(host) {
            return Err("plain http:// is allowed only to a loopback host (127.0.0.0/8, ::1, localhost): use https://".into());
        }
        Ok(JwksUrl {
            raw: raw.to_string(),
            tls,
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
            authority: authority.as_str().to_string(),
            path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_https_or_loopback_http() {
        let u = JwksUrl::parse("https://auth.example.org/application/o/poimen/jwks/").unwrap();
        assert!(u.tls);
        assert_eq!((u.host.as_str(), u.port), ("auth.example.org", 443));
        assert_eq!(u.path, "/application/o/poimen/jwks/");
        let u = JwksUrl::parse("http://127.0.0.1:9000/jwks?x=1").unwrap();
        assert_eq!((u.tls, u.port, u.path.as_str()), (false, 9000, "/jwks?x=1"));
        assert_eq!(u.authority, "127.0.0.1:9000");
        let u = JwksUrl::parse("http://[::1]/k").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 80));
        assert!(JwksUrl::parse("http://localhost:1/").is_ok());
        for bad in [
            "http://auth.example.org/jwks",
            "http://10.0.0.1/jwks",
            "ftp://auth.example.org/jwks",
            "auth.example.org/jwks",
            "https://user:pw@auth.example.org/jwks",
            "",
        ] {
            assert!(JwksUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
