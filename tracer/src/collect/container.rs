//! What container, pod or service a process runs in, from its cgroup v2
//! path (`/proc/PID/cgroup`), in cAdvisor's label names where they mean
//! the same: `container_id`, `pod_uid`, `qos`, and `service` for a systemd
//! service outside any container.
//!
//! The path's components are read from the innermost out, so that a
//! container nested in another (kind, Docker in Docker) is named by its own
//! scope. Recognised: the kubelet's systemd driver
//! (`kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<UID>.slice/
//! cri-containerd-<ID>.scope`, `crio-<ID>.scope`, `docker-<ID>.scope`) and
//! its cgroupfs driver (`kubepods/<qos>/pod<UID>/<ID>`); Docker
//! (`docker-<ID>.scope`, `docker/<ID>`); Podman (`libpod-<ID>.scope`, also
//! nested `…/container`, and `libpod-<ID>` under cgroupfs); systemd services
//! (`<name>.service` in a `system.slice`). Only a component that has the
//! form of an id is taken as one (64 hex digits for a container, a UUID
//! for a pod), and a service name only of the characters systemd gives
//! units: a directory named by another user cannot forge a label.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// A process's place. Empty fields: not known, or not in one.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Container {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    /// `guaranteed`, `burstable` or `besteffort` (the kubelet's QoS class).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub qos: String,
    /// A systemd service outside any container (`NAME.service`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
}

/// The value every field takes past [`Containers`]' limit.
pub const OTHER: &str = "other";

impl Container {
    /// The place a cgroup v2 path (as `/proc/PID/cgroup` has it) names.
    pub fn of_path(path: &str) -> Container {
        let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let mut c = Container::default();
        let mut kube = false;
        for (i, part) in parts.iter().enumerate().rev() {
            if c.container_id.is_empty() {
                if let Some(id) = container_id(part) {
                    c.container_id = id;
                    continue;
                }
            }
            if c.pod_uid.is_empty() {
                if let Some(uid) = pod_uid(part) {
                    c.pod_uid = uid;
                    continue;
                }
            }
            if part.starts_with("kubepods") {
                kube = true;
                if c.qos.is_empty() {
                    c.qos = qos(part).unwrap_or_default();
                }
            } else if matches!(*part, "guaranteed" | "burstable" | "besteffort")
                && parts.get(i.wrapping_sub(1)).is_some_and(|p| *p == "kubepods")
            {
                c.qos = part.to_string();
            }
            if c.service.is_empty() && c.container_id.is_empty() && i > 0 && parts[i - 1] == "system.slice" {
                c.service = service(part).unwrap_or_default();
            }
        }
        // The kubelet puts a Guaranteed pod right under kubepods.
        if kube && !c.pod_uid.is_empty() && c.qos.is_empty() {
            c.qos = "guaranteed".into();
        }
        c
    }

    /// Whether the path named a container, a pod or a service.
    pub fn is_known(&self) -> bool {
        *self != Container::default()
    }

    /// The place of a running process (the default if it is gone).
    pub fn of_pid(pid: u32) -> Container {
        Container::of_proc_cgroup(&std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default())
    }

    /// The place `/proc/PID/cgroup` names: the cgroup v2 path (`0::PATH`),
    /// else, on a host with the v1 hierarchies too (where the kubelet and
    /// Docker put their paths), the first v1 path that names one.
    pub fn of_proc_cgroup(text: &str) -> Container {
        let paths = text.lines().filter_map(|l| Some((l.starts_with("0::"), l.splitn(3, ':').nth(2)?)));
        let mut v1 = Container::default();
        for (v2, path) in paths {
            let c = Container::of_path(path);
            if v2 && c.is_known() {
                return c;
            }
            if !v2 && !v1.is_known() {
                v1 = c;
            }
        }
        v1
    }

    fn other() -> Container {
        Container {
            container_id: OTHER.into(),
            pod_uid: OTHER.into(),
            qos: OTHER.into(),
            service: OTHER.into(),
        }
    }
}

fn is_hex_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A container's id from one path component.
fn container_id(part: &str) -> Option<String> {
    let inner = part.strip_suffix(".scope").unwrap_or(part);
    let id = ["cri-containerd-", "crio-", "docker-", "libpod-", "containerd-"]
        .iter()
        .find_map(|p| inner.strip_prefix(p))
        .unwrap_or(inner);
    is_hex_id(id).then(|| id.to_string())
}

/// A pod's UID: `pod<UID>` (cgroupfs) or `kubepods[-<qos>]-pod<UID>.slice`
/// (systemd, whose unit names have `_` for the UID's `-`).
fn pod_uid(part: &str) -> Option<String> {
    let rest = match part.strip_suffix(".slice") {
        Some(unit) => unit.rsplit_once("-pod")?.1.replace('_', "-"),
        None => part.strip_prefix("pod")?.to_string(),
    };
    let uuid = rest.len() == 36
        && rest.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        });
    uuid.then_some(rest)
}

