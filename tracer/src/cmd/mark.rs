//! Explicit phase marks: `faultscope mark LABEL` talks to a running
//! `faultscope record` over a Unix socket in /run/faultscope/.
//!
//! A recorder killed by SIGKILL leaves its socket behind. A socket is
//! stale when no process has it bound (it is not in /proc/net/unix) and a
//! connection to it is refused; stale sockets are removed by `mark` and at
//! the start of every faultscope run as root, so that a reused pid is never
//! taken for a recorder.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::{fs::FileTypeExt as _, net::UnixStream},
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};
use tokio::net::UnixListener;

use crate::{error::Refusal, term::safe};

pub const SOCKET_DIR: &str = "/run/faultscope";

pub fn socket_path(recorder_pid: u32) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("record-{recorder_pid}.sock"))
}

/// A recorder's listening socket (in a root-only directory), removed when
/// dropped: at the end of the run, on an error and on a panic.
pub struct Socket {
    pub listener: UnixListener,
    /// Where it is bound now.
    path: PathBuf,
}

impl Socket {
    /// Binds the socket before anything is attached, so that a run that
    /// cannot listen for marks (a read-only /run) is refused before it
    /// starts a command; under a name `mark` does not look for until
    /// [`Socket::publish`].
    pub fn bind(recorder_pid: u32) -> Result<Socket> {
        use std::os::unix::fs::DirBuilderExt;
        let cannot = |what: &Path, e: std::io::Error| {
            Refusal::new(format!("cannot listen for phase marks at {}: {e}", what.display()))
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(SOCKET_DIR)
            .map_err(|e| cannot(Path::new(SOCKET_DIR), e))?;
        let path = socket_path(recorder_pid).with_extension("starting");
        // Ours by pid: whatever is there was left by an earlier process.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| cannot(&path, e))?;
        Ok(Socket { listener, path })
    }

    /// Gives the socket the name `mark` finds, once the run is attached.
    pub fn publish(&mut self, recorder_pid: u32) -> Result<()> {
        let name = socket_path(recorder_pid);
        std::fs::rename(&self.path, &name).with_context(|| format!("naming {}", name.display()))?;
        self.path = name;
        Ok(())
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The paths of the Unix sockets bound now (in this network namespace).
fn bound_sockets() -> Vec<String> {
    std::fs::read_to_string("/proc/net/unix")
        .map(|t| t.lines().skip(1).filter_map(|l| l.split_whitespace().nth(7)).map(String::from).collect())
        .unwrap_or_default()
}

/// Whether nobody serves the socket at `path`: not bound, and a connection
/// is refused (a recorder in another network namespace would accept it).
fn is_stale(path: &Path, bound: &[String]) -> bool {
    if bound.iter().any(|b| Path::new(b) == path) {
        return false;
    }
    matches!(UnixStream::connect(path), Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED))
}

/// Removes the recorder sockets nobody serves; returns their paths.
pub fn remove_stale_sockets() -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(SOCKET_DIR) else { return Vec::new() };
    let bound = bound_sockets();
    let mut removed = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let ours = name.starts_with("record-") && (name.ends_with(".sock") || name.ends_with(".starting"));
        if ours && e.file_type().is_ok_and(|t| t.is_socket()) && is_stale(&e.path(), &bound) {
            let _ = std::fs::remove_file(e.path());
            removed.push(e.path());
        }
    }
    removed
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

/// Running recorders, by their sockets (stale ones removed first).
fn recorders() -> Vec<(u32, PathBuf)> {
    remove_stale_sockets();
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
    // The sockets are root's: as another user, "no recorder" would be a lie.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Refusal::new(format!(
            "faultscope mark needs root: the recorders' sockets are in {SOCKET_DIR}, which only root can read"
        ))
        .into());
    }
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
    let reply = safe(reply.trim_end());
    match reply.strip_prefix("ok ") {
        Some(name) => {
            println!("phase {name}");
            Ok(0)
        }
        None => Err(Refusal::new(format!("the recorder refused the mark: {reply}")).into()),
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
