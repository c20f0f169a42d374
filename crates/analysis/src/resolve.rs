//! Stacks as source frames, for output: each [`Frame`] of the
//! [`StackTable`] symbolized once (an address in inlined code gives several
//! source frames, the inlined function first).

use alloctrace_symbolize::{SymbolFrame, Symbolizer};
use rustc_hash::FxHashMap;

use crate::stacks::{Frame, StackId, StackTable};

/// One source-level frame as reports print it. The JSON shape of `top`,
/// `leaks` and `diff`: `{"function", "file", "line", "module", "address"}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceFrame {
    /// The function (demangled), or `module+0xOFFSET` when unknown,
    /// `[truncated]` for the truncation marker.
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The module's path as the trace names it; `[registered]` for a
    /// runtime's registered frame; empty when unknown.
    pub module: String,
    /// The module-relative return address, `0x...` (what `addr2line -e
    /// MODULE` takes, plus one); the absolute address when no module
    /// holds it; empty for registered frames and the marker.
    pub address: String,
}

/// Symbolizes frames once each.
pub struct Resolver {
    pub symbolizer: Symbolizer,
    cache: FxHashMap<Frame, Vec<SourceFrame>>,
}

impl Resolver {
    pub fn new(symbolizer: Symbolizer) -> Resolver {
        Resolver {
            symbolizer,
            cache: FxHashMap::default(),
        }
    }

    /// The source frames of one frame (never empty).
    pub fn frame(&mut self, table: &StackTable, frame: Frame) -> &[SourceFrame] {
        let symbolizer = &mut self.symbolizer;
        self.cache.entry(frame).or_insert_with(|| match frame {
            Frame::Native { module, offset } => {
                let key = &table.modules()[module as usize];
                let address = format!("{offset:#x}");
                symbolizer
                    .symbolize(key, offset)
                    .iter()
                    .map(|s: &SymbolFrame| SourceFrame {
                        function: s.function.clone(),
                        file: s.file.clone(),
                        line: s.line,
                        module: key.path.clone(),
                        address: address.clone(),
                    })
                    .collect()
            }
            Frame::Unknown { addr } => vec![SourceFrame {
                function: format!("{addr:#x}"),
                file: None,
                line: None,
                module: String::new(),
                address: format!("{addr:#x}"),
            }],
            Frame::Registered(i) => {
                let r = &table.registered()[i as usize];
                vec![SourceFrame {
                    function: r.function.clone(),
                    file: (!r.file.is_empty()).then(|| r.file.clone()),
                    line: (r.line != 0).then(|| u32::try_from(r.line).unwrap_or(u32::MAX)),
                    module: "[registered]".to_string(),
                    address: String::new(),
                }]
            }
            Frame::Truncated => vec![SourceFrame {
                function: "[truncated]".to_string(),
                file: None,
                line: None,
                module: String::new(),
                address: String::new(),
            }],
        })
    }

    /// The source frames of a stack, innermost first.
    pub fn stack(&mut self, table: &StackTable, stack: StackId) -> Vec<SourceFrame> {
        let mut out = Vec::new();
        for frame in table.frames(stack) {
            out.extend_from_slice(self.frame(table, frame));
        }
        out
    }
}
