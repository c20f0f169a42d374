//! The modeled stream of compressed-modeled batches (FORMAT.md section
//! 2.2): the inverse gives back exactly the encoder's input for any input,
//! and a malformed stream is an error, never a panic or unbounded output.

use alloctrace_format::compression_model::{max_modeled_len, size_class, Decoder, Encoder};
use alloctrace_format::{zigzag, BatchKind, ENTRY_TAG, LONG_FORM};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Mostly small values, sometimes anything.
    fn value(&mut self) -> u64 {
        match self.below(8) {
            0 => self.next(),
            1 => self.below(1 << 20),
            2 => u64::MAX - self.below(3),
            _ => self.below(300),
        }
    }
}

fn varint(out: &mut Vec<u8>, v: u64) {
    alloctrace_format::push_uvarint(out, v);
}

fn batch(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// A heap the generated events follow part of the time, so the model's
/// predictions hit as well as miss.
#[derive(Default)]
struct Heap {
    live: Vec<(u64, u64)>,
    freed: Vec<u64>,
}

/// A compact events batch: every event kind, short and long form, entry
/// tags, frees of live objects and allocations of freed IDs mixed with
/// random ones, and odd values.
fn events_payload(rng: &mut Rng, heap: &mut Heap, events: usize) -> Vec<u8> {
    let mut p = Vec::new();
    for _ in 0..3 {
        varint(&mut p, rng.value());
    }
    let mut previous = [0u64; 3];
    for _ in 0..events {
        let kind = 1 + rng.below(12) as u8;
        let long = kind != 10 && rng.below(10) == 0;
        let tagged = kind == 10 || rng.below(3) != 0;
        let mut kind_byte = kind;
        if long {
            kind_byte |= LONG_FORM;
        }
        if tagged {
            kind_byte |= ENTRY_TAG;
        }
        p.push(kind_byte);
        varint(&mut p, rng.value());
        let class = match kind {
            1..=3 | 12 => Some(0),
            4..=6 | 11 => Some(1),
            7..=9 => Some(2),
            _ => None,
        };
        let (id, size) = match kind {
            6 if !heap.live.is_empty() && rng.below(4) != 0 => {
                let i = match rng.below(3) {
                    0 => 0,
                    1 => heap.live.len() - 1,
                    _ => rng.below(heap.live.len() as u64) as usize,
                };
                let (id, _) = heap.live.remove(i);
                heap.freed.push(id);
                (id, 0)
            }
            4 | 5 | 11 => {
                let size = if rng.below(2) == 0 {
                    16 + rng.below(240)
                } else {
                    rng.value()
                };
                let id = match heap.freed.pop() {
                    Some(id) if rng.below(3) != 0 => id,
                    _ => rng.value(),
                };
                heap.live.push((id, size));
                if heap.live.len() > 5000 {
                    heap.live.remove(0);
                }
                (id, size)
            }
            _ => (rng.value(), rng.value()),
        };
        let first = match class {
            Some(c) if !long => {
                let arg = zigzag(id.wrapping_sub(previous[c]) as i64);
                previous[c] = id;
                arg
            }
            _ => id,
        };
        varint(&mut p, first);
        match kind {
            1 | 2 => {
                varint(&mut p, rng.value());
                varint(&mut p, rng.value());
            }
            4 | 5 => {
                varint(&mut p, size);
                varint(&mut p, rng.below(4));
            }
            11 => {
                varint(&mut p, size);
                varint(&mut p, rng.below(4));
                // Stack IDs: mostly small and repeating, sometimes any.
                let stack = if rng.below(8) == 0 {
                    rng.value()
                } else {
                    1 + rng.below(20)
                };
                varint(&mut p, stack);
            }
            12 => {
                varint(&mut p, rng.value());
                varint(&mut p, rng.value());
                varint(&mut p, 1 + rng.below(20));
            }
            7 | 8 => varint(&mut p, rng.below(64)),
            _ => {}
        }
        if tagged {
            varint(
                &mut p,
                if rng.below(8) == 0 {
                    rng.value()
                } else {
                    1 + rng.below(13)
                },
            );
        }
    }
    p
}

/// A stream of raw batches: compact events (most), plain events, pages,
/// info-like bodies, empty batches, batches the model must copy (an unknown
/// event kind, a varint not in its shortest form, a cut event), and
/// sometimes bytes that are not a batch at all at the end.
fn raw_stream(rng: &mut Rng) -> Vec<u8> {
    let mut heap = Heap::default();
    let mut out = Vec::new();
    for _ in 0..rng.below(12) {
        let compact = BatchKind::CompactEvents as u8;
        match rng.below(10) {
            0 => out.extend(batch(
                BatchKind::Events as u8,
                &events_payload(rng, &mut heap, 20),
            )),
            1 => {
                let words: Vec<u8> = (0..rng.below(20))
                    .flat_map(|_| rng.next().to_le_bytes())
                    .collect();
                out.extend(batch(BatchKind::Pages as u8, &words));
            }
            2 => {
                let body: Vec<u8> = (0..rng.below(40)).map(|_| rng.next() as u8).collect();
                out.extend(batch(1 + rng.below(9) as u8, &body));
            }
            3 => {
                let mut p = events_payload(rng, &mut heap, 30);
                let at = rng.below(p.len() as u64) as usize;
                match rng.below(3) {
                    // An unknown kind byte, or a varint made longer than it
                    // need be: both parse only as verbatim.
                    0 => p.push(if rng.below(2) == 0 { 0 } else { 13 }),
                    1 => {
                        p[at] |= 0x80;
                        p.insert(at + 1, 0);
                    }
                    _ => p.truncate(at),
                }
                out.extend(batch(compact, &p));
            }
            4 => out.extend(batch(compact, &[])),
            _ => {
                let n = 1 + rng.below(300) as usize;
                out.extend(batch(compact, &events_payload(rng, &mut heap, n)));
            }
        }
    }
    match rng.below(6) {
        0 => out.extend((0..rng.below(7)).map(|_| rng.next() as u8)),
        1 => {
            // A batch that declares more bytes than follow.
            out.extend(batch(
                BatchKind::CompactEvents as u8,
                &events_payload(rng, &mut heap, 5),
            ));
            out.truncate(out.len() - 1);
        }
        _ => {}
    }
    out
}

fn round_trip(encoder: &mut Encoder, decoder: &mut Decoder, raw: &[u8]) -> Vec<u8> {
    let mut modeled = Vec::new();
    assert!(encoder.encode(raw, &mut modeled));
    let mut back = b"kept".to_vec();
    decoder
        .decode(&modeled, raw.len() as u64, &mut back)
        .unwrap();
    assert_eq!(&back[..4], b"kept", "decode appends");
    assert!(back[4..] == *raw, "round trip differs");
    modeled
}

#[test]
fn any_batches_round_trip_exactly() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut encoder = Encoder::with_capacity(1 << 10);
    let mut decoder = Decoder::new();
    // Miri (`make miri`) interprets about a thousand times slower.
    let (streams, random) = if cfg!(miri) { (3, 20) } else { (600, 200) };
    for _ in 0..streams {
        let raw = raw_stream(&mut rng);
        round_trip(&mut encoder, &mut decoder, &raw);
    }
    // Random bytes, too.
    for len in 0..random {
        let raw: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        round_trip(&mut encoder, &mut decoder, &raw);
    }
}

