//! A URL that may carry credentials (`http://user:password@host/…?token=…`), as a spec
//! or pruefstand.toml gives it: kept whole for connecting, shown and serialized with its
//! userinfo and query values as `***`. It is redacted where it enters, so no writer
//! after it (files of a run, reports, logs, `check`) can forget to.
//!
//! Not for URLs whose path is the secret (Slack's and Discord's webhook URLs): those
//! are [`super::Secret`]s, never shown at all.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An `http://` or `https://` URL with a host. `Display`, `Debug` and `Serialize` give
/// [`SecretUrl::redacted`]; [`SecretUrl::expose`] the URL itself, for connecting.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Refuses anything but an http(s) URL with a host: `file:///etc/passwd` or a bare
    /// `localhost:8000` would only turn every case into an error later. A URL whose
    /// authority could be read two ways is refused too, its credentials unshown:
    /// `http://user:12/SECRET@host` (an HTTP client connects to `user:12`) or
    /// `http://u:SEC#RET@host` — a `/`, `?` or `#` in a password must be
    /// percent-encoded.
    pub fn parse(text: &str) -> Result<SecretUrl, String> {
        let Some((scheme, rest)) = text.split_once("://").filter(|(scheme, _)| ["http", "https"].contains(scheme))
        else {
            return Err(format!("{} is no http:// or https:// URL", redact(text)));
        };
        let authority = authority(rest);
        let host = authority.rsplit('@').next().unwrap_or_default();
        if host.is_empty() || host.starts_with(':') {
            return Err(format!("{} has no host", redact(text)));
        }
        let encode = "a '/', '?', '#' or '@' in a user name or password must be percent-encoded";
        if rest[authority.len()..].contains('@') {
            return Err(format!("{scheme}://*** is ambiguous: an '@' follows the end of its host ({encode})"));
        }
        if !host_and_port(host) {
            return Err(format!("{scheme}://*** has no host[:port] that reads one way ({encode})"));
        }
        Ok(SecretUrl(text.to_string()))
    }

    /// A URL taken as it is: one pruefstand made for a server of its own, or one a
    /// spec's check has passed already. Shown redacted all the same.
    pub fn own(url: String) -> SecretUrl {
        SecretUrl(url)
    }

    /// The URL itself, for the places that connect to it (and the agents' environment).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with userinfo and query values as `***`.
    pub fn redacted(&self) -> String {
        redact(&self.0)
    }

    /// Whether the URL carries anything [`SecretUrl::redacted`] hides.
    pub fn has_secrets(&self) -> bool {
        self.redacted() != self.0
    }

    /// An identity of the whole URL that does not reveal it: HMAC-SHA256 under `key`
    /// (the bench's, [`crate::root::Root::identity_key`]). Provenance tells two
    /// credentials apart by it; a plain sha256 would let anyone holding a run directory
    /// test password guesses offline.
    pub fn keyed_identity(&self, key: &[u8]) -> String {
        crate::util::hmac_sha256_hex(key, self.0.as_bytes())
    }

    /// The same URL with `path` appended (`…/v1` + `/models`), before its query.
    pub fn join(&self, path: &str) -> SecretUrl {
        let (base, query) = match self.0.find(['?', '#']) {
            Some(at) => self.0.split_at(at),
            None => (self.0.as_str(), ""),
        };
        SecretUrl(format!("{}/{}{query}", base.trim_end_matches('/'), path.trim_start_matches('/')))
    }
}

/// What follows `scheme://` up to the path, query or fragment.
fn authority(rest: &str) -> &str {
    rest.split(['/', '?', '#']).next().unwrap_or_default()
}

/// `host`, `host:port` or `[v6]:port`, the port digits: what is left of an authority
/// whose password held a `#` or `/` (`u:SEC` of `http://u:SEC#RET@host`) is neither.
fn host_and_port(text: &str) -> bool {
    let (host, port) = match text.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((address, after)) if !address.is_empty() => {
                (None, after.strip_prefix(':').or(after.is_empty().then_some("")))
            }
            _ => return false,
        },
        None => match text.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(text), Some("")),
        },
    };
    let host_ok = host
        .is_none_or(|host| !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-._~%".contains(c)));
    let port_ok = port.is_some_and(|port| port.chars().all(|c| c.is_ascii_digit()));
    host_ok && port_ok
}

/// The one place that decides how a URL, or text meant as one, is shown:
/// `scheme://***@host/path?key=***#***`. Userinfo, every query value and the fragment
/// are hidden; scheme, host, port, path and query keys kept, so an operator still sees
/// which server it is. Everything before the last `@` counts as userinfo, wherever it
/// stands — in a malformed `http:/u:pw@host` or `https//u:pw@host`, or an ambiguous
/// `http://u:12/pw@host` — so no form of a URL shows its password. Text without `@`,
/// query or fragment comes back as it is (`file:///etc/passwd`, `localhost:9`).
pub fn redact(text: &str) -> String {
    let (scheme, rest) = match text.find("://") {
        Some(at) => text.split_at(at + 3),
        None => ("", text),
    };
    let (host, after) = match rest.rsplit_once('@') {
        Some((_, tail)) => {
            let host = authority(tail);
            (format!("***@{host}"), &tail[host.len()..])
        }
        None if scheme.is_empty() => (String::new(), rest),
        None => {
            let host = authority(rest);
            (host.to_string(), &rest[host.len()..])
        }
    };
    let (before_fragment, fragment) = match after.split_once('#') {
        Some((before, _)) => (before, "#***"),
        None => (after, ""),
    };
    let (path, query) = match before_fragment.split_once('?') {
        Some((path, query)) => {
            let hidden: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) => format!("{key}=***"),
                    None if pair.is_empty() => String::new(),
                    None => "***".to_string(),
                })
                .collect();
            (path, format!("?{}", hidden.join("&")))
        }
        None => (before_fragment, String::new()),
    };
    format!("{scheme}{host}{path}{query}{fragment}")
}

