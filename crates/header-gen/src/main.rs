//! Writes the C headers of the alloctrace library:
//! `alloctrace-header-gen API.h FORMAT.h INLINE.h` writes the C API
//! (cbindgen, from src/capi.rs and cbindgen.toml) to API.h, the numbers the
//! inline event path needs (the wire format's, from the format crate
//! itself, and the private layout's, from the core) to FORMAT.h, and
//! include/alloctrace_inline.h to INLINE.h with its per-kind wrappers (the
//! lines between its BEGIN and END markers) written from the format
//! crate's event spec and the C API's prototypes.
//! Run from the workspace root (the Makefile does: `make header`).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use alloctrace_format::{
    AddressClass, EventKind, ENTRY_TAG, EVENT_KINDS, LONG_FORM, MAX_EVENT_LEN, MAX_VARINT_LEN,
};
use alloctrace_writer::shared::{
    inline_mode, BATCH_DATA_OFFSET, CALL_STACK_MAX_NODES, CALL_STACK_NODE_SIZE,
    CALL_STACK_NODE_USED_OFFSET,
};

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let [api, format, inline] = args.as_slice() else {
        eprintln!(
            "usage: alloctrace-header-gen API.h FORMAT.h INLINE.h   (run from the workspace root)"
        );
        return ExitCode::from(2);
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = match cbindgen::Config::from_file(root.join("cbindgen.toml")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: reading cbindgen.toml: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut api_text = Vec::new();
    match cbindgen::Builder::new()
        .with_crate(&root)
        .with_config(config)
        .generate()
    {
        Ok(bindings) => {
            bindings.write(&mut api_text);
        }
        Err(e) => {
            eprintln!("error: generating the header: {e}");
            return ExitCode::FAILURE;
        }
    }
    let api_text = String::from_utf8_lossy(&api_text).into_owned();
    let inline_path = root.join("include/alloctrace_inline.h");
    let inline_text = match std::fs::read_to_string(&inline_path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: reading {}: {e}", inline_path.display());
            return ExitCode::FAILURE;
        }
    };
    let inline_text = match inline_header(&inline_text, &api_text) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: include/alloctrace_inline.h: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (path, text) in [
        (api, api_text.as_str()),
        (format, format_header().as_str()),
        (inline, inline_text.as_str()),
    ] {
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("error: writing {}: {e}", path.to_string_lossy());
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// The line after which include/alloctrace_inline.h's per-kind wrappers
/// start (the second line of a comment that opens on the line before).
const WRAPPERS_BEGIN: &str =
    " * crate's event spec and the C API; do not edit, run `make header`. */\n";
/// The line that ends the per-kind wrappers.
const WRAPPERS_END: &str = "/* END per-kind wrappers */\n";

/// `inline` (include/alloctrace_inline.h) with the per-kind wrappers
/// between its markers written anew: one `alloctrace_NAME_` per event kind
/// the inline path writes (every kind with an address; a kind with a call
/// stack only when the stack is already marked in the generation), taking the parameters of the C API's `trace_NAME` (found in
/// `api`, the generated alloctrace.h): it records the event with
/// `ALLOCTRACE_RECORD_` and the kind's numbers from alloctrace_format.h,
/// or calls `trace_NAME`. The record primitive stays hand-written.
fn inline_header(inline: &str, api: &str) -> Result<String, String> {
    let (Some(begin), Some(end)) = (inline.find(WRAPPERS_BEGIN), inline.find(WRAPPERS_END)) else {
        return Err("the BEGIN and END lines of the per-kind wrappers are missing".into());
    };
    let begin = begin + WRAPPERS_BEGIN.len();
    if end < begin {
        return Err("the END line of the per-kind wrappers comes before BEGIN".into());
    }
    let mut out = String::from(&inline[..begin]);
    for kind in EVENT_KINDS {
        if kind.address_class().delta_index().is_none() {
            continue; // the library's path always: not written inline
        }
        let name = kind.name();
        let params = c_params(api, name)?;
        if params.len() != kind.arg_count() {
            return Err(format!(
                "trace_{name} takes {} parameters but the event has {} arguments",
                params.len(),
                kind.arg_count()
            ));
        }
        let decls: Vec<&str> = params.iter().map(|(decl, _)| decl.as_str()).collect();
        let names: Vec<&str> = params.iter().map(|(_, name)| name.as_str()).collect();
        let record_args: Vec<&str> = (0..4)
            .map(|i| names.get(i).copied().unwrap_or("0"))
            .collect();
        let n = c_name(kind);
        let _ = write!(
            out,
            "static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_{name}_(trace_writer *w, {decls})\n\
             {{\n\
             \x20   if (ALLOCTRACE_RECORD_(w, ALLOCTRACE_KIND_{n}_, ALLOCTRACE_CLASS_{n}_, ALLOCTRACE_ARGS_{n}_, ALLOCTRACE_LOG2_SIZE_{n}_,\n\
             \x20                          {record}))\n\
             \x20       return 0;\n\
             \x20   (trace_{name})({call});\n\
             \x20   return 1;\n\
             }}\n",
            decls = decls.join(", "),
            record = record_args.join(", "),
            call = names.join(", "),
        );
    }
    out.push_str(&inline[end..]);
    Ok(out)
}

/// The parameters of `void trace_NAME(...)` in the generated C API, each
/// as its declaration and its name.
fn c_params(api: &str, name: &str) -> Result<Vec<(String, String)>, String> {
    let open = format!("void trace_{name}(");
    let start = api
        .find(&open)
        .ok_or_else(|| format!("no prototype of trace_{name} in the C API"))?
        + open.len();
    let len = api[start..]
        .find(')')
        .ok_or_else(|| format!("trace_{name}'s prototype does not end"))?;
    api[start..start + len]
        .split(',')
        .map(|p| {
            let decl = p.split_whitespace().collect::<Vec<_>>().join(" ");
            let name = decl
                .rsplit([' ', '*'])
                .next()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| format!("a parameter of trace_{name} without a name"))?;
            Ok((decl.clone(), name.to_string()))
        })
        .collect()
}

/// The C name of an event kind: `SPAN_EXISTS` for `span_exists`.
fn c_name(kind: EventKind) -> String {
    kind.name().to_ascii_uppercase()
}

/// include/alloctrace_format.h: every number of the wire format the inline
/// event path (include/alloctrace_inline.h) writes, taken from the format
/// crate, and the numbers of the library's private layout it reads that are
/// not field offsets (those are in the header's structs, asserted in the
/// core), taken from the core: so that the C and the Rust writer cannot
/// disagree on them.
fn format_header() -> String {
    let mut h = String::new();
    for line in [
        "/*",
        " * alloctrace_format.h: the numbers of the trace format (docs/FORMAT.md,",
        " * section 3) that the inline event path of alloctrace_inline.h writes.",
        " *",
        " * Generated by crates/header-gen from the format crate (crates/format):",
        " * do not edit; run `make header`. Private: not API.",
        " */",
        "#ifndef ALLOCTRACE_FORMAT_H",
        "#define ALLOCTRACE_FORMAT_H",
        "",
    ] {
        let _ = writeln!(h, "{line}");
    }
    let _ = writeln!(h, "/* The most bytes one event takes (MAX_EVENT_LEN). */");
    let _ = writeln!(h, "#define ALLOCTRACE_MAX_EVENT_LEN_ {MAX_EVENT_LEN}");
    let _ = writeln!(h, "/* The most bytes one varint takes (MAX_VARINT_LEN). */");
    let _ = writeln!(h, "#define ALLOCTRACE_MAX_VARINT_LEN_ {MAX_VARINT_LEN}");
    let _ = writeln!(h, "/* Kind byte flags: long form, entry-point tag. */");
    let _ = writeln!(h, "#define ALLOCTRACE_LONG_FORM_ 0x{LONG_FORM:02x}");
    let _ = writeln!(h, "#define ALLOCTRACE_ENTRY_TAG_ 0x{ENTRY_TAG:02x}");
    let _ = writeln!(
        h,
        "\n/* Address classes: the index of a batch's previous ID of the class. */"
    );
    for (name, class) in [
        ("SPAN", AddressClass::Span),
        ("HEAP_OBJECT", AddressClass::HeapObject),
        ("STACK", AddressClass::Stack),
    ] {
        if let Some(i) = class.delta_index() {
            let _ = writeln!(h, "#define ALLOCTRACE_CLASS_{name}_ {i}");
        }
    }
    for line in [
        "",
        "/* Per event kind: the kind byte (KIND_), the address class of its first",
        " * argument (CLASS_), its argument count (ARGS_), and whether its second",
        " * argument is a size written as its log2 in short form (LOG2_SIZE_). */",
    ] {
        let _ = writeln!(h, "{line}");
    }
    for kind in EVENT_KINDS {
        let Some(class) = kind.address_class().delta_index() else {
            continue; // not an address: the inline path never writes it
        };
        let n = c_name(kind);
        let _ = writeln!(h, "#define ALLOCTRACE_KIND_{n}_ {}", kind as u8);
        let _ = writeln!(h, "#define ALLOCTRACE_CLASS_{n}_ {class}");
        let _ = writeln!(h, "#define ALLOCTRACE_ARGS_{n}_ {}", kind.arg_count());
        let _ = writeln!(
            h,
            "#define ALLOCTRACE_LOG2_SIZE_{n}_ {}",
            u8::from(kind.size_as_log2())
        );
    }
    for line in [
        "",
        "/* The library's private layout (crates/writer/src/shared.rs, buffer.rs): the",
        " * inline_mode values of struct alloctrace_shared_, and the offset of the",
        " * batch bytes from a buffer's struct alloctrace_batch_. */",
    ] {
        let _ = writeln!(h, "{line}");
    }
    let _ = writeln!(
        h,
        "#define ALLOCTRACE_MODE_OUT_OF_LINE_ {}",
        inline_mode::OUT_OF_LINE
    );
    let _ = writeln!(
        h,
        "#define ALLOCTRACE_MODE_PRECISE_ {}",
        inline_mode::PRECISE
    );
    let _ = writeln!(h, "#define ALLOCTRACE_MODE_COARSE_ {}", inline_mode::COARSE);
    let _ = writeln!(h, "#define ALLOCTRACE_BATCH_DATA_ {BATCH_DATA_OFFSET}");
    let _ = writeln!(
        h,
        "#define ALLOCTRACE_CALL_STACK_MAX_NODES_ {CALL_STACK_MAX_NODES}"
    );
    let _ = writeln!(
        h,
        "#define ALLOCTRACE_CALL_STACK_NODE_SIZE_ {CALL_STACK_NODE_SIZE}"
    );
    let _ = writeln!(
        h,
        "#define ALLOCTRACE_CALL_STACK_NODE_USED_ {CALL_STACK_NODE_USED_OFFSET}"
    );
    h.push_str("\n#endif /* ALLOCTRACE_FORMAT_H */\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed(name: &str) -> String {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../include");
        std::fs::read_to_string(root.join(name)).expect("committed header")
    }

    /// The committed wrappers are what the spec gives (as `make
    /// check-header` checks, without a release build), and an edited
    /// wrapper is written back.
    #[test]
    fn the_per_kind_wrappers_come_from_the_spec() {
        let (inline, api) = (committed("alloctrace_inline.h"), committed("alloctrace.h"));
        assert_eq!(inline_header(&inline, &api).as_deref(), Ok(inline.as_str()));
        let edited = inline.replace("(trace_span_free)(base);", "(trace_span_free)(0);");
        assert_ne!(edited, inline);
        assert_eq!(inline_header(&edited, &api).as_deref(), Ok(inline.as_str()));
        let wrappers = inline.matches("static inline ALLOCTRACE_ALWAYS_INLINE_ int alloctrace_");
        assert_eq!(
            wrappers.count(),
            12,
            "eleven wrappers and the record primitive"
        );
        // A kind whose C call takes other parameters than its arguments.
        let api_changed = api.replace(
            "void trace_span_free(uintptr_t base);",
            "void trace_span_free(uintptr_t base, int x);",
        );
        assert!(inline_header(&inline, &api_changed)
            .unwrap_err()
            .contains("trace_span_free takes 2 parameters"));
        assert!(inline_header("no markers", &api).is_err());
    }
}
