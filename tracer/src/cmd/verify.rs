//! `faultscope verify`: the checks of `report::verify` over a report file,
//! or over the report of a faultscope run it starts. Exit 0 when all hold,
//! 1 when one fails (with the numbers), 3 when a class is not measurable on
//! that kernel, 2 for a usage error.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Args;

use crate::{
    error::Refusal,
    report::{
        file::{self, Loaded},
        verify::{
            check, check_scope, parse, summed, Expect, Scope, Verdict, EXIT_FAILED, EXIT_NOT_MEASURABLE,
        },
    },
    signals::{self, HeldSignals},
    term::safe,
};

#[derive(Args, Debug)]
pub struct VerifyOpts {
    /// An assertion: CLASS[.ORIGIN][/folio|/page] OP NUMBER[%], OP one of
    /// = == != < <= > >=; ORIGIN user, kernel or gup (who asked for the
    /// faults); a percentage is of all faults, or, with an origin, of the
    /// class (`copy.kernel<=10%`: at most a tenth of the copies were the
    /// kernel's).
    #[arg(long = "expect", required = true)]
    pub expects: Vec<String>,
    /// Only this phase (a bench step such as mark:write, or a phase name).
    #[arg(long)]
    pub phase: Option<String>,
    /// Only this process (default: all processes of the report, summed).
    #[arg(long)]
    pub pid: Option<u64>,
    /// The report to check; or, after `--`, a faultscope command to run
    /// (e.g. `-- bench seq --folio 64K`) whose report is checked.
    pub report: Option<PathBuf>,
    /// The faultscope command to run and check (its arguments after `--`).
    #[arg(last = true)]
    pub run: Vec<String>,
}

pub fn run(o: &VerifyOpts) -> Result<i32> {
    let scope = Scope { phase: o.phase.clone(), pid: o.pid };
    let expects: Vec<Expect> =
        o.expects.iter().map(|e| parse(e)).collect::<Result<_, _>>().map_err(Refusal::new)?;
    let report = match (&o.report, o.run.is_empty()) {
        (Some(p), true) => file::load(p)?,
        (None, false) => live(&o.run)?,
        _ => return Err(Refusal::new("give a report file, or a faultscope command after --").into()),
    };
    check_scope(&report, &scope)?;
    // Per folio or page needs a bench's folio count: a usage error, not a
    // failed check.
    if let Some(e) = expects.iter().find(|e| e.per.is_some() && report.report.bench.is_none()) {
        return Err(Refusal::new(format!(
            "{}: /folio and /page need a bench report (the folio count is known there); {} is not one",
            e.text, report.path
        ))
        .into());
    }
    println!("{}", safe(&summed(&report.report, &scope)));
    let mut code = 0;
    for e in &expects {
        // The messages quote the report (phase names, reasons): escaped.
        match check(&report.report, e, &scope) {
            Verdict::Pass(m) => println!("PASS {}", safe(&m)),
            Verdict::Fail(m) => {
                println!("FAIL {}", safe(&m));
                if code == 0 {
                    code = EXIT_FAILED;
                }
            }
            Verdict::NotMeasurable(m) => {
                println!("NOT MEASURABLE {}: {}", safe(&e.text), safe(&m));
                code = EXIT_NOT_MEASURABLE;
            }
        }
    }
    Ok(code)
}

/// A private temporary directory (mkdtemp: a new name, mode 0700), removed
/// with everything in it when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> Result<TempDir> {
        use std::os::unix::ffi::OsStringExt as _;
        let template = std::env::temp_dir().join(format!("{prefix}XXXXXX"));
        let mut buf = std::ffi::CString::new(template.into_os_string().into_vec())?.into_bytes_with_nul();
        // SAFETY: a NUL-terminated template that mkdtemp fills in place.
        if unsafe { libc::mkdtemp(buf.as_mut_ptr().cast()) }.is_null() {
            return Err(std::io::Error::last_os_error()).context("creating a temporary directory");
        }
        buf.pop();
        Ok(TempDir(PathBuf::from(std::ffi::OsString::from_vec(buf))))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `faultscope ARGS --json TMP` and loads its report. The report goes
/// to a new private directory, removed in every outcome: while the run
/// goes on, SIGINT, SIGTERM and SIGHUP are passed on to it (so that Ctrl-C
/// ends a `record` and its report is checked) instead of ending verify.
fn live(args: &[String]) -> Result<Loaded> {
    if !matches!(args.first().map(String::as_str), Some("bench" | "record")) {
        return Err(Refusal::new("after --, give a faultscope bench or record command").into());
    }
    let dir = TempDir::new("faultscope-verify-")?;
    let json = dir.0.join("report.json");
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg(&args[0]).arg("--json").arg(&json).args(&args[1..]);
    signals::empty_mask_in_child(&mut cmd);
    let mut passed_on = false;
    let st = {
        let _held = HeldSignals::new();
        let mut child = cmd.spawn()?;
        loop {
            if let Some(st) = child.try_wait()? {
                break st;
            }
            if let Some(sig) = _held.wait(std::time::Duration::from_millis(50)) {
                // SAFETY: a signal to our own child.
                unsafe { libc::kill(child.id() as libc::pid_t, sig) };
                passed_on = true;
            }
        }
    };
    // A run ended by a signal passed on has its report (its exit status is
    // the ended command's): checked like any other.
    let checked = st.success() || (passed_on && json.is_file());
    if !checked {
        return Err(Refusal::new(format!("the run failed ({st}); nothing to verify")).into());
    }
    Ok(file::load(&json)?)
}
