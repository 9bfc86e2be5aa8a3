//! Workload phases. The kernel attributes every fault to a phase id (see
//! `faultscope_common::maps::phase_id`); this module turns the lifecycle
//! events and user marks that start phases into named, timed phases:
//!
//! ```text
//! before-fork -> fork#1 child-alive -> fork#1 after-child-exit -> fork#2 ...
//! ```
//!
//! plus `mark:LABEL` phases from `faultscope mark`, signals or bench. A run
//! that attaches while a child forked earlier still shares a target's
//! memory starts with `attached: child-alive (pid N, forked before attach)`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use faultscope_common::PhaseId;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What started a phase: the bounded set a phase can be grouped by (its
/// name says more: which fork, which child, which label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum PhaseKind {
    BeforeFork,
    ChildAlive,
    AfterChildExit,
    AfterChildExec,
    Mark,
}

impl PhaseKind {
    pub const ALL: [PhaseKind; 5] = [
        PhaseKind::BeforeFork,
        PhaseKind::ChildAlive,
        PhaseKind::AfterChildExit,
        PhaseKind::AfterChildExec,
        PhaseKind::Mark,
    ];
}

/// Within this time of its fork, a child's exec is "at once" (system(),
/// posix_spawn): its COW window was a blip, and the phase says so.
pub const EXEC_AT_ONCE_NS: u64 = 50_000_000;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    pub id: PhaseId,
    pub name: String,
    pub kind: PhaseKind,
    pub start_ns: u64,
    /// None while the phase is current.
    pub end_ns: Option<u64>,
    /// Children of traced processes sharing memory during this phase.
    pub children_alive: usize,
}

/// When a traced process existed for faultscope: from its first sight
/// (attach, or its fork) to its exit (or the exit/exec that ended its
/// sharing of a parent's memory). A process carries only the phases that
/// overlap it, and those in which it faulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub start_ns: u64,
    pub end_ns: Option<u64>,
}

impl Lifetime {
    pub fn from(start_ns: u64) -> Lifetime {
        Lifetime { start_ns, end_ns: None }
    }

    /// Ends it (the earliest end seen counts).
    pub fn end(&mut self, ts: u64) {
        self.end_ns = Some(self.end_ns.map_or(ts, |e| e.min(ts)));
    }

    /// Whether `phase` overlaps it: the phase its fork starts is in, the one
    /// its exit starts is not.
    pub fn overlaps(&self, phase: &Phase) -> bool {
        phase.start_ns < self.end_ns.unwrap_or(u64::MAX) && phase.end_ns.is_none_or(|e| e > self.start_ns)
    }
}

#[derive(Clone, Debug)]
struct Child {
    /// The fork's label (`fork#N`, see [`Timeline::fork`]); None: forked
    /// before attach.
    fork_no: Option<String>,
    forked_ns: u64,
}

/// How a phase names a child forked before attach.
fn before_attach(pid: u32) -> String {
    format!("pid {pid}, forked before attach")
}

/// The phase state machine, fed events in time order.
#[derive(Clone, Debug)]
pub struct Timeline {
    phases: Vec<Phase>,
    alive: BTreeMap<u32, Child>,
    /// Forks so far, per forking process.
    forks: BTreeMap<u32, u32>,
    /// The first process that forked: its forks are `fork#N`, another's
    /// `fork#N of pid P`.
    first_parent: Option<u32>,
}

impl Timeline {
    /// Starts with phase `id` (the kernel's counters at attach time).
    pub fn new(id: PhaseId, start_ns: u64) -> Timeline {
        Timeline {
            phases: vec![Phase {
                id,
                name: "before-fork".into(),
                kind: PhaseKind::BeforeFork,
                start_ns,
                end_ns: None,
                children_alive: 0,
            }],
            alive: BTreeMap::new(),
            forks: BTreeMap::new(),
            first_parent: None,
        }
    }

