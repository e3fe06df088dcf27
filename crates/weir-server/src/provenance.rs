//! `GET /v1/pipelines/{name}/results/{seq}/provenance`: where one published
//! row came from, as a W3C PROV-JSON document
//! (<https://www.w3.org/submissions/prov-json/>).
//!
//! - entity `weir:row/{pipeline}/{seq}`: the row and its revision; the
//!   window's previous row, if any, is an entity it `wasDerivedFrom`
//!   (`prov:Revision`);
//! - entity per partition `weir:log/{topic}/{partition}/{first}-{last}`:
//!   the offsets of the first and last event the window counted from that
//!   partition and how many it counted (others, of other keys or windows,
//!   lie between);
//! - entity `weir:contract/{pipeline}/{version}` with the contract's hash;
//! - activity `weir:run/{id}`: the pipeline run that published the row
//!   (started at server start, after a failure or at a replay), with the
//!   contract version and hash and weir's version; it `used` the log ranges
//!   and the contract;
//! - agents: the contract's owner and steward, associated with the run
//!   (`prov:role`), the row attributed to the owner.
//!
//! The row entity also carries `weir:events`, `weir:late_events` and
//! `weir:ledgered`: ledger entries, by reason, of the row's key whose
//! window is this window or, for entries without a window, whose event time
//! falls in it, as the ledger holds them when asked (so a settled row shows
//! the events refused after it).

use serde_json::{json, Map, Value};
use weir_contract::Contract;
use weir_engine::time::format_rfc3339_ms;

use weir_store::rows::RowOrigin;

fn time(ms: i64) -> Value {
    json!({ "$": format_rfc3339_ms(ms), "type": "xsd:dateTime" })
}

/// The PROV-JSON document of the row `seq` of the contract's pipeline.
pub fn document(contract: &Contract, seq: i64, origin: &RowOrigin) -> Value {
    let p = &contract.pipeline;
    let topic = &contract.source.topic;
    let row = &origin.row;
    let row_id = format!("weir:row/{}/{seq}", p.name);
    let contract_id = format!("weir:contract/{}/{}", p.name, p.version);
    let owner_id = format!("weir:agent/{}", p.owner);
    let steward_id = format!("weir:agent/{}", p.steward);

    let mut entity = Map::new();
    let ledgered: Map<String, Value> = origin.ledgered.iter().map(|(r, n)| (r.clone(), json!(n))).collect();
    let mut this = json!({
        "prov:type": "weir:Row",
        "prov:label": format!("{} row {} revision {}", p.name, seq, row["revision"]),
        "weir:pipeline": p.name,
        "weir:seq": seq,
        "weir:key": row["key"],
        "weir:window_start": row["window_start"],
        "weir:window_end": row["window_end"],
        "weir:status": row["status"],
        "weir:revision": row["revision"],
        "weir:values": row["values"],
        "weir:events": row["events"],
        "weir:late_events": row["late_events"],
        "weir:ledgered": ledgered,
    });
    if let Some(at) = origin.at_ms {
        this["prov:generatedAtTime"] = time(at);
    }
    entity.insert(row_id.clone(), this);
    entity.insert(
        contract_id.clone(),
        json!({
            "prov:type": "weir:Contract",
            "weir:pipeline": p.name,
            "weir:version": p.version,
            "weir:hash": origin.run.as_ref().map_or_else(|| format!("{:016x}", contract.text_hash), |r| r.text_hash.clone()),
            "weir:decision": p.decision,
        }),
    );
    let mut used = Map::new();
    let run_id =
        origin.run.as_ref().map_or_else(|| format!("weir:run/{}/unknown", p.name), |r| format!("weir:run/{}", r.id));
    for (i, [partition, first, last, events]) in origin.sources.iter().enumerate() {
        let id = format!("weir:log/{topic}/{partition}/{first}-{last}");
        entity.insert(
            id.clone(),
            json!({
                "prov:type": "weir:LogRange",
                "weir:topic": topic,
                "weir:partition": partition,
                "weir:first_offset": first,
                "weir:last_offset": last,
                "weir:events": events,
            }),
        );
        used.insert(format!("_:used{i}"), json!({ "prov:activity": run_id, "prov:entity": id }));
    }
    used.insert("_:used_contract".into(), json!({ "prov:activity": run_id, "prov:entity": contract_id }));

    let mut derived = Map::new();
    if let Some((prev_seq, prev)) = &origin.previous {
        let prev_id = format!("weir:row/{}/{prev_seq}", p.name);
        entity.insert(
            prev_id.clone(),
            json!({
                "prov:type": "weir:Row",
                "weir:seq": prev_seq,
                "weir:status": prev["status"],
                "weir:revision": prev["revision"],
                "weir:values": prev["values"],
            }),
        );
        derived.insert(
            "_:derived".into(),
            json!({ "prov:generatedEntity": row_id, "prov:usedEntity": prev_id, "prov:type": "prov:Revision" }),
        );
    }

    let mut activity = json!({
        "prov:type": "weir:PipelineRun",
        "weir:pipeline": p.name,
        "weir:contract_version": p.version,
        "weir:contract_hash": format!("{:016x}", contract.text_hash),
        "weir:weir_version": env!("CARGO_PKG_VERSION"),
    });
    if let Some(r) = &origin.run {
        activity["prov:startTime"] = time(r.started_ms);
        activity["weir:contract_version"] = json!(r.version);
        activity["weir:contract_hash"] = json!(r.text_hash);
        activity["weir:weir_version"] = json!(r.weir_version);
        activity["weir:started_because"] = json!(r.why);
    }
    let mut generated = json!({ "prov:entity": row_id, "prov:activity": run_id });
    if let Some(at) = origin.at_ms {
        generated["prov:time"] = time(at);
    }
    let mut doc = json!({
        "prefix": {
            "weir": "urn:weir:",
            "xsd": "http://www.w3.org/2001/XMLSchema#",
        },
        "entity": entity,
        "activity": { run_id.clone(): activity },
        "agent": {
            owner_id.clone(): { "prov:type": "prov:Organization", "prov:label": p.owner },
            steward_id.clone(): { "prov:type": "prov:Organization", "prov:label": p.steward },
        },
        "wasGeneratedBy": { "_:generated": generated },
        "used": used,
        "wasAssociatedWith": {
            "_:owner": { "prov:activity": run_id, "prov:agent": owner_id, "prov:role": "weir:owner" },
            "_:steward": { "prov:activity": run_id, "prov:agent": steward_id, "prov:role": "weir:steward" },
        },
        "wasAttributedTo": { "_:attributed": { "prov:entity": row_id, "prov:agent": owner_id } },
    });
    if !derived.is_empty() {
        doc["wasDerivedFrom"] = Value::Object(derived);
    }
    doc
}
