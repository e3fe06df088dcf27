//! weir contracts: one versioned TOML file per decision (SPEC.md section 2).
//!
//! This crate owns parsing and validation. A [`Contract`] that exists is one
//! that can run: every refusal happens here, before anything runs, and names
//! the file, the line, the key and what to do.
//!
//! In more detail: the TOML contract: parsing (toml_edit, for line numbers),
//! validation (including `[limits]`, `[privacy] personal`, refused on the key,
//! event time or an aggregated field, and `on_conflict = "correct"`, refused
//! with aggregates other than count, sum and avg or with session windows),
//! durations, the CEL subset parser. A `Contract` value always satisfies
//! SPEC.md section 2.

mod checks;
mod config;
mod contract;
mod destinations;
mod duration;
mod reader;
pub mod reconcile;
mod rule;
mod time_format;

pub use checks::{fields_of, Check, CheckKind, Severity, VolumePeriod};
pub use config::{Connection, KafkaConfig, OtelConfig, OtelProtocol, PostgresConfig, ServerConfig, TopicConfig};
pub use contract::{
    overlaps, AggFn, Aggregate, Alerts, Contract, ContractError, ContractErrors, Dedup, LatePolicy, Limits, OnConflict,
    Pipeline, Promote, Reconcile, Source, SourceKind, SystemOfRecord, WindowKind, WindowSpec, MAX_DEPTH,
};
pub use destinations::{
    aggregate_type, key_column, typed_columns, Column, ColumnSource, Destination, DestinationKind, KafkaMode, SqlType,
    TableMode, TableName, RESERVED_COLUMNS, ROW_COLUMNS,
};
pub use duration::{format_duration_ms, parse_duration_ms};
pub use rule::{parse_rule, CmpOp, Expr, FieldPath};
pub use time_format::{days_from_civil, days_in_month, EpochUnit, Pattern, TimeFormat, Zone};
