//! Requests weir makes to addresses a contract or weir.toml names (`http`
//! destinations, alert webhooks): never redirected, checked against the
//! system's roots (or the ones given), and sent only to an address that
//! was checked.
//!
//! The host is resolved once per connection by [`Guarded`], which refuses
//! it when any of its addresses is loopback, private, link-local, a cloud
//! metadata service or unspecified (loopback and private ones are allowed
//! when the [`Allow`] says so: a connection's `allow_private = true`,
//! weir.toml's `allow_private_webhooks`; link-local and metadata ones only
//! by `allow_link_local_webhooks`), and hands the connector exactly the
//! addresses it checked: a name that resolves elsewhere a moment later (DNS
//! rebinding) is not resolved again.

use std::net::IpAddr;
use std::time::Duration;

use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

/// A refusal's reason as words: "a loopback address", "a cloud metadata service".
fn described(why: &str) -> String {
    if why.starts_with("a ") {
        why.to_owned()
    } else {
        format!("a {why} address")
    }
}

/// Which of the addresses refused by default may be called.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allow {
    /// Loopback and private ranges (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7).
    pub private: bool,
    /// Link-local addresses and cloud metadata services.
    pub link_local: bool,
}

impl Allow {
    pub fn private(private: bool) -> Allow {
        Allow { private, link_local: false }
    }
}

/// Why `ip` may not be called under `allow`, or `None` when it may.
pub fn refused_for(ip: IpAddr, allow: Allow) -> Option<&'static str> {
    let why = refused_address(ip, allow.private)?;
    (!(allow.link_local && matches!(why, "a cloud metadata service" | "link-local"))).then_some(why)
}

/// Why `ip` may not be called, or `None` when it may.
pub fn refused_address(ip: IpAddr, allow_private: bool) -> Option<&'static str> {
    let metadata = |ip: IpAddr| match ip {
        IpAddr::V4(v4) => v4.octets() == [169, 254, 169, 254] || v4.octets() == [100, 100, 100, 200],
        IpAddr::V6(v6) => v6.segments() == [0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254],
    };
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    if metadata(ip) {
        return Some("a cloud metadata service");
    }
    let (link_local, unspecified, loopback, private) = match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            let shared = o[0] == 100 && (64..128).contains(&o[1]);
            (v4.is_link_local(), v4.is_unspecified() || o[0] == 0, v4.is_loopback(), v4.is_private() || shared)
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            ((first & 0xffc0) == 0xfe80, v6.is_unspecified(), v6.is_loopback(), (first & 0xfe00) == 0xfc00)
        }
    };
    if link_local {
        Some("link-local")
    } else if unspecified {
        Some("unspecified")
    } else if !allow_private && loopback {
        Some("loopback")
    } else if !allow_private && private {
        Some("private")
    } else {
        None
    }
}

/// Resolves a URL's host once and refuses it if any address is refused
/// (see [`refused_address`]).
#[derive(Debug)]
pub struct Guarded {
    allow: Allow,
    /// Where the hint for a loopback or private address points.
    hint: &'static str,
}

impl Resolver for Guarded {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let addrs = DefaultResolver::default().resolve(uri, config, timeout)?;
        let host = uri.host().unwrap_or_default();
        if let Some((ip, why)) = addrs.iter().find_map(|a| Some((a.ip(), refused_for(a.ip(), self.allow)?))) {
            let hint = if matches!(why, "loopback" | "private") { self.hint } else { "" };
            return Err(ureq::Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{host} resolves to {ip}, {}, which weir does not call{hint}", described(why)),
            )));
        }
        Ok(addrs)
    }
}

/// The hint of a destination's connection that names a loopback or private address.
const CONNECTION_HINT: &str =
    "; allow it with allow_private = true in the connection's [connections.NAME] of weir.toml";

/// The hint of a webhook that names a loopback or private address.
pub const WEBHOOK_HINT: &str = "; allow it with allow_private_webhooks = true in weir.toml";

/// Why `url` cannot be a destination's, checked before a server starts:
/// not http(s), or naming a refused address now.
pub fn check_url(url: &str, allow_private: bool) -> Result<(), String> {
    check_url_for(url, Allow::private(allow_private), CONNECTION_HINT, true)
}

