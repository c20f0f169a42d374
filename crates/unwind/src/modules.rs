//! The loaded objects of the process, read from `dl_iterate_phdr`.

use core::ffi::{c_int, c_void, CStr};

/// One `PT_LOAD` segment of a module, as mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    /// Start address in this process (load bias + `p_vaddr`).
    pub start: u64,
    /// One past the end in this process (start + `p_memsz`).
    pub end: u64,
    /// `p_offset`: where the segment starts in the file.
    pub file_offset: u64,
    /// `p_flags` (`PF_X` = 1, `PF_W` = 2, `PF_R` = 4).
    pub flags: u32,
}

/// One loaded object (the executable, a shared library, the vDSO): what a
/// trace's module table needs to symbolize its addresses offline, and what
/// the DWARF unwinder needs to find its unwind tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    /// The path the loader used (`dlpi_name`); for the main executable,
    /// which the loader names "", the path of `/proc/self/exe`. The vDSO is
    /// `linux-vdso.so.1` (no file).
    pub path: Vec<u8>,
    /// The GNU build ID (`NT_GNU_BUILD_ID` note read from the object's
    /// in-memory `PT_NOTE` segments), empty when the object has none.
    pub build_id: Vec<u8>,
    /// The load bias (`dlpi_addr`): address in this process minus the
    /// address in the file (0 for a non-PIE executable).
    pub bias: u64,
    /// The lowest address of its `PT_LOAD` segments in this process.
    pub start: u64,
    /// One past the highest address of its `PT_LOAD` segments.
    pub end: u64,
    /// The `PT_LOAD` segments, in program-header order.
    pub segments: Vec<LoadSegment>,
    /// Address of `.eh_frame_hdr` in this process (`PT_GNU_EH_FRAME`), 0
    /// when the object has none.
    pub eh_frame_hdr: u64,
    /// Size of `.eh_frame_hdr` in bytes (0 when absent).
    pub eh_frame_hdr_len: u64,
    /// Address of `.eh_frame` in this process, from the header's
    /// `eh_frame_ptr`; 0 when unknown.
    pub eh_frame: u64,
    /// Bytes from `.eh_frame` to the end of the `PT_LOAD` segment that holds
    /// it (the section's own size is not in memory; the unwinder only reads
    /// the entries the header's table points at).
    pub eh_frame_len: u64,
}

impl ModuleInfo {
    /// The path as text (lossy), for display.
    pub fn path_lossy(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }

    /// Whether `addr` lies in one of its `PT_LOAD` segments.
    pub fn contains(&self, addr: u64) -> bool {
        self.segments
            .iter()
            .any(|s| addr >= s.start && addr < s.end)
    }
}

/// A snapshot of the loaded objects, sorted by start address.
///
/// Built at start and again after each `dlopen`/`dlclose` (the shim's own
/// wrappers say when), never per capture: `dl_iterate_phdr` takes the
/// loader's lock and this allocates.
#[derive(Clone, Debug, Default)]
pub struct Modules {
    modules: Vec<ModuleInfo>,
    adds: u64,
    subs: u64,
}

impl Modules {
    /// Reads the current list from `dl_iterate_phdr`.
    ///
    /// Set-up only: allocates, takes the loader lock and (for the main
    /// executable's path) makes a system call. In the shim, call it with the
    /// recursion guard set, never from inside malloc.
    pub fn snapshot() -> Modules {
        let mut state = Collect {
            modules: Vec::new(),
            adds: 0,
            subs: 0,
        };
        // SAFETY: `collect` matches dl_iterate_phdr's callback type and
        // receives `&mut state` back as `data`, used only for this call.
        unsafe {
            libc::dl_iterate_phdr(Some(collect), (&mut state as *mut Collect).cast());
        }
        let exe = std::fs::read_link("/proc/self/exe")
            .map(|p| p.into_os_string().into_encoded_bytes())
            .unwrap_or_default();
        for m in &mut state.modules {
            if m.path.is_empty() {
                m.path = exe.clone();
            }
        }
        state.modules.sort_by_key(|m| m.start);
        Modules {
            modules: state.modules,
            adds: state.adds,
            subs: state.subs,
        }
    }

