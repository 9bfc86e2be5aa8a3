//! Loading the eBPF object and attaching the resolved probes. Dropping a
//! [`Session`] detaches every link and unloads every program: faultscope
//! leaves nothing attached behind it.

use super::drops::{DropReason, Drops};
use std::{os::fd::AsFd as _, path::Path, time::Instant};

use anyhow::{anyhow, Context as _, Result};
use aya::maps::Array;
use aya::{
    maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePoint, FEntry, FExit, KProbe, TracePoint},
    Ebpf,
};
use faultscope_common::{
    maps::{
        phase_id, CgroupDir, ClassSetKey, Config, ConfigValues, DropKind, FltCount, LifeEvent, PhaseId, Stat,
        TargetInfo, CGROUP_PATH_MAX,
    },
    Program,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::kernel::{
    self,
    btf::KernelBtf,
    footprint::Sizes,
    latency::LatencyWindow,
    probes::{self, Backend, BackendChoice, Hook, Resolution, Resolved},
};

/// The eBPF object built by build.rs for this target's architecture.
#[cfg(feature = "ebpf")]
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/faultscope-ebpf"));
/// Built without the `ebpf` feature: a library that reads reports only.
#[cfg(not(feature = "ebpf"))]
pub static EBPF_OBJECT: &[u8] = &[];

/// What happened to each probe of the table in this run.
#[derive(Clone, Debug)]
pub struct ProbeStatus {
    pub program: Program,
    pub target: String,
    pub attached: bool,
    pub reason: Option<String>,
    /// How it is attached (`Backend::attach_kind`), when it is.
    pub kind: Option<&'static str>,
    /// Why that way (a kprobe where fentry was possible in principle).
    pub backend_reason: Option<String>,
}

impl ProbeStatus {
    fn not_attached(program: Program, target: String, reason: String) -> ProbeStatus {
        ProbeStatus {
            program,
            target,
            attached: false,
            reason: Some(reason),
            kind: None,
            backend_reason: None,
        }
    }
}

/// Whether these probes are exit-only mode's: the fault entry folded
/// into the return's fexit (attached, with no attachment of its own).
pub fn exit_only_in(status: &[ProbeStatus]) -> bool {
    status.iter().any(|s| s.program == Program::FaultEntry && s.attached && s.kind.is_none())
}

/// Where a timed fault's time starts with these probes.
pub fn latency_window(status: &[ProbeStatus]) -> LatencyWindow {
    if exit_only_in(status) {
        LatencyWindow::Exception
    } else {
        LatencyWindow::Entry
    }
}

pub struct Session {
    pub bpf: Ebpf,
    pub status: Vec<ProbeStatus>,
    /// The VMA start offset the programs read, or why there is none.
    pub vma_offset: Result<u32, String>,
    /// Whether the programs read the order of each new anon folio (BTF
    /// said where it is), or why not.
    pub folio_order: Result<(), String>,
    _logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    /// Held while the kernel accounts each program's runs (bpf_stats);
    /// closing it ends the accounting.
    stats: Option<std::os::fd::OwnedFd>,
    /// `PHASE` in this process's memory (mapped at the attach, so that a
    /// mark makes no system call).
    phase: PhaseCount,
}

/// Detaches every program at once, one thread each: each detach waits for
/// the kernel's RCU grace periods, and waits made together share them
/// (one after another they added about 75 ms a program on this project's
/// host, 0.9 s in a TCG guest, to every run's end).
impl Drop for Session {
    fn drop(&mut self) {
        log::debug!("end: detaching");
        std::thread::scope(|scope| {
            for (name, p) in self.bpf.programs_mut() {
                let _ = std::thread::Builder::new().spawn_scoped(scope, move || {
                    let t0 = std::time::Instant::now();
                    let _ = match p {
                        aya::programs::Program::KProbe(p) => p.unload(),
                        aya::programs::Program::FEntry(p) => p.unload(),
                        aya::programs::Program::FExit(p) => p.unload(),
                        aya::programs::Program::BtfTracePoint(p) => p.unload(),
                        aya::programs::Program::TracePoint(p) => p.unload(),
                        // The rest close when the object is dropped.
                        _ => Ok(()),
                    };
                    log::debug!("end: {name} unloaded in {:?}", t0.elapsed());
                });
            }
        });
        log::debug!("end: programs detached");
    }
}

/// The kernel's count of phase changes (the `PHASE` array, created
/// `BPF_F_MMAPABLE`) mapped into this process: a mark adds to it with the
/// same atomic read-modify-write the programs use.
struct PhaseCount {
    /// The mapping's address (a `usize`, so that the session stays `Send`).
    addr: usize,
    len: usize,
}

impl PhaseCount {
    fn map(bpf: &Ebpf) -> Result<PhaseCount> {
        use std::os::fd::{AsFd as _, AsRawFd as _};
        let Some(aya::maps::Map::Array(data)) = bpf.map("PHASE") else {
            anyhow::bail!("no PHASE array");
        };
        // SAFETY: sysconf has no preconditions.
        let len = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // SAFETY: a shared mapping of the map's first page, which holds its
        // one u64; unmapped on drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(anyhow!("mapping the kernel's phase count: {}", std::io::Error::last_os_error()));
        }
        Ok(PhaseCount { addr: p as usize, len })
    }

    /// Adds 1; the id of the phase this starts.
    fn bump(&self) -> PhaseId {
        // SAFETY: the mapping lives as long as `self`; the u64 is aligned
        // (the map's value area starts the page).
        let count = unsafe { std::sync::atomic::AtomicU64::from_ptr(self.addr as *mut u64) };
        phase_id(count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
    }
}

impl Drop for PhaseCount {
    fn drop(&mut self) {
        // SAFETY: mapped by `map`, unmapped once.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// The tracepoint fields the programs read: (category, name, field, the
/// object's global that takes its offset).
const TP_FIELDS: [(&str, &str, &str, &str); 8] = [
    ("exceptions", "page_fault_user", "address", "PF_ADDRESS_OFF"),
    ("exceptions", "page_fault_user", "ip", "PF_IP_OFF"),
    ("exceptions", "page_fault_user", "error_code", "PF_ERROR_CODE_OFF"),
    ("task", "task_newtask", "pid", "NEWTASK_PID_OFF"),
    ("task", "task_newtask", "clone_flags", "NEWTASK_CLONE_FLAGS_OFF"),
    ("cgroup", "cgroup_mkdir", "root", "MKDIR_ROOT_OFF"),
    ("cgroup", "cgroup_mkdir", "id", "MKDIR_ID_OFF"),
    ("cgroup", "cgroup_mkdir", "path", "MKDIR_PATH_OFF"),
];

/// The offsets of [`TP_FIELDS`] in this kernel, by global, and a warning for
/// each field of an existing tracepoint whose offset could not be read (its
/// program would then read the compiled-in x86-64 offset). A tracepoint
/// this kernel lacks needs none: no program can attach to it.
fn tracepoint_offsets(tracefs: &Path) -> (Vec<(&'static str, u32)>, Vec<String>) {
    let mut offsets = Vec::new();
    let mut warnings = Vec::new();
    for (cat, name, field, global) in TP_FIELDS {
        if !kernel::tracepoint_exists(tracefs, cat, name) {
            continue;
        }
        let why = match kernel::tracepoint_fields(tracefs, cat, name) {
            Ok(fields) => match fields.get(field) {
                Some(off) => {
                    offsets.push((global, *off as u32));
                    continue;
                }
                None => "no such field in its format".to_string(),
            },
            Err(e) => format!("{e:#}"),
        };
        warnings.push(format!(
            "warning: tracepoint {cat}:{name}: offset of field {field} unknown ({why}); using the compiled-in x86-64 default"
        ));
    }
    (offsets, warnings)
}

/// `vm_area_struct.vm_start`'s offset from the running kernel's BTF, or why
/// per-mapping counting is not possible here.
pub fn vma_start_offset(btf: &KernelBtf) -> Result<u32, String> {
    btf.member_offset("vm_area_struct", "vm_start")
        .map_err(|e| format!("vm_area_struct.vm_start not found in the kernel's BTF: {e}"))
}

/// The globals that let the programs describe a VMA (`VMA_DESCRIBED` and
/// the offsets it stands for), from BTF: all of them, or why not. A member
/// path `a.b` sums the offsets of `b` in the type of `a`.
pub fn vma_description_offsets(btf: &KernelBtf) -> Result<Vec<(&'static str, u32)>, String> {
    const MEMBERS: [(&str, &[(&str, &str)]); 10] = [
        ("VMA_END_OFF", &[("vm_area_struct", "vm_end")]),
        ("VMA_PGOFF_OFF", &[("vm_area_struct", "vm_pgoff")]),
        ("VMA_FLAGS_OFF", &[("vm_area_struct", "vm_flags")]),
        ("VMA_FILE_OFF", &[("vm_area_struct", "vm_file")]),
        ("FILE_DENTRY_OFF", &[("file", "f_path"), ("path", "dentry")]),
        ("FILE_INODE_OFF", &[("file", "f_inode")]),
        ("INODE_INO_OFF", &[("inode", "i_ino")]),
        ("INODE_SB_OFF", &[("inode", "i_sb")]),
        ("SB_DEV_OFF", &[("super_block", "s_dev")]),
        ("DENTRY_NAME_OFF", &[("dentry", "d_name"), ("qstr", "name")]),
    ];
    let mut out = vec![("VMA_DESCRIBED", 1)];
    for (global, path) in MEMBERS {
        let mut off = 0;
        for (s, m) in path {
            off += btf.member_offset(s, m).map_err(|e| format!("{s}.{m} not in the kernel's BTF: {e}"))?;
        }
        out.push((global, off));
    }
    Ok(out)
}

/// `task_struct.mm` and `mm_struct.mm_lock_seq`, where the kernel has a
/// write sequence (per-VMA locks, 6.4+); none otherwise.
fn mm_lock_seq_offsets(btf: &KernelBtf) -> Vec<(&'static str, u32)> {
    match (btf.member_offset("task_struct", "mm"), btf.member_offset("mm_struct", "mm_lock_seq")) {
        (Ok(mm), Ok(seq)) => vec![("TASK_MM_OFF", mm), ("MM_LOCK_SEQ_OFF", seq)],
        _ => Vec::new(),
    }
}

/// One attached program's cost, as the kernel accounts it (bpf_stats): the
/// program's own run time, without what attaching costs around it (a
/// kprobe's breakpoint, a kretprobe's return trampoline).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProgramCost {
    /// The program's name in the object (a fentry twin ends in `_fe`).
    pub name: String,
    /// The probe of the table it serves.
    pub probe: String,
    /// `tracepoint`, `tp_btf`, `kprobe`, `kretprobe`, `fentry` or `fexit`.
    pub backend: String,
    /// The kernel function or tracepoint.
    pub target: String,
    pub runs: u64,
    pub run_time_ns: u64,
    /// `run_time_ns / runs`; absent when it never ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_per_run: Option<f64>,
}

/// A hash map's bound and the entries it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapFill {
    pub name: &'static str,
    pub capacity: u64,
    pub entries: u64,
}

/// How `sched_process_exit` tells that the last thread of a process exits
/// (a process is gone only then: its leader may exit first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitDetection {
    /// The tracepoint's `group_dead` field, at this offset (newer kernels:
    /// 6.18 has it, 6.12 not).
    GroupDead(u32),
    /// `current->signal->live`, at these BTF offsets (task_struct.signal,
    /// signal_struct.live): 0 once every thread is exiting.
    SignalLive { signal: u32, live: u32 },
    /// Neither: the thread-group leader's exit, and why.
    Leader(String),
}

impl ExitDetection {
    /// The object's globals that select it.
    fn globals(&self) -> Vec<(&'static str, u32)> {
        match self {
            ExitDetection::GroupDead(off) => vec![("EXIT_GROUP_DEAD_OFF", *off)],
            ExitDetection::SignalLive { signal, live } => {
                vec![("TASK_SIGNAL_OFF", *signal), ("SIGNAL_LIVE_OFF", *live)]
            }
            ExitDetection::Leader(_) => vec![],
        }
    }
}

/// The best way this kernel offers. In a debug build (the host tests'),
/// `FAULTSCOPE_EXIT_VIA=signal-live` or `=leader` skips the better ones, to
/// test the fallbacks; a release build reads no such variable.
pub fn exit_detection(tracefs: &Path, btf: &KernelBtf) -> ExitDetection {
    let via = if cfg!(debug_assertions) {
        std::env::var("FAULTSCOPE_EXIT_VIA").unwrap_or_default()
    } else {
        String::new()
    };
    if via.is_empty() {
        if let Some(off) = kernel::tracepoint_fields(tracefs, "sched", "sched_process_exit")
            .ok()
            .and_then(|f| f.get("group_dead").copied())
        {
            return ExitDetection::GroupDead(off as u32);
        }
    }
    if via != "leader" {
        let offsets = btf
            .member_offset("task_struct", "signal")
            .and_then(|signal| Ok((signal, btf.member_offset("signal_struct", "live")?)));
        return match offsets {
            Ok((signal, live)) if signal != 0 => ExitDetection::SignalLive { signal, live },
            Ok(_) => ExitDetection::Leader("BTF puts task_struct.signal at offset 0".into()),
            Err(e) => ExitDetection::Leader(e),
        };
    }
    ExitDetection::Leader("FAULTSCOPE_EXIT_VIA=leader".into())
}

/// `task_struct.min_flt` and `maj_flt` from BTF: the kernel's own fault
/// count of a thread, which the kernel check compares with.
pub fn task_flt_offsets(btf: &KernelBtf) -> Result<(u32, u32), String> {
    let off = |m| {
        btf.member_offset("task_struct", m)
            .map_err(|e| format!("task_struct.{m} not found in the kernel's BTF: {e}"))
    };
    Ok((off("min_flt")?, off("maj_flt")?))
}

/// Loader with the tracepoint field offsets and the BTF offsets of this
/// kernel. `aya_btf`: aya's parse of the kernel's BTF, given only when
/// fentry programs are loaded (aya would otherwise parse it again itself).
fn loader(
    tracefs: &Path,
    sizes: Sizes,
    vma_offset: Option<u32>,
    btf: &KernelBtf,
    aya_btf: Option<&aya::Btf>,
    exit_only: bool,
) -> Result<Ebpf> {
    let (mut offsets, warnings) = tracepoint_offsets(tracefs);
    for w in warnings {
        crate::term::say(&format!("faultscope: {w}"));
    }
    let exit = exit_detection(tracefs, btf);
    if let ExitDetection::Leader(why) = &exit {
        crate::term::say(&format!(
            "faultscope: warning: cannot tell the last thread of a process ({why}); a process counts as exited when its main thread exits"
        ));
    }
    offsets.extend(exit.globals());
    match task_flt_offsets(btf) {
        Ok((min, maj)) => offsets.extend([("TASK_MIN_FLT_OFF", min), ("TASK_MAJ_FLT_OFF", maj)]),
        Err(why) => crate::term::say(&format!(
            "faultscope: warning: {why}; the kernel's own fault count is not checked"
        )),
    }
    // What the tp_btf twins of task_newtask and cgroup_mkdir read (left 0
    // where BTF lacks it: their reads then fail, counted as drops).
    for (global, s, m) in [
        ("TASK_PID_OFF", "task_struct", "pid"),
        ("CGROUP_ROOT_OFF", "cgroup", "root"),
        ("ROOT_HIERARCHY_ID_OFF", "cgroup_root", "hierarchy_id"),
        ("CGROUP_KN_OFF", "cgroup", "kn"),
        ("KERNFS_ID_OFF", "kernfs_node", "id"),
    ] {
        if let Ok(off) = btf.member_offset(s, m) {
            offsets.push((global, off));
        }
    }
    // Faults raised with page faults disabled are not the kernel's to
    // handle: left out (a kernel without the field in BTF counts them).
    match btf.member_offset("task_struct", "pagefault_disabled") {
        Ok(off) => offsets.push(("TASK_PAGEFAULT_DISABLED_OFF", off)),
        Err(why) => crate::term::say(&format!(
            "faultscope: warning: task_struct.pagefault_disabled not in the kernel's BTF ({why}): kernel-mode faults of nofault copies are counted"
        )),
    }
    match btf.folio_order_offsets() {
        Ok(v) => offsets.extend(v),
        Err(why) => crate::term::say(&format!(
            "faultscope: warning: the folio order is not in the kernel's BTF ({why}): new folios are counted without their size"
        )),
    }
    if vma_offset.is_some() {
        // Without them mappings are named from the maps snapshots alone.
        match vma_description_offsets(btf) {
            Ok(v) => offsets.extend(v),
            Err(why) => crate::term::say(&format!(
                "faultscope: warning: {why}; a process that exits before its maps are read has its mappings unnamed"
            )),
        }
        offsets.extend(mm_lock_seq_offsets(btf));
    }
    log::debug!("start: offsets read (tracefs formats, BTF)");
    let mut l = btf.take_loader();
    // THREADS is task-local storage, which aya 0.14 creates but has no
    // user-space type for (user space never reads it).
    l.allow_unsupported_maps();
    // The object has no CO-RE relocations: aya needs the kernel's BTF only
    // to load fentry programs.
    l.btf(aya_btf);
    for (name, off) in &offsets {
        l.override_global(name, off, true);
    }
    if let Some(off) = &vma_offset {
        l.override_global("VMA_START_OFF", off, true);
    }
    l.map_max_entries("STATS", sizes.stats);
    l.map_max_entries("STACK_TRACES", sizes.stacks.max(1));
    for (map, entries) in sizes.attribution() {
        l.map_max_entries(map, entries);
    }
    let filter = (sizes.cgroups > 0) as u32;
    l.override_global("CGROUP_FILTER", &filter, true);
    l.map_max_entries("CGROUPS", sizes.cgroups.max(1));
    let filter = (sizes.comms > 0) as u32;
    l.override_global("COMM_FILTER", &filter, true);
    l.map_max_entries("COMMS", sizes.comms.max(1));
    let exit_only = exit_only as u32;
    l.override_global("EXIT_ONLY", &exit_only, true);
    let exec_phase = sizes.exec_phase as u32;
    l.override_global("EXEC_PHASE", &exec_phase, true);
    let all = sizes.system_wide as u32;
    l.override_global("TRACE_ALL", &all, true);
    if EBPF_OBJECT.is_empty() {
        anyhow::bail!("this faultscope was built without its eBPF object (the `ebpf` feature)");
    }
    l.load(EBPF_OBJECT).context("loading the eBPF object")
}

impl Session {
    /// Loads the object and attaches every probe resolution says is
    /// attachable, the way it says. Probes that fail to attach are recorded
    /// with the kernel's reason; a required probe that fails is an error,
    /// and so is a probe `--backend fentry` cannot have. With `--backend
    /// auto`, a fentry the kernel refuses falls back to the kprobe.
    pub fn attach(
        tracefs: &Path,
        resolved: &[Resolved],
        sizes: Sizes,
        btf: &KernelBtf,
        choice: BackendChoice,
    ) -> Result<Session> {
        if let Some(why) = resolved.iter().find_map(|r| match &r.resolution {
            Resolution::Refused(why) => Some(why),
            _ => None,
        }) {
            return Err(crate::error::Refusal::new(why.clone()).into());
        }
        let aya_btf = fentry_btf(resolved, btf, choice)?;
        let vma_offset = vma_start_offset(btf);
        let exit_only = aya_btf.is_some() && probes::exit_only(resolved);
        let mut bpf = loader(tracefs, sizes, vma_offset.as_ref().ok().copied(), btf, aya_btf, exit_only)?;
        log::debug!("start: object parsed, maps created");
        let logger = aya_log::EbpfLogger::init(&mut bpf).ok();
        preload(&mut bpf, resolved, exit_only, aya_btf);
        log::debug!("start: programs loaded (verified)");
        let mut status = Vec::new();
        for r in resolved {
            let spec = r.spec;
            let attached = |p: Program| status.iter().any(|s: &ProbeStatus| s.program == p && s.attached);
            let redundant = spec.redundant_with.filter(|other| attached(*other));
            let unneeded = spec.only_with.filter(|other| !attached(*other));
            let exception_opens = attached(Program::PageFaultUser) && attached(Program::PageFaultKernel);
            let folded = spec.folded_into.filter(|other| {
                exit_only
                    && exception_opens
                    && status.iter().any(|s| s.program == *other && s.kind == Some("fexit"))
            });
            let st = match &r.resolution {
                _ if folded.is_some() => ProbeStatus {
                    program: spec.program,
                    target: match &r.resolution {
                        Resolution::Attach { symbol, .. } => symbol.clone(),
                        _ => hook_name(spec.hook),
                    },
                    attached: true,
                    reason: Some(format!(
                        "folded into {}: its fexit reads the arguments at the return, and the exception opens the fault (exit-only mode)",
                        folded.map(Program::name).unwrap_or_default()
                    )),
                    kind: None,
                    backend_reason: None,
                },
                _ if unneeded.is_some() => ProbeStatus::not_attached(
                    spec.program,
                    hook_name(spec.hook),
                    format!(
                        "not needed: {} is not attached",
                        unneeded.map(Program::name).unwrap_or_default()
                    ),
                ),
                _ if redundant.is_some() => ProbeStatus::not_attached(
                    spec.program,
                    hook_name(spec.hook),
                    format!(
                        "not needed: {} tells the same",
                        redundant.map(Program::name).unwrap_or_default()
                    ),
                ),
                Resolution::Unavailable(why) | Resolution::Refused(why) => {
                    ProbeStatus::not_attached(spec.program, hook_name(spec.hook), why.clone())
                }
                Resolution::Attach { symbol, backend, why, fallback } => {
                    attach_resolved(&mut bpf, spec, symbol, (*backend, why), fallback, choice, aya_btf)?
                }
            };
            if let (Some(other), false) = (spec.only_with, st.attached || unneeded.is_some()) {
                return Err(anyhow!(
                    "probe {} ({}) is not available, and {other} cannot be right without it: {}",
                    spec.program,
                    st.target,
                    st.reason.as_deref().unwrap_or("?")
                ));
            }
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
        let phase = PhaseCount::map(&bpf)?;
        let folio_order = btf.folio_order_offsets().map(drop);
        Ok(Session { bpf, status, vma_offset, folio_order, _logger: logger, stats: None, phase })
    }

    /// Turns on the kernel's accounting of program run time and count
    /// (BPF_ENABLE_STATS, 5.8+; `kernel.bpf_stats_enabled` stays as it is
    /// and the accounting ends with this run).
    pub fn enable_program_stats(&mut self) -> Result<()> {
        let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .context("turning on the kernel's BPF run-time accounting (BPF_ENABLE_STATS, kernel 5.8+)")?;
        self.stats = Some(fd);
        Ok(())
    }

    /// Each attached program's runs and run time so far, from the kernel's
    /// accounting; `None` unless it was turned on.
    pub fn program_costs(&self) -> Result<Option<Vec<ProgramCost>>> {
        if !self.program_stats_on() {
            return Ok(None);
        }
        let mut out = Vec::new();
        for (st, kind, name, prog) in self.attached_programs()? {
            let info = prog.info().with_context(|| format!("reading {name}'s info"))?;
            let runs = info.run_count();
            let run_time_ns = info.run_time().as_nanos() as u64;
            out.push(ProgramCost {
                name: name.to_string(),
                probe: st.program.to_string(),
                backend: kind.to_string(),
                target: st.target.clone(),
                runs,
                run_time_ns,
                ns_per_run: (runs > 0).then(|| run_time_ns as f64 / runs as f64),
            });
        }
        Ok(Some(out))
    }

    /// Whether the kernel accounts program runs now: turned on for this
    /// run, or by `kernel.bpf_stats_enabled`.
    pub fn program_stats_on(&self) -> bool {
        self.stats.is_some()
            || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").is_ok_and(|v| v.trim() == "1")
    }

    /// The bound and the entries in use of the hash maps whose fill a long
    /// run should watch: the aggregates and the per-process tables.
    pub fn map_fill(&self) -> Vec<MapFill> {
        let count = |name: &'static str, n: Option<usize>| {
            let capacity = match self.bpf.map(name) {
                Some(Map::HashMap(d) | Map::PerCpuHashMap(d) | Map::LruHashMap(d)) => {
                    d.info().ok()?.max_entries()
                }
                _ => return None,
            };
            Some(MapFill { name, capacity: capacity as u64, entries: n? as u64 })
        };
        let keys = |name: &'static str| -> Option<usize> {
            let m = self.bpf.map(name)?;
            Some(match name {
                "STATS" => PerCpuHashMap::<_, ClassSetKey, Stat>::try_from(m).ok()?.keys().count(),
                "EXITED" => BpfHashMap::<_, u32, FltCount>::try_from(m).ok()?.keys().count(),
                "TARGETS" => BpfHashMap::<_, u32, TargetInfo>::try_from(m).ok()?.keys().count(),
                _ => BpfHashMap::<_, u32, u32>::try_from(m).ok()?.keys().count(),
            })
        };
        ["STATS", "TARGETS", "CHILDREN", "EXITED"].into_iter().filter_map(|n| count(n, keys(n))).collect()
    }

    /// Each attached program, with its attach kind and its name in the
    /// object.
    fn attached_programs(
        &self,
    ) -> Result<Vec<(&ProbeStatus, &'static str, &'static str, &aya::programs::Program)>> {
        let mut out = Vec::new();
        for st in self.status.iter().filter(|s| s.attached) {
            let Some(kind) = st.kind else { continue };
            let name = match kind {
                "fentry" | "fexit" | "tp_btf" => st.program.fentry_name().unwrap_or(st.program.name()),
                _ => st.program.name(),
            };
            let prog = self.bpf.program(name).ok_or_else(|| anyhow!("no program {name}"))?;
            out.push((st, kind, name, prog));
        }
        Ok(out)
    }

    /// Runs of the attached programs that the kernel skipped, summed
    /// (`bpf_prog_info.recursion_misses`); `None` where the kernel does not
    /// count them (before 5.12; kprobe and tracepoint programs from 6.7).
    /// See [`DropReason::SkippedRuns`] for when the kernel skips one. The
    /// kernel-mode exception programs are left out: faultscope's own stack
    /// walks and probe reads fault inside its programs, with page faults
    /// disabled, and the kernel skips those nested runs, which would count
    /// nothing.
    pub fn skipped_runs(&self) -> Result<Option<u64>> {
        let mut total = None;
        let nested = [Program::PageFaultKernel, Program::MemAbort];
        for (_, _, name, prog) in
            self.attached_programs()?.into_iter().filter(|p| !nested.contains(&p.0.program))
        {
            let fd = prog.fd().with_context(|| format!("{name}'s descriptor"))?;
            let n = kernel::prog_info::recursion_misses(fd.as_fd())
                .with_context(|| format!("reading {name}'s info"))?;
            total = match (total, n) {
                (t, None) => t,
                (t, Some(n)) => Some(t.unwrap_or(0) + n),
            };
        }
        Ok(total)
    }

    /// How the fault path is probed: the attach kind of the
    /// `handle_mm_fault` entry ("fentry" where exit-only mode folded it into
    /// the fexit), else the x86 tracepoint, else none.
    pub fn fault_path_backend(&self) -> &'static str {
        let kind =
            |p: Program| self.status.iter().find(|s| s.program == p && s.attached).and_then(|s| s.kind);
        let folded = self.exit_only().then_some("fentry");
        kind(Program::FaultEntry).or(folded).or(kind(Program::PageFaultUser)).unwrap_or("none")
    }

    /// Whether the run is in exit-only mode ([`probes::exit_only`]): the
    /// fault entry folded into the return's fexit, the exception opening
    /// each fault.
    pub fn exit_only(&self) -> bool {
        exit_only_in(&self.status)
    }

    pub fn attached(&self, program: Program) -> bool {
        self.status.iter().any(|s| s.program == program && s.attached)
    }

    pub fn reason(&self, program: Program) -> Option<&str> {
        self.status.iter().find(|s| s.program == program).and_then(|s| s.reason.as_deref())
    }

    pub fn targets(&mut self) -> Result<BpfHashMap<&mut MapData, u32, TargetInfo>> {
        let m = self.bpf.map_mut("TARGETS").ok_or_else(|| anyhow!("no TARGETS map"))?;
        Ok(BpfHashMap::try_from(m)?)
    }

    pub fn add_target(&mut self, tgid: u32, info: TargetInfo) -> Result<()> {
        self.targets()?
            .insert(tgid, info, 0)
            .with_context(|| format!("adding pid {tgid} to the traced set"))?;
        // An entry may have been rewritten (flags): threads look it up again.
        self.bump_targets_epoch()
    }

    /// Moves `TARGETS_EPOCH`: every thread's cached "traced" and every
    /// CPU's `UNTRACED` note is stale, so each thread looks its process up
    /// again at its next fault.
    fn bump_targets_epoch(&mut self) -> Result<()> {
        let m = self.bpf.map_mut("TARGETS_EPOCH").ok_or_else(|| anyhow!("no TARGETS_EPOCH map"))?;
        let mut a: aya::maps::Array<_, u64> = aya::maps::Array::try_from(m)?;
        let e = a.get(&0, 0)?;
        a.set(0, e.wrapping_add(1), 0)?;
        Ok(())
    }

    /// The kernel's cgroup filter: a process of cgroup `id` joins the traced
    /// set at its first event, reported with `index`.
    pub fn add_cgroup(&mut self, id: u64, index: u32) -> Result<()> {
        let m = self.bpf.map_mut("CGROUPS").context("no CGROUPS map")?;
        let mut cg: BpfHashMap<_, u64, u32> = BpfHashMap::try_from(m)?;
        cg.insert(id, index, 0).with_context(|| format!("adding cgroup {id} to the filter"))?;
        // Its processes were untraced until now: no CPU's note may say so.
        self.bump_targets_epoch()
    }

    /// Takes cgroup `id` out of the filter (its directory was removed).
    pub fn remove_cgroup(&mut self, id: u64) -> Result<()> {
        let m = self.bpf.map_mut("CGROUPS").context("no CGROUPS map")?;
        let mut cg: BpfHashMap<_, u64, u32> = BpfHashMap::try_from(m)?;
        cg.remove(&id).with_context(|| format!("removing cgroup {id} from the filter"))
    }

    /// The kernel's comm filter: a program exec'd under `comm` joins the
    /// traced set at its exec.
    pub fn add_comm(&mut self, comm: [u8; 16]) -> Result<()> {
        let m = self.bpf.map_mut("COMMS").context("no COMMS map")?;
        let mut c: BpfHashMap<_, [u8; 16], u32> = BpfHashMap::try_from(m)?;
        c.insert(comm, 0, 0).context("adding a comm to the filter")
    }

    /// Takes a traced process out of the traced set. (An exited one leaves
    /// it in the kernel, at its exit.)
    pub fn remove_target(&mut self, tgid: u32) {
        if let Ok(mut t) = self.targets() {
            let _ = t.remove(&tgid);
        }
        let _ = self.bump_targets_epoch();
    }

    /// Takes the kernel's sum of the own fault counts of `tgid`'s threads
    /// that exited while it was counted (`EXITED`), if any did.
    pub fn take_exited(&mut self, tgid: u32) -> Option<FltCount> {
        let m = self.bpf.map_mut("EXITED")?;
        let mut map: BpfHashMap<_, u32, FltCount> = BpfHashMap::try_from(m).ok()?;
        let v = map.get(&tgid, 0).ok();
        let _ = map.remove(&tgid);
        v
    }

    fn children(&mut self) -> Result<BpfHashMap<&mut MapData, u32, u32>> {
        let m = self.bpf.map_mut("CHILDREN").ok_or_else(|| anyhow!("no CHILDREN map"))?;
        Ok(BpfHashMap::try_from(m)?)
    }

    /// A child of traced process `parent` that still shares its memory
    /// (forked before attach): its exit or exec starts a phase.
    pub fn add_child(&mut self, child: u32, parent: u32) -> Result<()> {
        self.children()?.insert(child, parent, 0).with_context(|| format!("adding child {child} of {parent}"))
    }

    /// Takes `child` out of the children map; false when it was not there
    /// (the kernel took it out at its exit or exec, and said so).
    pub fn remove_child(&mut self, child: u32) -> bool {
        self.children().is_ok_and(|mut c| c.remove(&child).is_ok())
    }

    /// Tells the kernel side what to record: `(entry, value)` pairs of
    /// `CONFIG` (entries not given stay as they were: 0, off, at first).
    pub fn configure(&mut self, entries: &[(Config, u32)]) -> Result<()> {
        let m = self.bpf.map_mut("CONFIG").ok_or_else(|| anyhow!("no CONFIG map"))?;
        let mut a: Array<_, ConfigValues> = Array::try_from(m)?;
        let mut v = a.get(&0, 0)?;
        for (c, x) in entries {
            v[c.index() as usize] = *x;
        }
        a.set(0, v, 0)?;
        Ok(())
    }

    /// Sum over CPUs of the kernel side's drop counters, by report key
    /// (user space adds its own: `Recorder::drops`).
    pub fn drops(&self) -> Result<Drops> {
        let m = self.bpf.map("DROPS").ok_or_else(|| anyhow!("no DROPS map"))?;
        let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(m)?;
        let mut out = Drops::default();
        for d in DropKind::ALL {
            out.set(DropReason::Kernel(d), arr.get(&d.index(), 0)?.iter().sum());
        }
        if let Some(n) = self.skipped_runs()? {
            out.set(DropReason::SkippedRuns, n);
        }
        Ok(out)
    }

    /// The phase faults are accounted to now.
    pub fn current_phase(&self) -> Result<PhaseId> {
        let m = self.bpf.map("PHASE").ok_or_else(|| anyhow!("no PHASE map"))?;
        let a: Array<_, u64> = Array::try_from(m)?;
        Ok(phase_id(a.get(&0, 0)?))
    }

    /// Starts a new phase (a mark) and returns its id: the count of phase
    /// changes it made, added to atomically in the kernel's own memory (as
    /// a fork's program adds to it), so that a fork on another CPU at the
    /// same moment takes the id before or after, never the same.
    /// `then` runs right after the switch, before anything else can touch
    /// memory: it is where the tracefs marker goes, so that a trace split on
    /// markers splits exactly where the kernel switched phase.
    pub fn mark(&mut self, then: impl FnOnce()) -> Result<PhaseId> {
        let id = self.phase.bump();
        then();
        Ok(id)
    }

    /// Every record the kernel put in ring buffer `name` since the last
    /// call (a shorter one, which no program writes, is skipped).
    fn drain_ring<T: Copy>(&mut self, name: &str) -> Result<Vec<T>> {
        let m = self.bpf.map_mut(name).ok_or_else(|| anyhow!("no {name} map"))?;
        let mut ring = RingBuf::try_from(m)?;
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            if item.len() >= std::mem::size_of::<T>() {
                // SAFETY: a program wrote a T there; read unaligned.
                out.push(unsafe { std::ptr::read_unaligned(item.as_ptr() as *const T) });
            }
        }
        Ok(out)
    }

    /// The lifecycle events since the last call.
    pub fn events(&mut self) -> Result<Vec<LifeEvent>> {
        self.drain_ring("EVENTS")
    }

    /// The cgroup v2 directories made since the last call: (id, path); a
    /// path cut short at `CGROUP_PATH_MAX` is left out.
    pub fn cgroup_dirs(&mut self) -> Result<Vec<(u64, String)>> {
        let dirs: Vec<CgroupDir> = self.drain_ring("CGROUP_DIRS")?;
        // The copy keeps room for its NUL: a path of the whole room minus
        // one may have been cut.
        Ok(dirs
            .iter()
            .filter(|d| (d.len as usize) + 1 < CGROUP_PATH_MAX)
            .map(|d| (d.id, String::from_utf8_lossy(&d.path[..d.len as usize]).into_owned()))
            .collect())
    }

    pub fn flush_logs(&mut self) {
        if let Some(l) = self._logger.as_mut() {
            l.flush();
        }
    }
}

