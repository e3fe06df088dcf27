//! `weir serve`: the command line around `weir_server::serve`.

use std::path::{Path, PathBuf};

use weir_contract::ServerConfig;
use weir_log::LogOptions;

use crate::Failure;

pub struct ServeArgs {
    pub data: PathBuf,
    pub contracts: PathBuf,
    pub config: Option<PathBuf>,
    pub listen: Option<String>,
    /// HTTPS: `--tls-cert` and `--tls-key`.
    pub tls: Option<(PathBuf, PathBuf)>,
}

pub fn read_config(path: Option<&Path>) -> Result<ServerConfig, Failure> {
    let Some(path) = path else { return Ok(ServerConfig::default()) };
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("cannot read {}: {e}; check the --config path", path.display())))?;
    ServerConfig::parse(&path.display().to_string(), &text)
        .map_err(|errors| Failure::contract(format!("{errors}\nweir: fix weir.toml at the lines above")))
}

/// Turns transparent huge pages off for this process, as every server
/// (`weir serve`, `weir demo`) does before it starts: with them, an engine
/// table's doubling had the kernel zero tens of megabytes at once on a
/// pipeline's thread, holding its rows back for 100-400 ms; with 4 KiB
/// pages the zeroing spreads over the writes that touch them
/// (BENCHMARKS.md, issue 19).
pub(crate) fn small_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        eprintln!("weir: cannot turn transparent huge pages off ({e}); serving with them");
    }
}

pub fn serve(args: ServeArgs) -> Result<(), Failure> {
    small_pages();
    let config = read_config(args.config.as_deref())?;
    let contracts = weir_server::load_contracts(&args.contracts).map_err(Failure::contract)?;
    let listen = args.listen.or_else(|| config.listen.clone()).unwrap_or_else(|| "127.0.0.1:8080".into());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::run(anyhow::anyhow!("cannot start the runtime: {e}")))?;
    let scheme = if args.tls.is_some() { "https" } else { "http" };
    let opts = weir_server::ServeOptions {
        data: args.data,
        contracts,
        config,
        listen,
        log_options: LogOptions::default(),
        tls: args.tls,
    };
    let names: Vec<String> = opts.contracts.iter().map(|c| c.pipeline.name.clone()).collect();
    runtime
        .block_on(weir_server::serve(
            opts,
            move |addr| {
                eprintln!("weir: serving {scheme}://{addr} (pipelines: {})", names.join(", "));
            },
            shutdown_signal(),
        ))
        .map_err(Failure::run)
}

/// Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    eprintln!("weir: stopping: last checkpoints, then exit");
}
