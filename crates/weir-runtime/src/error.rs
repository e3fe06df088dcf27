//! The runtime's one error type (STYLE.md: a typed error per library
//! crate, `anyhow` only in the binary). A runner, a backfill, a drill or a
//! Kafka source fails with an [`Error`]: a part's own error (the store, the
//! log, Kafka, Postgres, the engine's plan, the file system), a refusal
//! said in full for the person who reads it (`Refused`), a part's error
//! with what was being done (`Context`), or a broken invariant
//! (`Internal`).

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] weir_store::StoreError),
    #[error(transparent)]
    Checkpoint(#[from] weir_store::CheckpointError),
    #[error(transparent)]
    Log(#[from] weir_log::LogError),
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("Postgres: {0}")]
    Postgres(#[from] postgres::Error),
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Plan(#[from] weir_engine::PlanError),
    #[error("a checkpoint cannot be restored: {0}")]
    Snapshot(#[from] weir_engine::SnapshotError),
    #[error("{}", .0.0)]
    Connect(#[from] weir_store::pg_tls::ConnectError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
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
    /// A broken invariant: a bug in weir.
    #[error("internal error (a bug in weir; please report it): {0}")]
    Internal(String),
}

/// The runtime's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A refusal said in full.
    pub fn refused(why: impl Into<String>) -> Error {
        Error::Refused(why.into())
    }
}

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

/// Returns a [`Error::Refused`] made as `format!` makes a string.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::Refused(format!($($arg)*)))
    };
}

/// A [`Error::Refused`] made as `format!` makes a string.
#[macro_export]
macro_rules! refused {
    ($($arg:tt)*) => {
        $crate::Error::Refused(format!($($arg)*))
    };
}