    /// Children of the targets that were forked before attach and still
    /// share their memory: the first phase is one of a child alive, and
    /// their exits and execs end it like any fork's. Called before any
    /// other event.
    pub fn attached_children(&mut self, pids: &[u32]) {
        if pids.is_empty() || self.phases.len() != 1 {
            return;
        }
        let first = &mut self.phases[0];
        for &pid in pids {
            self.alive.insert(pid, Child { fork_no: None, forked_ns: first.start_ns });
        }
        first.kind = PhaseKind::ChildAlive;
        first.children_alive = self.alive.len();
        first.name = match pids {
            [one] => format!("attached: child-alive ({})", before_attach(*one)),
            _ => {
                let list: Vec<String> = self.alive.keys().map(u32::to_string).collect();
                format!(
                    "attached: child-alive ({} children: pids {}, forked before attach)",
                    pids.len(),
                    list.join(", ")
                )
            }
        };
    }

    /// Adds phase `id`, in the order of the ids: they only grow with time
    /// in the kernel, but a lifecycle event is read from its ring after the
    /// kernel switched, so a mark taken meanwhile may be here first. A phase
    /// that comes late goes before the later ones, which keep their own
    /// start; it ends where the next one starts.
    fn push(&mut self, id: PhaseId, ts: u64, kind: PhaseKind, name: String) {
        let at = self.phases.partition_point(|p| p.id <= id || p.id.wrapping_sub(id) > PhaseId::MAX / 2);
        let phase = Phase { id, name, kind, start_ns: ts, end_ns: None, children_alive: self.alive.len() };
        if at == self.phases.len() {
            if let Some(last) = self.phases.last_mut() {
                if last.end_ns.is_none() {
                    last.end_ns = Some(ts);
                }
            }
            self.phases.push(phase);
            return;
        }
        let next = &self.phases[at];
        let phase = Phase { start_ns: ts.min(next.start_ns), end_ns: Some(next.start_ns), ..phase };
        if at > 0 {
            let prev = &mut self.phases[at - 1];
            prev.end_ns = Some(phase.start_ns.max(prev.start_ns));
        }
        self.phases.insert(at, phase);
    }

    /// Traced process `parent` forked `child`; phase `id` starts. Forks are
    /// numbered per process (`fork#1` is its first); those of a process
    /// other than the first one that forked also name it (`fork#1 of pid
    /// P`), since the phases are one sequence for every traced process.
    pub fn fork(&mut self, id: PhaseId, ts: u64, parent: u32, child: u32) {
        let n = self.forks.entry(parent).or_insert(0);
        *n += 1;
        let first = *self.first_parent.get_or_insert(parent);
        let label = if parent == first { format!("fork#{n}") } else { format!("fork#{n} of pid {parent}") };
        // A reused pid is a new child: the old entry is replaced.
        self.alive.insert(child, Child { fork_no: Some(label.clone()), forked_ns: ts });
        let name = if self.alive.len() == 1 {
            format!("{label} child-alive")
        } else {
            format!("{label} child-alive ({} children)", self.alive.len())
        };
        self.push(id, ts, PhaseKind::ChildAlive, name);
    }

    /// `child` exited (`exec == false`) or exec'd; phase `id` starts.
    pub fn child_gone(&mut self, id: PhaseId, ts: u64, child: u32, exec: bool) {
        let Some(c) = self.alive.remove(&child) else {
            // A child forked before we attached: still a change of phase.
            let what = if exec { "after-child-exec" } else { "after-child-exit" };
            self.push(id, ts, gone_kind(exec, 0), format!("{what} (pid {child})"));
            return;
        };
        let gone = if exec { "exec" } else { "exit" };
        let did = if exec { "exec'd" } else { "exited" };
        let forked = c.fork_no.is_some();
        let mut name = match (c.fork_no, self.alive.len()) {
            (Some(f), 0) => format!("{f} after-child-{gone}"),
            (None, 0) => format!("after-child-{gone} ({})", before_attach(child)),
            (Some(f), k) => format!("{f} child {did}, {k} still alive"),
            (None, k) => format!("child {did} ({}), {k} still alive", before_attach(child)),
        };
        // When it forked is known only for our own forks.
        if exec && forked && ts.saturating_sub(c.forked_ns) < EXEC_AT_ONCE_NS {
            name.push_str(" (child exec'd at once, as from system())");
        }
        self.push(id, ts, gone_kind(exec, self.alive.len()), name);
    }

