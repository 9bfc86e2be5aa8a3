//! Struct member offsets from the running kernel's BTF.
//!
//! The eBPF programs read `vm_area_struct.vm_start`/`vm_end` from
//! handle_mm_fault's `vma` argument. aya emits no CO-RE relocations, so the
//! offsets are looked up here at load time and handed to the programs as
//! globals. aya-obj parses BTF but keeps struct members crate-private, so
//! this is a small reader of its own (types and strings sections only).

use std::{collections::BTreeSet, path::Path};

use anyhow::{anyhow, bail, ensure, Context as _, Result};

/// Byte offset of the user instruction pointer (`ip`) in x86-64's
/// `struct pt_regs`: 16 saved registers (r15 .. orig_ax) precede it. Part of
/// the user ABI (`struct pt_regs` in asm/ptrace.h), so a constant.
pub const PT_REGS_IP_OFFSET_X86_64: u32 = 128;
/// Byte offset of `pc` in arm64's `struct pt_regs` (`regs[31]`, `sp`, then
/// `pc`, as in `struct user_pt_regs`).
pub const PT_REGS_PC_OFFSET_AARCH64: u32 = 256;

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_FUNC: u32 = 12;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_ENUM64: u32 = 19;
// Kinds that only qualify another type: followed through to reach the
// struct/union of an anonymous member.
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_TYPE_TAG: u32 = 18;
/// Nesting of anonymous members followed at most (the kernel has 2-3).
const MAX_DEPTH: usize = 32;

/// A parsed BTF blob: its type table indexed by id, and its strings.
pub struct Btf {
    data: Vec<u8>,
    big_endian: bool,
    /// Start of the types section in `data`.
    types_start: usize,
    types_end: usize,
    strs_start: usize,
    strs_end: usize,
    /// Byte offset (in `data`) of each type's `struct btf_type`; index 0 is
    /// void and unused.
    type_offsets: Vec<usize>,
}

struct TypeHeader {
    name_off: u32,
    kind: u32,
    vlen: usize,
    kind_flag: bool,
    /// `size` or `type`, by kind.
    size_or_type: u32,
    /// Where the kind-specific data starts.
    extra: usize,
}

