//! `weir token create|revoke|list` and `weir audit verify`: run on the
//! server's machine against its data folder (`weir.db`), the way a first
//! admin token is made. Every token change is in the audit log.

use std::path::{Path, PathBuf};

use weir_store::sqlite as store;
use weir_store::tokens::{self as auth, NewToken, Role};

use crate::Failure;

/// `data`'s database; `create` makes the folder and the database when
/// missing (a first admin token before the first start).
fn open_or_create(data: &Path, create: bool) -> Result<store::Connection, Failure> {
    let db = data.join("weir.db");
    if !db.exists() {
        if !create {
            return Err(Failure::usage(format!(
                "{} does not exist: --data names the folder `weir serve --data` uses",
                db.display()
            )));
        }
        weir_log::create_private_dir(data)
            .map_err(|e| Failure::usage(format!("cannot create {}: {e}; choose a writable folder", data.display())))?;
    }
    let conn = store::open(&db).map_err(|e| Failure::run(anyhow::anyhow!("cannot open {}: {e}", db.display())))?;
    store::migrate(&conn).map_err(Failure::run)?;
    Ok(conn)
}

/// `data`'s database, read-only: listing and verifying change nothing.
fn open_read_only(data: &Path) -> Result<store::Connection, Failure> {
    let db = data.join("weir.db");
    if !db.exists() {
        return Err(Failure::usage(format!(
            "{} does not exist: --data names the folder `weir serve --data` uses",
            db.display()
        )));
    }
    store::open_read_only(&db).map_err(|e| Failure::usage(format!("{e:#}")))
}

/// Who runs the command, for the audit log.
fn who() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown user".into());
    format!("{user} (weir command line)")
}

fn origin() -> String {
    format!("weir command line, process {}", std::process::id())
}

pub struct CreateArgs<'a> {
    pub data: &'a Path,
    pub role: &'a str,
    pub name: &'a str,
    pub topics: Vec<String>,
    pub pipelines: Vec<String>,
    pub expires: Option<&'a str>,
    pub why: &'a str,
}

/// Prints the token (once: only its hash is kept) on standard output.
pub fn create(a: CreateArgs<'_>) -> Result<(), Failure> {
    let all: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
    let role =
        Role::parse(a.role).ok_or_else(|| Failure::usage(format!("--role {:?} is not one of {all:?}", a.role)))?;
    let expires_in_ms = match a.expires {
        None => None,
        Some(e) => {
            Some(weir_contract::parse_duration_ms(e).map_err(|why| Failure::usage(format!("--expires {e:?}: {why}")))?)
        }
    };
    let new = NewToken { role, name: a.name.to_owned(), topics: a.topics, pipelines: a.pipelines, expires_in_ms };
    new.check().map_err(Failure::usage)?;
    if !a.data.join("weir.db").exists() {
        eprintln!(
            "weir: making {}; start the server with weir serve --data {}",
            a.data.join("weir.db").display(),
            a.data.display()
        );
    }
    let conn = open_or_create(a.data, true)?;
    let (token, grant) = auth::create_audited(&conn, &new, &who(), &origin(), a.why).map_err(Failure::run)?;
    println!("{token}");
    eprintln!(
        "weir: token {} ({}) for {}: {}; {}. Keep it secret: it is not shown again.",
        grant.id,
        grant.role,
        grant.name,
        grant.rights(),
        grant.expires_ms.map_or("it lasts until revoked".into(), |ms| format!(
            "it expires at {}",
            weir_engine::time::format_rfc3339_ms(ms)
        ))
    );
    Ok(())
}

pub fn revoke(data: &Path, id: &str, why: &str) -> Result<(), Failure> {
    let conn = open_or_create(data, false)?;
    match auth::revoke_audited(&conn, id, &who(), &origin(), why).map_err(Failure::run)? {
        Some(g) => {
            eprintln!(
                "weir: token {} ({}, {}) is revoked: requests with it are refused from now on",
                g.id, g.role, g.name
            );
            Ok(())
        }
        None => Err(Failure::usage(format!("no token {id:?} in {}; `weir token list` shows them", data.display()))),
    }
}

/// Every token as JSON lines (never a secret or its hash).
pub fn list(data: &Path) -> Result<(), Failure> {
    let conn = open_read_only(data)?;
    let tokens = auth::list(&conn).map_err(Failure::run)?;
    for g in tokens {
        println!("{}", g.json());
    }
    Ok(())
}