impl std::fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        SecretUrl::parse(&text).map_err(|err| serde::de::Error::custom(format!("url: {err}")))
    }
}

/// An optional URL read as it stands, for a field inside an internally tagged table (the
/// guardrail's): serde buffers such a table and loses its lines, so the URL is checked
/// afterwards with [`SecretUrl::parse`] by code that can name its line.
pub(crate) fn deserialize_unchecked<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SecretUrl>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(SecretUrl))
}

/// A required URL read as it stands, for the same reason as [`deserialize_unchecked`].
pub(crate) fn deserialize_unchecked_one<'de, D: Deserializer<'de>>(d: D) -> Result<SecretUrl, D::Error> {
    Ok(SecretUrl(String::deserialize(d)?))
}

/// A whole-secret URL ([`super::Secret`], a webhook's) refused unless http(s), like a
/// [`SecretUrl`], without showing any of it.
pub(crate) fn http_secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<super::Secret>, D::Error> {
    let text = String::deserialize(d)?;
    match SecretUrl::parse(&text) {
        Ok(_) => Ok(Some(super::Secret(text))),
        Err(_) => Err(serde::de::Error::custom("url: only http:// and https:// URLs with a host are taken")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_query_values_and_fragment_are_hidden_and_the_server_still_shows() {
        for (url, shown) in [
            ("http://alice:S3CRETPW@127.0.0.1:8000/v1?token=T0KEN", "http://***@127.0.0.1:8000/v1?token=***"),
            ("https://key@host/v1?a=1&b&c=2#frag", "https://***@host/v1?a=***&***&c=***#***"),
            ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
            ("http://host?x=1", "http://host?x=***"),
            ("http://a@b@host/p", "http://***@host/p"),
            ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
        ] {
            let secret = SecretUrl::parse(url).unwrap();
            assert_eq!((secret.to_string(), format!("{secret:?}")), (shown.to_string(), format!("{shown:?}")));
            assert_eq!(serde_json::to_value(&secret).unwrap(), serde_json::json!(shown));
            assert_eq!(secret.expose(), url);
            assert_eq!(secret.has_secrets(), url != shown);
        }
    }

    #[test]
    fn only_http_urls_with_a_host_are_taken_and_the_refusal_hides_credentials() {
        for bad in
            ["file:///etc/passwd", "localhost:8000/v1", "ftp://u:pw@host/", "http://", "http:///v1", "http://u:pw@/"]
        {
            let err = SecretUrl::parse(bad).unwrap_err();
            assert!(!err.contains("pw@"), "{bad}: {err}");
            assert!(err.contains("no http://") || err.contains("no host"), "{bad}: {err}");
        }
        assert!(SecretUrl::parse("https://example.org").is_ok());
    }

    #[test]
    fn malformed_and_ambiguous_urls_never_show_their_password() {
        for (bad, why) in [
            ("http:/u:SECRET@127.0.0.1:9/v1", "***@127.0.0.1:9/v1 is no http"),
            ("http:\\\\u:SECRET@127.0.0.1:9/v1", "***@127.0.0.1:9/v1 is no http"),
            ("https//u:SECRET@127.0.0.1:9/v1", "***@127.0.0.1:9/v1 is no http"),
            ("http//u:SECRET@127.0.0.1:9/v1", "***@127.0.0.1:9/v1 is no http"),
            ("http://user:12/SECRET@127.0.0.1:9/v1", "http://*** is ambiguous"),
            ("http://u:SEC#RET@127.0.0.1:9/v1", "http://*** is ambiguous"),
            ("http://u:SEC?RET@127.0.0.1:9/v1", "http://*** is ambiguous"),
            ("http://u:SECRET/v1", "http://*** has no host[:port]"),
            ("https://u:SECRET", "https://*** has no host[:port]"),
        ] {
            let err = SecretUrl::parse(bad).unwrap_err();
            assert!(err.starts_with(why) && !err.contains("SEC"), "{bad}: {err}");
            // Without an `@` nothing marks a password (`u:SECRET` reads as host and port).
            assert!(!bad.contains('@') || !redact(bad).contains("SEC"), "{bad}: {}", redact(bad));
        }
    }

    #[test]
    fn join_appends_before_the_query_and_the_identity_tells_credentials_apart() {
        let url = SecretUrl::parse("http://u:p@h/v1/?k=v").unwrap();
        assert_eq!(url.join("/models").expose(), "http://u:p@h/v1/models?k=v");
        let other = SecretUrl::parse("http://u:q@h/v1/?k=v").unwrap();
        assert_eq!(url.redacted(), other.redacted());
        assert_ne!(url.keyed_identity(b"k"), other.keyed_identity(b"k"));
        assert_eq!(url.keyed_identity(b"k"), url.clone().keyed_identity(b"k"));
        assert_ne!(url.keyed_identity(b"k"), url.keyed_identity(b"other bench"));
    }
}