impl Btf {
    /// The running kernel's BTF.
    pub fn vmlinux() -> Result<Self> {
        Self::from_file("/sys/kernel/btf/vmlinux")
    }

    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let data = std::fs::read(path).with_context(|| format!("reading BTF {}", path.display()))?;
        Self::parse(data).with_context(|| format!("parsing BTF {}", path.display()))
    }

    /// Parses raw BTF (either byte order, as the magic says).
    pub fn parse(data: Vec<u8>) -> Result<Self> {
        ensure!(data.len() >= 24, "BTF too short for a header ({} bytes)", data.len());
        let big_endian = match [data[0], data[1]] {
            m if u16::from_le_bytes(m) == BTF_MAGIC => false,
            m if u16::from_be_bytes(m) == BTF_MAGIC => true,
            m => bail!("bad BTF magic {m:02x?}"),
        };
        let mut btf = Btf {
            data,
            big_endian,
            types_start: 0,
            types_end: 0,
            strs_start: 0,
            strs_end: 0,
            type_offsets: vec![0],
        };
        let hdr_len = btf.u32_at(4)? as usize;
        let section = |off: u32, len: u32| -> Result<(usize, usize)> {
            let start =
                hdr_len.checked_add(off as usize).ok_or_else(|| anyhow!("section offset overflows"))?;
            let end = start.checked_add(len as usize).ok_or_else(|| anyhow!("section length overflows"))?;
            ensure!(end <= btf.data.len(), "section {start}..{end} past the end ({} bytes)", btf.data.len());
            Ok((start, end))
        };
        (btf.types_start, btf.types_end) = section(btf.u32_at(8)?, btf.u32_at(12)?)?;
        (btf.strs_start, btf.strs_end) = section(btf.u32_at(16)?, btf.u32_at(20)?)?;

        let mut pos = btf.types_start;
        while pos < btf.types_end {
            let h = btf.header_at(pos)?;
            let extra_len = match h.kind {
                1 | 14 | 17 => 4,       // INT, VAR, DECL_TAG
                3 => 12,                // ARRAY
                4 | 5 => 12 * h.vlen,   // STRUCT, UNION: members
                6 | 13 => 8 * h.vlen,   // ENUM, FUNC_PROTO
                15 | 19 => 12 * h.vlen, // DATASEC, ENUM64
                2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
                k => bail!("type {} at byte {pos}: unknown BTF kind {k}", btf.type_offsets.len()),
            };
            btf.type_offsets.push(pos);
            pos = h.extra + extra_len;
        }
        ensure!(pos == btf.types_end, "types section ends inside a type");
        Ok(btf)
    }

    fn u32_at(&self, off: usize) -> Result<u32> {
        let b: [u8; 4] = self
            .data
            .get(off..off + 4)
            .and_then(|s| s.try_into().ok())
            .ok_or_else(|| anyhow!("BTF truncated at byte {off}"))?;
        Ok(if self.big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) })
    }

    fn header_at(&self, pos: usize) -> Result<TypeHeader> {
        ensure!(pos + 12 <= self.types_end, "type at byte {pos} runs past the types section");
        let info = self.u32_at(pos + 4)?;
        Ok(TypeHeader {
            name_off: self.u32_at(pos)?,
            kind: (info >> 24) & 0x1f,
            vlen: (info & 0xffff) as usize,
            kind_flag: info >> 31 == 1,
            size_or_type: self.u32_at(pos + 8)?,
            extra: pos + 12,
        })
    }

    fn type_header(&self, id: u32) -> Result<TypeHeader> {
        let pos =
            *self.type_offsets.get(id as usize).filter(|_| id != 0).ok_or_else(|| anyhow!("no type {id}"))?;
        self.header_at(pos)
    }

    fn name(&self, off: u32) -> Result<&str> {
        let start = self.strs_start + off as usize;
        ensure!(start < self.strs_end, "string offset {off} past the strings section");
        let bytes = &self.data[start..self.strs_end];
        let len =
            bytes.iter().position(|&b| b == 0).ok_or_else(|| anyhow!("unterminated string at {off}"))?;
        std::str::from_utf8(&bytes[..len]).map_err(|_| anyhow!("string at {off} is not UTF-8"))
    }

    /// Follows typedefs and qualifiers to the type they name.
    fn strip(&self, mut id: u32) -> Result<(u32, TypeHeader)> {
        for _ in 0..MAX_DEPTH {
            let h = self.type_header(id)?;
            match h.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = h.size_or_type
                }
                _ => return Ok((id, h)),
            }
        }
        bail!("type {id}: qualifier chain too long")
    }

    /// The id of the struct named `name` that has members (a forward
    /// declaration has none).
    fn struct_id(&self, name: &str) -> Result<u32> {
        for id in 1..self.type_offsets.len() as u32 {
            let h = self.type_header(id)?;
            if (h.kind == KIND_STRUCT || h.kind == KIND_UNION) && self.name(h.name_off)? == name {
                return Ok(id);
            }
        }
        bail!("struct {name} is not in this BTF")
    }

    /// Bit offset of `member` in struct/union `id`, searching anonymous
    /// struct/union members (and what they nest) too.
    fn find_member(&self, id: u32, member: &str, depth: usize) -> Result<Option<u64>> {
        ensure!(depth < MAX_DEPTH, "anonymous members nested too deep");
        let (_, h) = self.strip(id)?;
        if h.kind != KIND_STRUCT && h.kind != KIND_UNION {
            return Ok(None);
        }
        for i in 0..h.vlen {
            let m = h.extra + 12 * i;
            let (name_off, ty, raw) = (self.u32_at(m)?, self.u32_at(m + 4)?, self.u32_at(m + 8)?);
            // With kind_flag, the top 8 bits are a bitfield size.
            let bits = if h.kind_flag { raw & 0x00ff_ffff } else { raw } as u64;
            if name_off == 0 {
                if let Some(inner) = self.find_member(ty, member, depth + 1)? {
                    return Ok(Some(bits + inner));
                }
            } else if self.name(name_off)? == member {
                let bitfield = h.kind_flag && raw >> 24 != 0;
                ensure!(!bitfield && bits.is_multiple_of(8), "{member} is a bitfield (bit offset {bits})");
                return Ok(Some(bits));
            }
        }
        Ok(None)
    }

    /// Byte offset of `member` in `struct struct_name`, members of anonymous
    /// structs/unions included (their offsets summed). An absent struct or
    /// member, or a bitfield, is an error.
    pub fn member_offset(&self, struct_name: &str, member: &str) -> Result<u32> {
        let id = self.struct_id(struct_name)?;
        let bits = self
            .find_member(id, member, 0)
            .with_context(|| format!("{struct_name}.{member}"))?
            .ok_or_else(|| anyhow!("struct {struct_name} has no member {member}"))?;
        u32::try_from(bits / 8).context("offset does not fit u32")
    }
}

