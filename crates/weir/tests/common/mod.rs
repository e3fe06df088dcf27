//! Helpers shared by the command-line tests: a scratch folder and the binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "weir-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn weir(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weir")).args(args.iter().map(|a| a.as_ref())).output().unwrap()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `weir serve` child process, killed when dropped (a failing test
/// leaves no server behind).
pub struct Server {
    pub child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `weir serve` on `root`'s data, contracts and weir.toml, and waits
/// until it says it is serving.
pub fn start(root: &Path, port: u16) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(["serve", "--data"])
        .arg(root.join("data"))
        .arg("--contracts")
        .arg(root.join("contracts"))
        .arg("--config")
        .arg(root.join("weir.toml"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the line that says it is serving.
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !sent && line.contains("serving http://") {
                let _ = tx.send(Ok(()));
                sent = true;
            } else if !sent {
                let _ = tx.send(Err(line));
            }
        }
    });
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(())) => return Server { child },
            Ok(Err(line)) if line.contains("cut") || line.contains("created Kafka topic") => continue,
            Ok(Err(line)) => panic!("weir serve said: {line}"),
            Err(_) => panic!("weir serve did not start"),
        }
    }
}
