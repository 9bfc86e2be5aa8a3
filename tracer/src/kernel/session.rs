//! Loading the eBPF object and attaching the resolved probes. Dropping a
//! [`Session`] detaches every link and unloads every program: faultscope
//! leaves nothing attached behind it.

use std::{collections::BTreeMap, path::Path};

use anyhow::{anyhow, Context as _, Result};
use aya::maps::Array;
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{KProbe, TracePoint},
    Ebpf, EbpfLoader,
};
use faultscope_common::maps::{
    phase_id, TargetInfo, CONFIG_EXCEPTIONS, CONFIG_TP_CLASSES, NDROPS, PHASE_LIFECYCLE, PHASE_MARKS,
};

use crate::kernel::{
    self,
    probes::{Hook, Resolution, Resolved, PROBES},
};

/// The eBPF object built by build.rs for this target's architecture.
#[cfg(feature = "ebpf")]
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/faultscope"));
/// Built without the `ebpf` feature: a library that reads reports only.
#[cfg(not(feature = "ebpf"))]
pub static EBPF_OBJECT: &[u8] = &[];

/// What happened to each probe of the table in this run.
#[derive(Clone, Debug)]
pub struct ProbeStatus {
    pub program: &'static str,
    pub target: String,
    pub attached: bool,
    pub reason: Option<String>,
}

pub struct Session {
    pub bpf: Ebpf,
    pub status: Vec<ProbeStatus>,
    _logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
}

/// Loader with the tracepoint field offsets of this kernel.
fn loader(tracefs: &Path, stats_entries: u32) -> Result<Ebpf> {
    let mut offsets: Vec<(&'static str, u32)> = Vec::new();
    let mut want = |cat: &str, name: &str, field: &str, global: &'static str| {
        if let Ok(fields) = kernel::tracepoint_fields(tracefs, cat, name) {
            if let Some(off) = fields.get(field) {
                offsets.push((global, *off as u32));
            }
        }
    };
    want("exceptions", "page_fault_user", "address", "PF_ADDRESS_OFF");
    want("exceptions", "page_fault_user", "error_code", "PF_ERROR_CODE_OFF");
    want("task", "task_newtask", "pid", "NEWTASK_PID_OFF");
    want("task", "task_newtask", "clone_flags", "NEWTASK_CLONE_FLAGS_OFF");
    let mut l = EbpfLoader::new();
    for (name, off) in &offsets {
        l.override_global(name, off, true);
    }
    l.map_max_entries("STATS", stats_entries);
    if EBPF_OBJECT.is_empty() {
        anyhow::bail!("this faultscope was built without its eBPF object (the `ebpf` feature)");
    }
    l.load(EBPF_OBJECT).context("loading the eBPF object")
}

impl Session {
    /// Loads the object and attaches every probe resolution says is
    /// attachable. Probes that fail to attach are recorded with the kernel's
    /// reason; a required probe that fails is an error.
    pub fn attach(tracefs: &Path, resolved: &[Resolved], stats_entries: u32) -> Result<Session> {
        let mut bpf = loader(tracefs, stats_entries)?;
        let logger = aya_log::EbpfLogger::init(&mut bpf).ok();
        let mut status = Vec::new();
        for r in resolved {
            let spec = r.spec;
            let redundant = spec
                .redundant_with
                .filter(|other| status.iter().any(|s: &ProbeStatus| s.program == *other && s.attached));
            let st = match &r.resolution {
                _ if redundant.is_some() => ProbeStatus {
                    program: spec.program,
                    target: hook_name(spec.hook),
                    attached: false,
                    reason: Some(format!("not needed: {} tells the same", redundant.unwrap_or_default())),
                },
                Resolution::Unavailable(why) => ProbeStatus {
                    program: spec.program,
                    target: hook_name(spec.hook),
                    attached: false,
                    reason: Some(why.clone()),
                },
                Resolution::Attach(sym) => match attach_one(&mut bpf, spec.program, spec.hook, sym) {
                    Ok(()) => ProbeStatus {
                        program: spec.program,
                        target: sym.clone(),
                        attached: true,
                        reason: None,
                    },
                    Err(e) => ProbeStatus {
                        program: spec.program,
                        target: sym.clone(),
                        attached: false,
                        reason: Some(attach_reason(&e)),
                    },
                },
            };
            if spec.required && !st.attached {
                return Err(anyhow!(
                    "required probe {} ({}) is not available: {}",
                    spec.program,
                    st.target,
                    st.reason.as_deref().unwrap_or("?")
                ));
            }
            status.push(st);
        }
        Ok(Session { bpf, status, _logger: logger })
    }

    pub fn attached(&self, program: &str) -> bool {
        self.status.iter().any(|s| s.program == program && s.attached)
    }

    pub fn reason(&self, program: &str) -> Option<&str> {
        self.status.iter().find(|s| s.program == program).and_then(|s| s.reason.as_deref())
    }

    pub fn targets(&mut self) -> Result<BpfHashMap<&mut MapData, u32, TargetInfo>> {
        let m = self.bpf.map_mut("TARGETS").ok_or_else(|| anyhow!("no TARGETS map"))?;
        Ok(BpfHashMap::try_from(m)?)
    }

    pub fn add_target(&mut self, tgid: u32, info: TargetInfo) -> Result<()> {
        self.targets()?.insert(tgid, info, 0).with_context(|| format!("adding pid {tgid} to the traced set"))
    }

    pub fn remove_target(&mut self, tgid: u32) {
        if let Ok(mut t) = self.targets() {
            let _ = t.remove(&tgid);
        }
    }

