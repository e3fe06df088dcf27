//! The contract compiled for the hot path: field paths split once, rules
//! compiled with their decimal literals read once.

use weir_contract::{AggFn, Contract, FieldPath, LatePolicy, OnConflict, TimeFormat, WindowKind, Zone};

use crate::json::{Bounds, FieldRef, Names};
use crate::output::RowFormat;
use crate::rule::Rule;

#[derive(Debug, Clone)]
pub(crate) struct AggPlan {
    pub func: AggFn,
    pub field: Option<FieldRef>,
    pub field_name: String,
    pub rule: Option<Rule>,
}

#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub name: String,
    pub version: u32,
    pub text_hash: u64,
    /// The hash of the contract's bytes, by which snapshots written before
    /// contracts were hashed as parsed name it.
    pub bytes_hash: u64,
    /// Top-level names every path below starts from.
    pub names: Names,
    pub time_path: FieldRef,
    pub time_name: String,
    pub time_format: TimeFormat,
    pub time_zone: Zone,
    pub key_paths: Vec<FieldRef>,
    pub key_names: Vec<String>,
    pub id_path: Option<FieldRef>,
    pub id_name: String,
    pub rule: Option<Rule>,
    pub max_delay_ms: i64,
    pub max_future_ms: Option<i64>,
    pub max_event_bytes: usize,
    /// `[limits]` for one event: nesting and number of values.
    pub bounds: Bounds,
    pub max_key_bytes: usize,
    pub max_keys: usize,
    pub max_open_windows: usize,
    /// Keys are counted apart from windows: tumbling or hopping windows
    /// with `max_keys` below `max_open_windows` (otherwise the window
    /// limit is met first, or a session or global window counts its keys).
    pub count_keys: bool,
    pub kind: WindowKind,
    pub lateness_ms: i64,
    pub late: LatePolicy,
    pub early: bool,
    pub horizon_ms: Option<i64>,
    /// `on_conflict = "correct"`: each remembered id keeps what its counting
    /// version gave, and a different version replaces it (SPEC.md 3.3).
    pub corrects: bool,
    pub aggs: Vec<AggPlan>,
    pub format: RowFormat,
}

impl Plan {
    pub(crate) fn compile(contract: &Contract) -> Result<Plan, String> {
        let mut names = Names::default();
        let compile_rule = |rule: &Option<(String, weir_contract::Expr)>, key: &str, names: &mut Names| {
            rule.as_ref().map(|(_, expr)| Rule::compile(expr, names).map_err(|e| format!("`{key}`: {e}"))).transpose()
        };
        let source = &contract.source;
        let time_path = names.field(source.event_time.segments());
        let key_paths = source.key.iter().map(|k| names.field(k.segments())).collect();
        let id_path = source.event_id.as_ref().map(|p| names.field(p.segments()));
        let rule = compile_rule(&source.rule, "source.where", &mut names)?;
        let mut aggs = Vec::new();
        for (i, agg) in contract.aggregates.iter().enumerate() {
            aggs.push(AggPlan {
                func: agg.func,
                field: agg.field.as_ref().map(|p: &FieldPath| names.field(p.segments())),
                field_name: agg.field.as_ref().map(ToString::to_string).unwrap_or_default(),
                rule: compile_rule(&agg.rule, &format!("aggregate[{}].where", i + 1), &mut names)?,
            });
        }
        let limits = contract.limits;
        let fixed = matches!(contract.window.kind, WindowKind::Tumbling { .. } | WindowKind::Hopping { .. });
        Ok(Plan {
            bounds: Bounds { depth: limits.max_depth, values: limits.max_fields },
            max_key_bytes: limits.max_key_bytes,
            max_keys: limits.max_keys,
            max_open_windows: limits.max_open_windows,
            count_keys: fixed && limits.max_keys < limits.max_open_windows,
            names,
            name: contract.pipeline.name.clone(),
            version: contract.pipeline.version,
            text_hash: contract.text_hash,
            bytes_hash: contract.bytes_hash(),
            time_path,
            time_name: source.event_time.to_string(),
            time_format: source.event_time_format.clone(),
            time_zone: source.event_time_zone,
            key_paths,
            key_names: source.key.iter().map(ToString::to_string).collect(),
            id_path,
            id_name: source.event_id.as_ref().map(ToString::to_string).unwrap_or_default(),
            rule,
            max_delay_ms: source.max_delay_ms,
            max_future_ms: source.max_future_ms,
            max_event_bytes: source.max_event_bytes,
            kind: contract.window.kind,
            lateness_ms: contract.window.allowed_lateness_ms,
            late: contract.window.late,
            early: contract.window.early,
            horizon_ms: contract.dedup.map(|d| d.horizon_ms),
            corrects: contract.dedup.is_some_and(|d| d.on_conflict == OnConflict::Correct),
            aggs,
            format: RowFormat::new(
                contract.pipeline.name.clone(),
                contract.pipeline.version,
                source.key.iter().map(ToString::to_string).collect(),
                contract.aggregates.iter().map(|a| a.name.clone()).collect(),
            ),
        })
    }
}