/// aya's parse of the kernel's BTF where a probe attaches by fentry (it
/// loads those programs); a parse that fails refuses `--backend fentry`.
fn fentry_btf<'a>(
    resolved: &[Resolved],
    btf: &'a KernelBtf,
    choice: BackendChoice,
) -> Result<Option<&'a aya::Btf>> {
    let fentry =
        resolved.iter().any(|r| matches!(r.resolution, Resolution::Attach { backend: Backend::Fentry, .. }));
    if !fentry {
        return Ok(None);
    }
    match btf.aya() {
        Ok(b) => Ok(Some(b)),
        Err(e) if choice == BackendChoice::Fentry => anyhow::bail!("--backend fentry: {e}"),
        Err(_) => Ok(None),
    }
}

/// Attaches a probe by the backend its resolution chose; an fentry the
/// kernel refuses falls back to the kprobe (or tracepoint) where the
/// resolution allows it, and is refused with `--backend fentry`.
fn attach_resolved(
    bpf: &mut Ebpf,
    spec: &super::probes::ProbeSpec,
    symbol: &str,
    (mut backend, why): (Backend, &str),
    fallback: &Result<(), String>,
    choice: BackendChoice,
    aya_btf: Option<&aya::Btf>,
) -> Result<ProbeStatus> {
    let mut why = why.to_string();
    let mut res = attach_one(bpf, spec.program, spec.hook, symbol, backend, aya_btf);
    if let (Err(e), Backend::Fentry) = (&res, backend) {
        let refused =
            format!("the kernel refused {}: {}", Backend::Fentry.attach_kind(spec.hook), attach_reason(e));
        match fallback {
            _ if choice == BackendChoice::Fentry => {
                anyhow::bail!("--backend fentry: probe {} on {symbol}: {refused}", spec.program)
            }
            Ok(()) => {
                why = refused;
                backend = match spec.hook {
                    Hook::Tracepoint(..) => Backend::Tracepoint,
                    _ => Backend::Kprobe,
                };
                res = attach_one(bpf, spec.program, spec.hook, symbol, backend, None);
            }
            Err(no_kprobe) => res = Err(anyhow!("{no_kprobe}; {refused}")),
        }
    }
    Ok(match res {
        Ok(()) => ProbeStatus {
            program: spec.program,
            target: symbol.to_string(),
            attached: true,
            reason: None,
            kind: Some(backend.attach_kind(spec.hook)),
            backend_reason: Some(why),
        },
        Err(e) => ProbeStatus::not_attached(spec.program, symbol.to_string(), attach_reason(&e)),
    })
}