    /// Traced process `tgid` exec'd another program and the kernel started
    /// phase `id` for it (`EXEC_PHASE`, serve only): the other processes'
    /// phases go on as they were.
    pub fn exec(&mut self, id: PhaseId, ts: u64, tgid: u32) {
        let kind = self.current().kind;
        self.push(id, ts, kind, format!("exec (pid {tgid})"));
    }

    /// A mark's phase is named by its label alone (so scripts can find it);
    /// whether children were alive is in `children_alive`.
    pub fn mark(&mut self, id: PhaseId, ts: u64, label: &str) {
        self.push(id, ts, PhaseKind::Mark, format!("mark:{label}"));
    }

    /// Forgets the current phase (bench's own reporting) and reopens the
    /// one before it up to the end.
    pub fn drop_current(&mut self) {
        if self.phases.len() > 1 {
            self.phases.pop();
            if let Some(last) = self.phases.last_mut() {
                last.end_ns = None;
            }
        }
    }

    pub fn end(&mut self, ts: u64) {
        if let Some(last) = self.phases.last_mut() {
            last.end_ns.get_or_insert(ts);
        }
    }

    /// Keeps only the last `n` phases (`serve`, which runs for days and
    /// needs the kinds of recent phases only). Forks keep their numbers.
    pub fn keep_last(&mut self, n: usize) {
        let n = n.max(1);
        if self.phases.len() > n {
            self.phases.drain(..self.phases.len() - n);
        }
    }

    pub fn phases(&self) -> &[Phase] {
        &self.phases
    }

    pub fn current(&self) -> &Phase {
        self.phases.last().expect("a timeline has a phase")
    }
}

/// Each process's own phase kinds, for `serve`. The kernel's phase ids are
/// one sequence for every traced process, so any process's fork starts a
/// phase for all of them; in a daemon that traces many processes (two
/// Redis, or one restarted), a process's faults belong to the kind its own
/// forks and children made: before its first fork, while its own child
/// lives, after its own child's exit or exec. Keeps the last
/// [`ProcessKinds::KEEP`] changes of each process, and nothing once it is
/// forgotten.
#[derive(Debug, Default)]
pub struct ProcessKinds {
    procs: HashMap<u32, OwnPhases>,
}

#[derive(Debug, Default)]
struct OwnPhases {
    /// Its children that still share its memory.
    children: BTreeSet<u32>,
    /// (phase id the change started, the kind from there on), oldest first.
    changes: VecDeque<(PhaseId, PhaseKind)>,
}

impl ProcessKinds {
    /// Changes kept per process: enough for every phase whose kernel
    /// entries serve still reads (the current and the previous one).
    pub const KEEP: usize = 16;

    fn change(&mut self, tgid: u32, id: PhaseId, f: impl FnOnce(&mut BTreeSet<u32>) -> PhaseKind) {
        let own = self.procs.entry(tgid).or_default();
        let kind = f(&mut own.children);
        own.changes.push_back((id, kind));
        if own.changes.len() > Self::KEEP {
            own.changes.pop_front();
        }
    }

    /// `children` of `tgid`, forked before attach, still share its memory
    /// at phase `id`.
    pub fn attached(&mut self, tgid: u32, id: PhaseId, children: &[u32]) {
        if !children.is_empty() {
            self.change(tgid, id, |c| {
                c.extend(children);
                PhaseKind::ChildAlive
            });
        }
    }

    /// `tgid` forked `child`, starting phase `id`.
    pub fn fork(&mut self, tgid: u32, id: PhaseId, child: u32) {
        self.change(tgid, id, |c| {
            c.insert(child);
            PhaseKind::ChildAlive
        });
    }

    /// `tgid` exec'd another program at phase `id`: its faults from there
    /// on are the new program's, before any fork of its own. Children of
    /// the old program share nothing with the new one.
    pub fn exec(&mut self, tgid: u32, id: PhaseId) {
        self.change(tgid, id, |c| {
            c.clear();
            PhaseKind::BeforeFork
        });
    }