impl Btf {
    /// The value of enumerator `name` (e.g. `PG_head` of `enum pageflags`,
    /// whose values depend on the kernel's configuration), in whichever
    /// enum declares it first.
    pub fn enum_value(&self, name: &str) -> Result<i64> {
        for id in 1..self.type_offsets.len() as u32 {
            let h = self.type_header(id)?;
            let step = match h.kind {
                KIND_ENUM => 8,
                KIND_ENUM64 => 12,
                _ => continue,
            };
            for i in 0..h.vlen {
                let e = h.extra + step * i;
                if self.name(self.u32_at(e)?)? != name {
                    continue;
                }
                let lo = self.u32_at(e + 4)?;
                return Ok(if step == 8 {
                    lo as i32 as i64
                } else {
                    ((self.u32_at(e + 8)? as i64) << 32) | lo as i64
                });
            }
        }
        bail!("no enumerator {name} in this BTF")
    }

    /// Which of `names` are functions (BTF_KIND_FUNC) or typedefs (a
    /// tracepoint's `btf_trace_NAME`) here: one pass over the types,
    /// comparing only the names of those kinds.
    pub fn functions_among(&self, names: &BTreeSet<String>) -> Result<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        for id in 1..self.type_offsets.len() as u32 {
            let h = self.type_header(id)?;
            if h.kind == KIND_FUNC || h.kind == KIND_TYPEDEF {
                let name = self.name(h.name_off)?;
                if names.contains(name) {
                    out.insert(name.to_string());
                }
            }
        }
        Ok(out)
    }

    /// The raw BTF, for a second reader of the same bytes (aya's, which
    /// loads fentry programs).
    pub fn raw(&self) -> &[u8] {
        &self.data
    }
}

/// `btf.member_offset(struct_name, member)`.
pub fn member_offset(btf: &Btf, struct_name: &str, member: &str) -> Result<u32> {
    btf.member_offset(struct_name, member)
}

/// Where the eBPF side finds a VMA's bounds and owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmaOffsets {
    pub vm_start: u32,
    pub vm_end: u32,
    pub vm_mm: u32,
}