fn hook_name(h: Hook) -> String {
    match h {
        Hook::Kprobe(f) => f.join("|"),
        Hook::Kretprobe(f) => format!("{} (return)", f.join("|")),
        Hook::Tracepoint(c, n) => format!("{c}:{n}"),
    }
}

fn attach_one(
    bpf: &mut Ebpf,
    program: Program,
    hook: Hook,
    sym: &str,
    backend: Backend,
    btf: Option<&aya::Btf>,
) -> Result<()> {
    let name = twin_name(program, backend)?;
    let prog = bpf.program_mut(name).ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))?;
    load_one(prog, hook, sym, backend, btf).with_context(|| format!("loading {name}"))?;
    match (backend, hook) {
        (Backend::Fentry, Hook::Kprobe(_)) => {
            let p: &mut FEntry = prog.try_into()?;
            p.attach().with_context(|| format!("attaching {name} to {sym}"))?;
        }
        (Backend::Fentry, Hook::Kretprobe(_)) => {
            let p: &mut FExit = prog.try_into()?;
            p.attach().with_context(|| format!("attaching {name} to {sym}"))?;
        }
        (Backend::Fentry, Hook::Tracepoint(_, _)) => {
            let p: &mut BtfTracePoint = prog.try_into()?;
            p.attach().with_context(|| format!("attaching {name} to {sym}"))?;
        }
        (_, Hook::Kprobe(_) | Hook::Kretprobe(_)) => {
            let p: &mut KProbe = prog.try_into()?;
            p.attach(sym, 0).with_context(|| format!("attaching {name} to {sym}"))?;
        }
        (_, Hook::Tracepoint(cat, tp)) => {
            let p: &mut TracePoint = prog.try_into()?;
            p.attach(cat, tp).with_context(|| format!("attaching {name} to {cat}:{tp}"))?;
        }
    }
    Ok(())
}