    /// The modules, sorted by start address.
    pub fn modules(&self) -> &[ModuleInfo] {
        &self.modules
    }

    /// Keeps only the modules `keep` accepts (an unwinder built from the
    /// rest never reads the others' unwind tables).
    pub fn retain(&mut self, keep: impl FnMut(&ModuleInfo) -> bool) {
        self.modules.retain(keep);
    }

    /// The module whose `[start, end)` holds `addr`.
    pub fn find(&self, addr: u64) -> Option<&ModuleInfo> {
        let i = self.modules.partition_point(|m| m.start <= addr);
        let m = self.modules.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }

    /// glibc's `dlpi_adds` and `dlpi_subs` counters when the snapshot was
    /// taken (objects loaded and unloaded since start): a snapshot is
    /// current when a later one shows the same pair.
    pub fn load_counters(&self) -> (u64, u64) {
        (self.adds, self.subs)
    }
}

struct Collect {
    modules: Vec<ModuleInfo>,
    adds: u64,
    subs: u64,
}

const NT_GNU_BUILD_ID: u32 = 3;

/// dl_iterate_phdr's callback: records one object.
extern "C" fn collect(info: *mut libc::dl_phdr_info, size: usize, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info of `size` bytes and our
    // `data` (a live &mut Collect, see Modules::snapshot).
    let (info, state) = unsafe { (&*info, &mut *data.cast::<Collect>()) };
    if size >= core::mem::size_of::<libc::dl_phdr_info>() {
        state.adds = info.dlpi_adds;
        state.subs = info.dlpi_subs;
    }
    // SAFETY: as above; the object stays loaded during the callback.
    if let Some(m) = unsafe { read_module(info) } {
        state.modules.push(m);
    }
    0
}