#[test]
fn many_batches_the_model_cannot_parse_still_round_trip() {
    // More broken compact batches than the encoder retries for one by one.
    let mut rng = Rng(7);
    let mut heap = Heap::default();
    let mut raw = Vec::new();
    for i in 0..40 {
        let mut p = events_payload(&mut rng, &mut heap, 10);
        if i % 2 == 0 {
            p.push(0);
        }
        raw.extend(batch(BatchKind::CompactEvents as u8, &p));
    }
    round_trip(&mut Encoder::with_capacity(0), &mut Decoder::new(), &raw);
}

/// The allocation pattern of the benchmark: a ring of slots freed in
/// allocation order, each refilled at once with a small allocation that
/// reuses the block just freed.
fn ring_workload(events: usize) -> Vec<u8> {
    let mut rng = Rng(3);
    let mut p = Vec::new();
    for v in [1, 1, 1000] {
        varint(&mut p, v);
    }
    let mut ring = vec![(0u64, 0u64); 512];
    let mut previous = 0u64;
    let mut next_new = 1u64 << 32;
    for i in 0..events / 2 {
        let slot = i % ring.len();
        let (old, old_size) = ring[slot];
        if old != 0 {
            p.push(6 | ENTRY_TAG);
            varint(&mut p, 50 + rng.below(100));
            varint(&mut p, zigzag(old.wrapping_sub(previous) as i64));
            previous = old;
            varint(&mut p, 4);
        }
        let size = if old != 0 && rng.below(2) == 0 {
            old_size
        } else {
            16 + rng.below(240)
        };
        let id = if old != 0 && size_class(size) == size_class(old_size) {
            old
        } else {
            next_new += 64;
            next_new
        };
        p.push(5 | ENTRY_TAG);
        varint(&mut p, 50 + rng.below(100));
        varint(&mut p, zigzag(id.wrapping_sub(previous) as i64));
        previous = id;
        varint(&mut p, size);
        varint(&mut p, 0);
        varint(&mut p, 1);
        ring[slot] = (id, size);
    }
    batch(BatchKind::CompactEvents as u8, &p)
}

