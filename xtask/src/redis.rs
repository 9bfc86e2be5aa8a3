//! `cargo xtask redis`: Redis end to end. The host's own redis-server (Debian
//! 7.0.15) runs in a guest of the generic Debian 6.12 amd64 kernel, with the
//! host's `/` over virtio-9p (`vm::virtfs_host_root`) and a chroot into it
//! (`xtask/guest/redis.sh`). The -cloud kernels the other guest tests boot
//! have no 9p; the generic one has it as modules (netfs, 9pnet,
//! 9pnet_virtio, 9p, with virtio-pci built in), which are taken from its
//! .deb, decompressed here and `insmod`ed in dependency order
//! (`vm::kernel_modules`).
//!
//! Two runs, each on a fresh redis-server (exec'd while tracing is on: the
//! oracle counts a process from its exec; `--save ''`, no AOF, a tmpfs
//! `--dir`) loaded with `keys` values of `value_size` bytes by one Lua
//! script (in-process like `DEBUG POPULATE`, which would need
//! `--enable-debug-command yes`, but under redis-benchmark's key names
//! `key:%012d`, so that its `-r keys` SETs overwrite the loaded keys rather
//! than add new ones):
//!
//! 1. BGSAVE and wait for its end, then `faultscope record -p` and SETs
//!    from redis-benchmark: the pages the fork write-protected are reused.
//! 2. `faultscope record -p` first, then BGSAVE and SETs: the automatic
//!    phases `fork#1 child-alive` and `fork#1 after-child-exit` must match
//!    the BGSAVE Redis reports.
//!
//! In both, faultscope's counts for redis-server must equal the tracefs
//! oracle's for its tgid in the oracle phase "attach" (from faultscope's
//! "attach" trace marker to its "detach" one).

use std::{collections::BTreeMap, fmt::Write as _, time::Duration};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use crate::{
    foundation::{oracle_unknown, ORACLE_COLUMNS},
    kernels, matrix, root, setup, vm,
};

/// Modules the guest needs for `mount -t 9p` over virtio (their
/// dependencies, netfs and 9pnet, are found from their modinfo).
const MODULES: &[&str] = &["9pnet_virtio", "9p"];

/// Resolution of `/proc/uptime` (10 ms), which times the guest's BGSAVE.
const UPTIME_RES_NS: u64 = 10_000_000;

pub fn run(keys: u64, value_size: u64, requests: u64) -> Result<()> {
    setup::setup()?;
    let k = kernels::GENERIC_6_12_AMD64;
    let vmlinuz = kernels::fetch(k)?;
    let modules = kernels::modules_dir(k)?;
    let bin = vm::build_faultscope(k.arch)?;
    let dir = root().join("target/vm/redis");
    std::fs::create_dir_all(&dir)?;
    let mods = vm::kernel_modules(&modules, MODULES, &dir)?;
    let names: Vec<&str> = mods
        .iter()
        .filter_map(|(_, g)| g.strip_prefix("/modules/").and_then(|n| n.strip_suffix(".ko")))
        .collect();
    let env = [
        ("MODULES", names.join(" ")),
        ("KEYS", keys.to_string()),
        ("VALUE_SIZE", value_size.to_string()),
        ("REQUESTS", requests.to_string()),
    ];
    let cpio = vm::initramfs_with(&dir, k.arch, &bin, "redis.sh", &env, &mods)?;
    let run = vm::boot_with(k, &vmlinuz, &cpio, &dir, Duration::from_secs(600), &vm::virtfs_host_root())?;
    if let Some(l) = run.console.lines().find(|l| l.starts_with("@@FS-FAIL ")) {
        bail!("the redis guest failed: {l}\nconsole tail:\n{}", vm::tail(&run.console, 60));
    }
    println!(
        "{} on {} (modules {}), {keys} keys of {value_size} bytes, {requests} SETs per run",
        run.marker("REDIS-VERSION", "Redis").map(|v| format!("Redis {v}")).unwrap_or("Redis ?".into()),
        k.name,
        names.join(", ")
    );
    let mut failures = Vec::new();
    for (name, what) in [
        ("run1", "attach after BGSAVE (the child has exited), then SETs"),
        ("run2", "attach, then BGSAVE, then SETs"),
    ] {
        match check_run(&run, name, what) {
            Ok(r) => {
                print!("{}", r.table);
                failures.extend(r.failures);
            }
            Err(e) => failures.push(format!("{name}: {e:#}")),
        }
    }
    println!("guest {} booted, ran both runs and powered off in {:.1}s", k.name, run.wall.as_secs_f64());
    if !failures.is_empty() {
        bail!("redis test failed:\n  {}", failures.join("\n  "));
    }
    Ok(())
}

