//! The kernel stage: the probe table (`probes`), which classes it makes
//! measurable here (`classes`), loading and attaching the eBPF object
//! (`session`), and, in this file, what the running kernel offers: tracefs,
//! kallsyms, the kprobe PMU, BTF, lockdown. Read once at start-up; nothing
//! here is on the fault path.

pub mod btf;
pub mod classes;
pub mod drops;
pub mod footprint;
pub mod latency;
pub mod probes;
pub mod prog_info;
pub mod session;

use std::{
    collections::{BTreeSet, HashMap},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};

use crate::error::Refusal;

pub const TRACEFS_CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];
pub const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe/type";
pub const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Finds tracefs, mounting it at /sys/kernel/tracing when it is not mounted
/// (as perf and bpftrace do). Refuses when it cannot be read.
pub fn tracefs() -> Result<PathBuf, Refusal> {
    for c in TRACEFS_CANDIDATES {
        let p = Path::new(c);
        if p.join("events").is_dir() {
            return readable(p);
        }
    }
    let p = Path::new(TRACEFS_CANDIDATES[0]);
    let src = c"nodev";
    let dst = c"/sys/kernel/tracing";
    let fstype = c"tracefs";
    // SAFETY: plain mount(2) with static C strings.
    let rc = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc == 0 && p.join("events").is_dir() {
        return readable(p);
    }
    Err(Refusal::new(format!(
        "tracefs is not mounted and could not be mounted at /sys/kernel/tracing ({}); \
         mount it with: mount -t tracefs nodev /sys/kernel/tracing",
        std::io::Error::last_os_error()
    )))
}

fn readable(p: &Path) -> Result<PathBuf, Refusal> {
    fs::read_dir(p.join("events")).map_err(|e| {
        Refusal::new(format!("tracefs at {} is not readable ({e}); run faultscope as root", p.display()))
    })?;
    Ok(p.to_path_buf())
}

pub fn require_btf() -> Result<(), Refusal> {
    if Path::new(BTF_VMLINUX).exists() {
        Ok(())
    } else {
        Err(Refusal::new(format!(
            "{BTF_VMLINUX} is missing: faultscope needs a kernel built with CONFIG_DEBUG_INFO_BTF \
             (to check the types its probes read)"
        )))
    }
}