/// Exit 0 when the chain holds (ends at `expect_head` if given, and holds
/// each entry `at` names unchanged), 1 where it breaks.
pub fn verify(data: &Path, expect_head: Option<&str>, at: &[String], key_files: &[PathBuf]) -> Result<(), Failure> {
    let conn = open_read_only(data)?;
    let mut saved = Vec::new();
    for a in at {
        let parsed = a.split_once(':').and_then(|(seq, hash)| Some((seq.parse::<i64>().ok()?, hash.to_owned())));
        match parsed {
            Some(p) => saved.push(p),
            None => {
                return Err(Failure::usage(format!(
                    "--at {a:?} must be SEQ:HASH, as a line of GET /v1/audit gives them"
                )))
            }
        }
    }
    let named = weir_store::audit::key_named(&conn).map_err(Failure::run)?;
    let mut keys = Vec::new();
    for file in key_files {
        keys.push(weir_store::audit::Key::read(file).map_err(Failure::usage)?);
    }
    if key_files.is_empty() {
        if let Some((file, _)) = &named {
            eprintln!(
                "weir: checking keyed entries with {}, the key file weir.db names; pass --key to check with a key you trust",
                file.display()
            );
            keys.push(weir_store::audit::Key::read(file).map_err(Failure::usage)?);
        }
    }
    let v = match weir_store::audit::verify(&conn, &keys).map_err(Failure::run)? {
        Ok(v) => v,
        Err(broken) => {
            return Err(Failure::run(anyhow::anyhow!("{broken}; the audit log was tampered with from this entry on")))
        }
    };
    if !key_files.is_empty() && v.keyed_from.is_none() {
        return Err(Failure::run(anyhow::anyhow!(
            "none of the audit log's {} entries is chained with the key given: the log was rewritten without it, or no server used it",
            v.entries
        )));
    }
    if let Some(h) = expect_head {
        if h != v.head {
            return Err(Failure::run(anyhow::anyhow!(
                "the audit log's {} entries chain correctly but end at {}, not at the expected {h}: entries were removed from its end (or --expect-head is from another log)",
                v.entries,
                v.head
            )));
        }
    }
    for (seq, hash) in &saved {
        match weir_store::audit::hash_at(&conn, *seq).map_err(Failure::run)? {
            Some(h) if h == *hash => {}
            Some(h) => {
                return Err(Failure::run(anyhow::anyhow!(
                "audit entry {seq} has hash {h}, not the {hash} kept: the log was rewritten at or before entry {seq}"
            )))
            }
            None => {
                return Err(Failure::run(anyhow::anyhow!(
                    "audit entry {seq} is gone (the log has {} entries): entries were removed from its end",
                    v.entries
                )))
            }
        }
    }
    let keyed = v.keyed_from.map_or("null".to_owned(), |s| s.to_string());
    println!("{{\"entries\":{},\"head\":\"{}\",\"keyed_from\":{keyed}}}", v.entries, v.head);
    eprintln!(
        "weir: the audit log's {} entries chain correctly{}; keep the head hash to check later that none was removed from the end",
        v.entries,
        match v.keyed_from {
            Some(s) => format!(" (keyed from entry {s} on)"),
            None => String::new(),
        }
    );
    Ok(())
}

/// One token of each role over every topic and pipeline, for `weir demo`
/// and the benchmarks (made on `data` before the server starts).
pub struct RoleTokens {
    pub producer: String,
    pub reader: String,
    pub raw_reader: String,
    pub operator: String,
    pub admin: String,
}

pub fn role_tokens(data: &Path, name: &str) -> Result<RoleTokens, Failure> {
    let conn = open_or_create(data, true)?;
    let every = || vec!["*".to_owned()];
    let make = |role: Role| -> Result<String, Failure> {
        let (topics, pipelines) = match role {
            Role::Producer | Role::RawReader => (every(), Vec::new()),
            Role::Reader | Role::Operator => (Vec::new(), every()),
            Role::Admin => (Vec::new(), Vec::new()),
        };
        let new = NewToken { role, name: name.to_owned(), topics, pipelines, expires_in_ms: None };
        let why = format!("made by {name} for itself");
        auth::create_audited(&conn, &new, &who(), &origin(), &why).map(|(t, _)| t).map_err(Failure::run)
    };
    Ok(RoleTokens {
        producer: make(Role::Producer)?,
        reader: make(Role::Reader)?,
        raw_reader: make(Role::RawReader)?,
        operator: make(Role::Operator)?,
        admin: make(Role::Admin)?,
    })
}