/// The object's program for `program` attached by `backend`.
fn twin_name(program: Program, backend: Backend) -> Result<&'static str> {
    match backend {
        Backend::Fentry => program.fentry_name().ok_or_else(|| anyhow!("{program} has no fentry twin")),
        _ => Ok(program.name()),
    }
}

/// Loads `prog` for `hook` by `backend` (the verifier runs
/// here), unless it is loaded already ([`preload`]).
fn load_one(
    prog: &mut aya::programs::Program,
    hook: Hook,
    sym: &str,
    backend: Backend,
    btf: Option<&aya::Btf>,
) -> Result<()> {
    if prog.fd().is_ok() {
        return Ok(());
    }
    match (backend, hook) {
        (Backend::Fentry, Hook::Kprobe(_)) => {
            let btf = btf.ok_or_else(|| anyhow!("no BTF parsed for fentry"))?;
            let p: &mut FEntry = prog.try_into()?;
            p.load(sym, btf)?;
        }
        (Backend::Fentry, Hook::Kretprobe(_)) => {
            let btf = btf.ok_or_else(|| anyhow!("no BTF parsed for fexit"))?;
            let p: &mut FExit = prog.try_into()?;
            p.load(sym, btf)?;
        }
        (Backend::Fentry, Hook::Tracepoint(_, tp)) => {
            let btf = btf.ok_or_else(|| anyhow!("no BTF parsed for tp_btf"))?;
            let p: &mut BtfTracePoint = prog.try_into()?;
            p.load(tp, btf)?;
        }
        (_, Hook::Kprobe(_) | Hook::Kretprobe(_)) => {
            let p: &mut KProbe = prog.try_into()?;
            p.load()?;
        }
        (_, Hook::Tracepoint(..)) => {
            let p: &mut TracePoint = prog.try_into()?;
            p.load()?;
        }
    }
    Ok(())
}