/// `kubepods-<qos>.slice` and `kubepods-<qos>-pod….slice`.
fn qos(part: &str) -> Option<String> {
    ["burstable", "besteffort"]
        .iter()
        .find(|q| part.starts_with(&format!("kubepods-{q}")))
        .map(|q| q.to_string())
}

/// A systemd service's unit name, of the characters systemd allows.
fn service(part: &str) -> Option<String> {
    let ok = part.ends_with(".service")
        && part.len() <= 256
        && part.bytes().all(|b| b.is_ascii_alphanumeric() || b":-_.@\\".contains(&b));
    ok.then(|| part.to_string())
}

/// The places of the processes named so far, at most `limit` distinct
/// ones: a process in a further one is `other` in every field, so that
/// the series stay bounded however many containers come and go.
pub struct Containers {
    by_pid: BTreeMap<u32, Container>,
    distinct: BTreeSet<Container>,
    limit: usize,
}

impl Containers {
    pub fn new(limit: usize) -> Containers {
        Containers { by_pid: BTreeMap::new(), distinct: BTreeSet::new(), limit }
    }

    /// `pid`'s label, from its `place` (as the recorder read it) the first
    /// time: `other` in every field once `limit` places are labelled.
    pub fn of(&mut self, pid: u32, place: &Container) -> Container {
        if let Some(c) = self.by_pid.get(&pid) {
            return c.clone();
        }
        let mut c = place.clone();
        if !self.distinct.contains(&c) {
            if self.distinct.len() >= self.limit {
                c = Container::other();
            } else {
                self.distinct.insert(c.clone());
            }
        }
        self.by_pid.insert(pid, c.clone());
        c
    }

    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
    }
}

/// The most cgroups [`Places`] remembers; past it, it starts afresh.
pub const PLACES_MAX: usize = 65_536;

/// How often, at most, a miss walks the cgroup tree again.
const WALK_EVERY: Duration = Duration::from_secs(1);

/// Places by cgroup v2 id (a cgroup directory's inode number, which the
/// kernel's exit event carries): the place of a process that exits before
/// its `/proc/PID/cgroup` is read. Learnt from the kernel's `cgroup_mkdir`
/// events, which carry the path at the moment the directory is made (the
/// runtime may remove it right after the container's last exit), and from
/// a walk of the cgroup2 tree for cgroups made before the run.
pub struct Places {
    by_id: HashMap<u64, Container>,
    /// The cgroup2 mount (none on a host with v1 hierarchies only).
    root: Option<PathBuf>,
    next_walk: Option<Instant>,
}

impl Places {
    pub fn new() -> Places {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Places { by_id: HashMap::new(), root: cgroup2_mount(&mountinfo), next_walk: None }
    }

    /// A cgroup made, as the kernel told it.
    pub fn made(&mut self, id: u64, path: &str) {
        self.insert(id, Container::of_path(path));
    }

    fn insert(&mut self, id: u64, c: Container) {
        if self.by_id.len() >= PLACES_MAX && !self.by_id.contains_key(&id) {
            self.by_id.clear();
        }
        self.by_id.insert(id, c);
    }

    /// The place cgroup `id` names (the default if it is not known, even
    /// after a walk).
    pub fn of(&mut self, id: u64) -> Container {
        if !self.by_id.contains_key(&id) && self.next_walk.is_none_or(|t| Instant::now() >= t) {
            self.next_walk = Some(Instant::now() + WALK_EVERY);
            if let Some(root) = self.root.clone() {
                self.walk(&root);
            }
        }
        self.by_id.get(&id).cloned().unwrap_or_default()
    }

    /// Every directory under `root`, by inode number, at most
    /// [`PLACES_MAX`] of them.
    fn walk(&mut self, root: &Path) {
        use std::os::unix::fs::MetadataExt as _;
        let mut todo = vec![root.to_path_buf()];
        let mut seen = 0;
        while let Some(dir) = todo.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else { continue };
            for e in entries.flatten() {
                // No symbolic link is followed: a cgroup is a directory.
                if seen >= PLACES_MAX {
                    return;
                }
                let Ok(m) = e.metadata() else { continue };
                if !m.is_dir() {
                    continue;
                }
                seen += 1;
                let path = e.path();
                let rel = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
                self.insert(m.ino(), Container::of_path(&rel));
                todo.push(path);
            }
        }
    }
}

impl Default for Places {
    fn default() -> Self {
        Places::new()
    }
}

/// Where the cgroup2 file system is mounted, from `/proc/self/mountinfo`
/// (`ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - TYPE SOURCE SUPER`).
fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split(' ').nth(4)?;
        (right.split(' ').next()? == "cgroup2").then(|| PathBuf::from(unescape_octal(point)))
    })
}

