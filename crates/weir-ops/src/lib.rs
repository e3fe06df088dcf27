//! weir's operations, apart from the HTTP side that serves them: what the
//! alert loop observed (`watch`), a pipeline version's status as one value
//! (`report`), the delivery of notifications to webhooks (`webhooks`), and
//! the difference between two versions' rows (`diff`). `weir-server` keeps
//! the listener, `App`, the routes and their handlers, and runs these.
//!
//! The alert loop, checks, versions, advice and the drill runner are still
//! in `weir-server`: they read the server's `App`.

pub mod diff;
pub mod report;
pub mod watch;
pub mod webhooks;
