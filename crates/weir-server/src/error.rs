//! The server's one error type (STYLE.md: a typed error per library
//! crate, `anyhow` only in the binary): why `serve` could not start or
//! stopped. A request's refusal is an `app::ApiError`, an answer, not this.

/// Why the server could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] weir_runtime::Error),
    #[error(transparent)]
    Store(#[from] weir_store::StoreError),
    #[error(transparent)]
    Log(#[from] weir_log::LogError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("{}", .0.0)]
    Connect(#[from] weir_store::pg_tls::ConnectError),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("PEM: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("a task of the server failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// What cannot be done, and what to do, in full.
    #[error("{0}")]
    Refused(String),
    /// `what` was being done when `source` failed.
    #[error("{what}: {source}")]
    Context {
        what: String,
        #[source]
        source: Box<Error>,
    },
}

/// The server's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What was being done, added to an error as it goes up.
pub trait Context<T> {
    fn context(self, what: impl Into<String>) -> Result<T>;
    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Into<String>) -> Result<T> {
        self.map_err(|e| Error::Context { what: what.into(), source: Box::new(e.into()) })
    }

    fn with_context<S: Into<String>>(self, what: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| Error::Context { what: what().into(), source: Box::new(e.into()) })
    }
}

/// Returns an [`Error::Refused`] made as `format!` makes a string.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::Refused(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// An [`Error::Refused`] made as `format!` makes a string.
macro_rules! refused {
    ($($arg:tt)*) => {
        $crate::error::Error::Refused(format!($($arg)*))
    };
}
pub(crate) use refused;