/// Why `url` cannot be called under `allow`: not http(s), or naming a
/// refused address now. A name that does not resolve now is refused only
/// when `must_resolve` (each connection checks it again anyway).
pub fn check_url_for(url: &str, allow: Allow, hint: &str, must_resolve: bool) -> Result<(), String> {
    let uri: ureq::http::Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(format!("{url:?} is not an http:// or https:// URL"));
    }
    let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    let lower = host.to_ascii_lowercase();
    if matches!(lower.trim_end_matches('.'), "metadata.google.internal" | "metadata" | "metadata.azure.internal")
        && !allow.link_local
    {
        return Err(format!("{host} is a cloud metadata service, which weir does not call"));
    }
    let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => match std::net::ToSocketAddrs::to_socket_addrs(&(host, port)) {
            Ok(addrs) => addrs.map(|a| a.ip()).collect(),
            Err(e) if must_resolve => return Err(format!("{host} cannot be resolved: {e}")),
            Err(_) => Vec::new(),
        },
    };
    match addrs.iter().find_map(|ip| Some((ip, refused_for(*ip, allow)?))) {
        Some((ip, why)) => Err(format!(
            "{host} is {ip}, {}, which weir does not call{}",
            described(why),
            if matches!(why, "loopback" | "private") { hint } else { "" }
        )),
        None => Ok(()),
    }
}

/// The roots `https` is checked against: the system's (Debian's
/// `/etc/ssl/certs/ca-certificates.crt`, or `SSL_CERT_FILE`), else the
/// Mozilla roots built in.
fn system_roots() -> ureq::tls::RootCerts {
    let file = std::env::var("SSL_CERT_FILE").unwrap_or_else(|_| "/etc/ssl/certs/ca-certificates.crt".into());
    let Ok(pem) = std::fs::read(&file) else { return ureq::tls::RootCerts::WebPki };
    let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    if certs.is_empty() {
        ureq::tls::RootCerts::WebPki
    } else {
        ureq::tls::RootCerts::from(certs)
    }
}

/// An agent for one destination: no redirects, statuses returned as they
/// are, `timeout` for a whole request, the guarded resolver.
pub fn agent(allow_private: bool, timeout: Duration) -> ureq::Agent {
    guarded_agent(Allow::private(allow_private), CONNECTION_HINT, timeout, None)
}

/// An agent as [`agent`]'s, under `allow`, its refusals hinting `hint`,
/// `https` checked against `roots` when given (else the system's).
pub fn guarded_agent(
    allow: Allow,
    hint: &'static str,
    timeout: Duration,
    roots: Option<ureq::tls::RootCerts>,
) -> ureq::Agent {
    let tls = ureq::tls::TlsConfig::builder().root_certs(roots.unwrap_or_else(system_roots)).build();
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .timeout_global(Some(timeout))
        .tls_config(tls)
        .build();
    ureq::Agent::with_parts(config, DefaultConnector::default(), Guarded { allow, hint })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_refused_unless_allowed() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (addr, strict, loose) in [
            ("127.0.0.1", Some("loopback"), None),
            ("::1", Some("loopback"), None),
            ("10.1.2.3", Some("private"), None),
            ("172.16.0.1", Some("private"), None),
            ("192.168.1.1", Some("private"), None),
            ("100.64.0.1", Some("private"), None),
            ("fd12::1", Some("private"), None),
            ("169.254.169.254", Some("a cloud metadata service"), Some("a cloud metadata service")),
            ("100.100.100.200", Some("a cloud metadata service"), Some("a cloud metadata service")),
            ("::ffff:169.254.169.254", Some("a cloud metadata service"), Some("a cloud metadata service")),
            ("fe80::1", Some("link-local"), Some("link-local")),
            ("0.0.0.0", Some("unspecified"), Some("unspecified")),
            ("93.184.216.34", None, None),
            ("2606:2800:220:1::1", None, None),
        ] {
            assert_eq!(refused_address(ip(addr), false), strict, "{addr}");
            assert_eq!(refused_address(ip(addr), true), loose, "{addr} allowed private");
        }
    }

    #[test]
    fn a_url_is_checked_before_the_start() {
        assert!(check_url("http://127.0.0.1:9/x", false).unwrap_err().contains("loopback"));
        assert!(check_url("http://127.0.0.1:9/x", true).is_ok());
        assert!(check_url("ftp://example.com/", true).unwrap_err().contains("not an http"));
        assert!(check_url("http://169.254.169.254/latest", true).unwrap_err().contains("metadata"));
    }
}
