//! `weir review --since 30d [--format md|html|json]`: the monthly review of
//! a running server's pipelines (`GET /v1/review`), as Markdown, as one
//! self-contained HTML file with its charts drawn in inline SVG, or as the
//! server's JSON.

use serde_json::Value;

use crate::client::{agent, get_ok};
use crate::Failure;

pub fn review(url: &str, since: &str, format: &str) -> Result<(), Failure> {
    if !["md", "html", "json"].contains(&format) {
        return Err(Failure::usage(format!("--format {format:?}: use md, html or json")));
    }
    let target = format!("{}/v1/review?since={}", url.trim_end_matches('/'), since);
    let body = get_ok(&agent(), &target)?;
    if format == "json" {
        print!("{body}");
        return Ok(());
    }
    let r: Value = serde_json::from_str(&body).map_err(Failure::run)?;
    print!("{}", if format == "md" { markdown(&r) } else { html(&r) });
    Ok(())
}

/// A value as text: strings unquoted, null as a dash.
fn plain(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn duration(v: &Value) -> String {
    v.as_i64().map_or_else(|| "–".into(), |ms| weir_contract::format_duration_ms(ms.max(0)))
}

fn materiality(e: &Value) -> String {
    let parts: Vec<String> =
        e["materiality"].as_object().into_iter().flatten().map(|(a, v)| format!("{a} {}", plain(v))).collect();
    let mut text = if parts.is_empty() { "–".to_owned() } else { parts.join(", ") };
    if let Some(n) = e["materiality_unknown"].as_u64().filter(|n| *n > 0) {
        text.push_str(&format!(" ({n} without a readable payload)"));
    }
    text
}

/// Each section as rows of cells: (title, header, rows, what an empty one says).
type Table = (&'static str, Vec<&'static str>, Vec<Vec<String>>, &'static str);

fn sections(p: &Value) -> Vec<Table> {
    let list = |k: &str| p[k].as_array().cloned().unwrap_or_default();
    let exceptions =
        list("exceptions").iter().map(|e| vec![plain(&e["cause"]), plain(&e["count"]), materiality(e)]).collect();
    let incidents = list("incidents")
        .iter()
        .map(|i| {
            vec![
                plain(&i["id"]),
                plain(&i["title"]),
                plain(&i["cause"]),
                plain(&i["status"]),
                plain(&i["opened"]),
                duration(&i["time_to_mitigation_ms"]),
                duration(&i["time_to_resolution_ms"]),
            ]
        })
        .collect();
    let drills = list("drills")
        .iter()
        .map(|d| {
            let fired: Vec<String> = d["alerts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| a["fired_after_ms"].is_number())
                .map(|a| format!("{} in {}", plain(&a["alert"]), duration(&a["fired_after_ms"])))
                .collect();
            vec![
                plain(&d["id"]),
                plain(&d["scenario"]),
                plain(&d["started"]),
                plain(&d["verdict"]),
                if fired.is_empty() { "none".into() } else { fired.join(", ") },
                duration(&d["recovery_ms"]),
            ]
        })
        .collect();
    let a = &p["lateness"];
    let pct = |v: &Value| format!("{:.3}%", v.as_f64().unwrap_or(0.0) * 100.0);
    let mut lateness = vec![vec![
        "now".to_owned(),
        plain(&a["current"]["allowed_lateness"]),
        pct(&a["current"]["too_late_rate"]),
        plain(&a["current"]["too_late_events"]),
        "–".into(),
        plain(&a["current"]["state_bytes"]),
    ]];
    if let Some(note) = a["note"].as_str() {
        lateness.push(vec![note.to_owned(), "–".into(), "–".into(), "–".into(), "–".into(), "–".into()]);
    }
    for s in a["suggestions"].as_array().into_iter().flatten() {
        lateness.push(vec![
            format!("at most {}", pct(&s["target_too_late_rate"])),
            plain(&s["allowed_lateness"]),
            pct(&s["too_late_rate"]),
            plain(&s["too_late_events"]),
            plain(&s["extra_revisions"]),
            plain(&s["state_bytes"]),
        ]);
    }
    let promoted = list("versions_promoted")
        .iter()
        .map(|v| vec![plain(&v["version"]), plain(&v["promoted"]), plain(&v["promoted_by"]), plain(&v["replaced"])])
        .collect();
    vec![
        ("Exceptions by cause", vec!["cause", "count", "materiality"], exceptions, "none in the period"),
        (
            "Incidents",
            vec!["#", "title", "cause", "status", "opened", "to mitigation", "to resolution"],
            incidents,
            "none in the period",
        ),
        (
            "Drills",
            vec!["#", "scenario", "started", "verdict", "alerts fired", "recovery"],
            drills,
            "none in the period",
        ),
        (
            "Lateness: today's setting and the advice",
            vec![
                "too late",
                "allowed_lateness",
                "observed too late",
                "events too late",
                "extra revisions",
                "state bytes",
            ],
            lateness,
            "",
        ),
        ("Versions promoted", vec!["version", "promoted", "by", "replaced"], promoted, "none in the period"),
    ]
}

fn heading(p: &Value) -> String {
    format!(
        "{} (live v{}; owner {}, steward {})",
        plain(&p["pipeline"]),
        plain(&p["live_version"]),
        plain(&p["owner"]),
        plain(&p["steward"])
    )
}

fn observed(p: &Value) -> String {
    let period = &p["lateness"]["period"];
    format!(
        "Lateness observed over {} events from {} to {}.",
        plain(&period["events"]),
        plain(&period["from"]),
        plain(&period["to"])
    )
}

pub fn markdown(r: &Value) -> String {
    let cell = |s: &str| md_text(s);
    let mut out = format!(
        "# weir review: {} to {} ({})\n",
        cell(&plain(&r["since"])),
        cell(&plain(&r["until"])),
        cell(&plain(&r["period"]))
    );
    for p in r["pipelines"].as_array().into_iter().flatten() {
        out.push_str(&format!("\n## {}\n\n{}\n", cell(&heading(p)), cell(&plain(&p["decision"]))));
        for (title, header, rows, empty) in sections(p) {
            out.push_str(&format!("\n### {title}\n\n"));
            if rows.is_empty() {
                out.push_str(&format!("{empty}\n"));
                continue;
            }
            out.push_str(&format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len())));
            for row in rows {
                out.push_str(&format!("| {} |\n", row.iter().map(|c| cell(c)).collect::<Vec<_>>().join(" | ")));
            }
            if title.starts_with("Lateness") {
                out.push_str(&format!("\n{}\n", observed(p)));
            }
        }
    }
    out
}

/// Text from the server as Markdown that shows it as it is: no raw HTML,
/// no link or image, no escape undone, no table cell or line ended early
/// (CommonMark lets a backslash escape any ASCII punctuation).
fn md_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | '<' | '>' | '&' | '[' | ']' | '|' | '`' | '!' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' => out.push(' '),
            _ => out.push(c),
        }
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Horizontal bars, one a label, as inline SVG.
fn bars(label: &str, items: &[(String, f64, String)]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let max = items.iter().map(|i| i.1).fold(0.0_f64, f64::max).max(1.0);
    let mut svg = format!(
        "<svg role=\"img\" aria-label=\"{}\" viewBox=\"0 0 640 {}\" width=\"640\" height=\"{}\">",
        escape(label),
        items.len() * 24 + 4,
        items.len() * 24 + 4
    );
    for (i, (name, v, shown)) in items.iter().enumerate() {
        let y = i * 24 + 2;
        let w = (v / max * 380.0).max(1.0);
        svg.push_str(&format!(
            "<text x=\"0\" y=\"{}\" font-size=\"12\">{}</text><rect x=\"220\" y=\"{y}\" width=\"{w:.1}\" height=\"18\" fill=\"#4a78c2\"/><text x=\"{:.1}\" y=\"{}\" font-size=\"12\">{}</text>",
            y + 14,
            escape(name),
            224.0 + w,
            y + 14,
            escape(shown)
        ));
    }
    svg.push_str("</svg>");
    svg
}

