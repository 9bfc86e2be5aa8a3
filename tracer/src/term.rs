//! What reaches the terminal: writes to stdout and stderr that never panic,
//! and foreign strings (process names, paths, kernel logs) made safe to
//! print.

use std::{fmt::Write as _, io::Write as _};

/// Writes to stdout and flushes. An error means stdout is gone (EPIPE from
/// `| head`, or a full disk): the caller ends its run as if interrupted and
/// still writes its report, where `print!` would panic.
pub fn out(s: &str) -> std::io::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes()).and_then(|()| o.flush())
}

/// Whether stdout's reader is gone (a pipe whose read end was closed,
/// `| head -1`), found without writing: an interval with nothing to print
/// must still end the run then.
pub fn stdout_gone() -> bool {
    let mut fd = libc::pollfd { fd: 1, events: 0, revents: 0 };
    // SAFETY: one pollfd, no wait.
    unsafe { libc::poll(&mut fd, 1, 0) == 1 && fd.revents & (libc::POLLERR | libc::POLLHUP) != 0 }
}

/// `record --quiet`: the informational lines are left out.
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// From now on [`say`] says nothing (errors still go out: [`error`]).
pub fn quiet() {
    QUIET.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// An informational line on stderr, best effort: a closed stderr is no
/// reason to lose a run (`eprintln!` would panic). Nothing under
/// `--quiet`.
pub fn say(line: &str) {
    if !QUIET.load(std::sync::atomic::Ordering::Relaxed) {
        error(line);
    }
}

/// A line on stderr that `--quiet` keeps: an error. On a terminal it is
/// wrapped to the terminal's width.
pub fn error(line: &str) {
    let text = match stderr_width() {
        Some(w) => wrap(line, w),
        None => line.to_string(),
    };
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// The width of the terminal stderr is, if it is one.
fn stderr_width() -> Option<usize> {
    // SAFETY: isatty and TIOCGWINSZ only read the descriptor's state into
    // the winsize given.
    unsafe {
        if libc::isatty(2) != 1 {
            return None;
        }
        let mut ws: libc::winsize = std::mem::zeroed();
        (libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0).then_some(ws.ws_col as usize)
    }
}

/// `line` broken at spaces into lines of at most `width` characters (a
/// word longer than that keeps its own line), each continuation indented
/// two more than the line. Lines that fit are left alone.
pub fn wrap(line: &str, width: usize) -> String {
    let mut out = String::new();
    for l in line.split('\n') {
        if !out.is_empty() {
            out.push('\n');
        }
        if l.chars().count() <= width {
            out.push_str(l);
            continue;
        }
        let indent = l.len() - l.trim_start().len();
        let cont = " ".repeat(indent + 2);
        let mut cur = l[..indent].to_string();
        let mut at_start = true;
        for word in l[indent..].split(' ') {
            let len = cur.chars().count();
            if !at_start && len + 1 + word.chars().count() > width {
                out.push_str(&cur);
                out.push('\n');
                cur = cont.clone();
                at_start = true;
            }
            if !at_start {
                cur.push(' ');
            }
            cur.push_str(word);
            at_start = false;
        }
        out.push_str(&cur);
    }
    out
}

/// Escapes control characters (C0, DEL, C1) of a string that came from
/// someone else (a process name, a path, a report's field) before it goes to
/// a terminal.
pub fn safe(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

/// [`safe`] for text of several lines (a verifier log): newlines are kept.
pub fn safe_lines(s: &str) -> String {
    s.split('\n').map(safe).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_wrap_at_the_width_and_short_ones_stay() {
        assert_eq!(wrap("short line", 80), "short line");
        let w = wrap("faultscope: not measurable here: reuse, copy, wp_shared", 24);
        assert_eq!(w, "faultscope: not\n  measurable here:\n  reuse, copy, wp_shared");
        assert!(w.lines().all(|l| l.chars().count() <= 24), "{w}");
        // A word longer than the width keeps its line whole.
        assert_eq!(wrap("a /very/long/path/name b", 8), "a\n  /very/long/path/name\n  b");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(safe("a\x1b[2Jb\n\u{9b}c"), "a\\x1b[2Jb\\x0a\\x9bc");
        assert_eq!(safe("redis-server"), "redis-server");
        assert_eq!(safe_lines("a\x1bb\nc\r"), "a\\x1bb\nc\\x0d");
    }
}
