//! TLS to PostgreSQL, with libpq's settings in `[postgres] url`:
//! `sslmode` (`disable`, `allow`, `prefer` (the default), `require`,
//! `verify-ca`, `verify-full`), `sslrootcert` (a PEM file of trusted CAs),
//! and `sslcert` with `sslkey` (a client certificate), in the `key=value`
//! form or as the query of a `postgresql://` URL. They mean what they mean
//! to libpq: `prefer` and `require` encrypt without checking the server's
//! certificate (`require` with `sslrootcert` checks the chain, as libpq
//! does); `verify-ca` checks the chain; `verify-full` the chain and the
//! host name. Passwords (SCRAM-SHA-256 or MD5) are the driver's, from
//! `password` in the URL.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use postgres::config::SslMode;
use postgres::{Client, NoTls};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, Error as TlsError, RootCertStore, SignatureScheme};

/// libpq's TLS settings, taken out of a connection string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: Option<String>,
    pub root_cert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

const TLS_KEYS: &[&str] = &["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Why a connection to Postgres was not made: the URL, its TLS files, the
/// network, the handshake or the server, in a sentence.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(pub String);

/// Connects to `url`, with TLS as its `sslmode` says. The error never
/// holds the password.
pub fn connect(url: &str) -> Result<Client, ConnectError> {
    open(url).map_err(|e| ConnectError(without_password(url, &e)))
}

/// `url` with its password (`password=...`, or `user:...@` in a URL) as `***`:
/// what a log line or an error may show.
pub fn redacted(url: &str) -> String {
    without_password(url, url)
}

/// `text` with every spelling of `url`'s password replaced by `***`.
fn without_password(url: &str, text: &str) -> String {
    let mut secrets: Vec<String> = Vec::new();
    if let Ok(config) = postgres::Config::from_str(url) {
        if let Some(p) = config.get_password() {
            secrets.push(String::from_utf8_lossy(p).into_owned());
        }
    }
    // `password=VALUE` (quoted or not) and `scheme://user:VALUE@`, as written.
    for (at, _) in url.match_indices("password=") {
        let rest = &url[at + "password=".len()..];
        let end = match rest.strip_prefix('\'') {
            Some(quoted) => quoted.find('\'').map_or(rest.len(), |e| e + 2),
            None => rest.find(|c: char| c.is_whitespace() || c == '&').unwrap_or(rest.len()),
        };
        secrets.push(rest[..end].to_owned());
    }
    if let Some((_, after)) = url.split_once("://") {
        let authority = after.split(['/', '?']).next().unwrap_or_default();
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if let Some((_, password)) = userinfo.split_once(':') {
                secrets.push(password.to_owned());
            }
        }
    }
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_owned();
    for s in secrets {
        out = out.replace(&s, "***");
    }
    out
}

