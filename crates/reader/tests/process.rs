//! The process batch (format version 4): each generation's command line,
//! offered once the generation starts; none in older traces.

use alloctrace_reader::testing::{process_trace, sample_trace, stacks_trace};
use alloctrace_reader::{Record, TraceReader};

/// A generation's number, and its command line and truncation flag.
type GenerationCommand = (u64, Option<(Vec<String>, bool)>);

/// Per generation, its command line and truncation flag.
fn command_lines(trace: &[u8]) -> Vec<GenerationCommand> {
    let mut reader = TraceReader::new(trace).unwrap();
    assert_eq!(reader.command_line(), None, "before the first generation");
    let mut out = Vec::new();
    while let Some(record) = reader.next_record().unwrap() {
        if let Record::GenerationStart { generation } = record {
            let p = reader
                .process()
                .map(|p| (p.command_line.clone(), p.truncated));
            assert_eq!(
                reader.command_line(),
                p.as_ref().map(|(args, _)| args.as_slice())
            );
            out.push((generation, p));
        }
    }
    out
}

#[test]
fn each_generation_has_its_command_line() {
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        command_lines(&process_trace()),
        [
            (
                1,
                Some((args(&["/bin/app", "--size", "3", "x\u{fffd}y"]), false))
            ),
            (2, Some((args(&["/bin/app", "-"]), true))),
        ]
    );
}

#[test]
fn traces_without_process_batches_have_no_command_line() {
    for trace in [sample_trace(), stacks_trace()] {
        let lines = command_lines(&trace);
        assert_eq!(lines.len(), 2);
        assert!(lines.iter().all(|(_, p)| p.is_none()), "{lines:?}");
    }
}