struct RunResult {
    table: String,
    failures: Vec<String>,
}

/// `key:value` lines of an INFO reply.
fn parse_info(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// "123.45" (seconds, from /proc/uptime) in ns.
fn uptime_ns(s: &str) -> Option<u64> {
    let (sec, frac) = s.split_once('.').unwrap_or((s, "0"));
    let frac = format!("{frac:0<9}");
    Some(sec.parse::<u64>().ok()? * 1_000_000_000 + frac.get(..9)?.parse::<u64>().ok()?)
}

fn ms(ns: u64) -> String {
    format!("{:.1} ms", ns as f64 / 1e6)
}

fn check_run(run: &vm::GuestRun, name: &str, what: &str) -> Result<RunResult> {
    let mut fails = Vec::new();
    let rc = run.marker("RC", name).unwrap_or_default();
    if rc != "0" {
        bail!("faultscope exited with {rc:?}:\n{}", run.section(&format!("{name}.out")).unwrap_or(""));
    }
    let pid: u64 = run.marker("PID", name).and_then(|p| p.parse().ok()).context("no redis-server pid")?;
    let report: Value =
        serde_json::from_str(run.section(&format!("{name}.fs.json"))?).context("faultscope JSON")?;
    let p = crate::foundation::report_process(&report, pid)?;
    if report["mode"] != "kprobe" {
        fails.push(format!("{name}: mode is {}, not kprobe", report["mode"]));
    }
    if p["comm"] != "redis-server" {
        fails.push(format!("{name}: pid {pid} is {}, not redis-server", p["comm"]));
    }
    let oracle = matrix::parse_oracle(run.section(&format!("{name}.oracle"))?);
    let theirs = oracle.get(&(pid, "attach".to_string())).with_context(|| {
        format!("redis-server: {}", matrix::oracle_gap(run, name, &format!("{name}.oracle"), pid, "attach"))
    })?;
    let count = |ph: &Value, class: &str| ph["classes"][class]["count"].as_u64();

    let mut t = String::new();
    let _ = writeln!(t, "=== {name}: {what} ===");
    let _ = writeln!(
        t,
        "  redis-server pid {pid}; {}; redis-benchmark: {}",
        run.marker("POPULATE", name).unwrap_or_default(),
        run.marker("BENCH", name).unwrap_or_default()
    );
    let _ = writeln!(t, "  {:<20} {:>10} {:>10}", "redis-server", "faultscope", "oracle");
    for (class, key, events) in ORACLE_COLUMNS {
        let f = count(p, class);
        // Unknown to the oracle (a refused event) is not 0: then faultscope
        // must say "not measurable" too.
        let o = if oracle_unknown(run, events).is_empty() { theirs.get(key).copied() } else { None };
        let show = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        let _ = writeln!(t, "  {class:<20} {:>10} {:>10}", show(f), show(o));
        if f != o {
            fails.push(format!("{name}: {class}: faultscope {} != oracle {}", show(f), show(o)));
        }
    }
    let get = |c: &str| count(p, c).unwrap_or(0);
    let keys = run.marker("KEYS", name).unwrap_or_default();
    let mut expect = |t: &mut String, ok: bool, what: String| {
        let _ = writeln!(t, "  {} {what}", if ok { "ok  " } else { "FAIL" });
        if !ok {
            fails.push(format!("{name}: {what}"));
        }
    };
    let loaded = run.marker("POPULATE", name).unwrap_or_default();
    expect(&mut t, loaded == format!("loaded dbsize={keys}"), format!("{keys} keys loaded: {loaded:?}"));
    expect(
        &mut t,
        get("reuse") + get("copy") > 0,
        format!("the SETs' write-protect faults show: reuse {} + copy {} > 0", get("reuse"), get("copy")),
    );
    let lost = &report["drops"]["lost_kretprobe_returns"];
    expect(&mut t, lost.as_u64() == Some(0), format!("kretprobe returns lost: {lost}"));
    for (tag, want) in [("KPROBES-LEFT", "0"), ("OVERRUN", "0")] {
        let v = run.marker(tag, name).unwrap_or_default();
        expect(&mut t, v == want, format!("{tag} = {v}"));
    }

    let phases = p["phases"].as_array().context("no phases")?;
    let _ = writeln!(t, "  faultscope phases:");
    for ph in phases {
        let (s, e) = (ph["start_ns"].as_u64().unwrap_or(0), ph["end_ns"].as_u64().unwrap_or(0));
        let _ = writeln!(
            t,
            "    {:<28} {:>10}  faults {:>6} wp {:>6} reuse {:>6} copy {:>6} spurious {:>3}",
            ph["name"].as_str().unwrap_or("?"),
            ms(e.saturating_sub(s)),
            count(ph, "faults").unwrap_or(0),
            count(ph, "wp_faults").unwrap_or(0),
            count(ph, "reuse").unwrap_or(0),
            count(ph, "copy").unwrap_or(0),
            count(ph, "spurious").unwrap_or(0),
        );
    }
    // The phases split the process' counts: their sums are its totals.
    for class in ["faults", "wp_faults", "reuse", "copy"] {
        let sum: u64 = phases.iter().filter_map(|ph| count(ph, class)).sum();
        if sum != get(class) {
            expect(&mut t, false, format!("{class}: phases sum to {sum}, total {}", get(class)));
        }
    }
    let forks: Vec<&str> =
        phases.iter().filter_map(|ph| ph["name"].as_str()).filter(|n| n.starts_with("fork#")).collect();

    let bg = run.marker("BGSAVE", name).context("no BGSAVE marker")?;
    let bgw: Vec<&str> = bg.split_whitespace().collect();
    let (t0, t1) = match bgw.as_slice() {
        [a, b, ..] => (uptime_ns(a).context("BGSAVE t0")?, uptime_ns(b).context("BGSAVE t1")?),
        _ => bail!("bad BGSAVE marker {bg:?}"),
    };
    let reply = bgw.get(2..).map(|w| w.join(" ")).unwrap_or_default();
    expect(&mut t, reply == "Background saving started", format!("BGSAVE replied {reply:?}"));

    if name == "run1" {
        let info = parse_info(run.section(&format!("{name}.info.after-bgsave"))?);
        let v = |k: &str| info.get(k).map(String::as_str).unwrap_or("?");
        let _ = writeln!(
            t,
            "  Redis INFO before attaching: rdb_bgsave_in_progress {}, rdb_last_bgsave_status {}, latest_fork_usec {}, rdb_last_cow_size {}, total_forks {}",
            v("rdb_bgsave_in_progress"),
            v("rdb_last_bgsave_status"),
            v("latest_fork_usec"),
            v("rdb_last_cow_size"),
            v("total_forks")
        );
        expect(
            &mut t,
            v("rdb_bgsave_in_progress") == "0" && v("rdb_last_bgsave_status") == "ok",
            "BGSAVE had ended, ok, before faultscope attached".into(),
        );
        // The child was reaped before faultscope attached: nothing forked or
        // exited during the trace.
        expect(&mut t, forks.is_empty(), format!("no fork phase while attached after the BGSAVE: {forks:?}"));
        // Pages written after a fork whose child is gone are the parent's
        // alone: 4K anonymous pages are reused, not copied.
        expect(
            &mut t,
            get("reuse") > get("copy"),
            format!(
                "reuse {} > copy {} (child gone: write-protected pages are reused)",
                get("reuse"),
                get("copy")
            ),
        );
    } else {
        check_bgsave_phases(run, name, phases, &forks, (t0, t1), &mut t, &mut expect)?;
    }
    Ok(RunResult { table: t, failures: fails })
}

/// Run 2: the fork phases against Redis' own account of the BGSAVE.
///
/// What is compared, and why it holds:
/// - INFO `total_forks` read before faultscope attached and after it
///   detached differs by exactly 1, `rdb_saves` likewise, and Redis forked
///   for nothing else (`--save ''`, no AOF, no replicas). So exactly one
///   fork happened while faultscope was attached, and it was the BGSAVE's:
///   faultscope must show exactly `fork#1 child-alive` then `fork#1
///   after-child-exit`, and no other fork phase.
/// - The BGSAVE ended well (`rdb_last_bgsave_status:ok`,
///   `rdb_bgsave_in_progress:0`).
/// - Timing, on one clock: faultscope's phase times are CLOCK_MONOTONIC (BPF
///   ktime), the guest stamps BGSAVE with /proc/uptime (CLOCK_BOOTTIME,
///   equal to it in a guest that never suspends; 10 ms resolution). The fork
///   (task_newtask, inside the fork() Redis runs for the BGSAVE command)
///   cannot precede the command being sent (t0), and the child's exit
///   cannot follow the moment Redis reported it reaped (t1, when
///   `rdb_bgsave_in_progress` was first seen 0): t0 <= child-alive start,
///   child-alive end <= t1 (+ the clock's resolution).
/// - Redis times the save as `rdb_last_bgsave_time_sec` (whole seconds from
///   just after fork() returned to the reaping) and the fork as
///   `latest_fork_usec` (the whole fork() call, which contains the phase's
///   start): so the child-alive phase is shorter than
///   rdb_last_bgsave_time_sec + 1 s + latest_fork_usec. That bound is sound.
/// - The child-alive phase lasts at least latest_fork_usec: a plausibility
///   check, not a law (the phase starts late in fork(), after the page
///   tables were copied); it holds by orders of magnitude because the child
///   serializes the whole data set before it exits.
fn check_bgsave_phases(
    run: &vm::GuestRun,
    name: &str,
    phases: &[Value],
    forks: &[&str],
    (t0, t1): (u64, u64),
    t: &mut String,
    expect: &mut impl FnMut(&mut String, bool, String),
) -> Result<()> {
    let before = parse_info(run.section(&format!("{name}.info.before"))?);
    let after = parse_info(run.section(&format!("{name}.info.end"))?);
    let num = |m: &BTreeMap<String, String>, k: &str| m.get(k).and_then(|v| v.parse::<i64>().ok());
    let show = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
    let v = |k: &str| after.get(k).map(String::as_str).unwrap_or("?");
    let _ = writeln!(
        t,
        "  Redis INFO: total_forks {} -> {}, rdb_saves {} -> {}, rdb_last_bgsave_status {}, rdb_bgsave_in_progress {}, latest_fork_usec {}, rdb_last_bgsave_time_sec {}, rdb_last_cow_size {}",
        show(num(&before, "total_forks")),
        show(num(&after, "total_forks")),
        show(num(&before, "rdb_saves")),
        show(num(&after, "rdb_saves")),
        v("rdb_last_bgsave_status"),
        v("rdb_bgsave_in_progress"),
        v("latest_fork_usec"),
        v("rdb_last_bgsave_time_sec"),
        v("rdb_last_cow_size"),
    );
    let delta = |k: &str| Some(num(&after, k)? - num(&before, k)?);
    expect(
        t,
        delta("total_forks") == Some(1),
        format!("Redis forked once while attached: total_forks +{}", show(delta("total_forks"))),
    );
    if num(&after, "rdb_saves").is_some() {
        expect(
            t,
            delta("rdb_saves") == Some(1),
            format!("one RDB save: rdb_saves +{}", show(delta("rdb_saves"))),
        );
    }
    expect(
        t,
        v("rdb_last_bgsave_status") == "ok" && v("rdb_bgsave_in_progress") == "0",
        format!(
            "the BGSAVE ended ok (rdb_last_bgsave_status {}, rdb_bgsave_in_progress {})",
            v("rdb_last_bgsave_status"),
            v("rdb_bgsave_in_progress")
        ),
    );
    expect(
        t,
        forks == ["fork#1 child-alive", "fork#1 after-child-exit"],
        format!("exactly one fork, the BGSAVE's: fork phases {forks:?}"),
    );
    let find = |n: &str| phases.iter().find(|ph| ph["name"] == n);
    let (Some(alive), Some(exit)) = (find("fork#1 child-alive"), find("fork#1 after-child-exit")) else {
        return Ok(());
    };
    let start = alive["start_ns"].as_u64().unwrap_or(0);
    let end = alive["end_ns"].as_u64().unwrap_or(0);
    let d = end.saturating_sub(start);
    expect(
        t,
        exit["start_ns"].as_u64() == Some(end),
        "after-child-exit starts where child-alive ends".into(),
    );
    let _ = writeln!(
        t,
        "  BGSAVE seen by the guest: sent at {:.2}s, end seen at {:.2}s ({}); fork#1 child-alive {:.3}s .. {:.3}s ({})",
        t0 as f64 / 1e9,
        t1 as f64 / 1e9,
        ms(t1 - t0),
        start as f64 / 1e9,
        end as f64 / 1e9,
        ms(d)
    );
    expect(
        t,
        t0 <= start && end <= t1 + UPTIME_RES_NS,
        "the child lived within the BGSAVE command's window (sent .. seen ended)".into(),
    );
    let fork_ns = num(&after, "latest_fork_usec").unwrap_or(-1);
    let save_s = num(&after, "rdb_last_bgsave_time_sec").unwrap_or(-1);
    if fork_ns >= 0 && save_s >= 0 {
        let fork_ns = fork_ns as u64 * 1000;
        let bound = (save_s as u64 + 1) * 1_000_000_000 + fork_ns;
        expect(
            t,
            d < bound,
            format!("child-alive {} < rdb_last_bgsave_time_sec {save_s} s + 1 s + latest_fork_usec", ms(d)),
        );
        expect(
            t,
            d >= fork_ns,
            format!("child-alive {} >= latest_fork_usec {} (plausibility)", ms(d), ms(fork_ns)),
        );
    } else {
        expect(t, false, "INFO has no latest_fork_usec or rdb_last_bgsave_time_sec".into());
    }
    let reuse_after = exit["classes"]["reuse"]["count"].as_u64().unwrap_or(0);
    expect(
        t,
        reuse_after > 0,
        format!("the SETs after the child's exit reuse write-protected pages: reuse {reuse_after}"),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uptime_parses() {
        assert_eq!(uptime_ns("12.34"), Some(12_340_000_000));
        assert_eq!(uptime_ns("7"), Some(7_000_000_000));
        assert_eq!(uptime_ns("x"), None);
    }

    #[test]
    fn info_parses() {
        let i = parse_info("# Persistence\nrdb_bgsave_in_progress:0\nlatest_fork_usec:123\n\n");
        assert_eq!(i["rdb_bgsave_in_progress"], "0");
        assert_eq!(i["latest_fork_usec"], "123");
    }
}