/// Loads, one thread each, the programs `resolved` will attach whatever
/// else attaches (none that another probe's presence decides): the
/// verifier's work is most of a start-up, and the kernel verifies
/// privileged loads side by side. A load that fails here is left to the
/// attach, which loads it again and says why.
fn preload(bpf: &mut Ebpf, resolved: &[Resolved], exit_only: bool, btf: Option<&aya::Btf>) {
    let mut wanted = std::collections::BTreeMap::new();
    for r in resolved {
        let spec = r.spec;
        let conditional = spec.redundant_with.is_some()
            || spec.only_with.is_some()
            || (exit_only && spec.folded_into.is_some());
        if let (Resolution::Attach { symbol, backend, .. }, false) = (&r.resolution, conditional) {
            if let Ok(name) = twin_name(spec.program, *backend) {
                wanted.insert(name, (spec.hook, symbol.as_str(), *backend));
            }
        }
    }
    std::thread::scope(|scope| {
        for (name, prog) in bpf.programs_mut() {
            let Some(&(hook, sym, backend)) = wanted.get(name) else { continue };
            let _ = std::thread::Builder::new().spawn_scoped(scope, move || {
                let _ = load_one(prog, hook, sym, backend, btf);
            });
        }
    });
}

/// A one-line reason from an attach error chain, naming lockdown when the
/// kernel's EPERM comes from it.
fn attach_reason(e: &anyhow::Error) -> String {
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    let mut s = chain.join(": ");
    // aya's load error with an empty verifier log repeats the errno after it.
    if let Some(i) = s.find(". Verifier output: : ") {
        s.truncate(i);
    }
    if s.contains("Operation not permitted") {
        if let Some(l) = kernel::lockdown().filter(|l| l != "none") {
            s.push_str(&format!(" (kernel lockdown={l})"));
        }
    }
    s
}