#[test]
fn the_model_predicts_frees_and_reused_blocks() {
    let raw = ring_workload(40_000);
    let modeled = round_trip(&mut Encoder::with_capacity(0), &mut Decoder::new(), &raw);
    // The IDs column (the fifth) holds one code per heap event: 1 for a
    // free in allocation order and for the block freed last of its size
    // class, 0 for an escape (the ring's first round, new blocks).
    let mut pos = 0;
    let lens: Vec<usize> = (0..9)
        .map(|_| alloctrace_format::get_uvarint(&modeled, &mut pos).unwrap() as usize)
        .collect();
    let start = pos + lens[..4].iter().sum::<usize>();
    let ids = &modeled[start..start + lens[4]];
    let hits = ids.iter().filter(|&&b| b == 1).count();
    let escapes = ids.iter().filter(|&&b| b == 0).count();
    // The ring's first confirmed free has an age 512 off the initial
    // guess of 0: a two-byte code.
    assert_eq!(ids.len(), 40_000 - 512 + 1, "one code per heap event");
    assert!(
        hits * 4 > ids.len() * 3,
        "{hits} predicted of {}",
        ids.len()
    );
    assert!(
        escapes * 3 < ids.len(),
        "{escapes} escapes of {}",
        ids.len()
    );
    assert!(modeled.len() < raw.len());
    assert!(modeled.len() as u64 <= max_modeled_len(raw.len() as u64));
}

fn decode(
    stream: &[u8],
    raw_len: u64,
) -> Result<Vec<u8>, alloctrace_format::compression_model::ModelError> {
    thread_local! {
        static DECODER: std::cell::RefCell<Decoder> = std::cell::RefCell::new(Decoder::new());
    }
    let mut out = Vec::new();
    let result = DECODER.with(|d| d.borrow_mut().decode(stream, raw_len, &mut out));
    // Output stays within raw_len and one event, whatever the input.
    assert!(
        out.len() as u64 <= raw_len + 64,
        "{} bytes out for raw_len {raw_len}",
        out.len()
    );
    result.map(|()| out)
}

