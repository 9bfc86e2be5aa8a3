//! The report's provenance: faultscope's build, the command line, the
//! machine (host name, kernel command line, THP knobs, CPU, hypervisor)
//! and the clock anchor, read once at the end of a run.

use std::{collections::BTreeMap, fs, path::Path};

use super::schema::Provenance;
use crate::kernel::ClockAnchor;

const THP: &str = "/sys/kernel/mm/transparent_hugepage";

pub fn here(target: String, start: ClockAnchor) -> Provenance {
    let (cpu_vendor, cpu_model) = cpu(&read("/proc/cpuinfo"));
    Provenance {
        version: env!("CARGO_PKG_VERSION").into(),
        commit: crate::commit().into(),
        argv: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
        target,
        hostname: read("/proc/sys/kernel/hostname"),
        start_unix_ns: start.unix_ns,
        start_monotonic_ns: start.monotonic_ns,
        kernel_cmdline: read("/proc/cmdline"),
        thp: thp_knobs(Path::new(THP)),
        cpu_vendor,
        cpu_model,
        hypervisor: hypervisor(),
        boot_id: Some(read("/proc/sys/kernel/random/boot_id")).filter(|b| !b.is_empty()),
    }
}

fn read(p: &str) -> String {
    fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Every readable knob file below `dir`, one level of `hugepages-*` and
/// `khugepaged` deep; `[x]`-style lists give their selected choice.
fn thp_knobs(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut walk = |sub: &str| {
        let Ok(rd) = fs::read_dir(dir.join(sub)) else { return Vec::new() };
        let mut dirs = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let rel = if sub.is_empty() { name.clone() } else { format!("{sub}/{name}") };
            match e.file_type() {
                Ok(t) if t.is_dir() => dirs.push(rel),
                Ok(t) if t.is_file() => {
                    if let Ok(v) = fs::read_to_string(e.path()) {
                        out.insert(rel, selected(v.trim()));
                    }
                }
                _ => {}
            }
        }
        dirs
    };
    for d in walk("") {
        walk(&d);
    }
    out
}

/// `always [madvise] never` -> `madvise`; other values as they are.
fn selected(v: &str) -> String {
    match (v.find('['), v.find(']')) {
        (Some(a), Some(b)) if a < b => v[a + 1..b].to_string(),
        _ => v.to_string(),
    }
}

/// (vendor, model) from /proc/cpuinfo's first processor.
fn cpu(cpuinfo: &str) -> (String, String) {
    let field = |keys: &[&str]| {
        cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                keys.contains(&k.trim()).then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    (field(&["vendor_id", "CPU implementer"]), field(&["model name", "CPU part"]))
}

/// The hypervisor: x86's CPUID leaf 0x40000000 signature where the
/// hypervisor bit is set; else DMI's product (QEMU and other VMs name
/// themselves there), else arm64 QEMU's device tree.
fn hypervisor() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        let leaf1 = core::arch::x86_64::__cpuid(1);
        if leaf1.ecx & (1 << 31) != 0 {
            // Leaf 0x40000000 is the hypervisor's signature when the bit is set.
            let l = core::arch::x86_64::__cpuid(0x4000_0000);
            let sig: Vec<u8> = [l.ebx, l.ecx, l.edx].iter().flat_map(|r| r.to_le_bytes()).collect();
            let sig = String::from_utf8_lossy(&sig).trim_matches(char::from(0)).trim().to_string();
            return Some(match sig.as_str() {
                "KVMKVMKVM" => "KVM".into(),
                "TCGTCGTCGTCG" => "QEMU TCG".into(),
                "" => dmi().unwrap_or_else(|| "unknown".into()),
                s => crate::term::safe(s),
            });
        }
        return None;
    }
    #[allow(unreachable_code)]
    dmi().or_else(|| {
        let dt = fs::read("/proc/device-tree/compatible").ok()?;
        dt.split(|&b| b == 0).any(|c| c == b"linux,dummy-virt").then(|| "QEMU virt".to_string())
    })
}

fn dmi() -> Option<String> {
    let v = read("/sys/class/dmi/id/sys_vendor");
    let p = read("/sys/class/dmi/id/product_name");
    ["QEMU", "KVM", "VMware", "Xen", "Microsoft", "Amazon EC2", "Google"]
        .iter()
        .any(|h| v.contains(h) || p.contains(h))
        .then(|| crate::term::safe(format!("{v} {p}").trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_choice() {
        assert_eq!(selected("always [madvise] never"), "madvise");
        assert_eq!(selected("511"), "511");
    }

    #[test]
    fn cpu_fields_of_both_arches() {
        assert_eq!(
            cpu("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\n"),
            ("AuthenticAMD".into(), "AMD EPYC".into())
        );
        assert_eq!(
            cpu("processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"),
            ("0x41".into(), "0xd0c".into())
        );
    }

    #[test]
    fn knobs_of_a_tree() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("enabled"), "always [madvise] never\n").unwrap();
        fs::create_dir(d.path().join("hugepages-64kB")).unwrap();
        fs::write(d.path().join("hugepages-64kB/enabled"), "[inherit] never\n").unwrap();
        let k = thp_knobs(d.path());
        assert_eq!(k["enabled"], "madvise");
        assert_eq!(k["hugepages-64kB/enabled"], "inherit");
    }
}