    /// Tells the kernel side what to record (see `CONFIG_TP_CLASSES`).
    pub fn configure(&mut self, tp_classes: u32, exceptions: bool) -> Result<()> {
        let m = self.bpf.map_mut("CONFIG").ok_or_else(|| anyhow!("no CONFIG map"))?;
        let mut a: Array<_, u32> = Array::try_from(m)?;
        a.set(CONFIG_TP_CLASSES, tp_classes, 0)?;
        a.set(CONFIG_EXCEPTIONS, exceptions as u32, 0)?;
        Ok(())
    }

    /// Sum over CPUs of the kernel side's drop counters, by report key.
    pub fn drops(&self) -> Result<BTreeMap<String, u64>> {
        const KEYS: [&str; NDROPS as usize] = [
            "stats_map_full",
            "threads_map_full",
            "targets_map_full",
            "events_ring_full",
            "lost_kretprobe_returns",
        ];
        let m = self.bpf.map("DROPS").ok_or_else(|| anyhow!("no DROPS map"))?;
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(m)?;
        let mut out = BTreeMap::new();
        for (i, k) in KEYS.iter().enumerate() {
            out.insert(k.to_string(), arr.get(&(i as u32), 0)?.iter().sum());
        }
        Ok(out)
    }

    fn phase_counters(&self) -> Result<(u32, u32)> {
        let m = self.bpf.map("PHASE").ok_or_else(|| anyhow!("no PHASE map"))?;
        let a: Array<_, u64> = Array::try_from(m)?;
        Ok((a.get(&PHASE_LIFECYCLE, 0)? as u32, a.get(&PHASE_MARKS, 0)? as u32))
    }

    /// The phase faults are accounted to now.
    pub fn current_phase(&self) -> Result<u32> {
        let (l, m) = self.phase_counters()?;
        Ok(phase_id(l, m))
    }

    /// Starts a new phase (a mark) and returns its id. Only user space
    /// writes the marks counter, so a plain write is race-free.
    /// `then` runs right after the switch, before anything else can touch
    /// memory: it is where the tracefs marker goes, so that a trace split on
    /// markers splits exactly where the kernel switched phase.
    pub fn mark(&mut self, then: impl FnOnce()) -> Result<u32> {
        let (_, marks) = self.phase_counters()?;
        let m = self.bpf.map_mut("PHASE").ok_or_else(|| anyhow!("no PHASE map"))?;
        let mut a: Array<_, u64> = Array::try_from(m)?;
        a.set(PHASE_MARKS, marks.wrapping_add(1) as u64, 0)?;
        then();
        self.current_phase()
    }

    pub fn events(&mut self) -> Result<RingBuf<&mut MapData>> {
        let m = self.bpf.map_mut("EVENTS").ok_or_else(|| anyhow!("no EVENTS map"))?;
        Ok(RingBuf::try_from(m)?)
    }

    pub fn flush_logs(&mut self) {
        if let Some(l) = self._logger.as_mut() {
            l.flush();
        }
    }
}

fn hook_name(h: Hook) -> String {
    match h {
        Hook::Kprobe(f) => f.join("|"),
        Hook::Kretprobe(f) => format!("{} (return)", f.join("|")),
        Hook::Tracepoint(c, n) => format!("{c}:{n}"),
    }
}

fn attach_one(bpf: &mut Ebpf, program: &str, hook: Hook, sym: &str) -> Result<()> {
    let prog =
        bpf.program_mut(program).ok_or_else(|| anyhow!("program {program} missing from the eBPF object"))?;
    match hook {
        Hook::Kprobe(_) | Hook::Kretprobe(_) => {
            let p: &mut KProbe = prog.try_into()?;
            p.load().with_context(|| format!("loading {program}"))?;
            p.attach(sym, 0).with_context(|| format!("attaching {program} to {sym}"))?;
        }
        Hook::Tracepoint(cat, name) => {
            let p: &mut TracePoint = prog.try_into()?;
            p.load().with_context(|| format!("loading {program}"))?;
            p.attach(cat, name).with_context(|| format!("attaching {program} to {cat}:{name}"))?;
        }
    }
    Ok(())
}

/// A one-line reason from an attach error chain, naming lockdown when the
/// kernel's EPERM comes from it.
fn attach_reason(e: &anyhow::Error) -> String {
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    let mut s = chain.join(": ");
    if s.contains("Operation not permitted") {
        if let Some(l) = kernel::lockdown().filter(|l| l != "none") {
            s.push_str(&format!(" (kernel lockdown={l})"));
        }
    }
    s
}

/// Loads every program of the object into the kernel without attaching any:
/// the verifier's verdict on each, for `faultscope probes --load`.
pub fn load_all(tracefs: &Path) -> Result<BTreeMap<&'static str, Result<(), String>>> {
    let mut bpf = loader(tracefs, 64)?;
    let mut out = BTreeMap::new();
    for spec in PROBES {
        let res = (|| -> Result<()> {
            let prog = bpf.program_mut(spec.program).ok_or_else(|| anyhow!("missing from the object"))?;
            match spec.hook {
                Hook::Kprobe(_) | Hook::Kretprobe(_) => {
                    let p: &mut KProbe = prog.try_into()?;
                    p.load()?;
                }
                Hook::Tracepoint(..) => {
                    let p: &mut TracePoint = prog.try_into()?;
                    p.load()?;
                }
            }
            Ok(())
        })();
        out.insert(spec.program, res.map_err(|e| format!("{e:#}")));
    }
    Ok(out)
}