/// mountinfo's escapes (`\040` for a space, and the like).
fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct =
            b.get(i + 1..i + 4).filter(|o| b[i] == b'\\' && o.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(o) => {
                out.push(o.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4d7c5a0f6f0b1e2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f6a7b8c9d0e";
    const UID: &str = "0b6f8a2e-3c1d-4e5f-9a8b-7c6d5e4f3a2b";

    fn c(id: &str, uid: &str, qos: &str, service: &str) -> Container {
        Container { container_id: id.into(), pod_uid: uid.into(), qos: qos.into(), service: service.into() }
    }

    #[test]
    fn kubelet_systemd_and_cgroupfs_drivers() {
        let u = UID.replace('-', "_");
        let sys = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope");
        assert_eq!(Container::of_path(&sys), c(ID, UID, "burstable", ""));
        let guaranteed = format!("/kubepods.slice/kubepods-pod{u}.slice/crio-{ID}.scope");
        assert_eq!(Container::of_path(&guaranteed), c(ID, UID, "guaranteed", ""));
        let fs = format!("/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(Container::of_path(&fs), c(ID, UID, "besteffort", ""));
        assert_eq!(Container::of_path(&format!("/kubepods/pod{UID}/{ID}")), c(ID, UID, "guaranteed", ""));
    }

    #[test]
    fn docker_podman_and_services() {
        assert_eq!(Container::of_path(&format!("/system.slice/docker-{ID}.scope")), c(ID, "", "", ""));
        assert_eq!(Container::of_path(&format!("/docker/{ID}")), c(ID, "", "", ""));
        assert_eq!(
            Container::of_path(&format!("/machine.slice/libpod-{ID}.scope/container")),
            c(ID, "", "", "")
        );
        let rootless = format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope");
        assert_eq!(Container::of_path(&rootless), c(ID, "", "", ""));
        assert_eq!(
            Container::of_path("/system.slice/redis-server.service"),
            c("", "", "", "redis-server.service")
        );
        // Under a test's own parent: the innermost components decide.
        assert_eq!(
            Container::of_path(&format!("/fs-test-1/kubepods/burstable/pod{UID}/{ID}")),
            c(ID, UID, "burstable", "")
        );
        assert_eq!(Container::of_path("/"), Container::default());
        assert_eq!(Container::of_path("/user.slice/user-0.slice/session-3.scope"), Container::default());
    }

    /// A host with the v1 hierarchies beside v2 (the v2 path `/`): the
    /// kubelet's v1 path names the pod.
    #[test]
    fn v1_paths_where_v2_names_nothing() {
        let text = format!("12:memory:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n0::/\n");
        assert_eq!(Container::of_proc_cgroup(&text), c(ID, UID, "burstable", ""));
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(Container::of_proc_cgroup(&v2), c(ID, "", "", ""));
        assert_eq!(Container::of_proc_cgroup("0::/\n4:memory:/\n"), Container::default());
    }

    /// A directory named to look like a label, or an id of the wrong form,
    /// is no container, pod or service.
    #[test]
    fn hostile_names_forge_nothing() {
        let evil = "/system.slice/x\"} 1\nfaultscope_faults_total{comm=\"y.service";
        assert_eq!(Container::of_path(evil), Container::default());
        assert_eq!(Container::of_path(&format!("/docker/{}", &ID[..63])), Container::default());
        assert_eq!(Container::of_path(&format!("/docker/{}", ID.to_uppercase())), Container::default());
        assert_eq!(Container::of_path("/kubepods/burstable/podnot-a-uid/x"), c("", "", "burstable", ""));
    }

    #[test]
    fn past_the_limit_every_field_is_other() {
        let mut cs = Containers::new(1);
        cs.distinct.insert(c(ID, "", "", ""));
        cs.by_pid.insert(1, c(ID, "", "", ""));
        assert_eq!(cs.of(1, &Container::default()), c(ID, "", "", ""));
        // A second place is past the limit.
        assert_eq!(cs.of(2, &Container::default()), Container::other());
    }

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let info = "25 30 0:22 / /sys ro,nosuid shared:7 - sysfs sysfs rw\n\
            31 25 0:27 / /sys/fs/cgroup/unified rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n\
            32 25 0:28 / /sys/fs/cgroup/memory rw shared:10 - cgroup cgroup rw,memory\n";
        assert_eq!(cgroup2_mount(info), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let spaced = "40 30 0:27 / /mnt/a\\040b rw - cgroup2 none rw\n";
        assert_eq!(cgroup2_mount(spaced), Some(PathBuf::from("/mnt/a b")));
        assert_eq!(cgroup2_mount("32 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw\n"), None);
    }

    #[test]
    fn places_come_from_the_kernel_and_from_a_walk() {
        let dir = tempfile::tempdir().unwrap();
        let scope = dir.path().join("system.slice").join(format!("docker-{ID}.scope"));
        std::fs::create_dir_all(&scope).unwrap();
        use std::os::unix::fs::MetadataExt as _;
        let ino = std::fs::metadata(&scope).unwrap().ino();
        let mut p = Places { by_id: HashMap::new(), root: Some(dir.path().into()), next_walk: None };
        // Made before the run: found by the walk.
        assert_eq!(p.of(ino).container_id, ID);
        // Told by the kernel, and gone since: still named.
        p.made(7, &format!("/kubepods/besteffort/pod{UID}/{ID}"));
        assert_eq!(p.of(7).pod_uid, UID);
        // Unknown: nothing, and no second walk within the second.
        assert_eq!(p.of(8), Container::default());
        assert!(p.next_walk.is_some());
    }
}
