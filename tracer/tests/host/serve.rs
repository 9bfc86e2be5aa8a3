//! serve: counts against getrusage by pid, comm and cgroup, phase kinds,
//! HTTP under idle, slow and hostile clients, descriptors running out.

use super::*;

/// One GET /metrics, the body.
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

fn sample(text: &str, prefix: &str) -> u64 {
    text.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0)
}

#[test]
fn serve_pid_counts_match_getrusage_and_sigterm_ends_it() {
    let _t = host_test();
    let port = 9871;
    // Says it is ready, waits for a line on stdin, touches 2048 new pages,
    // prints its minflt for that, and waits for the next line to exit. Run
    // by its own path (a `python3` found on PATH may be a shell script that
    // execs it) and traced only once ready: its start-up is over before the
    // count the test takes as its start.
    let script = "import sys,resource\nprint(\"ready\",flush=True)\nsys.stdin.readline()\n\
r0=resource.getrusage(0).ru_minflt\nb=bytearray(2048*4096)\nfor j in range(0,len(b),4096): b[j]=1\n\
print(resource.getrusage(0).ru_minflt-r0,flush=True)\nsys.stdin.readline()\n";
    let mut wl = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(wl.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = wl.id().to_string();
    let served = Served::start(&["-p", &pid, "--port", &port.to_string(), "--tick", "0.2"]);
    // Attaching takes seconds on a loaded machine.
    wait_serving(port);
    sleep(Duration::from_millis(500));
    let before = sample(&scrape(port), "faultscope_class_faults_total{class=\"faults\"");
    use std::io::{BufRead, Write};
    let mut stdin = wl.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let minflt: u64 = line.trim().parse().unwrap();
    sleep(Duration::from_millis(1000));
    let text = scrape(port);
    let faults = faults_with(&text, "");
    assert!(minflt >= 2048, "{minflt}");
    let delta = faults - before;
    assert!(
        delta >= minflt && delta <= minflt + TOLERANCE,
        "{delta} faults counted, getrusage {minflt}\n{text}"
    );
    assert!(text.contains("faultscope_build_info{"), "{text}");
    // The kinds partition the faults: their sum is the faults class.
    let kinds: u64 = text
        .lines()
        .filter(|l| l.starts_with("faultscope_faults_total{kind="))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(kinds, faults, "{text}");
    stdin.write_all(b"bye\n").unwrap();
    wl.wait().unwrap();
    served.stop();
}

/// Waits until `serve` answers on `port` (loading and attaching take a while).
fn wait_serving(port: u16) {
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        sleep(Duration::from_millis(100));
    }
    panic!("serve never listened on {port}");
}