#[test]
fn malformed_streams_are_errors_with_an_offset() {
    let mut rng = Rng(11);
    let raw = {
        let mut raw = ring_workload(2000);
        raw.extend(raw_stream(&mut rng));
        raw
    };
    let mut modeled = Vec::new();
    assert!(Encoder::with_capacity(0).encode(&raw, &mut modeled));
    let len = raw.len() as u64;
    assert_eq!(decode(&modeled, len).unwrap(), raw);
    // Cuts: every one in the column lengths and the first columns, then
    // a sample.
    let cuts = (0..300).chain((0..300).map(|_| rng.below(modeled.len() as u64) as usize));
    for cut in cuts {
        let e = decode(&modeled[..cut], len).unwrap_err();
        assert!(e.at <= cut as u64, "{e:?} for a cut at {cut}");
    }
    // raw_len lies.
    for lie in [0, 1, len - 1, len + 1, 64 << 20] {
        let e = decode(&modeled, lie).unwrap_err();
        assert!(e.at <= modeled.len() as u64, "{e:?}");
    }
    // Bytes after the last column.
    let mut longer = modeled.clone();
    longer.push(0);
    assert_eq!(
        decode(&longer, len).unwrap_err().what,
        "bytes after the last column"
    );
    // Damaged bytes anywhere: an error or some output, never a panic.
    for _ in 0..3000 {
        let mut bad = modeled.clone();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(bad.len() as u64) as usize;
            bad[at] = rng.next() as u8;
        }
        let _ = decode(&bad, len);
    }
    // Random streams.
    for _ in 0..3000 {
        let bad: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
        let _ = decode(&bad, rng.below(1 << 12));
    }
}

/// A stream of one modeled events batch from its columns, in order.
fn stream(columns: [&[u8]; 9]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in columns {
        varint(&mut out, c.len() as u64);
    }
    for c in columns {
        out.extend_from_slice(c);
    }
    out
}

#[test]
fn codes_the_model_cannot_resolve_are_errors() {
    // batches: form 1, header 1 1 0, one event. kinds: a heap free.
    let header: &[u8] = &[1, 1, 1, 0, 1];
    let free: &[u8] = &[6];
    let alloc: &[u8] = &[5];
    // A free that names an allocation never made.
    let e = decode(
        &stream([header, &[], free, &[0], &[1], &[], &[], &[], &[]]),
        100,
    )
    .unwrap_err();
    assert!(e.what.contains("names no allocation"), "{e:?}");
    // An allocation from a size class with no freed ID.
    let e = decode(
        &stream([header, &[], alloc, &[0], &[1], &[], &[16], &[0], &[]]),
        100,
    )
    .unwrap_err();
    assert!(e.what.contains("no freed ID"), "{e:?}");
    // An escape missing from its column.
    let e = decode(
        &stream([header, &[], free, &[0], &[0], &[], &[], &[], &[]]),
        100,
    )
    .unwrap_err();
    assert!(e.what.contains("escape"), "{e:?}");
    // An unknown event kind, an unknown batch form.
    let e = decode(
        &stream([header, &[], &[13], &[0], &[], &[], &[], &[0], &[]]),
        100,
    )
    .unwrap_err();
    assert_eq!(e.what, "unknown event kind");
    let e = decode(&stream([&[7], &[], &[], &[], &[], &[], &[], &[], &[]]), 100).unwrap_err();
    assert_eq!((e.what, e.at), ("unknown batch form", 9));
    // An event count that lies: the kinds column runs out.
    let e = decode(
        &stream([
            &[1, 1, 1, 0, 100],
            &[],
            free,
            &[0],
            &[0],
            &[0],
            &[],
            &[],
            &[],
        ]),
        1000,
    )
    .unwrap_err();
    assert!(e.what.contains("kinds column"), "{e:?}");
    // A verbatim batch longer than raw_len.
    let e = decode(
        &stream([&[0, 5], &[1, 2, 3, 4, 5], &[], &[], &[], &[], &[], &[], &[]]),
        4,
    )
    .unwrap_err();
    assert!(e.what.contains("raw_len"), "{e:?}");
    // The valid version of the first: a lone escaped free decodes.
    let ok = decode(
        &stream([header, &[], free, &[0], &[0], &[6], &[], &[], &[]]),
        11,
    )
    .unwrap();
    assert_eq!(ok, [7, 6, 0, 0, 0, 1, 1, 0, 6, 0, 6]);
}