pub fn require_root() -> Result<(), Refusal> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Refusal::new(
            "faultscope needs root (CAP_BPF, CAP_PERFMON and tracefs access): run it with sudo",
        ));
    }
    let caps = effective_caps().unwrap_or(u64::MAX);
    let has = |c: u32| caps & (1u64 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        return Err(Refusal::new(format!(
            "faultscope runs as root without CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN): effective \
             capabilities {caps:#x}; give them back (a container: --cap-add BPF --cap-add PERFMON)"
        )));
    }
    // Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK: lift it as
    // bcc does (root may), so that a low limit is not a map-creation error.
    let inf = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: setrlimit reads a valid rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &inf) };
    Ok(())
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// This process's effective capability set (`CapEff` in /proc/self/status).
fn effective_caps() -> Option<u64> {
    let s = fs::read_to_string("/proc/self/status").ok()?;
    let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

pub fn has_kprobe_pmu() -> bool {
    Path::new(KPROBE_PMU).exists()
}

/// The kernel's lockdown mode, if the securityfs file is readable
/// ("confidentiality" forbids reading kernel memory from BPF).
pub fn lockdown() -> Option<String> {
    let s = fs::read_to_string("/sys/kernel/security/lockdown").ok()?;
    let start = s.find('[')? + 1;
    let end = s[start..].find(']')? + start;
    Some(s[start..end].to_string())
}

/// CLOCK_MONOTONIC in ns: the clock of bpf_ktime_get_ns, so user-space
/// marks and kernel events share one time line.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime fills ts.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One instant on both clocks: the kernel's times (CLOCK_MONOTONIC, as
/// `bpf_ktime_get_ns` reads it) become wall-clock times through it.
#[derive(Clone, Copy, Debug)]
pub struct ClockAnchor {
    pub unix_ns: u64,
    pub monotonic_ns: u64,
}

impl ClockAnchor {
    pub fn now() -> ClockAnchor {
        let monotonic_ns = monotonic_ns();
        let unix_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        ClockAnchor { unix_ns, monotonic_ns }
    }
}

pub fn release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Text symbols of /proc/kallsyms, by name (names are listed to root even
/// when kptr_restrict hides addresses): those of the functions asked for and
/// their compiler clones only. A kernel lists about 120,000 symbols, and
/// their text is most of a start-up under emulation: each line is looked at
/// as bytes, and only a kept name is copied.
#[derive(Default)]
pub struct Kallsyms {
    names: HashMap<String, ()>,
}

impl Kallsyms {
    /// The symbols of `wanted` functions and their clones (`f.isra.0`).
    pub fn load(wanted: &BTreeSet<String>) -> Result<Kallsyms> {
        let text = fs::read("/proc/kallsyms").context("reading /proc/kallsyms")?;
        Ok(Kallsyms::parse(&text, |f| wanted.contains(f)))
    }

    /// The text symbols of `text` whose name, up to its first `.`, `keep`
    /// takes.
    pub fn parse(text: &[u8], keep: impl Fn(&str) -> bool) -> Kallsyms {
        let mut names = HashMap::new();
        for line in text.split(|&b| b == b'\n') {
            let mut it = line.split(|b| b.is_ascii_whitespace()).filter(|f| !f.is_empty());
            let (Some(_addr), Some(kind), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            if !matches!(kind, b"t" | b"T" | b"w" | b"W") {
                continue;
            }
            let base = name.split(|&b| b == b'.').next().unwrap_or(name);
            if !std::str::from_utf8(base).is_ok_and(&keep) {
                continue;
            }
            if let Ok(name) = std::str::from_utf8(name) {
                names.insert(name.to_string(), ());
            }
        }
        Kallsyms { names }
    }

    /// The symbol to attach to for `func`: the function itself, or a
    /// compiler clone of it (`func.isra.0`, `func.constprop.0`, ...).
    pub fn resolve(&self, func: &str) -> Option<String> {
        if self.names.contains_key(func) {
            return Some(func.to_string());
        }
        let prefix = format!("{func}.");
        let mut clones: Vec<&String> = self
            .names
            .keys()
            .filter(|n| {
                n.strip_prefix(&prefix)
                    .is_some_and(|rest| rest.starts_with("isra") || rest.starts_with("constprop"))
            })
            .collect();
        clones.sort();
        clones.first().map(|s| s.to_string())
    }
}

/// Functions kprobes refuse (`/sys/kernel/debug/kprobes/blacklist`), when
/// debugfs is mounted.
pub fn kprobe_blacklist() -> Vec<String> {
    fs::read_to_string("/sys/kernel/debug/kprobes/blacklist")
        .map(|s| s.lines().filter_map(|l| l.split_whitespace().nth(1).map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Offsets of a tracepoint's fields, from its tracefs `format` file.
pub fn tracepoint_fields(tracefs: &Path, category: &str, name: &str) -> Result<HashMap<String, usize>> {
    let path = tracefs.join("events").join(category).join(name).join("format");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_format(&text).with_context(|| format!("parsing {}", path.display()))
}

pub fn parse_format(text: &str) -> Result<HashMap<String, usize>> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut decl = None;
        let mut offset = None;
        for part in rest.split(';') {
            let part = part.trim();
            if let Some(o) = part.strip_prefix("offset:") {
                offset = Some(o.parse::<usize>().context("bad offset")?);
            } else if decl.is_none() && !part.is_empty() {
                decl = Some(part);
            }
        }
        let (Some(decl), Some(offset)) = (decl, offset) else {
            bail!("malformed field line: {line}");
        };
        // "unsigned long error_code" / "char comm[16]"
        let name = decl.rsplit(' ').next().unwrap_or(decl).split('[').next().unwrap_or_default();
        out.insert(name.to_string(), offset);
    }
    if out.is_empty() {
        bail!("no fields");
    }
    Ok(out)
}

pub fn tracepoint_exists(tracefs: &Path, category: &str, name: &str) -> bool {
    tracefs.join("events").join(category).join(name).is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_offsets() {
        let f = "name: page_fault_user\nID: 190\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n\tfield:unsigned long address;\toffset:8;\tsize:8;\tsigned:0;\n\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;\n\tfield:unsigned long error_code;\toffset:24;\tsize:8;\tsigned:0;\n";
        let m = parse_format(f).unwrap();
        assert_eq!(m["address"], 8);
        assert_eq!(m["error_code"], 24);
        assert_eq!(m["comm"], 12);
        assert_eq!(m["common_type"], 0);
    }

    #[test]
    fn malformed_format_is_an_error() {
        assert!(parse_format("format:\n\tfield:int x;\tsize:4;\n").is_err());
        assert!(parse_format("garbage").is_err());
    }

    #[test]
    fn kallsyms_clones() {
        let k = Kallsyms::parse(
            b"ffff t do_wp_page\nffff t wp_page_copy.isra.0\nffff T handle_mm_fault\nffff d some_data\nffff t foo.cold\n",
            |_| true,
        );
        assert_eq!(k.resolve("do_wp_page").as_deref(), Some("do_wp_page"));
        assert_eq!(k.resolve("wp_page_copy").as_deref(), Some("wp_page_copy.isra.0"));
        assert_eq!(k.resolve("some_data"), None);
        assert_eq!(k.resolve("foo"), None);
        assert_eq!(k.resolve("missing"), None);
    }

    #[test]
    fn kallsyms_keeps_the_wanted_and_their_clones() {
        let wanted: BTreeSet<String> = ["wp_page_copy".to_string()].into();
        let k = Kallsyms::parse(
            b"ffff t do_wp_page\nffff t wp_page_copy.isra.0\nffff t wp_page_copy_x\n\n bad\nffff \xff\xfe t\n",
            |f| wanted.contains(f),
        );
        assert_eq!(k.resolve("wp_page_copy").as_deref(), Some("wp_page_copy.isra.0"));
        assert_eq!(k.resolve("do_wp_page"), None);
        assert_eq!(k.names.len(), 1);
    }
}