/// One program's verdict in `probes --load`.
pub enum Verdict {
    Ok(LoadCost),
    /// The verifier (or the loader) rejected it.
    Rejected(String),
    /// Not loaded: the kernel refuses this kind of program here (a fentry
    /// twin where the kernel forbids tracing programs; `auto` then uses
    /// the kprobe).
    NotHere(String),
}

/// The most instructions the verifier may process for one program of the
/// object (`probes --load` reports each; the host tests and every kernel of
/// the guest matrix hold every program to it). The kernel refuses a program
/// at 1,000,000, and every attach pays the verifier's work again: on an
/// emulated guest, seconds per 100,000. Older verifiers prune less: 6.1's
/// walks `fault_entry` in about 200,000 (arm64: 212,000), where the 6.18
/// build host's needs about 12,500.
pub const VERIFIED_INSNS_BUDGET: u32 = 300_000;

/// What loading a program cost: the verifier's own count of the
/// instructions it processed (`verified_insns`, Linux 5.16+) and the load's
/// wall time. Every attach pays it again, and on a slow machine (an
/// emulated guest) the verifier dominates the time to attach.
#[derive(Clone, Copy, Debug)]
pub struct LoadCost {
    pub verified_insns: Option<u32>,
    pub load: std::time::Duration,
}