impl VmaOffsets {
    pub fn from_btf(btf: &Btf) -> Result<Self> {
        Ok(VmaOffsets {
            vm_start: btf.member_offset("vm_area_struct", "vm_start")?,
            vm_end: btf.member_offset("vm_area_struct", "vm_end")?,
            vm_mm: btf.member_offset("vm_area_struct", "vm_mm")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmlinux() -> Option<Btf> {
        if !Path::new("/sys/kernel/btf/vmlinux").exists() {
            println!("skipped: this kernel has no /sys/kernel/btf/vmlinux");
            return None;
        }
        Some(Btf::vmlinux().unwrap())
    }

    #[test]
    fn vma_and_task_members() {
        let Some(btf) = vmlinux() else { return };
        let vma = VmaOffsets::from_btf(&btf).unwrap();
        assert_eq!(vma.vm_end - vma.vm_start, 8);
        #[cfg(target_arch = "x86_64")]
        assert_eq!((vma.vm_start, vma.vm_end), (0, 8));
        assert!(vma.vm_mm >= 16);
        let tgid = member_offset(&btf, "task_struct", "tgid").unwrap();
        assert!(tgid > 0 && tgid.is_multiple_of(4), "{tgid}");
        let err = format!("{:#}", btf.member_offset("vm_area_struct", "no_such_member").unwrap_err());
        assert!(err.contains("no member no_such_member"), "{err}");
        let err = format!("{:#}", btf.member_offset("no_such_struct_xyz", "x").unwrap_err());
        assert!(err.contains("not in this BTF"), "{err}");
        // PG_head's value depends on the configuration; PG_locked is 0.
        assert_eq!(btf.enum_value("PG_locked").unwrap(), 0);
        let head = btf.enum_value("PG_head").unwrap();
        assert!((1..64).contains(&head), "{head}");
        assert!(format!("{:#}", btf.enum_value("PG_no_such_flag").unwrap_err()).contains("no enumerator"));
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn pt_regs_ip_matches_the_constant() {
        let Some(btf) = vmlinux() else { return };
        assert_eq!(btf.member_offset("pt_regs", "ip").unwrap(), PT_REGS_IP_OFFSET_X86_64);
    }

    /// A hand-made BTF: struct s { int a; union { struct { int b; int c; }; long d; }; }.
    fn synthetic() -> Vec<u8> {
        let strs = b"\0int\0s\0a\0b\0c\0d\0long\0f\0g\0";
        let off = |s: &str| {
            let needle = format!("\0{s}\0");
            strs.windows(needle.len()).position(|w| w == needle.as_bytes()).unwrap() as u32 + 1
        };
        let mut t: Vec<u32> = Vec::new();
        // 1: int
        t.extend([off("int"), 1 << 24, 4, 32]);
        // 2: long
        t.extend([off("long"), 1 << 24, 8, 64]);
        // 3: anonymous struct { int b; int c; }
        t.extend([0, (4 << 24) | 2, 8, off("b"), 1, 0, off("c"), 1, 32]);
        // 4: anonymous union { struct 3; long d; }
        t.extend([0, (5 << 24) | 2, 8, 0, 3, 0, off("d"), 2, 0]);
        // 5: typedef u = union 4 (anonymous member through a typedef)
        t.extend([0, 8 << 24, 4]);
        // 6: struct s { int a; <5> at 64 bits; }
        t.extend([off("s"), (4 << 24) | 2, 16, off("a"), 1, 0, 0, 5, 64]);
        // 7: func_proto void (void); 8: func f, 9: func g
        t.extend([0, 13 << 24, 0]);
        t.extend([off("f"), 12 << 24, 7]);
        t.extend([off("g"), 12 << 24, 7]);
        let types: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = Vec::new();
        out.extend(BTF_MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        for v in [24u32, 0, types.len() as u32, types.len() as u32, strs.len() as u32] {
            out.extend(v.to_le_bytes());
        }
        out.extend(types);
        out.extend(strs);
        out
    }

    #[test]
    fn nested_anonymous_members() {
        let btf = Btf::parse(synthetic()).unwrap();
        assert_eq!(btf.member_offset("s", "a").unwrap(), 0);
        assert_eq!(btf.member_offset("s", "b").unwrap(), 8);
        assert_eq!(btf.member_offset("s", "c").unwrap(), 12);
        assert_eq!(btf.member_offset("s", "d").unwrap(), 8);
        assert!(btf.member_offset("s", "e").is_err());
        // Functions by name; a struct of a wanted name is no function.
        let want: BTreeSet<String> = ["f", "s", "h"].map(String::from).into();
        assert_eq!(btf.functions_among(&want).unwrap(), ["f".to_string()].into());
    }

    #[test]
    fn bad_btf_is_an_error() {
        assert!(Btf::parse(vec![]).is_err());
        assert!(Btf::parse(vec![0; 64]).is_err());
        let good = synthetic();
        for cut in [10, 30, good.len() - 3] {
            assert!(Btf::parse(good[..cut].to_vec()).is_err(), "cut at {cut}");
        }
        let mut bad_kind = good.clone();
        bad_kind[24 + 7] = 31; // first type's kind byte
        assert!(Btf::parse(bad_kind).is_err());
    }
}
