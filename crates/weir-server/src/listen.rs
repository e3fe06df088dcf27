//! The server's listener: plain TCP, or TLS (rustls, `--tls-cert` and
//! `--tls-key`). TCP connections are accepted on a task of their own and
//! each TLS handshake runs on its own task with a deadline, so a client
//! that opens a connection and sends nothing holds up no one.
//!
//! [`serve`] runs each connection on its own task with HTTP/1.1, and gives
//! every request head a deadline (`header_timeout` in weir.toml): a client
//! that sends its head slowly, or keeps a connection open and idle, is
//! disconnected. A head over 32 KiB gets 431. Bodies have their own
//! deadline (`http::whole_body`).
//!
//! In more detail: the listener and `serve`, weir's own accept loop: plain TCP,
//! or TLS with rustls (`--tls-cert`/`--tls-key`, PEM); at most
//! `max_connections` open (a semaphore place taken before each accept and held
//! by the connection's task, so the next clients wait in the kernel's backlog);
//! connections are accepted on a task of their own and each TLS handshake runs
//! on its own task with a 10 s deadline; each connection is served by hyper's
//! HTTP/1.1 with `header_timeout` for every request head (slow heads and idle
//! kept-alive connections are closed) and a 32 KiB head limit (431); a write
//! that makes no progress for `write_timeout` (a client that stopped reading)
//! ends its connection (`Stalling`); on shutdown, accepting stops and each
//! connection finishes its request within `write_timeout`. Token checks use a
//! pool of `weir.db` connections of their own (`App::read_tokens`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Context;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// How long a client has to complete the TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// The largest request head (request line and headers): past it, 431.
const MAX_HEAD_BYTES: usize = 32 << 10;

/// A connection, over TLS or not.
pub trait Conn: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Conn for T {}

/// The client's address, for the audit log.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

/// An accepted connection, with its place among `max_connections`.
type Accepted = (Box<dyn Conn>, Peer, tokio::sync::OwnedSemaphorePermit);

pub struct WeirListener {
    accepted: mpsc::Receiver<Accepted>,
}

impl WeirListener {
    /// Starts accepting on `tcp`; with `tls`, only connections that finish
    /// a handshake reach the server. At most `max_connections` are open (a
    /// TLS handshake counts): the next one waits in the kernel's backlog
    /// until one closes.
    pub fn new(tcp: TcpListener, tls: Option<TlsAcceptor>, max_connections: usize) -> std::io::Result<WeirListener> {
        let (tx, accepted) = mpsc::channel(256);
        let places = Arc::new(tokio::sync::Semaphore::new(max_connections.max(1)));
        tokio::spawn(async move {
            loop {
                let Ok(place) = Arc::clone(&places).acquire_owned().await else { return };
                let (stream, addr) = match tcp.accept().await {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of file descriptors, or a connection reset before accept: try again.
                        eprintln!("weir: accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                match &tls {
                    None => {
                        if tx.send((Box::new(stream) as Box<dyn Conn>, Peer(addr), place)).await.is_err() {
                            return;
                        }
                    }
                    Some(acceptor) => {
                        let (acceptor, tx) = (acceptor.clone(), tx.clone());
                        tokio::spawn(async move {
                            // A failed or slow handshake (a plain-HTTP client, a scanner) just closes.
                            if let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                                let _ = tx.send((Box::new(tls) as Box<dyn Conn>, Peer(addr), place)).await;
                            }
                        });
                    }
                }
            }
        });
        Ok(WeirListener { accepted })
    }
}

impl WeirListener {
    async fn accept(&mut self) -> Accepted {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accepting task ended: nothing will come.
            None => std::future::pending().await,
        }
    }
}

/// A connection whose writes must make progress: a write that waits
/// longer than `limit` (a client that stopped reading) fails, which ends
/// the connection.
struct Stalling {
    io: Box<dyn Conn>,
    limit: Duration,
    waiting: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl Stalling {
    fn new(io: Box<dyn Conn>, limit: Duration) -> Stalling {
        Stalling { io, limit, waiting: None }
    }

    /// `Pending` from the connection: fails once it has lasted `limit`.
    fn stalled<T>(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<T>> {
        let limit = self.limit;
        let sleep = self.waiting.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match std::future::Future::poll(sleep.as_mut(), cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing for write_timeout",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl AsyncRead for Stalling {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stalling {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match std::pin::Pin::new(&mut self.io).poll_write(cx, data) {
            std::task::Poll::Pending => self.stalled(cx),
            done => {
                self.waiting = None;
                done
            }
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match std::pin::Pin::new(&mut self.io).poll_flush(cx) {
            std::task::Poll::Pending => self.stalled(cx),
            done => {
                self.waiting = None;
                done
            }
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves `router` on `listener` until `shutdown` completes; then stops
/// accepting, lets every connection finish the request it is in (for at
/// most `write_timeout`), and returns.
pub async fn serve(
    mut listener: WeirListener,
    router: Router,
    (header_timeout, write_timeout): (Duration, Duration),
    shutdown: impl std::future::Future<Output = ()>,
) {
    let (stop, stopping) = tokio::sync::watch::channel(false);
    // Each connection's task holds a receiver: when none is left, all are done.
    let (open, open_rx) = tokio::sync::watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (io, peer, place) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let service = router.clone().map_request(move |mut req: axum::http::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            req.map(Body::new)
        });
        let (mut stopping, held) = (stopping.clone(), open_rx.clone());
        tokio::spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new()).header_read_timeout(header_timeout).max_header_size(MAX_HEAD_BYTES);
            let io = Stalling::new(io, write_timeout);
            let conn = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stopping.changed() => {
                    conn.as_mut().graceful_shutdown();
                    // A client that stops reading cannot hold the shutdown up.
                    let _ = tokio::time::timeout(write_timeout, conn).await;
                }
            }
            drop((held, place));
        });
    }
    drop(listener);
    let _ = stop.send(true);
    drop(open_rx);
    open.closed().await;
}

/// A TLS acceptor from PEM files: the certificate chain (server first) and its private key.
pub fn tls_acceptor(cert: &Path, key: &Path) -> crate::error::Result<TlsAcceptor> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect())
        .with_context(|| format!("cannot read certificates from --tls-cert {}: it must be PEM", cert.display()))?;
    if certs.is_empty() {
        crate::error::bail!("--tls-cert {} holds no certificate (PEM \"BEGIN CERTIFICATE\")", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read a private key from --tls-key {}: it must be PEM", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("the certificate and the key of --tls-cert and --tls-key do not go together")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