/// Reads one object's record from its program headers and in-memory notes.
///
/// # Safety
/// `info` comes from dl_iterate_phdr, during its callback.
unsafe fn read_module(info: &libc::dl_phdr_info) -> Option<ModuleInfo> {
    let bias = info.dlpi_addr;
    let phdrs: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() || info.dlpi_phnum == 0 {
        &[]
    } else {
        // SAFETY: the loader's program headers, dlpi_phnum of them.
        unsafe { core::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
    };
    let path = if info.dlpi_name.is_null() {
        Vec::new()
    } else {
        // SAFETY: a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_bytes()
            .to_vec()
    };
    let segments: Vec<LoadSegment> = phdrs
        .iter()
        .filter(|p| p.p_type == libc::PT_LOAD)
        .map(|p| LoadSegment {
            start: bias.wrapping_add(p.p_vaddr),
            end: bias.wrapping_add(p.p_vaddr).wrapping_add(p.p_memsz),
            file_offset: p.p_offset,
            flags: p.p_flags,
        })
        .collect();
    let start = segments.iter().map(|s| s.start).min()?;
    let end = segments.iter().map(|s| s.end).max()?;
    let mut build_id = Vec::new();
    for p in phdrs.iter().filter(|p| p.p_type == libc::PT_NOTE) {
        let addr = bias.wrapping_add(p.p_vaddr);
        if p.p_memsz == 0
            || !segments
                .iter()
                .any(|s| addr >= s.start && addr.saturating_add(p.p_memsz) <= s.end)
        {
            continue;
        }
        // SAFETY: a PT_NOTE segment inside a loaded PT_LOAD segment is
        // mapped readable for as long as the object is loaded.
        let notes = unsafe { core::slice::from_raw_parts(addr as *const u8, p.p_memsz as usize) };
        if let Some(id) = find_build_id(notes) {
            build_id = id.to_vec();
            break;
        }
    }
    let mut m = ModuleInfo {
        path,
        build_id,
        bias,
        start,
        end,
        segments,
        eh_frame_hdr: 0,
        eh_frame_hdr_len: 0,
        eh_frame: 0,
        eh_frame_len: 0,
    };
    if let Some(p) = phdrs.iter().find(|p| p.p_type == libc::PT_GNU_EH_FRAME) {
        let hdr = bias.wrapping_add(p.p_vaddr);
        if p.p_memsz > 0 && m.contains(hdr) && m.contains(hdr.saturating_add(p.p_memsz - 1)) {
            m.eh_frame_hdr = hdr;
            m.eh_frame_hdr_len = p.p_memsz;
            // SAFETY: the header lies inside a loaded segment (checked).
            let bytes =
                unsafe { core::slice::from_raw_parts(hdr as *const u8, p.p_memsz as usize) };
            if let Some(eh_frame) = eh_frame_address(bytes, hdr) {
                if let Some(seg) = m
                    .segments
                    .iter()
                    .find(|s| eh_frame >= s.start && eh_frame < s.end)
                {
                    m.eh_frame = eh_frame;
                    m.eh_frame_len = seg.end.saturating_sub(eh_frame);
                }
            }
        }
    }
    Some(m)
}

/// The descriptor of the first `NT_GNU_BUILD_ID` note named "GNU" in a
/// note segment (ELF64 notes: namesz, descsz, type, then name and
/// descriptor, each padded to 4 bytes).
pub(crate) fn find_build_id(mut notes: &[u8]) -> Option<&[u8]> {
    let word = |b: &[u8], i: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
    };
    let pad = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let namesz = word(notes, 0)? as usize;
        let descsz = word(notes, 4)? as usize;
        let kind = word(notes, 8)?;
        let name_end = 12usize.checked_add(pad(namesz)?)?;
        let desc_end = name_end.checked_add(pad(descsz)?)?;
        if desc_end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && notes.get(12..12 + namesz)? == b"GNU\0" {
            return notes.get(name_end..name_end + descsz);
        }
        notes = &notes[desc_end..];
    }
    None
}

/// `.eh_frame`'s address, from the `eh_frame_ptr` field of the
/// `.eh_frame_hdr` at `hdr` (gimli decodes its pointer encoding).
fn eh_frame_address(bytes: &[u8], hdr: u64) -> Option<u64> {
    let bases = gimli::BaseAddresses::default().set_eh_frame_hdr(hdr);
    let parsed = gimli::EhFrameHdr::new(bytes, gimli::NativeEndian)
        .parse(&bases, 8)
        .ok()?;
    match parsed.eh_frame_ptr() {
        gimli::Pointer::Direct(a) => Some(a),
        gimli::Pointer::Indirect(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(name: &[u8], kind: u32, desc: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(name.len() as u32).to_ne_bytes());
        v.extend_from_slice(&(desc.len() as u32).to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(name);
        v.resize(v.len().next_multiple_of(4), 0);
        v.extend_from_slice(desc);
        v.resize(v.len().next_multiple_of(4), 0);
        v
    }

    #[test]
    fn build_id_is_found_after_other_notes() {
        let mut notes = note(b"GNU\0", 1, &[0; 16]);
        notes.extend(note(b"XYZ\0", 3, &[9; 20]));
        notes.extend(note(b"GNU\0", 3, &[1, 2, 3, 4, 5]));
        assert_eq!(find_build_id(&notes), Some(&[1, 2, 3, 4, 5][..]));
    }

    #[test]
    fn truncated_or_missing_notes_give_none() {
        let notes = note(b"GNU\0", 3, &[7; 20]);
        assert_eq!(find_build_id(&notes[..notes.len() - 4]), None);
        assert_eq!(find_build_id(&note(b"GNU\0", 1, &[7; 20])), None);
        assert_eq!(find_build_id(&[]), None);
    }
}
