//! The shim's capture (`capture_stack_from`, from the caller's registers
//! as a naked entry hands them over) from two call sites in turn: each
//! keeps its stack ID, and a stack walked after one taken from a branch
//! of the memo is interned right. (A test file of its own: one session per
//! process.)
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

mod common;

use std::hint::black_box;

use alloctrace_writer::capture::{self, StackMode};

/// A naked entry, as the shim's malloc and TracingAlloc's: hands its
/// caller's return address, stack pointer and rbp to `entry_body`, which
/// captures from there (`capture_stack_from`); the stack ID.
#[unsafe(naked)]
extern "sysv64" fn entry() -> u64 {
    core::arch::naked_asm!(
        "mov rdi, [rsp]",
        "lea rsi, [rsp + 8]",
        "mov rdx, rbp",
        "jmp {body}",
        body = sym entry_body,
    )
}

extern "sysv64" fn entry_body(ra: u64, sp: u64, bp: u64) -> u64 {
    capture::capture_stack_from(capture::StartRegs { ra, sp, bp })
}

#[inline(never)]
fn from_leaf_a() -> u64 {
    black_box(entry())
}

#[inline(never)]
fn from_leaf_b() -> u64 {
    black_box(entry())
}

/// `which` 0: through `from_leaf_a`; else from here.
#[inline(never)]
fn from_q(which: u32) -> u64 {
    if which == 0 {
        black_box(from_leaf_a())
    } else {
        black_box(entry())
    }
}

#[inline(never)]
fn from_p(which: u32) -> u64 {
    black_box(from_q(black_box(which)))
}

#[inline(never)]
fn from_r() -> u64 {
    black_box(from_leaf_b())
}

/// `code` 2: b (through `from_r`); else through `from_p(code)`, from one
/// call instruction (a, or c).
#[inline(never)]
fn site(code: u32) -> u64 {
    if code == 2 {
        black_box(from_r())
    } else {
        black_box(from_p(black_box(code)))
    }
}

/// `site(code)` for each of `codes` in turn, from one call instruction:
/// an optimised build may peel or unroll a loop, and a capture from a
/// copy of the call is another stack (the induction variable goes through
/// `black_box`, so the loop has no trip count to unroll by, and nothing
/// else in it branches).
#[inline(never)]
fn captures(codes: &[u32], ids: &mut Vec<u64>) {
    let mut k = 0;
    while k < codes.len() {
        ids.push(site(black_box(codes[k])));
        k = black_box(k + 1);
    }
}

#[test]
fn two_call_sites_in_turn_keep_their_stacks() {
    // The shim's capture (from the caller's registers) from two call
    // sites in turn, a (under p, q) and b (under r), then from c, under
    // p and q like a: each site keeps one stack ID however its captures
    // come about (a branch of the memo, with the ID the first capture
    // of that walk interned), and c, walked after a capture that took
    // a's walk from the branch, shares a's outer frames, not b's.
    let dir = std::env::temp_dir().join(format!("alloctrace-capture-alt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("capture.trace");
    let config = alloctrace_writer::Config {
        min_heap_align: 16,
        stacks: StackMode::Full,
        ..Default::default()
    };
    common::start_to(&path, &config);
    // One call site for all (so that the stacks differ only where the
    // sites do): c, then a and b in turn, a, then c again.
    // Rounds of it, a while: the walks step by the compact tables (which
    // the memo can re-check) once the writer thread has built them.
    let round = [1, 0, 2, 0, 2, 0, 2, 0, 2, 0, 1];
    let codes: Vec<u32> = round
        .iter()
        .copied()
        .cycle()
        .take(round.len() * 40)
        .collect();
    let mut ids = Vec::new();
    for round in codes.chunks(round.len()) {
        std::thread::sleep(std::time::Duration::from_millis(5));
        captures(round, &mut ids);
    }
    alloctrace_writer::stop().unwrap();
    let of = |code: u32| -> Vec<u64> {
        codes
            .iter()
            .zip(&ids)
            .filter(|(&c, _)| c == code)
            .map(|(_, &id)| id)
            .collect()
    };
    let (a, b, c) = (of(0), of(2), of(1));
    let (c_alone, c_after_a) = (c[0], c[1]);
    assert!(c.iter().all(|&id| id == c_alone), "{c:?}");
    assert!(c_alone != 0 && a[0] != 0 && b[0] != 0);
    assert!(a.iter().all(|&id| id == a[0]), "{a:?}");
    assert!(b.iter().all(|&id| id == b[0]), "{b:?}");
    assert_ne!(a[0], b[0]);
    assert_ne!(a[0], c_alone);
    assert_eq!(c_after_a, c_alone, "a: {a:?}, b: {b:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