fn open(url: &str) -> Result<Client, String> {
    let (rest, tls) = split(url)?;
    let mut config = postgres::Config::from_str(&rest).map_err(|e| format!("the Postgres URL is not valid: {e}"))?;
    let mode = tls.mode.as_deref().unwrap_or("prefer");
    let verify = match mode {
        "disable" => return config.ssl_mode(SslMode::Disable).connect(NoTls).map_err(|e| e.to_string()),
        "allow" | "prefer" => {
            config.ssl_mode(SslMode::Prefer);
            Verify::Nothing
        }
        "require" => {
            config.ssl_mode(SslMode::Require);
            if tls.root_cert.is_some() {
                Verify::Chain
            } else {
                Verify::Nothing
            }
        }
        "verify-ca" => {
            config.ssl_mode(SslMode::Require);
            Verify::Chain
        }
        "verify-full" => {
            config.ssl_mode(SslMode::Require);
            Verify::Full
        }
        other => {
            return Err(format!(
                "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full; fix [postgres] url in weir.toml"
            ))
        }
    };
    let client_config = client_config(&tls, verify)?;
    config.connect(tokio_postgres_rustls::MakeRustlsConnect::new(client_config)).map_err(|e| {
        match std::error::Error::source(&e) {
            Some(why) => format!("{e}: {why}"),
            None => e.to_string(),
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verify {
    Nothing,
    Chain,
    Full,
}

fn client_config(tls: &TlsSettings, verify: Verify) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let verifier: Arc<dyn ServerCertVerifier> = match verify {
        Verify::Nothing => Arc::new(Lenient { chain: None, provider }),
        Verify::Chain | Verify::Full => {
            let Some(path) = &tls.root_cert else {
                return Err(
                    "sslmode verify-ca and verify-full need sslrootcert=FILE (PEM, the CAs to trust) in [postgres] url"
                        .into(),
                );
            };
            let mut roots = RootCertStore::empty();
            let certs: Vec<CertificateDer<'static>> =
                CertificateDer::pem_file_iter(Path::new(path)).and_then(|certs| certs.collect()).map_err(|e| {
                    format!("cannot read sslrootcert {path}: {e}; it must be a PEM file of CA certificates")
                })?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!("sslrootcert {path} holds no usable certificate; it must be PEM"));
            }
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                .build()
                .map_err(|e| format!("sslrootcert {path}: {e}"))?;
            if verify == Verify::Full {
                webpki
            } else {
                Arc::new(Lenient { chain: Some(webpki), provider })
            }
        }
    };
    let builder = builder.dangerous().with_custom_certificate_verifier(verifier);
    match (&tls.cert, &tls.key) {
        (None, None) => Ok(builder.with_no_client_auth()),
        (Some(cert), Some(key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(Path::new(cert))
                .and_then(|certs| certs.collect())
                .map_err(|e| format!("cannot read sslcert {cert}: {e}; it must be PEM"))?;
            let key = PrivateKeyDer::from_pem_file(Path::new(key))
                .map_err(|e| format!("cannot read sslkey {key}: {e}; it must be a PEM private key"))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("sslcert and sslkey do not go together: {e}"))
        }
        _ => Err("sslcert and sslkey go together: give both in [postgres] url, or neither".into()),
    }
}

/// The checks libpq skips: with no `chain`, the server's certificate is not
/// checked at all (`prefer`, `require`); with one, the chain is and the host
/// name is not (`verify-ca`). Handshake signatures are always checked.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, TlsError> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(TlsError::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, TlsError> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// Takes libpq's TLS settings out of a connection string (`key=value`
/// pairs, or a `postgresql://` URL's query); the rest is for the driver.
pub fn split(url: &str) -> Result<(String, TlsSettings), String> {
    let mut tls = TlsSettings::default();
    let mut take = |key: &str, value: String| match key {
        "sslmode" => tls.mode = Some(value),
        "sslrootcert" => tls.root_cert = Some(value),
        "sslcert" => tls.cert = Some(value),
        _ => tls.key = Some(value),
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let Some((base, query)) = url.split_once('?') else { return Ok((url.to_owned(), tls)) };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if TLS_KEYS.contains(&key) {
                take(key, percent_decode(value)?);
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() { base.to_owned() } else { format!("{base}?{}", kept.join("&")) };
        return Ok((rest, tls));
    }
    let mut kept = Vec::new();
    let mut chars = url.char_indices().peekable();
    while let Some(&(start, c)) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
            continue;
        }
        // One `key = value` pair; the value may be quoted with '...' and \ escapes.
        let mut key = String::new();
        while let Some(&(_, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|&(_, c)| c.is_whitespace()) {
            chars.next();
        }
        if chars.next().map(|(_, c)| c) != Some('=') {
            return Err(format!("the Postgres URL is not valid: `{key}` has no `=`"));
        }
        while chars.peek().is_some_and(|&(_, c)| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek().map(|&(_, c)| c) == Some('\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some((_, '\\')) => value.extend(chars.next().map(|(_, c)| c)),
                    Some((_, '\'')) => break,
                    Some((_, c)) => value.push(c),
                    None => {
                        return Err(format!("the Postgres URL is not valid: the value of `{key}` has no closing quote"))
                    }
                }
            }
        } else {
            while let Some(&(_, c)) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        let end = chars.peek().map_or(url.len(), |&(i, _)| i);
        if TLS_KEYS.contains(&key.as_str()) {
            take(&key, value);
        } else {
            kept.push(&url[start..end]);
        }
    }
    Ok((kept.join(" "), tls))
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(b) = hex else { return Err(format!("the Postgres URL is not valid: bad %-escape in `{text}`")) };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the Postgres URL is not valid: `{text}` is not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_never_shown() {
        for (url, shown) in [
            ("host=db user=weir password=s3cret dbname=test", "host=db user=weir password=*** dbname=test"),
            ("host=db password='two words' dbname=test", "host=db password=*** dbname=test"),
            ("postgresql://weir:s3cret@db:5432/test", "postgresql://weir:***@db:5432/test"),
            (
                "postgres://weir@db/test?password=s3cret&sslmode=disable",
                "postgres://weir@db/test?password=***&sslmode=disable",
            ),
            ("host=db user=weir dbname=test", "host=db user=weir dbname=test"),
        ] {
            assert_eq!(redacted(url), shown);
        }
        // Nor in a refusal: nothing listens on port 9.
        let e = connect("host=127.0.0.1 port=9 user=weir password=s3cret dbname=test connect_timeout=2").err().unwrap();
        assert!(!e.0.contains("s3cret"), "{}", e.0);
        let e = connect("host=127.0.0.1 port=notaport password=s3cret").err().unwrap();
        assert!(!e.0.contains("s3cret"), "{}", e.0);
    }

    #[test]
    fn tls_settings_come_out_of_both_forms() {
        let (rest, tls) =
            split("host=db user=weir sslmode=verify-full sslrootcert='/etc/my ca.pem' dbname=test").unwrap();
        assert_eq!(rest, "host=db user=weir dbname=test");
        assert_eq!(tls.mode.as_deref(), Some("verify-full"));
        assert_eq!(tls.root_cert.as_deref(), Some("/etc/my ca.pem"));
        let (rest, tls) =
            split("postgresql://weir@db:5432/test?sslmode=require&application_name=w&sslcert=%2Fc.pem&sslkey=k.pem")
                .unwrap();
        assert_eq!(rest, "postgresql://weir@db:5432/test?application_name=w");
        assert_eq!((tls.cert.as_deref(), tls.key.as_deref()), (Some("/c.pem"), Some("k.pem")));
        assert_eq!(split("host=db").unwrap(), ("host=db".to_owned(), TlsSettings::default()));
        assert!(split("host").unwrap_err().contains("has no `=`"));
        assert!(split("password='x").unwrap_err().contains("no closing quote"));
        assert!(split("postgresql://h/d?sslrootcert=%zz").unwrap_err().contains("%-escape"));
    }
}