    /// `tgid`'s `child` exited or exec'd, starting phase `id`. A child of
    /// the program before an exec changes nothing.
    pub fn child_gone(&mut self, tgid: u32, id: PhaseId, child: u32, exec: bool) {
        if !self.procs.get(&tgid).is_some_and(|o| o.children.contains(&child)) {
            return;
        }
        self.change(tgid, id, |c| {
            c.remove(&child);
            gone_kind(exec, c.len())
        });
    }

    /// The kind of `tgid`'s faults in phase `id`.
    pub fn kind(&self, tgid: u32, id: PhaseId) -> PhaseKind {
        self.procs
            .get(&tgid)
            .and_then(|o| o.changes.iter().rev().find(|(start, _)| *start <= id))
            .map_or(PhaseKind::BeforeFork, |(_, k)| *k)
    }

    /// `tgid` is gone.
    pub fn forget(&mut self, tgid: u32) {
        self.procs.remove(&tgid);
    }
}

/// A child left: while others still share the memory, the phase is still
/// one of a child alive.
fn gone_kind(exec: bool, still_alive: usize) -> PhaseKind {
    match (still_alive, exec) {
        (1.., _) => PhaseKind::ChildAlive,
        (0, true) => PhaseKind::AfterChildExec,
        (0, false) => PhaseKind::AfterChildExit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(t: &Timeline) -> Vec<String> {
        t.phases().iter().map(|p| p.name.clone()).collect()
    }

    #[test]
    fn each_process_has_its_own_kinds() {
        let mut k = ProcessKinds::default();
        // Redis A forks (phase 1); B, traced beside it, is still before
        // its first fork, in phase 1 too.
        k.fork(10, 1, 11);
        assert_eq!(k.kind(10, 0), PhaseKind::BeforeFork);
        assert_eq!(k.kind(10, 1), PhaseKind::ChildAlive);
        assert_eq!(k.kind(20, 1), PhaseKind::BeforeFork);
        // B forks (2) and A's child exits (3): A after its child's exit,
        // B's child still alive.
        k.fork(20, 2, 21);
        k.child_gone(10, 3, 11, false);
        assert_eq!(k.kind(10, 2), PhaseKind::ChildAlive);
        assert_eq!(k.kind(10, 3), PhaseKind::AfterChildExit);
        assert_eq!(k.kind(20, 3), PhaseKind::ChildAlive);
        // Two children of B, one exec'd: still a child alive; then none.
        k.fork(20, 4, 22);
        k.child_gone(20, 5, 21, true);
        assert_eq!(k.kind(20, 5), PhaseKind::ChildAlive);
        k.child_gone(20, 6, 22, true);
        assert_eq!(k.kind(20, 6), PhaseKind::AfterChildExec);
        // A restarted under a new pid starts before its first fork.
        k.forget(10);
        assert_eq!(k.kind(10, 6), PhaseKind::BeforeFork);
        // Children forked before attach.
        k.attached(30, 6, &[31]);
        assert_eq!(k.kind(30, 6), PhaseKind::ChildAlive);
        k.child_gone(30, 7, 31, false);
        assert_eq!(k.kind(30, 7), PhaseKind::AfterChildExit);
        // Bounded: the last KEEP changes of a process.
        for i in 0..100 {
            k.fork(40, 100 + 2 * i, 41);
            k.child_gone(40, 101 + 2 * i, 41, false);
        }
        assert_eq!(k.procs[&40].changes.len(), ProcessKinds::KEEP);
        assert_eq!(k.kind(40, 298), PhaseKind::ChildAlive);
        assert_eq!(k.kind(40, 299), PhaseKind::AfterChildExit);
    }

    /// Forks are numbered per process; another process's forks name it.
    #[test]
    fn forks_are_numbered_per_process() {
        let mut t = Timeline::new(0, 0);
        // The gcc driver (10) forks cc1 (11), which forks nothing; then
        // collect2 (12, the driver's second child) forks ld (13).
        t.fork(1, 10, 10, 11);
        t.child_gone(2, 20, 11, false);
        t.fork(3, 30, 10, 12);
        t.fork(4, 40, 12, 13);
        t.child_gone(5, 50, 13, false);
        t.child_gone(6, 60, 12, false);
        assert_eq!(
            names(&t),
            [
                "before-fork",
                "fork#1 child-alive",
                "fork#1 after-child-exit",
                "fork#2 child-alive",
                "fork#1 of pid 12 child-alive (2 children)",
                "fork#1 of pid 12 child exited, 1 still alive",
                "fork#2 after-child-exit",
            ]
        );
    }

    #[test]
    fn an_exec_starts_a_fresh_kind() {
        let mut k = ProcessKinds::default();
        // A shell forks a child (1), then execs a program (2) while the
        // child lives: the program starts before its first fork.
        k.fork(10, 1, 11);
        k.exec(10, 2);
        assert_eq!(k.kind(10, 1), PhaseKind::ChildAlive);
        assert_eq!(k.kind(10, 2), PhaseKind::BeforeFork);
        // The old program's child exiting (3) changes nothing for it.
        k.child_gone(10, 3, 11, false);
        assert_eq!(k.kind(10, 3), PhaseKind::BeforeFork);
        // Its own fork (4) and child exit (5) do.
        k.fork(10, 4, 12);
        k.child_gone(10, 5, 12, false);
        assert_eq!(k.kind(10, 4), PhaseKind::ChildAlive);
        assert_eq!(k.kind(10, 5), PhaseKind::AfterChildExit);
        let mut t = Timeline::new(0, 0);
        t.fork(1, 10, 5, 11);
        t.exec(2, 20, 10);
        assert_eq!(t.current().id, 2);
        assert_eq!(t.current().name, "exec (pid 10)");
    }

    #[test]
    fn fork_then_exit() {
        let mut t = Timeline::new(0, 0);
        t.fork(1, 100, 5, 50);
        t.child_gone(2, 200_000_000, 50, false);
        t.end(300_000_000);
        assert_eq!(names(&t), ["before-fork", "fork#1 child-alive", "fork#1 after-child-exit"]);
        let p = t.phases();
        assert_eq!((p[1].start_ns, p[1].end_ns), (100, Some(200_000_000)));
        assert_eq!(p[2].end_ns, Some(300_000_000));
    }

    #[test]
    fn child_that_execs_at_once() {
        let mut t = Timeline::new(0, 0);
        t.fork(1, 1_000, 5, 60);
        t.child_gone(2, 1_000 + 2_000_000, 60, true);
        assert_eq!(names(&t)[2], "fork#1 after-child-exec (child exec'd at once, as from system())");
        // A late exec is not "at once".
        t.fork(3, 10_000_000_000, 5, 61);
        t.child_gone(4, 11_000_000_000, 61, true);
        assert_eq!(names(&t)[4], "fork#2 after-child-exec");
    }

    #[test]
    fn overlapping_children() {
        let mut t = Timeline::new(0, 0);
        t.fork(1, 10, 5, 70);
        t.fork(2, 20, 5, 71);
        t.child_gone(3, 30, 70, false);
        t.child_gone(4, 40, 71, false);
        assert_eq!(
            names(&t),
            [
                "before-fork",
                "fork#1 child-alive",
                "fork#2 child-alive (2 children)",
                "fork#1 child exited, 1 still alive",
                "fork#2 after-child-exit"
            ]
        );
        assert_eq!(t.phases()[2].children_alive, 2);
    }

    #[test]
    fn pid_reuse_is_a_new_child() {
        let mut t = Timeline::new(0, 0);
        t.fork(1, 10, 5, 80);
        t.child_gone(2, 20, 80, false);
        t.fork(3, 30, 5, 80);
        t.child_gone(4, 40, 80, false);
        assert_eq!(names(&t)[3], "fork#2 child-alive");
        assert_eq!(names(&t)[4], "fork#2 after-child-exit");
        // An exit of a child we never saw fork still starts a phase.
        t.child_gone(5, 50, 99, false);
        assert_eq!(names(&t)[5], "after-child-exit (pid 99)");
    }

    #[test]
    fn children_forked_before_attach() {
        let mut t = Timeline::new(5, 0);
        t.attached_children(&[40]);
        assert_eq!(names(&t), ["attached: child-alive (pid 40, forked before attach)"]);
        assert_eq!((t.current().kind, t.current().children_alive), (PhaseKind::ChildAlive, 1));
        t.child_gone(6, 10, 40, false);
        assert_eq!(names(&t)[1], "after-child-exit (pid 40, forked before attach)");
        assert_eq!((t.current().kind, t.current().children_alive), (PhaseKind::AfterChildExit, 0));
        // Two, one exec'd: still a child alive; then a fork of our own.
        let mut t = Timeline::new(0, 0);
        t.attached_children(&[41, 42]);
        assert_eq!(names(&t)[0], "attached: child-alive (2 children: pids 41, 42, forked before attach)");
        t.child_gone(1, 10, 42, true);
        assert_eq!(names(&t)[1], "child exec'd (pid 42, forked before attach), 1 still alive");
        assert_eq!(t.current().kind, PhaseKind::ChildAlive);
        t.fork(2, 20, 5, 43);
        assert_eq!(names(&t)[2], "fork#1 child-alive (2 children)");
        t.child_gone(3, 30, 43, false);
        assert_eq!(names(&t)[3], "fork#1 child exited, 1 still alive");
        t.child_gone(4, 40, 41, false);
        assert_eq!(names(&t)[4], "after-child-exit (pid 41, forked before attach)");
        // None alive at attach: nothing changes.
        let mut t = Timeline::new(0, 0);
        t.attached_children(&[]);
        assert_eq!(names(&t), ["before-fork"]);
    }

    #[test]
    fn a_process_overlaps_the_phases_it_lived_in() {
        let mut t = Timeline::new(0, 0);
        t.fork(1, 100, 5, 50);
        t.child_gone(2, 200, 50, false);
        t.fork(3, 300, 5, 51);
        t.end(400);
        let child = |start, end| Lifetime { start_ns: start, end_ns: end };
        let of = |l: Lifetime| -> Vec<PhaseId> {
            t.phases().iter().filter(|p| l.overlaps(p)).map(|p| p.id).collect()
        };
        // The parent, all along; the first child from its fork to its exit.
        assert_eq!(of(child(0, None)), [0, 1, 2, 3]);
        assert_eq!(of(child(100, Some(200))), [1]);
        assert_eq!(of(child(300, None)), [3]);
        let mut l = Lifetime::from(100);
        l.end(250);
        l.end(200);
        l.end(260);
        assert_eq!(l, child(100, Some(200)));
    }

    #[test]
    fn marks_and_ids() {
        let mut t = Timeline::new(7, 0);
        t.mark(8, 5, "populate");
        t.fork(9, 6, 5, 1);
        t.mark(10, 7, "write");
        assert_eq!(names(&t), ["before-fork", "mark:populate", "fork#1 child-alive", "mark:write"]);
        assert_eq!(t.phases()[3].children_alive, 1);
        assert_eq!(t.current().id, 10);
    }

    /// A fork's event is read from the ring after a mark that came after
    /// the fork in the kernel (a higher id): the fork's phase goes before
    /// the mark's, and neither is lost.
    #[test]
    fn a_lifecycle_event_read_after_a_later_mark_goes_before_it() {
        let mut t = Timeline::new(0, 0);
        t.mark(2, 70, "x");
        t.fork(1, 60, 5, 50);
        assert_eq!(names(&t), ["before-fork", "fork#1 child-alive", "mark:x"]);
        let p = t.phases();
        assert_eq!((p[0].end_ns, p[1].start_ns, p[1].end_ns, p[2].start_ns), (Some(60), 60, Some(70), 70));
        assert_eq!(t.current().id, 2);
        // What comes next goes after the mark, as ever.
        t.child_gone(3, 80, 50, false);
        assert_eq!(t.current().name, "fork#1 after-child-exit");
        assert_eq!(t.phases()[2].end_ns, Some(80));
    }
}
