//! Explicit phase marks: `faultscope mark LABEL` talks to a running
//! `faultscope record` over a Unix socket in /run/faultscope/.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::net::UnixListener;

use crate::error::Refusal;

pub const SOCKET_DIR: &str = "/run/faultscope";

pub fn socket_path(recorder_pid: u32) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("record-{recorder_pid}.sock"))
}

/// Listens on the recorder's socket (root-only directory).
pub fn listen(path: &Path) -> Result<UnixListener> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(SOCKET_DIR)?;
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))
}

/// Signals a phase may be marked with.
pub fn parse_signal(s: &str) -> Result<i32, String> {
    match s.trim_start_matches("SIG").to_ascii_uppercase().as_str() {
        "USR1" => Ok(libc::SIGUSR1),
        "USR2" => Ok(libc::SIGUSR2),
        "HUP" => Ok(libc::SIGHUP),
        other => Err(format!("--mark-on-signal takes USR1, USR2 or HUP, not {other:?}")),
    }
}

/// A label is one printable line, without spaces at the ends.
pub fn parse_request(line: &str) -> Result<String, String> {
    let label = line.trim_end_matches('\n').strip_prefix("mark ").ok_or("expected: mark LABEL")?.trim();
    if label.is_empty() || label.len() > 64 || label.chars().any(|c| c.is_control()) {
        return Err("a label is 1 to 64 printable characters".into());
    }
    Ok(label.to_string())
}

/// Running recorders, by their sockets.
fn recorders() -> Vec<(u32, PathBuf)> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(SOCKET_DIR) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if let Some(pid) = name.strip_prefix("record-").and_then(|s| s.strip_suffix(".sock")) {
                if let Ok(pid) = pid.parse::<u32>() {
                    if Path::new(&format!("/proc/{pid}")).exists() {
                        out.push((pid, e.path()));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

/// `faultscope mark [--recorder PID] LABEL`.
pub fn mark(label: &str, recorder: Option<u32>) -> Result<i32> {
    parse_request(&format!("mark {label}")).map_err(Refusal::new)?;
    let all = recorders();
    let path = match recorder {
        Some(pid) => all
            .iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, path)| path.clone())
            .ok_or_else(|| Refusal::new(format!("no faultscope record with pid {pid} is running")))?,
        None => match all.as_slice() {
            [] => return Err(Refusal::new("no faultscope record is running").into()),
            [(_, path)] => path.clone(),
            _ => {
                let pids: Vec<String> = all.iter().map(|(p, _)| p.to_string()).collect();
                return Err(Refusal::new(format!(
                    "several faultscope records are running ({}); pass --recorder PID",
                    pids.join(", ")
                ))
                .into());
            }
        },
    };
    let mut s = UnixStream::connect(&path).with_context(|| format!("connecting to {}", path.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(format!("mark {label}\n").as_bytes())?;
    let mut reply = String::new();
    BufReader::new(s).read_line(&mut reply)?;
    match reply.trim_end().strip_prefix("ok ") {
        Some(name) => {
            println!("phase {name}");
            Ok(0)
        }
        None => Err(Refusal::new(format!("the recorder refused the mark: {}", reply.trim_end())).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests() {
        assert_eq!(parse_request("mark BGSAVE done\n").unwrap(), "BGSAVE done");
        assert!(parse_request("mark \n").is_err());
        assert!(parse_request("hello\n").is_err());
        assert!(parse_request(&format!("mark {}\n", "x".repeat(65))).is_err());
    }

    #[test]
    fn signals() {
        assert_eq!(parse_signal("USR1"), Ok(libc::SIGUSR1));
        assert_eq!(parse_signal("SIGUSR2"), Ok(libc::SIGUSR2));
        assert!(parse_signal("KILL").is_err());
    }
}
