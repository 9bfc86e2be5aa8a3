//! Children that a target forked before faultscope attached and that still
//! share its memory (copy-on-write, not exec'd yet): Redis' BGSAVE child
//! when `record -p` attaches during the save. The kernel learns of them at
//! attach, so that their exit or exec starts a phase like any fork's.

use std::fs;

use super::target;

/// Fields of /proc/PID/stat that describe the address space's layout
/// (proc(5) numbers): startcode, endcode, startstack, start_data, end_data,
/// start_brk, arg_start, arg_end, env_start, env_end. `fork` copies them;
/// `exec` sets them anew (randomized, where ASLR is on).
const LAYOUT_FIELDS: [usize; 10] = [26, 27, 28, 45, 46, 47, 48, 49, 50, 51];

type Layout = [u64; LAYOUT_FIELDS.len()];

/// The address-space layout of a process, None when unreadable (gone, a
/// kernel thread, or hidden from us).
fn layout(pid: u32) -> Option<Layout> {
    // Bytes: the comm in it need not be UTF-8 (the fields after it are).
    let stat = fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_layout(&String::from_utf8_lossy(&stat))
}

fn parse_layout(stat: &str) -> Option<Layout> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut out = [0u64; LAYOUT_FIELDS.len()];
    for (o, n) in out.iter_mut().zip(LAYOUT_FIELDS) {
        *o = fields.get(n - 3)?.parse().ok()?;
    }
    out.iter().any(|v| *v != 0).then_some(out)
}

/// The processes `pid`'s threads forked: /proc/PID/task/*/children
/// (CONFIG_PROC_CHILDREN), else every process whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut readable = false;
    if let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(list) = fs::read_to_string(t.path().join("children")) {
                readable = true;
                out.extend(list.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
            }
        }
    }
    if !readable {
        out = scan_ppid(pid);
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn scan_ppid(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|c| {
            let stat = fs::read(format!("/proc/{c}/stat")).unwrap_or_default();
            let stat = String::from_utf8_lossy(&stat);
            let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse().ok());
            ppid == Some(pid)
        })
        .collect()
}

/// Whether `child` still runs in a copy of `parent`'s address space: it
/// runs, it has not exec'd (the same executable, the same layout). A child
/// that exec'd the same executable with ASLR off would look the same.
pub fn shares_memory(parent: u32, child: u32) -> bool {
    let exe = |p: u32| fs::read_link(format!("/proc/{p}/exe")).ok();
    !target::is_gone(child)
        && layout(child).is_some()
        && layout(child) == layout(parent)
        && exe(child).is_some()
        && exe(child) == exe(parent)
}

/// The children of `parent` that still share its memory.
pub fn sharing_memory(parent: u32) -> Vec<u32> {
    children_of(parent).into_iter().filter(|&c| shares_memory(parent, c)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fields_of_a_stat_line() {
        // A comm with spaces and a parenthesis, then fields 3..52.
        let mut fields: Vec<String> = vec!["S".into()];
        fields.extend((4..=52).map(|n| n.to_string()));
        let stat = format!("123 (a (b) c) {}", fields.join(" "));
        assert_eq!(parse_layout(&stat), Some([26, 27, 28, 45, 46, 47, 48, 49, 50, 51]));
        // A kernel thread: all zero.
        let zero = format!("2 (kthreadd) S {}", vec!["0"; 49].join(" "));
        assert_eq!(parse_layout(&zero), None);
        assert_eq!(parse_layout("1 (x) S 0 1"), None);
    }

    #[test]
    fn this_process_has_a_layout() {
        assert!(layout(std::process::id()).is_some());
        assert!(shares_memory(std::process::id(), std::process::id()));
    }

    #[test]
    fn a_forked_child_shares_and_an_exec_does_not() {
        let me = std::process::id();
        // SAFETY: the child only calls pause() until killed.
        let forked = unsafe { libc::fork() };
        assert!(forked >= 0);
        if forked == 0 {
            loop {
                unsafe { libc::pause() };
            }
        }
        let forked = forked as u32;
        let mut exec = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        let kids = children_of(me);
        assert!(kids.contains(&forked) && kids.contains(&exec.id()), "{kids:?}");
        assert!(shares_memory(me, forked), "a forked child shares until it execs");
        assert!(!shares_memory(me, exec.id()), "an exec'd child shares nothing");
        assert!(sharing_memory(me).contains(&forked));
        unsafe {
            libc::kill(forked as i32, libc::SIGKILL);
        }
        // A zombie shares nothing either.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!shares_memory(me, forked));
        unsafe { libc::waitpid(forked as i32, std::ptr::null_mut(), 0) };
        exec.kill().unwrap();
        exec.wait().unwrap();
        assert!(!children_of(me).contains(&forked));
    }
}