/// The sum of the `faults` counters whose labels include `label`.
fn faults_with(text: &str, label: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with("faultscope_class_faults_total{class=\"faults\"") && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `serve` with `args`, ended by SIGTERM when dropped.
struct Served(Option<std::process::Child>);
impl Served {
    fn start(args: &[&str]) -> Served {
        let c = Command::new(bin()).arg("serve").args(args).stderr(Stdio::piped()).spawn().unwrap();
        Served(Some(c))
    }
    /// SIGTERM, and its stderr; it must end cleanly.
    fn stop(mut self) -> String {
        let c = self.0.take().unwrap();
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        err
    }
}
impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

/// A Python that waits for a line, touches 2048 new pages, prints its
/// minflt for that, and exits at the next line; run as `exe` (its comm).
fn paced_python(
    exe: &Path,
) -> (std::process::Child, std::process::ChildStdin, std::io::BufReader<std::process::ChildStdout>) {
    let script = "import sys,resource\nsys.stdin.readline()\nr0=resource.getrusage(0).ru_minflt\n\
b=bytearray(2048*4096)\nfor j in range(0,len(b),4096): b[j]=1\n\
print(resource.getrusage(0).ru_minflt-r0,flush=True)\nsys.stdin.readline()\n";
    let mut c =
        Command::new(exe).args(["-c", script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let stdin = c.stdin.take().unwrap();
    let stdout = std::io::BufReader::new(c.stdout.take().unwrap());
    (c, stdin, stdout)
}

#[test]
fn serve_comm_picks_up_an_exec_and_follows_a_restart() {
    use std::io::{BufRead, Write};
    let _t = host_test();
    let port = 9872;
    let dir = tmp();
    // A comm of its own: exec through a link of that name.
    let exe = dir.path().join("fs-commtest");
    std::os::unix::fs::symlink(std::fs::canonicalize("/usr/bin/python3").unwrap(), &exe).unwrap();
    let served = Served::start(&["--comm", "fs-commtest", "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    let mut total = 0;
    let mut pids = Vec::new();
    // The first run, then the "restarted" one under a new pid: the counter
    // goes on from the first's count.
    for _ in 0..2 {
        let (mut c, mut stdin, mut stdout) = paced_python(&exe);
        pids.push(c.id());
        // Found by the /proc scan within a tick.
        sleep(Duration::from_millis(1000));
        let before = faults_with(&scrape(port), "comm=\"fs-commtest\"");
        stdin.write_all(b"go\n").unwrap();
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let minflt: u64 = line.trim().parse().unwrap();
        assert!(minflt >= 2048, "{minflt}");
        sleep(Duration::from_millis(800));
        let text = scrape(port);
        let now = faults_with(&text, "comm=\"fs-commtest\"");
        let delta = now - before;
        assert!(
            delta >= minflt && delta <= minflt + TOLERANCE,
            "pid {}: {delta} counted, getrusage {minflt}\n{text}",
            c.id()
        );
        assert!(now >= total + delta, "the counter went back: {total} then {now}");
        total = now;
        stdin.write_all(b"bye\n").unwrap();
        c.wait().unwrap();
        sleep(Duration::from_millis(400));
    }
    let err = served.stop();
    for pid in pids {
        assert!(err.contains(&format!("tracing pid {pid} (fs-commtest)")), "{pid}: {err}");
    }
}

#[test]
fn serve_phase_kinds_are_each_processes_own() {
    use std::io::{BufRead, Write};
    let _t = host_test();
    let port = 9874;
    let dir = tmp();
    let python = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let link = |name: &str| {
        let exe = dir.path().join(name);
        std::os::unix::fs::symlink(&python, &exe).unwrap();
        exe
    };
    let (forker, writer) = (link("fs-kindfork"), link("fs-kindwrite"));
    let port_s = port.to_string();
    let served = Served::start(&[
        "--comm",
        "fs-kindfork",
        "--comm",
        "fs-kindwrite",
        "--port",
        &port_s,
        "--tick",
        "0.2",
    ]);
    wait_serving(port);
    // At a line, forks a child that lives until the next one.
    let script = "import os,sys\nsys.stdin.readline()\nr,w=os.pipe()\npid=os.fork()\n\
if pid==0:\n    os.close(w)\n    os.read(r,1)\n    os._exit(0)\n\
os.close(r)\nprint(pid,flush=True)\nsys.stdin.readline()\nos.close(w)\nos.waitpid(pid,0)\n";
    let mut f = Command::new(&forker)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut f_in = f.stdin.take().unwrap();
    let mut f_out = std::io::BufReader::new(f.stdout.take().unwrap());
    let (mut w, mut w_in, mut w_out) = paced_python(&writer);
    // Both found by the /proc scan.
    sleep(Duration::from_millis(1000));
    f_in.write_all(b"fork\n").unwrap();
    let mut line = String::new();
    f_out.read_line(&mut line).unwrap();
    sleep(Duration::from_millis(600));
    // The forker's child is alive; the writer has forked nothing: its
    // faults are its own before-fork ones, not the forker's child-alive.
    let mine = "phase_kind=\"before-fork\",comm=\"fs-kindwrite\"";
    let before = faults_with(&scrape(port), mine);
    w_in.write_all(b"go\n").unwrap();
    let mut line = String::new();
    w_out.read_line(&mut line).unwrap();
    let minflt: u64 = line.trim().parse().unwrap();
    sleep(Duration::from_millis(800));
    let text = scrape(port);
    let delta = faults_with(&text, mine) - before;
    assert!(
        delta >= minflt && delta <= minflt + TOLERANCE,
        "{delta} counted before-fork, getrusage {minflt}\n{text}"
    );
    assert_eq!(faults_with(&text, "phase_kind=\"child-alive\",comm=\"fs-kindwrite\""), 0, "{text}");
    assert!(faults_with(&text, "phase_kind=\"child-alive\",comm=\"fs-kindfork\"") > 0, "{text}");
    for stdin in [&mut f_in, &mut w_in] {
        stdin.write_all(b"bye\n").unwrap();
    }
    f.wait().unwrap();
    w.wait().unwrap();
    served.stop();
}

#[test]
fn serve_cgroup_counts_a_short_process_inside_it_and_none_outside() {
    let _t = host_test();
    let port = 9873;
    let (cg, _rm) = test_cgroup("");
    let served =
        Served::start(&["--cgroup", cg.to_str().unwrap(), "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    sleep(Duration::from_millis(500));
    // Outside: 16384 pages, at the same time.
    let outside = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import time\nb=bytearray(16384*4096)\nfor j in range(0,len(b),4096): b[j]=1\ntime.sleep(1)\n",
        ])
        .spawn()
        .unwrap();
    // Inside: joins the cgroup, execs, touches 2048 pages and exits at once
    // (within a tick: only the kernel's filter can see it), printing its
    // whole minflt and that of the touching.
    let (touch, whole) = short_python_in(&cg);
    let mut outside = outside;
    assert!(outside.wait().unwrap().success());
    sleep(Duration::from_millis(800));
    let text = scrape(port);
    let counted = faults_with(&text, "");
    // From its first event in the cgroup to its exit: at least the touching,
    // at most its whole life; the other's 16384 pages are not there.
    assert!(
        counted >= touch && counted <= whole + TOLERANCE,
        "{counted} counted; inside: touched {touch}, whole {whole}\n{text}"
    );
    assert!(text.contains("comm=\"python3\""), "{text}");
    served.stop();
}

/// `serve --cgroup`: a running process moved into the cgroup (no fork, no
/// exec) is adopted by the kernel at its next fault, even though its faults
/// just before, outside, were found untraced on the same CPU: counted from
/// the move, bounded by the pages it touched after it (its own getrusage)
/// and not the ones before.
#[test]
fn serve_cgroup_adopts_a_running_process_moved_into_it() {
    let _t = host_test();
    let port = 9881;
    let (cg, _rm) = test_cgroup("-moved");
    // A tick of 5 s: the process lives far less after its move, so only the
    // kernel's filter can see it.
    let served =
        Served::start(&["--cgroup", cg.to_str().unwrap(), "--port", &port.to_string(), "--tick", "5"]);
    wait_serving(port);
    let script = "import resource,sys\nb=bytearray(4096*4096)\nfor j in range(0,len(b),4096): b[j]=1\n\
print(\"ready\",flush=True)\nsys.stdin.readline()\nr0=resource.getrusage(0).ru_minflt\n\
c=bytearray(3072*4096)\nfor j in range(0,len(c),4096): c[j]=1\nr1=resource.getrusage(0).ru_minflt\n\
print(r1-r0,r1,flush=True)\n";
    let mut py = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(py.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    std::fs::write(cg.join("cgroup.procs"), py.id().to_string()).unwrap();
    std::io::Write::write_all(py.stdin.as_mut().unwrap(), b"go\n").unwrap();
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    let v: Vec<u64> = line.split_whitespace().map(|w| w.parse().unwrap()).collect();
    assert!(py.wait().unwrap().success());
    let (touch, whole) = (v[0], v[1]);
    assert!(touch >= 3072 && whole >= touch + 4096, "{v:?}");
    // Published at the next tick.
    sleep(Duration::from_millis(5500));
    let text = scrape(port);
    let counted = faults_with(&text, "");
    assert!(
        counted >= touch && counted <= touch + TOLERANCE,
        "{counted} counted; after the move it touched {touch}, in its whole life {whole}\n{text}"
    );
    served.stop();
}

/// One HTTP request to serve, the whole reply.
fn http(port: u16, request: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    // A reset (a connection past the cap) reads as an empty reply.
    let _ = s.read_to_string(&mut out);
    out
}

/// serve under a hostile host: the port it got is said (`--port 0`), HEAD
/// and `/` are answered, idle connections past the cap cannot keep a
/// scrape out, a hostile tick is refused, and SIGHUP ends it cleanly.
#[test]
fn serve_says_its_port_answers_head_caps_idle_clients_and_ends_on_sighup() {
    let _t = host_test();
    let out = faultscope(&["serve", "-p", "1", "--tick", "1e-10"]);
    assert_eq!(out.status.code(), Some(2));
    let mut target = Command::new("sleep").arg("60").spawn().unwrap();
    let mut serve = Command::new(bin())
        .args(["serve", "-p", &target.id().to_string(), "--port", "0", "--tick", "0.2"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ends serve when an assertion fails first.
    struct Term(u32);
    impl Drop for Term {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0 as i32, libc::SIGTERM) };
        }
    }
    let _term = Term(serve.id());
    use std::io::BufRead as _;
    let mut lines = std::io::BufReader::new(serve.stderr.take().unwrap()).lines();
    let port: u16 = loop {
        let l = lines.next().expect("serve said where it serves").unwrap();
        if let Some(rest) = l.strip_prefix("faultscope: serving OpenMetrics on http://127.0.0.1:") {
            break rest.trim_end_matches("/metrics").parse().unwrap();
        }
    };
    assert_ne!(port, 0);
    // Idle clients, more than the cap: past it a new one evicts the one
    // idle longest, so serve's descriptors stay bounded, and a scrape gets
    // in.
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", serve.id())).unwrap().count();
    let before = fds();
    let idle: Vec<_> =
        (0..200).filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    sleep(Duration::from_millis(500));
    let held = fds() - before;
    assert!(held <= 64 + 4, "serve holds {held} more descriptors with 200 idle clients (cap 64)");
    let answered = (0..40).any(|_| {
        let ok = http(port, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n").starts_with("HTTP/1.1 200");
        if !ok {
            sleep(Duration::from_millis(500));
        }
        ok
    });
    assert!(answered, "no scrape answered within 20 s of 200 idle clients");
    let head = http(port, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"), "{head}");
    assert!(http(port, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n").contains("href=\"/metrics\""));
    let scrape = http(port, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
    assert!(scrape.contains("faultscope_build_info"), "{scrape}");
    // Keep-alive: a bare-LF request, then a gzip'd scrape on the same
    // connection; a POST is refused.
    {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(b"GET / HTTP/1.1\nHost: x\n\n").unwrap();
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let head_end = |b: &[u8]| b.windows(4).position(|w| w == b"\r\n\r\n");
        while head_end(&buf).is_none() {
            let n = c.read(&mut chunk).unwrap();
            assert!(n > 0, "closed after the first reply: {}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
        }
        let h = head_end(&buf).unwrap();
        let head = String::from_utf8_lossy(&buf[..h]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse().unwrap())
            .unwrap();
        while buf.len() < h + 4 + len {
            let n = c.read(&mut chunk).unwrap();
            buf.extend_from_slice(&chunk[..n]);
        }
        c.write_all(b"GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n").unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        let h = head_end(&rest).expect("a second reply on the same connection");
        let head = String::from_utf8_lossy(&rest[..h]).to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 200") && head.contains("content-encoding: gzip"), "{head}");
        let mut text = String::new();
        flate2::read::GzDecoder::new(&rest[h + 4..]).read_to_string(&mut text).unwrap();
        assert!(text.contains("faultscope_build_info"), "{text}");
        let post = http(port, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    }
    drop(idle);
    unsafe { libc::kill(serve.id() as i32, libc::SIGHUP) };
    let st = serve.wait().unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    assert!(st.success(), "{st:?}");
}

/// A Python run as `exe` (its comm) that touches 2048 new pages and exits at
/// once; its output: the minflt of the touching, then of its whole life.
pub(super) fn short_python(exe: &Path) -> (u64, u64) {
    touch_2048(Command::new(exe).args(["-c", SHORT_SCRIPT]))
}

/// [`short_python`] as `/usr/bin/python3`, exec'd after joining cgroup `cg`
/// (so that only the kernel's filter can see it from its first event).
pub(super) fn short_python_in(cg: &Path) -> (u64, u64) {
    let join =
        format!("echo $$ > {}/cgroup.procs && exec /usr/bin/python3 -c '{SHORT_SCRIPT}'", cg.display());
    touch_2048(Command::new("sh").args(["-c", &join]))
}

const SHORT_SCRIPT: &str = "import resource\nr0=resource.getrusage(0).ru_minflt\nb=bytearray(2048*4096)\n\
for j in range(0,len(b),4096): b[j]=1\nr1=resource.getrusage(0).ru_minflt\nprint(r1-r0, r1)\n";

/// Runs `cmd` (a [`SHORT_SCRIPT`]) to its end: (minflt of the touching,
/// of its whole life).
fn touch_2048(cmd: &mut Command) -> (u64, u64) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Vec<u64> =
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(|w| w.parse().unwrap()).collect();
    assert!(v[0] >= 2048, "{v:?}");
    (v[0], v[1])
}

/// `serve --comm`: a program that lives far less than a tick is counted
/// from its exec (the kernel adopts it there), bounded by the page
/// arithmetic and its own getrusage; a comm the kernel could never hold is
/// refused.
#[test]
fn serve_comm_counts_a_process_shorter_than_a_tick_from_its_exec() {
    let _t = host_test();
    let out = faultscope(&["serve", "--comm", "0123456789abcdef"]);
    assert_refused(&out, "--comm");
    let port = 9876;
    let dir = tmp();
    let exe = dir.path().join("fs-shortlived");
    std::os::unix::fs::symlink(std::fs::canonicalize("/usr/bin/python3").unwrap(), &exe).unwrap();
    // A tick of 5 s: the /proc scan could not see it.
    let served = Served::start(&["--comm", "fs-shortlived", "--port", &port.to_string(), "--tick", "5"]);
    wait_serving(port);
    let mut runs = Vec::new();
    for _ in 0..2 {
        runs.push(short_python(&exe));
    }
    // Counted at the next tick.
    sleep(Duration::from_millis(6000));
    let text = scrape(port);
    let counted = faults_with(&text, "comm=\"fs-shortlived\"");
    let touched: u64 = runs.iter().map(|r| r.0).sum();
    let whole: u64 = runs.iter().map(|r| r.1).sum();
    assert!(
        counted >= touched && counted <= whole + TOLERANCE,
        "{counted} counted; runs (touch, whole) {runs:?}\n{text}"
    );
    let err = served.stop();
    assert!(err.matches("(fs-shortlived)").count() >= 2, "{err}");
}

/// `serve -a`: every process, however short, is counted from its fork
/// (its own getrusage at its end bounds it from below), under the comm
/// it exits with; its entries leave the kernel's map once it is gone.
#[test]
fn serve_all_counts_every_process_from_its_fork() {
    let _t = host_test();
    let port = 9879;
    let dir = tmp();
    let exe = dir.path().join("fs-allhost");
    std::os::unix::fs::symlink(std::fs::canonicalize("/usr/bin/python3").unwrap(), &exe).unwrap();
    let served = Served::start(&["-a", "--prog-stats", "--port", &port.to_string(), "--tick", "1"]);
    wait_serving(port);
    let runs: Vec<(u64, u64)> = (0..3).map(|_| short_python(&exe)).collect();
    sleep(Duration::from_millis(2500));
    let text = scrape(port);
    let counted = faults_with(&text, "comm=\"fs-allhost\"");
    let whole: u64 = runs.iter().map(|r| r.1).sum();
    assert!(counted >= whole && counted <= whole + 3 * TOLERANCE, "{counted} counted; runs {runs:?}\n{text}");
    // Its own state: the exception program attached and run (--prog-stats),
    // the stats map's bound under -a and its fill within it.
    assert!(text.contains("faultscope_program_stats_enabled 1"), "{text}");
    let runs = text
        .lines()
        .filter(|l| l.starts_with("faultscope_program_runs_total{program=\"page_fault_user"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum::<u64>();
    assert!(runs >= whole, "{runs} runs of the exception program for {whole} faults\n{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("faultscope_program_attached{program=\"page_fault_user\"")
                && l.ends_with(" 1")),
        "{text}"
    );
    assert_eq!(sample(&text, "faultscope_map_capacity_entries{map=\"STATS\"}"), 16384, "{text}");
    assert!(sample(&text, "faultscope_map_entries{map=\"STATS\"}") <= 16384, "{text}");
    served.stop();
}

/// `serve -a --label-container`: a process in a cgroup laid out as the
/// kubelet's systemd driver, its cgroupfs driver, Docker or a systemd
/// service makes them lays out is labelled with that container, pod, QoS
/// class or service, with its faults; a directory named to forge a label
/// forges none.
#[test]
fn serve_labels_containers_pods_and_services_from_the_cgroup_path() {
    let _t = host_test();
    let port = 9880;
    let (root, _rm) = test_cgroup("-ctr");
    let id = |n: u8| format!("{:064x}", 0xfeed_0000u64 + n as u64);
    let uid = |n: u8| format!("0b6f8a2e-3c1d-4e5f-9a8b-7c6d5e4f3a{n:02x}");
    let cases: Vec<(String, String)> = vec![
        (
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope",
                uid(1).replace('-', "_"),
                id(1)
            ),
            format!("container_id=\"{}\",pod_uid=\"{}\",qos=\"burstable\",service=\"\"", id(1), uid(1)),
        ),
        (
            format!("kubepods/besteffort/pod{}/{}", uid(2), id(2)),
            format!("container_id=\"{}\",pod_uid=\"{}\",qos=\"besteffort\",service=\"\"", id(2), uid(2)),
        ),
        (
            format!("system.slice/docker-{}.scope", id(3)),
            format!("container_id=\"{}\",pod_uid=\"\",qos=\"\",service=\"\"", id(3)),
        ),
        ("system.slice/fs-test.service".into(), "container_id=\"\",pod_uid=\"\",qos=\"\",service=\"fs-test.service\"".into()),
    ];
    let mut dirs = Vec::new();
    for (path, _) in &cases {
        let mut at = root.clone();
        for part in path.split('/') {
            at = at.join(part);
            if std::fs::create_dir(&at).is_ok() {
                dirs.push(Rmdir(at.clone()));
            }
        }
    }
    let forged = root.join("system.slice").join("x\",service=\"forged.service");
    std::fs::create_dir(&forged).unwrap();
    dirs.push(Rmdir(forged.clone()));
    // Innermost first.
    dirs.reverse();
    let served = Served::start(&["-a", "--label-container", "--port", &port.to_string(), "--tick", "0.5"]);
    wait_serving(port);
    let script =
        "import sys\nsys.stdin.readline()\nb=bytearray(2048*4096)\nfor j in range(0,len(b),4096): b[j]=1\n\
print(1,flush=True)\nsys.stdin.readline()\n";
    let all: Vec<PathBuf> = cases.iter().map(|(p, _)| root.join(p)).chain([forged]).collect();
    let mut procs = Vec::new();
    for cg in &all {
        let join =
            format!("echo $$ > '{}/cgroup.procs' && exec /usr/bin/python3 -c '{script}'", cg.display());
        let mut c = Command::new("sh")
            .args(["-c", &join])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = c.stdin.take().unwrap();
        let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
        use std::io::{BufRead, Write};
        stdin.write_all(b"go\n").unwrap();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        procs.push((c, stdin));
    }
    // Named while they run: two ticks.
    sleep(Duration::from_millis(1500));
    for (mut c, mut stdin) in procs {
        use std::io::Write;
        let _ = stdin.write_all(b"end\n");
        drop(stdin);
        c.wait().unwrap();
    }
    sleep(Duration::from_millis(1000));
    let text = scrape(port);
    for (path, labels) in &cases {
        let n = faults_with(&text, labels);
        assert!(n >= 2048, "{path}: {n} faults labelled {labels}\n{text}");
    }
    assert!(!text.contains("forged.service\""), "{text}");
    served.stop();
}

/// `serve --cgroup`: a cgroup removed and created again (a service
/// restart) is a new id; serve says so and counts the processes of the new
/// one.
#[test]
fn serve_follows_a_cgroup_created_again() {
    let _t = host_test();
    let port = 9877;
    let (cg, _rm) = test_cgroup("-recreate");
    let served =
        Served::start(&["--cgroup", cg.to_str().unwrap(), "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    std::fs::remove_dir(&cg).unwrap();
    sleep(Duration::from_millis(600));
    std::fs::create_dir(&cg).unwrap();
    sleep(Duration::from_millis(600));
    let (touch, whole) = short_python_in(&cg);
    sleep(Duration::from_millis(800));
    let text = scrape(port);
    let counted = faults_with(&text, "");
    assert!(
        counted >= touch && counted <= whole + TOLERANCE,
        "{counted} counted; inside: touched {touch}, whole {whole}\n{text}"
    );
    let err = served.stop();
    assert!(err.contains("is gone") && err.contains("is back (id "), "{err}");
}

/// serve out of descriptors: its RLIMIT_NOFILE lowered (on the running
/// serve) to what it holds plus a few, idle clients take the rest. It keeps
/// counting its target (the target's own getrusage minflt, touched while no
/// descriptor is left), never takes it for exited, counts the refused
/// connections, and answers again once the clients are gone.
#[test]
fn serve_out_of_descriptors_keeps_counting() {
    use std::io::{BufRead, Write};
    let _t = host_test();
    let port = 9878;
    let (mut wl, mut stdin, mut stdout) = paced_python(Path::new("/usr/bin/python3"));
    let served = Served::start(&["-p", &wl.id().to_string(), "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    sleep(Duration::from_millis(500));
    let before = faults_with(&scrape(port), "");
    let spid = served.0.as_ref().unwrap().id();
    let fds = || std::fs::read_dir(format!("/proc/{spid}/fd")).unwrap().count() as u64;
    let limit = fds() + 4;
    let lim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
    assert_eq!(unsafe { libc::prlimit(spid as i32, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) }, 0);
    let idle: Vec<_> =
        (0..40).filter_map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).ok()).collect();
    sleep(Duration::from_millis(500));
    assert!(fds() >= limit - 1, "serve holds {} of {limit} descriptors", fds());
    stdin.write_all(b"go\n").unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let minflt: u64 = line.trim().parse().unwrap();
    // Ticks with no descriptor left.
    sleep(Duration::from_millis(1000));
    drop(idle);
    let text = (0..20)
        .find_map(|_| {
            sleep(Duration::from_millis(500));
            let r = http(port, "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
            r.starts_with("HTTP/1.1 200").then(|| r.split_once("\r\n\r\n").unwrap().1.to_string())
        })
        .expect("serve answers once the idle clients are gone");
    let delta = faults_with(&text, "") - before;
    assert!(
        minflt >= 2048 && delta >= minflt && delta <= minflt + TOLERANCE,
        "{delta} counted, getrusage {minflt}\n{text}"
    );
    assert!(sample(&text, "faultscope_drops_total{reason=\"accept_errors\"}") > 0, "{text}");
    stdin.write_all(b"bye\n").unwrap();
    wl.wait().unwrap();
    let err = served.stop();
    assert_eq!(err.matches("cannot accept a connection").count(), 1, "{err}");
}

/// A `sleep` to trace, killed with the test.
struct Sleeper(std::process::Child);
impl Sleeper {
    fn start() -> Sleeper {
        Sleeper(Command::new("sleep").arg("300").spawn().unwrap())
    }
    fn pid(&self) -> String {
        self.0.id().to_string()
    }
}
impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The connections serve keeps at once (`MAX_CONNECTIONS`).
const SERVE_CONNECTIONS: usize = 64;

/// A client that holds a connection to `port` without ever completing a
/// request: it sends nothing (`trickle` false) or a request line and
/// headers one byte every 200 ms that never end, and connects again
/// whenever serve closes it, until `stop`. Counts its connections in
/// `opened`.
fn slow_client(
    port: u16,
    trickle: bool,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    opened: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::{
        io::{ErrorKind, Read, Write},
        sync::atomic::Ordering::Relaxed,
    };
    let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    while !stop.load(Relaxed) {
        let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
            sleep(Duration::from_millis(50));
            continue;
        };
        opened.fetch_add(1, Relaxed);
        c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut sent = 0;
        while !stop.load(Relaxed) {
            if trickle {
                let b = head.get(sent).copied().unwrap_or(b'a');
                if c.write_all(&[b]).is_err() {
                    break;
                }
                sent += 1;
            }
            // Closed (or answered, with a timeout's 408): connect again.
            match c.read(&mut [0u8; 512]) {
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                _ => break,
            }
        }
    }
}

/// One `request` to `port` within `within` (connect, write, read to the
/// end): the whole reply, or what went wrong.
fn http_within(port: u16, request: &str, within: Duration) -> Result<String, String> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect_timeout(&addr, within).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(within)).unwrap();
    s.set_write_timeout(Some(within)).unwrap();
    s.write_all(request.as_bytes()).map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| format!("read: {e} after {} bytes", out.len()))?;
    let took = t0.elapsed();
    let out = String::from_utf8_lossy(&out).into_owned();
    if took > within {
        return Err(format!("took {took:?}"));
    }
    if !out.starts_with("HTTP/1.1 200") {
        return Err(format!("reply {:?}", out.chars().take(80).collect::<String>()));
    }
    Ok(out)
}

/// Slow clients past the cap: more than the connections serve keeps, each
/// sending nothing or a request line and headers that never end, a byte at
/// a time, and connecting again whenever serve closes it. A prober's 60
/// scrapes are all answered, each within 5 s: a new connection makes room
/// by evicting the one that has waited longest for its request. serve's
/// descriptors stay bounded all the while, and it counts the evictions.
#[test]
fn serve_answers_every_scrape_while_slow_clients_hold_more_than_its_connections() {
    use std::sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed},
        Arc,
    };
    let _t = host_test();
    let port = 9879;
    let target = Sleeper::start();
    let served = Served::start(&["-p", &target.pid(), "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    let spid = served.0.as_ref().unwrap().id();
    let fds = || std::fs::read_dir(format!("/proc/{spid}/fd")).unwrap().count();
    let before = fds();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..SERVE_CONNECTIONS + 16)
        .map(|i| {
            let (stop, opened) = (stop.clone(), opened.clone());
            std::thread::spawn(move || slow_client(port, i % 2 == 0, stop, opened))
        })
        .collect();
    // Every client connected, and the cap reached.
    for _ in 0..100 {
        if opened.load(Relaxed) >= SERVE_CONNECTIONS + 16 {
            break;
        }
        sleep(Duration::from_millis(50));
    }
    sleep(Duration::from_millis(500));
    let within = Duration::from_secs(5);
    let mut failed = Vec::new();
    let mut most_fds = 0;
    let mut slowest = Duration::ZERO;
    let n = 60;
    for i in 0..n {
        let t0 = Instant::now();
        if let Err(e) =
            http_within(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", within)
        {
            failed.push(format!("scrape {i}: {e}"));
        }
        slowest = slowest.max(t0.elapsed());
        most_fds = most_fds.max(fds());
        sleep(Duration::from_millis(100));
    }
    stop.store(true, Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let opened = opened.load(Relaxed);
    assert!(
        failed.is_empty(),
        "{} of {n} scrapes failed while {} slow clients held connections ({opened} opened):\n{}",
        failed.len(),
        SERVE_CONNECTIONS + 16,
        failed.join("\n")
    );
    // The table's connections, the listener's and a scrape's.
    let held = most_fds - before;
    assert!(held <= SERVE_CONNECTIONS + 4, "serve held {held} more descriptors (cap {SERVE_CONNECTIONS})");
    sleep(Duration::from_millis(500));
    let text = scrape(port);
    let evicted = sample(&text, "faultscope_http_connections_dropped_total{reason=\"evicted\"}");
    println!(
        "{opened} slow connections, {evicted} evicted, slowest scrape {slowest:?}, {held} more fds at most"
    );
    assert!(evicted > 0, "no eviction counted ({opened} connections opened)\n{text}");
    served.stop();
}

/// The head of a reply (lowercased) and its body, gunzipped when it says
/// gzip.
fn head_and_body(reply: &[u8]) -> (String, String) {
    use std::io::Read as _;
    let h = reply.windows(4).position(|w| w == b"\r\n\r\n").expect("a reply head");
    let head = String::from_utf8_lossy(&reply[..h]).to_ascii_lowercase();
    let raw = &reply[h + 4..];
    let body = if head.contains("\r\ncontent-encoding: gzip") {
        let mut t = String::new();
        flate2::read::GzDecoder::new(raw).read_to_string(&mut t).expect("a gzip body");
        t
    } else {
        String::from_utf8_lossy(raw).into_owned()
    };
    (head, body)
}

/// Content negotiation by RFC 9110 over HTTP: q-values (q=0 is "not
/// acceptable"), wildcards, case, parameters and quoted commas choose
/// between OpenMetrics and the text format 0.0.4 and between gzip and
/// identity; with nothing acceptable, text 0.0.4 without gzip.
#[test]
fn serve_negotiates_format_and_encoding_by_q_values() {
    use std::io::{Read, Write};
    let _t = host_test();
    let port = 9880;
    let target = Sleeper::start();
    let served = Served::start(&["-p", &target.pid(), "--port", &port.to_string(), "--tick", "0.2"]);
    wait_serving(port);
    const OM: bool = true;
    const TEXT: bool = false;
    const GZIP: bool = true;
    const IDENTITY: bool = false;
    let prometheus3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,\
application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,\
text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    let cases: &[(Option<&str>, Option<&str>, bool, bool)] = &[
        (None, None, TEXT, IDENTITY),
        (Some("application/openmetrics-text;q=0, text/plain"), None, TEXT, IDENTITY),
        (Some("application/openmetrics-text; version=1.0.0"), Some("gzip"), OM, GZIP),
        (Some(prometheus3), Some("gzip"), OM, GZIP),
        (Some("text/plain;q=0.5, application/openmetrics-text;q=0.4"), None, TEXT, IDENTITY),
        (Some("APPLICATION/OpenMetrics-Text;Q=0.9, text/plain;q=0.5"), None, OM, IDENTITY),
        (Some("*/*"), None, TEXT, IDENTITY),
        (Some("application/*"), None, OM, IDENTITY),
        (Some("text/html"), None, TEXT, IDENTITY),
        (Some("application/openmetrics-text;q=0"), Some("gzip;q=0, identity;q=0"), TEXT, IDENTITY),
        (
            Some("application/openmetrics-text;x=\"a,text/plain;q=1\";q=0.1, text/plain;q=0.5"),
            None,
            TEXT,
            IDENTITY,
        ),
        (None, Some("gzip;q=0"), TEXT, IDENTITY),
        (None, Some("notgzip"), TEXT, IDENTITY),
        (None, Some("GZIP;Q=0.5"), TEXT, GZIP),
        (None, Some("gzip;q=0.5, identity;q=0.8"), TEXT, IDENTITY),
        (None, Some("*"), TEXT, GZIP),
        (None, Some("*;q=0, identity"), TEXT, IDENTITY),
        (None, Some("gzip;q=1.5"), TEXT, IDENTITY),
        (None, Some("x-gzip"), TEXT, GZIP),
    ];
    for &(accept, encoding, om, gzip) in cases {
        let mut req = String::from("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
        for (name, v) in [("Accept", accept), ("Accept-Encoding", encoding)] {
            if let Some(v) = v {
                req.push_str(&format!("{name}: {v}\r\n"));
            }
        }
        req.push_str("\r\n");
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).unwrap();
        let (head, body) = head_and_body(&reply);
        let case = format!("Accept {accept:?}, Accept-Encoding {encoding:?}");
        assert!(head.starts_with("http/1.1 200"), "{case}: {head}");
        let ctype = if om {
            "\r\ncontent-type: application/openmetrics-text; version=1.0.0; charset=utf-8"
        } else {
            "\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8"
        };
        assert!(
            head.contains(ctype),
            "{case}: want {}, got\n{head}",
            if om { "OpenMetrics" } else { "text" }
        );
        assert_eq!(head.contains("\r\ncontent-encoding: gzip"), gzip, "{case}: gzip {gzip}, got\n{head}");
        assert!(body.contains("faultscope_build_info"), "{case}: {body}");
        assert_eq!(body.ends_with("# EOF\n"), om, "{case}: {body}");
    }
    served.stop();
}

/// `serve -a` with a stats map far too small for the host: most faults are
/// lost at the map, and the kernel's own count of the faults that reached
/// it adds up, in every scrape, to what serve served plus what was lost
/// (`seen = counted + lost`), never less. The workloads come in waves a
/// few ticks apart, so that counts served from a CPU's pending slot meet a
/// full map when a later wave needs that slot: they must not be lost then
/// (counted twice).
#[test]
fn serve_faults_seen_are_counted_plus_lost_past_an_overflow() {
    let _t = host_test();
    let port = 9882;
    let served = Served::start(&["-a", "--max-stats", "64", "--port", &port.to_string(), "--tick", "0.5"]);
    wait_serving(port);
    let flow = |text: &str| {
        let counted: u64 = text
            .lines()
            .filter(|l| l.starts_with("faultscope_faults_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        (
            counted,
            sample(text, "faultscope_faults_lost_total "),
            sample(text, "faultscope_faults_seen_total "),
        )
    };
    for wave in 0..4 {
        let wl: Vec<_> = (0..6)
            .map(|_| Command::new(workload()).args(["--size", "4M"]).stdout(Stdio::null()).spawn().unwrap())
            .collect();
        for mut c in wl {
            assert!(c.wait().unwrap().success());
        }
        sleep(Duration::from_millis(1200));
        let text = scrape(port);
        let (counted, lost, seen) = flow(&text);
        assert!(counted + lost <= seen, "wave {wave}: counted {counted} + lost {lost} > seen {seen}\n{text}");
    }
    let mut last = String::new();
    let mut exact = false;
    for _ in 0..20 {
        sleep(Duration::from_millis(500));
        last = scrape(port);
        let (counted, lost, seen) = flow(&last);
        assert!(lost > 0, "nothing lost with 64 stats entries\n{last}");
        // Served late (a process not yet named), never more than seen.
        assert!(counted + lost <= seen, "counted {counted} + lost {lost} > seen {seen}\n{last}");
        if counted + lost == seen {
            exact = true;
            break;
        }
    }
    assert!(exact, "seen never equal to counted + lost in 20 scrapes\n{last}");
    assert!(sample(&last, "faultscope_drops_total{reason=\"stats_map_full\"}") > 0, "{last}");
    served.stop();
}

/// `serve -a --label-container`: a process in a container's cgroup made
/// after serve started, which exits and whose cgroup is removed before
/// serve's next tick could read `/proc/PID/cgroup`, is still served under
/// that container's id (from the kernel's exit event and `cgroup_mkdir`),
/// with its faults.
#[test]
fn serve_labels_a_container_gone_before_its_first_tick() {
    let _t = host_test();
    let port = 9883;
    let (root, _rm) = test_cgroup("-gone");
    let served = Served::start(&["-a", "--label-container", "--port", &port.to_string(), "--tick", "2"]);
    wait_serving(port);
    let id = format!("{:064x}", 0x90e_0000u64 + std::process::id() as u64);
    let scope = root.join(format!("docker-{id}.scope"));
    std::fs::create_dir(&scope).unwrap();
    let join = format!(
        "echo $$ > '{}/cgroup.procs' && exec {} --size 8M",
        scope.display(),
        std::fs::canonicalize(workload()).unwrap().display()
    );
    let out = Command::new("sh").args(["-c", &join]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let wl: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    std::fs::remove_dir(&scope).unwrap();
    // Two ticks: the exit, then the series.
    sleep(Duration::from_millis(4500));
    let text = scrape(port);
    let own = wl["minflt_total"].as_u64().unwrap() + wl["majflt_total"].as_u64().unwrap();
    let n = faults_with(&text, &format!("container_id=\"{id}\""));
    assert!(n >= own && n <= own + TOLERANCE, "{n} faults labelled {id}; its getrusage {own}\n{text}");
    served.stop();
}