impl LoadCost {
    fn of(prog: &aya::programs::Program, load: std::time::Duration) -> LoadCost {
        LoadCost { verified_insns: prog.info().ok().and_then(|i| i.verified_instruction_count()), load }
    }
}

/// Loads every program of the object into the kernel without attaching any:
/// the verifier's verdict on each, for `faultscope probes --load`. A
/// kernel function's fentry twin is loaded against its function where BTF
/// describes it (not with `--backend kprobe`).
pub fn load_all(
    tracefs: &Path,
    resolved: &[Resolved],
    btf: &KernelBtf,
    choice: BackendChoice,
) -> Result<Vec<(&'static str, Verdict)>> {
    let aya_btf = if choice == BackendChoice::Kprobe { None } else { btf.aya().ok() };
    let mut bpf = loader(
        tracefs,
        Sizes { stats: 64, cgroups: 1, comms: 1, ..Sizes::default() },
        Some(0),
        btf,
        aya_btf,
        aya_btf.is_some() && probes::exit_only(resolved),
    )?;
    let mut out = Vec::new();
    for r in resolved {
        let spec = r.spec;
        let res = (|| -> Result<LoadCost> {
            let prog =
                bpf.program_mut(spec.program.name()).ok_or_else(|| anyhow!("missing from the object"))?;
            let t0 = Instant::now();
            let classic =
                if matches!(spec.hook, Hook::Tracepoint(..)) { Backend::Tracepoint } else { Backend::Kprobe };
            load_one(prog, spec.hook, "", classic, None)?;
            Ok(LoadCost::of(prog, t0.elapsed()))
        })();
        out.push((
            spec.program.name(),
            res.map_or_else(|e| Verdict::Rejected(format!("{e:#}")), Verdict::Ok),
        ));
        let (Some(twin), Some(aya_btf)) = (spec.program.fentry_name(), aya_btf) else { continue };
        let Resolution::Attach { symbol, backend: Backend::Fentry, .. } = &r.resolution else { continue };
        let res = (|| -> Result<LoadCost> {
            let prog = bpf.program_mut(twin).ok_or_else(|| anyhow!("missing from the object"))?;
            let t0 = Instant::now();
            load_one(prog, spec.hook, symbol, Backend::Fentry, Some(aya_btf))?;
            Ok(LoadCost::of(prog, t0.elapsed()))
        })();
        out.push((
            twin,
            match res {
                Ok(c) => Verdict::Ok(c),
                Err(e) => {
                    let e = attach_reason(&e);
                    if e.contains("Operation not permitted") && choice == BackendChoice::Auto {
                        Verdict::NotHere(e)
                    } else {
                        Verdict::Rejected(e)
                    }
                }
            },
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::kernel::probes::PROBES;

    /// The program names of an eBPF object, parsed without a kernel.
    fn object_programs(object: &[u8]) -> BTreeSet<String> {
        let obj = aya_obj::Object::parse(object).expect("parsing the eBPF object");
        obj.programs.keys().cloned().collect()
    }

    /// What differs between an object's programs and the catalogue.
    fn mismatch(in_object: &BTreeSet<String>, catalogue: &[Program]) -> Vec<String> {
        let names: BTreeSet<String> = catalogue
            .iter()
            .flat_map(|p| std::iter::once(p.name()).chain(p.fentry_name()))
            .map(String::from)
            .collect();
        let mut out: Vec<String> = in_object
            .difference(&names)
            .map(|n| format!("{n}: in the object, not in Program::ALL"))
            .collect();
        out.extend(names.difference(in_object).map(|n| format!("{n}: in Program::ALL, not in the object")));
        out
    }

    #[test]
    fn object_programs_are_the_catalogue() {
        let progs = object_programs(EBPF_OBJECT);
        assert_eq!(mismatch(&progs, &Program::ALL), Vec::<String>::new());
        // Both directions are checked: one program more on either side fails.
        let mut more = progs.clone();
        more.insert("extra_program".into());
        assert_eq!(mismatch(&more, &Program::ALL).len(), 1);
        // The first program, a tracepoint, has its BTF tracepoint twin, and
        // the fault entry its fentry twin: two names each.
        let without = |x: Program| -> Vec<Program> { Program::ALL.into_iter().filter(|p| *p != x).collect() };
        assert_eq!(mismatch(&progs, &Program::ALL[1..]).len(), 2);
        assert_eq!(mismatch(&progs, &without(Program::FaultEntry)).len(), 2);
    }

    #[test]
    fn probe_table_covers_the_catalogue() {
        let table: BTreeSet<Program> = PROBES.iter().map(|p| p.program).collect();
        assert_eq!(table, Program::ALL.into_iter().collect());
    }

    #[test]
    fn unreadable_tracepoint_offsets_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("events");
        // page_fault_user exists, but its format cannot be read.
        std::fs::create_dir_all(events.join("exceptions/page_fault_user")).unwrap();
        // task_newtask's format lacks clone_flags.
        std::fs::create_dir_all(events.join("task/task_newtask")).unwrap();
        std::fs::write(
            events.join("task/task_newtask/format"),
            "format:\n\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;\n",
        )
        .unwrap();
        let (offsets, warnings) = tracepoint_offsets(dir.path());
        assert_eq!(offsets, vec![("NEWTASK_PID_OFF", 8)]);
        assert_eq!(warnings.len(), 4, "{warnings:?}");
        assert!(warnings[0].contains("exceptions:page_fault_user") && warnings[0].contains("field address"));
        assert!(warnings[3].contains("task:task_newtask") && warnings[3].contains("field clone_flags"));
        assert!(warnings.iter().all(|w| w.contains("compiled-in")));
        // A tracepoint this kernel lacks: nothing attaches to it, no warning.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(tracepoint_offsets(empty.path()), (vec![], vec![]));
    }
}