pub fn html(r: &Value) -> String {
    let mut out = String::from(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>weir review</title><style>\
         body{font:14px system-ui,sans-serif;margin:2rem;color:#222}table{border-collapse:collapse;margin:.5rem 0}\
         td,th{border:1px solid #ccc;padding:.25rem .5rem;text-align:left}th{background:#f3f3f3}\
         section{border-top:2px solid #4a78c2;margin-top:1.5rem}.muted{color:#777}</style></head><body>",
    );
    out.push_str(&format!(
        "<h1>weir review: {} to {} ({})</h1>",
        escape(&plain(&r["since"])),
        escape(&plain(&r["until"])),
        escape(&plain(&r["period"]))
    ));
    for p in r["pipelines"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "<section data-pipeline=\"{}\"><h2>{}</h2><p>{}</p>",
            escape(&plain(&p["pipeline"])),
            escape(&heading(p)),
            escape(&plain(&p["decision"]))
        ));
        let exceptions: Vec<(String, f64, String)> = p["exceptions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| (plain(&e["cause"]), e["count"].as_f64().unwrap_or(0.0), plain(&e["count"])))
            .collect();
        let resolutions: Vec<(String, f64, String)> = p["incidents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| {
                let ms = i["time_to_resolution_ms"].as_i64()?;
                Some((
                    format!("#{} {}", plain(&i["id"]), plain(&i["cause"])),
                    ms as f64,
                    duration(&i["time_to_resolution_ms"]),
                ))
            })
            .collect();
        for (title, header, rows, empty) in sections(p) {
            out.push_str(&format!("<h3>{}</h3>", escape(title)));
            if title == "Exceptions by cause" {
                out.push_str(&bars("exceptions by cause", &exceptions));
            }
            if title == "Incidents" {
                out.push_str(&bars("time to resolution", &resolutions));
            }
            if rows.is_empty() {
                out.push_str(&format!("<p class=\"muted\">{}</p>", escape(empty)));
                continue;
            }
            out.push_str("<table><tr>");
            for h in header {
                out.push_str(&format!("<th>{}</th>", escape(h)));
            }
            out.push_str("</tr>");
            for row in rows {
                out.push_str("<tr>");
                for c in row {
                    out.push_str(&format!("<td>{}</td>", escape(&c)));
                }
                out.push_str("</tr>");
            }
            out.push_str("</table>");
            if title.starts_with("Lateness") {
                out.push_str(&format!("<p class=\"muted\">{}</p>", escape(&observed(p))));
            }
        }
        out.push_str("</section>");
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_markdown_review_shows_titles_and_names_as_text_not_html_or_links() {
        let hostile = "<img src=x onerror=alert(1)> [click](javascript:alert(1)) ![i](http://x/y.png) \\<b>";
        let r = serde_json::json!({
            "since": "2026-11-05", "until": "2026-12-05", "period": "30d",
            "pipelines": [{
                "pipeline": "paid", "live_version": 1, "owner": hostile, "steward": "s", "decision": hostile,
                "incidents": [{ "id": 1, "title": hostile, "cause": "alert:x", "status": "open", "opened": "t" }],
                "lateness": {}
            }]
        });
        let md = markdown(&r);
        // What a renderer reads as markup: the text without its escaped characters.
        let mut unescaped = String::new();
        let mut chars = md.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                chars.next();
            } else {
                unescaped.push(c);
            }
        }
        for markup in ['<', '>', '[', ']', '!', '&'] {
            assert!(!unescaped.contains(markup), "{markup:?} passed through as Markdown:\n{md}");
        }
        assert!(md.contains("\\<img src=x onerror=alert(1)\\>"), "{md}");
        assert!(md.contains("\\[click\\](javascript:alert(1))"), "{md}");
    }
}
