//! The running kernel's BTF, read once and parsed once per run: its member
//! offsets (for the programs' loads), the functions fentry can attach to,
//! and, only when a probe is attached by fentry, aya's own parse of the
//! same bytes, which loads those programs (aya keeps struct members
//! private, so the offsets need the reader in `attrib::btf`).

use std::{cell::OnceCell, collections::BTreeSet};

use crate::{attrib::btf::Btf, kernel::BTF_VMLINUX};

pub struct KernelBtf {
    parsed: Result<Btf, String>,
    /// The probe table's functions (and `btf_trace_NAME` of its tracepoints)
    /// that BTF describes.
    functions: Result<BTreeSet<String>, String>,
    aya: OnceCell<Result<aya::Btf, String>>,
}

impl KernelBtf {
    /// Reads and parses `/sys/kernel/btf/vmlinux`, and which of `wanted`
    /// (the probe table's functions: `probes::kernel_btf`) it describes; an
    /// error is kept (and said where it matters), not raised.
    pub fn load(wanted: &BTreeSet<String>) -> KernelBtf {
        KernelBtf::from(Btf::from_file(BTF_VMLINUX).map_err(|e| format!("{e:#}")), wanted)
    }

    pub fn from(parsed: Result<Btf, String>, wanted: &BTreeSet<String>) -> KernelBtf {
        let functions = match &parsed {
            Ok(b) => b.functions_among(wanted).map_err(|e| format!("{e:#}")),
            Err(e) => Err(e.clone()),
        };
        KernelBtf { parsed, functions, aya: OnceCell::new() }
    }

    /// The table's functions BTF describes, or why none.
    pub fn functions(&self) -> Result<&BTreeSet<String>, String> {
        self.functions.as_ref().map_err(Clone::clone)
    }

    /// Byte offset of `struct_name.member`.
    pub fn member_offset(&self, struct_name: &str, member: &str) -> Result<u32, String> {
        let b = self.parsed.as_ref().map_err(Clone::clone)?;
        b.member_offset(struct_name, member).map_err(|e| format!("{e:#}"))
    }

    /// aya's parse of the same BTF (for fentry programs), made on first use.
    pub fn aya(&self) -> Result<&aya::Btf, String> {
        self.aya
            .get_or_init(|| {
                let b = self.parsed.as_ref().map_err(Clone::clone)?;
                aya::Btf::parse(b.raw(), aya::Endianness::default()).map_err(|e| format!("parsing BTF: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}
