//! A loaded program's `bpf_prog_info` fields that aya does not expose.

use std::{
    io,
    mem::{offset_of, size_of},
    os::fd::{AsRawFd, BorrowedFd},
};

use aya_obj::generated::bpf_prog_info;

/// `BPF_OBJ_GET_INFO_BY_FD`'s command number (uapi `enum bpf_cmd`).
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;

/// `union bpf_attr`'s `info` member.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The runs of program `fd` the kernel skipped (its recursion guard was
/// held); `None` where the kernel's `bpf_prog_info` has no such field
/// (before 5.12). The kernel fills no more than it has and says how much.
pub fn recursion_misses(fd: BorrowedFd<'_>) -> io::Result<Option<u64>> {
    // SAFETY: bpf_prog_info is plain data; all zeroes is a valid value.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    let mut attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: size_of::<bpf_prog_info>() as u32,
        info: &mut info as *mut bpf_prog_info as u64,
    };
    // SAFETY: the attribute and the buffer it points to live across the
    // call, and info_len is the buffer's size.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoAttr,
            size_of::<InfoAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let end = offset_of!(bpf_prog_info, recursion_misses) + size_of::<u64>();
    Ok((attr.info_len as usize >= end).then_some(info.recursion_misses))
}
