//! The event path's thread-local words, read in two instructions.
//!
//! Rust's `thread_local!` in a shared object uses the general-dynamic TLS
//! model: every access calls `__tls_get_addr`, about a dozen instructions
//! and a call, twice per interposed malloc. On x86-64 Linux these words
//! live instead in a `.tbss` block of our own, accessed with the
//! initial-exec model (the offset from the thread pointer comes from the
//! GOT, the word from `%fs:offset`), as jemalloc and glibc's own malloc do.
//!
//! Initial-exec TLS comes from the static TLS block, which always has room
//! for libraries loaded at start-up (linked or LD_PRELOADed). A library
//! `dlopen`ed later takes its 16 bytes from glibc's static TLS surplus
//! (hundreds of bytes, `glibc.rtld.optional_static_tls`), so dlopen works
//! too unless many other initial-exec libraries used the surplus up first.
//!
//! Elsewhere the words are ordinary `thread_local!` cells.
//!
//! All words start at zero on every thread, need no destructor and never
//! allocate, so they are safe from the first malloc ld.so makes to the last
//! free of a dying thread.

/// Which word.
#[derive(Clone, Copy)]
#[repr(usize)]
pub enum Word {
    /// The calling thread's `ThreadSlot`, or 0 (thread.rs).
    Slot = 0,
    /// Free for the core's client: the LD_PRELOAD shim keeps its reentrancy
    /// state here.
    Client = 1,
    /// The thread's stack as its host knows it, lowest address and one past
    /// the highest, for native stack captures (stacks/capture); 0 unknown.
    StackLo = 2,
    StackHi = 3,
    /// The calling thread's slot's entry in sampling.rs's table of
    /// countdowns and counts, or 0: set with `Slot` (thread.rs), so that
    /// sampling's fast path finds it in one load.
    Counts = 4,
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use super::Word;

    // Five words of static TLS. The symbol is global so that every codegen
    // unit binds to this one definition, and hidden so that it never leaves
    // the shared object: the shim and liballoctrace.so each have their own.
    core::arch::global_asm!(
        ".pushsection .tbss,\"awT\",@nobits",
        ".p2align 4",
        ".globl alloctrace_writer_tls",
        ".hidden alloctrace_writer_tls",
        ".type alloctrace_writer_tls,@object",
        ".size alloctrace_writer_tls,40",
        "alloctrace_writer_tls:",
        ".zero 40",
        ".popsection",
    );

    /// The offset of the TLS block from the thread pointer.
    #[inline(always)]
    fn offset() -> usize {
        let off: usize;
        // SAFETY: loads the GOT entry the linker fills with the block's
        // thread-pointer offset; reads no other memory.
        unsafe {
            core::arch::asm!(
                "mov {off}, qword ptr [rip + alloctrace_writer_tls@GOTTPOFF]",
                off = out(reg) off,
                options(nostack, preserves_flags, pure, readonly),
            );
        }
        off
    }

    #[inline(always)]
    pub fn get(word: Word) -> usize {
        let off = offset() + word as usize * 8;
        let v: usize;
        // SAFETY: %fs:off is this thread's word in the static TLS block.
        unsafe {
            core::arch::asm!(
                "mov {v}, qword ptr fs:[{off}]",
                off = in(reg) off,
                v = out(reg) v,
                // pure: the word changes only through `set` (which clobbers
                // memory, so no read moves across it) or inside a signal
                // handler, which puts it back before returning.
                options(nostack, preserves_flags, readonly, pure),
            );
        }
        v
    }

    /// Two words, with one load of the block's offset.
    #[inline(always)]
    pub fn get_pair(a: Word, b: Word) -> (usize, usize) {
        let off = offset();
        (at(off, a), at(off, b))
    }

    /// `word`, its place in the block folded into the load.
    #[inline(always)]
    fn at(off: usize, word: Word) -> usize {
        match word {
            Word::Slot => load::<0>(off),
            Word::Client => load::<1>(off),
            Word::StackLo => load::<2>(off),
            Word::StackHi => load::<3>(off),
            Word::Counts => load::<4>(off),
        }
    }

    #[inline(always)]
    fn load<const W: usize>(off: usize) -> usize {
        let v: usize;
        // SAFETY: as in `get`.
        unsafe {
            core::arch::asm!(
                "mov {v}, qword ptr fs:[{off} + {disp}]",
                off = in(reg) off,
                disp = const W * 8,
                v = out(reg) v,
                options(nostack, preserves_flags, readonly, pure),
            );
        }
        v
    }

    #[inline(always)]
    pub fn set(word: Word, v: usize) {
        let off = offset() + word as usize * 8;
        // SAFETY: as in `get`; the word is this thread's own.
        unsafe {
            core::arch::asm!(
                "mov qword ptr fs:[{off}], {v}",
                off = in(reg) off,
                v = in(reg) v,
                options(nostack, preserves_flags),
            );
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod imp {
    use super::Word;
    use core::cell::Cell;

    thread_local! {
        static WORDS: [Cell<usize>; 5] = const { [const { Cell::new(0) }; 5] };
    }

    #[inline(always)]
    pub fn get(word: Word) -> usize {
        WORDS.with(|w| w[word as usize].get())
    }

    #[inline(always)]
    pub fn get_pair(a: Word, b: Word) -> (usize, usize) {
        (get(a), get(b))
    }

    #[inline(always)]
    pub fn set(word: Word, v: usize) {
        WORDS.with(|w| w[word as usize].set(v))
    }
}

/// The calling thread's value of `word`.
#[inline(always)]
pub fn get(word: Word) -> usize {
    imp::get(word)
}

/// The calling thread's values of `a` and `b` (the block's offset loaded
/// once).
#[inline(always)]
pub fn get_pair(a: Word, b: Word) -> (usize, usize) {
    imp::get_pair(a, b)
}

/// Sets the calling thread's value of `word`.
#[inline(always)]
pub fn set(word: Word, v: usize) {
    imp::set(word, v)
}
