//! `[[destination]]` (SPEC.md 11): where a pipeline's change stream goes,
//! and the typed columns a row has there (the `postgres` destination's
//! table, and the stores' typed views).
//!
//! ```toml
//! [[destination]]
//! name = "accounts"            # a-z, 0-9 and _, unique in the contract
//! kind = "http"                # http | postgres
//! connection = "accounts_api"  # weir.toml's [connections.accounts_api]: the URL and its secrets
//! batch = 500                  # changes in one POST or transaction (default 1000)
//!
//! [[destination]]
//! name = "warehouse"
//! kind = "postgres"
//! connection = "warehouse"
//! table = "paid_revenue"       # default: the pipeline's name; "schema.table" allowed; created if missing
//! mode = "upsert"              # upsert (a row per key and window) | changes (every change appended)
//!
//! [[destination]]
//! name = "rows"
//! kind = "kafka"
//! topic = "paid_rows"
//! mode = "live"                # live (the live version's rows) | changes (every version's) | ledger
//! connection = "events"        # optional: default the pipeline's Kafka ([source] brokers, weir.toml's [kafka])
//! ```
//!
//! A contract names a connection, never a URL: secrets stay in weir.toml.
//! Whether the connection exists is the server's to check at its start.
//!
//! The older `[sink]` section is read as `kafka` destinations: `topic` as
//! `sink` (`mode = "changes"`), `ledger_topic` as `sink_ledger` (`mode =
//! "ledger"`), on `[sink] brokers` when it names them.

use toml_edit::{Item, Table};

use crate::contract::{AggFn, Aggregate, Source};
use crate::reader::Reader;

/// One `[[destination]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub name: String,
    pub kind: DestinationKind,
    /// The `[connections.NAME]` of weir.toml that holds the URL; a `kafka`
    /// destination without one uses the pipeline's Kafka.
    pub connection: Option<String>,
    /// Most changes in one delivery: a POST, or a transaction.
    pub batch: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationKind {
    /// POSTs JSON lines with an `Idempotency-Key` per batch.
    Http,
    /// A table in a Postgres database, upserted or appended.
    Postgres { table: TableName, mode: TableMode },
    /// Records on a Kafka topic, keyed by the row's key and window.
    Kafka {
        topic: String,
        mode: KafkaMode,
        /// The brokers a `[sink]` named in the contract (over the connection).
        brokers: Option<String>,
    },
}

/// What a `kafka` destination produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaMode {
    /// The live version's rows, and at a promote the new version's rows restated.
    Live,
    /// Every change of every version as it is, keyed by version too.
    Changes,
    /// The ledger: every event that did not count, personal fields masked.
    Ledger,
}

impl KafkaMode {
    pub fn as_str(self) -> &'static str {
        match self {
            KafkaMode::Live => "live",
            KafkaMode::Changes => "changes",
            KafkaMode::Ledger => "ledger",
        }
    }
}

impl DestinationKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            DestinationKind::Http => "http",
            DestinationKind::Postgres { .. } => "postgres",
            DestinationKind::Kafka { .. } => "kafka",
        }
    }
}

/// A Postgres table, with its schema when named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub schema: Option<String>,
    pub table: String,
}

impl TableName {
    /// `"schema"."table"` or `"table"`, quoted for SQL.
    pub fn quoted(&self) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{}\"", self.table),
            None => format!("\"{}\"", self.table),
        }
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.table),
            None => f.write_str(&self.table),
        }
    }
}

/// How a `postgres` destination keeps the changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableMode {
    /// One row per key and window, replaced only by a change of higher `seq`.
    Upsert,
    /// Every change appended once, keyed by `seq`.
    Changes,
}

/// Default `batch`.
pub const BATCH_DEFAULT: usize = 1000;
/// The most `batch` may be.
pub const BATCH_MAX: usize = 10_000;

const DESTINATION_KEYS: &[&str] = &["name", "kind", "connection", "batch", "table", "mode", "topic"];

/// A typed column's SQL type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlType {
    Text,
    BigInt,
    Numeric,
    Timestamp,
}

