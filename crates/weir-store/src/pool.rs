//! Connection pools for the HTTP side, from `r2d2`: readers of `weir.db`
//! and clients of the Postgres destination. Each holds at most weir.toml's
//! `pool_connections`; a request that finds them all busy waits up to
//! [`WAIT`], then is answered 503. A connection idle for [`IDLE`] is closed,
//! so a burst does not keep its connections open.
//!
//! In more detail: the HTTP side's connection pools (`r2d2`): readers of
//! `weir.db` and clients of the Postgres destination, each at most
//! `pool_connections` (weir.toml, 16), opened when needed, closed after a
//! minute idle; a request that waits 10 s for one gets 503. Every call on them
//! is stopped after `store_statement_timeout` (60 s): SQLite's progress handler
//! checks a deadline set for the call, and each Postgres connection is opened
//! with `SET statement_timeout`; either is `StoreError::TimedOut` (503).

use std::path::PathBuf;
use std::time::Duration;

/// How long a request waits for a pooled connection.
pub const WAIT: Duration = Duration::from_secs(10);
/// A pooled connection unused this long is closed.
pub const IDLE: Duration = Duration::from_secs(60);

/// Connections to the SQLite database (`store::open`).
pub struct Sqlite {
    pub path: PathBuf,
}

impl r2d2::ManageConnection for Sqlite {
    type Connection = rusqlite::Connection;
    type Error = rusqlite::Error;

    fn connect(&self) -> Result<rusqlite::Connection, rusqlite::Error> {
        crate::sqlite::open(&self.path)
    }

    fn is_valid(&self, conn: &mut rusqlite::Connection) -> Result<(), rusqlite::Error> {
        conn.execute_batch("")
    }

    fn has_broken(&self, _: &mut rusqlite::Connection) -> bool {
        false
    }
}

/// Clients of the Postgres destination (TLS as the url's libpq settings
/// say), each with a `statement_timeout` when one is given.
pub struct Postgres {
    pub url: String,
    pub statement_timeout: Option<Duration>,
}

impl r2d2::ManageConnection for Postgres {
    type Connection = postgres::Client;
    type Error = PostgresError;

    fn connect(&self) -> Result<postgres::Client, PostgresError> {
        let mut client = crate::pg::connect(&self.url).map_err(|e| PostgresError(e.to_string()))?;
        if let Some(timeout) = self.statement_timeout {
            let set = format!("SET statement_timeout = {}", timeout.as_millis());
            client.batch_execute(&set).map_err(|e| PostgresError(e.to_string()))?;
        }
        Ok(client)
    }

    fn is_valid(&self, client: &mut postgres::Client) -> Result<(), PostgresError> {
        client.simple_query("").map(|_| ()).map_err(|e| PostgresError(e.to_string()))
    }

    fn has_broken(&self, client: &mut postgres::Client) -> bool {
        client.is_closed()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PostgresError(String);

/// A pool of at most `size` connections, none opened until needed.
pub fn build<M: r2d2::ManageConnection>(manager: M, size: u32) -> r2d2::Pool<M> {
    r2d2::Pool::builder()
        .max_size(size.max(1))
        .min_idle(Some(0))
        .idle_timeout(Some(IDLE))
        .connection_timeout(WAIT)
        .test_on_check_out(false)
        .build_unchecked(manager)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_opens_no_more_than_its_size() {
        let dir = std::env::temp_dir().join(format!("weir-pool-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = build(Sqlite { path: dir.join("weir.db") }, 2);
        assert_eq!(pool.state().connections, 0, "nothing is opened before it is needed");
        let a = pool.get().unwrap();
        let b = pool.get().unwrap();
        assert!(pool.try_get().is_none(), "a third waits while two are in use");
        assert_eq!(pool.state().connections, 2);
        drop(a);
        let c = pool.try_get().expect("a returned connection is used again");
        assert_eq!(pool.state().connections, 2);
        drop((b, c));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
