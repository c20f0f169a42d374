//! glibc's own definitions, never an interposer's (real.rs re-exports
//! [`libc_own`]): for the shim's own calls, its threads and signal
//! handlers, which must not reach a library preloaded after it.

use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicPtr, Ordering};

extern "C" {
    fn gnu_get_libc_version() -> *const c_char;
    fn dladdr1(
        addr: *const c_void,
        info: *mut libc::Dl_info,
        extra: *mut *mut c_void,
        flags: c_int,
    ) -> c_int;
}

/// dladdr1's request for the object's link map (glibc's dlfcn.h).
const RTLD_DL_LINKMAP: c_int = 2;

// glibc's own definitions, found in libc.so.6's dynamic symbol table (its
// GNU hash table) without dlsym: dlsym on libc's link map needs a search
// list that ld.so builds only for dlopen'd objects, and dlopen itself is
// interposed (by the shim, and maybe by the next library). 64-bit ELF.

/// struct link_map's public head (glibc's link.h).
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *const ElfDyn,
}

#[repr(C)]
struct ElfDyn {
    d_tag: i64,
    d_val: u64,
}

#[repr(C)]
struct ElfSym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    st_shndx: u16,
    st_value: u64,
    st_size: u64,
}

const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;

/// The GNU hash of a symbol name (without its NUL).
fn gnu_hash(name: &[u8]) -> u32 {
    name.iter().fold(5381u32, |h, &c| {
        h.wrapping_mul(33).wrapping_add(u32::from(c))
    })
}

/// Looks `name` (NUL-terminated) up in libc.so.6's dynamic symbol table: the
/// address of its default-version definition, or null.
fn libc_symbol(name: &[u8]) -> *mut c_void {
    // SAFETY: a zeroed Dl_info is valid; dladdr1 fills it and `map`.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let mut map: *mut c_void = core::ptr::null_mut();
    // SAFETY: the address of a function of libc.so.6 (nobody interposes
    // gnu_get_libc_version), valid out-pointers.
    let found = unsafe {
        dladdr1(
            gnu_get_libc_version as *const c_void,
            &mut info,
            &mut map,
            RTLD_DL_LINKMAP,
        )
    };
    if found == 0 || map.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: (1) dladdr1 returned libc's link map, whose head is LinkMap
    // and whose l_ld is its mapped dynamic section, ended by DT_NULL.
    // (2) The dynamic entries point into libc's mapped image (ld.so has
    // added the load address on most targets; where it has not, the value
    // is below it and we add it). (3) The GNU hash table's layout is the
    // ELF gABI extension's: nbuckets, symoffset, bloom size and shift, the
    // bloom words, the buckets, then one chain word per symbol from
    // symoffset, the last of each chain with bit 0 set; every index read is
    // one the table itself gives.
    unsafe {
        let map = &*(map as *const LinkMap);
        let base = map.l_addr;
        let at = |v: u64| -> usize {
            let v = v as usize;
            if v < base {
                v + base
            } else {
                v
            }
        };
        let (mut strtab, mut symtab, mut hash, mut versym) = (0, 0, 0, 0);
        let mut d = map.l_ld;
        while (*d).d_tag != DT_NULL {
            match (*d).d_tag {
                DT_STRTAB => strtab = at((*d).d_val),
                DT_SYMTAB => symtab = at((*d).d_val),
                DT_GNU_HASH => hash = at((*d).d_val),
                DT_VERSYM => versym = at((*d).d_val),
                _ => {}
            }
            d = d.add(1);
        }
        if strtab == 0 || symtab == 0 || hash == 0 {
            return core::ptr::null_mut();
        }
        let key = &name[..name.len() - 1];
        let h = gnu_hash(key);
        let words = hash as *const u32;
        let (nbuckets, symoffset, bloom_size) = (*words, *words.add(1), *words.add(2));
        if nbuckets == 0 {
            return core::ptr::null_mut();
        }
        let buckets = words.add(4 + 2 * bloom_size as usize);
        let chains = buckets.add(nbuckets as usize);
        let mut i = *buckets.add((h % nbuckets) as usize);
        if i < symoffset {
            return core::ptr::null_mut();
        }
        loop {
            let h2 = *chains.add((i - symoffset) as usize);
            if h | 1 == h2 | 1 {
                let sym = &*(symtab as *const ElfSym).add(i as usize);
                let sym_name =
                    core::ffi::CStr::from_ptr((strtab + sym.st_name as usize) as *const c_char);
                // 0x8000: a hidden (non-default) version.
                let default = versym == 0 || *(versym as *const u16).add(i as usize) & 0x8000 == 0;
                // STT_FUNC only (an IFUNC's value is its resolver).
                let function = sym.st_info & 0xf == 2;
                if sym_name.to_bytes() == key
                    && sym.st_shndx != 0
                    && sym.st_value != 0
                    && function
                    && default
                {
                    return (base + sym.st_value as usize) as *mut c_void;
                }
            }
            if h2 & 1 != 0 {
                return core::ptr::null_mut();
            }
            i += 1;
        }
    }
}

/// glibc's own definition of `name` (NUL-terminated), cached in `cache`,
/// never an interposer's: for the shim's own calls, which must not reach
/// the next library (it counts, fakes or filters the program's calls).
/// Null if libc has none.
pub fn libc_own(cache: &AtomicPtr<c_void>, name: &[u8]) -> *mut c_void {
    debug_assert_eq!(name.last(), Some(&0));
    let cached = cache.load(Ordering::Acquire);
    if !cached.is_null() {
        return cached;
    }
    let p = libc_symbol(name);
    cache.store(p, Ordering::Release);
    p
}