impl SqlType {
    /// The Postgres type.
    pub fn postgres(self) -> &'static str {
        match self {
            SqlType::Text => "text",
            SqlType::BigInt => "bigint",
            SqlType::Numeric => "numeric",
            SqlType::Timestamp => "timestamptz",
        }
    }
}

/// Where a typed column's value comes from in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ColumnSource {
    /// The row's `key` member of this name (the field path as written).
    Key(String),
    /// The row's `values` member of this name.
    Value(String),
    /// A top-level member of the row: `window_start`, `status`, ...
    Row(&'static str),
}

/// One typed column: its name, type and where its value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub sql: SqlType,
    pub source: ColumnSource,
}

/// The columns every typed row has besides its key fields and aggregates,
/// in table order after them (`updated_at` and `seq` are the writer's).
pub const ROW_COLUMNS: &[(&str, SqlType)] = &[
    ("status", SqlType::Text),
    ("revision", SqlType::BigInt),
    ("version", SqlType::BigInt),
    ("events", SqlType::BigInt),
    ("late_events", SqlType::BigInt),
    ("as_of", SqlType::Timestamp),
];

/// The names a typed row's own columns take.
pub const RESERVED_COLUMNS: &[&str] = &[
    "window_start",
    "window_end",
    "status",
    "revision",
    "version",
    "events",
    "late_events",
    "as_of",
    "updated_at",
    "seq",
];

/// A key field's column name: its path's segments joined by `_`.
pub fn key_column(path: &str) -> String {
    path.replace('.', "_")
}

/// An aggregate's column type: `bigint` for counts, `numeric` for the
/// numeric functions, `text` for `first` and `last` (a value of any type).
pub fn aggregate_type(func: AggFn) -> SqlType {
    match func {
        AggFn::Count | AggFn::CountDistinct => SqlType::BigInt,
        AggFn::Sum | AggFn::Avg | AggFn::Min | AggFn::Max => SqlType::Numeric,
        AggFn::First | AggFn::Last => SqlType::Text,
    }
}

/// The typed columns of a contract's rows, in table order: key fields,
/// `window_start`, `window_end`, aggregates, then [`ROW_COLUMNS`].
pub fn typed_columns(source: &Source, aggregates: &[Aggregate]) -> Vec<Column> {
    let mut out: Vec<Column> = source
        .key
        .iter()
        .map(|k| Column {
            name: key_column(&k.to_string()),
            sql: SqlType::Text,
            source: ColumnSource::Key(k.to_string()),
        })
        .collect();
    for w in ["window_start", "window_end"] {
        out.push(Column { name: w.into(), sql: SqlType::Timestamp, source: ColumnSource::Row(w) });
    }
    for a in aggregates {
        out.push(Column {
            name: a.name.clone(),
            sql: aggregate_type(a.func),
            source: ColumnSource::Value(a.name.clone()),
        });
    }
    for (name, sql) in ROW_COLUMNS {
        out.push(Column { name: (*name).into(), sql: *sql, source: ColumnSource::Row(name) });
    }
    out
}

/// A Kafka topic's name: 1 to 249 of letters, digits, `.`, `_` and `-`.
pub fn is_topic(s: &str) -> bool {
    !s.is_empty() && s.len() <= 249 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// A Postgres identifier weir creates: 1 to 63 of a-z, 0-9 and _, not starting with a digit.
fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !s.starts_with(|c: char| c.is_ascii_digit())
}

