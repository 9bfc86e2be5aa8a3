//! The running kernel's BTF, read once and parsed once per run: its member
//! offsets (for the programs' loads), the functions fentry can attach to,
//! and, only when a probe is attached by fentry, aya's own parse of the
//! same bytes, which loads those programs (aya keeps struct members
//! private, so the offsets need the reader in `attrib::btf`).

use std::{cell::OnceCell, collections::BTreeSet, sync::Mutex};

use aya::EbpfLoader;

use crate::{attrib::btf::Btf, error::Refusal, kernel::BTF_VMLINUX};

pub struct KernelBtf {
    parsed: Result<Btf, String>,
    /// The probe table's functions (and `btf_trace_NAME` of its tracepoints)
    /// that BTF describes.
    functions: Result<BTreeSet<String>, String>,
    aya: OnceCell<Result<aya::Btf, String>>,
    /// aya's loader, made ahead: `EbpfLoader::new` parses the kernel's BTF
    /// yet again (aya 0.14 has no constructor without; `loader` then sets
    /// the parse it uses), so `probes::read_kernel` makes it on a thread
    /// beside the other readings.
    loader: Mutex<Option<EbpfLoader<'static>>>,
}

impl KernelBtf {
    /// Reads and parses `/sys/kernel/btf/vmlinux`, and which of `wanted`
    /// (the probe table's functions: `probes::read_kernel`) it describes; an
    /// error is kept (and said where it matters), not raised.
    pub fn load(wanted: &BTreeSet<String>) -> KernelBtf {
        KernelBtf::from(Btf::from_file(BTF_VMLINUX).map_err(|e| format!("{e:#}")), wanted)
    }

    pub fn from(parsed: Result<Btf, String>, wanted: &BTreeSet<String>) -> KernelBtf {
        let functions = match &parsed {
            Ok(b) => b.functions_among(wanted).map_err(|e| format!("{e:#}")),
            Err(e) => Err(e.clone()),
        };
        KernelBtf { parsed, functions, aya: OnceCell::new(), loader: Mutex::new(None) }
    }

    /// Keeps a loader made ahead for [`KernelBtf::take_loader`].
    pub fn keep_loader(&self, l: EbpfLoader<'static>) {
        if let Ok(mut slot) = self.loader.lock() {
            *slot = Some(l);
        }
    }

    /// The loader made ahead, else a new one.
    pub fn take_loader<'a>(&self) -> EbpfLoader<'a> {
        self.loader.lock().ok().and_then(|mut slot| slot.take()).unwrap_or_default()
    }

    /// A run needs the kernel's BTF: one that cannot be read or parsed (an
    /// empty or truncated file, an I/O error) is refused as a missing one
    /// is (`kernel::require_btf`), before anything is attached. Without it
    /// the offsets the programs read (the kernel's own fault count of a
    /// thread among them) would be unknown.
    pub fn require(&self) -> Result<(), Refusal> {
        match &self.parsed {
            Ok(_) => Ok(()),
            Err(e) => Err(Refusal::new(format!(
                "{BTF_VMLINUX} is not usable BTF ({}): faultscope needs a kernel built with CONFIG_DEBUG_INFO_BTF \
                 (to check the types its probes read)",
                one_line(e)
            ))),
        }
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

    /// The value of enumerator `name`.
    pub fn enum_value(&self, name: &str) -> Result<i64, String> {
        let b = self.parsed.as_ref().map_err(Clone::clone)?;
        b.enum_value(name).map_err(|e| format!("{e:#}"))
    }

    /// Where a large folio keeps its order and the `PG_head` bit that says
    /// it is large (`FOLIO_ORDER_OFF`, `FOLIO_HEAD_BIT`): `folio._folio_order`
    /// where it exists (6.1; its `_flags_1` is the tail page's flags), else
    /// `folio._flags_1`'s low byte (6.6 on).
    pub fn folio_order_offsets(&self) -> Result<[(&'static str, u32); 2], String> {
        let off = self
            .member_offset("folio", "_folio_order")
            .or_else(|_| self.member_offset("folio", "_flags_1"))?;
        let head = self.enum_value("PG_head")?;
        let head = u32::try_from(head).ok().filter(|h| *h < 64).ok_or(format!("PG_head is {head}"))?;
        Ok([("FOLIO_ORDER_OFF", off), ("FOLIO_HEAD_BIT", head)])
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

/// An error on one line (a refusal is one line).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header (magic, version 1, 24 bytes) saying where the sections are.
    fn header(type_len: u32, str_len: u32) -> Vec<u8> {
        let mut b = vec![0x9f, 0xeb, 1, 0];
        for v in [24u32, 0, type_len, type_len, str_len] {
            b.extend(v.to_le_bytes());
        }
        b
    }

    fn load(bytes: Vec<u8>) -> KernelBtf {
        KernelBtf::from(Btf::parse(bytes).map_err(|e| format!("{e:#}")), &BTreeSet::new())
    }

    #[test]
    fn unusable_btf_is_refused() {
        // Empty, a header cut short, and sections past the end of the file.
        for bytes in [vec![], header(0, 1)[..12].to_vec(), header(4096, 64)] {
            let why = load(bytes.clone()).require().unwrap_err().to_string();
            assert!(why.starts_with(BTF_VMLINUX) && why.contains("CONFIG_DEBUG_INFO_BTF"), "{why}");
            assert_eq!(why.lines().count(), 1, "{why}");
        }
        let why = KernelBtf::from(Err("reading BTF x:\nInput/output error".into()), &BTreeSet::new())
            .require()
            .unwrap_err()
            .to_string();
        assert!(why.contains("Input/output error") && why.lines().count() == 1, "{why}");
    }

    #[test]
    fn parsed_btf_is_taken_and_says_which_offsets_it_lacks() {
        // Well formed, with no type: the run goes on, and each offset it
        // lacks is an error where it is asked for.
        let mut bytes = header(0, 1);
        bytes.push(0);
        let b = load(bytes);
        b.require().unwrap();
        assert!(b.member_offset("task_struct", "min_flt").is_err());
    }
}
