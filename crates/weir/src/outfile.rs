//! Output files that appear whole or not at all: written beside the target
//! under a temporary name, flushed and synced, then renamed into place.
//! A destination that exists and is not a regular file (`/dev/null`, a
//! named pipe, a terminal) is written directly: renaming over it would
//! replace the device or pipe with a file.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

pub enum Sink {
    Stdout(BufWriter<io::Stdout>),
    File { out: BufWriter<File>, tmp: PathBuf, dest: PathBuf },
    Direct { out: BufWriter<File>, dest: PathBuf },
    Discard,
}

impl Sink {
    /// `None` or `-` is standard output.
    pub fn create(path: Option<&Path>) -> Result<Sink> {
        match path {
            None => Ok(Sink::Stdout(BufWriter::with_capacity(1 << 16, io::stdout()))),
            Some(p) if p == Path::new("-") => Ok(Sink::Stdout(BufWriter::with_capacity(1 << 16, io::stdout()))),
            Some(dest) if std::fs::metadata(dest).is_ok_and(|m| !m.is_file() && !m.is_dir()) => {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(dest)
                    .with_context(|| format!("cannot write {}: check that it is writable", dest.display()))?;
                Ok(Sink::Direct { out: BufWriter::with_capacity(1 << 16, file), dest: dest.to_owned() })
            }
            Some(dest) => {
                let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
                let tmp = dest.with_file_name(format!(".{name}.weir-tmp-{}", std::process::id()));
                let file = File::create(&tmp).with_context(|| {
                    format!("cannot write {}: check that its folder exists and is writable", dest.display())
                })?;
                Ok(Sink::File { out: BufWriter::with_capacity(1 << 16, file), tmp, dest: dest.to_owned() })
            }
        }
    }

    pub fn write(&mut self, text: &str) -> Result<()> {
        let result = match self {
            Sink::Stdout(out) => out.write_all(text.as_bytes()),
            Sink::File { out, .. } | Sink::Direct { out, .. } => out.write_all(text.as_bytes()),
            Sink::Discard => Ok(()),
        };
        result.with_context(|| format!("cannot write {}", self.name()))
    }

    fn name(&self) -> String {
        match self {
            Sink::Stdout(_) => "standard output".into(),
            Sink::File { dest, .. } | Sink::Direct { dest, .. } => dest.display().to_string(),
            Sink::Discard => "nothing".into(),
        }
    }

    /// Flushes, syncs and moves the file into place.
    pub fn commit(mut self) -> Result<()> {
        match &mut self {
            Sink::Stdout(out) => out.flush().context("cannot write standard output"),
            Sink::Discard => Ok(()),
            Sink::Direct { out, dest } => out.flush().with_context(|| format!("cannot write {}", dest.display())),
            Sink::File { out, tmp, dest } => {
                let done =
                    out.flush().and_then(|()| out.get_ref().sync_all()).and_then(|()| std::fs::rename(&*tmp, &*dest));
                done.map_err(|e| anyhow::anyhow!("cannot write {}: {e}", dest.display()))?;
                // Renamed: nothing left for Drop to remove.
                *tmp = PathBuf::new();
                Ok(())
            }
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        // A sink dropped without commit leaves no partial file behind.
        if let Sink::File { tmp, .. } = self {
            if !tmp.as_os_str().is_empty() {
                let _ = std::fs::remove_file(&*tmp);
            }
        }
    }
}