impl Reader<'_> {
    pub(crate) fn destinations(
        &mut self,
        root: &Table,
        pipeline: &str,
        source: &Source,
        aggregates: &[Aggregate],
    ) -> Option<Vec<Destination>> {
        let tables: Vec<&Table> = match root.get("destination") {
            None => return Some(Vec::new()),
            Some(Item::ArrayOfTables(array)) => array.iter().collect(),
            Some(other) => {
                self.error(other.span(), "destination", "write each destination as its own [[destination]] table");
                return None;
            }
        };
        let mut out: Vec<Destination> = Vec::new();
        let mut ok = true;
        for (i, t) in tables.into_iter().enumerate() {
            let section = format!("destination[{}]", i + 1);
            match self.destination(t, &section, pipeline) {
                Some(d) => {
                    if out.iter().any(|o| o.name == d.name) {
                        self.error(
                            t.get("name").and_then(Item::span),
                            &format!("{section}.name"),
                            format!("`{}` names two destinations; give each a unique name", d.name),
                        );
                        ok = false;
                    }
                    if matches!(d.kind, DestinationKind::Postgres { .. })
                        && !self.columns_apart(t, &section, source, aggregates)
                    {
                        ok = false;
                    }
                    out.push(d);
                }
                None => ok = false,
            }
        }
        ok.then_some(out)
    }

    fn destination(&mut self, t: &Table, section: &str, pipeline: &str) -> Option<Destination> {
        self.item_keys(t, section, "destination", DESTINATION_KEYS);
        let name = self.item_name(t, section, "a destination");
        let kafka = t.get("kind").and_then(Item::as_str) == Some("kafka");
        let connection = self.string(t, section, "connection", !kafka);
        if connection.as_deref().is_some_and(|c| c.trim().is_empty()) {
            self.error(
                t.get("connection").and_then(Item::span),
                &format!("{section}.connection"),
                "must name a [connections.NAME] section of weir.toml, which holds the URL and its secrets",
            );
        }
        let batch = self.whole(t, section, "batch", 1, BATCH_MAX as i64);
        let span = |key: &str| t.get(key).and_then(Item::span);
        let kind = match self.string(t, section, "kind", true).as_deref() {
            Some("http") => {
                self.only_for(t, section, &["table", "mode"], "a postgres destination has a table");
                self.only_for(t, section, &["topic"], "a kafka destination has a topic");
                Some(DestinationKind::Http)
            }
            Some("postgres") => {
                self.only_for(t, section, &["topic"], "a kafka destination has a topic");
                self.postgres_destination(t, section, pipeline)
            }
            Some("kafka") => {
                self.only_for(t, section, &["table"], "a postgres destination has a table");
                let mode = match self.string(t, section, "mode", false).as_deref() {
                    None | Some("live") => Some(KafkaMode::Live),
                    Some("changes") => Some(KafkaMode::Changes),
                    Some("ledger") => Some(KafkaMode::Ledger),
                    Some(other) => {
                        self.error(
                            span("mode"),
                            &format!("{section}.mode"),
                            format!("`{other}` is not a kafka mode; use \"live\" (the live version's rows), \"changes\" (every version's changes) or \"ledger\""),
                        );
                        None
                    }
                };
                let topic = self.string(t, section, "topic", true);
                match (topic, mode) {
                    (Some(topic), Some(mode)) if is_topic(&topic) => {
                        Some(DestinationKind::Kafka { topic, mode, brokers: None })
                    }
                    (Some(topic), _) if !is_topic(&topic) => {
                        self.error(
                            span("topic"),
                            &format!("{section}.topic"),
                            format!("`{topic}` is not a Kafka topic name: 1 to 249 of letters, digits, ., _ and -"),
                        );
                        None
                    }
                    _ => None,
                }
            }
            Some(other) => {
                self.error(
                    span("kind"),
                    &format!("{section}.kind"),
                    format!("`{other}` is not a destination kind; use \"http\", \"postgres\" or \"kafka\""),
                );
                None
            }
            None => None,
        };
        if !kafka && connection.is_none() {
            return None;
        }
        let (name, kind, batch) = (name?, kind?, batch?);
        Some(Destination { name, kind, connection, batch: batch.map_or(BATCH_DEFAULT, |b| b as usize) })
    }

    /// `[sink]`, read as `kafka` destinations: `sink` (every change, as the
    /// section always published) and, with `ledger_topic`, `sink_ledger`.
    pub(crate) fn sink(&mut self, t: &Table) -> Option<Vec<Destination>> {
        self.unknown_keys(t, "sink", &["topic", "ledger_topic", "brokers"]);
        let brokers = self.string(t, "sink", "brokers", false);
        let mut out = Vec::new();
        for (key, name, mode, required) in
            [("topic", "sink", KafkaMode::Changes, true), ("ledger_topic", "sink_ledger", KafkaMode::Ledger, false)]
        {
            let Some(topic) = self.string(t, "sink", key, required) else { continue };
            if !is_topic(&topic) {
                self.error(
                    t.get(key).and_then(Item::span),
                    &format!("sink.{key}"),
                    format!("`{topic}` is not a Kafka topic name: 1 to 249 of letters, digits, ., _ and -"),
                );
                return None;
            }
            let kind = DestinationKind::Kafka { topic, mode, brokers: brokers.clone() };
            out.push(Destination { name: name.into(), kind, connection: None, batch: 2_000 });
        }
        (!out.is_empty()).then_some(out)
    }

    /// Keys another kind of destination takes, refused here (`what` says whose they are).
    fn only_for(&mut self, t: &Table, section: &str, keys: &[&str], what: &str) {
        for key in keys {
            if t.contains_key(key) {
                let span = t.get(key).and_then(Item::span);
                self.error(span, &format!("{section}.{key}"), format!("only {what}; remove `{key}`, or change `kind`"));
            }
        }
    }

    fn postgres_destination(&mut self, t: &Table, section: &str, pipeline: &str) -> Option<DestinationKind> {
        let span = |key: &str| t.get(key).and_then(Item::span);
        let table = self.string(t, section, "table", false).unwrap_or_else(|| pipeline.to_owned());
        let parts: Vec<&str> = table.split('.').collect();
        let table = match parts.as_slice() {
            [one] if is_identifier(one) => Some(TableName { schema: None, table: (*one).into() }),
            [schema, one] if is_identifier(schema) && is_identifier(one) => {
                Some(TableName { schema: Some((*schema).into()), table: (*one).into() })
            }
            _ => {
                self.error(
                    span("table"),
                    &format!("{section}.table"),
                    format!("`{table}` is not a table weir can create: write \"table\" or \"schema.table\", each 1 to 63 of a-z, 0-9 and _, not starting with a digit"),
                );
                None
            }
        };
        let mode = match self.string(t, section, "mode", false).as_deref() {
            None | Some("upsert") => Some(TableMode::Upsert),
            Some("changes") => Some(TableMode::Changes),
            Some(other) => {
                self.error(
                    span("mode"),
                    &format!("{section}.mode"),
                    format!("`{other}` is not a mode; use \"upsert\" (a row per key and window) or \"changes\" (every change appended)"),
                );
                None
            }
        };
        Some(DestinationKind::Postgres { table: table?, mode: mode? })
    }

    /// A typed table's column names must differ: key fields, aggregates
    /// and the row's own columns.
    fn columns_apart(&mut self, t: &Table, section: &str, source: &Source, aggregates: &[Aggregate]) -> bool {
        let mut seen: Vec<String> = RESERVED_COLUMNS.iter().map(|s| (*s).to_owned()).collect();
        let mut ok = true;
        let names = source.key.iter().map(|k| (format!("key field `{k}`"), key_column(&k.to_string())));
        let names = names.chain(aggregates.iter().map(|a| (format!("aggregate `{}`", a.name), a.name.clone())));
        for (what, column) in names.collect::<Vec<_>>() {
            if seen.contains(&column) {
                self.error(
                    t.span(),
                    section,
                    format!("{what} would be the table's column `{column}`, which another column has; rename the aggregate (a key field's column is its path with _ for .)"),
                );
                ok = false;
            }
            seen.push(column);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_path_becomes_a_column_with_underscores() {
        assert_eq!(key_column("customer.id"), "customer_id");
        assert_eq!(key_column("account_id"), "account_id");
    }

    #[test]
    fn identifiers_are_what_postgres_takes_unquoted() {
        assert!(is_identifier("paid_revenue"));
        assert!(!is_identifier("Paid"));
        assert!(!is_identifier("1x"));
        assert!(!is_identifier(&"a".repeat(64)));
        assert!(!is_identifier("a\"b"));
    }
}
