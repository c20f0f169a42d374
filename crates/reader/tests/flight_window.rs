//! The flight-recorder window flag (FORMAT.md section 1): a dump says so in
//! its file header, and a trace without the flag does not.

use alloctrace_format::{FileHeader, FILE_HEADER_LEN, FLAG_FLIGHT_WINDOW, VERSION};
use alloctrace_reader::testing::sample_trace;
use alloctrace_reader::TraceReader;

fn with_flags(trace: &[u8], flags: u16) -> Vec<u8> {
    let mut out = FileHeader {
        version: VERSION,
        flags,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(&trace[FILE_HEADER_LEN..]);
    out
}

#[test]
fn the_header_flag_marks_a_window() {
    let trace = sample_trace();
    assert!(!TraceReader::new(&trace[..]).unwrap().flight_window());
    let dump = with_flags(&trace, FLAG_FLIGHT_WINDOW);
    let mut reader = TraceReader::new(&dump[..]).unwrap();
    assert!(reader.flight_window());
    let mut events = 0;
    while reader.next_event().unwrap().is_some() {
        events += 1;
    }
    assert!(events > 0, "a window reads as any trace");
    assert_eq!(reader.truncated(), None);
    // Bits a reader does not know are ignored.
    assert!(!TraceReader::new(&with_flags(&trace, 0x8000)[..])
        .unwrap()
        .flight_window());
}