#[test]
fn size_classes() {
    assert_eq!(size_class(0), 0);
    assert_eq!(size_class(1), 1);
    assert_eq!(size_class(16), 1);
    assert_eq!(size_class(17), 2);
    assert_eq!(size_class(1024), 64);
    assert_eq!(size_class(1025), 65);
    assert_eq!(size_class(1280), 65);
    assert_eq!(size_class(1281), 66);
    assert_eq!(size_class(2048), 68);
    assert_eq!(size_class(u64::MAX), 280);
}

#[test]
fn a_block_freed_in_one_size_class_comes_back_in_another() {
    // Allocate 32 bytes at ID 100, free it, allocate 500 bytes there.
    let mut p = Vec::new();
    for v in [1, 1, 0] {
        varint(&mut p, v);
    }
    for (kind, id_delta, args) in [
        (5u8, 200u64, &[32u64, 0][..]),
        (6, 0, &[]),
        (5, 0, &[500, 0]),
    ] {
        p.push(kind);
        varint(&mut p, 1);
        varint(&mut p, id_delta);
        for &a in args {
            varint(&mut p, a);
        }
    }
    let raw = batch(BatchKind::CompactEvents as u8, &p);
    let modeled = round_trip(&mut Encoder::with_capacity(0), &mut Decoder::new(), &raw);
    let mut pos = 0;
    let lens: Vec<usize> = (0..9)
        .map(|_| alloctrace_format::get_uvarint(&modeled, &mut pos).unwrap() as usize)
        .collect();
    let start = pos + lens[..4].iter().sum::<usize>();
    // An escape, the free one allocation back (zigzag(1) + 1), and the
    // block the last free released (8 + 1): not in class 32's list.
    assert_eq!(&modeled[start..start + lens[4]], &[0, 3, 9]);
    // The same code with nothing freed yet names nothing.
    let e = decode(
        &stream([
            &[1, 1, 1, 0, 1],
            &[],
            &[5],
            &[0],
            &[9],
            &[],
            &[16],
            &[0],
            &[],
        ]),
        100,
    )
    .unwrap_err();
    assert!(e.what.contains("no freed ID"), "{e:?}");
}

#[test]
fn stack_events_are_modeled_not_copied() {
    // A heap alloc with a stack (kind 11), its free, an alloc with a stack
    // at the freed block, and a span alloc with a stack (kind 12).
    let mut p = Vec::new();
    for v in [1, 1, 0] {
        varint(&mut p, v);
    }
    for (kind, args) in [
        (11u8, &[200u64, 32, 0, 7][..]),
        (6, &[0][..]),
        (11, &[0, 32, 0, 9][..]),
        (12, &[10, 4, 1, 3][..]),
    ] {
        p.push(kind);
        varint(&mut p, 1);
        for &a in args {
            varint(&mut p, a);
        }
    }
    let raw = batch(BatchKind::CompactEvents as u8, &p);
    let modeled = round_trip(&mut Encoder::with_capacity(0), &mut Decoder::new(), &raw);
    let mut pos = 0;
    let lens: Vec<usize> = (0..9)
        .map(|_| alloctrace_format::get_uvarint(&modeled, &mut pos).unwrap() as usize)
        .collect();
    assert_eq!(lens[1], 0, "nothing copied verbatim: {lens:?}");
    assert_eq!(modeled[pos], 1, "the batch's form is modeled events");
    let start = pos + lens[..4].iter().sum::<usize>();
    // An escape, the free one allocation back, the block freed in class
    // 32 (code 1): kind 11's IDs go through the model as kind 5's do.
    assert_eq!(&modeled[start..start + lens[4]], &[0, 3, 1]);
    // Both stack IDs in the args column, after the type.
    let args_start = start + lens[4] + lens[5] + lens[6];
    assert_eq!(
        &modeled[args_start..args_start + lens[7]],
        &[0, 7, 0, 9, 10, 4, 1, 3]
    );
}
